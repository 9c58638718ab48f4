//! `sluicegate replay`: docs/SPEC.md's replay format through a store (in-memory by default),
//! deciding with the caller's timestamps.
//!
//! Input lines are `time_us,key,cost[,request_id[,mode]]`, ordered by time; blank lines and lines
//! starting with `#` are skipped and produce no output. Each other line produces
//! `time_us,key,cost,allowed,remaining,retry_after_us,reset_after_us,delay_us`.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use sluicegate::internals::{MAX_TIME, saturating_micros, signed_micros};
use sluicegate::{Charge, Check, Limit, ManualClock, MemoryStore, MemoryStoreConfig, Rule, Store};

/// A memory store for decisions timed by a trace: time comes from the input and the clock
/// is never read; every key of the trace may be live at once, so the cap is the trace's
/// size, not a server's.
pub(crate) fn trace_store() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig {
            max_keys: usize::MAX,
            ..MemoryStoreConfig::default()
        },
        Arc::new(ManualClock::new(Duration::ZERO)),
    )
}

/// One parsed input line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ReplayLine<'a> {
    pub(crate) time: u64,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) request_id: Option<&'a str>,
    /// The mode column: `check` when it is left out.
    pub(crate) charge: Charge,
}

impl ReplayLine<'_> {
    /// The check this line asks for, under `limits`.
    pub(crate) fn check<'a>(&'a self, limits: &'a [Limit<'a>]) -> Check<'a> {
        Check {
            request_id: self.request_id,
            at: Some(Duration::from_micros(self.time)),
            charge: self.charge,
            ..Check::new(limits, self.cost)
        }
    }
}

/// Parses one non-comment line; the error says what is wrong.
pub(crate) fn parse_line(text: &str) -> Result<ReplayLine<'_>> {
    const SHAPE: &str = "time_us,key,cost[,request_id[,mode]]";
    let mut fields = text.split(',');
    let (Some(time), Some(key), Some(cost)) = (fields.next(), fields.next(), fields.next()) else {
        bail!("expected {SHAPE}, got {} field(s)", text.split(',').count());
    };
    let request_id = fields.next();
    let mode = fields.next();
    if fields.next().is_some() {
        bail!(
            "expected at most 5 fields ({SHAPE}), got {}",
            text.split(',').count()
        );
    }
    let time: u64 = time
        .trim()
        .parse()
        .ok()
        .with_context(|| format!("time_us {time:?} is not a whole number of µs"))?;
    if time >= MAX_TIME {
        bail!("time_us {time} is not below 2^52");
    }
    let cost: u64 = cost
        .trim()
        .parse()
        .ok()
        .with_context(|| format!("cost {cost:?} is not a whole number"))?;
    // What no store decides: a malformed line here, not a failed run later.
    if cost > Check::MAX_COST {
        bail!("cost {cost} is not below 2^53");
    }
    let request_id = match (request_id, mode) {
        (Some(""), None) => bail!("request_id is empty (leave the field out instead)"),
        (Some(""), Some(_)) => None,
        (id, _) => id,
    };
    let charge = match mode {
        None => Charge::Check,
        Some(mode) => Charge::from_name(mode.trim())
            .with_context(|| format!("mode {mode:?} is not one of {}", Charge::NAMES))?,
    };
    if let Some(id) = request_id
        && id.len() > Check::MAX_REQUEST_ID_BYTES
    {
        bail!(
            "request_id is {} bytes, over {}",
            id.len(),
            Check::MAX_REQUEST_ID_BYTES
        );
    }
    if charge.needs_request_id() && request_id.is_none() {
        bail!("mode {} needs a request_id", charge.name());
    }
    Ok(ReplayLine {
        time,
        key,
        cost,
        request_id,
        charge,
    })
}

/// Replays `input` under `rule` through `store`, writing one decision line per input line.
pub(crate) async fn replay<S: Store>(
    store: &S,
    rule: &Rule,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<()> {
    let mut previous = 0;
    for (index, line) in input.lines().enumerate() {
        let line_no = index + 1;
        let at_line = || format!("line {line_no}");
        let line = line?;
        let text = line.trim_end_matches('\r');
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let parsed = parse_line(text).with_context(at_line)?;
        if parsed.time < previous {
            bail!(
                "line {line_no}: time_us {} is before the previous line's {previous}: input must be ordered by time",
                parsed.time
            );
        }
        previous = parsed.time;
        let limits = [Limit {
            rule,
            key: parsed.key,
        }];
        let d = store
            .check(&parsed.check(&limits))
            .await
            .with_context(at_line)?
            .decision;
        writeln!(
            output,
            "{},{},{},{},{},{},{},{}",
            parsed.time,
            parsed.key,
            parsed.cost,
            u8::from(d.allowed),
            d.remaining,
            signed_micros(d.retry_after()),
            saturating_micros(d.reset_after()),
            saturating_micros(d.delay())
        )?;
    }
    output.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields() {
        assert_eq!(
            parse_line("100,user:1,2,req-9").unwrap(),
            ReplayLine {
                time: 100,
                key: "user:1",
                cost: 2,
                request_id: Some("req-9"),
                charge: Charge::Check,
            }
        );
        let settle = parse_line("100,k,2,r1,settle").unwrap();
        assert_eq!(
            (settle.request_id, settle.charge),
            (Some("r1"), Charge::Settle)
        );
        let report = parse_line("100,k,4,,report").unwrap();
        assert_eq!((report.request_id, report.charge), (None, Charge::Report));
        assert_eq!(parse_line("1,k,1,r, check ").unwrap().charge, Charge::Check);
        assert_eq!(parse_line("5,,0").unwrap().key, "");
        let long_id = format!("1,k,1,{}", "r".repeat(257));
        for (bad, says) in [
            ("100,k", "got 2 field(s)"),
            ("x,k,1", "time_us \"x\""),
            ("-1,k,1", "time_us \"-1\""),
            ("1,k,one", "cost \"one\""),
            ("1,k,1,", "request_id is empty"),
            ("1,k,1,r,extra", "mode \"extra\" is not one of"),
            ("1,k,1,r,report,x", "at most 5 fields"),
            ("1,k,1,,reserve", "mode reserve needs a request_id"),
            ("1,k,1,,settle", "mode settle needs a request_id"),
            ("1,k,1,,", "mode \"\" is not one of"),
            (long_id.as_str(), "request_id is 257 bytes, over 256"),
            ("4503599627370496,k,1", "not below 2^52"),
            (
                "1,k,9007199254740992",
                "cost 9007199254740992 is not below 2^53",
            ),
        ] {
            let err = parse_line(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
