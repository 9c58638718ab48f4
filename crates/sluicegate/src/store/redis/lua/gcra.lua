-- token-bucket and leaky-bucket (algorithm/gcra.rs): GCRA, a hash {tat = theoretical
-- arrival time, t = latest time, T = the emission interval tat was written under},
-- emission interval T, tolerance T * capacity. A leaky-bucket admission waits until its
-- tat (the delay), so that what passes leaves at one unit per T. Evaluating leaves in the
-- rule: now, tolerance, tat (max(stored tat, now), read under the rule's numbers) and new
-- (tat after the check's units).
local function gcra_steps()
  local function evaluate(r, t, units)
    local v = call('HMGET', r.key, 'tat', 't', 'T')
    r.latest = tonumber(v[2]) or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    -- The backlog tat - now as written, in full (a report's debt included); written under
    -- another interval, its units (rounded up) at this one, at most the capacity.
    local backlog = max((tonumber(v[1]) or 0) - r.now, 0)
    local written_interval = tonumber(v[3]) or r.interval
    if backlog > 0 and written_interval ~= r.interval then
      backlog = min(div(backlog + written_interval - 1, written_interval), r.capacity) * r.interval
    end
    r.tat = r.now + backlog
    r.new = r.tat + units * r.interval
    return r.new - r.now <= r.tolerance
  end

  local function write(r, tat, margin)
    call('HSET', r.key, 'tat', int(tat), 't', int(r.now), 'T', int(r.interval))
    call('PEXPIRE', r.key, ttl_ms(tat - r.now, margin))
  end

  local function record(r, cost, margin)
    write(r, r.tat + cost * r.interval, margin)
  end

  local function answer(r, admitted, over)
    local now, interval, tolerance = r.now, r.interval, r.tolerance
    if admitted then
      local delay = r.algorithm == LEAKY_BUCKET and (r.tat - now) or 0
      return div(tolerance - (r.new - now), interval), 0, r.new - now, delay
    end
    local retry = over and (r.new - tolerance - now) or 0
    local remaining = div(max(tolerance - (r.tat - now), 0), interval)
    return remaining, retry, r.tat - now, 0
  end

  local function give_back(r, at, cost)
    local tat = tonumber(call('HGET', r.key, 'tat'))
    if tat then
      call('HSET', r.key, 'tat', int(max(at, tat - cost * r.interval)))
    end
  end

  -- Debt: the backlog may run past the tolerance, held at MAX_BACKLOG.
  local function report(r, cost, margin)
    write(r, min(r.tat + cost * r.interval, r.now + MAX_BACKLOG), margin)
  end

  -- Never below now; written with the rule's interval, the latest time left as it was.
  local function refund(r, cost, margin)
    if r.tat > r.now then
      local tat = max(r.now, r.tat - cost * r.interval)
      call('HSET', r.key, 'tat', int(tat), 'T', int(r.interval))
      call('PEXPIRE', r.key, ttl_ms(tat - r.now, margin))
    end
  end

  return evaluate, record, answer, give_back, report, refund
end
