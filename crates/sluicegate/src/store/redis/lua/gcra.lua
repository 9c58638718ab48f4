-- token-bucket and leaky-bucket (algorithm/gcra.rs): GCRA, a hash {tat = theoretical
-- arrival time, t = latest time, T = the emission interval tat was written under},
-- emission interval T, tolerance T * capacity. A leaky-bucket admission waits until its
-- tat (the delay), so that what passes leaves at one unit per T. Evaluating leaves in the
-- rule: now, tolerance, tat (max(stored tat, now), read under the rule's numbers) and new
-- (tat after the check's units).
--
-- A backlog read under another interval is rounded to whole units: an admission that
-- rewrites it cannot be undone by subtracting its units. So such an admission also keeps
-- the state it replaced (fields pt and pT) and the tat it wrote (pw): a give-back that
-- finds pw still the tat restores the state exactly. Every other write of a state that
-- holds them blanks pw, so that they are never taken for a later admission's.
local function gcra_steps()
  local function evaluate(r, t, units)
    local v = call('HMGET', r.key, 'tat', 't', 'T', 'pw')
    r.stored_tat, r.stored_interval = v[1], v[3]
    r.undo_kept = v[4] ~= false and v[4] ~= ''
    r.latest = tonumber(v[2]) or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    -- The backlog tat - now as written, in full (a report's debt included); written under
    -- another interval, its units (rounded up) at this one, at most the capacity.
    local backlog = max((tonumber(v[1]) or 0) - r.now, 0)
    local written_interval = tonumber(v[3]) or r.interval
    r.rounded = backlog > 0 and written_interval ~= r.interval
    if r.rounded then
      backlog = min(div(backlog + written_interval - 1, written_interval), r.capacity) * r.interval
    end
    r.tat = r.now + backlog
    r.new = r.tat + units * r.interval
    return r.new - r.now <= r.tolerance
  end

  local function write(r, tat, margin)
    local key, written = r.key, int(tat)
    if r.undo_kept then
      call('HSET', key, 'tat', written, 't', int(r.now), 'T', int(r.interval), 'pw', '')
    else
      call('HSET', key, 'tat', written, 't', int(r.now), 'T', int(r.interval))
    end
    call('PEXPIRE', key, ttl_ms(tat - r.now, margin))
  end

  local function record(r, cost, margin)
    local tat = r.tat + cost * r.interval
    if not r.rounded then
      return write(r, tat, margin)
    end
    local written = int(tat)
    call('HSET', r.key, 'tat', written, 't', int(r.now), 'T', int(r.interval),
      'pt', r.stored_tat, 'pT', r.stored_interval, 'pw', written)
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
    return remaining, retry, r.tat - now, 0
  end

  local function give_back(r, at, cost, margin)
    local v = call('HMGET', r.key, 'tat', 'pw', 'pt', 'pT')
    if v[2] and v[2] == v[1] then
      call('HSET', r.key, 'tat', v[3], 'T', v[4], 'pw', '')
      call('PEXPIRE', r.key, ttl_ms(max(tonumber(v[3]) - at, 0), margin))
    elseif v[1] then
      call('HSET', r.key, 'tat', int(max(at, tonumber(v[1]) - cost * r.interval)))
    end
  end

  -- Debt: the backlog may run past the tolerance, held at MAX_BACKLOG.
  local function report(r, cost, margin)
    write(r, min(r.tat + cost * r.interval, r.now + MAX_BACKLOG), margin)
    return true
  end

  -- The TAT pulled back by `backlog` µs, never below now; written with the rule's interval,
  -- the latest time left as it was.
  local function pull_back(r, backlog, margin)
    local tat = max(r.now, r.tat - backlog)
    if r.undo_kept then
      call('HSET', r.key, 'tat', int(tat), 'T', int(r.interval), 'pw', '')
    else
      call('HSET', r.key, 'tat', int(tat), 'T', int(r.interval))
    end
    call('PEXPIRE', r.key, ttl_ms(tat - r.now, margin))
  end

  -- A leaky bucket gives nothing back: every unit it admitted was handed its slot to pass
  -- in, and a TAT pulled back would hand the same slots out again.
  local function refund(r, cost, margin)
    if r.algorithm == LEAKY_BUCKET or r.tat <= r.now then
      return false
    end
    pull_back(r, cost * r.interval, margin)
    return true
  end

  -- A reservation's units are the last units * T before the TAT it set (`tat`): only what
  -- of them is still pending (tat - now) can be given back.
  local function unreserve(r, _, tat, units, margin)
    if r.algorithm ~= LEAKY_BUCKET and tat > r.now and r.tat > r.now then
      pull_back(r, min(units * r.interval, tat - r.now), margin)
    end
  end

  return evaluate, record, answer, give_back, report, refund, unreserve
end
