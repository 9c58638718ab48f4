//! Two separate `sluicegate bench` processes × 32 tasks on one key of a real redis-server,
//! deciding with Redis TIME. From Redis' own record and the processes' counts, no rule
//! ever admits more than it may.

use sluicegate::internals::{KeyKind, key_pattern};
use sluicegate_test_support::{self as support, cmd};

use std::process::{Command, Output};
use std::time::Instant;

/// Runs two bench processes at once against one key; returns their admitted counts and
/// the wall time both took.
fn hammer(prefix: &str, rule: &[&str]) -> (u64, f64) {
    let url = support::standalone().url();
    let started = Instant::now();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args([
                "bench",
                "--store",
                &url,
                "--prefix",
                prefix,
                "--store-timeout",
                "2s",
            ])
            .args(rule)
            .args([
                "--keys",
                "1",
                "--concurrency",
                "32",
                "--duration",
                "2s",
                "--json",
            ])
            .output()
            .expect("run sluicegate bench")
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap(), b.join().unwrap())
    });
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = |out: &Output| -> u64 {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["errors"], serde_json::json!({}), "{report}");
        assert!(report["decisions"].as_u64().unwrap() > 1000, "{report}");
        report["allowed"].as_u64().unwrap()
    };
    (allowed(&a) + allowed(&b), elapsed)
}

/// The one state key under `prefix`.
fn state_key(prefix: &str) -> String {
    let keys: Vec<String> = support::standalone()
        .query(cmd("KEYS").arg(key_pattern(prefix, KeyKind::State)))
        .unwrap();
    let key = keys
        .iter()
        .find(|key| key.starts_with(prefix))
        .unwrap_or_else(|| panic!("no state key under {prefix}: {keys:?}"));
    key.to_owned()
}

#[test]
fn sliding_log_admits_exactly_its_limit() {
    let prefix = format!("conc-log-{}:", std::process::id());
    let (allowed, _) = hammer(
        &prefix,
        &[
            "--algorithm",
            "sliding-log",
            "--limit",
            "300",
            "--window",
            "1h",
        ],
    );
    assert_eq!(allowed, 300);
    // Redis' record: 300 entries, distinct members, all within the hour.
    let key = state_key(&prefix);
    let entries: u64 = support::standalone().query(cmd("ZCARD").arg(&key)).unwrap();
    assert_eq!(entries, 300);
}

#[test]
fn fixed_window_never_exceeds_its_limit() {
    let prefix = format!("conc-fixed-{}:", std::process::id());
    let (allowed, _) = hammer(
        &prefix,
        &[
            "--algorithm",
            "fixed-window",
            "--limit",
            "250",
            "--window",
            "10d",
        ],
    );
    let key = state_key(&prefix);
    let count: u64 = support::standalone()
        .query(cmd("HGET").arg(&key).arg("n"))
        .unwrap();
    assert!(count <= 250, "the window holds {count}");
    // Two runs of 2 s cross at most one 10-day boundary.
    assert!(
        allowed <= 500 && allowed >= count,
        "{allowed} admitted, {count} recorded"
    );
}

#[test]
fn token_bucket_never_exceeds_burst_plus_rate() {
    let prefix = format!("conc-gcra-{}:", std::process::id());
    // T = 10 ms, B = 20.
    let (allowed, elapsed) = hammer(
        &prefix,
        &[
            "--algorithm",
            "token-bucket",
            "--limit",
            "100",
            "--window",
            "1s",
            "--burst",
            "20",
        ],
    );
    let bound = 20.0 + elapsed / 0.010;
    assert!(
        (allowed as f64) <= bound,
        "{allowed} admitted > B + elapsed/T = {bound:.0}"
    );
    assert!(allowed >= 20 + 100, "{allowed} admitted in {elapsed:.1} s");
}
