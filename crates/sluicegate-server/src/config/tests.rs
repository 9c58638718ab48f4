//! The configuration as files: matching, errors naming file, line and field, directories.

use super::*;
use sluicegate::internals::saturating_micros;
use std::time::Duration;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(
        Path::new("limits.yaml"),
        text,
        LoadOptions::new(DEFAULT_ALGORITHM),
    )
}

/// A request descriptor's entries (the other test modules use it too).
pub(super) fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(k, v)| Entry {
            key: (*k).into(),
            value: (*v).into(),
        })
        .collect()
}

fn found<'a>(config: &'a Config, pairs: &[(&str, &str)]) -> Option<&'a str> {
    config
        .find("d", &entries(pairs))
        .unwrap()
        .map(|l| l.path.as_str())
}

#[test]
fn most_specific_match_and_nesting() {
    let config = parse(
        "domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: to_cluster
    value: api
    descriptors:
      - key: user
        rate_limit: {window: 90s, requests_per_unit: 5, algorithm: token-bucket, burst: 2}
",
    )
    .unwrap();
    assert_eq!(
        found(&config, &[("remote_address", "10.0.0.1")]),
        Some("d.remote_address_10.0.0.1")
    );
    assert_eq!(
        found(&config, &[("remote_address", "10.0.0.2")]),
        Some("d.remote_address")
    );
    assert_eq!(
        found(&config, &[("to_cluster", "api"), ("user", "bob")]),
        Some("d.to_cluster_api.user")
    );
    // A node without a rate_limit limits nothing; an unknown value matches nothing.
    assert_eq!(found(&config, &[("to_cluster", "api")]), None);
    assert_eq!(
        found(&config, &[("to_cluster", "web"), ("user", "bob")]),
        None
    );
    assert!(config.find("other", &[]).is_err());
    let rule = config
        .find("d", &entries(&[("to_cluster", "api"), ("user", "x")]))
        .unwrap()
        .unwrap()
        .rule
        .clone()
        .unwrap();
    assert_eq!(
        (
            rule.algorithm(),
            saturating_micros(rule.window()),
            rule.capacity()
        ),
        (Algorithm::TokenBucket, 90_000_000, 2)
    );
}

#[test]
fn errors_name_file_line_and_field() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
            "line 5",
            "rate_limit.unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      window: 1d\n      requests_per_unit: 200000000\n      algorithm: sliding-counter\n",
            "line 5",
            "rate_limit.window: window 1d with limit 200000000 exceeds 2^53",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n",
            "line 4",
            "rate_limt",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n",
            "line 4",
            "rate_limit.algorithm",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, window: 1s, requests_per_unit: 1}\n",
            "line 4",
            "rate_limit.window",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, usage: true}\n",
            "line 4",
            "rate_limit.usage: an unlimited rate_limit takes no usage",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, usage: true}\n",
            "line 4",
            "rate_limit.usage: a block",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 9, usage: yes please}\n",
            "line 4",
            "usage",
        ),
    ];
    for (text, line, field) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.starts_with("limits.yaml: "), "{err}");
        assert!(!err.contains("error: "), "said once, by the caller: {err}");
        assert!(err.contains(line), "{line} in {err}");
        assert!(err.contains(field), "{field} in {err}");
    }
    let dup = parse("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").unwrap_err();
    assert!(
        dup.to_string().contains("d.a: duplicate descriptor"),
        "{dup}"
    );
}

/// `lease: k` (and `lease_for`) leases a rule; a value no rule can take, or a rule a
/// lease cannot apply to, is an error naming the file, the line and the field.
#[test]
fn a_lease_is_read_and_its_errors_name_file_line_and_field() {
    let doc = |rate_limit: &str| {
        format!("domain: d\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {rate_limit}\n")
    };
    let config = parse(&doc(
        "{window: 1s, requests_per_unit: 100, algorithm: fixed-window, lease: 5, lease_for: 20ms}",
    ))
    .unwrap();
    let limit = config.find("d", &entries(&[("a", "b")])).unwrap().unwrap();
    let lease = limit.rule.as_ref().unwrap().lease().unwrap();
    assert_eq!(lease.units(), 5);
    assert_eq!(lease.spend_within(), Duration::from_millis(20));
    // Under the server's default algorithm, checked where the rule is built.
    let default = parse(&doc("{unit: second, requests_per_unit: 100, lease: 10}")).unwrap();
    let limit = default.find("d", &entries(&[("a", "b")])).unwrap().unwrap();
    assert_eq!(limit.rule.as_ref().unwrap().lease().unwrap().units(), 10);
    let cases = [
        (
            "{unit: second, requests_per_unit: 10, algorithm: sliding-log, lease: 0}",
            "rate_limit.lease: lease must be at least 1",
        ),
        (
            "{unit: second, requests_per_unit: 10, algorithm: fixed-window, lease: 11}",
            "rate_limit.lease: lease 11 exceeds the rule's capacity 10",
        ),
        (
            "{unit: second, requests_per_unit: 10, algorithm: sliding-counter, lease: 2}",
            "rate_limit.lease: a lease applies to sliding-log, fixed-window and token-bucket, not to sliding-counter",
        ),
        (
            "{unit: second, requests_per_unit: 10, algorithm: leaky-bucket, lease: 2}",
            "not to leaky-bucket",
        ),
        (
            "{unit: second, requests_per_unit: 10, algorithm: fixed-window, lease: 2, lease_for: 2s}",
            "rate_limit.lease_for: lease_for 2s must be at least 1µs and at most the window 1s",
        ),
        (
            "{unit: second, requests_per_unit: 10, lease_for: 10ms}",
            "rate_limit.lease_for: applies only beside a lease",
        ),
        (
            "{unit: second, requests_per_unit: 10, lease: 2, lease_for: soon}",
            "rate_limit.lease_for",
        ),
        ("{unit: second, requests_per_unit: 10, lease: -1}", "lease"),
        (
            "{unlimited: true, lease: 2}",
            "rate_limit.lease: an unlimited rate_limit takes no lease",
        ),
        (
            "{unit: day, lease: 2}",
            "rate_limit.lease: a block (no requests_per_unit) takes no lease",
        ),
    ];
    for (rate_limit, field) in cases {
        let err = parse(&doc(rate_limit)).unwrap_err().to_string();
        assert!(err.starts_with("limits.yaml: "), "{err}");
        assert!(err.contains("line 5"), "line 5 in {err}");
        assert!(err.contains(field), "{field} in {err}");
    }
    // A rule of the server's default algorithm is built, and its lease checked, with the
    // descriptor: its error names the descriptor's line and path.
    let err = parse(&doc("{unit: second, requests_per_unit: 10, lease: 11}"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("limits.yaml: line 3: d.a_b: rate_limit.lease: lease 11 exceeds"),
        "{err}"
    );
}

/// `usage: true` marks a limited rule as a usage rule; without it, none is.
#[test]
fn usage_marks_a_rule() {
    let config = parse(
        "domain: d\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: day, requests_per_unit: 9, usage: true}\n  - key: requests\n    rate_limit: {unit: day, requests_per_unit: 9}\n",
    )
    .unwrap();
    let usage = |key: &str| {
        config
            .find("d", &entries(&[(key, "x")]))
            .unwrap()
            .unwrap()
            .usage
    };
    assert!(usage("tokens"));
    assert!(!usage("requests"));
}

/// envoyproxy/ratelimit's documented examples (its README, examples 1 to 9) load
/// unchanged and match as documented.
#[test]
fn envoyproxy_ratelimit_examples_match_as_documented() {
    let load = |text: &str| {
        Config::parse(
            Path::new("example.yaml"),
            text,
            LoadOptions::new(Algorithm::FixedWindow),
        )
        .unwrap()
    };
    let path = |config: &Config, domain: &str, pairs: &[(&str, &str)]| {
        config
            .find(domain, &entries(pairs))
            .unwrap()
            .map(|l| l.path.clone())
    };
    // 1: two values of one key.
    let c = load(
        "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n\n  - key: database\n    value: default\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n",
    );
    assert_eq!(
        path(&c, "mongo_cps", &[("database", "users")]).as_deref(),
        Some("mongo_cps.database_users")
    );
    assert_eq!(path(&c, "mongo_cps", &[("database", "other")]), None);
    // 2: nested lists; a key without a value matches any value.
    let c = load(
        "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
    );
    assert_eq!(
        path(
            &c,
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2061111111")]
        )
        .as_deref(),
        Some("messaging.message_type_marketing.to_number")
    );
    assert_eq!(
        path(&c, "messaging", &[("to_number", "2061111111")]).as_deref(),
        Some("messaging.to_number")
    );
    assert_eq!(
        path(&c, "messaging", &[("message_type", "marketing")]),
        None
    );
    // 3: key and value is tried before key alone; 0 per unit blocks.
    let c = load(
        "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  # Black list IP\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
    );
    let blocked = c
        .find(
            "edge_proxy_per_ip",
            &entries(&[("remote_address", "50.0.0.5")]),
        )
        .unwrap()
        .unwrap();
    assert!(blocked.blocked() && blocked.rule.is_none());
    let normal = c
        .find(
            "edge_proxy_per_ip",
            &entries(&[("remote_address", "50.0.0.1")]),
        )
        .unwrap()
        .unwrap();
    assert_eq!(normal.rule.as_ref().unwrap().limit(), 10);
    // 4: the request must reach the level that holds the limit.
    let c = load(
        "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit:\n      requests_per_unit: 300\n      unit: second\n",
    );
    assert_eq!(
        path(&c, "example4", &[("key", "value"), ("subkey", "subvalue")]),
        None
    );
    // 5: unlimited.
    let c = load(
        "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n",
    );
    assert!(
        c.find("internal", &entries(&[("ldap", "x")]))
            .unwrap()
            .unwrap()
            .rule
            .is_none()
    );
    // 6: shadow mode.
    let c = load(
        "domain: example6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit:\n          requests_per_unit: 10\n          unit: second\n        shadow_mode: true\n      - key: user\n        value: user-b\n        rate_limit:\n          requests_per_unit: 20\n          unit: second\n",
    );
    let a = c
        .find(
            "example6",
            &entries(&[("service", "auth-service"), ("user", "user-a")]),
        )
        .unwrap()
        .unwrap();
    let b = c
        .find(
            "example6",
            &entries(&[("service", "auth-service"), ("user", "user-b")]),
        )
        .unwrap()
        .unwrap();
    assert!(a.shadow_mode && !b.shadow_mode);
    // 7: replaces.
    let c = load(
        "domain: example7\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          name: specific_limit\n          requests_per_unit: 5\n          unit: second\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces:\n            - name: specific_limit\n          requests_per_unit: 10\n          unit: second\n",
    );
    let second = c
        .find(
            "example7",
            &entries(&[("key_2", "value_2"), ("user", "bkthomps")]),
        )
        .unwrap()
        .unwrap();
    assert_eq!(second.replaces, ["specific_limit"]);
    // 8: detailed metrics.
    let c = load(
        "domain: example8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    );
    assert!(
        c.find("example8", &entries(&[("key1", "other")]))
            .unwrap()
            .unwrap()
            .detailed_metric
    );
    // 9: a wildcard value.
    let c = load(
        "domain: example9\ndescriptors:\n  - key: key1\n    value: value*\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    );
    assert_eq!(
        path(&c, "example9", &[("key1", "value_2")]).as_deref(),
        Some("example9.key1_value*")
    );
    assert_eq!(path(&c, "example9", &[("key1", "other")]), None);
}

#[test]
fn unlimited_matches_without_a_rule() {
    let config =
        parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n").unwrap();
    let limit = config.find("d", &entries(&[("a", "x")])).unwrap().unwrap();
    assert!(limit.rule.is_none());
    let err = parse(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("rate_limit.unit"), "{err}");
}

/// A file over the node budget is an error naming the file and the flag that raises it;
/// the same file loads under the default budget.
#[test]
fn the_node_budget_bounds_a_file() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let tight = LoadOptions {
        max_nodes: 20,
        ..LoadOptions::new(DEFAULT_ALGORITHM)
    };
    let err = Config::parse(Path::new("big.yaml"), text, tight)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("big.yaml: more than 20 YAML nodes") && err.contains("--max-config-nodes"),
        "{err}"
    );
    assert!(parse(text).is_ok());
}

/// Long values nested deep spell descriptor paths far longer than the text they came
/// from (each path repeats every value above it): their bytes are bounded by
/// --max-config-bytes as the text is, with an error naming the line and the flag.
#[test]
fn descriptor_paths_are_bounded_like_the_text() {
    // Twelve levels of 4 KiB values: 49 KiB of text, 312 KiB of paths.
    let mut text = String::from("domain: d\ndescriptors:\n");
    for depth in 0..12 {
        let indent = "  ".repeat(2 * depth);
        let value = format!("{depth:02}{}", "v".repeat(4094));
        text += &format!("{indent}  - key: k{depth}\n{indent}    value: {value}\n");
        text += &format!("{indent}    rate_limit: {{unit: second, requests_per_unit: 1}}\n");
        text += &format!("{indent}    descriptors:\n");
    }
    text += &format!("{}  - key: leaf\n", "  ".repeat(24));
    let options = LoadOptions {
        max_bytes: 64 * 1024,
        ..LoadOptions::new(DEFAULT_ALGORITHM)
    };
    assert!(text.len() < options.max_bytes);
    let err = Config::parse(Path::new("deep.yaml"), &text, options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the descriptor paths of this file")
            && err.contains("--max-config-bytes (65536)"),
        "{err}"
    );
    assert!(
        err.len() < 4096,
        "the error quotes a bounded part: {} bytes",
        err.len()
    );
    // The same file within a bound its paths fit.
    let roomy = LoadOptions {
        max_bytes: 1 << 20,
        ..LoadOptions::new(DEFAULT_ALGORITHM)
    };
    Config::parse(Path::new("deep.yaml"), &text, roomy).unwrap();
}

/// A key or value longer than a request may carry could never be matched: refused, naming
/// the line, the field and the flag, so that a long value cannot cost memory (its path is
/// in every metric label of its rule) for nothing. Raising the flag admits it.
#[test]
fn keys_and_values_longer_than_a_request_may_carry_are_refused() {
    let value = "v".repeat(DEFAULT_MAX_ENTRY_BYTES + 1);
    let text = format!(
        "domain: d\ndescriptors:\n  - key: a\n    value: {value}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    );
    let err = parse(&text).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "limits.yaml: line 3: value: 65537 bytes, longer than --max-entry-bytes (65536)"
        ),
        "{err}"
    );
    assert!(
        err.len() < 4096,
        "the error quotes a bounded part: {} bytes",
        err.len()
    );
    let key_text = text.replace(
        &format!("key: a\n    value: {value}"),
        &format!("key: {value}"),
    );
    let err = parse(&key_text).unwrap_err().to_string();
    assert!(err.contains("line 3: key: 65537 bytes"), "{err}");
    let roomy = LoadOptions {
        max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES + 1,
        ..LoadOptions::new(DEFAULT_ALGORITHM)
    };
    Config::parse(Path::new("limits.yaml"), &text, roomy).unwrap();
}

#[test]
fn an_empty_directory_or_file_is_an_error() {
    let dir = std::env::temp_dir().join(format!("sluicegate-config-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = Config::load(&dir, LoadOptions::new(DEFAULT_ALGORITHM))
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no configuration"), "{err}");
    for empty in ["", "\n", "# nothing\n"] {
        let err = parse(empty).unwrap_err().to_string();
        assert!(err.starts_with("limits.yaml: "), "{empty:?}: {err}");
    }
}

/// An error quotes at most 1 KiB of what it is about: a value a megabyte long, in a field
/// that refuses it or in a domain declared twice, is cut short with how much was left out.
#[test]
fn an_error_quotes_a_long_value_cut_short() {
    let long = "x".repeat(1 << 20);
    let err = parse(&format!(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: {long}, requests_per_unit: 1}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(err.len() < 2600, "{} bytes", err.len());
    assert!(err.starts_with("limits.yaml: "), "{err}");
    let twice = format!("domain: {long}\ndescriptors: []\n");
    let err = Config::combine(
        ["a.yaml", "b.yaml"].map(|name| {
            Ok((
                PathBuf::from(name),
                Config::parse(Path::new(name), &twice, LoadOptions::new(DEFAULT_ALGORITHM))?,
            ))
        }),
        LoadOptions::new(DEFAULT_ALGORITHM),
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("b.yaml: domain: \"xxx"), "{err}");
    assert!(err.ends_with("more bytes)"), "{err}");
    assert!(err.len() < 1200, "{} bytes", err.len());
}

/// `clipped` cuts at a character's boundary, never inside one.
#[test]
fn clipped_keeps_whole_characters() {
    assert_eq!(clipped("short", 10), "short");
    assert_eq!(clipped("ééé", 3), "é… (4 more bytes)");
}
