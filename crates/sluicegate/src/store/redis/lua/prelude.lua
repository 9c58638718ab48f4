-- sluicegate: checks of one or more rules each, every check atomic (docs/SPEC.md).
--
-- One library in pieces, which store/redis/script.rs joins in this order: prelude.lua
-- (shared helpers, the codes of the arguments), one piece per algorithm (sliding_log.lua,
-- sliding_counter.lua, fixed_window.lua, gcra.lua), and main.lua (`check`: the arguments,
-- the checks, the reply). A piece uses only what the pieces before it define. Joined, they
-- are one chunk, so every name is one of its locals: a global lookup costs more.
--
-- The chunk runs two ways, the same code deciding: as a Redis Function library (Redis
-- >= 7.0; store/redis/scripting.rs registers `check` under a name carrying the code's
-- hash), loaded once, so its helpers and the algorithms' steps are made once and live on
-- from call to call; or, where a server has no functions, as a script (EVALSHA) ending in
-- `return check(KEYS, ARGV)`, which Lua runs anew, helpers and all, on every call. While a
-- library loads, Redis offers no globals but `redis.register_function` and `redis.log`:
-- the standard functions are bound on the first call (bind_globals), and nothing in the
-- chunk calls a function until then. State one call leaves behind (the slots of rules,
-- the steps made, the rules and shapes of check read from the arguments, kept while the
-- next call gives the same strings: main.lua, find_steps and read_shapes) is what the
-- next call may reuse; whatever else depends on the call (its keys, Redis TIME, the
-- reply) `check` sets anew.
--
-- An algorithm's piece is a function that makes its steps, which a rule then calls
-- as its methods: evaluate(r, t, units) reads the rule's state and says whether `units`
-- fit; record(r, cost, margin) records an admission; answer(r, admitted, over, units)
-- returns remaining, retry_after, reset_after and delay; give_back(r, at, cost, margin)
-- undoes an admission; report(r, cost, margin) records `cost` whatever the limit says (into
-- debt, within the algorithm's caps) and says whether it recorded any; refund(r, cost,
-- margin) gives back up to `cost` of the live units, newest first, and says whether it
-- gave back any; unreserve(r, at, tat, units, margin) gives back up to `units` of a
-- reservation recorded at `at` (that set the GCRA state's TAT to `tat`) from where it put
-- them, as far as they still count. report, refund and unreserve follow an evaluate of the
-- same rule, whose findings they use. A piece may make an eighth, decide(r, key, t, cost,
-- units, dry, charge, margin): a short check (main.lua, run_short) decided in one step, to
-- the same state and numbers as the others give it, returning its status and numbers; and
-- a ninth, decides(r, cost, dry), if its decide takes only some short checks (the others
-- take run_short).
-- main.lua makes each algorithm's steps the first time a call's rules use it.
--
-- The Rust algorithms (crates/sluicegate/src/algorithm/) are the reference; this script
-- re-implements them and differential tests hold the two together. In each check every
-- rule is evaluated first (reads only); only if all allow does each record. A refused
-- check writes nothing (a zset log's decide prunes before it knows, and removes something
-- only where the check then records: sliding_log.lua).
--
-- Most checks are of one rule, with no request id, in mode CHECK, DRY, CHARGE or
-- DRY_CHARGE: those take the short path (main.lua, run_short), which decides as the two
-- phases do for one rule without their bookkeeping — the same state and numbers, and the
-- same commands but where a zset log's decide prunes first. Every other check (several
-- rules, a request id, UNDO, the usage modes) takes the general path; one call may carry
-- checks of both. A call whose checks all take the short path and ask the same is a short
-- call, with arguments of its own (below): Redis spends about 800 instructions on each
-- argument of a call (callgrind), over 2,000 on each of a call's first few (Redis builds
-- their table one element at a time, and it grows at the first, second, third and fifth),
-- and a general call of one check has 17, a short call 1 on Redis TIME and 2 with a time
-- of the client's.
--
-- One call may carry several independent checks (the store batches checks that are in
-- flight together): each is decided as if it were alone, in order, and one that fails
-- (a key of the wrong type) fails alone.
--
-- Cost, not style, shapes this code: on Redis 7.0 each redis.call costs about 0.5 µs,
-- each table built 0.3 µs, each number in the reply 0.1 µs, against a whole check of a
-- few µs (measured; docs/BENCHMARKS.md). So a call describes its rules and its shapes of
-- check once and checks refer to them, and tables are few. Every argument of a command is
-- text: Redis writes a Lua number argument with "%.17g", about 2,200 instructions for any
-- number, small or large (callgrind). Whole numbers are written with string.format('%d')
-- (int: exact below 2^53 where Lua's integer format is 64-bit, checked below; tostring
-- keeps only 14 digits), each once, and constant offsets once per library; exclusive
-- bounds are written `x + 1` (every time is a whole µs). A score in a reply is written
-- with "%.17g" too, so a time is read from text the script wrote where there is some (a
-- zset member starts with its time).
--
-- A general call:
-- ARGV     the number of rules S, then RULE_VALUES (8) values per rule: algorithm
--          (SLIDING_LOG … LEAKY_BUCKET, below), limit L, window W (µs), buckets N,
--          capacity, emission interval T (µs), layout (ZSET or COMPACT for a sliding-log;
--          ENVOY for a fixed window kept as envoy's counter, else ZSET's code), and an
--          envoy counter's expiration jitter J (whole seconds; 0 otherwise).
--          Then the number of check shapes H, and per shape:
--            client time in µs, or '' for Redis TIME (read once per call)
--            cost (0 is a peek: answers as a cost of 1, records nothing), or '' when
--              each rule has its own, given last among its values below
--            request id, or ''
--            mode: CHECK; DRY (answer as if another rule had refused: record
--              nothing); UNDO (give back an admission of `cost` made at the times
--              given per rule); CHARGE and DRY_CHARGE are CHECK and DRY where a
--              fixed window that refuses records the cost all the same (docs/SPEC.md,
--              "Charging refusals"); RESERVE is CHECK whose admission also remembers
--              its units under the request id, and DRY_RESERVE its DRY; dry-report,
--              dry-settle and dry-refund check a usage mode's request id and answer
--              its standing, recording nothing; REPORT, SETTLE and REFUND are never
--              refused and each rule does its part (docs/SPEC.md, "Usage")
--            number of rules R, then per rule its number among the S rules (from 1),
--              for UNDO only the time the admission was recorded at ('' for none), and
--              when the shape's cost is '' the rule's own cost
--          Then the number of checks C, and when H > 1, per check the number of its shape
--          (from 1).
-- KEYS     per check and rule: the state; and when the check has a request id, its
--          request ids (zset id -> expiry) and release times (hash) too. Called as
--          `check_routed` (on a Redis Cluster, registered with `allow-cross-slot-keys`),
--          KEYS is empty (the call is sent to a node by its address), and these keys are
--          ARGV's last values, followed by their number.
-- A short call:
-- ARGV     its shape, one string: the rule's RULE_VALUES values as above, the cost, and
--          the mode (CHECK, DRY, CHARGE or DRY_CHARGE), joined by ':' (e.g.
--          "1:100:60000000:1:100:0:0:0:1:check"; a general call's first value has no ':');
--          then the client time in µs, or nothing for Redis TIME.
-- KEYS     per check, its state (routed: as above). The number of checks is the number of
--          keys.
--
-- Returns one flat array: per check, 6 numbers per rule {status (ALLOWS if the rule
-- allows, plus RECORDED if this call recorded units), remaining, retry_after (NEVER if no
-- wait will do), reset_after, delay, time decided at} (for REPORT, SETTLE and REFUND the
-- standing after it, for one unit, and never RECORDED: nothing of theirs is given back);
-- for an UNDO, the single number
-- GIVEN_BACK; for a check the short path decides, 5 numbers, those but the time, and the
-- status of one that recorded is -1 - that time (main.lua, add_answer); for a check that
-- failed, in place of its numbers, the error's text. Every number stays below 2^53 (rules
-- are validated for it).

-- The codes of the arguments and the reply, by name. store/redis/script.rs (`mod code`)
-- names the same codes: the two must match.
local SLIDING_LOG, SLIDING_COUNTER, FIXED_WINDOW, TOKEN_BUCKET, LEAKY_BUCKET = 1, 2, 3, 4, 5
local ZSET, COMPACT, ENVOY = 0, 1, 2
-- The modes: CHECK decides and records, as does any mode the script does not tell apart;
-- DRY is evaluated as CHECK is, but never records.
local CHECK, DRY, UNDO, CHARGE, DRY_CHARGE = 'check', 'dry', 'undo', 'charge', 'dry-charge'
-- DRY for a reservation: its request id's use is compared as a reserve's.
local DRY_RESERVE = 'dry-reserve'
local RESERVE, REPORT, SETTLE, REFUND = 'reserve', 'report', 'settle', 'refund'
-- The units a check of `cost` is decided for (algorithm/mod.rs, units_of): a peek (cost 0)
-- for one; for none when refusals are charged (envoy adds, then compares), but in a
-- sliding log.
local function units_of(algorithm, cost, charge)
  if cost == 0 and not (charge and algorithm ~= SLIDING_LOG) then
    return 1
  end
  return cost
end

-- The usage mode a dry run of REPORT, SETTLE or REFUND is of, or false: such a run
-- records nothing, fails on a conflicting reuse of its request id, and answers the
-- standing. A function, not a table, as usage_id below.
local function dry_usage(mode)
  if mode == 'dry-report' then
    return REPORT
  elseif mode == 'dry-settle' then
    return SETTLE
  elseif mode == 'dry-refund' then
    return REFUND
  end
  return false
end
-- The request id of a report, settle or refund, as a member of the request ids' zset: 0xFF,
-- the mode's letter, the id (no UTF-8 text begins with 0xFF, so no id passes for another
-- mode's). A function, not a table: a script run by EVALSHA would build the table anew on
-- every call.
local function usage_id(mode, request_id)
  local letter = mode == REPORT and 'p' or mode == SETTLE and 's' or 'f'
  return '\255' .. letter .. request_id
end
-- Prefixed to a reservation's id: the field of the release times' hash holding its record,
-- "r:s:e" — its units, the instant they were recorded at and the TAT its admission set
-- (s + its reset_after; only the GCRA algorithms read it), as exact integers.
local RESERVED_UNITS = '\255u'
-- Prefixed to a remembered id (its member of the request ids' zset): the field of the
-- release times' hash holding what the id was used for, "mode:cost" — `check` (envoy's
-- counting too), `reserve`, `report`, `settle` or `refund`, and the cost asked, an exact
-- integer. A later use of the id that asks otherwise is a conflicting reuse.
local USED = '\255c'
-- The error text of a conflicting reuse: this, the rule's number in the check (from 1),
-- a space, and what the id was used for. store/redis/script.rs reads it back.
local CONFLICT = 'request id conflict: rule '
-- The most units a count holds (a charged fixed window, a report's debt): every count at
-- or above its limit refuses alike, and below 2^53 a count is exact.
local MAX_EXACT = 2 ^ 53 - 1
-- The most backlog (TAT - now, µs) a report leaves a GCRA state, so that every number
-- stays below 2^53.
local MAX_BACKLOG = 2 ^ 51
local ALLOWS, RECORDED = 1, 2
-- A short check that recorded answers RECORDED_AT - the time it recorded at as its status
-- (main.lua, add_answer).
local RECORDED_AT = -1
local NEVER = -1
local GIVEN_BACK = 1
local RULE_VALUES = 8

-- The standard functions the chunk uses, bound on the first call (see the header), and the
-- call's keys and arguments (set by `check`).
local call, floor, max, min, format, tonumber, find, sub, rep, pack, unpack_struct, pcall
local argv, keys
-- How a whole number is written: '%d' where Lua's integer format holds 2^53 exactly (a
-- 64-bit long), '%.0f' otherwise.
local INT

-- (`_G.tonumber`, `_G.pcall`: the locals of those names shadow the globals here.)
local function bind_globals()
  call = redis.call
  floor, max, min = math.floor, math.max, math.min
  format, tonumber = string.format, _G.tonumber
  find, sub, rep = string.find, string.sub, string.rep
  pack, unpack_struct, pcall = struct.pack, struct.unpack, _G.pcall
  INT = format('%d', 2 ^ 53) == '9007199254740992' and '%d' or '%.0f'
end

-- A check's time as a call gives it ('' or none for Redis TIME), as a number or false, and
-- the margin its keys' TTLs get (ttl_ms): a minute for a time of the client's own.
local function time_and_margin(text)
  if not text or text == '' then
    return false, 0
  end
  return tonumber(text) or false, 60000
end

-- How many of `cost` units a count can still take: counts are held below 2^53, and every
-- count at or above its limit refuses alike.
local function units_below_cap(count, cost)
  return min(cost, MAX_EXACT - count)
end

-- Whole numbers as Redis arguments, each written once: a call's checks mostly share their
-- times (Redis TIME is read once per call), so the same few come up again and again. The
-- library keeps what it wrote from call to call, up to WRITTEN_MAX numbers: few, since the
-- times of one call seldom come up in the next, and Lua's collector walks the whole table
-- (4,096 cost a lone check 4k more instructions than 256: scripts/redis-instructions).
-- A call of one check (`keep_written` false) neither keeps nor looks up what it writes: its
-- numbers are its own time and counts, which later calls seldom write again, and the
-- lookup alone cost a lone fixed-window check more than it saved. Its TTL, which calls of
-- one rule share, is kept apart (ttl_ms).
local WRITTEN_MAX = 256
local written, written_count = {}, 0
local keep_written = true
local function int(x)
  if not keep_written then
    return format(INT, x)
  end
  local s = written[x]
  if not s then
    s = format(INT, x)
    if written_count >= WRITTEN_MAX then
      written, written_count = {}, 0
    end
    written[x] = s
    written_count = written_count + 1
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

-- Redis TIME, read once per call (`check` forgets it).
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
-- before its state stops mattering. Written as a string, the last one kept with the
-- duration and margin it is for: the checks of one rule mostly share them (a sliding log's
-- window always), in a call and from call to call, and a check that does is spared working
-- it out (math.max and math.floor, two calls into C).
local last_ttl_micros, last_ttl_margin, last_ttl = false, false, ''
local function ttl_ms(micros, margin)
  if micros ~= last_ttl_micros or margin ~= last_ttl_margin then
    last_ttl_micros, last_ttl_margin = micros, margin
    last_ttl = int(max(1, floor((micros + 999) / 1000)) + margin)
  end
  return last_ttl
end

-- One hash state held back from Redis (write-behind) while a call's checks of its key
-- follow one another. The checks of a hot key reach Redis together (those that waited on
-- one in flight go on together), and each would read the state its predecessor had just
-- written and write it again; held, they cost one read and one write per run of them, not
-- per check. Exact: the call is atomic, so nothing but its own checks sees the key
-- meanwhile; a check of the held key reads the held state (evaluate), a record updates it,
-- and it is written when a record of another key takes its place, when a check that is not
-- a plain check starts (its steps read and write Redis themselves: main.lua, `holding`),
-- and when the call ends. Only the plain steps of the hash algorithms hold (fixed_window.lua,
-- gcra.lua); the state is the algorithm's own fields, written by `held_write`.
--
-- A step holds a key only while `holding`, and only when the key is held already or the
-- call's next check is of it too (its first key: `keys[next_k + 1]`). Held for a check
-- followed by one of another key, the state would be written out by that check: a write
-- put off for nothing, which over distinct keys, 16 a call, cost a fixed-window check 7-8 %
-- more instructions (scripts/redis-instructions). The steps test it inline, and call hold
-- only to take up another key: a function call costs a hot key's check more than the test.
--
-- A write that fails when the state is written out would leave checks answered as admitted
-- whose units Redis never took; so it fails the whole call (`held_failure`, main.lua):
-- no check after it runs, no check of the call is answered, every one is a store error.
local held_key = false
local held_state = {}
local held_write = false
local holding = false
local writing_held = false
local held_failure = false
-- Where the next check's keys start in `keys`, less one (main.lua, run_checks).
local next_k

local function write_held()
  if held_key then
    local key = held_key
    held_key = false
    writing_held = true
    held_write(key, held_state)
    writing_held = false
  end
end

-- Holds `key`'s state, written by `write`, from now on, in place of the one held before
-- (written out): the caller, holding a key other than held_key, then sets its fields in
-- held_state, which are still the last key's. A check of the key held already sets them
-- without it: a Lua call per check of a hot key would cost it more than the rest of its
-- bookkeeping.
local function hold(key, write)
  write_held()
  held_key, held_write = key, write
end

