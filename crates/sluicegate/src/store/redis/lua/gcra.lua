-- token-bucket and leaky-bucket (algorithm/gcra.rs): GCRA, a hash {tat = theoretical
-- arrival time, t = latest time}, emission interval T, tolerance T * capacity. A
-- leaky-bucket admission waits until its tat (the delay), so that what passes leaves at
-- one unit per T. Evaluating leaves in the rule: now, stored_tat, tolerance, tat
-- (max(stored_tat, now)) and new (tat after the check's units).
local function gcra_steps()
  local function evaluate(r, t, units)
    local v = call('HMGET', r.key, 'tat', 't')
    r.stored_tat = tonumber(v[1]) or 0
    r.latest = tonumber(v[2]) or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    r.tat = max(r.stored_tat, r.now)
    r.new = r.tat + units * r.interval
    return r.new - r.now <= r.tolerance
  end

  local function record(r, cost, margin)
    local tat = r.tat + cost * r.interval
    call('HSET', r.key, 'tat', int(tat), 't', int(r.now))
    call('PEXPIRE', r.key, ttl_ms(tat - r.now, margin))
  end

  local function answer(r, admitted, over)
    local now, interval, tolerance = r.now, r.interval, r.tolerance
    if admitted then
      local delay = r.algorithm == LEAKY_BUCKET and (r.tat - now) or 0
      return div(tolerance - (r.new - now), interval), 0, r.new - now, delay
    end
    local retry = over and (r.new - tolerance - now) or 0
    local remaining = div(max(tolerance - (r.tat - now), 0), interval)
    return remaining, retry, max(r.stored_tat - now, 0), 0
  end

  local function give_back(r, at, cost)
    local tat = tonumber(call('HGET', r.key, 'tat'))
    if tat then
      call('HSET', r.key, 'tat', int(max(at, tat - cost * r.interval)))
    end
  end

  return evaluate, record, answer, give_back
end
