//! The `sluicegate` binary end to end: real processes, real sockets.

use sluicegate_test_support as support;

use crate::replay;
use crate::server;

use replay::replay;
use server::Server;

use std::process::Command;

fn sluicegate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluicegate"))
}

/// docs/SPEC.md's classic sliding-log trace in µs, with a comment, a blank line, a second
/// key and a request id.
/// Key b's unit admitted at 0.9 s has left its window at 1.9 s, so the peek finds 2 left.
#[test]
fn replay_decides_a_file() {
    let input = "\
# the classic trace: W = 1000 ms, L = 3
100000,a,1
400000,a,1
800000,a,1
900000,a,1

900000,b,1,r1
1200000,a,1
1500000,a,1
1600000,a,1
1900000,a,1
1900000,b,0
";
    let out = replay(
        &[
            "--algorithm",
            "sliding-log",
            "--limit",
            "3",
            "--window",
            "1s",
        ],
        input,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = "\
100000,a,1,1,2,0,1000000,0
400000,a,1,1,1,0,1000000,0
800000,a,1,1,0,0,1000000,0
900000,a,1,0,0,200000,900000,0
900000,b,1,1,2,0,1000000,0
1200000,a,1,1,0,0,1000000,0
1500000,a,1,1,0,0,1000000,0
1600000,a,1,0,0,200000,900000,0
1900000,a,1,1,0,0,1000000,0
1900000,b,0,1,2,0,1000000,0
";
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
}

#[test]
fn replay_stops_at_a_malformed_line() {
    let fixed = [
        "--algorithm",
        "fixed-window",
        "--limit",
        "3",
        "--window",
        "1s",
    ];
    let out = replay(&fixed, "1,a,1\n2,a,1\n3,a,lots\n4,a,1\n");
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 3: cost \"lots\""), "{stderr}");
    // Lines before the bad one were decided and written.
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 2);

    let out = replay(&fixed, "5,a,1\n4,a,1\n");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 2: time_us 4 is before"), "{stderr}");

    // The mode column: a mode that is none, and one that needs a request id without one.
    for (input, says) in [
        (
            "1,a,1\n2,a,1,,lend\n",
            "line 2: mode \"lend\" is not one of",
        ),
        (
            "1,a,1,,report\n2,a,1\n3,a,1,,settle\n",
            "line 3: mode settle needs a request_id",
        ),
    ] {
        let out = replay(&fixed, input);
        assert!(!out.status.success(), "{input}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn replay_rejects_a_bad_rule() {
    let out = replay(
        &[
            "--algorithm",
            "sliding-counter",
            "--limit",
            "200000000",
            "--window",
            "1d",
        ],
        "",
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("--window: window 1d with limit 200000000 exceeds 2^53"),
        "{stderr}"
    );
}

#[test]
fn serve_answers_the_documented_calls_and_exits_cleanly() {
    let server = Server::binary(&[]);
    let (status, body) = server.request("GET", "/healthz", "");
    assert_eq!((status, body.trim()), (200, "ok"));
    // The README's curl call, against the example rules (5 per 10 s per user).
    let check =
        r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    let answers: Vec<String> = (0..6)
        .map(|_| server.request("POST", "/v1/check", check).1)
        .collect();
    assert!(answers[0].contains(r#""allowed":true"#), "{}", answers[0]);
    assert!(answers[0].contains(r#""remaining":4"#), "{}", answers[0]);
    assert!(
        answers[5].starts_with(r#"{"allowed":false"#),
        "{}",
        answers[5]
    );
    let (status, body) = server.request("POST", "/v1/check", "{not json");
    assert_eq!(status, 400, "{body}");
    assert!(
        server.stop().success(),
        "SIGTERM ends the server with status 0"
    );
}

#[test]
fn serve_refuses_a_bad_config_naming_file_and_line() {
    let dir = std::env::temp_dir().join(format!("sluicegate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      algorithm: token-bucket\n      burst: 0\n",
    )
    .unwrap();
    let out = sluicegate()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("bad.yaml"), "{stderr}");
    assert!(stderr.contains("line 5"), "{stderr}");
    assert!(
        stderr.contains("rate_limit.burst: burst must be at least 1"),
        "{stderr}"
    );
}

/// `SLUICEGATE_STORE_DURABILITY=replicated` (the env twin of `--store-durability`) on a
/// Redis without a replica, or on the in-memory store, stops the start naming the flag.
#[test]
fn replicated_durability_without_a_replica_stops_the_start() {
    let alone = support::RedisServer::start(&[]);
    for store in [alone.url(), "memory".to_owned()] {
        let out = sluicegate()
            .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
            .env("SLUICEGATE_STORE_DURABILITY", "replicated")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{store}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("--store-durability replicated"),
            "{store}: {stderr}"
        );
    }
}

/// Each store-failure policy seen end to end: serve on a real redis-server, stop it, ask.
#[test]
fn store_failure_policies_through_the_http_api() {
    let config =
        std::env::temp_dir().join(format!("sluicegate-policies-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        "domain: d
descriptors:
  - key: user
    rate_limit: {window: 1h, requests_per_unit: 4}
  - key: vip
    rate_limit: {window: 1h, requests_per_unit: 4, on_store_error: allow}
",
    )
    .unwrap();
    let redis = support::RedisServer::start(&[]);
    let check = |entry: &str| {
        format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{entry}","value":"u1"}}]}}]}}"#
        )
    };
    let servers: Vec<(&str, Server)> = ["error", "deny", "local"]
        .into_iter()
        .map(|policy| {
            let server = Server::start(&[
                "--config",
                config.to_str().unwrap(),
                "--store",
                &redis.url(),
                "--prefix",
                &format!("policy-{policy}-{}:", std::process::id()),
                "--on-store-error",
                policy,
                "--instances",
                "2",
                "--store-timeout",
                "100ms",
                "--breaker-min-calls",
                "3",
            ]);
            (policy, server)
        })
        .collect();
    for (_, server) in &servers {
        let (status, body) = server.request("POST", "/v1/check", &check("user"));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""decided_by":"store""#), "{body}");
        // One check, alone: one script call.
        assert_eq!(server.metric("sluicegate_redis_script_calls_total"), 1);
        assert_eq!(server.metric("sluicegate_redis_script_checks_total"), 1);
    }
    redis.shutdown();
    for (policy, server) in &servers {
        let answers: Vec<(u16, String)> = (0..3)
            .map(|_| server.request("POST", "/v1/check", &check("user")))
            .collect();
        match *policy {
            "error" => assert!(answers.iter().all(|(s, _)| *s == 503), "{answers:?}"),
            "deny" => assert!(
                answers.iter().all(|(s, b)| *s == 200
                    && b.contains(r#""allowed":false"#)
                    && b.contains(r#""decided_by":"fallback-deny""#)),
                "{answers:?}"
            ),
            _ => {
                // L = 4 over 2 instances: 2 locally, then refused.
                let allowed: Vec<bool> = answers
                    .iter()
                    .map(|(_, b)| b.starts_with(r#"{"allowed":true"#))
                    .collect();
                assert_eq!(allowed, [true, true, false], "{answers:?}");
                assert!(answers.iter().all(|(_, b)| b.contains("fallback-local")));
                // What it admitted is owed to Redis until Redis is back.
                assert_eq!(server.metric("sluicegate_fallback_owed_units"), 2);
                assert_eq!(server.metric("sluicegate_fallback_owed_keys"), 1);
            }
        }
        // The failures opened the breaker (--breaker-min-calls 3), and the change is
        // counted.
        let opened = server.metric(r#"sluicegate_breaker_transitions_total{to="open"}"#);
        assert!(opened >= 1, "{policy}: the breaker opened {opened} times");
        // A rule's own policy beats the server's.
        let (status, body) = server.request("POST", "/v1/check", &check("vip"));
        assert_eq!(status, 200, "{policy}: {body}");
        assert!(
            body.contains(r#""decided_by":"fallback-allow""#),
            "{policy}: {body}"
        );
    }
    for (_, server) in servers {
        assert!(server.stop().success());
    }
}

fn user_config(limit: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit:\n      window: 1h\n      requests_per_unit: {limit}\n"
    )
}

#[test]
fn configuration_reloads_on_sighup_and_on_change_and_a_bad_one_keeps_the_old() {
    let path = std::env::temp_dir().join(format!("sluicegate-reload-{}.yaml", std::process::id()));
    std::fs::write(&path, user_config("1")).unwrap();
    let server = Server::binary(&[
        "--config",
        path.to_str().unwrap(),
        "--reload-interval",
        "1h",
    ]);
    let check = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let allowed = |server: &Server| {
        server
            .request("POST", "/v1/check", check)
            .1
            .starts_with(r#"{"allowed":true"#)
    };
    let hangup = |server: &Server| {
        let pid = server.pid().to_string();
        assert!(
            Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    assert!(allowed(&server));
    assert!(!allowed(&server));

    // A bad configuration is rejected, counted, and the old one keeps serving.
    std::fs::write(&path, user_config("-1")).unwrap();
    hangup(&server);
    server.wait_for_metric("sluicegate_config_errors_total", 1);
    assert!(!allowed(&server), "the old limit of 1 still holds");

    // A good one replaces it: a new limit is a new rule, with its own state.
    std::fs::write(&path, user_config("3")).unwrap();
    hangup(&server);
    server.wait_for_metric("sluicegate_config_loads_total", 2);
    assert!(allowed(&server));
    assert!(server.stop().success());

    // Without a signal, an edited file is noticed by itself.
    let watching = Server::start(&[
        "--config",
        path.to_str().unwrap(),
        "--reload-interval",
        "50ms",
    ]);
    // A different length too, so even a coarse modification time cannot hide the edit.
    std::fs::write(&path, user_config("17")).unwrap();
    watching.wait_for_metric("sluicegate_config_loads_total", 2);
    let (_, rules) = watching.request("GET", "/v1/rules", "");
    assert!(rules.contains(r#""limit":17"#), "{rules}");
    assert!(watching.stop().success());
}

/// `--max-keys` caps the in-memory store: under `--on-full refuse` a check that would add
/// an entry past it is refused (never 503), while keys already held go on deciding.
#[test]
fn serve_caps_the_memory_store_at_max_keys() {
    let server = Server::start(&[
        "--max-keys",
        "2",
        "--max-rule-share",
        "1",
        "--on-full",
        "refuse",
    ]);
    let check = |user: &str| {
        server.request(
            "POST",
            "/v1/check",
            &format!(
                r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
            ),
        )
    };
    assert_eq!(check("a").0, 200);
    assert_eq!(check("b").0, 200);
    let (status, body) = check("c");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""allowed":false"#), "{body}");
    assert_eq!(check("a").0, 200, "a key already held still decides");
    assert!(server.stop().success());
}

/// A sliding log's layout decides what Redis does: the bench report names it.
#[test]
fn bench_names_the_layout_it_measured() {
    let out = sluicegate()
        .args(["bench", "--algorithm", "sliding-log", "--layout", "compact"])
        .args([
            "--limit",
            "10",
            "--window",
            "1s",
            "--duration",
            "200ms",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["workload"], "sliding-log (compact)", "{report}");
}

/// With every timeout turned off (`0s`, as `--help` says), requests are still answered.
#[test]
fn timeouts_turned_off_with_0s_still_answer() {
    let server = Server::start(&[
        "--body-timeout",
        "0s",
        "--header-timeout",
        "0s",
        "--idle-timeout",
        "0s",
    ]);
    let (status, body) = server.request(
        "POST",
        "/v1/check",
        r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"off"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with(r#"{"allowed":true"#), "{body}");
    assert!(server.stop().success());
}
