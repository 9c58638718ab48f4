//! The Redis store behind Sentinel, against real redis-server processes in server and
//! sentinel mode: it finds the master through the sentinels and follows it through a
//! failover under load — checks the old master can no longer take fail as errors, and once
//! the sentinels name the new master, it decides. In plain text, over TLS with ACL users
//! (the master's and the sentinels' own), and with ACL users alone; and a wrong password
//! or an untrusted certificate fails the connection, saying which; a sentinel down with the
//! master is not blamed on the master.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluicegate::{
    Algorithm, Check, Limit, Limiter, LimiterConfig, RedisStore, RedisStoreConfig, Rule, RuleSpec,
    StoreError,
};
use sluicegate_test_support::certificates::Authority;
use sluicegate_test_support::{RedisSentinel, RedisServer, SentinelOptions, cmd};
use tokio::time::Instant;

/// A failover takes the sentinels a second to see the master down, then an election and a
/// promotion, then the demoted master's reconfiguration — seconds. But a sentinel whose
/// timer runs two seconds late (a loaded machine) enters TILT mode and acts on nothing for
/// 30 s, and sentinels whose votes split elect no leader until one tries again 20 s later
/// (twice the deployment's failover timeout); this bound outlasts either, twice.
const FAILOVER_WITHIN: Duration = Duration::from_secs(90);

/// How a deployment is secured: TLS only with an authority of its own, ACL users.
#[derive(Clone, Copy)]
struct Security {
    tls: bool,
    acl: bool,
}

const PLAIN: Security = Security {
    tls: false,
    acl: false,
};

/// A running deployment, and what the store needs to reach it.
struct Deployment {
    servers: RedisSentinel,
    security: Security,
    /// With TLS: the authority that signed every process's certificate.
    authority: Option<Authority>,
}

impl Deployment {
    fn start(test: &str, sentinels: usize, security: Security) -> Deployment {
        let authority = security.tls.then(|| {
            let dir = std::env::temp_dir()
                .join(format!("sluicegate-sentinel-{test}-{}", std::process::id()));
            Authority::new(&dir, "ca")
        });
        let servers = RedisSentinel::start_with(&SentinelOptions {
            sentinels,
            tls: authority.as_ref(),
            acl: security.acl,
        });
        Deployment {
            servers,
            security,
            authority,
        }
    }

    /// The store's URL: `rediss+sentinel://` with TLS; with ACL, the master's user and
    /// password in the user info and the sentinels' as parameters, `master_password` and
    /// `sentinel_password` in place of the right ones when given.
    fn url(&self, master_password: Option<&str>, sentinel_password: Option<&str>) -> String {
        let sentinels: Vec<String> = self
            .servers
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let scheme = if self.security.tls {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let (user_info, parameters) = if self.security.acl {
            (
                format!(
                    "{}:{}@",
                    RedisSentinel::USER,
                    master_password.unwrap_or(RedisSentinel::PASSWORD)
                ),
                format!(
                    "?sentinel_username={}&sentinel_password={}",
                    RedisSentinel::SENTINEL_USER,
                    sentinel_password.unwrap_or(RedisSentinel::SENTINEL_PASSWORD)
                ),
            )
        } else {
            (String::new(), String::new())
        };
        format!(
            "{scheme}://{user_info}{}/{}{parameters}",
            sentinels.join(","),
            RedisSentinel::MASTER_NAME
        )
    }

    /// The store's configuration for `url`, trusting the deployment's authority.
    fn config(&self, url: &str, test: &str) -> RedisStoreConfig {
        let mut config = RedisStoreConfig::new(url);
        config.prefix = format!("sentinel:{test}:");
        config.timeout = Duration::from_millis(500);
        config.tls_ca = self
            .authority
            .as_ref()
            .map(|authority| std::fs::read(authority.cert()).unwrap());
        config
    }

    async fn limiter(&self, test: &str) -> Arc<Limiter<RedisStore>> {
        let store = RedisStore::connect(self.config(&self.url(None, None), test))
            .await
            .expect("connects through the sentinels");
        Arc::new(Limiter::with_config(store, LimiterConfig::default()))
    }
}

/// What the load saw: checks decided, and checks that failed.
#[derive(Default)]
struct Tally {
    decided: AtomicU64,
    failed: AtomicU64,
}

/// Four tasks checking one key without pause until `stop`; every answer is either a
/// decision (all allowed: the limit is far away) or a store error, never anything else.
fn load(
    limiter: &Arc<Limiter<RedisStore>>,
    stop: &Arc<AtomicBool>,
) -> (Arc<Tally>, Vec<tokio::task::JoinHandle<()>>) {
    let tally = Arc::new(Tally::default());
    let rule = Rule::new(
        "load",
        &RuleSpec::new(
            Algorithm::FixedWindow,
            1_000_000_000,
            Duration::from_secs(3600),
        ),
    )
    .unwrap();
    let tasks = (0..4)
        .map(|_| {
            let (limiter, stop, tally, rule) = (
                Arc::clone(limiter),
                Arc::clone(stop),
                Arc::clone(&tally),
                rule.clone(),
            );
            tokio::spawn(async move {
                let limits = [Limit {
                    rule: &rule,
                    key: "steady",
                }];
                while !stop.load(Ordering::Relaxed) {
                    match limiter.decide(&Check::new(&limits, 1)).await {
                        Ok(outcome) => {
                            assert!(outcome.decision.allowed, "{outcome:?}");
                            tally.decided.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(StoreError::InvalidCheck(e)) => panic!("{e}"),
                        Err(_) => {
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            })
        })
        .collect();
    (tally, tasks)
}

/// Waits, boundedly, until the deployment's replica is the master and its old master (if
/// `old_stays_up`) is not, then until a check of `limiter` is decided — which only the new
/// master can do. Returns the checks that failed meanwhile.
async fn until_decided_on_the_replica(
    deployment: &RedisSentinel,
    old_stays_up: bool,
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
) -> u64 {
    let (new, old) = (&deployment.replica, &deployment.master);
    let deadline = Instant::now() + FAILOVER_WITHIN;
    while !new.is_master() || (old_stays_up && old.is_master()) {
        assert!(
            Instant::now() < deadline,
            "no failover to {}; what the sentinels logged:\n{}",
            new.port,
            deployment.sentinel_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut failed = 0;
    while limiter.check(rule, "probe", 1).await.is_err() {
        failed += 1;
        assert!(
            Instant::now() < deadline,
            "no check decided after the failover to {}",
            new.port
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    failed
}

/// After the failover, a fresh key is counted where the new master keeps it: three of a
/// limit of three admitted, the fourth refused, and the key in the new master's keyspace.
async fn counted_on(server: &RedisServer, limiter: &Limiter<RedisStore>, test: &str) {
    let rule = Rule::new(
        "after",
        &RuleSpec::new(Algorithm::SlidingLog, 3, Duration::from_secs(60)),
    )
    .unwrap();
    for n in 0..4 {
        let decision = limiter.check(&rule, "fresh", 1).await.expect("decided");
        assert_eq!(decision.allowed, n < 3, "check {n}: {decision:?}");
    }
    let keys: Vec<String> = server
        .query(cmd("KEYS").arg(format!("sentinel:{test}:*fresh*")))
        .unwrap();
    assert!(
        !keys.is_empty(),
        "the new master holds no key of the checks"
    );
}

/// Runs `fail_over` on a deployment secured as `security` says, under load; `old_stays_up`
/// when the old master lives on as a replica.
async fn through_a_failover(
    test: &str,
    security: Security,
    old_stays_up: bool,
    fail_over: impl FnOnce(&RedisSentinel),
) {
    let started = Deployment::start(test, 3, security);
    let limiter = started.limiter(test).await;
    let deployment = &started.servers;
    let probe = Rule::new(
        "probe",
        &RuleSpec::new(
            Algorithm::FixedWindow,
            1_000_000_000,
            Duration::from_secs(3600),
        ),
    )
    .unwrap();
    limiter
        .check(&probe, "probe", 1)
        .await
        .expect("decided by the first master");

    let stop = Arc::new(AtomicBool::new(false));
    let (tally, tasks) = load(&limiter, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = tally.decided.load(Ordering::Relaxed);
    assert!(before > 0, "no check decided before the failover");

    fail_over(deployment);
    let failed_probes =
        until_decided_on_the_replica(deployment, old_stays_up, &limiter, &probe).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no load task panicked");
    }
    counted_on(&deployment.replica, &limiter, test).await;

    let (decided, failed) = (
        tally.decided.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
    );
    assert!(decided > before, "no check decided after the failover");
    // A dead master fails the checks sent to it; a demoted one may take them until the
    // sentinels reconfigure it (what it took is lost with its data, Sentinel's own window).
    assert!(
        old_stays_up || failed > 0,
        "the failover went by without a failed check"
    );
    // The limiter counted every failure as an error, none as a decision.
    let stats = limiter.stats();
    assert_eq!(stats.store_errors, failed + failed_probes);
    assert_eq!(stats.fallback_decisions, 0);
}

/// The master dies: the connection to it is refused until the sentinels promote the
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_sentinel_when_the_master_dies_under_load() {
    through_a_failover("killed", PLAIN, false, kill_the_master).await;
}

/// `SENTINEL FAILOVER`: the old master stays up as a replica and answers writes with
/// READONLY until the store moves to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_sentinel_when_the_master_is_demoted_under_load() {
    through_a_failover("demoted", PLAIN, true, demote_the_master).await;
}

/// TLS only, everywhere, and ACL users — the master's in the URL's user info, the
/// sentinels' own as parameters: the store finds the master, decides, and follows the
/// sentinels to the replica when the master dies, over TLS with the same credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_sentinel_over_tls_with_acl_users_when_the_master_dies_under_load() {
    let security = Security {
        tls: true,
        acl: true,
    };
    through_a_failover("tls-acl-killed", security, false, kill_the_master).await;
}

/// ACL users without TLS, through a `SENTINEL FAILOVER`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_sentinel_with_acl_users_when_the_master_is_demoted_under_load() {
    let security = Security {
        tls: false,
        acl: true,
    };
    through_a_failover("acl-demoted", security, true, demote_the_master).await;
}

fn kill_the_master(deployment: &RedisSentinel) {
    deployment.master.shutdown();
}

fn demote_the_master(deployment: &RedisSentinel) {
    let started: String = deployment.sentinels[0]
        .query(
            cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(RedisSentinel::MASTER_NAME),
        )
        .expect("SENTINEL FAILOVER");
    assert_eq!(started, "OK");
}

/// A wrong master password, a wrong sentinel password, an authority that did not sign the
/// deployment's certificates: each fails the connection with an error that says which
/// (the master's connection or the sentinels'), and shows no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_an_untrusted_authority_each_fail_saying_which() {
    let test = "refused";
    let security = Security {
        tls: true,
        acl: true,
    };
    let deployment = Deployment::start(test, 1, security);
    let refused = async |config: RedisStoreConfig| -> String {
        match RedisStore::connect(config).await {
            Err(err @ StoreError::Unavailable { .. }) => err.to_string(),
            other => panic!("not refused as unavailable: {other:?}"),
        }
    };
    let says = |err: &str, whose: &str, what: &str| {
        assert!(
            err.contains(whose) && err.contains(what),
            "not {whose:?} and {what:?}: {err}"
        );
        assert!(!err.contains("wrong-password"), "a password shown: {err}");
    };

    let master = deployment.url(Some("wrong-password"), None);
    let err = refused(deployment.config(&master, test)).await;
    says(
        &err,
        "the connection to the master",
        "authentication failed",
    );

    let sentinels = deployment.url(None, Some("wrong-password"));
    let err = refused(deployment.config(&sentinels, test)).await;
    says(
        &err,
        "the connection to the sentinels",
        "authentication failed",
    );

    let mut untrusted = deployment.config(&deployment.url(None, None), test);
    let elsewhere =
        std::env::temp_dir().join(format!("sluicegate-sentinel-other-{}", std::process::id()));
    untrusted.tls_ca = Some(std::fs::read(Authority::new(&elsewhere, "other").cert()).unwrap());
    let err = refused(untrusted).await;
    says(&err, "the connection to the sentinels", "UnknownIssuer");
}

/// One of two sentinels stopped, and the master too: the live sentinel has it down (and
/// cannot fail over alone), the stopped one refuses the connection. The error names the
/// master the live sentinel names and says that it refuses connections, and does not
/// blame the master's credentials or TLS for the sentinel's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_down_with_the_master_is_not_blamed_on_the_master() {
    let test = "sentinel-and-master-down";
    let deployment = Deployment::start(test, 2, PLAIN);
    let url = deployment.url(None, None);
    deployment.servers.sentinels[1].shutdown();
    deployment.servers.master.shutdown();
    // Two sentinels make a quorum of two: the live one alone sees the master subjectively
    // down (after its down-after of 1 s) and cannot fail over.
    let live = &deployment.servers.sentinels[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let master: std::collections::HashMap<String, String> = live
            .query(
                cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(RedisSentinel::MASTER_NAME),
            )
            .expect("SENTINEL MASTER");
        if master["flags"].contains("s_down") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sentinel never saw the master down: {master:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (err, named) = refused_naming_the_master(&deployment, &url, test).await;
    assert!(
        err.contains(&named) && !err.contains("the connection to the master"),
        "{err}"
    );
}

/// The error of connecting to `deployment` at `url` while its master is down, and what it
/// must say of that master: the sentinels name it, where, and that it refuses connections.
async fn refused_naming_the_master(
    deployment: &Deployment,
    url: &str,
    test: &str,
) -> (String, String) {
    let err = match RedisStore::connect(deployment.config(url, test)).await {
        Err(err @ StoreError::Unavailable { .. }) => err.to_string(),
        other => panic!("not refused as unavailable: {other:?}"),
    };
    let named = format!(
        "the sentinels answer and name master {} at 127.0.0.1:{}, which refuses connections",
        RedisSentinel::MASTER_NAME,
        deployment.servers.master.port
    );
    (err, named)
}

/// Every sentinel up, the master's process killed and no replica to promote: the
/// sentinels still name the master. The error says so — the sentinels answer, the master
/// they name, where, and that it refuses connections — not that no master came from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_the_sentinels_still_name_is_named_with_its_address() {
    let test = "master-down-sentinels-up";
    let deployment = Deployment::start(test, 1, PLAIN);
    let url = deployment.url(None, None);
    deployment.servers.replica.shutdown();
    deployment.servers.master.shutdown();
    let (err, named) = refused_naming_the_master(&deployment, &url, test).await;
    assert!(err.contains(&named), "{err}");
}
