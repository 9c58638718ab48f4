//! The check script and how it is spoken to: the keys and arguments of one call carrying
//! one or more checks (the script's header describes them), and the reply split back into
//! each check's rows. How the call reaches Redis (`FCALL` or `EVALSHA`) is `scripting`'s.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::CallError;
use super::keys::{KeyKind, redis_key, state_key, wall_clock_micros};
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, LogLayout, Rule};
use crate::store::check::{Charge, Check, RequestUse};

/// The check script's library, joined from its pieces in this order (each uses only the
/// ones before it): it defines `check`, which `scripting` registers as a function or calls
/// from a script; see the header of `lua/prelude.lua` for the arguments.
pub(super) const CHECK_LIBRARY: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/sliding_log_compact.lua"),
    include_str!("lua/sliding_counter.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/main.lua"),
);

/// The check library as it is sent to Redis: [`CHECK_LIBRARY`], its comment lines emptied.
pub(super) fn library_source() -> String {
    without_comment_lines(CHECK_LIBRARY)
}

/// Lua `text` with each line that is only a comment left empty. Comments are about half the
/// library's bytes, and Redis keeps each library and script it is sent whole, as the service
/// keeps its copies. Emptied rather than removed, the lines keep the numbers Redis' error
/// messages give. Sound for text with no long brackets (`[[`), inside which such a line would
/// be text: a test holds the library so.
fn without_comment_lines(text: &str) -> String {
    let mut source = String::with_capacity(text.len());
    for line in text.lines() {
        if !line.trim_start().starts_with("--") {
            source.push_str(line);
        }
        source.push('\n');
    }
    source
}

/// The codes of the script's arguments and reply: they must match the constants of the
/// same names in `lua/prelude.lua` (which names no `CHECK`: a mode it does not tell apart
/// decides and records).
mod code {
    pub(super) const SLIDING_LOG: u64 = 1;
    pub(super) const SLIDING_COUNTER: u64 = 2;
    pub(super) const FIXED_WINDOW: u64 = 3;
    pub(super) const TOKEN_BUCKET: u64 = 4;
    pub(super) const LEAKY_BUCKET: u64 = 5;

    /// A sliding log's layout; a fixed window's is its own (`ZSET`'s code) or `ENVOY`.
    pub(super) const ZSET: u64 = 0;
    pub(super) const COMPACT: u64 = 1;
    pub(super) const ENVOY: u64 = 2;

    /// Modes.
    pub(super) const CHECK: &str = "check";
    pub(super) const DRY: &str = "dry";
    pub(super) const UNDO: &str = "undo";
    /// `CHECK` and `DRY` with refusals charged (`Charge::CheckChargingRefusals`).
    pub(super) const CHARGE: &str = "charge";
    pub(super) const DRY_CHARGE: &str = "dry-charge";
    /// `DRY` for a reservation: the use its request id is compared with is a `reserve`'s.
    pub(super) const DRY_RESERVE: &str = "dry-reserve";
    /// The usage modes (`Charge::Reserve` … `Charge::Refund`) and their dry runs: a
    /// reservation's is `DRY_RESERVE`; a report's, settle's or refund's records nothing and
    /// fails on a conflicting reuse of its request id.
    pub(super) const RESERVE: &str = "reserve";
    pub(super) const REPORT: &str = "report";
    pub(super) const SETTLE: &str = "settle";
    pub(super) const REFUND: &str = "refund";
    pub(super) const DRY_REPORT: &str = "dry-report";
    pub(super) const DRY_SETTLE: &str = "dry-settle";
    pub(super) const DRY_REFUND: &str = "dry-refund";

    /// Bits of a rule's status.
    pub(super) const ALLOWS: i64 = 1;
    pub(super) const RECORDED: i64 = 2;

    /// What an undo answers.
    pub(super) const GIVEN_BACK: i64 = 1;
}

/// What the script is asked to do (its ARGV[4]), with the check's [`Charge`].
#[derive(Clone, Copy)]
pub(super) enum Mode<'a> {
    /// Decide and record (a report, settle or refund: record and answer the standing).
    Check,
    /// Answer as a check refused by another rule: record nothing. For a report, settle or
    /// refund: fail on a conflicting reuse of its request id, else answer the standing.
    Dry,
    /// Give back what these rows recorded.
    Undo(&'a [Row]),
}

impl Mode<'_> {
    fn name(self, charge: Charge) -> &'static str {
        match (self, charge) {
            (Mode::Check, Charge::Check) => code::CHECK,
            (Mode::Check, Charge::CheckChargingRefusals) => code::CHARGE,
            (Mode::Check, Charge::Reserve) => code::RESERVE,
            (Mode::Check, Charge::Report) => code::REPORT,
            (Mode::Check, Charge::Settle) => code::SETTLE,
            (Mode::Check, Charge::Refund) => code::REFUND,
            (Mode::Dry, Charge::CheckChargingRefusals) => code::DRY_CHARGE,
            (Mode::Dry, Charge::Reserve) => code::DRY_RESERVE,
            (Mode::Dry, Charge::Report) => code::DRY_REPORT,
            (Mode::Dry, Charge::Settle) => code::DRY_SETTLE,
            (Mode::Dry, Charge::Refund) => code::DRY_REFUND,
            (Mode::Dry, _) => code::DRY,
            (Mode::Undo(_), _) => code::UNDO,
        }
    }
}

/// One limit's answer from the script.
#[derive(Clone, Copy, Debug)]
pub(super) struct Row {
    pub(super) decision: Decision,
    /// The time the script recorded units at, if it recorded any.
    pub(super) recorded_at: Option<u64>,
}

impl Row {
    /// A script row as a decision of a rule whose decisions carry `limit`.
    pub(super) fn new(row: ScriptRow, limit: u64) -> Self {
        let [status, remaining, retry, reset, delay, at] = row;
        let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
        Row {
            decision: Decision {
                allowed: status & code::ALLOWS != 0,
                limit,
                remaining: unsigned(remaining),
                retry_after: if retry < 0 {
                    RetryAfter::Never
                } else {
                    RetryAfter::micros(unsigned(retry))
                },
                reset_after: unsigned(reset),
                delay: unsigned(delay),
            },
            recorded_at: (status & code::RECORDED != 0).then(|| unsigned(at)),
        }
    }
}

/// One limit's answer from the script: status (1 allows, +2 recorded), remaining,
/// retry_after (-1 never), reset_after, delay, time decided at.
pub(super) type ScriptRow = [i64; ROW_FIELDS];
const ROW_FIELDS: usize = 6;
/// A short check's answer (its check [`ScriptCheck::is_short`]) is a row but the time,
/// which only a check that recorded needs: its status is then `-1 - time`.
const SHORT_ROW_FIELDS: usize = 5;

/// The row of a short check's answer.
fn short_row(fields: &[i64]) -> ScriptRow {
    let [status, remaining, retry, reset, delay] = fields.try_into().expect("a short row");
    match status {
        // Recorded at -1 - status (always allowed: a refusal that records is charged, not
        // given back).
        ..0 => [
            code::ALLOWS | code::RECORDED,
            remaining,
            retry,
            reset,
            delay,
            -1 - status,
        ],
        _ => [status, remaining, retry, reset, delay, 0],
    }
}

/// Whether any of a check's `rows` recorded units.
pub(super) fn recorded(rows: &[ScriptRow]) -> bool {
    rows.iter().any(|row| row[0] & code::RECORDED != 0)
}

/// One check's keys and arguments for the script.
pub(super) struct ScriptCheck {
    keys: Vec<String>,
    /// Client time, if the check carries one.
    at: Option<u64>,
    cost: u64,
    /// Each limit's own cost when they differ (`Check::costs`); empty otherwise.
    costs: Vec<u64>,
    request_id: Option<String>,
    mode: &'static str,
    /// Per limit, its rule's description and, for an undo, when it recorded units.
    rules: Vec<(RuleSpec, Option<u64>)>,
}

/// A rule as the script reads it: algorithm, limit, window, buckets, capacity, emission
/// interval, layout, and an envoy counter's expiration jitter (s).
type RuleSpec = [u64; 8];

fn rule_spec(rule: &Rule, expiration_jitter_max: u64) -> RuleSpec {
    if rule.envoy_counter() {
        return [
            code::FIXED_WINDOW,
            rule.limit(),
            rule.window_micros(),
            rule.buckets(),
            rule.capacity(),
            rule.emission_interval_micros(),
            code::ENVOY,
            expiration_jitter_max,
        ];
    }
    [
        algorithm_code(rule.algorithm()),
        rule.limit(),
        rule.window_micros(),
        rule.buckets(),
        rule.capacity(),
        rule.emission_interval_micros(),
        match rule.layout() {
            LogLayout::Zset => code::ZSET,
            LogLayout::Compact => code::COMPACT,
        },
        0,
    ]
}

fn algorithm_code(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingLog => code::SLIDING_LOG,
        Algorithm::SlidingCounter => code::SLIDING_COUNTER,
        Algorithm::FixedWindow => code::FIXED_WINDOW,
        Algorithm::TokenBucket => code::TOKEN_BUCKET,
        Algorithm::LeakyBucket => code::LEAKY_BUCKET,
    }
}

impl ScriptCheck {
    /// The script's keys (under `prefix`) and arguments for `check`, in `mode`; envoy
    /// counters expire after their window and up to `expiration_jitter_max` seconds more.
    /// A check of an envoy counter is decided at its own time, or this instance's wall
    /// clock, which names the counter's window as envoy's instances do.
    pub(super) fn new(
        prefix: &str,
        expiration_jitter_max: u64,
        check: &Check<'_>,
        mode: Mode<'_>,
    ) -> Self {
        let at = if check.limits.iter().any(|l| l.rule.envoy_counter()) {
            Some(check.at_micros().unwrap_or_else(wall_clock_micros))
        } else {
            check.at_micros()
        };
        let with_request_id = check.request_id.is_some();
        let mut keys = Vec::with_capacity(if with_request_id { 3 } else { 1 } * check.limits.len());
        let mut rules = Vec::with_capacity(check.limits.len());
        for (i, limit) in check.limits.iter().enumerate() {
            let rule = limit.rule;
            // `at` is set whenever an envoy counter, the one key it names, is in the check.
            keys.push(state_key(prefix, rule, limit.key, at.unwrap_or(0)));
            if with_request_id {
                keys.push(redis_key(prefix, KeyKind::RequestIds, rule, limit.key));
                keys.push(redis_key(prefix, KeyKind::ReleaseTimes, rule, limit.key));
            }
            let recorded_at = match mode {
                Mode::Undo(rows) => rows[i].recorded_at,
                Mode::Check | Mode::Dry => None,
            };
            rules.push((rule_spec(rule, expiration_jitter_max), recorded_at));
        }
        ScriptCheck {
            keys,
            at,
            cost: check.cost,
            costs: check.costs.to_vec(),
            request_id: check.request_id.map(str::to_owned),
            mode: mode.name(check.charge),
            rules,
        }
    }

    /// The check's keys.
    pub(super) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Whether the check gives back an admission: never routed (`check_routed` guards
    /// only what a check does).
    pub(super) fn is_undo(&self) -> bool {
        self.mode == code::UNDO
    }

    /// Whether the check may record units: any mode but a dry run or an undo, unless it
    /// costs nothing and has no request id to remember (a peek).
    pub(super) fn may_record(&self) -> bool {
        let costs_something = self.cost > 0 || self.costs.iter().any(|&cost| cost > 0);
        self.mode != code::UNDO
            && !self.mode.starts_with(code::DRY)
            && (costs_something || self.request_id.is_some())
    }

    /// Whether the script's short path decides the check (`run_short` in `lua/main.lua`):
    /// one rule, no request id, no costs per rule, and a check or a dry run, refusals
    /// charged or not.
    fn is_short(&self) -> bool {
        self.rules.len() == 1
            && self.request_id.is_none()
            && self.costs.is_empty()
            && [code::CHECK, code::DRY, code::CHARGE, code::DRY_CHARGE].contains(&self.mode)
    }

    /// Whether the script would read `other` exactly as this check, but for the keys.
    fn same_shape(&self, other: &ScriptCheck) -> bool {
        self.at == other.at
            && self.cost == other.cost
            && self.costs == other.costs
            && self.request_id == other.request_id
            && self.mode == other.mode
            && self.rules == other.rules
    }
}

/// One script call carrying `checks`, in order: `{verb} {name} {key count} {keys…}
/// {arguments…}` (`FCALL` and `EVALSHA` read the same). Checks of one rule that the short
/// path decides, all of one shape, go as a short call: that shape in one argument, and the
/// client's time in a second if they carry one.
/// Otherwise each distinct rule is described once, and so is each distinct shape of check
/// (what it asks, but for its keys): checks of the same rules and cost, without request ids
/// or times of their own, cost one argument each, and none when every check of the call
/// has one shape.
pub(super) fn command(verb: &str, name: &str, checks: &[ScriptCheck]) -> redis::Cmd {
    let mut command = redis::cmd(verb);
    command
        .arg(name)
        .arg(checks.iter().map(|check| check.keys.len()).sum::<usize>());
    for check in checks {
        command.arg(&check.keys);
    }
    add_arguments(&mut command, checks);
    command
}

/// [`command`] for `check_routed`, a function (FCALL): no key declared (the call is sent to
/// a node by its address); every check's keys follow the arguments, then their number.
pub(super) fn routed_command(name: &str, checks: &[ScriptCheck]) -> redis::Cmd {
    let mut command = redis::cmd("FCALL");
    command.arg(name).arg(0);
    add_arguments(&mut command, checks);
    for check in checks {
        command.arg(&check.keys);
    }
    command.arg(checks.iter().map(|check| check.keys.len()).sum::<usize>());
    command
}

/// The arguments of a call carrying `checks`, but for their keys: a short call's when the
/// short path decides every check and they are all of one shape (the script's header
/// describes both).
fn add_arguments(command: &mut redis::Cmd, checks: &[ScriptCheck]) {
    match checks {
        [first, rest @ ..] if first.is_short() && rest.iter().all(|c| first.same_shape(c)) => {
            add_short_arguments(command, first);
        }
        _ => add_general_arguments(command, checks),
    }
}

/// The arguments of a short call of checks shaped as `shape`: the rule's values, the cost
/// and the mode, joined by ':', then the client's time, if any: none stands for Redis
/// TIME, as each argument costs Redis some 2,000 instructions in a call of few.
fn add_short_arguments(command: &mut redis::Cmd, shape: &ScriptCheck) {
    let (spec, _) = &shape.rules[0];
    let values: Vec<String> = spec.iter().map(u64::to_string).collect();
    command.arg(format!(
        "{}:{}:{}",
        values.join(":"),
        shape.cost,
        shape.mode
    ));
    if let Some(at) = shape.at {
        command.arg(at);
    }
}

/// The arguments of a general call carrying `checks`, but for their keys.
fn add_general_arguments(command: &mut redis::Cmd, checks: &[ScriptCheck]) {
    let mut specs: Vec<RuleSpec> = Vec::new();
    let mut shapes: Vec<&ScriptCheck> = Vec::new();
    let mut shape_numbers = Vec::with_capacity(checks.len());
    for check in checks {
        for (spec, _) in &check.rules {
            if !specs.contains(spec) {
                specs.push(*spec);
            }
        }
        let number = match shapes.iter().position(|shape| shape.same_shape(check)) {
            Some(i) => i + 1,
            None => {
                shapes.push(check);
                shapes.len()
            }
        };
        shape_numbers.push(number);
    }
    command.arg(specs.len());
    for spec in &specs {
        command.arg(&spec[..]);
    }
    let shapes_count = shapes.len();
    command.arg(shapes_count);
    for shape in shapes {
        match shape.at {
            Some(at) => command.arg(at),
            None => command.arg(""),
        };
        // '' for the cost: each rule's follows its number (and recorded time).
        if shape.costs.is_empty() {
            command.arg(shape.cost);
        } else {
            command.arg("");
        }
        command
            .arg(shape.request_id.as_deref().unwrap_or(""))
            .arg(shape.mode)
            .arg(shape.rules.len());
        for (i, (spec, recorded_at)) in shape.rules.iter().enumerate() {
            let number = 1 + specs
                .iter()
                .position(|known| known == spec)
                .expect("every rule of every check was collected");
            command.arg(number);
            if shape.mode == code::UNDO {
                match recorded_at {
                    Some(at) => command.arg(at),
                    None => command.arg(""),
                };
            }
            if let Some(cost) = shape.costs.get(i) {
                command.arg(cost);
            }
        }
    }
    command.arg(checks.len());
    if shapes_count > 1 {
        command.arg(shape_numbers);
    }
}

/// The script's reply to a call carrying `checks`, split per check: its rows (none for an
/// undo), or the error that stopped it.
pub(super) fn split_answers(
    reply: redis::Value,
    checks: &[ScriptCheck],
) -> Result<Vec<Result<Vec<ScriptRow>, CallError>>, CallError> {
    let malformed = |what: &str| CallError::Check(format!("malformed script reply: {what}"));
    let redis::Value::Array(values) = reply else {
        return Err(malformed("not an array"));
    };
    let mut values = values.into_iter();
    let mut answers = Vec::with_capacity(checks.len());
    for check in checks {
        let answer = match values.next() {
            Some(redis::Value::BulkString(text)) => Err(CallError::Check(
                String::from_utf8_lossy(&text).into_owned(),
            )),
            Some(redis::Value::Int(code::GIVEN_BACK)) if check.mode == code::UNDO => Ok(Vec::new()),
            Some(redis::Value::Int(first)) if check.mode != code::UNDO => {
                let short = check.is_short();
                let row_fields = if short { SHORT_ROW_FIELDS } else { ROW_FIELDS };
                let mut fields = vec![first];
                while fields.len() < row_fields * check.rules.len() {
                    match values.next() {
                        Some(redis::Value::Int(field)) => fields.push(field),
                        _ => return Err(malformed("short row")),
                    }
                }
                Ok(fields
                    .chunks_exact(row_fields)
                    .map(|row| {
                        if short {
                            short_row(row)
                        } else {
                            row.try_into().expect("chunks of a row's length")
                        }
                    })
                    .collect())
            }
            _ => return Err(malformed("unexpected value")),
        };
        answers.push(answer);
    }
    if values.next().is_some() {
        return Err(malformed("more values than checks"));
    }
    Ok(answers)
}

/// The rule (its index in the check) and what its state remembers the request id was used
/// for, from the error text of a conflicting reuse: `request id conflict: rule {i}
/// {mode}:{cost}`, `i` from 1 (prelude.lua, `CONFLICT`). `None` for any other text.
pub(super) fn request_id_conflict(message: &str) -> Option<(usize, RequestUse)> {
    let rest = message.strip_prefix("request id conflict: rule ")?;
    let (number, used) = rest.split_once(' ')?;
    let (mode, cost) = used.split_once(':')?;
    let index = number.parse::<usize>().ok()?.checked_sub(1)?;
    Some((
        index,
        RequestUse::new(Charge::from_name(mode)?, cost.parse().ok()?),
    ))
}

/// Script calls made and checks carried, counted as they are sent.
#[derive(Default)]
pub(super) struct CallCounters {
    calls: AtomicU64,
    checks: AtomicU64,
    not_replicated: AtomicU64,
}

impl CallCounters {
    pub(super) fn count(&self, checks: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.checks.fetch_add(checks as u64, Ordering::Relaxed);
    }

    /// A check that recorded units failed: no replica acknowledged them.
    pub(super) fn count_not_replicated(&self) {
        self.not_replicated.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> ScriptCalls {
        ScriptCalls {
            calls: self.calls.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            not_replicated: self.not_replicated.load(Ordering::Relaxed),
        }
    }
}

/// What [`RedisStore::script_calls`](super::RedisStore::script_calls) reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScriptCalls {
    /// Script calls sent.
    pub calls: u64,
    /// Checks they carried.
    pub checks: u64,
    /// Checks that recorded units and failed because no replica acknowledged them in
    /// time ([`StoreError::NotReplicated`](crate::StoreError::NotReplicated)).
    pub not_replicated: u64,
}

/// What [`RedisStore::script_time`](super::RedisStore::script_time) reports: Redis' own
/// account of the script calls it ran (`FCALL`, `EVALSHA`, `EVAL`), from `INFO
/// commandstats`, summed over the servers asked. Counts every client's calls, not only
/// this store's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
pub struct ScriptTime {
    /// Script calls run.
    pub calls: u64,
    /// Microseconds spent running them, the commands they sent included.
    pub micros: u64,
}

/// The script commands whose time `INFO commandstats` reports.
const SCRIPT_COMMANDS: [&str; 3] = ["fcall", "evalsha", "eval"];

#[cfg_attr(not(feature = "internals"), allow(dead_code, unreachable_pub))]
impl ScriptTime {
    /// Adds what one server's `INFO commandstats` says of the script commands (lines
    /// `cmdstat_fcall:calls=3,usec=40,usec_per_call=13.33,…`).
    pub(super) fn add_commandstats(&mut self, info: &str) {
        for line in info.lines() {
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            if !name
                .strip_prefix("cmdstat_")
                .is_some_and(|command| SCRIPT_COMMANDS.contains(&command))
            {
                continue;
            }
            for field in fields.split(',') {
                match field.split_once('=') {
                    Some(("calls", n)) => self.calls += n.parse::<u64>().unwrap_or(0),
                    Some(("usec", n)) => self.micros += n.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }

    /// What ran between `earlier` and this reading.
    pub fn since(self, earlier: ScriptTime) -> ScriptTime {
        ScriptTime {
            calls: self.calls.saturating_sub(earlier.calls),
            micros: self.micros.saturating_sub(earlier.micros),
        }
    }
}

#[cfg(test)]
mod library_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_sum_the_script_commands_only() {
        let mut time = ScriptTime::default();
        time.add_commandstats(
            "# Commandstats\r\n\
             cmdstat_fcall:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0\r\n\
             cmdstat_zadd:calls=9,usec=90,usec_per_call=10.00\r\n\
             cmdstat_evalsha:calls=2,usec=7,usec_per_call=3.50\r\n\
             cmdstat_function|load:calls=1,usec=500,usec_per_call=500.00\r\n",
        );
        assert_eq!(
            time,
            ScriptTime {
                calls: 5,
                micros: 47
            }
        );
    }

    #[test]
    fn a_conflict_names_its_rule_and_the_first_use() {
        assert_eq!(
            request_id_conflict("request id conflict: rule 2 reserve:10"),
            Some((1, RequestUse::new(Charge::Reserve, 10)))
        );
        assert_eq!(
            request_id_conflict("request id conflict: rule 1 check:1"),
            Some((0, RequestUse::new(Charge::Check, 1)))
        );
        for other in [
            "request id conflict: rule 0 check:1",
            "request id conflict: rule 1 charge:1",
            "ERR something else",
        ] {
            assert_eq!(request_id_conflict(other), None, "{other}");
        }
    }

    #[test]
    fn rows_become_decisions() {
        let row = Row::new([0, 0, -1, 10, 0, 77], 5);
        assert_eq!(row.decision.retry_after, RetryAfter::Never);
        assert!(!row.decision.allowed);
        assert_eq!(row.recorded_at, None);
        let row = Row::new([3, 4, 0, 10, 3, 77], 5);
        assert_eq!((row.decision.delay, row.recorded_at), (3, Some(77)));
    }

    #[test]
    fn a_short_row_carries_the_time_only_when_it_recorded() {
        assert_eq!(short_row(&[-78, 4, 0, 10, 3]), [3, 4, 0, 10, 3, 77]);
        assert_eq!(short_row(&[-1, 4, 0, 10, 0]), [3, 4, 0, 10, 0, 0]);
        assert_eq!(short_row(&[1, 4, 0, 10, 0]), [1, 4, 0, 10, 0, 0]);
        assert_eq!(short_row(&[0, 0, -1, 10, 0]), [0, 0, -1, 10, 0, 0]);
    }
}
