-- sluicegate: one check of one or more rules, atomically (SPEC.md).
--
-- The Rust algorithms (crates/sluicegate/src/algorithm/) are the reference; this script
-- re-implements them and differential tests hold the two together. Every rule is evaluated
-- first (reads only); only if all allow does each record. A refused check writes nothing.
--
-- The code is flat on purpose: an EVAL script's whole body runs on every call, so each
-- function or table it defined would be built again for every check.
--
-- ARGV[1]  client time in µs, or '' for Redis TIME
-- ARGV[2]  cost (0 is a peek: answers as a cost of 1, records nothing)
-- ARGV[3]  request id, or ''
-- ARGV[4]  mode: 'check'; 'dry' (answer as if another rule had refused: record nothing);
--          'undo' (give back an admission of `cost` made at the times given per rule)
-- ARGV[5]  number of rules R; then 8 values per rule:
--          algorithm (1 sliding-log, 2 sliding-counter, 3 fixed-window, 4 token-bucket,
--          5 leaky-bucket), limit L, window W (µs), buckets N, capacity, emission
--          interval T (µs), layout (0 zset, 1 compact; sliding-log only), and for 'undo'
--          the time the admission was recorded at ('' otherwise)
-- KEYS     3 per rule: state, request ids (zset id -> expiry), release times (hash)
--
-- Returns R arrays {allows, limit, remaining, retry_after (-1 never), reset_after, delay,
-- time decided at, 1 if this call recorded units}. Every number stays below 2^53 (rules are validated for it); times are
-- formatted with %.0f because tostring loses digits past 14.

local call = redis.call
local floor, max, min = math.floor, math.max, math.min
local format = string.format

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

-- Redis expires keys on its own clock. A check that carries its own time (replay, tests)
-- may run that time far faster than Redis's, so such keys get a minute more; with Redis
-- TIME the TTL is exact. PEXPIRE takes ms: µs round up, so a key never expires before its
-- state stops mattering.
local ttl_margin_ms = ARGV[1] == '' and 0 or 60000
local function expire_after(key, micros)
  call('PEXPIRE', key, max(1, floor((micros + 999) / 1000)) + ttl_margin_ms)
end

local cost = tonumber(ARGV[2])
local units = max(cost, 1)
local request_id = ARGV[3]
local mode = ARGV[4]
local rule_count = tonumber(ARGV[5])

-- Reads one 8-byte slot of a compact log: slot i counted from the oldest entry.
local function slot_offset(r, i)
  return 16 + 8 * ((r.head + i) % r.limit)
end
local function entry_at(r, i)
  local o = slot_offset(r, i)
  return struct.unpack('<d', call('GETRANGE', r.key, o, o + 7))
end

local function read_rule(i)
  local a = 5 + (i - 1) * 8
  return {
    algorithm = tonumber(ARGV[a + 1]),
    limit = tonumber(ARGV[a + 2]),
    window = tonumber(ARGV[a + 3]),
    buckets = tonumber(ARGV[a + 4]),
    capacity = tonumber(ARGV[a + 5]),
    interval = tonumber(ARGV[a + 6]),
    layout = tonumber(ARGV[a + 7]),
    undo_at = tonumber(ARGV[a + 8]),
    key = KEYS[(i - 1) * 3 + 1],
    ids = KEYS[(i - 1) * 3 + 2],
    releases = KEYS[(i - 1) * 3 + 3],
  }
end

-- Give back an admission of `cost` made at `undo_at`: a later rule in another hash slot
-- refused the check (SPEC.md, several rules). Units recorded at one instant are
-- indistinguishable, so removing `cost` of them at that instant restores the state.
if mode == 'undo' then
  for i = 1, rule_count do
    local r = read_rule(i)
    local at = r.undo_at
    if not at then
      -- This rule recorded nothing (a retried request id): nothing to give back.
    elseif r.algorithm == 1 and r.layout == 0 then
      local stamp = format('%.0f', at)
      local taken = call('ZREVRANGEBYSCORE', r.key, stamp, stamp, 'LIMIT', 0, cost)
      if #taken > 0 then
        call('ZREM', r.key, unpack(taken))
      end
    elseif r.algorithm == 1 then
      local header = call('GETRANGE', r.key, 0, 15)
      if #header == 16 then
        r.head, r.count = struct.unpack('<dd', header)
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
            call('SETRANGE', r.key, slot_offset(r, j - removed), struct.pack('<d', entry_at(r, j)))
          end
          r.count = r.count - removed
          call('SETRANGE', r.key, 0, struct.pack('<dd', r.head, r.count))
        end
      end
    elseif r.algorithm == 2 then
      local field = 'b' .. format('%.0f', div(at, div(r.window, r.buckets)))
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
        call('HSET', r.key, 'tat', format('%.0f', max(at, tat - cost * r.interval)))
      end
    end
    if at and request_id ~= '' then
      call('ZREM', r.ids, request_id)
      call('HDEL', r.releases, request_id)
    end
  end
  return 1
end

local t
if ARGV[1] == '' then
  local now = call('TIME')
  t = tonumber(now[1]) * 1000000 + tonumber(now[2])
else
  t = tonumber(ARGV[1])
end

-- Phase 1: evaluate every rule, reading only.
local rules = {}
local all_allow = mode == 'check'
for i = 1, rule_count do
  local r = read_rule(i)
  local alg = r.algorithm
  local fits
  if alg == 1 then
    -- sliding-log. zset layout: score = time, one member per unit (see recording). compact:
    -- one string, a 16-byte header (head, count) and a ring of L 8-byte times, oldest at
    -- head. Either way the newest entry is the key's latest admission: its latest time.
    if r.layout == 0 then
      local newest = call('ZRANGE', r.key, -1, -1, 'WITHSCORES')
      r.latest = newest[2] and tonumber(newest[2]) or 0
      r.now = max(t, r.latest)
      r.cutoff = r.now - r.window
      r.live = call('ZCOUNT', r.key, '(' .. format('%.0f', r.cutoff), '+inf')
    else
      local header = call('GETRANGE', r.key, 0, 15)
      if #header == 16 then
        r.head, r.count = struct.unpack('<dd', header)
      else
        r.head, r.count, r.new_key = 0, 0, true
      end
      r.latest = r.count > 0 and entry_at(r, r.count - 1) or 0
      r.now = max(t, r.latest)
      r.cutoff = r.now - r.window
      -- Usually the oldest entry is live (admissions drop what has expired); otherwise a
      -- binary search finds the first live one.
      local expired = 0
      if r.count > 0 and entry_at(r, 0) <= r.cutoff then
        local low, high = 1, r.count
        while low < high do
          local mid = floor((low + high) / 2)
          if entry_at(r, mid) <= r.cutoff then
            low = mid + 1
          else
            high = mid
          end
        end
        expired = low
      end
      r.expired = expired
      r.live = r.count - expired
    end
    fits = r.live + units <= r.limit
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
    fits = r.estimate_w <= (r.limit - units) * w
  elseif alg == 3 then
    -- fixed-window: a hash {k = window index, n = units in it, t = latest time}.
    local v = call('HMGET', r.key, 'k', 'n', 't')
    r.stored_window = tonumber(v[1])
    r.latest = tonumber(v[3]) or 0
    r.now = max(t, r.latest)
    r.index = div(r.now, r.window)
    r.count = r.stored_window == r.index and (tonumber(v[2]) or 0) or 0
    r.window_end = (r.index + 1) * r.window
    fits = r.count + units <= r.limit
  else
    -- token-bucket, leaky-bucket: GCRA, a hash {tat, t = latest time}.
    local v = call('HMGET', r.key, 'tat', 't')
    r.stored_tat = tonumber(v[1]) or 0
    r.latest = tonumber(v[2]) or 0
    r.now = max(t, r.latest)
    r.tolerance = r.interval * r.capacity
    r.tat = max(r.stored_tat, r.now)
    r.new = r.tat + units * r.interval
    fits = r.new - r.now <= r.tolerance
  end
  if request_id ~= '' then
    local expires = tonumber(call('ZSCORE', r.ids, request_id))
    local release = tonumber(call('HGET', r.releases, request_id))
    if expires and expires > r.now then
      r.repeat_release = release or 0
    end
  end
  if r.repeat_release then
    r.verdict = 'repeat'
  elseif units > r.capacity then
    r.verdict = 'never'
  elseif fits then
    r.verdict = 'fits'
  else
    r.verdict = 'over'
  end
  if r.verdict == 'never' or r.verdict == 'over' then
    all_allow = false
  end
  rules[i] = r
end

-- Phase 2: record in every rule, or in none, and answer.
local answers = {}
for i = 1, rule_count do
  local r = rules[i]
  local alg, now, limit = r.algorithm, r.now, r.limit
  local record = all_allow and r.verdict == 'fits' and cost > 0
  local admitted = all_allow and r.verdict == 'fits'
  -- allows, limit, remaining, retry_after, reset_after, delay
  local row
  if alg == 1 then
    if record then
      if r.layout == 0 then
        call('ZREMRANGEBYSCORE', r.key, '-inf', format('%.0f', r.cutoff))
        -- Member "time:n", n = live + u. After pruning the set holds exactly `live`
        -- entries, and units at one instant are only added while it is the key's latest
        -- (time is clamped), when nothing can be pruned: so the n of one instant run
        -- consecutively and never repeat. n is written with its digit count first, so that
        -- members of one instant sort by n (a give-back removes the highest).
        local stamp = format('%.0f', now)
        local args = {}
        for u = 1, cost do
          local n = format('%.0f', r.live + u)
          args[#args + 1] = stamp
          args[#args + 1] = stamp .. ':' .. #n .. n
          if #args >= 1000 then
            call('ZADD', r.key, unpack(args))
            args = {}
          end
        end
        if #args > 0 then
          call('ZADD', r.key, unpack(args))
        end
      else
        if r.new_key then
          -- Allocated whole, once: growing by SETRANGE would let Redis over-allocate.
          call('SET', r.key, string.rep('\0', 16 + 8 * limit))
        end
        r.head = (r.head + r.expired) % limit
        r.count = r.count - r.expired
        local packed = struct.pack('<d', now)
        for u = 0, cost - 1 do
          call('SETRANGE', r.key, slot_offset(r, r.count + u), packed)
        end
        r.count = r.count + cost
        call('SETRANGE', r.key, 0, struct.pack('<dd', r.head, r.count))
      end
      expire_after(r.key, r.window)
    end
    if admitted then
      row = {1, limit, limit - r.live - units, 0, r.window, 0}
    else
      local retry = 0
      if r.verdict == 'over' then
        local k = r.live + units - limit
        local kth
        if r.layout == 0 then
          local expired = call('ZCOUNT', r.key, '-inf', format('%.0f', r.cutoff))
          kth = tonumber(call('ZRANGE', r.key, expired + k - 1, expired + k - 1, 'WITHSCORES')[2])
        else
          kth = entry_at(r, r.expired + k - 1)
        end
        retry = kth + r.window - now
      end
      local reset = r.live > 0 and (r.latest + r.window - now) or 0
      row = {0, limit, max(limit - r.live, 0), retry, reset, 0}
    end
  elseif alg == 2 then
    local w, n = r.width, r.buckets
    if record then
      for _, b in ipairs(r.stored) do
        if b[1] + n < r.bucket then
          call('HDEL', r.key, 'b' .. format('%.0f', b[1]))
        end
      end
      call('HINCRBY', r.key, 'b' .. format('%.0f', r.bucket), cost)
      call('HSET', r.key, 't', format('%.0f', now))
      expire_after(r.key, (r.bucket + n + 1) * w - now)
    end
    if admitted then
      local estimate_w = r.estimate_w + units * w
      row = {1, limit, div(limit * w - estimate_w, w), 0, (r.bucket + n + 1) * w - now, 0}
    else
      local retry = 0
      if r.verdict == 'over' then
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
      row = {0, limit, div(max(limit * w - r.estimate_w, 0), w), retry, reset, 0}
    end
  elseif alg == 3 then
    if record then
      if r.stored_window == r.index then
        call('HINCRBY', r.key, 'n', cost)
        call('HSET', r.key, 't', format('%.0f', now))
      else
        -- A new window's counter: its TTL is set now and never refreshed (seed 004).
        call('HSET', r.key, 'k', format('%.0f', r.index), 'n', cost, 't', format('%.0f', now))
        expire_after(r.key, r.window_end - now)
      end
    end
    if admitted then
      row = {1, limit, limit - r.count - units, 0, r.window_end - now, 0}
    else
      local reset = r.count > 0 and (r.window_end - now) or 0
      row = {0, limit, max(limit - r.count, 0), r.verdict == 'over' and reset or 0, reset, 0}
    end
  else
    local interval, tolerance = r.interval, r.tolerance
    if record then
      local tat = r.tat + cost * interval
      call('HSET', r.key, 'tat', format('%.0f', tat), 't', format('%.0f', now))
      expire_after(r.key, tat - now)
    end
    if admitted then
      local delay = alg == 5 and (r.tat - now) or 0
      row = {1, r.capacity, div(tolerance - (r.new - now), interval), 0, r.new - now, delay}
    else
      local retry = r.verdict == 'over' and (r.new - tolerance - now) or 0
      local remaining = div(max(tolerance - (r.tat - now), 0), interval)
      row = {0, r.capacity, remaining, retry, max(r.stored_tat - now, 0), 0}
    end
  end
  if r.verdict == 'never' then
    row[4] = -1
  elseif r.verdict == 'repeat' then
    -- Admitted before and still counting: allowed again, nothing recorded.
    row[1] = 1
    row[4] = 0
    row[6] = all_allow and max(r.repeat_release - now, 0) or 0
  elseif r.verdict == 'fits' then
    -- Refused by another rule, this one answers that it would have allowed.
    row[1] = 1
  end
  if record and request_id ~= '' then
    -- Forget ids whose admissions no longer count, then remember this one.
    local gone = call('ZRANGEBYSCORE', r.ids, '-inf', format('%.0f', now))
    for g = 1, #gone, 1000 do
      local chunk = {unpack(gone, g, min(g + 999, #gone))}
      call('ZREM', r.ids, unpack(chunk))
      call('HDEL', r.releases, unpack(chunk))
    end
    call('ZADD', r.ids, format('%.0f', now + row[5]), request_id)
    expire_after(r.ids, row[5])
    if row[6] > 0 then
      call('HSET', r.releases, request_id, format('%.0f', now + row[6]))
      expire_after(r.releases, row[5])
    end
  end
  row[7] = now
  row[8] = record and 1 or 0
  answers[i] = row
end
return answers
