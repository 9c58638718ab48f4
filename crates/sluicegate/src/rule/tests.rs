//! The bounds of docs/SPEC.md per field, defaults, and what a rule's identity holds.

use super::*;
use crate::duration::parse_duration;
use std::time::Duration;

fn build(spec: RuleSpec) -> Result<Rule, RuleError> {
    Rule::new("r", &spec)
}

#[test]
fn sliding_counter_product_bound_names_window_and_limit() {
    let spec = RuleSpec::new(
        Algorithm::SlidingCounter,
        200_000_000,
        Duration::from_micros(parse_duration("1d").unwrap()),
    );
    let err = build(spec).unwrap_err();
    assert_eq!(err.field(), "window");
    assert!(
        err.to_string()
            .contains("window 1d with limit 200000000 exceeds 2^53 µs·units for sliding-counter"),
        "{err}"
    );
}

#[test]
fn bounds_are_checked_per_field() {
    let w = 1_000_000;
    let cases = [
        (
            RuleSpec::new(Algorithm::SlidingLog, 0, Duration::from_micros(w)),
            "limit",
        ),
        (
            RuleSpec::new(Algorithm::SlidingLog, 1 << 53, Duration::from_micros(w)),
            "limit",
        ),
        (
            RuleSpec::new(
                Algorithm::SlidingLog,
                1_000_000_000,
                Duration::from_micros(w),
            ),
            "limit",
        ),
        (
            RuleSpec {
                layout: Some(LogLayout::Compact),
                ..RuleSpec::new(Algorithm::SlidingLog, 100_000_000, Duration::from_micros(w))
            },
            "limit",
        ),
        (
            RuleSpec {
                layout: Some(LogLayout::Compact),
                ..RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_micros(w))
            },
            "layout",
        ),
        (
            RuleSpec::new(Algorithm::FixedWindow, 1, Duration::ZERO),
            "window",
        ),
        (
            RuleSpec::new(
                Algorithm::FixedWindow,
                1,
                Duration::from_micros(MAX_SPAN + 1),
            ),
            "window",
        ),
        (
            RuleSpec {
                buckets: Some(7),
                ..RuleSpec::new(Algorithm::SlidingCounter, 5, Duration::from_micros(w))
            },
            "buckets",
        ),
        (
            RuleSpec {
                buckets: Some(0),
                ..RuleSpec::new(Algorithm::SlidingCounter, 5, Duration::from_micros(w))
            },
            "buckets",
        ),
        (
            RuleSpec {
                buckets: Some(10),
                ..RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_micros(w))
            },
            "buckets",
        ),
        (
            RuleSpec::new(Algorithm::TokenBucket, 2_000_000, Duration::from_micros(w)),
            "limit",
        ),
        (
            RuleSpec {
                burst: Some(0),
                ..RuleSpec::new(Algorithm::TokenBucket, 5, Duration::from_micros(w))
            },
            "burst",
        ),
        (
            RuleSpec {
                burst: Some(1 << 40),
                ..RuleSpec::new(Algorithm::TokenBucket, 1, Duration::from_micros(1 << 20))
            },
            "burst",
        ),
        (
            RuleSpec {
                queue: Some(1 << 40),
                ..RuleSpec::new(Algorithm::LeakyBucket, 1, Duration::from_micros(1 << 20))
            },
            "queue",
        ),
        (
            RuleSpec {
                queue: Some(3),
                ..RuleSpec::new(Algorithm::TokenBucket, 1, Duration::from_micros(w))
            },
            "queue",
        ),
    ];
    for (spec, field) in cases {
        let err = build(spec.clone()).unwrap_err();
        assert_eq!(err.field(), field, "{spec:?}: {err}");
    }
}

#[test]
fn defaults_and_capacity() {
    let w = 1_000_000;
    let counter = build(RuleSpec::new(
        Algorithm::SlidingCounter,
        5,
        Duration::from_micros(w),
    ))
    .unwrap();
    assert_eq!(counter.buckets(), 10);
    let token = build(RuleSpec::new(
        Algorithm::TokenBucket,
        5,
        Duration::from_micros(w),
    ))
    .unwrap();
    assert_eq!(
        (token.capacity(), token.emission_interval_micros()),
        (5, 200_000)
    );
    let leaky = build(RuleSpec::new(
        Algorithm::LeakyBucket,
        5,
        Duration::from_micros(w),
    ))
    .unwrap();
    assert_eq!(leaky.capacity(), 1);
    assert_eq!(leaky.spec().queue, Some(0));
}

#[test]
fn identity_is_the_place_and_what_the_state_cannot_be_read_without() {
    let w = 1_000_000;
    let spec = RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_micros(w));
    let a = Rule::new("a|b", &spec).unwrap();
    let b = Rule::new("a", &spec).unwrap();
    assert!(!a.same_identity(&b));
    let same = |x: RuleSpec, y: RuleSpec| {
        let (x, y) = (Rule::new("r", &x).unwrap(), Rule::new("r", &y).unwrap());
        assert!(x.same_rule(&x.clone()));
        assert_eq!(x.same_rule(&y), x.spec() == y.spec());
        x.same_identity(&y)
    };
    let with =
        |algorithm, limit, window| RuleSpec::new(algorithm, limit, Duration::from_micros(window));
    for algorithm in Algorithm::ALL {
        // A new limit keeps the state of every algorithm and log layout.
        assert!(
            same(with(algorithm, 5, w), with(algorithm, 6, w)),
            "{algorithm}"
        );
        // A new window keeps only the GCRA state, which converts.
        let gcra = matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
        assert_eq!(
            same(with(algorithm, 5, w), with(algorithm, 5, 2 * w)),
            gcra,
            "{algorithm}"
        );
    }
    let compact = |limit| RuleSpec {
        layout: Some(LogLayout::Compact),
        ..with(Algorithm::SlidingLog, limit, w)
    };
    assert!(same(compact(5), compact(6)));
    assert!(!same(compact(5), with(Algorithm::SlidingLog, 5, w)));
    let counter = |buckets| RuleSpec {
        buckets: Some(buckets),
        ..with(Algorithm::SlidingCounter, 5, w)
    };
    assert!(!same(counter(10), counter(5)));
    let token = |burst| RuleSpec {
        burst: Some(burst),
        ..with(Algorithm::TokenBucket, 5, w)
    };
    assert!(same(token(5), token(9)));
    let leaky = |queue| RuleSpec {
        queue: Some(queue),
        ..with(Algorithm::LeakyBucket, 5, w)
    };
    assert!(same(leaky(0), leaky(3)));
    // Another algorithm never reads the state.
    assert!(!same(
        with(Algorithm::TokenBucket, 5, w),
        with(Algorithm::LeakyBucket, 5, w)
    ));
}

#[test]
fn scopes_separate_rules_of_one_name_and_keep_the_name() {
    let spec = RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(1));
    let plain = Rule::new("per_user", &spec).unwrap();
    let team_a = plain.in_scope("team_a");
    let team_b = plain.in_scope("team_b");
    assert_eq!(
        (team_a.name(), team_a.scope()),
        ("per_user", Some("team_a"))
    );
    assert_eq!(plain.scope(), None);
    assert!(!team_a.same_identity(&team_b));
    assert!(!team_a.same_identity(&plain));
    assert_ne!(team_a.fingerprint(), team_b.fingerprint());
    assert!(team_a.same_identity(&plain.in_scope("team_a")));
    // A policy changes no state: the scope stays.
    let policed = team_a.with_failure_policy(FailurePolicy::Allow);
    assert!(policed.same_identity(&team_a));
    // Neither a scope nor a name can be chosen to spell another rule's identity.
    let identities = [
        Rule::new("b", &spec).unwrap().in_scope("a"),
        Rule::new("1:b", &spec).unwrap().in_scope(""),
        Rule::new("a/1:b", &spec).unwrap(),
        Rule::new("1:a/1:b", &spec).unwrap(),
        Rule::new("b", &spec).unwrap().in_scope("a/1:"),
        Rule::new("", &spec).unwrap().in_scope("a/1:b"),
    ]
    .map(|rule| rule.identity().to_owned());
    for (i, a) in identities.iter().enumerate() {
        for b in &identities[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn algorithm_names_round_trip() {
    for a in Algorithm::ALL {
        assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
    }
    assert_eq!(
        "gcra".parse::<Algorithm>().unwrap_err().field(),
        "algorithm"
    );
}

#[test]
fn a_lease_is_bounded_per_field_and_by_algorithm() {
    let second = Duration::from_secs(1);
    let rule = |algorithm, limit| build(RuleSpec::new(algorithm, limit, second)).unwrap();
    let cases: [(Rule, u64, Option<Duration>, &str, &str); 6] = [
        (
            rule(Algorithm::FixedWindow, 10),
            0,
            None,
            "lease",
            "lease must be at least 1",
        ),
        (
            rule(Algorithm::FixedWindow, 10),
            11,
            None,
            "lease",
            "lease 11 exceeds the rule's capacity 10",
        ),
        (
            rule(Algorithm::SlidingCounter, 10),
            2,
            None,
            "lease",
            "not to sliding-counter",
        ),
        (
            rule(Algorithm::LeakyBucket, 10),
            1,
            None,
            "lease",
            "not to leaky-bucket",
        ),
        (
            rule(Algorithm::TokenBucket, 10),
            2,
            Some(Duration::from_secs(2)),
            "lease_for",
            "at most the window 1s",
        ),
        (
            rule(Algorithm::TokenBucket, 10),
            2,
            Some(Duration::from_nanos(10)),
            "lease_for",
            "at least 1µs",
        ),
    ];
    let cut = rule(Algorithm::TokenBucket, 10)
        .with_lease(8, Some(Duration::from_millis(300)))
        .unwrap_err();
    assert_eq!(cut.field(), "lease_for");
    assert!(cut.message().contains("takes 3 of the burst 10"), "{cut}");
    for (rule, units, spend_within, field, message) in cases {
        let err = rule.with_lease(units, spend_within).unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(err.message().contains(message), "{err}");
    }
    let leased = rule(Algorithm::FixedWindow, 10)
        .with_lease(2, None)
        .unwrap();
    assert_eq!(
        leased.with_lease(2, None).unwrap_err().message(),
        "the rule already has a lease"
    );
}

#[test]
fn a_lease_spends_within_a_tenth_of_the_window_or_a_hundredth_for_a_sliding_log() {
    let spec = |algorithm, window| RuleSpec::new(algorithm, 100, window);
    let lease = |spec: RuleSpec| build(spec).unwrap().with_lease(5, None).unwrap();
    let fixed = lease(spec(Algorithm::FixedWindow, Duration::from_secs(1)));
    assert_eq!(fixed.lease().unwrap().units(), 5);
    assert_eq!(
        fixed.lease().unwrap().spend_within(),
        Duration::from_millis(100)
    );
    assert_eq!(fixed.window(), Duration::from_secs(1));
    let hourly = lease(spec(Algorithm::TokenBucket, Duration::from_secs(3600)));
    assert_eq!(
        hourly.lease().unwrap().spend_within(),
        Duration::from_secs(1)
    );
    // A sliding log is kept over W + D, a state of its own.
    let plain = build(spec(Algorithm::SlidingLog, Duration::from_secs(1))).unwrap();
    let log = plain.with_lease(5, None).unwrap();
    assert_eq!(
        log.lease().unwrap().spend_within(),
        Duration::from_millis(10)
    );
    assert_eq!(log.window(), Duration::from_millis(1010));
    assert!(!log.same_identity(&plain));
    // Other numbers keep the state.
    assert!(
        fixed.same_identity(&build(spec(Algorithm::FixedWindow, Duration::from_secs(1))).unwrap())
    );
}
