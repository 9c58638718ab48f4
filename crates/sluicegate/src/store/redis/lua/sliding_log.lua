-- sliding-log (algorithm/sliding_log.rs): the time of every admitted unit, for a window W;
-- a check fits when its units and the live entries (those later than now - W) are at most
-- L. Two layouts of the same log (rule.rs, LogLayout):
--   ZSET     a sorted set, score = time, one member per unit (see its record); its
--            newest entry is the key's latest admission.
--   COMPACT  one string: a COMPACT_HEADER-byte header (head, count, latest time) and a
--            ring of L 8-byte times, oldest at head.
-- Evaluating leaves in the rule: now, cutoff (now - W: an entry at or before it has
-- expired), count (entries stored), expired (how many of them have; false while the zset
-- has not counted them), live (count - expired) and latest (the key's latest time; false
-- while the zset has not read it).

-- The answer of either layout; `entry(r, i)` is the time of entry i (from 0, oldest
-- first; -1 the newest, which only a zset that has not read its latest time asks for).
local function answer_log(r, admitted, over, units, entry)
  local limit, live, window, now = r.limit, r.live, r.window, r.now
  if admitted then
    return limit - live - units, 0, window, 0
  end
  local retry = 0
  if over then
    -- The check fits once the k-th live entry has expired.
    local k = live + units - limit
    retry = entry(r, r.expired + k - 1) + window - now
  end
  local reset = 0
  if live > 0 then
    reset = (r.latest or entry(r, -1)) + window - now
  end
  return max(limit - live, 0), retry, reset, 0
end

-- The steps of the ZSET layout.
local function zset_log_steps()
  -- A member: "time:<digits of n><n>".
  local MEMBER = INT .. ':%d' .. INT

  -- Decimal digits of a whole number n >= 1.
  local function digits(n)
    local d = 1
    while n >= 10 do
      n = floor(n / 10)
      d = d + 1
    end
    return d
  end

  local function entry(r, i)
    return tonumber(call('ZRANGE', r.key, i, i, 'WITHSCORES')[2])
  end

  -- The live entries: all of them (r.count) less the expired ones, which are few and at the
  -- front. (ZCOUNT of the live ones would walk them all, one by one in a small set's
  -- listpack.)
  local function count_live(r)
    r.expired = call('ZCOUNT', r.key, '-inf', int(r.cutoff))
    r.live = r.count - r.expired
  end

  local function evaluate(r, t, units)
    local key = r.key
    local total = call('ZCARD', key)
    if total == 0 then
      r.now = t
      return units <= r.limit
    end
    -- Time clamps to the newest entry only when that is later than t (Redis' clock stepped
    -- back, or a replay's time did): usually nothing is, and a count over the end of the set
    -- says so without reading an entry.
    if call('ZCOUNT', key, int(t + 1), '+inf') > 0 then
      r.latest = entry(r, -1)
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
    return r.live + units <= r.limit
  end

  -- Members "time:n" for n = first .. last, at `now`.
  local function add_members(key, now, first, last)
    if first == last then
      call('ZADD', key, int(now), format(MEMBER, now, digits(first), first))
      return
    end
    local stamp = int(now)
    local args = {}
    for n = first, last do
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

  -- Drops what has expired, and counts what is left when evaluating did not.
  local function prune(r)
    if not r.expired then
      r.expired = call('ZREMRANGEBYSCORE', r.key, '-inf', int(r.cutoff))
      r.live = r.count - r.expired
    elseif r.expired > 0 then
      call('ZREMRANGEBYSCORE', r.key, '-inf', int(r.cutoff))
    end
  end

  -- Member "time:n", n = live + u. After pruning the set holds exactly `live` entries, and
  -- units at one instant are only added while it is the key's latest (time is clamped), when
  -- nothing can be pruned: so the n of one instant are at most `live` and never repeat.
  -- report, refund and unreserve keep it so (they renumber the newest instant once they
  -- remove entries). n is written with its digit count first, so that members of one
  -- instant sort by n (a give-back and a refund remove the highest).
  local function record(r, cost, margin)
    prune(r)
    add_members(r.key, r.now, r.live + 1, r.live + cost)
    call('PEXPIRE', r.key, ttl_ms(r.window, margin))
  end

  -- Into debt the log keeps its newest L live units: the oldest older entries go, and the
  -- entries at now are written anew as n = (older ones kept) + 1 .. L.
  local function report(r, cost, margin)
    if not r.expired then
      count_live(r)
    end
    local limit = r.limit
    if r.live + cost <= limit then
      record(r, cost, margin)
      return true
    end
    local key, now = r.key, r.now
    prune(r)
    local at_now = r.live > 0 and call('ZCOUNT', key, int(now), int(now)) or 0
    local older_kept = limit - min(at_now + cost, limit)
    local older_dropped = r.live - at_now - older_kept
    if older_dropped > 0 then
      call('ZREMRANGEBYRANK', key, 0, older_dropped - 1)
    end
    if at_now > 0 then
      call('ZREMRANGEBYSCORE', key, int(now), int(now))
    end
    add_members(key, now, older_kept + 1, limit)
    call('PEXPIRE', key, ttl_ms(r.window, margin))
    return true
  end

  -- Once entries are removed (expired ones pruned, live ones given back), the newest
  -- instant, where a check clamped to it would add live + 1 on, may hold numbers above the
  -- live count: its members are renumbered to end at it (`live`, what the set holds).
  local function renumber_newest(r, live)
    if live == 0 then
      return
    end
    local key = r.key
    local newest = entry(r, -1)
    local stamp = int(newest)
    local at_newest = call('ZCOUNT', key, stamp, stamp)
    call('ZREMRANGEBYSCORE', key, stamp, stamp)
    add_members(key, newest, live - at_newest + 1, live)
  end

  -- The newest live entries go first (the highest n of the newest instant).
  local function refund(r, cost)
    if not r.expired then
      count_live(r)
    end
    local taken = min(cost, r.live)
    if taken == 0 then
      return false
    end
    prune(r)
    call('ZREMRANGEBYRANK', r.key, -taken, -1)
    r.live = r.live - taken
    renumber_newest(r, r.live)
    return true
  end

  local function answer(r, admitted, over, units)
    if not r.expired then
      count_live(r)
    end
    return answer_log(r, admitted, over, units, entry)
  end

  -- Up to `cost` members at `at`, the highest n (the latest added) first.
  local function members_at(r, at, cost)
    local stamp = int(at)
    return call('ZREVRANGEBYSCORE', r.key, stamp, stamp, 'LIMIT', 0, cost)
  end

  -- Units recorded at one instant are indistinguishable: any `cost` members at `at` will do.
  local function give_back(r, at, cost)
    local taken = members_at(r, at, cost)
    if #taken > 0 then
      call('ZREM', r.key, unpack(taken))
    end
  end

  -- From the entries at `at`, while they are live (those among the newest L that a report
  -- into debt kept are all the set holds) and at least the reservation's r of them are:
  -- fewer means a trim or a refund took some, and whose are left can no longer be told.
  -- Otherwise nothing changes.
  local function unreserve(r, at, _, units)
    if r.count == 0 or at <= r.cutoff then
      return
    end
    local held = members_at(r, at, r.reserved)
    if #held < r.reserved then
      return
    end
    if not r.expired then
      count_live(r)
    end
    prune(r)
    call('ZREM', r.key, unpack(held, 1, units))
    renumber_newest(r, r.live - units)
  end

  return evaluate, record, answer, give_back, report, refund, unreserve
end

-- The steps of the COMPACT layout.
local function compact_log_steps()
  local COMPACT_HEADER = 24
  -- How many of the oldest entries evaluating reads at once (see evaluate).
  local COMPACT_FRONT = 8

  local function slot_offset(r, i)
    return COMPACT_HEADER + 8 * ((r.head + i) % r.limit)
  end

  local function entry(r, i)
    local o = slot_offset(r, i)
    return (unpack_struct('<d', call('GETRANGE', r.key, o, o + 7)))
  end

  local function evaluate(r, t, units)
    local header = call('GETRANGE', r.key, 0, COMPACT_HEADER - 1)
    if #header == COMPACT_HEADER then
      r.head, r.count, r.latest = unpack_struct('<ddd', header)
    else
      r.latest, r.new_key = 0, true
    end
    r.now = max(t, r.latest)
    r.cutoff = r.now - r.window
    -- Admissions drop what has expired, so what has expired since is usually a few of the
    -- oldest entries: one read of up to COMPACT_FRONT of them finds where the live ones
    -- start; only when all of those have expired does a binary search go on.
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
        if entry(r, mid) <= r.cutoff then
          low = mid + 1
        else
          high = mid
        end
      end
      r.expired = low
    end
    r.live = r.count - r.expired
    return r.live + units <= r.limit
  end

  local function record(r, cost, margin)
    local key, now, limit = r.key, r.now, r.limit
    local run = string.rep(pack('<d', now), cost)
    if r.new_key then
      -- Allocated whole, once, with its TTL: growing by SETRANGE would let Redis
      -- over-allocate.
      call('SET', key, pack('<ddd', 0, cost, now) .. run
        .. string.rep('\0', 8 * (limit - cost)), 'PX', ttl_ms(r.window, margin))
      return
    end
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

  -- Into debt the ring keeps its newest L live units: the oldest live ones are dropped as
  -- the expired ones are, and at most L new ones written.
  local function report(r, cost, margin)
    local limit = r.limit
    if r.live + cost > limit then
      local written = min(cost, limit)
      local dropped = r.live + written - limit
      r.expired, r.live = r.expired + dropped, r.live - dropped
      cost = written
    end
    record(r, cost, margin)
    return true
  end

  -- The newest live entries go first; the latest time becomes the newest entry left, and a
  -- ring left empty is deleted.
  local function refund(r, cost)
    local taken = min(cost, r.live)
    if taken == 0 then
      return false
    end
    local count = r.live - taken
    if count == 0 then
      call('DEL', r.key)
      return true
    end
    r.head = (r.head + r.expired) % r.limit
    call('SETRANGE', r.key, 0, pack('<ddd', r.head, count, entry(r, count - 1)))
    return true
  end

  local function answer(r, admitted, over, units)
    return answer_log(r, admitted, over, units, entry)
  end

  -- The first index in [low, high) whose entry is not `before` (the ring is in time order).
  local function first_not(r, low, high, before)
    while low < high do
      local mid = floor((low + high) / 2)
      if before(entry(r, mid)) then
        low = mid + 1
      else
        high = mid
      end
    end
    return low
  end

  -- The `n` entries from index `i` on, as one string: one read, two if they wrap.
  local function read_entries(r, i, n)
    if n == 0 then
      return ''
    end
    local start = (r.head + i) % r.limit
    local fitting = min(n, r.limit - start)
    local o = COMPACT_HEADER + 8 * start
    local entries = call('GETRANGE', r.key, o, o + 8 * fitting - 1)
    if fitting < n then
      local rest = COMPACT_HEADER + 8 * (n - fitting) - 1
      entries = entries .. call('GETRANGE', r.key, COMPACT_HEADER, rest)
    end
    return entries
  end

  -- Writes `entries` from index `i` on: one write, two if they wrap.
  local function write_entries(r, i, entries)
    local n = #entries / 8
    if n == 0 then
      return
    end
    local start = (r.head + i) % r.limit
    local fitting = min(n, r.limit - start)
    call('SETRANGE', r.key, COMPACT_HEADER + 8 * start, string.sub(entries, 1, 8 * fitting))
    if fitting < n then
      call('SETRANGE', r.key, COMPACT_HEADER, string.sub(entries, 8 * fitting + 1))
    end
  end

  -- Removes `cost` of the entries at `at` when at least `needed` are held: two binary
  -- searches find the run, and the later entries shift back in one slice (L may be tens of
  -- millions: a command per entry would block Redis for seconds).
  local function take_run(r, at, cost, needed)
    local header = call('GETRANGE', r.key, 0, COMPACT_HEADER - 1)
    if #header ~= COMPACT_HEADER then
      return
    end
    r.head, r.count = unpack_struct('<dd', header)
    local after = first_not(r, 0, r.count, function(e) return e <= at end)
    local held = after - first_not(r, 0, after, function(e) return e < at end)
    if held == 0 or held < needed then
      return
    end
    local removed = min(cost, held)
    write_entries(r, after - removed, read_entries(r, after, r.count - after))
    r.count = r.count - removed
    -- The latest time is the newest entry left, as if the admission never was.
    local latest = r.count > 0 and entry(r, r.count - 1) or 0
    call('SETRANGE', r.key, 0, pack('<ddd', r.head, r.count, latest))
  end

  local function give_back(r, at, cost)
    take_run(r, at, cost, 0)
  end

  -- From the run of entries at `at`, while they are live (a report into debt kept in the
  -- ring only the newest L) and at least the reservation's r of them are (see the zset's).
  local function unreserve(r, at, _, units)
    if r.live > 0 and at > r.cutoff then
      take_run(r, at, units, r.reserved)
    end
  end

  return evaluate, record, answer, give_back, report, refund, unreserve
end
