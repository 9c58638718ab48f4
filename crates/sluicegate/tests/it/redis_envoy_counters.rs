//! Envoy counters (`Rule::with_envoy_counter`) on a real redis-server, a Sentinel
//! deployment and a real three-master Redis Cluster: a fixed window counted in
//! envoyproxy/ratelimit's own key, with its arithmetic, so that envoy's instances and the
//! store's share one counter — a count envoy left is honoured, and what the store counts is
//! what envoy reads.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluicegate::internals::{envoy_counter_key, hash_slot};
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Charge, Check, Limit, ManualClock, MemoryStore, MemoryStoreConfig, Outcome,
    RedisStore, RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{self as support, RedisSentinel, RedisServer, cmd};

use crate::redis_trace::random;

use random::Random;

/// envoy's `EXPIRATION_JITTER_MAX_SECONDS` in these tests.
const JITTER: u64 = 300;

/// The wall clock now, in µs: the time envoy's instances name their windows by.
fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A rule `name` of `limit` per minute, kept as envoy's counter.
fn per_minute(name: &str, limit: u64) -> Rule {
    Rule::new(
        name,
        &RuleSpec::new(Algorithm::FixedWindow, limit, Duration::from_secs(60)),
    )
    .unwrap()
    .with_envoy_counter()
    .unwrap()
}

/// A store on `url` under `prefix` (envoy's CACHE_KEY_PREFIX), its checks sent as
/// `scripting` says.
async fn store(url: &str, prefix: &str, scripting: Scripting) -> RedisStore {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = prefix.to_owned();
    config.timeout = Duration::from_secs(5);
    config.scripting = scripting;
    config.expiration_jitter_max = Duration::from_secs(JITTER);
    RedisStore::connect(config).await.unwrap()
}

/// A check of `cost` under `rule` for `key` at `at`, charged as envoy charges (a refusal
/// counts too).
async fn charged(
    store: &RedisStore,
    rule: &Rule,
    key: &str,
    cost: u64,
    at: u64,
) -> Result<Outcome, StoreError> {
    let limits = [Limit { rule, key }];
    store
        .check(&Check {
            at: Some(Duration::from_micros(at)),
            charge: Charge::CheckChargingRefusals,
            ..Check::new(&limits, cost)
        })
        .await
}

/// Where the counters are: the one standalone server, the cluster (each key on the master
/// of its slot), or a Sentinel deployment's master.
#[derive(Clone, Copy)]
enum Servers<'a> {
    Standalone,
    Cluster,
    Sentinel(&'a RedisSentinel),
}

impl<'a> Servers<'a> {
    /// The server holding `key`.
    fn server_of(self, key: &str) -> &'a RedisServer {
        match self {
            Servers::Standalone => support::standalone(),
            Servers::Cluster => support::cluster().master_of(hash_slot(key)),
            Servers::Sentinel(deployment) => &deployment.master,
        }
    }
}

/// What envoy left, or what the store counted, at `key`: its value and TTL in seconds.
fn counter(servers: Servers<'_>, key: &str) -> (Option<u64>, i64) {
    let server = servers.server_of(key);
    let value: Option<u64> = server.query(cmd("GET").arg(key)).unwrap();
    let ttl: i64 = server.query(cmd("TTL").arg(key)).unwrap();
    (value, ttl)
}

/// Every case on one deployment, the script called as `scripting` says.
async fn shares_envoys_counter(url: &str, servers: Servers<'_>, scripting: Scripting, test: &str) {
    let prefix = format!("{test}:{}:", std::process::id());
    let store = store(url, &prefix, scripting).await;
    let rule = per_minute("per_user", 5);
    let at = now_micros();

    // A counter envoy left at its limit: `SET domain_key_value_<window start> L` with its
    // TTL, as envoy's INCRBY and EXPIRE leave it. The next check is over the limit, and
    // counts, as envoy's does (INCRBY, then compare: envoyproxy/ratelimit@f2fb157
    // src/redis/fixed_cache_impl.go:166-220, src/limiter/base_limiter.go:101-113).
    let left = "domain_key_left";
    let name = envoy_counter_key(&prefix, &rule, left, at);
    assert_eq!(
        name,
        format!("{prefix}domain_key_left_{}", at / 60_000_000 * 60)
    );
    let _: () = servers
        .server_of(&name)
        .query(cmd("SET").arg(&name).arg(5).arg("EX").arg(60))
        .unwrap();
    let refused = charged(&store, &rule, left, 1, at).await.unwrap();
    assert!(!refused.decision.allowed, "{refused:?}");
    assert_eq!(refused.decision.remaining, 0);
    assert_eq!(counter(servers, &name).0, Some(6));
    // A check that does not charge refusals leaves envoy's count alone.
    let limits = [Limit {
        rule: &rule,
        key: left,
    }];
    let plain = Check {
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, 1)
    };
    assert!(!store.check(&plain).await.unwrap().decision.allowed);
    assert_eq!(counter(servers, &name).0, Some(6));

    // What the store counts is envoy's counter: its name, its value, and a TTL of the
    // window plus a jitter below EXPIRATION_JITTER_MAX_SECONDS, set on every increment
    // (src/redis/fixed_cache_impl.go:31-34, 166-171).
    let fresh = "domain_key_fresh";
    let name = envoy_counter_key(&prefix, &rule, fresh, at);
    assert_eq!(counter(servers, &name), (None, -2));
    for (cost, remaining) in [(2, 3), (3, 0)] {
        let outcome = charged(&store, &rule, fresh, cost, at).await.unwrap();
        assert!(outcome.decision.allowed);
        assert_eq!(outcome.decision.remaining, remaining);
    }
    let (value, ttl) = counter(servers, &name);
    assert_eq!(value, Some(5));
    assert!((60 - 1..60 + JITTER as i64).contains(&ttl), "TTL {ttl}");
    let over = charged(&store, &rule, fresh, 1, at).await.unwrap();
    assert!(!over.decision.allowed);
    assert_eq!(counter(servers, &name).0, Some(6));
    // A peek counts nothing.
    let limits = [Limit {
        rule: &rule,
        key: fresh,
    }];
    let peek = Check {
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, 0)
    };
    assert!(!store.check(&peek).await.unwrap().decision.allowed);
    assert_eq!(counter(servers, &name).0, Some(6));

    // The next window is another key, as envoy's is.
    let next = at + 60_000_000;
    assert!(
        charged(&store, &rule, fresh, 1, next)
            .await
            .unwrap()
            .decision
            .allowed
    );
    assert_eq!(
        counter(servers, &envoy_counter_key(&prefix, &rule, fresh, next)).0,
        Some(1)
    );

    // On the store's own clock, the key names the window of this instance's wall clock.
    let before = now_micros();
    let limits = [Limit {
        rule: &rule,
        key: "domain_key_clock",
    }];
    assert!(
        store
            .check(&Check::new(&limits, 1))
            .await
            .unwrap()
            .decision
            .allowed
    );
    let after = now_micros();
    let named: Vec<Option<u64>> = [before, after]
        .iter()
        .map(|&t| {
            counter(
                servers,
                &envoy_counter_key(&prefix, &rule, "domain_key_clock", t),
            )
            .0
        })
        .collect();
    assert!(named.contains(&Some(1)), "{named:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_shares_envoys_counters() {
    let url = support::standalone().url();
    let servers = Servers::Standalone;
    shares_envoys_counter(&url, servers, Scripting::Auto, "envoy-fn").await;
    shares_envoys_counter(&url, servers, Scripting::Eval, "envoy-eval").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shares_envoys_counters() {
    let url = support::cluster().url();
    let servers = Servers::Cluster;
    shares_envoys_counter(&url, servers, Scripting::Auto, "envoy-cluster-fn").await;
    shares_envoys_counter(&url, servers, Scripting::Eval, "envoy-cluster-eval").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_deployment_shares_envoys_counters() {
    let deployment = RedisSentinel::start(1);
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/{}",
        deployment.sentinels[0].port,
        RedisSentinel::MASTER_NAME
    );
    let servers = Servers::Sentinel(&deployment);
    shares_envoys_counter(&url, servers, Scripting::Auto, "envoy-sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_in_several_slots_give_back_when_one_refuses() {
    let prefix = format!("envoy-slots:{}:", std::process::id());
    let store = store(&support::cluster().url(), &prefix, Scripting::Auto).await;
    let (roomy, full) = (per_minute("roomy", 5), per_minute("full", 1));
    let at = now_micros();
    // Two counters on different masters: the check is run slot by slot.
    let cluster = support::cluster();
    let port = |key: &str| cluster.master_of(hash_slot(key)).port;
    let first = envoy_counter_key(&prefix, &roomy, "domain_a", at);
    let second_key = (0..)
        .map(|i| format!("domain_b{i}"))
        .find(|k| port(&envoy_counter_key(&prefix, &full, k, at)) != port(&first))
        .unwrap();
    let second = envoy_counter_key(&prefix, &full, &second_key, at);
    let limits = [
        Limit {
            rule: &roomy,
            key: "domain_a",
        },
        Limit {
            rule: &full,
            key: &second_key,
        },
    ];
    let check = Check {
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, 1)
    };
    assert!(store.check(&check).await.unwrap().decision.allowed);
    assert_eq!(counter(Servers::Cluster, &first).0, Some(1));
    assert_eq!(counter(Servers::Cluster, &second).0, Some(1));
    // The second is full: the first's admission is given back.
    let refused = store.check(&check).await.unwrap();
    assert!(!refused.decision.allowed);
    assert_eq!(counter(Servers::Cluster, &first).0, Some(1));
    assert_eq!(counter(Servers::Cluster, &second).0, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_take_no_request_ids_and_whole_seconds_only() {
    let store = store(
        &support::standalone().url(),
        "envoy-refused:",
        Scripting::Auto,
    )
    .await;
    let rule = per_minute("ids", 5);
    let limits = [Limit {
        rule: &rule,
        key: "domain_k_v",
    }];
    let with_id = Check {
        request_id: Some("r1"),
        ..Check::new(&limits, 1)
    };
    assert!(matches!(
        store.check(&with_id).await,
        Err(StoreError::InvalidCheck(message)) if message.contains("envoy's counter")
    ));
    let half_second = Rule::new(
        "h",
        &RuleSpec::new(Algorithm::FixedWindow, 5, Duration::from_millis(500)),
    )
    .unwrap();
    assert!(half_second.with_envoy_counter().is_err());
    let log = Rule::new(
        "l",
        &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(1)),
    )
    .unwrap();
    assert!(log.with_envoy_counter().is_err());
}

/// The Lua follows the Rust: random checks of envoy counters (one or two limits, costs
/// from a peek to more than L, refusals charged or not, time moving on across windows)
/// decide alike on the memory store and on Redis, by functions and by EVALSHA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_agree_with_the_reference() {
    let url = support::standalone().url();
    for (scripting, name) in [(Scripting::Auto, "fn"), (Scripting::Eval, "eval")] {
        let rules = [
            Rule::new(
                "a",
                &RuleSpec::new(Algorithm::FixedWindow, 3, Duration::from_secs(1)),
            )
            .unwrap()
            .with_envoy_counter()
            .unwrap(),
            Rule::new(
                "b",
                &RuleSpec::new(Algorithm::FixedWindow, 7, Duration::from_secs(2)),
            )
            .unwrap()
            .with_envoy_counter()
            .unwrap(),
        ];
        // Each rule its own keys: a key counted under two windows shares envoy's counter
        // whenever their starts coincide (as envoy's does), which the memory store, keeping
        // a window per rule, does not follow.
        let keys = [["d_a_x", "d_a_y", "d_a_z"], ["d_b_x", "d_b_y", "d_b_z"]];
        for seed in 1..=4u64 {
            // Counters of their own: the traces' times overlap.
            let prefix = format!("envoy-diff-{name}-{seed}:{}:", std::process::id());
            let store = store(&url, &prefix, scripting).await;
            let reference = MemoryStore::new(
                MemoryStoreConfig::default(),
                Arc::new(ManualClock::new(Duration::ZERO)),
            );
            let mut random = Random(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut at = now_micros();
            for line in 0..300 {
                at += random.below(400_000);
                let (rule, first) = (random.below(2) as usize, random.below(3) as usize);
                let mut limits = vec![Limit {
                    rule: &rules[rule],
                    key: keys[rule][first],
                }];
                if random.below(3) == 0 {
                    let other = random.below(2) as usize;
                    limits.push(Limit {
                        rule: &rules[other],
                        key: keys[other][(first + 1) % 3],
                    });
                }
                let check = Check {
                    at: Some(Duration::from_micros(at)),
                    charge: if random.below(2) == 0 {
                        Charge::Check
                    } else {
                        Charge::CheckChargingRefusals
                    },
                    ..Check::new(&limits, random.below(5))
                };
                let want = reference.check_now(&check).unwrap();
                let got = store.check(&check).await.unwrap();
                assert_eq!(got, want, "{name} seed {seed} line {line}: {check:?}");
            }
        }
    }
}
