-- fixed-window (algorithm/fixed_window.rs): a hash {k = window index, n = units in it,
-- t = latest time}. Evaluating leaves in the rule: now, stored_window (k), index (the
-- current window's), count (units in the current window) and window_end.
local function fixed_window_steps()
  -- The stored window, its count and the latest time of `key`: held (prelude.lua), or read.
  local function read(key)
    if key == held_key then
      return held_state.k, held_state.n, held_state.t
    end
    local v = call('HMGET', key, 'k', 'n', 't')
    return tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  end

  -- Where a check at `t` stands against a state read: the time decided at (never before
  -- the latest), the current window's index, the units counted in it and its end.
  local function standing(t, window, stored_window, count, latest)
    local now = max(t, latest or 0)
    local index = div(now, window)
    return now, index, stored_window == index and (count or 0) or 0, (index + 1) * window
  end

  local function evaluate(r, t, units)
    local stored_window, count, latest = read(r.key)
    r.stored_window, r.latest = stored_window, latest or 0
    r.now, r.index, r.count, r.window_end = standing(t, r.window, stored_window, count, latest)
    return r.count + units <= r.limit
  end

  -- The window k, its count n and the latest time t; and with `ttl`, the TTL of a window
  -- that started (a new window's counter gets its TTL when it starts, never refreshed:
  -- extended by every hit, it would no longer be a fixed window; docs/SPEC.md, TTLs).
  local function write_fields(key, k, n, t, ttl)
    if ttl then
      call('HSET', key, 'k', int(k), 'n', int(n), 't', int(t))
      call('PEXPIRE', key, ttl)
    else
      call('HSET', key, 'n', int(n), 't', int(t))
    end
  end

  -- A held state (prelude.lua): those fields, ttl false unless a record of the run started
  -- a window.
  local function write_held_state(key, state)
    write_fields(key, state.k, state.n, state.t, state.ttl)
  end

  -- Sets `key`'s window to `index` (ending at `window_end`; a new one when the stored
  -- window was another), its count to `n` and its latest time to `now`: held where a step
  -- holds a key (prelude.lua), else written. The count was read when evaluating, and nothing
  -- runs between: one write sets it and the latest time (an increment, then a set, would
  -- be two commands per check).
  local function keep(key, stored_window, index, n, now, window_end, margin)
    local ttl = stored_window ~= index and ttl_ms(window_end - now, margin)
    if holding and (key == held_key or key == keys[next_k + 1]) then
      if key ~= held_key then
        hold(key, write_held_state)
        held_state.ttl = false
      end
      held_state.k, held_state.n, held_state.t = index, n, now
      held_state.ttl = ttl or held_state.ttl
      return
    end
    write_fields(key, index, n, now, ttl)
  end

  local function record(r, cost, margin)
    keep(r.key, r.stored_window, r.index, r.count + cost, r.now, r.window_end, margin)
  end

  -- remaining, retry_after, reset_after and delay of a window counting `count` units.
  local function answer_of(limit, count, window_end, now, admitted, over, units)
    if admitted then
      return limit - count - units, 0, window_end - now, 0
    end
    local reset = count > 0 and (window_end - now) or 0
    return max(limit - count, 0), over and reset or 0, reset, 0
  end

  local function answer(r, admitted, over, units)
    return answer_of(r.limit, r.count, r.window_end, r.now, admitted, over, units)
  end

  -- A short check (main.lua, run_short) of `key` decided in one step, from the same reads,
  -- writes and numbers as evaluate, record and answer there, without a rule slot's
  -- bookkeeping: most checks of a fixed window take it. Returns the check's status and
  -- numbers (main.lua, add_answer).
  local function decide(r, key, t, cost, units, dry, charge, margin)
    local stored_window, count, latest = read(key)
    local limit = r.limit
    local now, index, window_end
    now, index, count, window_end = standing(t, r.window, stored_window, count, latest)
    -- More units than the capacity (L) never fit: refused whatever the count, as they are
    -- here, and answered so.
    if count + units > limit then
      local never = units > r.capacity
      -- A charged refusal counts, and answers as refused after it.
      if charge and cost > 0 then
        local charged = count + units_below_cap(count, cost)
        keep(key, stored_window, index, charged, now, window_end, margin)
        count = charged
      end
      local remaining, retry, reset = answer_of(limit, count, window_end, now, false, true, units)
      return 0, remaining, never and NEVER or retry, reset, 0
    end
    if dry then
      return ALLOWS, answer_of(limit, count, window_end, now, false, false, units)
    end
    if cost == 0 then
      return ALLOWS, answer_of(limit, count, window_end, now, true, false, units)
    end
    keep(key, stored_window, index, count + cost, now, window_end, margin)
    return RECORDED_AT - now, answer_of(limit, count, window_end, now, true, false, units)
  end

  -- Only while the admission's window is still the current one: a later window never
  -- counted it.
  local function give_back(r, at, cost)
    if tonumber(call('HGET', r.key, 'k')) == div(at, r.window) then
      call('HSET', r.key, 'n', int(max(0, call('HINCRBY', r.key, 'n', int(-cost)))))
    end
  end

  -- Debt: the count held below 2^53, as a charged refusal's is.
  local function report(r, cost, margin)
    record(r, units_below_cap(r.count, cost), margin)
    return true
  end

  -- Only from the current window's count: an earlier one's has nothing left to give.
  local function refund(r, cost)
    if r.count == 0 then
      return false
    end
    call('HSET', r.key, 'n', int(max(0, r.count - cost)))
    return true
  end

  -- Only while the reservation's window is the current one.
  local function unreserve(r, at, _, units)
    if div(at, r.window) == r.index then
      refund(r, units)
    end
  end

  return evaluate, record, answer, give_back, report, refund, unreserve, decide
end

-- A fixed window kept as envoyproxy/ratelimit keeps its counters (Rule::with_envoy_counter),
-- so that its instances and these checks count together: a plain integer at the key the
-- client named for the window (keys.rs, `envoy_counter_key`), which envoy increments by a
-- request's hits and, on every increment, gives the window's length plus a jitter below J
-- seconds to live (INCRBY, then EXPIRE: envoyproxy/ratelimit@f2fb157
-- src/redis/fixed_cache_impl.go:31-34, 166-171). The count decides as a fixed window's
-- does, and answers as one (its `answer`); the key holds nothing else, so the time is the
-- check's own, which named the window. The fields it leaves are a fixed window's.
local function envoy_counter_steps()
  local _, _, answer = fixed_window_steps()

  local function evaluate(r, t, units)
    r.now = t
    r.index = div(t, r.window)
    r.window_end = (r.index + 1) * r.window
    r.count = tonumber(call('GET', r.key)) or 0
    return r.count + units <= r.limit
  end

  -- The jitter: the check's time in µs modulo J. envoy draws it at random; any value below
  -- J spreads the counters' expiry alike, and this one needs no random source in a script.
  local function record(r, cost)
    call('INCRBY', r.key, int(cost))
    local jitter = r.jitter > 0 and r.now - div(r.now, r.jitter) * r.jitter or 0
    call('EXPIRE', r.key, int(r.window / 1000000 + jitter))
  end

  -- The key names the admission's window; a counter that expired has nothing to give.
  local function give_back(r, _, cost)
    if call('EXISTS', r.key) == 1 and call('DECRBY', r.key, int(cost)) < 0 then
      call('SET', r.key, '0', 'KEEPTTL')
    end
  end

  -- Checks only (the store refuses any other mode for these rules before calling).
  local function check_only()
    error('an envoy counter takes checks only')
  end

  return evaluate, record, answer, give_back, check_only, check_only, check_only
end
