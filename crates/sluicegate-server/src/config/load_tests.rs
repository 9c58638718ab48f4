//! What envoyproxy/ratelimit loads loads, what it refuses is refused (beyond the cases of
//! its own tests, in `envoy_tests.rs`), and how a level is matched.

use proptest::prelude::*;

use super::tests::entries;
use super::wildcard::tests::brute_force;
use super::*;

fn parse(text: &str, algorithm: Algorithm) -> Result<Config, ConfigError> {
    Config::parse(Path::new("limits.yaml"), text, LoadOptions::new(algorithm))
}

fn find<'c>(config: &'c Config, pairs: &[(&str, &str)]) -> Option<&'c ConfiguredLimit> {
    let entries = entries(pairs);
    config.find("d", &entries).unwrap()
}

fn path(config: &Config, pairs: &[(&str, &str)]) -> Option<String> {
    find(config, pairs).map(|l| l.path.clone())
}

/// Every field and form envoyproxy/ratelimit's loader (`src/config/config_impl.go`)
/// accepts: `share_threshold`, `value_to_metric`, `quota_mode`, `metadata`, units
/// `week`, `month` and `year` in any case (7, 30 and 365 days, as its `UnitToDivider`),
/// `value: ""` (no value), a `unit` without `requests_per_unit` (a block),
/// `unlimited` beside `requests_per_unit` or a unit it does not know (it refuses only a
/// known unit there), `descriptors:` with nothing in it.
#[test]
fn what_envoy_loads_loads() {
    let text = r#"domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    value_to_metric: true
    quota_mode: false
    metadata:
      owner: {team: storage, pager: [a, b]}
      weight: 2
    rate_limit: {unit: WEEK, requests_per_unit: 7}
  - key: monthly
    rate_limit: {unit: Month, requests_per_unit: 30}
  - key: yearly
    detailed_metric: true
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 365}
  - key: empty
    value: ""
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: hour}
  - key: free
    rate_limit: {unlimited: true, requests_per_unit: 5}
  - key: odd
    rate_limit: {unlimited: true, unit: fortnight}
  - key: parent
    descriptors:
"#;
    for algorithm in [Algorithm::FixedWindow, DEFAULT_ALGORITHM] {
        let c = parse(text, algorithm).unwrap();
        let window = |pairs: &[(&str, &str)]| {
            let rule = find(&c, pairs).unwrap().rule.as_ref().unwrap();
            (rule.limit(), rule.window().as_secs())
        };
        assert_eq!(window(&[("files", "files/a")]), (7, 7 * 86_400));
        assert_eq!(window(&[("monthly", "x")]), (30, 30 * 86_400));
        assert_eq!(window(&[("yearly", "x")]), (365, 365 * 86_400));
        // An empty value is no value: the key alone, whatever the request's value.
        assert_eq!(
            path(&c, &[("empty", "anything")]).as_deref(),
            Some("d.empty")
        );
        let block = find(&c, &[("blocked", "x")]).unwrap();
        assert!(block.blocked() && block.rule.is_none());
        assert_eq!(block.block_window, Some(3_600_000_000));
        let free = find(&c, &[("free", "x")]).unwrap();
        assert!(free.rule.is_none() && !free.blocked());
        assert!(find(&c, &[("odd", "x")]).unwrap().rule.is_none());
        assert_eq!(path(&c, &[("parent", "x")]), None);
        let yearly = find(&c, &[("yearly", "x")]).unwrap();
        assert!(yearly.detailed_metric && yearly.shadow_mode);
    }
    parse("domain: d\ndescriptors:\n", DEFAULT_ALGORITHM).unwrap();
    let zero = parse(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 0}\n",
        DEFAULT_ALGORITHM,
    )
    .unwrap();
    assert_eq!(
        find(&zero, &[("a", "x")]).unwrap().block_window,
        Some(60_000_000)
    );
    let most = format!(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: {}}}\n",
        u32::MAX
    );
    parse(&most, Algorithm::FixedWindow).unwrap();
}

/// What envoyproxy/ratelimit refuses, refused with the line and the field: an empty key,
/// more requests per unit than a u32 holds, `share_threshold` on a value without `*`, an
/// empty `replaces` name, a descriptor key that is not a known field.
#[test]
fn what_envoy_refuses_is_refused_naming_line_and_field() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: \"\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "line 4",
            "d.: key: must not be empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n",
            "line 5",
            "rate_limit.requests_per_unit: 4294967296 is more than 4294967295",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: plain\n    share_threshold: true\n",
            "line 3",
            "d.a_plain: share_threshold: only a wildcard value",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n",
            "line 4",
            "rate_limit.replaces[0].name: must not be empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    7: b\n",
            "line 4",
            "7",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 5}\n",
            "line 4",
            "rate_limit.unit: required",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {window: 1m}\n",
            "line 4",
            "rate_limit.requests_per_unit: required beside a window",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "line 4",
            "requests_per_unit",
        ),
    ];
    for (text, line, field) in cases {
        let err = parse(text, DEFAULT_ALGORITHM).unwrap_err().to_string();
        assert!(err.starts_with("limits.yaml: "), "{err}");
        assert!(err.contains(line), "{line} in {err}");
        assert!(err.contains(field), "{field} in {err}");
    }
}

/// envoyproxy/ratelimit joins a key and its value with `_` and matches wildcards on the
/// joined text, so `{key: a_b}` and `{key: a, value: b}` collide (it refuses the file)
/// and `a: b*` matches a request's `a_bc: x`. Arguably wrong: sluicegate keeps keys and
/// values apart.
#[test]
fn keys_and_values_are_kept_apart() {
    let c = parse(
        "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: w\n    value: b*\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
        DEFAULT_ALGORITHM,
    )
    .unwrap();
    let limit = |pairs: &[(&str, &str)]| find(&c, pairs).map(|l| l.rule.as_ref().unwrap().limit());
    assert_eq!(limit(&[("a_b", "x")]), Some(1));
    assert_eq!(limit(&[("a", "b")]), Some(2));
    assert_eq!(limit(&[("a", "c")]), None);
    assert_eq!(limit(&[("w", "bc")]), Some(3));
    assert_eq!(limit(&[("w_bc", "x")]), None);
}

/// A level is matched as envoyproxy/ratelimit's `GetLimit` matches it: the exact value
/// first (a wildcard's own text too), then the first wildcard declared that matches —
/// not the longest — then the key alone, wherever each is declared.
#[test]
fn overlapping_wildcards_resolve_as_envoy() {
    let rule = "    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let file = |values: &[Option<&str>]| {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for value in values {
            text.push_str("  - key: a\n");
            if let Some(value) = value {
                text.push_str(&format!("    value: \"{value}\"\n"));
            }
            text.push_str(rule);
        }
        parse(&text, DEFAULT_ALGORITHM).unwrap()
    };
    let c = file(&[
        None,
        Some("/api/*"),
        Some("/api/*/action"),
        Some("/api/v1/action"),
    ]);
    assert_eq!(
        path(&c, &[("a", "/api/v2/action")]).as_deref(),
        Some("d.a_/api/*")
    );
    assert_eq!(
        path(&c, &[("a", "/api/v1/action")]).as_deref(),
        Some("d.a_/api/v1/action")
    );
    assert_eq!(path(&c, &[("a", "/web")]).as_deref(), Some("d.a"));
    let c = file(&[Some("/api/*/action"), Some("/api/*")]);
    assert_eq!(
        path(&c, &[("a", "/api/v2/action")]).as_deref(),
        Some("d.a_/api/*/action")
    );
    assert_eq!(
        path(&c, &[("a", "/api/v2/list")]).as_deref(),
        Some("d.a_/api/*")
    );
    // A request whose value is a wildcard's text finds that wildcard, as envoy's lookup of
    // `key_value` does, though an earlier one matches too.
    let c = file(&[Some("*"), Some("x*")]);
    assert_eq!(path(&c, &[("a", "xy")]).as_deref(), Some("d.a_*"));
    assert_eq!(path(&c, &[("a", "x*")]).as_deref(), Some("d.a_x*"));
    assert_eq!(path(&c, &[("a", "")]).as_deref(), Some("d.a_*"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// One level of random descriptors of one key (without a value, with an exact value,
    /// with wildcards that overlap), against a model of envoyproxy/ratelimit's lookup:
    /// the value exactly, else the first pattern declared that matches, else the key.
    #[test]
    fn a_level_resolves_as_envoys_lookup(
        values in proptest::collection::vec(proptest::option::of("[ab*]{0,4}"), 1..6),
        request in "[ab*]{0,5}",
    ) {
        // A key and value declared twice is refused; the model keeps the first.
        let mut declared: Vec<Option<String>> = Vec::new();
        for value in values {
            let value = value.filter(|v| !v.is_empty());
            if !declared.contains(&value) {
                declared.push(value);
            }
        }
        let mut text = String::from("domain: d\ndescriptors:\n");
        for value in &declared {
            text.push_str("  - key: k\n");
            if let Some(value) = value {
                text.push_str(&format!("    value: \"{value}\"\n"));
            }
            text.push_str("    rate_limit: {unit: second, requests_per_unit: 1}\n");
        }
        let config = parse(&text, DEFAULT_ALGORITHM).unwrap();
        let exact = declared.iter().flatten().find(|v| **v == request);
        let wildcard = || {
            declared
                .iter()
                .flatten()
                .find(|v| v.contains('*') && brute_force(v.as_bytes(), request.as_bytes()))
        };
        let model = match exact.or_else(wildcard) {
            Some(value) => Some(format!("d.k_{value}")),
            None => declared.contains(&None).then(|| "d.k".to_owned()),
        };
        prop_assert_eq!(path(&config, &[("k", &request)]), model, "{}", text);
    }
}
