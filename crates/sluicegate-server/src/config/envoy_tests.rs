//! envoyproxy/ratelimit's own configuration tests, ported: each test names the function of
//! envoyproxy/ratelimit@f2fb157 `test/config/config_test.go` it follows and loads that
//! test's fixture, copied unchanged into `tests/fixtures/envoy/test-config/`.
//!
//! Not ported, as they are about something else than loading and matching:
//! `TestConfigLimitOverride` (the request's own `limit`, decided in the service),
//! `TestDetailedMetric`, `TestValueToMetric_*` and `TestWildcardStatsBehavior` (metric
//! names). Error texts are sluicegate's, which name the line and field where envoy's
//! name only the file; each refusal below gives envoy's text beside ours.

use super::tests::entries;
use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy")
        .join(name)
}

fn options(merge_domains: bool) -> LoadOptions {
    LoadOptions {
        merge_domains,
        ..LoadOptions::new(Algorithm::FixedWindow)
    }
}

/// The fixtures `names` of `test-config/`, read in this order as one configuration.
fn load(names: &[&str], merge_domains: bool) -> Result<Config, ConfigError> {
    let files: Vec<PathBuf> = names
        .iter()
        .map(|name| fixture(&format!("test-config/{name}")))
        .collect();
    Config::load_files(&files, options(merge_domains))
}

/// A request descriptor's entries.
type Pairs<'a> = &'a [(&'a str, &'a str)];

/// The limit `pairs` match in `test-domain`.
fn found<'c>(config: &'c Config, pairs: Pairs<'_>) -> Option<&'c ConfiguredLimit> {
    let entries = entries(pairs);
    config.find("test-domain", &entries).unwrap()
}

/// What the limit matched by `pairs` in `test-domain` is: `20/60s` (requests per seconds,
/// with its `name` after a space if it has one), `unlimited`, `block/60s`, or `none` when
/// nothing matches.
fn limit(config: &Config, pairs: Pairs<'_>) -> String {
    let Some(limit) = found(config, pairs) else {
        return "none".into();
    };
    let rate = match (&limit.rule, limit.block_window) {
        (Some(rule), _) => format!("{}/{}s", rule.limit(), rule.window().as_secs()),
        (None, Some(window)) => format!("block/{}s", window / 1_000_000),
        (None, None) => "unlimited".into(),
    };
    match &limit.name {
        Some(name) => format!("{rate} {name}"),
        None => rate,
    }
}

/// The fixture `name` (after `first`, when given) is refused with an error that starts
/// with its path and holds each of `wanted`.
fn refused(first: Option<&str>, name: &str, merge_domains: bool, wanted: &[&str]) {
    let names: Vec<&str> = first.into_iter().chain([name]).collect();
    let err = load(&names, merge_domains).unwrap_err().to_string();
    let path = fixture(&format!("test-config/{name}"));
    assert!(err.starts_with(&format!("{}: ", path.display())), "{err}");
    for want in wanted {
        assert!(err.contains(want), "{want:?} in {err}");
    }
}

/// config_test.go:30.
#[test]
fn basic_config() {
    let c = load(&["basic_config.yaml"], false).unwrap();
    assert!(c.find("foo_domain", &[]).is_err());
    assert_eq!(limit(&c, &[]), "none");
    let cases: &[(Pairs<'_>, &str)] = &[
        (&[("key1", "something")], "none"),
        (&[("key1", "value1")], "none"),
        (&[("key2", "value2"), ("subkey", "subvalue")], "none"),
        (&[("key5", "value5"), ("subkey5", "subvalue")], "none"),
        (&[("key1", "value1"), ("subkey1", "something")], "5/1s"),
        (&[("key1", "value1"), ("subkey1", "subvalue1")], "10/1s"),
        (&[("key2", "something")], "20/60s"),
        (&[("key2", "value2")], "30/60s"),
        (&[("key2", "value3")], "none"),
        (&[("key3", "foo")], "1/3600s"),
        (&[("key4", "foo")], "1/86400s key4_rate_limit"),
        (&[("key6", "foo")], "unlimited"),
        (&[("key7", "unspecified_value")], "70/60s"),
        (&[("key7", "another_value")], "70/60s"),
    ];
    for (pairs, want) in cases {
        assert_eq!(limit(&c, pairs), *want, "{pairs:?}");
    }
}

/// config_test.go:227.
#[test]
fn domain_merge() {
    let c = load(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true).unwrap();
    assert!(c.find("foo_domain", &[]).is_err());
    assert_eq!(limit(&c, &[("key1", "value1")]), "10/60s");
    assert_eq!(limit(&c, &[("key2", "value2")]), "20/60s");
}

/// config_test.go:347 (envoy: "config file cannot have empty domain").
#[test]
fn empty_domain() {
    refused(
        None,
        "empty_domain.yaml",
        false,
        &["missing field `domain`"],
    );
}

/// config_test.go:357 (envoy: "duplicate domain 'test-domain' in config file").
#[test]
fn duplicate_domain() {
    refused(
        Some("basic_config.yaml"),
        "duplicate_domain.yaml",
        false,
        &[
            r#"domain: "test-domain" is already defined in"#,
            "basic_config.yaml",
        ],
    );
}

/// config_test.go:368 (envoy: "descriptor has empty key").
#[test]
fn empty_key() {
    refused(
        None,
        "empty_key.yaml",
        false,
        &["line 3", "missing field `key`"],
    );
}

/// config_test.go:379 (envoy: "duplicate descriptor composite key
/// 'test-domain.key1_value1'").
#[test]
fn duplicate_key() {
    refused(
        None,
        "duplicate_key.yaml",
        false,
        &["line 6", "test-domain.key1_value1: duplicate descriptor"],
    );
}

/// config_test.go:390 (envoy: "merge_domain_key1.yaml: duplicate descriptor composite
/// key 'test-domain.key1_value1'", merging a file with itself).
#[test]
fn duplicate_key_domain_merge() {
    refused(
        Some("merge_domain_key1.yaml"),
        "merge_domain_key1.yaml",
        true,
        &[
            "line 5",
            "test-domain.key1_value1: duplicate descriptor",
            "merged with",
        ],
    );
}

/// config_test.go:403 (envoy: "invalid rate limit unit 'foo'").
#[test]
fn bad_limit_unit() {
    refused(
        None,
        "bad_limit_unit.yaml",
        false,
        &["line 6", r#"rate_limit.unit: unknown unit "foo""#],
    );
}

/// config_test.go:414 (envoy: "replaces should not contain name of same descriptor").
#[test]
fn replaces_self() {
    refused(
        None,
        "replaces_self.yaml",
        false,
        &["line 8", "rate_limit.replaces[0].name", "own name"],
    );
}

/// config_test.go:425 (envoy: "should not have an empty replaces entry").
#[test]
fn replaces_empty() {
    refused(
        None,
        "replaces_empty.yaml",
        false,
        &["line 8", "rate_limit.replaces[0].name: must not be empty"],
    );
}

/// config_test.go:436 (envoy: "error loading config file: yaml: line 2: found unexpected
/// end of stream").
#[test]
fn bad_yaml() {
    refused(None, "bad_yaml.yaml", false, &["line "]);
}

/// config_test.go:447 (envoy: "config error, unknown key 'ratelimit'").
#[test]
fn misspelled_key() {
    refused(None, "misspelled_key.yaml", false, &["line 5", "ratelimit"]);
}

/// config_test.go:447 (envoy: "config error, unknown key 'requestsperunit'").
#[test]
fn misspelled_key2() {
    refused(
        None,
        "misspelled_key2.yaml",
        false,
        &["line 7", "requestsperunit"],
    );
}

/// config_test.go:467 (envoy: "config error, key is not of type string: 0.25").
#[test]
fn non_string_key() {
    refused(None, "non_string_key.yaml", false, &["line 1", "0.25"]);
}

/// config_test.go:478 (envoy: "config error, yaml file contains list of type other than
/// map: a").
#[test]
fn non_map_list() {
    refused(None, "non_map_list.yaml", false, &["line 3"]);
}

/// config_test.go:489 (envoy: "should not specify rate limit unit when unlimited").
#[test]
fn unlimited_with_rate_limit_unit() {
    refused(
        None,
        "unlimited_with_unit.yaml",
        false,
        &[
            "line 5",
            "rate_limit.unit: an unlimited rate_limit takes no unit",
        ],
    );
}

/// config_test.go:500.
#[test]
fn shadow_mode_config() {
    let c = load(&["shadowmode_config.yaml"], false).unwrap();
    let shadow = |pairs: Pairs<'_>| found(&c, pairs).unwrap().shadow_mode;
    assert!(!shadow(&[("key1", "value1"), ("subkey1", "something")]));
    assert!(shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]));
    assert!(shadow(&[("key2", "something")]));
    assert!(!shadow(&[("key2", "value2")]));
    assert_eq!(
        limit(&c, &[("key1", "value1"), ("subkey1", "subvalue1")]),
        "10/1s"
    );
    assert_eq!(limit(&c, &[("key2", "something")]), "20/60s");
}

/// config_test.go:576.
#[test]
fn wildcard_config() {
    let c = load(&["wildcard.yaml"], false).unwrap();
    let path = |pairs: Pairs<'_>| found(&c, pairs).map(|l| l.path.clone());
    let cases: &[(Pairs<'_>, Option<&str>)] = &[
        (&[("noVal", "foo1")], Some("test-domain.noVal")),
        (&[("noVal", "foo2")], Some("test-domain.noVal")),
        (&[("wild", "foo1")], Some("test-domain.wild_foo*")),
        (&[("wild", "foo2")], Some("test-domain.wild_foo*")),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")],
            Some("test-domain.nestedWild_val1.wild_goo*"),
        ),
        (&[("wild", "bar")], None),
        (&[("noWild", "foo1")], None),
        (&[("midWild", "barab")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "bar123b")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "barb")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "bara")], None),
        (&[("midWild", "xbarb")], None),
        (
            &[("multiWild", "foo123bar456baz")],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (
            &[("multiWild", "foobarbaz")],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (&[("multiWild", "foo123baz")], None),
        (&[("multiWild", "bar456baz")], None),
    ];
    for (pairs, want) in cases {
        assert_eq!(path(pairs).as_deref(), *want, "{pairs:?}");
    }
}

/// config_test.go:1669: the values a `share_threshold` wildcard matches count under the
/// wildcard, level by level; an exact value beside it keeps its own count.
#[test]
fn share_threshold() {
    let c = load(&["share_threshold.yaml"], false).unwrap();
    let counted = |pairs: Pairs<'_>| {
        let entries = entries(pairs);
        let limit = c.find("test-domain", &entries).unwrap().unwrap();
        let counted = limit.counted_entries(&entries);
        let values: Vec<String> = counted.iter().map(|e| e.value.clone()).collect();
        (limit.rule.as_ref().unwrap().limit(), values.join(" "))
    };
    for value in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        assert_eq!(counted(&[("files", value)]), (100, "files/*".into()));
    }
    assert_eq!(
        counted(&[("route", "api/v1"), ("method", "GET")]),
        (60, "api/* GET".into())
    );
    assert_eq!(
        counted(&[("service", "svc/users"), ("endpoint", "/get")]),
        (80, "svc/* /get".into())
    );
    assert_eq!(
        counted(&[("nested", "parent"), ("files", "nested/x")]),
        (200, "parent nested/*".into())
    );
    assert_eq!(
        counted(&[("files", "top/a"), ("files", "nested/b")]),
        (300, "top/* nested/*".into())
    );
    // The parent shares, the child (file/*, share_threshold: false) does not.
    assert_eq!(
        counted(&[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]),
        (120, "path/* file/doc1 pdf".into())
    );
    assert_eq!(
        counted(&[
            ("user", "user/alice"),
            ("resource", "res/file1"),
            ("action", "read")
        ]),
        (150, "user/* res/* read".into())
    );
    assert_eq!(counted(&[("file", "test1")]), (50, "test1".into()));
    for value in ["test2", "test23", "test123"] {
        assert_eq!(counted(&[("file", value)]), (100, "test*".into()));
    }
    for value in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        assert_eq!(counted(&[("midpath", value)]), (100, "/api*v1".into()));
    }
    for value in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        assert_eq!(counted(&[("multiroute", value)]), (50, "svc*ep*rpc".into()));
    }
    for value in ["/api/v2", "/api-beta-v2"] {
        assert_eq!(counted(&[("midroute", value)]), (80, "/api*v2".into()));
    }
    for (tenant, resource) in [("t1prod", "resAv2"), ("t99prod", "resBBBv2")] {
        assert_eq!(
            counted(&[("tenant", tenant), ("resource", resource)]),
            (60, "t*prod res*v2".into())
        );
    }
    let none = |pairs: Pairs<'_>| found(&c, pairs).is_none();
    assert!(none(&[("midpath", "/api/v2")]));
    assert!(none(&[("multiroute", "svcABCrpc")]));
}

/// config_test.go:2209: `metadata` loads (sluicegate does not answer with it yet).
#[test]
fn metadata() {
    let c = load(&["metadata.yaml"], false).unwrap();
    assert_eq!(limit(&c, &[("key1", "value1"), ("subkey1", "x")]), "5/1s");
    assert_eq!(limit(&c, &[("key2", "x")]), "20/60s");
}

/// Envoy Gateway's rate limit configurations, as its translator writes them
/// (`tests/fixtures/envoy-gateway/ratelimit-config/`, one file per test, the configurations of
/// several domains as YAML documents of one file), each a file's path.
pub(crate) fn envoy_gateway_configurations() -> Vec<PathBuf> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoy-gateway/ratelimit-config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            name.ends_with(".yaml") && !name.ends_with(".routes.yaml")
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 26, "{}", dir.display());
    files
}

/// Envoy Gateway's rate limit configurations ([`envoy_gateway_configurations`]): each loads, its top-level `name`, `rate_limit:
/// null`, `name: ""`, `replaces: []` and every flag written out included, with each of its
/// rate limits, unnamed.
#[test]
fn envoy_gateway_configurations_load() {
    let files = envoy_gateway_configurations();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for document in text.split("\n---\n") {
            let config = Config::parse(file, document, options(false))
                .unwrap_or_else(|e| panic!("{e}\n{document}"));
            let name = document
                .lines()
                .find_map(|line| line.strip_prefix("name: "))
                .unwrap();
            assert!(config.find(name, &[]).is_ok(), "{}: {name}", file.display());
            let limits = config.limits();
            assert_eq!(
                limits.len(),
                document.matches("requests_per_unit:").count(),
                "{}",
                file.display()
            );
            assert!(limits.iter().all(|l| l.rule.is_some() && l.name.is_none()));
            let shadow = limits.iter().filter(|l| l.shadow_mode).count();
            let wanted = usize::from(file.ends_with("global-shadow-mode.yaml"));
            assert_eq!(shadow, wanted, "{}", file.display());
        }
    }
    // `value: ""` is no value: the key matches whatever value comes.
    let file = files
        .iter()
        .find(|f| f.ends_with("distinct-match.yaml"))
        .unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    let c = Config::parse(file, &text, options(false)).unwrap();
    for value in ["a", "192.0.2.1"] {
        let pairs = [("first-route", "first-route"), ("rule-0-match-0", value)];
        let found = c.find("first-listener", &entries(&pairs)).unwrap();
        assert_eq!(found.map(|l| l.rule.as_ref().unwrap().limit()), Some(5));
    }
}
