-- sluicegate: one check of one or more rules, atomically (SPEC.md).
--
-- The Rust algorithms (crates/sluicegate/src/algorithm/) are the reference; this script
-- re-implements them and differential tests hold the two together. Every rule is evaluated
-- first (reads only); only if all allow does each record. A refused check writes nothing.
--
-- ARGV[1]  client time in µs, or '' for Redis TIME
-- ARGV[2]  cost (0 is a peek: answers as a cost of 1, records nothing)
-- ARGV[3]  request id, or ''
-- ARGV[4]  number of rules R; then 7 values per rule:
--          algorithm (1 sliding-log, 2 sliding-counter, 3 fixed-window, 4 token-bucket,
--          5 leaky-bucket), limit L, window W (µs), buckets N, capacity, emission
--          interval T (µs), layout (0 zset, 1 compact; sliding-log only)
-- KEYS     3 per rule: state, request ids (zset id -> expiry), release times (hash)
--
-- Returns R arrays {allows, limit, remaining, retry_after (-1 never), reset_after, delay}.
-- Every number stays below 2^53 (rules are validated for it); times are formatted with
-- %.0f because tostring loses digits past 14.

local function fmt(x)
  return string.format('%.0f', x)
end

-- floor(x / y) for integers, exact even where the double quotient rounds up to the next
-- integer.
local function div(x, y)
  local q = math.floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

-- Redis expires keys on its own clock. A check that carries its own time (replay, tests)
-- may run that time far faster than Redis's, so such keys get a minute more; with Redis
-- TIME the TTL is exact.
local ttl_margin_ms = ARGV[1] == '' and 0 or 60000

-- PEXPIRE takes ms: round µs up, so a key never expires before its state stops mattering.
local function expire_after(key, micros)
  redis.call('PEXPIRE', key, math.max(1, math.floor((micros + 999) / 1000)) + ttl_margin_ms)
end

local t
if ARGV[1] == '' then
  local now = redis.call('TIME')
  t = tonumber(now[1]) * 1000000 + tonumber(now[2])
else
  t = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
local units = math.max(cost, 1)
local request_id = ARGV[3]
local rule_count = tonumber(ARGV[4])

local SLIDING_LOG, SLIDING_COUNTER, FIXED_WINDOW, TOKEN_BUCKET, LEAKY_BUCKET = 1, 2, 3, 4, 5

-- sliding-log, zset layout: score = time, member = "time:n", unique per entry. The newest
-- entry is the key's latest admission, so it also gives the key's latest time.
local zset_log = {}

function zset_log.load(r)
  local newest = redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')
  r.latest = newest[2] and tonumber(newest[2]) or 0
end

function zset_log.plan(r, now)
  r.cutoff = now - r.window
  r.live = redis.call('ZCOUNT', r.key, '(' .. fmt(r.cutoff), '+inf')
end

function zset_log.kth_live(r, k)
  local expired = redis.call('ZCOUNT', r.key, '-inf', fmt(r.cutoff))
  local entry = redis.call('ZRANGE', r.key, expired + k - 1, expired + k - 1, 'WITHSCORES')
  return tonumber(entry[2])
end

function zset_log.record(r, now)
  redis.call('ZREMRANGEBYSCORE', r.key, '-inf', fmt(r.cutoff))
  local same_time = redis.call('ZCOUNT', r.key, fmt(now), fmt(now))
  local args = {}
  for i = 1, cost do
    args[#args + 1] = fmt(now)
    args[#args + 1] = fmt(now) .. ':' .. (same_time + i)
    if #args >= 1000 then
      redis.call('ZADD', r.key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', r.key, unpack(args))
  end
  expire_after(r.key, r.window)
end

-- sliding-log, compact layout: one string, a 16-byte header (head, count) and a ring of L
-- slots of 8 bytes (the admission time of one unit, a double), oldest at `head`.
local compact_log = {}

local function slot_offset(r, i)
  return 16 + 8 * ((r.head + i) % r.limit)
end

local function entry_at(r, i)
  local bytes = redis.call('GETRANGE', r.key, slot_offset(r, i), slot_offset(r, i) + 7)
  return struct.unpack('<d', bytes)
end

function compact_log.load(r)
  local header = redis.call('GETRANGE', r.key, 0, 15)
  if #header == 16 then
    r.head, r.count = struct.unpack('<dd', header)
  else
    r.head, r.count, r.new_key = 0, 0, true
  end
  r.latest = r.count > 0 and entry_at(r, r.count - 1) or 0
end

function compact_log.plan(r, now)
  r.cutoff = now - r.window
  -- Entries expire oldest first. Usually the oldest is still live (admissions drop what
  -- has expired); otherwise a binary search finds the first live one.
  local expired = 0
  if r.count > 0 and entry_at(r, 0) <= r.cutoff then
    local low, high = 1, r.count
    while low < high do
      local mid = math.floor((low + high) / 2)
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

function compact_log.kth_live(r, k)
  return entry_at(r, r.expired + k - 1)
end

function compact_log.record(r, now)
  if r.new_key then
    -- Allocated whole, once: growing by SETRANGE would let Redis over-allocate.
    redis.call('SET', r.key, string.rep('\0', 16 + 8 * r.limit))
  end
  r.head = (r.head + r.expired) % r.limit
  r.count = r.count - r.expired
  local packed = struct.pack('<d', now)
  for i = 0, cost - 1 do
    redis.call('SETRANGE', r.key, slot_offset(r, r.count + i), packed)
  end
  r.count = r.count + cost
  redis.call('SETRANGE', r.key, 0, struct.pack('<dd', r.head, r.count))
  expire_after(r.key, r.window)
end

local function log_layout(r)
  return r.layout == 1 and compact_log or zset_log
end

local sliding_log = {}

function sliding_log.load(r)
  log_layout(r).load(r)
end

function sliding_log.plan(r, now)
  log_layout(r).plan(r, now)
  return r.live + units <= r.limit
end

function sliding_log.admit(r, now, record)
  if record then
    log_layout(r).record(r, now)
  end
  return {1, r.limit, r.limit - r.live - units, 0, r.window, 0}
end

function sliding_log.refuse(r, now, retry)
  local retry_after = retry
  if retry == 'over' then
    retry_after = log_layout(r).kth_live(r, r.live + units - r.limit) + r.window - now
  end
  local reset_after = r.live > 0 and (r.latest + r.window - now) or 0
  return {0, r.limit, math.max(r.limit - r.live, 0), retry_after, reset_after, 0}
end

-- fixed-window: a hash {k = window index, n = units in it, t = latest time}. Its TTL is
-- set when a window's counter is created, never refreshed by later hits (seed 004).
local fixed_window = {}

function fixed_window.load(r)
  local v = redis.call('HMGET', r.key, 'k', 'n', 't')
  r.stored_window = tonumber(v[1])
  r.stored_count = tonumber(v[2]) or 0
  r.latest = tonumber(v[3]) or 0
end

function fixed_window.plan(r, now)
  r.index = div(now, r.window)
  r.count = r.stored_window == r.index and r.stored_count or 0
  r.window_end = (r.index + 1) * r.window
  return r.count + units <= r.limit
end

function fixed_window.admit(r, now, record)
  if record then
    if r.stored_window == r.index then
      redis.call('HINCRBY', r.key, 'n', cost)
      redis.call('HSET', r.key, 't', fmt(now))
    else
      redis.call('HSET', r.key, 'k', fmt(r.index), 'n', cost, 't', fmt(now))
      expire_after(r.key, r.window_end - now)
    end
  end
  return {1, r.limit, r.limit - r.count - units, 0, r.window_end - now, 0}
end

function fixed_window.refuse(r, now, retry)
  local reset_after = r.count > 0 and (r.window_end - now) or 0
  local retry_after = retry == 'over' and reset_after or retry
  return {0, r.limit, math.max(r.limit - r.count, 0), retry_after, reset_after, 0}
end

-- sliding-counter: a hash {t = latest time, b<j> = units in bucket j}.
local sliding_counter = {}

function sliding_counter.load(r)
  local fields = redis.call('HGETALL', r.key)
  r.latest = 0
  r.stored = {}
  for i = 1, #fields, 2 do
    if fields[i] == 't' then
      r.latest = tonumber(fields[i + 1])
    else
      r.stored[#r.stored + 1] = {tonumber(string.sub(fields[i], 2)), tonumber(fields[i + 1])}
    end
  end
  table.sort(r.stored, function(a, b) return a[1] < b[1] end)
  r.width = div(r.window, r.buckets)
end

function sliding_counter.plan(r, now)
  local w, n = r.width, r.buckets
  r.bucket = div(now, w)
  local offset = now - r.bucket * w
  local full, sliding = 0, 0
  for _, b in ipairs(r.stored) do
    if b[1] + n == r.bucket then
      sliding = b[2]
    elseif b[1] + n > r.bucket then
      full = full + b[2]
    end
  end
  r.estimate_w = w * full + sliding * (w - offset)
  return r.estimate_w <= (r.limit - units) * w
end

function sliding_counter.admit(r, now, record)
  local w, n = r.width, r.buckets
  if record then
    for _, b in ipairs(r.stored) do
      if b[1] + n < r.bucket then
        redis.call('HDEL', r.key, 'b' .. fmt(b[1]))
      end
    end
    redis.call('HINCRBY', r.key, 'b' .. fmt(r.bucket), cost)
    redis.call('HSET', r.key, 't', fmt(now))
    expire_after(r.key, (r.bucket + n + 1) * w - now)
  end
  local estimate_w = r.estimate_w + units * w
  return {1, r.limit, div(r.limit * w - estimate_w, w), 0, (r.bucket + n + 1) * w - now, 0}
end

-- The least d >= 0 at which the check would fit: walk the pieces where E is linear (see
-- SlidingCounterState::retry_after).
local function counter_retry_after(r, now)
  local w, n, stored = r.width, r.buckets, r.stored
  local target = (r.limit - units) * w
  local piece = div(now, w)
  local first_full = 1
  local full = 0
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
    local offset = math.max(now - start, 0)
    if w * full <= target then
      if sliding == 0 then
        return start + offset - now
      end
      local slack = div(target - w * full, sliding)
      local needed = math.max(offset, math.max(w - slack, 0))
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

function sliding_counter.refuse(r, now, retry)
  local w = r.width
  local retry_after = retry
  if retry == 'over' then
    retry_after = counter_retry_after(r, now)
  end
  local reset_after = 0
  local newest = r.stored[#r.stored]
  if newest then
    reset_after = math.max((newest[1] + r.buckets + 1) * w - now, 0)
  end
  local remaining = div(math.max(r.limit * w - r.estimate_w, 0), w)
  return {0, r.limit, remaining, retry_after, reset_after, 0}
end

-- token-bucket and leaky-bucket: GCRA, a hash {tat = theoretical arrival time, t = latest}.
local gcra = {}

function gcra.load(r)
  local v = redis.call('HMGET', r.key, 'tat', 't')
  r.stored_tat = tonumber(v[1]) or 0
  r.latest = tonumber(v[2]) or 0
  r.tolerance = r.interval * r.capacity
end

function gcra.plan(r, now)
  r.tat = math.max(r.stored_tat, now)
  r.new = r.tat + units * r.interval
  return r.new - now <= r.tolerance
end

function gcra.admit(r, now, record)
  if record then
    local tat = r.tat + cost * r.interval
    redis.call('HSET', r.key, 'tat', fmt(tat), 't', fmt(now))
    expire_after(r.key, tat - now)
  end
  local delay = r.algorithm == LEAKY_BUCKET and (r.tat - now) or 0
  return {1, r.capacity, div(r.tolerance - (r.new - now), r.interval), 0, r.new - now, delay}
end

function gcra.refuse(r, now, retry)
  local retry_after = retry
  if retry == 'over' then
    retry_after = r.new - r.tolerance - now
  end
  local remaining = div(math.max(r.tolerance - (r.tat - now), 0), r.interval)
  return {0, r.capacity, remaining, retry_after, math.max(r.stored_tat - now, 0), 0}
end

local algorithms = {
  [SLIDING_LOG] = sliding_log,
  [SLIDING_COUNTER] = sliding_counter,
  [FIXED_WINDOW] = fixed_window,
  [TOKEN_BUCKET] = gcra,
  [LEAKY_BUCKET] = gcra,
}

-- Evaluate every rule: reads only.
local rules = {}
local all_allow = true
for i = 1, rule_count do
  local a = 4 + (i - 1) * 7
  local r = {
    algorithm = tonumber(ARGV[a + 1]),
    limit = tonumber(ARGV[a + 2]),
    window = tonumber(ARGV[a + 3]),
    buckets = tonumber(ARGV[a + 4]),
    capacity = tonumber(ARGV[a + 5]),
    interval = tonumber(ARGV[a + 6]),
    layout = tonumber(ARGV[a + 7]),
    key = KEYS[(i - 1) * 3 + 1],
    ids = KEYS[(i - 1) * 3 + 2],
    releases = KEYS[(i - 1) * 3 + 3],
  }
  r.impl = algorithms[r.algorithm]
  r.impl.load(r)
  r.now = math.max(t, r.latest)
  local fits = r.impl.plan(r, r.now)
  if request_id ~= '' then
    local expires = tonumber(redis.call('ZSCORE', r.ids, request_id))
    local release = tonumber(redis.call('HGET', r.releases, request_id))
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
  if r.verdict ~= 'fits' and r.verdict ~= 'repeat' then
    all_allow = false
  end
  rules[i] = r
end

-- Forget request ids whose admissions no longer count, then remember this one.
local function remember_request(r, decision)
  local gone = redis.call('ZRANGEBYSCORE', r.ids, '-inf', fmt(r.now))
  for i = 1, #gone, 1000 do
    local chunk = {unpack(gone, i, math.min(i + 999, #gone))}
    redis.call('ZREM', r.ids, unpack(chunk))
    redis.call('HDEL', r.releases, unpack(chunk))
  end
  redis.call('ZADD', r.ids, fmt(r.now + decision[5]), request_id)
  expire_after(r.ids, decision[5])
  if decision[6] > 0 then
    redis.call('HSET', r.releases, request_id, fmt(r.now + decision[6]))
    expire_after(r.releases, decision[5])
  end
end

local answers = {}
for i, r in ipairs(rules) do
  local decision
  if all_allow and r.verdict == 'repeat' then
    -- Admitted before and still counting: allowed again, nothing recorded.
    decision = r.impl.refuse(r, r.now, 0)
    decision[1] = 1
    decision[6] = math.max(r.repeat_release - r.now, 0)
  elseif all_allow then
    decision = r.impl.admit(r, r.now, cost > 0)
    if cost > 0 and request_id ~= '' then
      remember_request(r, decision)
    end
  else
    local retry = 0
    if r.verdict == 'never' then
      retry = -1
    elseif r.verdict == 'over' then
      retry = 'over'
    end
    decision = r.impl.refuse(r, r.now, retry)
    -- A rule that would have allowed says so; it recorded nothing either.
    if r.verdict == 'fits' or r.verdict == 'repeat' then
      decision[1] = 1
    end
  end
  answers[i] = decision
end
return answers
