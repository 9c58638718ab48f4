//! A Redis that may evict keys can reset limits silently: the service reads each server's
//! `maxmemory-policy` (CONFIG GET, or INFO memory where CONFIG is renamed away), names the
//! risk in `/readyz` and `/metrics`, and with `--require-noeviction` is not ready. Each
//! server's replicas and `min-replicas-to-write` are read along with it, and matter under
//! `--store-durability replicated`.

use crate::server;

use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::{RedisCluster, RedisServer, cmd};

/// Asks `GET /readyz` until `want` holds of its answer, for at most 10 s; the last answer.
fn readyz_until(server: &Server, want: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = server.request("GET", "/readyz", "");
        if want(status, &body) || Instant::now() >= deadline {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metrics(server: &Server) -> String {
    server.request("GET", "/metrics", "").1
}

#[test]
fn an_evicting_redis_is_named_in_readyz_and_metrics() {
    let redis = RedisServer::start(&["--maxmemory-policy", "allkeys-lru"]);
    let server = Server::start(&["--store", &redis.url()]);
    let (status, body) = server.request("GET", "/readyz", "");
    assert_eq!(status, 200, "{body}");
    let named = format!("redis at {} has maxmemory-policy allkeys-lru", redis.url());
    assert!(body.starts_with("ready\nwarning: "), "{body}");
    assert!(body.contains(&named), "{body}");
    assert!(body.contains("noeviction"), "says what to set: {body}");
    let text = metrics(&server);
    assert!(
        text.contains("sluicegate_redis_evicting{policy=\"allkeys-lru\"} 1"),
        "{text}"
    );
}

#[test]
fn require_noeviction_refuses_readiness_naming_the_policy() {
    let redis = RedisServer::start(&["--maxmemory-policy", "volatile-ttl"]);
    let server = Server::start(&["--store", &redis.url(), "--require-noeviction"]);
    let (status, body) = server.request("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready (--require-noeviction): "),
        "{body}"
    );
    assert!(body.contains("maxmemory-policy volatile-ttl"), "{body}");
}

#[test]
fn a_noeviction_redis_is_ready_without_a_warning() {
    let redis = RedisServer::start(&["--maxmemory-policy", "noeviction"]);
    let server = Server::start(&["--store", &redis.url(), "--require-noeviction"]);
    assert_eq!(
        server.request("GET", "/readyz", ""),
        (200, "ready\n".to_owned())
    );
    let text = metrics(&server);
    assert!(
        text.contains("sluicegate_redis_evicting{policy=\"noeviction\"} 0"),
        "{text}"
    );
}

/// Managed Redis often renames CONFIG away: the policy is read from INFO memory then.
#[test]
fn with_config_renamed_away_the_policy_comes_from_info() {
    let redis = RedisServer::start(&[
        "--maxmemory-policy",
        "volatile-lfu",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    assert!(
        redis
            .query::<()>(cmd("CONFIG").arg("GET").arg("*"))
            .is_err()
    );
    let server = Server::start(&["--store", &redis.url(), "--require-noeviction"]);
    let (status, body) = server.request("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("maxmemory-policy volatile-lfu"), "{body}");
    assert!(
        metrics(&server).contains("sluicegate_redis_evicting{policy=\"volatile-lfu\"} 1"),
        "{}",
        metrics(&server)
    );
}

/// The policy is read again while the service runs: a change is seen within the interval.
#[test]
fn a_policy_changed_at_run_time_is_seen_within_the_check_interval() {
    let redis = RedisServer::start(&["--maxmemory-policy", "noeviction"]);
    let server = Server::start(&[
        "--store",
        &redis.url(),
        "--require-noeviction",
        "--eviction-check-interval",
        "200ms",
    ]);
    assert_eq!(server.request("GET", "/readyz", "").0, 200);
    let set = |policy: &str| {
        redis
            .query::<()>(cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg(policy))
            .unwrap();
    };
    set("allkeys-random");
    let (status, body) = readyz_until(&server, |status, _| status == 503);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("maxmemory-policy allkeys-random"), "{body}");
    set("noeviction");
    let (status, body) = readyz_until(&server, |status, _| status == 200);
    assert_eq!((status, body.as_str()), (200, "ready\n"));
}

/// On a cluster every master is read: one evicting master is enough to be named.
#[test]
fn on_a_cluster_each_master_is_read() {
    // A cluster of its own: its masters' policies are changed.
    let cluster = RedisCluster::start(3, 0);
    let masters = cluster.current_masters();
    let evicting = masters[1];
    let set = |node: &RedisServer, policy: &str| {
        node.query::<()>(cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg(policy))
            .unwrap();
    };
    for master in &masters {
        set(master, "noeviction");
    }
    set(evicting, "allkeys-lfu");
    let server = Server::start(&["--store", &cluster.url(), "--require-noeviction"]);
    let (status, body) = server.request("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    let named = format!(
        "redis at 127.0.0.1:{} has maxmemory-policy allkeys-lfu",
        evicting.port
    );
    assert!(body.contains(&named), "{body}");
    // The other masters are not named.
    for master in masters.iter().filter(|m| m.port != evicting.port) {
        assert!(!body.contains(&format!(":{} ", master.port)), "{body}");
    }
    let text = metrics(&server);
    assert!(
        text.contains("sluicegate_redis_evicting{policy=\"allkeys-lfu\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sluicegate_redis_evicting{policy=\"noeviction\"} 0"),
        "{text}"
    );
    set(evicting, "noeviction");
}

/// The binary says so in its log at start, naming the risk.
#[test]
fn the_risk_is_logged_at_start() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let redis = RedisServer::start(&["--maxmemory-policy", "allkeys-lru"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &redis.url()])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The warning comes before the server says it listens.
    let logged: Vec<String> = lines
        .map_while(Result::ok)
        .take_while(|line| !line.contains("sluicegate listening"))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    let warning = logged
        .iter()
        .find(|line| line.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning in {logged:?}"));
    assert!(
        warning.contains("limits at risk of silent reset"),
        "{warning}"
    );
    assert!(
        warning.contains("has maxmemory-policy allkeys-lru"),
        "{warning}"
    );
}

/// Under `--store-durability replicated`: the master's replicas and write guard are in
/// `/metrics`; once its replica is gone, `/readyz` names it, and a check that admits is
/// answered by the failure policy and counted as not replicated.
#[test]
fn replicated_durability_names_a_master_without_replica_and_its_policy_answers() {
    let master = RedisServer::start(&[]);
    let port = master.port.to_string();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while master.online_replicas() != 1 {
        assert!(Instant::now() < deadline, "the replica never came online");
        std::thread::sleep(Duration::from_millis(20));
    }
    let config =
        std::env::temp_dir().join(format!("sluicegate-durability-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {window: 1h, requests_per_unit: 4}\n",
    )
    .unwrap();
    let server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        &master.url(),
        "--store-durability",
        "replicated",
        // WAIT is given half the store timeout: room for the replica's acknowledgement
        // while every other test of the binary runs beside this one.
        "--store-timeout",
        "2s",
        "--on-store-error",
        "deny",
        "--eviction-check-interval",
        "200ms",
    ]);
    let node = format!("node=\"{}\"", master.url());
    let text = metrics(&server);
    assert!(
        text.contains(&format!("sluicegate_redis_replicas{{{node}}} 1")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "sluicegate_redis_min_replicas_to_write{{{node}}} 0"
        )),
        "{text}"
    );
    let check = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}"#;
    let (status, body) = server.request("POST", "/v1/check", check);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""allowed":true"#) && body.contains(r#""decided_by":"store""#),
        "{body}"
    );
    assert_eq!(server.metric("sluicegate_redis_not_replicated_total"), 0);

    replica.shutdown();
    let (status, body) = readyz_until(&server, |_, body| body.contains("warning:"));
    assert_eq!(status, 200, "{body}");
    let named = format!("redis at {} has no replica online", master.url());
    assert!(body.contains(&named), "{body}");
    let (status, body) = server.request("POST", "/v1/check", check);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""allowed":false"#) && body.contains(r#""decided_by":"fallback-deny""#),
        "{body}"
    );
    assert_eq!(server.metric("sluicegate_redis_not_replicated_total"), 1);
}
