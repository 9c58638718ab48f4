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
    local stored_tat, latest, stored_interval
    if r.key == held_key then
      -- A held state (prelude.lua) is one this call wrote: pw blanked.
      stored_tat, latest, stored_interval = held_state.tat, held_state.t, held_state.T
      r.undo_kept = false
    else
      local v = call('HMGET', r.key, 'tat', 't', 'T', 'pw')
      stored_tat, latest, stored_interval = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
      r.undo_kept = v[4] ~= false and v[4] ~= ''
    end
    r.stored_tat, r.stored_interval = stored_tat, stored_interval
    r.latest = latest or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    -- The backlog tat - now as written, in full (a report's debt included); written under
    -- another interval, its units (rounded up) at this one, at most the capacity.
    local backlog = max((stored_tat or 0) - r.now, 0)
    local written_interval = stored_interval or r.interval
    r.rounded = backlog > 0 and written_interval ~= r.interval
    if r.rounded then
      backlog = min(div(backlog + written_interval - 1, written_interval), r.capacity) * r.interval
    end
    r.tat = r.now + backlog
    r.new = r.tat + units * r.interval
    return r.new - r.now <= r.tolerance
  end

  -- The TAT, the latest time and the interval, blanking pw when the state kept an
  -- admission's undo (`blank`), and the key's TTL.
  local function write_fields(key, tat, now, interval, blank, ttl)
    if blank then
      call('HSET', key, 'tat', int(tat), 't', int(now), 'T', int(interval), 'pw', '')
    else
      call('HSET', key, 'tat', int(tat), 't', int(now), 'T', int(interval))
    end
    call('PEXPIRE', key, ttl)
  end

  -- A held state (prelude.lua): those fields.
  local function write_held_state(key, state)
    write_fields(key, state.tat, state.t, state.T, state.blank, state.ttl)
  end

  local function write(r, tat, margin)
    local ttl = ttl_ms(tat - r.now, margin)
    local key = r.key
    if holding and (key == held_key or key == keys[next_k + 1]) then
      if key ~= held_key then
        hold(key, write_held_state)
        held_state.blank = false
      end
      held_state.tat, held_state.t, held_state.T, held_state.ttl = tat, r.now, r.interval, ttl
      held_state.blank = held_state.blank or r.undo_kept
      return
    end
    write_fields(key, tat, r.now, r.interval, r.undo_kept, ttl)
  end

  local function record(r, cost, margin)
    local tat = r.tat + cost * r.interval
    if not r.rounded then
      return write(r, tat, margin)
    end
    -- Written with the state it replaced (pt, pT, pw: a rare write, after a reload): the
    -- key is not held, and one held is written out first.
    if r.key == held_key then
      write_held()
    end
    local written = int(tat)
    call('HSET', r.key, 'tat', written, 't', int(r.now), 'T', int(r.interval),
      'pt', int(r.stored_tat), 'pT', int(r.stored_interval), 'pw', written)
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
