//! The service with a fault-injecting proxy between it and a real redis-server
//! (`FaultProxy`): under each fault and each failure policy, every check is answered
//! within the store timeout and a margin, by the policy while Redis cannot decide, by the
//! store again once it can — and the store never admits more than L across the fault.

use crate::server;

use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::{self as support, Direction, FaultProxy};

/// The rule under test: L per hour, so no window rolls during a test.
const L: u64 = 20;
const CONFIG: &str = "domain: faults
descriptors:
  - key: user
    rate_limit: {algorithm: sliding-log, window: 1h, requests_per_unit: 20}
";
/// The store timeout the service runs with, and the margin an answer may take beyond it
/// on a loaded machine (a fresh client connection per request included).
const TIMEOUT: Duration = Duration::from_millis(100);
const MARGIN: Duration = Duration::from_millis(400);

/// One check's answer: who decided (`None`: the service answered 503) and whether it was
/// allowed, and how long it took.
struct Answer {
    decided_by: Option<String>,
    allowed: bool,
    took: Duration,
}

impl Answer {
    fn by_store(&self) -> bool {
        self.decided_by.as_deref() == Some("store")
    }
}

/// The service on `proxy`, deciding with its policy when the store cannot.
struct Setup {
    server: Server,
    proxy: FaultProxy,
    _config: TempConfig,
}

/// A configuration file, removed when dropped.
struct TempConfig(std::path::PathBuf);

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn setup(policy: &str, test: &str) -> Setup {
    let proxy = FaultProxy::start(support::standalone().port);
    let path = std::env::temp_dir().join(format!(
        "sluicegate-faults-{}-{test}-{policy}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    let prefix = format!("faults-{}-{test}-{policy}:", std::process::id());
    let server = Server::start(&[
        "--config",
        path.to_str().unwrap(),
        "--store",
        &proxy.url(),
        "--prefix",
        &prefix,
        "--store-timeout",
        "100ms",
        "--on-store-error",
        policy,
        "--breaker-cool-down",
        "200ms",
        "--no-negative-cache",
    ]);
    Setup {
        server,
        proxy,
        _config: TempConfig(path),
    }
}

/// One check of user `alice`.
fn check(server: &Server) -> Answer {
    let body =
        r#"{"domain":"faults","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    let started = Instant::now();
    let (status, body) = server.request("POST", "/v1/check", body);
    let took = started.elapsed();
    if status == 503 {
        return Answer {
            decided_by: None,
            allowed: false,
            took,
        };
    }
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    Answer {
        decided_by: Some(answer["decided_by"].as_str().unwrap().to_owned()),
        allowed: answer["allowed"].as_bool().unwrap(),
        took,
    }
}

/// Checks until the store decides one, for at most 5 s: the answers, that one last.
fn until_the_store_decides(server: &Server) -> Vec<Answer> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answers = Vec::new();
    loop {
        let answer = check(server);
        let done = answer.by_store();
        answers.push(answer);
        if done {
            return answers;
        }
        assert!(Instant::now() < deadline, "the store never decided again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks until the store refuses: how many it admitted on the way.
fn store_admits_until_full(server: &Server) -> u64 {
    for admitted in 0..=L * 2 {
        let answer = check(server);
        assert!(answer.by_store(), "{:?}", answer.decided_by);
        if !answer.allowed {
            return admitted;
        }
    }
    panic!("the store admitted more than 2L");
}

fn assert_answered_in_time(answers: &[Answer], what: &str) {
    for answer in answers {
        assert!(
            answer.took < TIMEOUT + MARGIN,
            "{what}: an answer took {:?}",
            answer.took
        );
    }
}

/// A stalled connection (Redis unreachable, sockets open): each policy answers within
/// the timeout, and after the stall the store decides again without admitting beyond L.
#[test]
fn a_stall_is_answered_in_time_by_each_policy_and_the_store_resumes_within_l() {
    for policy in ["error", "allow", "deny", "local"] {
        let Setup { server, proxy, .. } = setup(policy, "stall");
        let before: Vec<Answer> = (0..5).map(|_| check(&server)).collect();
        assert!(before.iter().all(|a| a.by_store() && a.allowed), "{policy}");

        proxy.stall();
        let during: Vec<Answer> = (0..6).map(|_| check(&server)).collect();
        assert_answered_in_time(&during, policy);
        for answer in &during {
            match policy {
                "error" => assert_eq!(answer.decided_by, None, "{policy}: not decided"),
                _ => assert_eq!(
                    answer.decided_by.as_deref(),
                    Some(format!("fallback-{policy}").as_str()),
                    "{policy}"
                ),
            }
            match policy {
                "allow" => assert!(answer.allowed),
                "deny" | "error" => assert!(!answer.allowed),
                _ => {}
            }
        }

        let resumed = Instant::now();
        proxy.resume();
        let recovering = until_the_store_decides(&server);
        let recovered_after = resumed.elapsed();
        assert_answered_in_time(&recovering, policy);
        // The recovering check the store decided counts against L too.
        let last = recovering.last().unwrap();
        let store_admitted = 5 + u64::from(last.allowed) + store_admits_until_full(&server);
        // Checks that timed out in the stall may have reached Redis once it resumed and
        // taken units; the store admits at most L in all.
        let timed_out = during.iter().filter(|a| a.took >= TIMEOUT).count() as u64;
        // What `local` admitted in the stall is written back before the store decides the
        // key again: with it, this one instance admits at most L in all.
        let admitted_locally = match policy {
            "local" => during.iter().filter(|a| a.allowed).count() as u64,
            _ => 0,
        };
        eprintln!(
            "{policy}: stalled answers took {:?}; store decided again {recovered_after:?} \
             after the stall; store admitted {store_admitted} of L = {L} ({timed_out} \
             checks timed out in the stall)",
            during.iter().map(|a| a.took).collect::<Vec<_>>()
        );
        assert!(
            store_admitted + admitted_locally <= L,
            "{policy}: {store_admitted} + {admitted_locally} > {L}"
        );
        assert!(
            store_admitted + admitted_locally + timed_out >= L,
            "{policy}: {store_admitted}"
        );
    }
}

/// Latency below the timeout costs time, not decisions; dropped, reset and half-closed
/// connections cost at most the checks in flight, each answered in time, and the store
/// decides again within seconds — never admitting beyond L.
#[test]
fn dropped_reset_half_closed_and_slow_connections_are_survived_within_l() {
    let Setup { server, proxy, .. } = setup("error", "faults");
    let admitted = |answers: &[Answer]| -> u64 {
        answers.iter().filter(|a| a.by_store() && a.allowed).count() as u64
    };
    // The first check loads the script (more round trips than a check): before latency.
    let warm = check(&server);
    assert!(warm.by_store() && warm.allowed);
    proxy.set_latency(Duration::from_millis(20));
    let slow: Vec<Answer> = (0..3).map(|_| check(&server)).collect();
    assert!(slow.iter().all(Answer::by_store));
    assert!(slow.iter().all(|a| a.took >= Duration::from_millis(40)));
    assert_answered_in_time(&slow, "latency");
    let mut store_admitted = 1 + admitted(&slow);
    proxy.set_latency(Duration::ZERO);

    let faults: [(&str, &dyn Fn()); 4] = [
        ("drop", &|| proxy.drop_connections()),
        ("reset", &|| proxy.reset()),
        ("half-close to client", &|| {
            proxy.half_close(Direction::ToClient)
        }),
        ("half-close to server", &|| {
            proxy.half_close(Direction::ToServer)
        }),
    ];
    for (name, fault) in faults {
        assert!(check(&server).by_store(), "{name}: healthy before");
        store_admitted += 1;
        fault();
        let started = Instant::now();
        let answers = until_the_store_decides(&server);
        assert_answered_in_time(&answers, name);
        eprintln!(
            "{name}: {} failed checks, store decided again after {:?}",
            answers.len() - 1,
            started.elapsed()
        );
        store_admitted += admitted(&answers);
    }
    store_admitted += store_admits_until_full(&server);
    eprintln!("store admitted {store_admitted} of L = {L} across the faults");
    // A check whose connection broke after Redis ran it took units it was not told of:
    // at most one per fault.
    assert!(store_admitted <= L, "{store_admitted} > {L}");
    assert!(store_admitted + 4 >= L, "{store_admitted}");
}

/// A connection gone silent for good — no FIN, no RST: a middlebox that forgot the flow —
/// fails each check in time, and once Redis has been silent on it for a script call's
/// hold (10 store timeouts, at least 1 s) the store moves to a new connection.
#[test]
fn a_blackholed_connection_is_replaced() {
    let Setup { server, proxy, .. } = setup("error", "blackhole");
    assert!(check(&server).by_store());
    proxy.blackhole();
    let started = Instant::now();
    let answers = until_the_store_decides(&server);
    let recovered_after = started.elapsed();
    assert_answered_in_time(&answers, "blackhole");
    eprintln!(
        "blackhole: {} failed checks, store decided again after {recovered_after:?}",
        answers.len() - 1
    );
    // The hold, a breaker cool-down, a reconnection and a loaded machine.
    assert!(
        recovered_after < Duration::from_secs(3),
        "{recovered_after:?}"
    );
}
