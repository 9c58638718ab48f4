//! How much Redis memory an algorithm's state takes, from constants measured with
//! `MEMORY USAGE`: what `simulate` and `plan` estimate with.

use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, LogLayout, Rule};

/// Redis bytes for one key's state, from `MEMORY USAGE` on Redis 7.0 with sluicegate's key
/// names (about 70 bytes): a hash of 2–3 small fields takes 184 bytes; a sliding counter
/// adds about 20 per bucket; a zset log about 36 per entry while Redis keeps it as a
/// listpack (up to 128 entries) and 116 per entry as a skiplist; a compact log's string
/// is a 20-byte header and w bytes per live entry, sized to fill its allocation
/// (an eighth more on average). `sluicegate plan --redis` measures them on a real server.
pub(crate) fn redis_bytes(rule: &Rule, layout: LogLayout, entries: u64) -> u64 {
    match rule.algorithm() {
        Algorithm::SlidingLog => match layout {
            LogLayout::Zset if entries <= 128 => 140 + 36 * entries,
            LogLayout::Zset => 200 + 116 * entries,
            LogLayout::Compact => {
                let width = compact_entry_width(saturating_micros(rule.window()));
                140 + (20 + width * entries) * 9 / 8
            }
        },
        Algorithm::SlidingCounter => 184 + 20 * rule.buckets().saturating_sub(1),
        Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::LeakyBucket => 184,
    }
}

/// The bytes of a compact log's entry under a window of `window` µs (docs/SPEC.md, "Redis
/// state"): the fewest, from 3, whose offsets span more than twice the window.
fn compact_entry_width(window: u64) -> u64 {
    (3..8)
        .find(|width| 1u128 << (8 * width) > 2 * u128::from(window))
        .unwrap_or(7)
}

/// Bytes in binary units (`97.7 KiB`).
pub(crate) fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use sluicegate::RuleSpec;

    const S: u64 = 1_000_000;

    #[test]
    fn memory_estimates_follow_the_measured_constants() {
        let rule = Rule::new(
            "r",
            &RuleSpec::new(Algorithm::SlidingLog, 1000, Duration::from_micros(S)),
        )
        .unwrap();
        assert_eq!(redis_bytes(&rule, LogLayout::Zset, 1000), 116_200);
        // 3 bytes an entry under 1 s, 5 under an hour.
        assert_eq!(redis_bytes(&rule, LogLayout::Compact, 1000), 3_537);
        assert_eq!(redis_bytes(&rule, LogLayout::Compact, 100), 500);
        let hour = Rule::new(
            "r",
            &RuleSpec::new(Algorithm::SlidingLog, 1000, Duration::from_micros(3600 * S)),
        )
        .unwrap();
        assert_eq!(redis_bytes(&hour, LogLayout::Compact, 1000), 5_787);
    }
}
