-- The steps of the COMPACT sliding-log layout: one string, a header and a ring of `room`
-- entries, oldest at head. An entry is its time modulo SPAN = 2^(8w), in w bytes: the
-- fewest (3 to 7) whose SPAN exceeds twice the window W. It is read against the latest
-- time, which the header holds whole: every entry stored lies in (latest - W, latest] (an
-- admission drops what has expired before it writes, a report into debt keeps the newest
-- L live, a refund or give-back makes the latest the newest entry left), so an entry is
-- the one time of that span with its residue, latest - ((latest - entry) mod SPAN), and no
-- entry is ever rewritten as time runs on.
-- The header (COMPACT_FIXED bytes): room (4 bytes), which only a rewrite changes, then head
-- and count (4 bytes each) and the latest time (a double; the key's latest admission is its
-- newest entry), which an admission writes at COMPACT_STATE. The ring grows and shrinks
-- with what is live: a string rewritten whole with one SET, sized to fill its allocation
-- (room_for), never grown in place (Redis would double it). See sliding_log.lua for what
-- evaluating leaves in the rule; also room and latest_residue. The steps are made per
-- width (compact_log_maker), their formats constants.
local COMPACT_FIXED, COMPACT_STATE = 20, 4
-- How many of the oldest entries evaluating reads at once (see stand).
local COMPACT_FRONT = 8
-- How many bytes of the string reading the header reads: the header and the ring's first
-- entries, which stand and a rewrite then take from what was read, not with a command of
-- their own (a command costs Redis thousands of instructions, a few hundred bytes more of
-- a reply next to nothing). A ring of a limit of 100 or so is read whole.
local COMPACT_READ = 512

local function compact_log_steps(w)
  -- The header's struct format, the state's (its part from COMPACT_STATE on), an entry's,
  -- the span of the entries' residues, and where the ring starts.
  local HEADER, STATE, ENTRY = '<I4I4I4d', '<I4I4d', '<I' .. w
  local SPAN, RING = 2 ^ (8 * w), COMPACT_FIXED
  -- The offsets commands are given as they are, as text (see prelude.lua): where the state
  -- starts, the last byte read_header reads, where the ring starts.
  local STATE_AT, READ_LAST, RING_AT = int(COMPACT_STATE), int(COMPACT_READ - 1), int(RING)

  -- The time whose residue is `residue`, among the W before the latest.
  local function decoded(r, residue)
    return r.latest - (r.latest_residue - residue) % SPAN
  end

  local function set_latest(r, latest)
    r.latest, r.latest_residue = latest, latest % SPAN
  end

  -- The header's head, count and latest time (room stays).
  local function write_state(r, head, count, latest)
    r.read = ''
    call('SETRANGE', r.key, STATE_AT, pack(STATE, head, count, latest))
    set_latest(r, latest)
  end

  -- Reads the header into `r`, and keeps the string's first COMPACT_READ bytes as read
  -- (r.read) for what the check reads until it writes (locate, record); false when there is no
  -- key, which reads as an empty ring with no room and no latest time.
  local function read_header(r)
    local read = call('GETRANGE', r.key, '0', READ_LAST)
    r.read = read
    if #read < RING then
      r.room, r.head, r.count = 0, 0, 0
      set_latest(r, 0)
      return false
    end
    local latest
    r.room, r.head, r.count, latest = unpack_struct(HEADER, read)
    set_latest(r, latest)
    return true
  end

  -- Where the string's `n` bytes from offset `o` are: a string that holds them and the
  -- position of the first in it (from 1). That is what read_header read when they lie in it
  -- and the check has not written since (every write forgets it), read in place (a copy
  -- would cost a function call and a new string); else a read of just those bytes.
  local function locate(r, o, n)
    local read = r.read
    if o + n <= #read then
      return read, o + 1
    end
    return call('GETRANGE', r.key, int(o), int(o + n - 1)), 1
  end

  -- The string's `n` bytes from offset `o` (locate): a read of just them as it is (a ring of
  -- a long limit is megabytes, not to be gone over twice), else cut from what was read.
  local function read_bytes(r, o, n)
    local bytes, at = locate(r, o, n)
    if #bytes == n then
      return bytes
    end
    return sub(bytes, at, at + n - 1)
  end

  -- The time of entry i (from 0, oldest first).
  local function entry(r, i)
    return decoded(r, unpack_struct(ENTRY, locate(r, RING + w * ((r.head + i) % r.room), w)))
  end

  -- Where a check at `t` stands on the ring, read into `r` (read_header): the time decided
  -- at (never before the key's latest) and how many entries have expired by then.
  -- Admissions drop what has expired, so what has expired since is usually a few of the
  -- oldest entries: one read of up to COMPACT_FRONT of them finds where the live ones start;
  -- only when all of those have expired does a binary search go on. Once the latest has,
  -- all have: nothing is read. This runs on every check: it compares where math.max and
  -- math.min would cost a call into C, and decodes the oldest entries it reads as `decoded`
  -- does, written out.
  local function stand(r, t)
    read_header(r)
    local latest, count = r.latest, r.count
    local now = t > latest and t or latest
    if count == 0 then
      return now, 0
    end
    local cutoff = now - r.window
    if latest <= cutoff then
      return now, count
    end
    local head = r.head
    local front = r.room - head
    if count < front then
      front = count
    end
    if COMPACT_FRONT < front then
      front = COMPACT_FRONT
    end
    local bytes, at = locate(r, RING + w * head, w * front)
    local latest_residue = r.latest_residue
    local expired = 0
    while expired < front
      and latest - (latest_residue - unpack_struct(ENTRY, bytes, at + w * expired)) % SPAN
        <= cutoff do
      expired = expired + 1
    end
    if expired < front or front == count then
      return now, expired
    end
    local low, high = front, count
    while low < high do
      local mid = floor((low + high) / 2)
      if entry(r, mid) <= cutoff then
        low = mid + 1
      else
        high = mid
      end
    end
    return now, low
  end

  local function evaluate(r, t, units)
    local now, expired = stand(r, t)
    r.now, r.cutoff, r.expired, r.live = now, now - r.window, expired, r.count - expired
    return r.live + units <= r.limit
  end

  -- The `n` entries from index `i` on, as one string (before the check writes: read_bytes):
  -- one read, two if they wrap.
  local function read_entries(r, i, n)
    if n == 0 then
      return ''
    end
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    local entries = read_bytes(r, RING + w * start, w * fitting)
    if fitting < n then
      entries = entries .. read_bytes(r, RING, w * (n - fitting))
    end
    return entries
  end

  -- Writes `entries` from index `i` on: one write, two if they wrap.
  local function write_entries(r, i, entries)
    local n = #entries / w
    if n == 0 then
      return
    end
    r.read = ''
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    local offset = int(RING + w * start)
    if fitting == n then
      call('SETRANGE', r.key, offset, entries)
      return
    end
    call('SETRANGE', r.key, offset, sub(entries, 1, w * fitting))
    call('SETRANGE', r.key, RING_AT, sub(entries, w * fitting + 1))
  end

  -- The header of a Redis string (sds) of `length` bytes.
  local function sds_header(length)
    return length < 256 and 3 or length < 65536 and 5 or 9
  end

  -- The room for at least `needed` entries that fills the string's allocation
  -- (its length, sds header and terminator) to its size class in jemalloc, Redis'
  -- allocator (16-spaced up to 128 bytes, then four classes per doubling), so that growth
  -- is geometric with nothing spare; at most the limit, unless more are needed (a lowered
  -- L).
  local function room_for(needed, limit)
    local length = RING + w * needed
    local header = sds_header(length)
    local size = length + header + 1
    local spacing = 16
    if size > 128 then
      spacing = 32
      while spacing * 8 < size do
        spacing = spacing * 2
      end
    end
    local class = spacing * floor((size + spacing - 1) / spacing)
    -- A longer string may take a longer sds header.
    local filled = class - sds_header(class - header - 1) - 1
    return max(needed, min(floor((filled - COMPACT_FIXED) / w), limit))
  end

  -- The key written whole, with one SET and its TTL: the live entries as they are, oldest
  -- first (head 0), then `cost` at now, in a ring sized to them (room_for).
  local function rewrite(r, cost, margin)
    local live, now = r.live, r.now
    local needed = live + cost
    local entries = read_entries(r, r.expired, live)
    r.room, r.read = room_for(needed, r.limit), ''
    call('SET', r.key, pack(HEADER, r.room, 0, needed, now) .. entries
      .. rep(pack(ENTRY, now % SPAN), cost) .. rep('\0', w * (r.room - needed)),
      'PX', ttl_ms(r.window, margin))
    set_latest(r, now)
  end

  -- `cost` entries at now after the live ones, in place while they fit the ring and the
  -- string needs no more than half its length for them; otherwise rewritten. A string
  -- read_header read whole, its new entries not wrapping, is written as it is now with one
  -- SET and its TTL: the same bytes as the two writes in place and a PEXPIRE, in one
  -- command (the string is at most COMPACT_READ bytes).
  local function record(r, cost, margin)
    local room, live = r.room, r.live
    local needed = live + cost
    -- (The string, F + w·room bytes, at least twice what needed takes: w·(room − 2·needed)
    -- ≥ F.)
    if needed > room or w * (room - 2 * needed) >= COMPACT_FIXED then
      rewrite(r, cost, margin)
      return
    end
    -- (A check of one unit, the most common, without string.rep's call into C.)
    local entries = pack(ENTRY, r.now % SPAN)
    if cost ~= 1 then
      entries = rep(entries, cost)
    end
    local head = (r.head + r.expired) % room
    local first = (head + live) % room
    local read = r.read
    if #read == RING + w * room and first + cost <= room then
      local o = RING + w * first
      r.read = ''
      call('SET', r.key, pack(HEADER, room, head, needed, r.now)
        .. sub(read, RING + 1, o) .. entries .. sub(read, o + w * cost + 1),
        'PX', ttl_ms(r.window, margin))
      set_latest(r, r.now)
      return
    end
    write_entries(r, r.expired + live, entries)
    write_state(r, head, needed, r.now)
    call('PEXPIRE', r.key, ttl_ms(r.window, margin))
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
      r.read = ''
      call('DEL', r.key)
      return true
    end
    r.head = (r.head + r.expired) % r.room
    write_state(r, r.head, count, entry(r, count - 1))
    return true
  end

  local function answer(r, admitted, over, units)
    return answer_log(r, admitted, over, units, entry)
  end

  -- A short check (main.lua, run_short) of one unit that records if it fits, under a limit
  -- of at least one (log_decides: most checks of a compact log), decided in one step, with
  -- the same commands, state and numbers as evaluate, record and answer give it there,
  -- without a rule slot's bookkeeping: the slot is given only what the steps it calls read.
  -- Returns the check's status and numbers (main.lua, add_answer).
  local function decide(r, key, t, _, _, _, _, margin)
    r.key = key
    local now, expired = stand(r, t)
    local limit, window, latest = r.limit, r.window, r.latest
    local live = r.count - expired
    if live >= limit then
      -- Over the limit for one unit (never more than L: the limit is at least one): the
      -- check fits once the entry at rank count - L has expired, and the answer counts
      -- none live (answer_log).
      return 0, 0, entry(r, r.count - limit) + window - now, latest + window - now, 0
    end
    r.now, r.expired, r.live = now, expired, live
    record(r, 1, margin)
    return RECORDED_AT - now, limit - live - 1, 0, window, 0
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

  -- Removes `cost` of the entries at `at` when at least `needed` are held: two binary
  -- searches find the run, and the later entries shift back in one slice (L may be tens of
  -- millions: a command per entry would block Redis for seconds). A ring left empty is
  -- deleted.
  local function take_run(r, at, cost, needed)
    if not read_header(r) then
      return
    end
    local after = first_not(r, 0, r.count, function(e) return e <= at end)
    local held = after - first_not(r, 0, after, function(e) return e < at end)
    if held == 0 or held < needed then
      return
    end
    local removed = min(cost, held)
    local count = r.count - removed
    if count == 0 then
      r.read = ''
      call('DEL', r.key)
      return
    end
    write_entries(r, after - removed, read_entries(r, after, r.count - after))
    -- The latest time is the newest entry left, as if the admission never was.
    write_state(r, r.head, count, entry(r, count - 1))
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

  return evaluate, record, answer, give_back, report, refund, unreserve, decide, log_decides
end

-- The makers of the compact steps, by width.
local compact_log_makers = {}

-- The maker of the compact steps for a rule of `window` µs: the width is the fewest bytes,
-- from 3, whose span 2^(8w) exceeds 2 · window.
local function compact_log_maker(window)
  local w = 3
  while 2 ^ (8 * w) <= 2 * window do
    w = w + 1
  end
  local make = compact_log_makers[w]
  if not make then
    make = function() return compact_log_steps(w) end
    compact_log_makers[w] = make
  end
  return make
end
