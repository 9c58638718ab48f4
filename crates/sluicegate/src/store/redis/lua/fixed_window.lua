-- fixed-window (algorithm/fixed_window.rs): a hash {k = window index, n = units in it,
-- t = latest time}. Evaluating leaves in the rule: now, stored_window (k), index (the
-- current window's), count (units in the current window) and window_end.
local function fixed_window_steps()
  local function evaluate(r, t, units)
    local v = call('HMGET', r.key, 'k', 'n', 't')
    r.stored_window = tonumber(v[1])
    r.latest = tonumber(v[3]) or 0
    r.now = max(t, r.latest)
    r.index = div(r.now, r.window)
    r.count = r.stored_window == r.index and (tonumber(v[2]) or 0) or 0
    r.window_end = (r.index + 1) * r.window
    return r.count + units <= r.limit
  end

  local function record(r, cost, margin)
    local key, now = r.key, r.now
    if r.stored_window == r.index then
      -- The count was read when evaluating, and nothing runs between: one write sets it
      -- and the latest time (an increment, then a set, was two commands per check).
      call('HSET', key, 'n', int(r.count + cost), 't', int(now))
    else
      -- A new window's counter: its TTL is set now and never refreshed (seed 004).
      call('HSET', key, 'k', r.index, 'n', cost, 't', int(now))
      call('PEXPIRE', key, ttl_ms(r.window_end - now, margin))
    end
  end

  local function answer(r, admitted, over, units)
    local now, limit = r.now, r.limit
    if admitted then
      return limit - r.count - units, 0, r.window_end - now, 0
    end
    local reset = r.count > 0 and (r.window_end - now) or 0
    return max(limit - r.count, 0), over and reset or 0, reset, 0
  end

  -- Only while the admission's window is still the current one: a later window never
  -- counted it.
  local function give_back(r, at, cost)
    if tonumber(call('HGET', r.key, 'k')) == div(at, r.window) then
      call('HSET', r.key, 'n', max(0, call('HINCRBY', r.key, 'n', -cost)))
    end
  end

  -- Debt: the count held below 2^53, as a charged refusal's is.
  local function report(r, cost, margin)
    record(r, min(cost, MAX_EXACT - r.count), margin)
    return true
  end

  -- Only from the current window's count: an earlier one's has nothing left to give.
  local function refund(r, cost)
    if r.count == 0 then
      return false
    end
    call('HSET', r.key, 'n', max(0, r.count - cost))
    return true
  end

  -- Only while the reservation's window is the current one.
  local function unreserve(r, at, _, units)
    if div(at, r.window) == r.index then
      refund(r, units)
    end
  end

  return evaluate, record, answer, give_back, report, refund, unreserve
end
