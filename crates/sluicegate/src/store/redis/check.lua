-- sluicegate: checks of one or more rules each, every check atomic (docs/SPEC.md).
--
-- The Rust algorithms (crates/sluicegate/src/algorithm/) are the reference; this script
-- re-implements them and differential tests hold the two together. In each check every
-- rule is evaluated first (reads only); only if all allow does each record. A refused
-- check writes nothing.
--
-- One call may carry several independent checks (the store batches checks that are in
-- flight together): each is decided as if it were alone, in order, and one that fails
-- (a key of the wrong type) fails alone.
--
-- Cost, not style, shapes this code: on Redis 7.0 each redis.call costs about 0.5 µs,
-- each table built 0.3 µs, each number in the reply 0.1 µs, against a whole check of a
-- few µs (measured; docs/BENCHMARKS.md). So a call describes its rules and its shapes of
-- check once and checks refer to them, and tables are few. Times and TTLs are written with
-- string.format('%d') (exact below 2^53 where Lua's integer format is 64-bit, checked
-- below; tostring keeps only 14 digits), once per call: glibc writes a 16-digit number
-- through '%.0f', or through the "%.17g" Redis uses for a Lua number argument, three times
-- slower. Offsets go as Lua numbers; exclusive bounds are written `x + 1` (every time is a
-- whole µs).
--
-- ARGV     the number of rules S, then 7 values per rule: algorithm (1 sliding-log,
--          2 sliding-counter, 3 fixed-window, 4 token-bucket, 5 leaky-bucket), limit L,
--          window W (µs), buckets N, capacity, emission interval T (µs), layout (0 zset,
--          1 compact; sliding-log only).
--          Then the number of check shapes H, and per shape:
--            client time in µs, or '' for Redis TIME (read once per call)
--            cost (0 is a peek: answers as a cost of 1, records nothing)
--            request id, or ''
--            mode: 'check'; 'dry' (answer as if another rule had refused: record
--              nothing); 'undo' (give back an admission of `cost` made at the times
--              given per rule)
--            number of rules R, then per rule its number among the S rules (from 1) and,
--              for 'undo' only, the time the admission was recorded at ('' for none)
--          Then the number of checks C, and when H > 1, per check the number of its shape
--          (from 1).
-- KEYS     per check and rule: the state; and when the check has a request id, its
--          request ids (zset id -> expiry) and release times (hash) too.
--
-- Returns one flat array: per check, 6 numbers per rule {status (1 allows, 0 refuses,
-- +2 if this call recorded units), remaining, retry_after (-1 never), reset_after, delay,
-- time decided at}; for an 'undo', the single number 1; for a check that failed, in place
-- of its numbers, the error's text. Every number stays below 2^53 (rules are validated for
-- it).

local call = redis.call
local floor, max, min = math.floor, math.max, math.min
local format, tonumber = string.format, tonumber
local pack, unpack_struct = struct.pack, struct.unpack
local argv, keys = ARGV, KEYS

-- How a whole number is written: '%d' where Lua's integer format holds 2^53 exactly (a
-- 64-bit long), '%.0f' otherwise. MEMBER: a sliding-log entry, "time:<digits of n><n>".
local INT = format('%d', 2 ^ 53) == '9007199254740992' and '%d' or '%.0f'
local MEMBER = INT .. ':%d' .. INT

-- Whole numbers as Redis arguments, each written once per call: a call's checks mostly
-- share their times (Redis TIME is read once per call), so the same few come up again
-- and again.
local written = {}
local function int(x)
  local s = written[x]
  if not s then
    s = format(INT, x)
    written[x] = s
  end
  return s
end

-- floor(x / y) for integers, exact even where the double quotient rounds to the next one.
local function div(x, y)
  local q = floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

local server_time
local function redis_time()
  if not server_time then
    local now = call('TIME')
    server_time = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return server_time
end

-- Redis expires keys on its own clock. A check that carries its own time (replay, tests)
-- may run that time far faster than Redis's, so such keys get a minute more (`margin`);
-- with Redis TIME the TTL is exact. PEXPIRE takes ms: µs round up, so a key never expires
-- before its state stops mattering. Written as a string (int): most checks of a call
-- share their TTL.
local function ttl_ms(micros, margin)
  return int(max(1, floor((micros + 999) / 1000)) + margin)
end

-- The compact sliding log: one string, a 24-byte header (head, count, latest time) and a
-- ring of L 8-byte times, oldest at head.
local COMPACT_HEADER = 24
local COMPACT_FRONT = 8
local function slot_offset(r, i)
  return COMPACT_HEADER + 8 * ((r.head + i) % r.limit)
end
local function entry_at(r, i)
  local o = slot_offset(r, i)
  return (unpack_struct('<d', call('GETRANGE', r.key, o, o + 7)))
end

-- Decimal digits of a whole number n >= 1.
local function digits(n)
  local d = 1
  while n >= 10 do
    n = floor(n / 10)
    d = d + 1
  end
  return d
end

-- A rule is known by where its 7 values start in ARGV (spec), read when a rule slot takes
-- it up: no table per rule.
local spec_count = tonumber(argv[1])

-- The rules of the check being decided, by position, reused from check to check: a table
-- built per check costs about as much as a Redis command. rule_of resets every field that
-- evaluating a rule reads before it writes; the algorithms' other fields are always
-- written first. A slot is built whole, once: fields added one by one would rehash it.
local rule_slots = {}
local function new_rule_slot()
  return {
    spec = false, algorithm = 0, limit = 0, window = 0, buckets = 0, capacity = 0,
    interval = 0, layout = 0, key = false, ids = false, releases = false, now = 0,
    latest = false, live = 0, expired = 0, cutoff = 0, head = 0, count = 0,
    new_key = false, repeat_release = false, verdict = false,
  }
end

-- Rule `i` of a check: its spec, its keys, and room for what evaluating it finds.
local function rule_of(i, spec, q, keys_per_rule)
  local r = rule_slots[i]
  if not r then
    r = new_rule_slot()
    rule_slots[i] = r
  end
  if r.spec ~= spec then
    r.spec = spec
    r.algorithm, r.limit = tonumber(argv[spec + 1]), tonumber(argv[spec + 2])
    r.window, r.buckets = tonumber(argv[spec + 3]), tonumber(argv[spec + 4])
    r.capacity, r.interval = tonumber(argv[spec + 5]), tonumber(argv[spec + 6])
    r.layout = tonumber(argv[spec + 7])
  end
  r.key = keys[q + 1]
  r.now, r.latest, r.live, r.expired, r.cutoff = 0, false, 0, 0, 0
  r.head, r.count, r.new_key, r.repeat_release = 0, 0, false, false
  if keys_per_rule == 3 then
    r.ids, r.releases = keys[q + 2], keys[q + 3]
  end
  return r
end

-- Give back an admission of `cost` made at `at` (a later rule in another hash slot refused
-- the check; docs/SPEC.md, several rules). Units recorded at one instant are indistinguishable,
-- so removing `cost` of them at that instant restores the state.
local function give_back(r, at, cost, request_id)
  if r.algorithm == 1 and r.layout == 0 then
    local stamp = int(at)
    local taken = call('ZREVRANGEBYSCORE', r.key, stamp, stamp, 'LIMIT', 0, cost)
    if #taken > 0 then
      call('ZREM', r.key, unpack(taken))
    end
  elseif r.algorithm == 1 then
    local header = call('GETRANGE', r.key, 0, COMPACT_HEADER - 1)
    if #header == COMPACT_HEADER then
      r.head, r.count = unpack_struct('<dd', header)
      -- The run of entries at `at` ends at the last index holding it; later ones shift back.
      local last = r.count - 1
      while last >= 0 and entry_at(r, last) > at do
        last = last - 1
      end
      local first = last
      while first > last - cost + 1 and first > 0 and entry_at(r, first - 1) == at do
        first = first - 1
      end
      if last >= 0 and entry_at(r, last) == at then
        local removed = last - first + 1
        for j = last + 1, r.count - 1 do
          call('SETRANGE', r.key, slot_offset(r, j - removed), pack('<d', entry_at(r, j)))
        end
        r.count = r.count - removed
        -- The latest time is the newest entry left, as if the admission never was.
        local latest = r.count > 0 and entry_at(r, r.count - 1) or 0
        call('SETRANGE', r.key, 0, pack('<ddd', r.head, r.count, latest))
      end
    end
  elseif r.algorithm == 2 then
    local field = 'b' .. int(div(at, div(r.window, r.buckets)))
    if call('HINCRBY', r.key, field, -cost) <= 0 then
      call('HDEL', r.key, field)
    end
  elseif r.algorithm == 3 then
    if tonumber(call('HGET', r.key, 'k')) == div(at, r.window) then
      call('HSET', r.key, 'n', max(0, call('HINCRBY', r.key, 'n', -cost)))
    end
  else
    local tat = tonumber(call('HGET', r.key, 'tat'))
    if tat then
      call('HSET', r.key, 'tat', int(max(at, tat - cost * r.interval)))
    end
  end
  if request_id ~= '' then
    call('ZREM', r.ids, request_id)
    call('HDEL', r.releases, request_id)
  end
end

-- The zset layout's live entries: all of them (r.count) less the expired ones, which are
-- few and at the front. (ZCOUNT of the live ones would walk them all, one by one in a
-- small set's listpack.)
local function count_live(r)
  r.expired = call('ZCOUNT', r.key, '-inf', int(r.cutoff))
  r.live = r.count - r.expired
end

-- Reads one rule's state at time t: sets r.now (t clamped to the key's latest time) and
-- what deciding and answering need; returns whether `units` fit.
local function evaluate(r, t, units)
  local alg = r.algorithm
  if alg == 1 then
    -- sliding-log. zset layout: score = time, one member per unit (see recording); its
    -- newest entry is the key's latest admission. compact: the header says it.
    if r.layout == 0 then
      local key = r.key
      local total = call('ZCARD', key)
      if total == 0 then
        r.now = t
        return units <= r.limit
      end
      -- Time clamps to the newest entry only when that is later than t (Redis' clock
      -- stepped back, or a replay's time did): usually nothing is, and a count over the
      -- end of the set says so without reading an entry.
      if call('ZCOUNT', key, int(t + 1), '+inf') > 0 then
        r.latest = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
      end
      r.now = max(t, r.latest or 0)
      r.cutoff = r.now - r.window
      r.count = total
      if total + units <= r.limit then
        -- Fits whatever has expired; how much has is learnt when recording prunes it, or
        -- counted if the check answers without recording.
        r.expired = false
        return true
      end
      count_live(r)
    else
      local header = call('GETRANGE', r.key, 0, COMPACT_HEADER - 1)
      if #header == COMPACT_HEADER then
        r.head, r.count, r.latest = unpack_struct('<ddd', header)
      else
        r.latest, r.new_key = 0, true
      end
      r.now = max(t, r.latest)
      r.cutoff = r.now - r.window
      -- Admissions drop what has expired, so what has expired since is usually a few of
      -- the oldest entries: one read of up to COMPACT_FRONT of them finds where the live
      -- ones start; only when all of those have expired does a binary search go on.
      local front = r.count > 0 and min(r.count, COMPACT_FRONT, r.limit - r.head) or 0
      if front > 0 then
        local o = COMPACT_HEADER + 8 * r.head
        local entries = call('GETRANGE', r.key, o, o + 8 * front - 1)
        local expired = 0
        while expired < front and unpack_struct('<d', entries, 8 * expired + 1) <= r.cutoff do
          expired = expired + 1
        end
        r.expired = expired
      end
      if front > 0 and r.expired == front and front < r.count then
        local low, high = front, r.count
        while low < high do
          local mid = floor((low + high) / 2)
          if entry_at(r, mid) <= r.cutoff then
            low = mid + 1
          else
            high = mid
          end
        end
        r.expired = low
      end
      r.live = r.count - r.expired
    end
    return r.live + units <= r.limit
  elseif alg == 2 then
    -- sliding-counter: a hash {t = latest time, b<j> = units in bucket j}.
    local fields = call('HGETALL', r.key)
    r.latest = 0
    local stored = {}
    for f = 1, #fields, 2 do
      if fields[f] == 't' then
        r.latest = tonumber(fields[f + 1])
      else
        stored[#stored + 1] = {tonumber(string.sub(fields[f], 2)), tonumber(fields[f + 1])}
      end
    end
    if #stored > 1 then
      table.sort(stored, function(x, y) return x[1] < y[1] end)
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
  elseif alg == 3 then
    -- fixed-window: a hash {k = window index, n = units in it, t = latest time}.
    local v = call('HMGET', r.key, 'k', 'n', 't')
    r.stored_window = tonumber(v[1])
    r.latest = tonumber(v[3]) or 0
    r.now = max(t, r.latest)
    r.index = div(r.now, r.window)
    r.count = r.stored_window == r.index and (tonumber(v[2]) or 0) or 0
    r.window_end = (r.index + 1) * r.window
    return r.count + units <= r.limit
  else
    -- token-bucket, leaky-bucket: GCRA, a hash {tat, t = latest time}.
    local v = call('HMGET', r.key, 'tat', 't')
    r.stored_tat = tonumber(v[1]) or 0
    r.latest = tonumber(v[2]) or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    r.tat = max(r.stored_tat, r.now)
    r.new = r.tat + units * r.interval
    return r.new - r.now <= r.tolerance
  end
end

-- Records `cost` units of an admitted check in one rule.
local function record(r, cost, margin)
  local alg, now, key = r.algorithm, r.now, r.key
  if alg == 1 then
    local limit = r.limit
    if r.layout == 0 then
      if not r.expired then
        r.expired = call('ZREMRANGEBYSCORE', key, '-inf', int(r.cutoff))
        r.live = r.count - r.expired
      elseif r.expired > 0 then
        call('ZREMRANGEBYSCORE', key, '-inf', int(r.cutoff))
      end
      -- Member "time:n", n = live + u. After pruning the set holds exactly `live` entries,
      -- and units at one instant are only added while it is the key's latest (time is
      -- clamped), when nothing can be pruned: so the n of one instant run consecutively
      -- and never repeat. n is written with its digit count first, so that members of one
      -- instant sort by n (a give-back removes the highest).
      if cost == 1 then
        local n = r.live + 1
        call('ZADD', key, int(now), format(MEMBER, now, digits(n), n))
      else
        local stamp = int(now)
        local args = {}
        for u = 1, cost do
          local n = r.live + u
          args[#args + 1] = stamp
          args[#args + 1] = format(MEMBER, now, digits(n), n)
          if #args >= 1000 then
            call('ZADD', key, unpack(args))
            args = {}
          end
        end
        if #args > 0 then
          call('ZADD', key, unpack(args))
        end
      end
      call('PEXPIRE', key, ttl_ms(r.window, margin))
    else
      local run = string.rep(pack('<d', now), cost)
      if r.new_key then
        -- Allocated whole, once, with its TTL: growing by SETRANGE would let Redis
        -- over-allocate.
        call('SET', key, pack('<ddd', 0, cost, now) .. run
          .. string.rep('\0', 8 * (limit - cost)), 'PX', ttl_ms(r.window, margin))
      else
        local head = (r.head + r.expired) % limit
        local count = r.count - r.expired
        -- The run may wrap around the end of the ring.
        local first = (head + count) % limit
        local fitting = min(cost, limit - first)
        if fitting == cost then
          call('SETRANGE', key, COMPACT_HEADER + 8 * first, run)
        else
          call('SETRANGE', key, COMPACT_HEADER + 8 * first, string.sub(run, 1, 8 * fitting))
          call('SETRANGE', key, COMPACT_HEADER, string.sub(run, 8 * fitting + 1))
        end
        call('SETRANGE', key, 0, pack('<ddd', head, count + cost, now))
        call('PEXPIRE', key, ttl_ms(r.window, margin))
      end
    end
  elseif alg == 2 then
    local w, n = r.width, r.buckets
    for _, b in ipairs(r.stored) do
      if b[1] + n < r.bucket then
        call('HDEL', key, 'b' .. int(b[1]))
      end
    end
    call('HINCRBY', key, 'b' .. int(r.bucket), cost)
    call('HSET', key, 't', int(now))
    call('PEXPIRE', key, ttl_ms((r.bucket + n + 1) * w - now, margin))
  elseif alg == 3 then
    if r.stored_window == r.index then
      call('HINCRBY', key, 'n', cost)
      call('HSET', key, 't', int(now))
    else
      -- A new window's counter: its TTL is set now and never refreshed (seed 004).
      call('HSET', key, 'k', r.index, 'n', cost, 't', int(now))
      call('PEXPIRE', key, ttl_ms(r.window_end - now, margin))
    end
  else
    local tat = r.tat + cost * r.interval
    call('HSET', key, 'tat', int(tat), 't', int(now))
    call('PEXPIRE', key, ttl_ms(tat - now, margin))
  end
end

-- The answer of one rule: remaining, retry_after, reset_after, delay; `admitted` when the
-- whole check was, `over` when this rule's own limit refused it (not another rule's).
local function answer(r, admitted, over, units)
  local alg, now, limit = r.algorithm, r.now, r.limit
  if alg == 1 then
    if not r.expired then
      count_live(r)
    end
    if admitted then
      return limit - r.live - units, 0, r.window, 0
    end
    local retry = 0
    if over then
      local k = r.live + units - limit
      local kth
      if r.layout == 0 then
        local at = r.expired + k - 1
        kth = tonumber(call('ZRANGE', r.key, at, at, 'WITHSCORES')[2])
      else
        kth = entry_at(r, r.expired + k - 1)
      end
      retry = kth + r.window - now
    end
    local reset = 0
    if r.live > 0 then
      local latest = r.latest or tonumber(call('ZRANGE', r.key, -1, -1, 'WITHSCORES')[2])
      reset = latest + r.window - now
    end
    return max(limit - r.live, 0), retry, reset, 0
  elseif alg == 2 then
    local w, n = r.width, r.buckets
    if admitted then
      local estimate_w = r.estimate_w + units * w
      return div(limit * w - estimate_w, w), 0, (r.bucket + n + 1) * w - now, 0
    end
    local retry = 0
    if over then
      -- The least d >= 0 at which the check fits: walk the pieces where the estimate is
      -- linear (see SlidingCounterState::retry_after).
      local stored = r.stored
      local target = (limit - units) * w
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
        local found
        if w * full <= target then
          if sliding == 0 then
            found = start + offset - now
          else
            local needed = max(offset, max(w - div(target - w * full, sliding), 0))
            if needed < w then
              found = start + needed - now
            end
          end
        end
        if found then
          retry = found
          break
        end
        if sliding > 0 or first_full > #stored then
          piece = piece + 1
        else
          piece = stored[first_full][1] + n
        end
      end
    end
    local newest = r.stored[#r.stored]
    local reset = newest and max((newest[1] + n + 1) * w - now, 0) or 0
    return div(max(limit * w - r.estimate_w, 0), w), retry, reset, 0
  elseif alg == 3 then
    if admitted then
      return limit - r.count - units, 0, r.window_end - now, 0
    end
    local reset = r.count > 0 and (r.window_end - now) or 0
    return max(limit - r.count, 0), over and reset or 0, reset, 0
  else
    local interval, tolerance = r.interval, r.tolerance
    if admitted then
      local delay = alg == 5 and (r.tat - now) or 0
      return div(tolerance - (r.new - now), interval), 0, r.new - now, delay
    end
    local retry = over and (r.new - tolerance - now) or 0
    local remaining = div(max(tolerance - (r.tat - now), 0), interval)
    return remaining, retry, max(r.stored_tat - now, 0), 0
  end
end

local results, result_count = {}, 0

-- One check of the given shape, its keys after KEYS index `k`; appends its numbers to
-- `results`.
local function run_check(shape, k)
  local cost, request_id, mode = shape.cost, shape.request_id, shape.mode
  local rule_count, specs = shape.rule_count, shape.specs
  local units = max(cost, 1)
  local keys_per_rule = request_id == '' and 1 or 3
  local margin = shape.margin

  if mode == 'undo' then
    for i = 1, rule_count do
      local at = shape.undo_at[i]
      -- No time: this rule recorded nothing (a retried request id), nothing to give back.
      if at then
        local r = rule_of(i, specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
        give_back(r, at, cost, request_id)
      end
    end
    result_count = result_count + 1
    results[result_count] = 1
    return
  end

  local t = shape.t or redis_time()

  -- Phase 1: evaluate every rule, reading only.
  local all_allow = mode == 'check'
  for i = 1, rule_count do
    local r = rule_of(i, specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
    local fits = evaluate(r, t, units)
    if request_id ~= '' then
      local expires = tonumber(call('ZSCORE', r.ids, request_id))
      if expires and expires > r.now then
        r.repeat_release = tonumber(call('HGET', r.releases, request_id)) or 0
      end
    end
    if r.repeat_release then
      r.verdict = 'repeat'
    elseif units > r.capacity then
      r.verdict = 'never'
      all_allow = false
    elseif fits then
      r.verdict = 'fits'
    else
      r.verdict = 'over'
      all_allow = false
    end
  end

  -- Phase 2: record in every rule, or in none, and answer.
  for i = 1, rule_count do
    local r = rule_slots[i]
    local now, verdict = r.now, r.verdict
    local fits = all_allow and verdict == 'fits'
    local recorded = fits and cost > 0
    if recorded then
      record(r, cost, margin)
    end
    local remaining, retry, reset, delay = answer(r, fits, verdict == 'over', units)
    local allows = (verdict == 'fits' or verdict == 'repeat') and 1 or 0
    if verdict == 'never' then
      retry = -1
    elseif verdict == 'repeat' then
      -- Admitted before and still counting: allowed again, nothing recorded.
      retry = 0
      delay = all_allow and max(r.repeat_release - now, 0) or 0
    end
    if recorded and request_id ~= '' then
      -- Forget ids whose admissions no longer count, then remember this one.
      local gone = call('ZRANGEBYSCORE', r.ids, '-inf', int(now))
      for g = 1, #gone, 1000 do
        local chunk = {unpack(gone, g, min(g + 999, #gone))}
        call('ZREM', r.ids, unpack(chunk))
        call('HDEL', r.releases, unpack(chunk))
      end
      call('ZADD', r.ids, int(now + reset), request_id)
      call('PEXPIRE', r.ids, ttl_ms(reset, margin))
      if delay > 0 then
        call('HSET', r.releases, request_id, int(now + delay))
        call('PEXPIRE', r.releases, ttl_ms(reset, margin))
      end
    end
    local n = result_count
    results[n + 1] = recorded and allows + 2 or allows
    results[n + 2] = remaining
    results[n + 3] = retry
    results[n + 4] = reset
    results[n + 5] = delay
    results[n + 6] = now
    result_count = n + 6
  end
end

-- The shapes of the call's checks: what a check asks, but for its keys. Checks that ask the
-- same (the same rules, cost, mode, no request id, Redis TIME: the common case under load)
-- share a shape, so a check costs one argument, and none when a call has one shape.
local shapes = {}
local p = 2 + 7 * spec_count
local shape_count = tonumber(argv[p])
for h = 1, shape_count do
  local rule_count, undo = tonumber(argv[p + 5]), argv[p + 4] == 'undo'
  -- t: the client's time, or false for Redis TIME; margin: see ttl_ms.
  local shape = {
    t = tonumber(argv[p + 1]) or false, margin = argv[p + 1] == '' and 0 or 60000,
    cost = tonumber(argv[p + 2]), request_id = argv[p + 3], mode = argv[p + 4],
    rule_count = rule_count, specs = {}, undo_at = undo and {},
  }
  for i = 1, rule_count do
    if undo then
      shape.specs[i] = 1 + 7 * (tonumber(argv[p + 4 + 2 * i]) - 1)
      shape.undo_at[i] = tonumber(argv[p + 5 + 2 * i])
    else
      shape.specs[i] = 1 + 7 * (tonumber(argv[p + 5 + i]) - 1)
    end
  end
  shapes[h] = shape
  p = p + 5 + rule_count * (undo and 2 or 1)
end

-- The checks, in order, each its shape's number. One pcall covers a run of checks (a pcall
-- per check costs more than the rest of a check's Lua): when a check fails, its numbers
-- are dropped, its error takes their place, and the run goes on from the next check.
local check_count = tonumber(argv[p + 1])
local done, k = 0, 0
-- Where the current check's keys and answer start, and where the next check's keys do.
local next_k, answer_start = 0, 0
local function run_checks()
  while done < check_count do
    local shape = shape_count == 1 and shapes[1] or shapes[tonumber(argv[p + 2 + done])]
    next_k = k + shape.rule_count * (shape.request_id == '' and 1 or 3)
    answer_start = result_count
    run_check(shape, k)
    k, done = next_k, done + 1
  end
end
while done < check_count do
  local ok, failure = pcall(run_checks)
  if not ok then
    -- A Redis error arrives as a table {err = text}; anything else is this script's bug.
    for i = result_count, answer_start + 1, -1 do
      results[i] = nil
    end
    result_count = answer_start + 1
    results[result_count] = type(failure) == 'table' and failure.err or tostring(failure)
    k, done = next_k, done + 1
  end
end
return results
