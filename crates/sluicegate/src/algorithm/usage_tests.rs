use super::super::{Charge, RuleState};
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, EXACT_LIMIT, Rule, RuleSpec};
use std::time::Duration;

const S: u64 = 1_000_000;

fn rule(spec: RuleSpec) -> Rule {
    Rule::new("r", &spec).unwrap()
}

fn check(state: &mut RuleState, rule: &Rule, t: u64, cost: u64, id: Option<&str>) -> Decision {
    check_as(state, rule, t, cost, id, Charge::Check)
}

fn check_as(
    state: &mut RuleState,
    rule: &Rule,
    t: u64,
    cost: u64,
    id: Option<&str>,
    charge: Charge,
) -> Decision {
    let eval = state.evaluate(rule, t, cost, id, Charge::Check);
    state.finish(rule, &eval, id, charge)
}

fn report(state: &mut RuleState, rule: &Rule, t: u64, cost: u64) -> Decision {
    state.record_usage(rule, t, cost, None, Charge::Report)
}

fn refund(state: &mut RuleState, rule: &Rule, t: u64, cost: u64) -> Decision {
    state.record_usage(rule, t, cost, None, Charge::Refund)
}

fn every_algorithm() -> Vec<Rule> {
    [
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ]
    .into_iter()
    .map(|algorithm| {
        let spec = RuleSpec::new(algorithm, 10, Duration::from_micros(S));
        rule(match algorithm {
            Algorithm::LeakyBucket => RuleSpec {
                queue: Some(9),
                ..spec
            },
            _ => spec,
        })
    })
    .collect()
}

#[test]
fn a_report_goes_into_debt_and_the_standing_refuses_until_it_is_gone() {
    for rule in every_algorithm() {
        let mut state = RuleState::new(&rule);
        let standing = report(&mut state, &rule, 10 * S, 25);
        assert!(!standing.allowed, "{:?}", rule.algorithm());
        assert_eq!(standing.remaining, 0);
        let Some(retry) = standing.retry_after.as_micros() else {
            panic!("the standing's retry_after is never `never`");
        };
        assert!(retry > 0);
        assert_eq!(standing.delay, 0);
        assert!(!check(&mut state, &rule, 10 * S + retry - 1, 1, None).allowed);
        assert!(
            check(&mut state, &rule, 10 * S + retry, 1, None).allowed,
            "{:?}: one unit fits after the standing's retry_after",
            rule.algorithm()
        );
    }
}

#[test]
fn the_standing_of_a_report_within_the_limit_allows_one_more() {
    for rule in every_algorithm() {
        let mut state = RuleState::new(&rule);
        let standing = report(&mut state, &rule, 10 * S, 4);
        let peek = state.evaluate(&rule, 10 * S, 0, None, Charge::Check);
        assert!(standing.allowed);
        assert_eq!(standing.retry_after, RetryAfter::micros(0));
        assert_eq!(standing.remaining, state.refuse(&rule, &peek).remaining);
        assert_eq!(standing.remaining, 6, "{:?}", rule.algorithm());
    }
}

#[test]
fn a_sliding_log_keeps_only_its_newest_limit_of_live_units() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        3,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    check(&mut state, &rule, 10 * S, 2, None);
    let standing = report(&mut state, &rule, 10 * S + 200_000, 4);
    // Six live, the newest three kept, all at 10.2 s: one fits again at 11.2 s.
    assert_eq!(standing.retry_after, RetryAfter::micros(S));
    assert_eq!(state.expires_at(&rule), 11 * S + 200_000);
    // A refund gives back from the newest three only.
    let standing = refund(&mut state, &rule, 10 * S + 300_000, 10);
    assert!(standing.allowed);
    assert_eq!(standing.remaining, 3);
    assert_eq!(standing.reset_after, 0);
}

#[test]
fn a_refund_gives_back_the_newest_units_and_never_expired_ones() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        3,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    check(&mut state, &rule, 10 * S, 1, None);
    check(&mut state, &rule, 10 * S + 500_000, 2, None);
    let standing = refund(&mut state, &rule, 10 * S + 600_000, 2);
    // The entry at 10.0 s is left: `latest` moves back to it, so a check stamped 10.1 s is
    // decided at 10.1 s.
    assert_eq!(standing.remaining, 2);
    assert_eq!(standing.reset_after, 400_000);
    assert_eq!(
        check(&mut state, &rule, 10 * S + 100_000, 2, None).reset_after,
        S
    );
    // At 11.2 s the entry at 10.0 s has expired: a refund there finds nothing live and
    // changes nothing (the expired entry is not even dropped: the state is as good as empty).
    let standing = refund(&mut state, &rule, 11 * S + 200_000, 5);
    assert_eq!(standing.remaining, 3);
    assert_eq!(state.expires_at(&rule), 11 * S + 100_000);
}

#[test]
fn a_refund_never_goes_below_empty() {
    // (A leaky bucket gives nothing back: give_back_tests.)
    for rule in every_algorithm()
        .into_iter()
        .filter(|r| r.algorithm() != Algorithm::LeakyBucket)
    {
        let mut state = RuleState::new(&rule);
        check(&mut state, &rule, 10 * S, 3, None);
        let standing = refund(&mut state, &rule, 10 * S, 100);
        assert_eq!(standing.remaining, 10, "{:?}", rule.algorithm());
        assert_eq!(standing.reset_after, 0, "{:?}", rule.algorithm());
        let full = check(&mut state, &rule, 10 * S, 10, None);
        assert!(
            full.allowed,
            "{:?}: the whole capacity fits",
            rule.algorithm()
        );
    }
}

#[test]
fn a_sliding_counter_refunds_newest_buckets_first_and_not_weightless_ones() {
    let rule = rule(RuleSpec {
        buckets: Some(2),
        ..RuleSpec::new(Algorithm::SlidingCounter, 10, Duration::from_micros(2 * S))
    });
    let mut state = RuleState::new(&rule);
    check(&mut state, &rule, 10 * S, 4, None); // bucket 10
    check(&mut state, &rule, 11 * S, 3, None); // bucket 11
    // At 12.5 s bucket 10 slides (half weight), 11 and 12 weigh fully: E = 2 + 3 = 5.
    let standing = refund(&mut state, &rule, 12 * S + 500_000, 4);
    // Bucket 11's three go first, then one of bucket 10's: E = 3 · 1/2 = 1.5.
    assert_eq!(standing.remaining, 8);
    // At 13 s bucket 10 weighs nothing: nothing is left to give back, and nothing changes.
    let standing = refund(&mut state, &rule, 13 * S, 1);
    assert_eq!(standing.remaining, 10);
    assert_eq!(state.expires_at(&rule), 13 * S);
}

#[test]
fn a_sliding_counter_report_is_capped_so_the_scaled_estimate_stays_exact() {
    let rule = rule(RuleSpec {
        buckets: Some(1),
        ..RuleSpec::new(Algorithm::SlidingCounter, 10, Duration::from_micros(S))
    });
    let cap = (EXACT_LIMIT - 1) / S;
    let mut state = RuleState::new(&rule);
    report(&mut state, &rule, 10 * S, cap - 5);
    report(&mut state, &rule, 10 * S, EXACT_LIMIT - 1);
    let refunded = refund(&mut state, &rule, 10 * S, cap - 1);
    assert_eq!(refunded.remaining, 9, "exactly the cap was held");
}

#[test]
fn a_fixed_window_report_is_held_below_2_to_53_and_a_refund_only_touches_its_window() {
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    report(&mut state, &rule, 10 * S, EXACT_LIMIT - 1);
    report(&mut state, &rule, 10 * S, EXACT_LIMIT - 1);
    let standing = refund(&mut state, &rule, 10 * S, EXACT_LIMIT - 2);
    assert!(standing.allowed, "one unit of the 2^53 − 1 is left");
    assert_eq!(standing.remaining, 9);
    check(&mut state, &rule, 11 * S, 4, None);
    let standing = refund(&mut state, &rule, 11 * S, 1);
    assert_eq!(standing.remaining, 7);
}

#[test]
fn a_gcra_backlog_is_held_at_2_to_51_and_refunds_never_go_before_now() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    let standing = report(&mut state, &rule, 10 * S, EXACT_LIMIT - 1);
    assert_eq!(standing.reset_after, 1 << 51);
    assert_eq!(
        refund(&mut state, &rule, 10 * S, 3).reset_after,
        (1 << 51) - 3 * S / 10
    );
    assert_eq!(
        refund(&mut state, &rule, 10 * S, EXACT_LIMIT - 1).reset_after,
        0
    );
}

#[test]
fn a_gcra_debt_is_read_in_full_under_the_same_interval() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    report(&mut state, &rule, 10 * S, 15);
    let refused = check(&mut state, &rule, 10 * S + 599_999, 1, None);
    assert_eq!(refused.retry_after, RetryAfter::micros(1));
    assert_eq!(refused.reset_after, 900_001);
    assert!(check(&mut state, &rule, 10 * S + 600_000, 1, None).allowed);
}

#[test]
fn a_settle_reports_the_excess_refunds_the_unused_part_or_reports_it_all() {
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        100,
        Duration::from_micros(60 * S),
    ));
    let mut state = RuleState::new(&rule);
    let settle = |state: &mut RuleState, t, cost, id| {
        state.record_usage(&rule, t, cost, Some(id), Charge::Settle)
    };
    check_as(&mut state, &rule, 60 * S, 30, Some("r1"), Charge::Reserve);
    assert_eq!(settle(&mut state, 61 * S, 45, "r1").remaining, 55);
    assert_eq!(
        settle(&mut state, 61 * S, 45, "r1").remaining,
        55,
        "a repeat"
    );
    check_as(&mut state, &rule, 61 * S, 40, Some("r2"), Charge::Reserve);
    assert_eq!(settle(&mut state, 62 * S, 10, "r2").remaining, 45);
    assert_eq!(
        settle(&mut state, 63 * S, 5, "r3").remaining,
        40,
        "no reservation"
    );
    // A check with an id is no reservation.
    check(&mut state, &rule, 63 * S, 5, Some("r4"));
    assert_eq!(settle(&mut state, 63 * S, 5, "r4").remaining, 30);
}

#[test]
fn a_settle_uses_its_reservation_up() {
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        100,
        Duration::from_micros(60 * S),
    ));
    let mut state = RuleState::new(&rule);
    check_as(&mut state, &rule, 60 * S, 30, Some("r"), Charge::Reserve);
    // A settle of 0 refunds the whole reservation and remembers no id: its retry must not
    // refund it again.
    for _ in 0..2 {
        let standing = state.record_usage(&rule, 61 * S, 0, Some("r"), Charge::Settle);
        assert_eq!(standing.remaining, 100);
    }
    check(&mut state, &rule, 61 * S, 20, None);
    let standing = state.record_usage(&rule, 61 * S, 0, Some("r"), Charge::Settle);
    assert_eq!(standing.remaining, 80);
}

#[test]
fn a_reservation_outlives_its_units_window() {
    // Fixed window of 1 min reserved 1 s before its end: `reset_after` 1 s, remembered W.
    let rule = rule(RuleSpec::new(
        Algorithm::FixedWindow,
        100,
        Duration::from_micros(60 * S),
    ));
    let mut state = RuleState::new(&rule);
    check_as(&mut state, &rule, 119 * S, 30, Some("r"), Charge::Reserve);
    let repeat = check_as(&mut state, &rule, 150 * S, 30, Some("r"), Charge::Reserve);
    assert_eq!(
        repeat.remaining, 100,
        "a repeat takes nothing from the new window"
    );
    let standing = state.record_usage(&rule, 178 * S, 50, Some("r"), Charge::Settle);
    assert_eq!(standing.remaining, 80, "reports the excess 20 only");
    assert_eq!(
        state.expires_at(&rule),
        178 * S + 60 * S,
        "the settle's id: W"
    );
    let fresh = state.record_usage(&rule, 240 * S, 50, Some("s"), Charge::Settle);
    assert_eq!(fresh.remaining, 50);
}

#[test]
fn each_mode_keeps_its_own_request_ids() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        10,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    assert!(check(&mut state, &rule, 10 * S, 1, Some("x")).allowed);
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 2, Some("x"), Charge::Report)
            .remaining,
        7
    );
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 2, Some("x"), Charge::Report)
            .remaining,
        7
    );
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 1, Some("x"), Charge::Refund)
            .remaining,
        8
    );
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 1, Some("x"), Charge::Refund)
            .remaining,
        8
    );
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 3, Some("x"), Charge::Settle)
            .remaining,
        5
    );
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 3, Some("x"), Charge::Settle)
            .remaining,
        5
    );
    // Without an id each is counted again; with 0 units none is remembered.
    assert_eq!(report(&mut state, &rule, 10 * S, 1).remaining, 4);
    assert_eq!(report(&mut state, &rule, 10 * S, 1).remaining, 3);
    state.record_usage(&rule, 10 * S, 0, Some("y"), Charge::Refund);
    assert_eq!(
        state
            .record_usage(&rule, 10 * S, 1, Some("y"), Charge::Refund)
            .remaining,
        4
    );
    // Remembered until t + max(W, reset_after of the standing).
    assert_eq!(
        state
            .record_usage(&rule, 11 * S - 1, 2, Some("x"), Charge::Report)
            .remaining,
        4
    );
    assert_eq!(
        state
            .record_usage(&rule, 11 * S, 2, Some("x"), Charge::Report)
            .remaining,
        8
    );
}

#[test]
fn a_gcra_refund_of_a_key_that_holds_nothing_writes_nothing() {
    let rule = rule(RuleSpec::new(
        Algorithm::TokenBucket,
        1,
        Duration::from_micros(S),
    ));
    let mut state = RuleState::new(&rule);
    check(&mut state, &rule, 10 * S, 1, None);
    // At 20 s the key is empty; writing TAT = 20 s would leave a backlog for a check
    // stamped at 15 s (after `latest`, 10 s).
    refund(&mut state, &rule, 20 * S, 1);
    assert!(check(&mut state, &rule, 15 * S, 1, None).allowed);
}

#[test]
fn a_refund_moving_the_log_back_finds_the_ids_it_still_remembers() {
    let rule = rule(RuleSpec::new(
        Algorithm::SlidingLog,
        5,
        Duration::from_micros(10 * S),
    ));
    let mut state = RuleState::new(&rule);
    let reported =
        |state: &mut RuleState, t| state.record_usage(&rule, t, 1, Some("p"), Charge::Report);
    reported(&mut state, 10 * S);
    check(&mut state, &rule, 15 * S, 1, None);
    // The refund takes back the entry at 15 s: `latest` is 10 s again, and a retry stamped
    // at 12 s is still a repeat of the report.
    refund(&mut state, &rule, 16 * S, 1);
    assert_eq!(reported(&mut state, 12 * S).remaining, 4);
}
