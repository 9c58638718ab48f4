//! `sluicegate plan`: the Redis memory each algorithm and layout needs for a workload,
//! computed from measured constants, or measured on a real server with `--redis`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Result, anyhow};
use sluicegate::internals::saturating_micros;
use sluicegate::{
    Algorithm, Check, Limit, LogLayout, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store,
};

use super::redis_memory::{human_bytes, redis_bytes};

/// The workload.
pub(crate) struct Workload {
    /// Requests per second, all keys together.
    pub(crate) qps: f64,
    /// µs.
    pub(crate) window: u64,
    pub(crate) keys: u64,
    /// L; default: what one key sends in a window (everything admitted).
    pub(crate) limit: Option<u64>,
    pub(crate) buckets: u64,
}

/// One row: an algorithm (and layout) and the rule that represents it.
pub(crate) struct PlanRow {
    pub(crate) label: String,
    pub(crate) rule: Rule,
    pub(crate) layout: LogLayout,
    /// Live entries per key (sliding-log) or admissions to make it representative.
    pub(crate) entries: u64,
}

impl Workload {
    /// Units one key has live in a window.
    fn entries_per_key(&self) -> u64 {
        let sent = (self.qps / self.keys as f64 * self.window as f64 / 1e6).ceil() as u64;
        self.limit.map_or(sent, |l| sent.min(l)).max(1)
    }

    pub(crate) fn rows(&self) -> Result<Vec<PlanRow>> {
        let entries = self.entries_per_key();
        let limit = self.limit.unwrap_or(entries).max(1);
        let mut rows = Vec::new();
        for algorithm in Algorithm::ALL {
            let layouts: &[LogLayout] = if algorithm == Algorithm::SlidingLog {
                &[LogLayout::Zset, LogLayout::Compact]
            } else {
                &[LogLayout::Zset]
            };
            for &layout in layouts {
                let mut spec = RuleSpec::new(algorithm, limit, Duration::from_micros(self.window));
                match algorithm {
                    Algorithm::SlidingLog => spec.layout = Some(layout),
                    Algorithm::SlidingCounter => spec.buckets = Some(self.buckets),
                    _ => {}
                }
                let rule = Rule::new(&format!("plan-{}-{}", algorithm, layout.name()), &spec)
                    .map_err(|e| anyhow!("{algorithm}: --{e}"))?;
                let label = if algorithm == Algorithm::SlidingLog {
                    format!("{algorithm} ({})", layout.name())
                } else {
                    algorithm.to_string()
                };
                rows.push(PlanRow {
                    label,
                    rule,
                    layout,
                    entries,
                });
            }
        }
        Ok(rows)
    }
}

/// Measures every row on the Redis at `url`, under a throwaway prefix of this process.
pub(crate) async fn measure_on(url: &str, rows: &[PlanRow]) -> Result<Vec<u64>> {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = format!("sluicegate:plan:{}:", std::process::id());
    config.timeout = Duration::from_secs(5);
    // A throwaway prefix leaves nothing behind: no epoch marker either.
    config.lost_state_check_interval = Duration::ZERO;
    let store = RedisStore::connect(config).await?;
    let mut bytes = Vec::new();
    for row in rows {
        bytes.push(measure(&store, row).await?);
    }
    Ok(bytes)
}

/// Writes one representative key of `row` through `store` (with the caller's clock, so the
/// entries all stay live), measures it with MEMORY USAGE, and deletes it.
async fn measure(store: &RedisStore, row: &PlanRow) -> Result<u64> {
    let key = "representative";
    let limits = [Limit {
        rule: &row.rule,
        key,
    }];
    let start: u64 = 1_700_000_000_000_000;
    let admissions = match row.rule.algorithm() {
        Algorithm::SlidingLog => row.entries,
        Algorithm::SlidingCounter => row.rule.buckets() + 1,
        _ => 1,
    };
    let step = match row.rule.algorithm() {
        // One admission in every bucket the estimate reads.
        Algorithm::SlidingCounter => saturating_micros(row.rule.window()) / row.rule.buckets(),
        _ => 1,
    };
    for i in 0..admissions {
        let check = Check {
            at: Some(Duration::from_micros(start + i * step)),
            ..Check::new(&limits, 1)
        };
        store.check(&check).await?;
    }
    let bytes = store.memory_usage(&row.rule, key).await?.unwrap_or(0);
    store.forget(&row.rule, key).await?;
    Ok(bytes)
}

/// The table: per key and for every key, computed and, when measured, measured.
pub(crate) fn table(workload: &Workload, rows: &[PlanRow], measured: Option<&[u64]>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} keys, {} requests/s, window {}: {} live entries per key",
        workload.keys,
        workload.qps,
        sluicegate::internals::format_duration(workload.window),
        workload.entries_per_key()
    );
    let _ = writeln!(
        out,
        "{:<24} {:>14} {:>14} {:>16} {:>16}",
        "algorithm", "per key", "all keys", "measured/key", "measured, all"
    );
    for (i, row) in rows.iter().enumerate() {
        let per_key = redis_bytes(&row.rule, row.layout, row.entries);
        let (m_key, m_all) = measured.map_or((String::from("-"), String::from("-")), |m| {
            (format!("{} B", m[i]), human_bytes(m[i] * workload.keys))
        });
        let _ = writeln!(
            out,
            "{:<24} {:>12} B {:>14} {:>16} {:>16}",
            row.label,
            per_key,
            human_bytes(per_key * workload.keys),
            m_key,
            m_all
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_follow_rate_window_and_limit() {
        let mut w = Workload {
            qps: 1000.0,
            window: 60_000_000,
            keys: 100,
            limit: None,
            buckets: 10,
        };
        assert_eq!(w.entries_per_key(), 600);
        w.limit = Some(100);
        assert_eq!(w.entries_per_key(), 100);
        let rows = w.rows().unwrap();
        assert_eq!(rows.len(), 6);
        let text = table(&w, &rows, None);
        assert!(text.contains("sliding-log (compact)"), "{text}");
        // 100 keys × (140 + (20 + 4 × 100) × 9/8) bytes: 4-byte entries under a minute.
        assert!(text.contains("612 B"), "{text}");
        assert!(text.contains("59.8 KiB"), "{text}");
    }
}
