-- sliding-counter (algorithm/sliding_counter.rs): a hash {t = latest time, b<j> = units in
-- bucket j}, buckets of width w = W / N. The estimate counts the current bucket and the
-- N - 1 before it whole, and the one before those, sliding out of the window, by the part
-- of it still inside. Evaluating leaves in the rule: now, stored (the buckets, {j, units},
-- oldest first), width (w), bucket (the current one's j) and estimate_w (the estimate
-- times w, in whole numbers).
local function sliding_counter_steps()
  local function by_bucket(x, y)
    return x[1] < y[1]
  end

  local function evaluate(r, t, units)
    local fields = call('HGETALL', r.key)
    r.latest = 0
    local stored = {}
    for f = 1, #fields, 2 do
      if fields[f] == 't' then
        r.latest = tonumber(fields[f + 1])
      else
        stored[#stored + 1] = {tonumber(sub(fields[f], 2)), tonumber(fields[f + 1])}
      end
    end
    if #stored > 1 then
      table.sort(stored, by_bucket)
    end
    r.stored = stored
    r.now = max(t, r.latest)
    local w, n = div(r.window, r.buckets), r.buckets
    r.width = w
    r.bucket = div(r.now, w)
    local offset = r.now - r.bucket * w
    local full, sliding = 0, 0
    for _, b in ipairs(stored) do
      if b[1] + n == r.bucket then
        sliding = b[2]
      elseif b[1] + n > r.bucket then
        full = full + b[2]
      end
    end
    r.estimate_w = w * full + sliding * (w - offset)
    return r.estimate_w <= (r.limit - units) * w
  end

  -- Drops the buckets that left the window, then counts `cost` in the current one.
  local function record(r, cost, margin)
    local key, now, w, n = r.key, r.now, r.width, r.buckets
    for _, b in ipairs(r.stored) do
      if b[1] + n < r.bucket then
        call('HDEL', key, 'b' .. int(b[1]))
      end
    end
    call('HINCRBY', key, 'b' .. int(r.bucket), int(cost))
    call('HSET', key, 't', int(now))
    call('PEXPIRE', key, ttl_ms((r.bucket + n + 1) * w - now, margin))
  end

  -- The least d >= 0 at which `units` fit: walk the pieces where the estimate is linear
  -- (see SlidingCounterState::retry_after).
  local function retry_after(r, units)
    local now, w, n, stored = r.now, r.width, r.buckets, r.stored
    local target = (r.limit - units) * w
    local piece = div(now, w)
    local first_full, full = 1, 0
    for _, b in ipairs(stored) do
      full = full + b[2]
    end
    while true do
      while first_full <= #stored and stored[first_full][1] + n <= piece do
        full = full - stored[first_full][2]
        first_full = first_full + 1
      end
      local sliding = 0
      if first_full > 1 and stored[first_full - 1][1] + n == piece then
        sliding = stored[first_full - 1][2]
      end
      local start = piece * w
      local offset = max(now - start, 0)
      if w * full <= target then
        if sliding == 0 then
          return start + offset - now
        end
        local needed = max(offset, max(w - div(target - w * full, sliding), 0))
        if needed < w then
          return start + needed - now
        end
      end
      if sliding > 0 or first_full > #stored then
        piece = piece + 1
      else
        piece = stored[first_full][1] + n
      end
    end
  end

  local function answer(r, admitted, over, units)
    local now, limit, w, n = r.now, r.limit, r.width, r.buckets
    if admitted then
      local estimate_w = r.estimate_w + units * w
      return div(limit * w - estimate_w, w), 0, (r.bucket + n + 1) * w - now, 0
    end
    local retry = over and retry_after(r, units) or 0
    local newest = r.stored[#r.stored]
    local reset = newest and max((newest[1] + n + 1) * w - now, 0) or 0
    return div(max(limit * w - r.estimate_w, 0), w), retry, reset, 0
  end

  local function give_back(r, at, cost)
    local field = 'b' .. int(div(at, div(r.window, r.buckets)))
    if call('HINCRBY', r.key, field, int(-cost)) <= 0 then
      call('HDEL', r.key, field)
    end
  end

  -- Debt: the units of the buckets that still weigh are held so that w times their sum
  -- stays below 2^53.
  local function report(r, cost, margin)
    local held = 0
    for _, b in ipairs(r.stored) do
      if b[1] + r.buckets >= r.bucket then
        held = held + b[2]
      end
    end
    local room = div(MAX_EXACT, r.width) - held
    if room <= 0 then
      return false
    end
    record(r, min(cost, room), margin)
    return true
  end

  -- From the buckets that still weigh, the newest first (n_b, n_{b-1}, …, n_{b-N}); the
  -- buckets left empty, and those that no longer weigh, are dropped.
  local function refund(r, cost)
    local key, stored, oldest_weighing = r.key, r.stored, r.bucket - r.buckets
    local left = cost
    for i = #stored, 1, -1 do
      local b = stored[i]
      local field = 'b' .. int(b[1])
      if b[1] < oldest_weighing then
        if left < cost then
          call('HDEL', key, field)
        end
      elseif left > 0 then
        local taken = min(left, b[2])
        left = left - taken
        if taken == b[2] then
          call('HDEL', key, field)
        else
          call('HINCRBY', key, field, int(-taken))
        end
      end
    end
    return left < cost
  end

  -- Only from the reservation's own bucket, while it still weighs.
  local function unreserve(r, at, _, units)
    if div(at, r.width) >= r.bucket - r.buckets then
      give_back(r, at, units)
    end
  end

  return evaluate, record, answer, give_back, report, refund, unreserve
end
