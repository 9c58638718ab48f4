-- The steps of the COMPACT sliding-log layout: one string, a header and a ring of `room`
-- entries, oldest at head. An entry is its time's offset from the header's base time, in
-- w bytes: the fewest (3 to 7) whose span 2^(8w) exceeds twice the window W. Every entry is
-- at or after the base; the live ones lie within W of now, so once the base is the oldest
-- of them (a rebase, at most once a window) now's offset fits again.
-- The header (COMPACT_FIXED + w bytes): base (a double), head, count and room (4 bytes
-- each), and the latest time's offset (w bytes; the key's latest admission is its newest
-- entry). The ring grows and shrinks with what is live: a string rewritten whole with one
-- SET, sized to fill its allocation (room_for), never grown in place (Redis would double
-- it). See sliding_log.lua for what evaluating leaves in the rule; also base, room, width.
local function compact_log_steps()
  local COMPACT_FIXED = 20
  -- How many of the oldest entries evaluating reads at once (see evaluate).
  local COMPACT_FRONT = 8
  -- Per width: the header's struct format, an entry's, and the span of its offsets.
  local HEADER_FORMAT, ENTRY_FORMAT, SPAN = {}, {}, {}
  for w = 3, 7 do
    HEADER_FORMAT[w] = '<dI4I4I4I' .. w
    ENTRY_FORMAT[w] = '<I' .. w
    SPAN[w] = 2 ^ (8 * w)
  end

  local function width_of(window)
    local w = 3
    while SPAN[w] <= 2 * window do
      w = w + 1
    end
    return w
  end

  -- Where slot `i` of the ring starts in the string.
  local function slot_start(w, slot)
    return COMPACT_FIXED + w * (1 + slot)
  end

  local function entry_offset(r, i)
    local w = r.width
    local o = slot_start(w, (r.head + i) % r.room)
    return (unpack_struct(ENTRY_FORMAT[w], call('GETRANGE', r.key, o, o + w - 1)))
  end

  local function entry(r, i)
    return r.base + entry_offset(r, i)
  end

  local function write_header(r, head, count, latest)
    call('SETRANGE', r.key, 0,
      pack(HEADER_FORMAT[r.width], r.base, head, count, r.room, latest - r.base))
  end

  -- Reads the header into `r`; false when there is no key.
  local function read_header(r)
    local w = width_of(r.window)
    r.width = w
    local header = call('GETRANGE', r.key, 0, COMPACT_FIXED + w - 1)
    if #header ~= COMPACT_FIXED + w then
      return false
    end
    local latest
    r.base, r.head, r.count, r.room, latest = unpack_struct(HEADER_FORMAT[w], header)
    r.latest = r.base + latest
    return true
  end

  local function evaluate(r, t, units)
    if not read_header(r) then
      r.base, r.room, r.latest, r.new_key = 0, 0, 0, true
    end
    local w = r.width
    r.now = max(t, r.latest)
    r.cutoff = r.now - r.window
    -- Admissions drop what has expired, so what has expired since is usually a few of the
    -- oldest entries: one read of up to COMPACT_FRONT of them finds where the live ones
    -- start; only when all of those have expired does a binary search go on.
    local front = r.count > 0 and min(r.count, COMPACT_FRONT, r.room - r.head) or 0
    if front > 0 then
      local o = slot_start(w, r.head)
      local entries = call('GETRANGE', r.key, o, o + w * front - 1)
      local cutoff, format_w = r.cutoff - r.base, ENTRY_FORMAT[w]
      local expired = 0
      while expired < front and unpack_struct(format_w, entries, w * expired + 1) <= cutoff do
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
    local w = r.width
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    local o = slot_start(w, start)
    local entries = call('GETRANGE', r.key, o, o + w * fitting - 1)
    if fitting < n then
      local rest = slot_start(w, n - fitting) - 1
      entries = entries .. call('GETRANGE', r.key, slot_start(w, 0), rest)
    end
    return entries
  end

  -- Writes `entries` from index `i` on: one write, two if they wrap.
  local function write_entries(r, i, entries)
    local w = r.width
    local n = #entries / w
    if n == 0 then
      return
    end
    local start = (r.head + i) % r.room
    local fitting = min(n, r.room - start)
    call('SETRANGE', r.key, slot_start(w, start), string.sub(entries, 1, w * fitting))
    if fitting < n then
      call('SETRANGE', r.key, slot_start(w, 0), string.sub(entries, w * fitting + 1))
    end
  end

  -- jemalloc's size class of `size` bytes (Redis' allocator): 16-spaced up to 128, then
  -- four classes per doubling.
  local function size_class(size)
    if size <= 128 then
      return 16 * floor((size + 15) / 16)
    end
    local spacing = 32
    while spacing * 8 < size do
      spacing = spacing * 2
    end
    return spacing * floor((size + spacing - 1) / spacing)
  end

  -- The header of a Redis string (sds) of `length` bytes.
  local function sds_header(length)
    return length < 256 and 3 or length < 65536 and 5 or 9
  end

  -- The room for at least `needed` entries of w bytes that fills the string's allocation
  -- (its length, sds header and terminator), so that growth is geometric with nothing
  -- spare beyond the size class; at most the limit, unless more are needed (a lowered L).
  local function room_for(needed, w, limit)
    local length = slot_start(w, needed)
    local header = sds_header(length)
    local class = size_class(length + header + 1)
    -- A longer string may take a longer sds header.
    local filled = class - sds_header(class - header - 1) - 1
    return max(needed, min(floor((filled - COMPACT_FIXED) / w) - 1, limit))
  end

  -- The live `entries` (offsets from `base`) as offsets from the oldest of them, and that
  -- base: every offset rewritten, in chunks (L may be tens of millions).
  local function rebased(entries, w, base)
    local format_w = ENTRY_FORMAT[w]
    local oldest = unpack_struct(format_w, entries, 1)
    local chunks, chunk = {}, {}
    for p = 1, #entries, w do
      chunk[#chunk + 1] = pack(format_w, unpack_struct(format_w, entries, p) - oldest)
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
    local w, live, now = r.width, r.live, r.now
    local needed = live + cost
    local entries = read_entries(r, r.expired, live)
    if live == 0 then
      r.base = now
    elseif now - r.base >= SPAN[w] then
      entries, r.base = rebased(entries, w, r.base)
    end
    r.room = room_for(needed, w, r.limit)
    local format_w, offset = ENTRY_FORMAT[w], now - r.base
    call('SET', r.key, pack(HEADER_FORMAT[w], r.base, 0, needed, r.room, offset) .. entries
      .. string.rep(pack(format_w, offset), cost) .. string.rep('\0', w * (r.room - needed)),
      'PX', ttl_ms(r.window, margin))
  end

  -- `cost` entries at now after the live ones, in place while they fit the ring, now's
  -- offset fits its width and the string needs no more than half its length for them;
  -- otherwise rewritten.
  local function record(r, cost, margin)
    local w, room, live = r.width, r.room, r.live
    local needed = live + cost
    local offset = r.now - r.base
    if needed > room or offset >= SPAN[w]
      or 2 * slot_start(w, needed) <= slot_start(w, room) then
      rewrite(r, cost, margin)
      return
    end
    local key = r.key
    local run = string.rep(pack(ENTRY_FORMAT[w], offset), cost)
    local head = (r.head + r.expired) % room
    -- The run may wrap around the end of the ring.
    local first = (head + live) % room
    local fitting = min(cost, room - first)
    if fitting == cost then
      call('SETRANGE', key, slot_start(w, first), run)
    else
      call('SETRANGE', key, slot_start(w, first), string.sub(run, 1, w * fitting))
      call('SETRANGE', key, slot_start(w, 0), string.sub(run, w * fitting + 1))
    end
    write_header(r, head, needed, r.now)
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
    write_header(r, r.head, count, entry(r, count - 1))
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
    write_header(r, r.head, count, entry(r, count - 1))
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
