-- The steps of the COMPACT sliding-log layout: one string, a header and a ring of `room`
-- entries, oldest at head. An entry is its time's offset from the header's base time, in
-- w bytes: the fewest (3 to 7) whose span 2^(8w) exceeds twice the window W. Every entry is
-- at or after the base; the live ones lie within W of now, so once the base is the oldest
-- of them (a rebase, at most once a window) now's offset fits again.
-- The header (COMPACT_FIXED + w bytes): base (a double) and room (4 bytes), which only a
-- rewrite changes, then head and count (4 bytes each) and the latest time's offset (w
-- bytes; the key's latest admission is its newest entry), which an admission writes at
-- COMPACT_STATE. The ring grows and shrinks with what is live: a string rewritten whole
-- with one SET, sized to fill its allocation (room_for), never grown in place (Redis would
-- double it). See sliding_log.lua for what evaluating leaves in the rule; also base and
-- room. The steps are made per width (compact_log_maker), their formats constants.
local COMPACT_FIXED, COMPACT_STATE = 20, 12
-- How many of the oldest entries evaluating reads at once (see evaluate).
local COMPACT_FRONT = 8

local function compact_log_steps(w)
  -- The header's struct format, the state's (its part from COMPACT_STATE on), an entry's,
  -- the span of an entry's offsets, and where the ring starts.
  local HEADER, STATE, ENTRY = '<dI4I4I4I' .. w, '<I4I4I' .. w, '<I' .. w
  local SPAN, RING = 2 ^ (8 * w), COMPACT_FIXED + w

  -- The time of entry i (from 0, oldest first).
  local function entry(r, i)
    local o = RING + w * ((r.head + i) % r.room)
    return r.base + unpack_struct(ENTRY, call('GETRANGE', r.key, o, o + w - 1))
  end

  -- The header's head, count and latest time (base and room stay).
  local function write_state(r, head, count, latest)
    call('SETRANGE', r.key, COMPACT_STATE, pack(STATE, head, count, latest - r.base))
  end

  -- Reads the header into `r`; false when there is no key.
  local function read_header(r)
    local header = call('GETRANGE', r.key, 0, RING - 1)
    if #header ~= RING then
      return false
    end
    local latest
    r.base, r.room, r.head, r.count, latest = unpack_struct(HEADER, header)
    r.latest = r.base + latest
    return true
  end

  local function evaluate(r, t, units)
    if not read_header(r) then
      r.base, r.room, r.latest, r.new_key = 0, 0, 0, true
    end
    r.now = max(t, r.latest)
    r.cutoff = r.now - r.window
    -- Admissions drop what has expired, so what has expired since is usually a few of the
    -- oldest entries: one read of up to COMPACT_FRONT of them finds where the live ones
    -- start; only when all of those have expired does a binary search go on.
    local front = r.count > 0 and min(r.count, COMPACT_FRONT, r.room - r.head) or 0
    if front > 0 then
      local o = RING + w * r.head
      local entries = call('GETRANGE', r.key, o, o + w * front - 1)
      local cutoff = r.cutoff - r.base
      local expired = 0
      while expired < front and unpack_struct(ENTRY, entries, w * expired + 1) <= cutoff do
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

  -- The `n` entries from index `i` on, as one string: one read, two if they wrap.
  local function read_entries(r, i, n)
    if n == 0 then
      return ''
    end
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    local o = RING + w * start
    local entries = call('GETRANGE', r.key, o, o + w * fitting - 1)
    if fitting < n then
      entries = entries .. call('GETRANGE', r.key, RING, RING + w * (n - fitting) - 1)
    end
    return entries
  end

  -- Writes `entries` from index `i` on: one write, two if they wrap.
  local function write_entries(r, i, entries)
    local n = #entries / w
    if n == 0 then
      return
    end
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    call('SETRANGE', r.key, RING + w * start, string.sub(entries, 1, w * fitting))
    if fitting < n then
      call('SETRANGE', r.key, RING, string.sub(entries, w * fitting + 1))
    end
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
    return max(needed, min(floor((filled - COMPACT_FIXED) / w) - 1, limit))
  end

  -- The live `entries` (offsets from `base`) as offsets from the oldest of them, and that
  -- base: every offset rewritten, in chunks (L may be tens of millions).
  local function rebased(entries, base)
    local oldest = unpack_struct(ENTRY, entries, 1)
    local chunks, chunk = {}, {}
    for p = 1, #entries, w do
      chunk[#chunk + 1] = pack(ENTRY, unpack_struct(ENTRY, entries, p) - oldest)
      if #chunk == 1024 then
        chunks[#chunks + 1] = table.concat(chunk)
        chunk = {}
      end
    end
    chunks[#chunks + 1] = table.concat(chunk)
    return table.concat(chunks), base + oldest
  end

  -- The key written whole, with one SET and its TTL: the live entries, oldest first (head
  -- 0), then `cost` at now, in a ring sized to them (room_for); rebased when now's offset
  -- would not fit.
  local function rewrite(r, cost, margin)
    local live, now = r.live, r.now
    local needed = live + cost
    local entries = read_entries(r, r.expired, live)
    if live == 0 then
      r.base = now
    elseif now - r.base >= SPAN then
      entries, r.base = rebased(entries, r.base)
    end
    r.room = room_for(needed, r.limit)
    local offset = now - r.base
    call('SET', r.key, pack(HEADER, r.base, r.room, 0, needed, offset) .. entries
      .. string.rep(pack(ENTRY, offset), cost) .. string.rep('\0', w * (r.room - needed)),
      'PX', ttl_ms(r.window, margin))
  end

  -- `cost` entries at now after the live ones, in place while they fit the ring, now's
  -- offset fits its width and the string needs no more than half its length for them;
  -- otherwise rewritten.
  local function record(r, cost, margin)
    local room, live = r.room, r.live
    local needed = live + cost
    local offset = r.now - r.base
    -- (The string, F + w·(1 + room) bytes, over twice what needed takes: w·(room − 2·needed
    -- − 1) ≥ F.)
    if needed > room or offset >= SPAN or w * (room - 2 * needed - 1) >= COMPACT_FIXED then
      rewrite(r, cost, margin)
      return
    end
    local key = r.key
    local run = string.rep(pack(ENTRY, offset), cost)
    local head = (r.head + r.expired) % room
    -- The run may wrap around the end of the ring.
    local first = (head + live) % room
    local fitting = min(cost, room - first)
    if fitting == cost then
      call('SETRANGE', key, RING + w * first, run)
    else
      call('SETRANGE', key, RING + w * first, string.sub(run, 1, w * fitting))
      call('SETRANGE', key, RING, string.sub(run, w * fitting + 1))
    end
    write_state(r, head, needed, r.now)
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
    r.head = (r.head + r.expired) % r.room
    write_state(r, r.head, count, entry(r, count - 1))
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

  return evaluate, record, answer, give_back, report, refund, unreserve
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
