-- sliding-log (algorithm/sliding_log.rs): the time of every admitted unit, for a window W;
-- a check fits when its units and the live entries (those later than now - W) are at most
-- L. Two layouts of the same log (rule.rs, LogLayout):
--   ZSET     a sorted set, score = time, one member per unit (see its record); its
--            newest entry is the key's latest admission.
--   COMPACT  one string: a header and a ring of times as offsets of a few bytes, sized
--            to what is live (sliding_log_compact.lua).
-- Evaluating leaves in the rule: now, cutoff (now - W: an entry at or before it has
-- expired), count (entries stored), expired (how many of them have; false while the zset
-- has not counted them), live (count - expired) and latest (the key's latest time; false
-- while the zset has not read it); a zset too full to admit without pruning, also awaited
-- (the entry a refusal waits for).

-- The answer of either layout; `entry(r, i)` is the time of entry i (from 0, oldest
-- first; -1 the newest, which only a zset that has not read its latest time asks for).
-- Refused over the limit for one unit, at least L entries are live and none remains: that
-- answer reads no live count (the zset counts none for it).
local function answer_log(r, admitted, over, units, entry)
  local limit, window, now = r.limit, r.window, r.now
  if admitted then
    return limit - r.live - units, 0, window, 0
  end
  local remaining = 0
  if not over or units > 1 then
    remaining = max(limit - r.live, 0)
  end
  local retry = 0
  if over then
    -- The check fits once the k-th live entry has expired, k = live + units - L: the entry
    -- at rank expired + k - 1 = count + units - L - 1.
    retry = entry(r, r.count + units - limit - 1) + window - now
  end
  -- Over the limit (for at most L units: more is never), some entry is live.
  local reset = 0
  if over or r.live > 0 then
    reset = (r.latest or entry(r, -1)) + window - now
  end
  return remaining, retry, reset, 0
end

-- The short checks either layout's decide takes: of one unit (cost 1: a sliding log decides
-- a check for its cost), recorded if they fit (not dry), under a limit of at least one (so
-- that one unit is never more than the capacity).
local function log_decides(r, cost, dry)
  return cost == 1 and not dry and r.capacity >= 1
end

-- The steps of the ZSET layout.
local function zset_log_steps()
  -- The number of digits of a whole number below 2^53, as text, by that number.
  local DIGIT_COUNTS = {
    '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15', '16',
  }

  -- A member: "time:<digits of n><n>", from `stamp`, the time as int wrote it: the
  -- parts joined by one concatenation (string.format would write the numbers anew).
  local function member(stamp, n)
    local written_n = int(n)
    return stamp .. ':' .. DIGIT_COUNTS[#written_n] .. written_n
  end

  -- The time of entry i of `key`'s log (nil if it holds no such entry): its member's stamp,
  -- the score as int wrote it (a score in a reply is written with "%.17g", as a number
  -- argument is: see prelude.lua).
  local function entry_of(key, i)
    local rank = i == -1 and '-1' or int(i)
    local at = call('ZRANGE', key, rank, rank)[1]
    return at and tonumber(sub(at, 1, find(at, ':', 1, true) - 1))
  end

  -- The time of entry i of the rule's log, as answer_log asks.
  local function entry(r, i)
    return entry_of(r.key, i)
  end

  -- The live entries: all of them (r.count) less the expired ones, which are few and at the
  -- front. (ZCOUNT of the live ones would walk them all, one by one in a small set's
  -- listpack.)
  local function count_live(r)
    r.expired = call('ZCOUNT', r.key, '-inf', int(r.cutoff))
    r.live = r.count - r.expired
  end

  -- Where a check of `units` at `t` stands on `key`'s log: whether they fit, the time
  -- decided at (never before the key's latest entry), the entries stored, how many of those
  -- have expired (false until known), the key's latest time (false while unread) and the
  -- entry a refusal waits for (false while unread). A full log of a check of one unit that
  -- records if it fits (`records`: decide's checks) is pruned first, as far as t - W: each
  -- of those entries has expired at t, and at any later time the key clamps to. If that
  -- removes any, the check fits and records at t or later, and recording prunes what has
  -- expired by then: the same entries and perhaps more, so the prune changed nothing
  -- recording would not. If it removes none, it wrote nothing. So a refused check still
  -- writes nothing, and an admission whose time is not clamped learns what it may drop
  -- without reading an entry; a refusal pays for a prune that removes nothing.
  local function stand(key, t, units, records, limit, window)
    local total = call('ZCARD', key)
    local expired = false
    if records and units == 1 and total == limit then
      total = total - call('ZREMRANGEBYSCORE', key, '-inf', int(t - window))
      expired = 0
    end
    if total == 0 then
      return units <= limit, t, 0, 0, false, false
    end
    local latest = false
    if total + units <= limit then
      -- Time clamps to the newest entry only when that is later than t (Redis' clock
      -- stepped back, or a replay's time did): usually nothing is, and a count over the end
      -- of the set says so without reading an entry.
      if call('ZCOUNT', key, int(t + 1), '+inf') > 0 then
        latest = entry_of(key, -1)
      end
    else
      -- A log this full may refuse, and a refusal's reset_after needs the newest entry: it
      -- is read for the clamp too, one command where a count and then a read would be two.
      latest = entry_of(key, -1)
    end
    local now = max(t, latest or 0)
    -- Entries up to the clamped time's cutoff may have expired too: how many is learnt when
    -- recording prunes them, or counted if the check answers without recording.
    if now > t then
      expired = false
    end
    if total + units <= limit then
      return true, now, total, expired, latest, false
    end
    -- The check fits once the oldest total + units - L entries have expired: once the
    -- newest of them, at that rank, has. That entry is also the one a refusal waits for
    -- (answer_log's), so one read decides and answers; when it is the newest entry (units
    -- = L), it was read just above. More units than L never fit, and no entry says when.
    local rank = total + units - limit - 1
    if rank >= total then
      return false, now, total, expired, latest, false
    end
    local awaited = rank == total - 1 and latest or entry_of(key, rank)
    return awaited <= now - window, now, total, expired, latest, awaited
  end

  local function evaluate(r, t, units)
    local fits, now, total, expired, latest, awaited = stand(r.key, t, units, false, r.limit,
      r.window)
    r.now, r.cutoff, r.latest, r.awaited = now, now - r.window, latest, awaited
    if total > 0 then
      r.count, r.expired = total, expired
      if expired then
        r.live = total - expired
      end
    end
    return fits
  end

  -- Members "time:n" for n = first .. last, at `now`; then, given `ttl`, the key's TTL (an
  -- admission's: one that only renumbers leaves it).
  local function add_members(key, now, first, last, ttl)
    local stamp = int(now)
    if first == last then
      call('ZADD', key, stamp, member(stamp, first))
    else
      local args = {}
      for n = first, last do
        args[#args + 1] = stamp
        args[#args + 1] = member(stamp, n)
        if #args >= 1000 then
          call('ZADD', key, unpack(args))
          args = {}
        end
      end
      if #args > 0 then
        call('ZADD', key, unpack(args))
      end
    end
    if ttl then
      call('PEXPIRE', key, ttl)
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
    add_members(r.key, r.now, r.live + 1, r.live + cost, ttl_ms(r.window, margin))
  end

  -- A short check (main.lua, run_short) of one unit that records if it fits, under a limit
  -- of at least one (log_decides: most checks of a zset log), decided in one step, to the
  -- state and numbers evaluate, record and answer give it there, without a rule slot's
  -- bookkeeping. Returns the check's status and numbers (main.lua, add_answer); refused,
  -- over the limit for one unit (never more than L: the limit is at least one), at least L
  -- entries are live, and the answer counts none (answer_log).
  -- Under a limit of one the newest entry is read first, and it decides: it is the key's
  -- latest time and the entry a refusal waits for, and once it has expired so has every
  -- older one. A refusal sends nothing else; an admission prunes only if an entry is there.
  -- Under a longer limit that read would decide nothing, and reading and parsing a member
  -- costs more than the count stand makes in its place, on every admission. There the
  -- commands differ from those steps' only on a full log, pruned first (stand): an
  -- admission there sends a prune and a count where those steps read one or two entries.
  local function decide(r, key, t, _, _, _, _, margin)
    local limit, window = r.limit, r.window
    if limit == 1 then
      local latest = entry_of(key, -1)
      local now = t
      if latest then
        now = max(t, latest)
        if latest > now - window then
          return 0, 0, latest + window - now, latest + window - now, 0
        end
        call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))
      end
      add_members(key, now, 1, 1, ttl_ms(window, margin))
      return RECORDED_AT - now, 0, 0, window, 0
    end
    local fits, now, total, expired, latest, awaited = stand(key, t, 1, true, limit, window)
    if not fits then
      return 0, 0, awaited + window - now, latest + window - now, 0
    end
    if not expired then
      expired = call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))
    end
    local live = total - expired
    add_members(key, now, live + 1, live + 1, ttl_ms(window, margin))
    return RECORDED_AT - now, limit - live - 1, 0, window, 0
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
      call('ZREMRANGEBYRANK', key, '0', int(older_dropped - 1))
    end
    if at_now > 0 then
      call('ZREMRANGEBYSCORE', key, int(now), int(now))
    end
    add_members(key, now, older_kept + 1, limit, ttl_ms(r.window, margin))
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
    call('ZREMRANGEBYRANK', r.key, int(-taken), '-1')
    r.live = r.live - taken
    renumber_newest(r, r.live)
    return true
  end

  -- The entry a refusal waits for, as evaluate read it.
  local function awaited(r)
    return r.awaited
  end

  local function answer(r, admitted, over, units)
    if not r.expired and not (over and units == 1) then
      count_live(r)
    end
    return answer_log(r, admitted, over, units, over and awaited or entry)
  end

  -- Up to `cost` members at `at`, the highest n (the latest added) first.
  local function members_at(r, at, cost)
    local stamp = int(at)
    return call('ZREVRANGEBYSCORE', r.key, stamp, stamp, 'LIMIT', '0', int(cost))
  end

  -- Units recorded at one instant are indistinguishable: any `cost` members at `at` will do.
  -- `at` may be older than the newest instant (another check landed between the admission
  -- and its give-back), whose numbers then run past the live count: they are renumbered,
  -- counting live what a check clamped to that instant would.
  local function give_back(r, at, cost)
    local taken = members_at(r, at, cost)
    if #taken == 0 then
      return
    end
    local key = r.key
    call('ZREM', key, unpack(taken))
    local total = call('ZCARD', key)
    if total > 0 then
      local cutoff = entry(r, -1) - r.window
      renumber_newest(r, total - call('ZCOUNT', key, '-inf', int(cutoff)))
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

  return evaluate, record, answer, give_back, report, refund, unreserve, decide, log_decides
end
