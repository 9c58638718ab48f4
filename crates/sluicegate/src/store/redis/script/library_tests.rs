//! The check library against a real redis-server: the short path (`run_short` in
//! `lua/main.lua`) decides exactly as the general path does, and the shell's copy of the
//! library and of a plain check's arguments (`scripts/lib/check-library.sh`) is what the
//! store sends.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use redis::Value;
use sluicegate_test_support::{cmd, standalone};

use super::*;
use crate::rule::RuleSpec;
use crate::store::check::Limit;

/// The repository's root (this crate's manifest is two levels below it).
fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("the crate lives in crates/")
}

/// What `script` prints with scripts/lib/check-library.sh sourced.
fn shell(script: &str) -> String {
    let root = repository();
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -eu; repo={root}; source \"$repo/scripts/lib/check-library.sh\"; {script}",
            root = root.display()
        ))
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The arguments of `command` as text, after its name, function and keys.
fn arguments_after_keys(command: &redis::Cmd) -> Vec<String> {
    let all: Vec<String> = command
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).expect("UTF-8"),
            _ => panic!("a command of plain arguments"),
        })
        .collect();
    let keys: usize = all[2].parse().expect("the number of keys");
    all[3 + keys..].to_vec()
}

#[test]
fn the_shell_joins_the_library_the_store_loads() {
    assert_eq!(shell("check_library"), library_source());
}

#[test]
fn the_library_is_sent_with_its_comment_lines_empty_and_every_other_line_as_it_is() {
    assert_eq!(
        without_comment_lines("-- a header\nlocal a = 1 -- a note\n  -- indented\n\nreturn a\n"),
        "\nlocal a = 1 -- a note\n\n\nreturn a\n"
    );
    // A long bracket would make a line starting with `--` text, not a comment.
    assert!(!CHECK_LIBRARY.contains("[[") && !CHECK_LIBRARY.contains("[="));
}

#[test]
fn the_shell_sends_a_plain_check_as_the_store_does() {
    let cases = [
        ("1 100 1000000", Algorithm::SlidingLog, 100, 1, None),
        (
            "1 100 1000000 1",
            Algorithm::SlidingLog,
            100,
            1,
            Some(LogLayout::Compact),
        ),
        (
            "3 1000000000 60000000",
            Algorithm::FixedWindow,
            1_000_000_000,
            60,
            None,
        ),
    ];
    for (shell_arguments, algorithm, limit, seconds, layout) in cases {
        let mut spec = RuleSpec::new(algorithm, limit, Duration::from_secs(seconds));
        spec.layout = layout;
        let rule = Rule::new("r", &spec).expect("a valid rule");
        let limits = [Limit {
            rule: &rule,
            key: "k",
        }];
        let check = ScriptCheck::new("p", 0, &Check::new(&limits, 1), Mode::Check);
        let sent = arguments_after_keys(&command("FCALL", "f", &[check]));
        let from_shell: Vec<String> = shell(&format!("one_rule_check {shell_arguments}"))
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(from_shell, sent, "one_rule_check {shell_arguments}");
    }
}

/// `source`, a version of the library, registered as function `name`.
fn load(name: &str, source: &str) -> String {
    let library = format!(
        "#!lua name={name}\n{source}\
         redis.register_function{{function_name = '{name}', callback = check}}\n"
    );
    standalone()
        .query::<String>(cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(library))
        .expect("the library loads");
    name.to_owned()
}

/// `text` with `from` (found exactly once) replaced by `to`.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "{from:?} once in the library"
    );
    text.replacen(from, to, 1)
}

/// The line of main.lua that sends a shape's checks down the short path.
const SHORT_SHAPE: &str = "    shape.short = rule_count == 1";

/// The library with the short path off: every check goes the general way.
fn general_only(library: &str) -> String {
    replace_once(
        library,
        SHORT_SHAPE,
        "    shape.short = false and rule_count == 1",
    )
}

/// The library with a short path that fails every check it is given, at its entry (what
/// `short_decider` gives, for every algorithm).
fn short_path_failing(library: &str) -> String {
    let entry = "local function short_decider(r, cost, dry)\n";
    replace_once(
        library,
        entry,
        &format!("{entry}  do return function() error('short path', 0) end end\n"),
    )
}

/// The library with each command it sends checked first: a Lua number among its arguments
/// (which Redis writes with "%.17g": prelude.lua) fails the check, naming the command.
fn number_arguments_failing(library: &str) -> String {
    replace_once(
        library,
        "  call = redis.call\n",
        "  call = function(...)\n\
         \x20   for i = 2, select('#', ...) do\n\
         \x20     if type((select(i, ...))) == 'number' then\n\
         \x20       error('a number argument to ' .. (...), 0)\n\
         \x20     end\n\
         \x20   end\n\
         \x20   return redis.call(...)\n\
         \x20 end\n",
    )
}

/// A small deterministic generator (xorshift64*).
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The traces' rules: one of each algorithm and layout, on windows of a second, and the two
/// log layouts again with a limit of 2 over 10 s, so that a key checked every few seconds
/// fills and is refused (a second's window seldom holds more than one check of a key).
fn rules() -> Vec<Rule> {
    let second = Duration::from_secs(1);
    let ten_seconds = Duration::from_secs(10);
    let mut specs = [
        RuleSpec::new(Algorithm::SlidingLog, 5, second),
        RuleSpec {
            layout: Some(LogLayout::Compact),
            ..RuleSpec::new(Algorithm::SlidingLog, 5, second)
        },
        RuleSpec::new(Algorithm::SlidingLog, 2, ten_seconds),
        RuleSpec {
            layout: Some(LogLayout::Compact),
            ..RuleSpec::new(Algorithm::SlidingLog, 2, ten_seconds)
        },
        RuleSpec::new(Algorithm::SlidingCounter, 6, second),
        RuleSpec::new(Algorithm::FixedWindow, 4, second),
        RuleSpec::new(Algorithm::TokenBucket, 3, second),
        RuleSpec::new(Algorithm::LeakyBucket, 3, second),
    ];
    specs[6].burst = Some(4);
    specs[7].queue = Some(2);
    let mut rules: Vec<Rule> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Rule::new(&format!("r{i}"), spec).expect("a valid rule"))
        .collect();
    let envoy = Rule::new("envoy", &RuleSpec::new(Algorithm::FixedWindow, 4, second))
        .and_then(|rule| rule.with_envoy_counter())
        .expect("an envoy counter");
    rules.push(envoy);
    rules
}

/// What a check of the trace is: its rule(s), key, cost, mode and whether it has a request
/// id (which sends it the general way, as does a second rule).
struct TraceCheck {
    rules: Vec<usize>,
    key: &'static str,
    cost: u64,
    charge: Charge,
    dry: bool,
    request_id: Option<String>,
}

impl TraceCheck {
    fn short(&self) -> bool {
        self.rules.len() == 1 && self.request_id.is_none()
    }
}

/// The script check of `check` at `at` µs in `mode`, its keys under `prefix`.
fn script_check(
    prefix: &str,
    rules: &[Rule],
    check: &TraceCheck,
    at: u64,
    mode: Mode<'_>,
) -> ScriptCheck {
    let limits: Vec<Limit<'_>> = check
        .rules
        .iter()
        .map(|&i| Limit {
            rule: &rules[i],
            key: check.key,
        })
        .collect();
    let mut asked = Check::new(&limits, check.cost);
    asked.at = Some(Duration::from_micros(at));
    asked.charge = check.charge;
    asked.request_id = check.request_id.as_deref();
    ScriptCheck::new(prefix, 0, &asked, mode)
}

/// The script checks of `checks` at `at` µs, their keys under `prefix`.
fn script_checks(prefix: &str, rules: &[Rule], checks: &[TraceCheck], at: u64) -> Vec<ScriptCheck> {
    checks
        .iter()
        .map(|check| {
            let mode = if check.dry { Mode::Dry } else { Mode::Check };
            script_check(prefix, rules, check, at, mode)
        })
        .collect()
}

fn fcall(function: &str, checks: &[ScriptCheck]) -> Value {
    standalone()
        .query(&command("FCALL", function, checks))
        .expect("the call answers")
}

/// [`fcall`] with the arguments of a general call, whatever the checks.
fn fcall_general(function: &str, checks: &[ScriptCheck]) -> Value {
    let mut call = redis::cmd("FCALL");
    call.arg(function)
        .arg(checks.iter().map(|check| check.keys().len()).sum::<usize>());
    for check in checks {
        call.arg(check.keys());
    }
    add_general_arguments(&mut call, checks);
    standalone().query(&call).expect("the call answers")
}

/// Split answers as comparable values: each check's rows, the time of one that recorded
/// nothing as 0 (a short check's answer leaves it out), or its error's text.
fn answers(split: Vec<Result<Vec<ScriptRow>, CallError>>) -> Vec<Result<Vec<ScriptRow>, String>> {
    split
        .into_iter()
        .map(|answer| match answer {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|mut row| {
                    if row[0] & code::RECORDED == 0 {
                        row[5] = 0;
                    }
                    row
                })
                .collect()),
            Err(CallError::Check(text)) => Err(text),
            Err(_) => panic!("a check fails by its error's text"),
        })
        .collect()
}

/// [`answers`] of a library with the short path off: every check's rows are whole.
fn general_answers(reply: Value, checks: &[ScriptCheck]) -> Vec<Result<Vec<ScriptRow>, String>> {
    let Value::Array(values) = reply else {
        panic!("not an array: {reply:?}");
    };
    let mut values = values.into_iter();
    let split = checks
        .iter()
        .map(|check| match values.next() {
            Some(Value::BulkString(text)) => Err(CallError::Check(
                String::from_utf8_lossy(&text).into_owned(),
            )),
            Some(Value::Int(first)) => {
                let mut fields = vec![first];
                for _ in 1..ROW_FIELDS * check.rules.len() {
                    match values.next() {
                        Some(Value::Int(field)) => fields.push(field),
                        other => panic!("not a number: {other:?}"),
                    }
                }
                Ok(fields
                    .chunks_exact(ROW_FIELDS)
                    .map(|row| row.try_into().expect("a row"))
                    .collect())
            }
            other => panic!("not an answer: {other:?}"),
        })
        .collect();
    assert_eq!(values.next(), None, "more values than checks");
    answers(split)
}

/// A key's value as DUMP gives it (its encoding and bytes), and when it expires (ms).
fn state(key: &str) -> (Value, i64) {
    let server = standalone();
    let dumped = server.query(cmd("DUMP").arg(key)).expect("DUMP");
    let expires = server
        .query(cmd("PEXPIRETIME").arg(key))
        .expect("PEXPIRETIME");
    (dumped, expires)
}

/// A random trace of calls of one to four checks, most of them plain checks of one rule,
/// some with a request id or a second rule (so that calls mix the two paths), decided by
/// the library as the store calls it (a short call when it can be) and by the library with
/// the short path off, called as a general call, under two prefixes: every reply and every
/// key's state (DUMP, expiry) the same.
#[test]
fn the_short_path_decides_as_the_general_path_does() {
    let short = load("sluicegate_short_test", &library_source());
    let general = load("sluicegate_general_test", &general_only(&library_source()));
    let failing = load(
        "sluicegate_failing_short_test",
        &short_path_failing(&library_source()),
    );
    let rules = rules();
    let keys = ["a", "b", "c"];
    let mut random = Random(0x5eed_0fc0_ffee);
    let mut at: u64 = 1_700_000_000_000_000;
    let (mut short_checks, mut short_calls) = (0, 0);
    for call in 0..600 {
        at += random.below(400_000);
        let checks: Vec<TraceCheck> = (0..1 + random.below(4))
            .map(|n| {
                let first = random.below(rules.len() as u64) as usize;
                let mut check_rules = vec![first];
                let mut request_id = None;
                // The envoy counter takes checks only, alone with other envoy counters.
                if first != rules.len() - 1 {
                    match random.below(8) {
                        0 => check_rules.push((first + 1) % (rules.len() - 1)),
                        1 => request_id = Some(format!("id{}", random.below(4))),
                        _ => {}
                    }
                }
                let charge = if random.below(4) == 0 {
                    Charge::CheckChargingRefusals
                } else {
                    Charge::Check
                };
                TraceCheck {
                    rules: check_rules,
                    key: keys[((call + n) % 3 + random.below(2)) as usize % 3],
                    cost: [0, 1, 1, 1, 2, 3, 9][random.below(7) as usize],
                    charge,
                    dry: random.below(6) == 0,
                    request_id,
                }
            })
            .collect();
        let on_short = script_checks("s", &rules, &checks, at);
        let on_general = script_checks("g", &rules, &checks, at);
        // A call whose checks all go short, all of one shape, is a short call.
        let short_call = checks.iter().all(TraceCheck::short)
            && on_short.iter().all(|check| on_short[0].same_shape(check));
        let sent = arguments_after_keys(&command("FCALL", &short, &on_short));
        assert_eq!(sent.len() == 2, short_call, "call {call}: {sent:?}");
        short_calls += usize::from(short_call);
        let Ok(replied) = split_answers(fcall(&short, &on_short), &on_short) else {
            panic!("call {call}: a malformed reply");
        };
        assert_eq!(
            answers(replied),
            general_answers(fcall_general(&general, &on_general), &on_general),
            "call {call} at {at}: the replies differ"
        );
        for (short_check, general_check) in on_short.iter().zip(&on_general) {
            for (short_key, general_key) in short_check.keys().iter().zip(general_check.keys()) {
                let (short_state, short_expiry) = state(short_key);
                let (general_state, general_expiry) = state(general_key);
                assert_eq!(short_state, general_state, "call {call}: {short_key}");
                assert!(
                    (short_expiry - general_expiry).abs() < 1000,
                    "call {call}: {short_key} expires at {short_expiry}, \
                     {general_key} at {general_expiry}"
                );
            }
        }
        // Each plain check of one rule went the short way: failing there, it fails alone;
        // the others never reach it. (Under a prefix of its own: it writes what the
        // general checks write.)
        let Value::Array(failed) = fcall(&failing, &script_checks("f", &rules, &checks, at)) else {
            panic!("call {call}: not an array");
        };
        let failed_short = failed
            .iter()
            .filter(|value| **value == Value::BulkString(b"short path".to_vec()))
            .count();
        let expected = checks.iter().filter(|check| check.short()).count();
        assert_eq!(
            failed_short, expected,
            "call {call}: checks that went short"
        );
        short_checks += expected;
    }
    assert!(short_checks > 1000, "{short_checks} short checks");
    assert!(short_calls > 100, "{short_calls} short calls");
}

/// The library keeps its reply table from call to call: each reply holds its own checks'
/// values and nothing the last call left, after a longer call and after a check that
/// failed (a key of the wrong type, answered by its error in place of its numbers).
#[test]
fn a_reply_holds_its_own_checks_only() {
    let function = load("sluicegate_reply_test", &library_source());
    let rule = Rule::new(
        "replies",
        &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(60)),
    )
    .expect("a valid rule");
    let call = |keys: &[&str]| -> Vec<Value> {
        let checks: Vec<ScriptCheck> = keys
            .iter()
            .map(|&key| {
                let limits = [Limit { rule: &rule, key }];
                ScriptCheck::new("reply", 0, &Check::new(&limits, 1), Mode::Check)
            })
            .collect();
        match fcall(&function, &checks) {
            Value::Array(values) => values,
            other => panic!("not an array: {other:?}"),
        }
    };
    assert_eq!(call(&["a", "b", "c", "d"]).len(), 4 * SHORT_ROW_FIELDS);
    assert_eq!(call(&["a"]).len(), SHORT_ROW_FIELDS);
    let limits = [Limit {
        rule: &rule,
        key: "string",
    }];
    let wrong = ScriptCheck::new("reply", 0, &Check::new(&limits, 1), Mode::Check);
    standalone()
        .query::<()>(cmd("SET").arg(&wrong.keys()[0]).arg("not a log"))
        .expect("SET");
    let failed = call(&["a", "string", "b", "c"]);
    assert_eq!(failed.len(), 3 * SHORT_ROW_FIELDS + 1, "{failed:?}");
    assert!(
        matches!(&failed[SHORT_ROW_FIELDS], Value::BulkString(text) if text.starts_with(b"WRONGTYPE")),
        "{failed:?}"
    );
    assert_eq!(call(&["a"]).len(), SHORT_ROW_FIELDS);
}

/// A short call on Redis TIME sends its shape alone, and one that carries the client's time
/// sends that time after it: called directly or routed (`check_routed`, whose keys follow
/// the arguments where a time would be), alone or with other checks, each decides on the
/// time it was given, and all count alike. A fixed window of 5 a day: its edge falls
/// inside a run but once a day.
#[test]
fn a_short_call_sends_a_time_only_when_it_has_one() {
    let source = library_source();
    let function = "sluicegate_time_test";
    let routed = "sluicegate_time_test_routed";
    standalone()
        .query::<String>(cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(format!(
            "#!lua name={function}\n{source}\
             redis.register_function{{function_name = '{function}', callback = check}}\n\
             redis.register_function{{function_name = '{routed}', callback = check_routed, \
             flags = {{'allow-cross-slot-keys'}}}}\n"
        )))
        .expect("the library loads");
    let rule = Rule::new(
        "times",
        &RuleSpec::new(Algorithm::FixedWindow, 5, Duration::from_secs(86_400)),
    )
    .expect("a valid rule");
    let client_time = 1_700_000_000_000_000;
    for at in [None, Some(client_time)] {
        for is_routed in [false, true] {
            for keys_per_call in [1, 3] {
                let case = format!("at {at:?}, routed {is_routed}, {keys_per_call} a call");
                let checks: Vec<ScriptCheck> = (0..keys_per_call)
                    .map(|i| {
                        let key = format!("k{i}");
                        let limits = [Limit {
                            rule: &rule,
                            key: &key,
                        }];
                        let mut asked = Check::new(&limits, 1);
                        asked.at = at.map(Duration::from_micros);
                        let prefix = format!("time-{}-{is_routed}-{keys_per_call}", at.is_some());
                        ScriptCheck::new(&prefix, 0, &asked, Mode::Check)
                    })
                    .collect();
                let call = if is_routed {
                    routed_command(routed, &checks)
                } else {
                    command("FCALL", function, &checks)
                };
                // The shape, the time if any, then a routed call's keys and their number.
                let sent = arguments_after_keys(&call);
                let mut expected = vec![sent[0].clone()];
                expected.extend(at.map(|micros| micros.to_string()));
                if is_routed {
                    expected.extend(checks.iter().flat_map(|check| check.keys().to_vec()));
                    expected.push(keys_per_call.to_string());
                }
                assert_eq!(sent, expected, "{case}");
                let mut remaining = Vec::new();
                for _ in 0..6 {
                    let Ok(split) =
                        split_answers(standalone().query(&call).expect("FCALL"), &checks)
                    else {
                        panic!("{case}: a malformed reply");
                    };
                    for answer in answers(split) {
                        let Ok(rows) = answer else {
                            panic!("{case}: {answer:?}");
                        };
                        let [[status, left, _, _, _, recorded_at]] = rows[..] else {
                            panic!("{case}: {rows:?}");
                        };
                        if status & code::RECORDED != 0 {
                            assert_recorded_at(recorded_at, at, &checks[0], &case);
                        }
                        remaining.push(left);
                    }
                }
                let expected: Vec<i64> = [4, 3, 2, 1, 0, 0]
                    .into_iter()
                    .flat_map(|left| std::iter::repeat_n(left, keys_per_call))
                    .collect();
                assert_eq!(remaining, expected, "{case}");
            }
        }
    }
}

/// A check of `first`'s day-long window recorded at `recorded_at`: the client's time `at`
/// if it gave one; else Redis' time, and then the window's key expires at the window's end,
/// where a time of the client's own would give it a minute more (prelude.lua, ttl_ms). The
/// bounds are wide: Redis sets a TTL from its clock when the command runs (7.0) or when the
/// script started (7.2), not from the `TIME` the script read.
fn assert_recorded_at(recorded_at: i64, at: Option<u64>, first: &ScriptCheck, case: &str) {
    const DAY_MICROS: i64 = 86_400_000_000;
    const SLACK_MS: i64 = 20_000;
    if let Some(micros) = at {
        assert_eq!(recorded_at, micros as i64, "{case}");
        return;
    }
    let window_end_ms = (recorded_at / DAY_MICROS + 1) * DAY_MICROS / 1000;
    let expires: i64 = standalone()
        .query(cmd("PEXPIRETIME").arg(&first.keys()[0]))
        .expect("PEXPIRETIME");
    assert!(
        (window_end_ms - SLACK_MS..window_end_ms + SLACK_MS).contains(&expires),
        "{case}: recorded at {recorded_at} µs, expires at {expires} ms"
    );
}

/// The rows of an answer, or None when its check failed for another reason than a number
/// argument (`number_arguments_failing`), in call `call`.
fn rows_unless_failed(
    answer: Result<Vec<ScriptRow>, CallError>,
    call: u64,
) -> Option<Vec<ScriptRow>> {
    match answer {
        Ok(rows) => Some(rows),
        Err(CallError::Check(text)) => {
            assert!(!text.contains("a number argument"), "call {call}: {text}");
            None
        }
        Err(_) => panic!("call {call}: a check fails by its error's text"),
    }
}

/// Every argument the library gives a command is text: a random trace of every mode
/// (check, charge, reserve, report, settle and refund, dry or not, with request ids) and of
/// undoing what checks recorded, over every algorithm and layout at limits that refuse, on
/// the library with each command checked (`number_arguments_failing`), which does fail a
/// number. The trace reaches what it is for: refusals, undos and answers in every mode.
#[test]
fn every_argument_the_library_sends_is_text() {
    let checked = number_arguments_failing(&library_source());
    let control = format!(
        "#!lua name=sluicegate_number_control\n{checked}\
         redis.register_function('sluicegate_number_control', \
         function() bind_globals() return call('EXISTS', 1) end)\n"
    );
    let server = standalone();
    server
        .query::<String>(cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(control))
        .expect("the control loads");
    let failed = server.query::<i64>(cmd("FCALL").arg("sluicegate_number_control").arg(0));
    assert!(
        matches!(&failed, Err(e) if e.to_string().contains("a number argument to EXISTS")),
        "{failed:?}"
    );

    let function = load("sluicegate_text_arguments_test", &checked);
    let rules = rules();
    let mut random = Random(0x7e57_a59e_0b57);
    let mut at: u64 = 1_700_000_000_000_000;
    let (mut refused, mut undone) = (0, 0);
    let mut answered = [0; Charge::ALL.len()];
    for call in 0..800 {
        at += random.below(300_000);
        let checks: Vec<TraceCheck> = (0..1 + random.below(3))
            .map(|_| {
                let first = random.below(rules.len() as u64) as usize;
                // The envoy counter takes checks only (alone with other envoy counters).
                let envoy = first == rules.len() - 1;
                let charge = if envoy {
                    Charge::Check
                } else {
                    Charge::ALL[random.below(Charge::ALL.len() as u64) as usize]
                };
                let mut check_rules = vec![first];
                if !envoy && random.below(4) == 0 {
                    check_rules.push((first + 1) % (rules.len() - 1));
                }
                let needs_id = matches!(charge, Charge::Reserve | Charge::Settle);
                TraceCheck {
                    rules: check_rules,
                    key: ["a", "b"][random.below(2) as usize],
                    cost: [0, 1, 1, 2, 3, 9][random.below(6) as usize],
                    charge,
                    dry: random.below(6) == 0,
                    request_id: (needs_id || (!envoy && random.below(3) == 0))
                        .then(|| format!("id{}", random.below(3))),
                }
            })
            .collect();
        let sent = script_checks("t", &rules, &checks, at);
        let Ok(replied) = split_answers(fcall(&function, &sent), &sent) else {
            panic!("call {call}: a malformed reply");
        };
        for (check, answer) in checks.iter().zip(replied) {
            let Some(rows) = rows_unless_failed(answer, call) else {
                continue;
            };
            let charge = Charge::ALL.iter().position(|&c| c == check.charge);
            answered[charge.expect("a mode")] += 1;
            let rows: Vec<Row> = rows
                .into_iter()
                .zip(&check.rules)
                .map(|(row, &i)| Row::new(row, rules[i].limit()))
                .collect();
            refused += usize::from(rows.iter().any(|row| !row.decision.allowed));
            if rows.iter().any(|row| row.recorded_at.is_some()) && random.below(3) == 0 {
                let undo = [script_check("t", &rules, check, at, Mode::Undo(&rows))];
                let Ok(mut undo_answer) = split_answers(fcall(&function, &undo), &undo) else {
                    panic!("call {call}: a malformed reply to an undo");
                };
                rows_unless_failed(undo_answer.remove(0), call);
                undone += 1;
            }
        }
    }
    assert!(refused > 100, "{refused} refusals");
    assert!(undone > 50, "{undone} undos");
    assert!(
        answered.iter().all(|&n| n > 50),
        "answers by mode: {answered:?}"
    );
}
