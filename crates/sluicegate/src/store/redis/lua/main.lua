-- The call: its arguments (see prelude.lua's header), its checks, in order, and the reply.

-- The rules of the check being decided, by position, reused from check to check (and, in
-- the library, from call to call): a table built per check costs about as much as a Redis
-- command. rule_of resets every field that evaluating a rule reads before it writes; the
-- algorithms' other fields are always written first. A slot is built whole, once: fields
-- added one by one would rehash it.
local rule_slots = {}
local function new_rule_slot()
  return {
    spec = false, algorithm = 0, limit = 0, window = 0, buckets = 0, capacity = 0,
    interval = 0, jitter = 0, key = false, ids = false, releases = false, now = 0, latest = false,
    live = 0, expired = 0, cutoff = 0, head = 0, count = 0, awaited = 0,
    latest_residue = 0, room = 0, read = '',
    repeat_release = false, verdict = false, cost = 0, units = 0, repeated = false,
    reserved = 0, reserved_at = 0, reserved_tat = 0,
    evaluate = false, record = false, answer = false, give_back = false, report = false,
    refund = false, unreserve = false, decide = false, decides = false,
  }
end

-- The steps of each algorithm (and layout), made the first time a call's rules use it (see
-- prelude.lua): {evaluate, record, answer, give_back, report, refund, unreserve} and, where
-- a piece makes them, decide and decides, by maker.
local made_steps = {}
local function steps_made_by(make)
  local steps = made_steps[make]
  if not steps then
    steps = {make()}
    made_steps[make] = steps
  end
  return steps
end

-- The steps of each rule of the call, by where its RULE_VALUES values start in ARGV (its
-- spec), and those values as the call gave them. Calls mostly describe the same rules at
-- the same places, so what a spec's values made (its steps, and the rule a slot took up
-- from them: rule_of) stays from call to call while the values are the same strings
-- (compared as Lua compares strings, by identity); a spec whose values changed is made
-- anew, and the slots that had taken it up let it go.
local spec_count
local steps_of_spec = {}
local values_of_spec = {}
local function spec_unchanged(spec)
  local known = values_of_spec[spec]
  if not known then
    return false
  end
  for i = 1, RULE_VALUES do
    if known[i] ~= argv[spec + i] then
      return false
    end
  end
  return true
end
-- The steps of the rule whose RULE_VALUES values follow index `at` of `values`.
local function steps_for(values, at)
  local algorithm, layout = tonumber(values[at + 1]), tonumber(values[at + 7])
  local make
  if algorithm == SLIDING_LOG and layout == ZSET then
    make = zset_log_steps
  elseif algorithm == SLIDING_LOG and layout == COMPACT then
    make = compact_log_maker(tonumber(values[at + 3]))
  elseif algorithm == SLIDING_COUNTER then
    make = sliding_counter_steps
  elseif algorithm == FIXED_WINDOW and layout == ENVOY then
    make = envoy_counter_steps
  elseif algorithm == FIXED_WINDOW then
    make = fixed_window_steps
  elseif algorithm == TOKEN_BUCKET or algorithm == LEAKY_BUCKET then
    make = gcra_steps
  else
    error(format('unknown algorithm %s (layout %s)', values[at + 1], values[at + 7]))
  end
  return steps_made_by(make)
end
local function find_steps()
  for spec = 1, RULE_VALUES * spec_count, RULE_VALUES do
    if not spec_unchanged(spec) then
      values_of_spec[spec] = nil
      steps_of_spec[spec] = steps_for(argv, spec)
      values_of_spec[spec] = {unpack(argv, spec + 1, spec + RULE_VALUES)}
      for i = 1, #rule_slots do
        if rule_slots[i].spec == spec then
          rule_slots[i].spec = false
        end
      end
    end
  end
end

-- Slot `r` takes up the rule whose values follow index `at` of `values`, and its `steps`
-- as methods, so that no check branches on the algorithm.
local function take_up(r, values, at, steps)
  r.algorithm, r.limit = tonumber(values[at + 1]), tonumber(values[at + 2])
  r.window, r.buckets = tonumber(values[at + 3]), tonumber(values[at + 4])
  r.capacity, r.interval = tonumber(values[at + 5]), tonumber(values[at + 6])
  r.jitter = tonumber(values[at + 8])
  r.evaluate, r.record, r.answer, r.give_back = steps[1], steps[2], steps[3], steps[4]
  r.report, r.refund, r.unreserve = steps[5], steps[6], steps[7]
  r.decide, r.decides = steps[8] or false, steps[9] or false
end

-- Slot `r` made ready for a check of `key`: every field evaluating reads before it writes.
local function bind_key(r, key)
  r.key = key
  r.now, r.latest, r.live, r.expired, r.cutoff = 0, false, 0, 0, 0
  r.count, r.repeat_release = 0, false
end

-- The slot of rule `i` of a check, its spec's: a slot takes up a rule's values when it
-- changes rule.
local function slot_of(i, spec)
  local r = rule_slots[i]
  if not r then
    r = new_rule_slot()
    rule_slots[i] = r
  end
  if r.spec ~= spec then
    r.spec = spec
    take_up(r, argv, spec, steps_of_spec[spec])
  end
  return r
end

-- Rule `i` of a check: its slot, its keys, and room for what evaluating it finds.
local function rule_of(i, spec, q, keys_per_rule)
  local r = slot_of(i, spec)
  bind_key(r, keys[q + 1])
  if keys_per_rule == 3 then
    r.ids, r.releases = keys[q + 2], keys[q + 3]
  end
  return r
end

-- Give back an admission of `cost` made at the times `shape.undo_at` gives per rule (a
-- later rule in another hash slot refused the check; docs/SPEC.md, several rules). Units
-- recorded at one instant are indistinguishable, so removing `cost` of them at that
-- instant restores the state.
local function give_back_check(shape, k)
  local cost, costs, request_id = shape.cost, shape.costs, shape.request_id
  local keys_per_rule = shape.keys_per_rule
  for i = 1, shape.rule_count do
    local at = shape.undo_at[i]
    -- No time: this rule recorded nothing (a retried request id), nothing to give back.
    if at then
      local r = rule_of(i, shape.specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
      r:give_back(at, costs and costs[i] or cost, shape.margin)
      if request_id ~= '' then
        call('ZREM', r.ids, request_id)
        call('HDEL', r.releases, request_id, RESERVED_UNITS .. request_id, USED .. request_id)
      end
    end
  end
end

-- What a use of a request id in `mode` ('check' for CHECK and CHARGE) for `cost` is
-- remembered as (USED).
local function use_of(mode, cost)
  return mode .. ':' .. int(cost)
end

-- Fails the check, before it writes anything, when rule `i` (`r`) remembers `member` from a
-- use other than `asked` (use_of): a conflicting reuse of the request id. An id remembered
-- with no use (written by a version of this script that kept no uses) is taken for a retry.
local function refuse_conflict(r, i, member, asked)
  local used = call('HGET', r.releases, USED .. member)
  if used and used ~= asked then
    error(CONFLICT .. i .. ' ' .. used, 0)
  end
end

-- Forget the request ids whose memory has expired (and what the release times' hash holds
-- for them), then remember `member` until `until_offset` from now, with what it was used
-- for (`used`, use_of); when it waits, until when (`delay`); for a reservation, its record
-- (RESERVED_UNITS), or false. Each key lasts as long as the latest instant it is needed
-- until: a shorter memory never cuts a longer one's.
local function remember_request(r, member, until_offset, delay, reservation, used, margin)
  local now = r.now
  local gone = call('ZRANGEBYSCORE', r.ids, '-inf', int(now))
  for g = 1, #gone, 500 do
    local chunk, fields = {}, {}
    for j = g, min(g + 499, #gone) do
      chunk[#chunk + 1] = gone[j]
      fields[#fields + 1] = gone[j]
      fields[#fields + 1] = RESERVED_UNITS .. gone[j]
      fields[#fields + 1] = USED .. gone[j]
    end
    call('ZREM', r.ids, unpack(chunk))
    call('HDEL', r.releases, unpack(fields))
  end
  call('ZADD', r.ids, int(now + until_offset), member)
  local latest = tonumber(call('ZRANGE', r.ids, '-1', '-1', 'WITHSCORES')[2])
  local ttl = ttl_ms(latest - now, margin)
  call('PEXPIRE', r.ids, ttl)
  if delay > 0 then
    call('HSET', r.releases, member, int(now + delay))
  end
  if reservation then
    call('HSET', r.releases, RESERVED_UNITS .. member, reservation)
  end
  call('HSET', r.releases, USED .. member, used)
  call('PEXPIRE', r.releases, ttl)
end

-- Reads the reservation of `request_id` that `r` holds, if it is still remembered: its
-- units, the instant they were recorded at and the TAT its admission set.
local function read_reservation(r, request_id)
  local reserved_until = tonumber(call('ZSCORE', r.ids, request_id))
  if not reserved_until or reserved_until <= r.now then
    return
  end
  local record = call('HGET', r.releases, RESERVED_UNITS .. request_id)
  local units, at, tat = string.match(record or '', '^(%d+):(%d+):(%d+)$')
  if units then
    r.reserved, r.reserved_at, r.reserved_tat = tonumber(units), tonumber(at), tonumber(tat)
    return
  end
  -- The previous script recorded the units alone: where they went is unknown, so none of
  -- them is given back (the unused part stays taken; an excess is still reported).
  units = string.match(record or '', '^(%d+)$')
  if units then
    r.reserved, r.reserved_at = tonumber(units), false
  end
end

-- The call is routed (check_routed): its keys came in ARGV.
local routed = false

-- The reply, kept from call to call (a table grown anew to a reply's length would be
-- rehashed at every power of two): a call overwrites what the last one left, and clears
-- only what lies past its own reply (Redis reads a reply up to its first nil). What
-- results may hold (results_held) counts every entry a call wrote, also one that failed
-- part way.
local results, result_count, results_held = {}, 0, 0

-- Appends one rule's numbers but the last (the time decided at). A short check's answer
-- stops there (run_short): only a check that recorded needs the time (its units are given
-- back at it), and its status says it, RECORDED_AT - that time in place of its status
-- (prelude.lua). A number fewer per check in a reply Redis converts number by number.
local function add_answer(status, remaining, retry, reset, delay)
  local n = result_count
  results[n + 1] = status
  results[n + 2] = remaining
  results[n + 3] = retry
  results[n + 4] = reset
  results[n + 5] = delay
  result_count = n + 5
end

-- Appends one rule's numbers to `results`.
local function add_result(status, remaining, retry, reset, delay, now)
  add_answer(status, remaining, retry, reset, delay)
  result_count = result_count + 1
  results[result_count] = now
end

-- A report, settle or refund (docs/SPEC.md, "Usage"), its keys after KEYS index `k`: never
-- refused, each rule does its part and answers its standing after it, for one unit. Every
-- rule's keys are read before any is written (a routed call must fail before it writes).
local function run_usage(shape, k)
  local cost, costs, request_id, mode = shape.cost, shape.costs, shape.request_id, shape.usage
  local rule_count, specs, keys_per_rule = shape.rule_count, shape.specs, shape.keys_per_rule
  local t = shape.t or redis_time()
  local member = request_id ~= '' and usage_id(mode, request_id)

  -- Phase 1: read every rule's state, and whether it has done this request already, or
  -- holds its reservation.
  for i = 1, rule_count do
    local r = rule_of(i, specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
    r.cost = costs and costs[i] or cost
    r:evaluate(t, 1)
    r.repeated, r.reserved = false, 0
    if member then
      if routed then
        call('EXISTS', r.releases)
      end
      local done_until = tonumber(call('ZSCORE', r.ids, member))
      r.repeated = done_until ~= nil and done_until > r.now
      if r.repeated then
        refuse_conflict(r, i, member, use_of(mode, r.cost))
      end
      if not r.repeated and mode == SETTLE then
        read_reservation(r, request_id)
      end
    end
  end

  -- Phase 2: each rule records its part, then answers its standing, read anew.
  for i = 1, rule_count do
    local r = rule_slots[i]
    local now, cost, repeated = r.now, r.cost, r.repeated
    -- Whether this request is to be remembered: it did its part, and a retry must not do
    -- it again. A report or refund that changed nothing did nothing: its retry may. A
    -- settle always did (it used its reservation up).
    local done = not repeated and cost > 0 and not shape.dry
    if not repeated and not shape.dry then
      if mode == SETTLE then
        -- Net of the reservation, which it uses up (a settle of 0 remembers no id: its
        -- retry must not give the reservation back again): a report of the excess, the
        -- unused units given back from where the reservation put them.
        if r.reserved > 0 then
          call('HDEL', r.releases, RESERVED_UNITS .. request_id)
        end
        if cost > r.reserved then
          r:report(cost - r.reserved, shape.margin)
        elseif cost < r.reserved and r.reserved_at then
          r:unreserve(r.reserved_at, r.reserved_tat, r.reserved - cost, shape.margin)
        end
      elseif cost > 0 and mode == REPORT then
        done = r:report(cost, shape.margin)
      elseif cost > 0 then
        done = r:refund(cost, shape.margin)
      end
    end
    rule_of(i, specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
    local fits = r:evaluate(now, 1)
    local remaining, retry, reset = r:answer(false, not fits, 1)
    if member and done then
      remember_request(r, member, r.window, 0, false, use_of(mode, cost), shape.margin)
    end
    add_result(fits and ALLOWS or 0, remaining, retry, reset, 0, r.now)
  end
end

-- A refusal of `cost` units charged to fixed window `r`: counted, and answered as refused
-- after it.
local function charge_refusal(r, cost, margin)
  local units_charged = units_below_cap(r.count, cost)
  r:record(units_charged, margin)
  r.count = r.count + units_charged
end

-- The short path: a check of one rule, with no request id, in mode CHECK, DRY, CHARGE or
-- DRY_CHARGE (shape.short) — most checks. It decides as run_check's two phases do for one
-- rule, without their bookkeeping (verdicts, costs per rule, request ids): evaluate, then
-- record or not, then answer; the same commands, the same state, the same numbers. The
-- rule's slot `r` is bound to `key` first. `units`: units_of the rule's algorithm, `cost`
-- and `charge`, which the caller works out once per shape where it can. Returns the
-- check's status and numbers, as add_answer takes them.
local function run_short(r, key, t, cost, units, dry, charge, margin)
  bind_key(r, key)
  local fits = r:evaluate(t, units)
  local never = units > r.capacity
  if never or not fits then
    if charge and cost > 0 and r.algorithm == FIXED_WINDOW then
      charge_refusal(r, cost, margin)
    end
    local remaining, retry, reset, delay = r:answer(false, not never, units)
    return 0, remaining, never and NEVER or retry, reset, delay
  end
  if dry then
    return ALLOWS, r:answer(false, false, units)
  end
  if cost > 0 then
    r:record(cost, margin)
  end
  return cost > 0 and RECORDED_AT - r.now or ALLOWS, r:answer(true, false, units)
end

-- What decides a short check of rule slot `r` for `cost`, `dry` or not, called as run_short
-- is: the decide step of its algorithm if it makes one that takes such checks (prelude.lua),
-- in one step, the slot left unbound; else run_short.
local function short_decider(r, cost, dry)
  if r.decide and (not r.decides or r.decides(r, cost, dry)) then
    return r.decide
  end
  return run_short
end

-- One check of the given shape, its keys after KEYS index `k`; appends its numbers to
-- `results`.
local function run_check(shape, k)
  -- A plain check's steps may hold its key's state (prelude.lua); any other check's steps
  -- read and write Redis themselves, so what is held is written out first.
  local plain = not shape.usage and not shape.undo and shape.request_id == ''
  if not plain then
    write_held()
  end
  holding = plain
  if shape.short then
    local r = slot_of(1, shape.specs[1])
    local run = short_decider(r, shape.cost, shape.dry)
    add_answer(run(r, keys[k + 1], shape.t or redis_time(), shape.cost,
      units_of(r.algorithm, shape.cost, shape.charge), shape.dry, shape.charge, shape.margin))
    return
  end
  if shape.usage then
    run_usage(shape, k)
    return
  end
  if shape.undo then
    give_back_check(shape, k)
    result_count = result_count + 1
    results[result_count] = GIVEN_BACK
    return
  end
  local cost, costs, request_id = shape.cost, shape.costs, shape.request_id
  local rule_count, specs, keys_per_rule = shape.rule_count, shape.specs, shape.keys_per_rule
  local t = shape.t or redis_time()

  -- Phase 1: evaluate every rule, reading only.
  local all_allow = not shape.dry
  for i = 1, rule_count do
    local r = rule_of(i, specs[i], k + (i - 1) * keys_per_rule, keys_per_rule)
    -- A routed call's keys are not checked by Redis up front: a key this node does not
    -- hold (its slot moved, or is migrating and the key is gone) fails at its first
    -- command. Every key of a check is read in this phase but the release times (read on
    -- a repeat only): touched here, so that a check fails before it writes anything.
    if routed and request_id ~= '' then
      call('EXISTS', r.releases)
    end
    -- Each rule's own cost when the check gives them, else the check's.
    local rule_cost = costs and costs[i] or cost
    local units = units_of(r.algorithm, rule_cost, shape.charge)
    r.cost, r.units = rule_cost, units
    local fits = r:evaluate(t, units)
    if request_id ~= '' then
      local expires = tonumber(call('ZSCORE', r.ids, request_id))
      if expires and expires > r.now then
        refuse_conflict(r, i, request_id, use_of(shape.reserve and RESERVE or 'check', rule_cost))
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
    local now, verdict, cost, units = r.now, r.verdict, r.cost, r.units
    local fits = all_allow and verdict == 'fits'
    local recorded = fits and cost > 0
    local charged = shape.charge and cost > 0 and r.algorithm == FIXED_WINDOW
      and (verdict == 'over' or verdict == 'never')
    if recorded then
      r:record(cost, shape.margin)
    elseif charged then
      charge_refusal(r, cost, shape.margin)
    end
    local remaining, retry, reset, delay = r:answer(fits, verdict == 'over', units)
    local status = (verdict == 'fits' or verdict == 'repeat') and ALLOWS or 0
    if verdict == 'never' then
      retry = NEVER
    elseif verdict == 'repeat' then
      -- Admitted before and still counting: allowed again, nothing recorded.
      retry = 0
      delay = all_allow and max(r.repeat_release - now, 0) or 0
    end
    if recorded and request_id ~= '' then
      if shape.reserve then
        local reservation = int(cost) .. ':' .. int(now) .. ':' .. int(now + reset)
        remember_request(r, request_id, max(r.window, reset), delay, reservation,
          use_of(RESERVE, cost), shape.margin)
      else
        remember_request(r, request_id, reset, delay, false, use_of('check', cost), shape.margin)
      end
    end
    add_result(recorded and status + RECORDED or status, remaining, retry, reset, delay, now)
  end
end

-- The shapes of the call's checks: what a check asks, but for its keys. Checks that ask the
-- same (the same rules, cost, mode, no request id, Redis TIME: the common case under load)
-- share a shape, so a check costs one argument, and none when a call has one shape.
-- Like the rules' slots, the shapes' tables are kept from check to check and call to call,
-- each field written before it is read.
local shapes, shape_count = {}, 0
-- Where in ARGV the shapes end: the number of checks is next.
local p
-- The last call's shapes as it gave them (its values from H on), and where they started:
-- a call whose shapes are the same strings at the same place (no time of its own: the
-- common case) reads none of them again. So a shape holds only what its strings say;
-- whatever else a check depends on (Redis TIME) is read per call, in run_check.
local shapes_values, shapes_from = {}, false
local function shapes_unchanged(from)
  if from ~= shapes_from then
    return false
  end
  for i = 1, #shapes_values do
    if shapes_values[i] ~= argv[from + i - 1] then
      return false
    end
  end
  return true
end
local function read_shapes()
  local from = 2 + RULE_VALUES * spec_count
  if shapes_unchanged(from) then
    p = from + #shapes_values - 1
    return
  end
  shapes_from = false
  p = from
  shape_count = tonumber(argv[p])
  for h = 1, shape_count do
    local rule_count, undo = tonumber(argv[p + 5]), argv[p + 4] == UNDO
    -- No cost for the shape: each rule's follows its number (and its recorded time).
    local own_costs = argv[p + 2] == ''
    local per_rule = 1 + (undo and 1 or 0) + (own_costs and 1 or 0)
    local shape = shapes[h]
    if not shape then
      shape = {
        t = false, margin = 0, cost = 0, request_id = '', undo = false, dry = false,
        charge = false, reserve = false, usage = false, short = false, keys_per_rule = 1,
        rule_count = 0,
        specs = {}, undo_at = {}, costs = false, cost_table = {},
      }
      shapes[h] = shape
    end
    -- t: the client's time, or false for Redis TIME; margin: see ttl_ms. keys_per_rule: the
    -- state, and with a request id, its request ids and release times (KEYS). dry: DRY or
    -- DRY_CHARGE, answered as refused by another rule. charge: a refusing fixed window
    -- records the cost. reserve: an admission remembers its units. usage: REPORT, SETTLE or
    -- REFUND, or false. short: a check run_short decides.
    local mode = argv[p + 4]
    shape.t, shape.margin = time_and_margin(argv[p + 1])
    shape.cost, shape.request_id = tonumber(argv[p + 2]), argv[p + 3]
    local dry_of = dry_usage(mode)
    shape.usage = (mode == REPORT or mode == SETTLE or mode == REFUND) and mode or dry_of
    shape.undo, shape.reserve = undo, mode == RESERVE or mode == DRY_RESERVE
    shape.dry = mode == DRY or mode == DRY_CHARGE or mode == DRY_RESERVE or dry_of ~= false
    shape.charge = mode == CHARGE or mode == DRY_CHARGE
    shape.keys_per_rule, shape.rule_count = argv[p + 3] == '' and 1 or 3, rule_count
    shape.costs = own_costs and shape.cost_table
    shape.short = rule_count == 1 and not own_costs and argv[p + 3] == ''
      and (mode == CHECK or mode == DRY or mode == CHARGE or mode == DRY_CHARGE)
    for i = 1, rule_count do
      local q = p + 5 + (i - 1) * per_rule
      shape.specs[i] = 1 + RULE_VALUES * (tonumber(argv[q + 1]) - 1)
      if undo then
        shape.undo_at[i] = tonumber(argv[q + 2])
      end
      if own_costs then
        shape.cost_table[i] = tonumber(argv[q + per_rule])
      end
    end
    p = p + 5 + rule_count * per_rule
  end
  shapes_values = {unpack(argv, from, p)}
  shapes_from = from
end

-- The checks, in order, each its shape's number. One pcall covers a run of checks (a pcall
-- per check costs more than the rest of a check's Lua): when a check fails, its numbers
-- are dropped, its error takes their place, and the run goes on from the next check.
local check_count, done, k
-- Where the current check's answer starts (its keys: `k`; the next check's: next_k,
-- prelude.lua).
local answer_start
local function run_checks()
  while done < check_count do
    local shape = shape_count == 1 and shapes[1] or shapes[tonumber(argv[p + 2 + done])]
    next_k = k + shape.rule_count * shape.keys_per_rule
    answer_start = result_count
    run_check(shape, k)
    k, done = next_k, done + 1
  end
end
-- A short call (prelude.lua's header): its shape as one string, the rule's values, the
-- cost and the mode joined by ':'. The shapes met, by that string, each with a slot of its
-- own that took up its rule; false for a general call's first value, which has no ':'. At
-- most SHORT_SHAPES_MAX, all forgotten at once past that. `check` looks a string up; a
-- string not met yet is read by new_short_shape.
local SHORT_SHAPES_MAX = 256
-- A short call's shape: RULE_VALUES values, the cost, the mode.
local SHORT_SHAPE = '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):(.*)$'
local short_shapes, short_shape_count = {}, 0
local function new_short_shape(text)
  local shape = false
  local values = {string.match(text, SHORT_SHAPE)}
  if values[1] then
    local r, mode = new_rule_slot(), values[RULE_VALUES + 2]
    local cost, charge = tonumber(values[RULE_VALUES + 1]), mode == CHARGE or mode == DRY_CHARGE
    local dry = mode == DRY or mode == DRY_CHARGE
    r.spec = text
    take_up(r, values, 0, steps_for(values, 0))
    shape = {
      r = r, run = short_decider(r, cost, dry), cost = cost,
      units = units_of(r.algorithm, cost, charge), dry = dry, charge = charge,
    }
  end
  if short_shape_count >= SHORT_SHAPES_MAX then
    short_shapes, short_shape_count = {}, 0
  end
  short_shapes[text] = shape
  short_shape_count = short_shape_count + 1
  return shape
end

-- The checks of a short call, one key each, in order (as run_checks).
local short_shape, short_time, short_margin
local function run_short_checks()
  local run, r, cost, units = short_shape.run, short_shape.r, short_shape.cost, short_shape.units
  local dry, charge = short_shape.dry, short_shape.charge
  local t = short_time or redis_time()
  while done < check_count do
    next_k = k + 1
    answer_start = result_count
    add_answer(run(r, keys[next_k], t, cost, units, dry, charge, short_margin))
    k, done = next_k, done + 1
  end
end

-- The text a check's failure answers: a Redis error arrives as a table {err = text};
-- anything else is this script's bug.
local function failure_text(failure)
  return type(failure) == 'table' and failure.err or tostring(failure)
end

-- A short call of one check: most calls at a moderate rate. Nothing to hold and no run of
-- checks to go on with, so none of `check`'s bookkeeping (scripts/redis-instructions). Its
-- reply is its own table, kept from call to call.
local lone_reply = {}
local function check_lone(shape, key, time)
  server_time, keep_written = false, false
  local t, margin = false, 0
  if time then
    t, margin = time_and_margin(time)
  end
  local reply = lone_reply
  local ok
  ok, reply[1], reply[2], reply[3], reply[4], reply[5] = pcall(shape.run, shape.r, key,
    t or redis_time(), shape.cost, shape.units, shape.dry, shape.charge, margin)
  if not ok then
    return {failure_text(reply[1])}
  end
  return reply
end

-- One call: `call_keys` and `call_argv` as prelude.lua's header describes them.
-- `is_routed`: called by check_routed, which gives a short call's time (`routed_time`, ''
-- for Redis TIME), its ARGV going on with keys where the time would be.
local function check(call_keys, call_argv, is_routed, routed_time)
  if not call then
    bind_globals()
  end
  short_shape = short_shapes[call_argv[1]]
  if short_shape == nil then
    short_shape = new_short_shape(call_argv[1])
  end
  local time = is_routed and routed_time or call_argv[2]
  if short_shape and #call_keys == 1 then
    return check_lone(short_shape, call_keys[1], time)
  end
  keys, argv, server_time, routed = call_keys, call_argv, false, is_routed or false
  keep_written = true
  held_key, holding, writing_held, held_failure = false, false, false, false
  results_held = max(results_held, result_count)
  result_count = 0
  local run = run_checks
  if short_shape then
    short_time, short_margin = time_and_margin(time)
    holding = true
    check_count, run = #keys, run_short_checks
  else
    spec_count = tonumber(argv[1])
    find_steps()
    read_shapes()
    check_count = tonumber(argv[p + 1])
  end
  done, k, next_k, answer_start = 0, 0, 0, 0
  while done < check_count and not held_failure do
    local ok, failure = pcall(run)
    if not ok then
      local text = failure_text(failure)
      if writing_held then
        held_failure, writing_held = text, false
      end
      for i = result_count, answer_start + 1, -1 do
        results[i] = nil
      end
      result_count = answer_start + 1
      results[result_count] = text
      k, done = next_k, done + 1
    end
  end
  -- Out of the pcall: a held state that cannot be written fails the call (prelude.lua).
  holding = false
  write_held()
  for i = results_held, result_count + 1, -1 do
    results[i] = nil
  end
  results_held = result_count
  if held_failure then
    return redis.error_reply(held_failure)
  end
  return results
end

-- One call sent to a node by its address, no key declared, every check's keys at the end
-- of ARGV (prelude.lua's header): on a Redis Cluster, checks of several slots of one node
-- in one call.
local routed_keys = {}
local function check_routed(call_keys, call_argv)
  if not call then
    bind_globals()
  end
  local n = tonumber(call_argv[#call_argv])
  local first = #call_argv - n - 1
  for i = 1, n do
    routed_keys[i] = call_argv[first + i]
  end
  for i = #routed_keys, n + 1, -1 do
    routed_keys[i] = nil
  end
  return check(routed_keys, call_argv, true, first >= 2 and call_argv[2] or '')
end
