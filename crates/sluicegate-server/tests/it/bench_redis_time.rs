//! `sluicegate bench` on Redis reports Redis' own time per decision (INFO commandstats)
//! beside decisions per second: held here to what a redis-server of the test's own says.

use std::process::Command;

use sluicegate_test_support::{RedisServer, cmd};

/// `INFO commandstats` of `command` (lower case): (calls, usec).
fn command_stats(redis: &RedisServer, command: &str) -> (u64, u64) {
    let info: String = redis.query(cmd("INFO").arg("commandstats")).unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(fields) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("calls"), field("usec"))
}

/// Runs bench with `concurrency` checks in flight for a second; its JSON report.
fn bench(redis: &RedisServer, concurrency: usize) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["bench", "--store", &redis.url()])
        .args(["--algorithm", "sliding-log", "--limit", "1000000"])
        .args(["--window", "1h", "--keys", "100", "--duration", "1s"])
        .args(["--concurrency", &concurrency.to_string(), "--json"])
        .output()
        .expect("run sluicegate bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn bench_reports_redis_time_per_decision() {
    for concurrency in [1, 64] {
        // A server of its own: its counters are this run's alone.
        let redis = RedisServer::start(&[]);
        let report = bench(&redis, concurrency);
        let cost = &report["redis"];
        assert_eq!(cost["command"], "FCALL", "{report}");
        let decisions = report["decisions"].as_u64().unwrap();
        assert!(decisions > 0, "{report}");
        // Every check Redis ran was a decision: no errors, nothing counted twice.
        assert_eq!(cost["checks"].as_u64().unwrap(), decisions, "{report}");
        let (calls, usec) = command_stats(&redis, "fcall");
        assert_eq!(cost["script_calls"].as_u64().unwrap(), calls, "{report}");
        let per_decision = cost["us_per_decision"].as_f64().unwrap();
        assert!(
            (per_decision * decisions as f64 - usec as f64).abs() < 1.0,
            "{report}: the server says {usec} µs in {calls} calls"
        );
        if concurrency == 1 {
            // A lone check is a call of its own.
            assert_eq!(calls, decisions, "{report}");
        } else {
            assert!(calls < decisions, "{report}: not batched");
        }
    }
}
