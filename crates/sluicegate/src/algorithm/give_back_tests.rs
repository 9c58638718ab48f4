//! Settles give back their reservation's own units from where it put them; refunds that find
//! nothing live change nothing; usage ids live W (docs/SPEC.md, "Refund", "Settle", request
//! ids).

use super::super::{Charge, RuleState};
use crate::decision::Decision;
use crate::rule::{Algorithm, Rule, RuleSpec};
use std::time::Duration;

const S: u64 = 1_000_000;
const MS: u64 = 1_000;

fn rule(spec: RuleSpec) -> Rule {
    Rule::new("r", &spec).unwrap()
}

fn run(
    state: &mut RuleState,
    rule: &Rule,
    t: u64,
    cost: u64,
    id: Option<&str>,
    charge: Charge,
) -> Decision {
    if charge.may_refuse() {
        let eval = state.evaluate(rule, t, cost, id, Charge::Check);
        state.finish(rule, &eval, id, charge)
    } else {
        state.record_usage(rule, t, cost, id, charge)
    }
}

#[test]
fn a_settle_in_a_later_fixed_window_gives_nothing_back() {
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        100,
        Duration::from_micros(60 * S),
    ));
    let mut state = RuleState::new(&rule);
    assert!(run(&mut state, &rule, 59 * S, 30, Some("R"), Charge::Reserve).allowed);
    assert!(run(&mut state, &rule, 61 * S, 100, None, Charge::Check).allowed);
    run(&mut state, &rule, 62 * S, 0, Some("R"), Charge::Settle);
    let late = run(&mut state, &rule, 63 * S, 30, None, Charge::Check);
    assert!(!late.allowed, "130 admitted in one window of 100: {late:?}");
}

#[test]
fn a_settle_after_its_token_bucket_reservation_drained_gives_nothing_back() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    assert!(run(&mut state, &rule, 10 * S, 5, Some("R"), Charge::Reserve).allowed);
    assert!(
        run(
            &mut state,
            &rule,
            10 * S + 800 * MS,
            10,
            None,
            Charge::Check
        )
        .allowed
    );
    run(
        &mut state,
        &rule,
        10 * S + 800 * MS,
        0,
        Some("R"),
        Charge::Settle,
    );
    let late = run(&mut state, &rule, 10 * S + 800 * MS, 5, None, Charge::Check);
    assert!(
        !late.allowed,
        "15 admitted at one instant with B = 10: {late:?}"
    );
}

#[test]
fn a_token_bucket_settle_gives_back_only_what_is_still_pending() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    // TAT 10.5 s; at 10.3 s 2 of the 5 units are still pending: those come back, not 5.
    run(&mut state, &rule, 10 * S, 5, Some("R"), Charge::Reserve);
    let standing = run(
        &mut state,
        &rule,
        10 * S + 300 * MS,
        0,
        Some("R"),
        Charge::Settle,
    );
    assert_eq!(standing.remaining, 10);
    assert_eq!(standing.reset_after, 0);
    assert!(
        run(
            &mut state,
            &rule,
            10 * S + 300 * MS,
            10,
            None,
            Charge::Check
        )
        .allowed
    );
    assert!(!run(&mut state, &rule, 10 * S + 300 * MS, 1, None, Charge::Check).allowed);
}

#[test]
fn a_leaky_bucket_settle_hands_out_no_slot_twice() {
    let rule = rule(RuleSpec {
        queue: Some(3),
        ..RuleSpec::new(Algorithm::LeakyBucket, 10, Duration::from_micros(S))
    });
    let mut state = RuleState::new(&rule);
    assert!(run(&mut state, &rule, 10 * S, 3, Some("R"), Charge::Reserve).allowed);
    let s = run(&mut state, &rule, 10 * S, 1, Some("S"), Charge::Check);
    assert_eq!(s.delay, 300 * MS);
    run(
        &mut state,
        &rule,
        10 * S + 50 * MS,
        0,
        Some("R"),
        Charge::Settle,
    );
    let mut passes = vec![10 * S + s.delay];
    for _ in 0..3 {
        let t = 10 * S + 70 * MS;
        let d = run(&mut state, &rule, t, 1, None, Charge::Check);
        if d.allowed {
            passes.push(t + d.delay);
        }
    }
    passes.sort_unstable();
    for pair in passes.windows(2) {
        assert!(
            pair[1] - pair[0] >= rule.emission_interval_micros(),
            "two pass in one T: {passes:?}"
        );
    }
    // A refund gives nothing back either.
    let standing = run(&mut state, &rule, 10 * S + 70 * MS, 3, None, Charge::Refund);
    assert_eq!(standing.remaining, 0);
}

#[test]
fn a_sliding_log_settle_gives_back_the_reservations_entries_not_the_newest() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    run(&mut state, &rule, 10 * S, 5, Some("R"), Charge::Reserve);
    run(&mut state, &rule, 10 * S + 500 * MS, 3, None, Charge::Check);
    let settled = run(
        &mut state,
        &rule,
        10 * S + 600 * MS,
        0,
        Some("R"),
        Charge::Settle,
    );
    assert_eq!(settled.remaining, 7);
    // The 3 units of 10.5 s still count at 11.2 s: the settle took the 5 of 10.0 s.
    let later = run(&mut state, &rule, 11 * S + 200 * MS, 0, None, Charge::Check);
    // (a peek answers as a check of one unit)
    assert_eq!(later.remaining, 6, "{later:?}");
}

#[test]
fn a_sliding_counter_settle_gives_back_from_the_reservations_bucket() {
    let rule = rule(RuleSpec {
        buckets: Some(10),
        ..RuleSpec::new(Algorithm::SlidingCounter, 10, Duration::from_micros(S))
    });
    let mut state = RuleState::new(&rule);
    run(&mut state, &rule, 10 * S, 5, Some("R"), Charge::Reserve);
    run(&mut state, &rule, 10 * S + 500 * MS, 3, None, Charge::Check);
    run(
        &mut state,
        &rule,
        10 * S + 600 * MS,
        1,
        Some("R"),
        Charge::Settle,
    );
    // Bucket 10.0 s slides out by 11.1 s; the 3 units of bucket 10.5 s still weigh fully.
    let later = run(&mut state, &rule, 11 * S + 100 * MS, 0, None, Charge::Check);
    assert_eq!(later.remaining, 6, "{later:?}");
}

#[test]
fn a_refund_that_finds_nothing_live_changes_nothing() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        3,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    run(&mut state, &rule, 10 * S, 1, None, Charge::Check);
    run(&mut state, &rule, 12 * S, 1, None, Charge::Refund);
    let d = run(&mut state, &rule, 10 * S + 500 * MS, 2, None, Charge::Check);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0, "as if the refund never happened: {d:?}");
}

#[test]
fn a_refund_that_gave_nothing_back_remembers_no_id() {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let rule = rule(RuleSpec::new(algorithm, 10, Duration::from_micros(S)));
        let mut state = RuleState::new(&rule);
        run(&mut state, &rule, 10 * S, 1, Some("F"), Charge::Refund);
        run(&mut state, &rule, 10 * S, 4, None, Charge::Report);
        let retried = run(&mut state, &rule, 10 * S, 4, Some("F"), Charge::Refund);
        assert_eq!(retried.remaining, 10, "{algorithm:?}: the retry gives back");
    }
}

#[test]
fn a_reports_id_lives_one_window_not_its_debts_reset_after() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    let first = run(&mut state, &rule, 10 * S, 25, Some("P"), Charge::Report);
    assert!(first.reset_after > 2 * S);
    let again = run(
        &mut state,
        &rule,
        11 * S + 100 * MS,
        5,
        Some("P"),
        Charge::Report,
    );
    assert!(
        again.reset_after > first.reset_after - S - 100 * MS,
        "recorded afresh: {again:?}"
    );
}

#[test]
fn many_ids_in_one_state_are_found_without_a_walk() {
    // A budget with an id per call: 200 000 ids in one window. Walking them per call is
    // ~2·10^10 comparisons; indexed it is a fraction of a second even unoptimised.
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        u64::from(u32::MAX),
        Duration::from_micros(86_400 * S),
    ));
    let mut state = RuleState::new(&rule);
    let started = std::time::Instant::now();
    for i in 0..200_000u64 {
        let id = i.to_string();
        run(&mut state, &rule, 10 * S + i, 1, Some(&id), Charge::Report);
    }
    let repeat = run(&mut state, &rule, 20 * S, 1, Some("7"), Charge::Report);
    assert_eq!(
        repeat.remaining,
        rule.limit() - 200_000,
        "a repeat records nothing"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_settle_that_records_nothing_is_remembered_so_its_retry_reports_nothing() {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let rule = rule(RuleSpec::new(algorithm, 10, Duration::from_micros(S)));
        let mut state = RuleState::new(&rule);
        run(&mut state, &rule, 10 * S, 3, Some("R"), Charge::Reserve);
        let settled = run(&mut state, &rule, 10 * S, 3, Some("R"), Charge::Settle);
        let retried = run(&mut state, &rule, 10 * S, 3, Some("R"), Charge::Settle);
        assert_eq!(retried.remaining, settled.remaining, "{algorithm:?}");
    }
}
