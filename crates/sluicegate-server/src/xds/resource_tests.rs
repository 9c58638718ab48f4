use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use prost::Message as _;
use serde::Deserialize;
use sluicegate::Algorithm;
use sluicegate::internals::saturating_micros;

use super::*;

fn options(merge_domains: bool) -> LoadOptions {
    LoadOptions {
        merge_domains,
        ..LoadOptions::new(Algorithm::FixedWindow)
    }
}

fn any(config: &RateLimitConfig) -> Any {
    Any {
        type_url: type_url(),
        value: config.encode_to_vec(),
    }
}

/// What a configuration holds, in a comparable form: every limit in path order.
fn limits(config: &Config) -> String {
    format!("{:#?}", config.limits())
}

/// The YAML documents `text` holds, as the file loader reads them, put together.
fn yaml_config(text: &str, merge: bool) -> Config {
    Config::combine(
        text.split("\n---\n").enumerate().map(|(i, document)| {
            let path = PathBuf::from(format!("document {i}"));
            Ok((
                path.clone(),
                Config::parse(&path, &unnamed(document), options(merge))?,
            ))
        }),
        options(merge),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A document without its top-level `name`: the resource's name, which names the source
/// rather than being part of what it configures (the comparison is of domains and
/// descriptors).
fn unnamed(document: &str) -> String {
    document
        .lines()
        .filter(|line| !line.starts_with("name:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fields Envoy Gateway's `egctl` writes for a resource
/// (`GetRateLimitServiceConfigStr`, envoyproxy/gateway@d32f282
/// internal/xds/translator/ratelimit.go:641-658, envoy's YamlDescriptor).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgResource {
    name: String,
    domain: String,
    descriptors: Vec<EgDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgDescriptor {
    key: String,
    value: String,
    rate_limit: Option<EgPolicy>,
    descriptors: Vec<EgDescriptor>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    // Not in the message: always false in what egctl writes of one.
    value_to_metric: bool,
    share_threshold: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgPolicy {
    requests_per_unit: u32,
    unit: String,
    unlimited: bool,
    name: String,
    replaces: Vec<EgReplace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EgReplace {
    name: String,
}

/// The message a written-out resource was written from.
fn message(resource: EgResource) -> RateLimitConfig {
    fn descriptor(d: EgDescriptor) -> RateLimitDescriptor {
        assert!(!d.value_to_metric && !d.share_threshold);
        RateLimitDescriptor {
            key: d.key,
            value: d.value,
            rate_limit: d.rate_limit.map(|p| RateLimitPolicy {
                unit: RateLimitUnit::from_str_name(&p.unit).expect("a unit name") as i32,
                requests_per_unit: p.requests_per_unit,
                unlimited: p.unlimited,
                name: p.name,
                replaces: p
                    .replaces
                    .into_iter()
                    .map(|r| RateLimitReplace { name: r.name })
                    .collect(),
            }),
            descriptors: d.descriptors.into_iter().map(descriptor).collect(),
            shadow_mode: d.shadow_mode,
            detailed_metric: d.detailed_metric,
            quota_mode: d.quota_mode,
            metadata: None,
        }
    }
    RateLimitConfig {
        name: resource.name,
        domain: resource.domain,
        descriptors: resource.descriptors.into_iter().map(descriptor).collect(),
    }
}

#[test]
fn envoy_gateway_pushes_load_what_their_yaml_loads() {
    let files = crate::config::envoy_tests::envoy_gateway_configurations();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a fixture");
        let resources: Vec<Any> = text
            .split("\n---\n")
            .map(|document| {
                let resource: EgResource =
                    serde_saphyr::from_str(document).unwrap_or_else(|e| panic!("{e}"));
                any(&message(resource))
            })
            .collect();
        let pushed = config_of(&resources, options(false))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let read = yaml_config(&text, false);
        assert!(!pushed.is_empty(), "{}", file.display());
        assert_eq!(limits(&pushed), limits(&read), "{}", file.display());
    }
}

fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..RateLimitPolicy::default()
    })
}

fn descriptor(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit,
        ..RateLimitDescriptor::default()
    }
}

/// Every field of the message, against the YAML that says the same (with the fields the
/// message lacks, at their defaults).
#[test]
fn every_field_of_the_message_loads_as_its_yaml() {
    let named = RateLimitPolicy {
        name: "per-user".into(),
        ..policy(RateLimitUnit::Minute, 10).unwrap()
    };
    let replacing = RateLimitPolicy {
        replaces: vec![RateLimitReplace {
            name: "per-user".into(),
        }],
        ..policy(RateLimitUnit::Hour, 100).unwrap()
    };
    let metadata = Struct {
        fields: [(
            "team".to_owned(),
            Value {
                kind: Some(Kind::StringValue("payments".into())),
            },
        )]
        .into(),
    };
    let resource = RateLimitConfig {
        name: "gateway/route".into(),
        domain: "edge".into(),
        descriptors: vec![
            RateLimitDescriptor {
                descriptors: vec![
                    RateLimitDescriptor {
                        detailed_metric: true,
                        quota_mode: true,
                        metadata: Some(metadata),
                        ..descriptor("user", "", Some(named))
                    },
                    descriptor("vip", "", Some(replacing)),
                ],
                ..descriptor("route", "checkout", None)
            },
            RateLimitDescriptor {
                shadow_mode: true,
                ..descriptor("path", "/health", policy(RateLimitUnit::Second, 0))
            },
            descriptor(
                "internal",
                "true",
                Some(RateLimitPolicy {
                    unlimited: true,
                    ..RateLimitPolicy::default()
                }),
            ),
            descriptor("week", "", policy(RateLimitUnit::Week, 7)),
        ],
    };
    let yaml = r#"
domain: edge
descriptors:
  - key: route
    value: checkout
    rate_limit: null
    value_to_metric: false
    share_threshold: false
    descriptors:
      - key: user
        detailed_metric: true
        quota_mode: true
        metadata: {team: payments}
        rate_limit: {unit: MINUTE, requests_per_unit: 10, name: per-user}
      - key: vip
        rate_limit:
          unit: HOUR
          requests_per_unit: 100
          unlimited: false
          name: ""
          replaces: [{name: per-user}]
  - key: path
    value: /health
    shadow_mode: true
    rate_limit: {unit: SECOND, requests_per_unit: 0}
  - key: internal
    value: "true"
    rate_limit: {unlimited: true}
  - key: week
    rate_limit: {unit: WEEK, requests_per_unit: 7}
"#;
    let pushed = config_of(&[any(&resource)], options(false)).expect("a good push");
    let read = yaml_config(yaml, false);
    assert_eq!(limits(&pushed), limits(&read));
    let all = pushed.limits();
    let user = all.iter().find(|l| l.path.ends_with("user")).unwrap();
    assert!(user.detailed_metric);
    assert_eq!(user.name.as_deref(), Some("per-user"));
    let vip = all.iter().find(|l| l.path.ends_with("vip")).unwrap();
    assert_eq!(vip.replaces, ["per-user"]);
    let health = all.iter().find(|l| l.path.contains("/health")).unwrap();
    assert!(health.blocked() && health.shadow_mode);
}

/// A push is refused for what a file is refused for, and the reason names the resource
/// and the field.
#[test]
fn a_push_a_file_would_be_refused_for_is_refused() {
    let refused =
        |resources: &[Any]| config_of(resources, options(false)).expect_err("a refused push");
    let resource = |domain: &str, descriptors| RateLimitConfig {
        name: format!("{domain}-resource"),
        domain: domain.into(),
        descriptors,
    };
    // envoy: "duplicate descriptor composite key".
    let duplicate = resource(
        "d",
        vec![
            descriptor("k", "v", policy(RateLimitUnit::Second, 1)),
            descriptor("k", "v", policy(RateLimitUnit::Minute, 1)),
        ],
    );
    let why = refused(&[any(&duplicate)]);
    assert!(
        why.contains("\"d-resource\"") && why.contains("duplicate descriptor"),
        "{why}"
    );
    // envoy: "invalid rate limit unit".
    let no_unit = resource(
        "d",
        vec![descriptor("k", "", policy(RateLimitUnit::Unknown, 5))],
    );
    let why = refused(&[any(&no_unit)]);
    assert!(
        why.contains("rate_limit.unit") && why.contains("UNKNOWN"),
        "{why}"
    );
    let mut unknown_number = resource(
        "d",
        vec![descriptor("k", "", policy(RateLimitUnit::Second, 5))],
    );
    unknown_number.descriptors[0]
        .rate_limit
        .as_mut()
        .unwrap()
        .unit = 42;
    let why = refused(&[any(&unknown_number)]);
    assert!(why.contains("unknown unit \"42\""), "{why}");
    // envoy: "should not specify rate limit unit when unlimited".
    let mut unlimited_unit = resource(
        "d",
        vec![descriptor("k", "", policy(RateLimitUnit::Second, 5))],
    );
    unlimited_unit.descriptors[0]
        .rate_limit
        .as_mut()
        .unwrap()
        .unlimited = true;
    let why = refused(&[any(&unlimited_unit)]);
    assert!(why.contains("unlimited rate_limit takes no unit"), "{why}");
    // envoy: "config file cannot have empty domain".
    let why = refused(&[any(&resource("", Vec::new()))]);
    assert!(why.contains("domain: must not be empty"), "{why}");
    // One bad resource refuses the whole push.
    let good = resource(
        "a",
        vec![descriptor("k", "", policy(RateLimitUnit::Second, 5))],
    );
    let why = refused(&[any(&good), any(&no_unit)]);
    assert!(why.contains("d-resource"), "{why}");
    // A domain twice: an error unless domains merge, as files.
    let again = resource(
        "a",
        vec![descriptor("other", "", policy(RateLimitUnit::Second, 5))],
    );
    let why = refused(&[any(&good), any(&again)]);
    assert!(
        why.contains("already defined in xDS resource \"a-resource\""),
        "{why}"
    );
    let merged = config_of(&[any(&good), any(&again)], options(true)).expect("merged");
    assert_eq!(merged.limits().len(), 2);
    // Not a RateLimitConfig at all.
    let garbage = Any {
        type_url: type_url(),
        value: vec![0xff, 0xff, 0xff],
    };
    assert!(refused(&[garbage]).contains("not a RateLimitConfig"));
    let other_type = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    assert!(refused(&[other_type]).contains("expected type.googleapis.com/ratelimit"));
}

#[test]
fn a_push_of_no_resource_is_an_empty_configuration() {
    let config = config_of(&[], options(false)).expect("an empty push");
    assert!(config.is_empty());
}

/// Each limit as `path: limit per window (µs)` or `unlimited`, with its shadow mode: what
/// envoyproxy/ratelimit's `Dump` lists, in sluicegate's terms.
fn dump(config: &Config) -> Vec<String> {
    config
        .limits()
        .iter()
        .map(|l| {
            let numbers = match &l.rule {
                Some(rule) => format!("{} per {}", rule.limit(), saturating_micros(rule.window())),
                None if l.blocked() => "blocked".to_owned(),
                None => "unlimited".to_owned(),
            };
            format!("{}: {numbers}, shadow_mode: {}", l.path, l.shadow_mode)
        })
        .collect()
}

fn unlimited() -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unlimited: true,
        ..RateLimitPolicy::default()
    })
}

/// envoyproxy/ratelimit@f2fb157 test/provider/xds_grpc_sotw_provider_test.go:182-279
/// (`testDeeperLimitsXdsConfigUpdate`): nested descriptors, unlimited ones, two domains.
#[test]
fn envoys_deeper_limits_push() {
    const MINUTE: u64 = 60_000_000;
    let foo = RateLimitConfig {
        name: "foo".into(),
        domain: "foo".into(),
        descriptors: vec![
            RateLimitDescriptor {
                descriptors: vec![
                    descriptor("k2", "", unlimited()),
                    descriptor("k2", "v2", policy(RateLimitUnit::Hour, 15)),
                ],
                ..descriptor("k1", "v1", policy(RateLimitUnit::Minute, 10))
            },
            RateLimitDescriptor {
                descriptors: vec![
                    descriptor("j2", "", unlimited()),
                    RateLimitDescriptor {
                        shadow_mode: true,
                        quota_mode: true,
                        ..descriptor("j2", "v2", policy(RateLimitUnit::Day, 15))
                    },
                ],
                ..descriptor("j1", "v2", unlimited())
            },
        ],
    };
    let bar = RateLimitConfig {
        name: "bar".into(),
        domain: "bar".into(),
        descriptors: vec![descriptor("k1", "v1", policy(RateLimitUnit::Minute, 100))],
    };
    let config = config_of(&[any(&foo), any(&bar)], options(false)).expect("a good push");
    assert_eq!(
        dump(&config),
        [
            format!("bar.k1_v1: 100 per {MINUTE}, shadow_mode: false"),
            "foo.j1_v2: unlimited, shadow_mode: false".to_owned(),
            "foo.j1_v2.j2: unlimited, shadow_mode: false".to_owned(),
            format!(
                "foo.j1_v2.j2_v2: 15 per {}, shadow_mode: true",
                1440 * MINUTE
            ),
            format!("foo.k1_v1: 10 per {MINUTE}, shadow_mode: false"),
            "foo.k1_v1.k2: unlimited, shadow_mode: false".to_owned(),
            format!(
                "foo.k1_v1.k2_v2: 15 per {}, shadow_mode: false",
                60 * MINUTE
            ),
        ]
    );
}

/// envoyproxy/ratelimit@f2fb157 test/provider/xds_grpc_sotw_provider_test.go:281-331
/// (`testSameDomainMultipleXdsConfigUpdate`): two resources of one domain merge under
/// MERGE_DOMAIN_CONFIG (here --merge-domain-config).
#[test]
fn envoys_same_domain_twice_push_merges() {
    let first = RateLimitConfig {
        name: "foo-1".into(),
        domain: "foo".into(),
        descriptors: vec![descriptor("k1", "v1", policy(RateLimitUnit::Minute, 10))],
    };
    let second = RateLimitConfig {
        name: "foo-2".into(),
        domain: "foo".into(),
        descriptors: vec![descriptor("k1", "v2", policy(RateLimitUnit::Minute, 100))],
    };
    let config = config_of(&[any(&first), any(&second)], options(true)).expect("merged");
    assert_eq!(
        dump(&config),
        [
            "foo.k1_v1: 10 per 60000000, shadow_mode: false",
            "foo.k1_v2: 100 per 60000000, shadow_mode: false",
        ]
    );
}

/// A push's resources are a configuration, bounded in bytes as files are: over
/// --max-config-bytes the push is refused, saying so, and the same push fits a larger bound.
#[test]
fn a_push_over_the_byte_bound_is_refused() {
    let resource = |domain: &str| {
        any(&RateLimitConfig {
            name: domain.into(),
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "v".repeat(10_000),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Second.into(),
                    requests_per_unit: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        })
    };
    let resources = [resource("d"), resource("e")];
    let bytes: usize = resources.iter().map(|r| r.value.len()).sum();
    let tight = LoadOptions {
        max_bytes: bytes - 1,
        ..options(true)
    };
    let err = config_of(&resources, tight).unwrap_err();
    assert!(
        err.starts_with(&format!(
            "the push's resources hold {bytes} bytes, more than --max-config-bytes ({})",
            bytes - 1
        )),
        "{err}"
    );
    let fits = LoadOptions {
        max_bytes: bytes,
        ..options(true)
    };
    assert!(config_of(&resources, fits).is_ok());
}
