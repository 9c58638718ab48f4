//! Durations as configuration writes them (`500ms`, `1s`, `90s`, `1m`, `1h`, `1d`) and
//! as integer microseconds, the unit of every time in docs/SPEC.md.

// Reached from outside only through `internals`; the library itself formats rules with it.
#![cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]

use std::fmt;

const UNITS: [(&str, u64); 6] = [
    ("d", 86_400_000_000),
    ("h", 3_600_000_000),
    ("m", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];

/// A duration that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?}: {} (write a whole number and a unit: us, ms, s, m, h or d, \
             e.g. 500ms or 90s)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for DurationError {}

/// Parses `500ms`, `90s`, `1m`, `1h`, `1d`, `250us` into µs.
pub fn parse_duration(input: &str) -> Result<u64, DurationError> {
    let error = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| error("no unit"))?;
    if digits_end == 0 {
        return Err(error("no number"));
    }
    let (number, unit) = text.split_at(digits_end);
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| error("unknown unit"))?;
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| error("too large"))
}

/// Writes µs in the largest unit that divides them exactly: `86400000000` → `1d`.
pub fn format_duration(micros: u64) -> String {
    let (unit, scale) = UNITS
        .iter()
        .find(|(_, scale)| micros != 0 && micros.is_multiple_of(*scale))
        .copied()
        .unwrap_or(("us", 1));
    format!("{}{unit}", micros / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        let cases = [
            ("500ms", 500_000),
            ("1s", 1_000_000),
            ("90s", 90_000_000),
            ("1m", 60_000_000),
            ("1h", 3_600_000_000),
            ("1d", 86_400_000_000),
            ("7us", 7),
        ];
        for (text, micros) in cases {
            assert_eq!(parse_duration(text), Ok(micros), "{text}");
            assert_eq!(parse_duration(&format_duration(micros)), Ok(micros));
        }
        assert_eq!(format_duration(90_000_000), "90s");
        assert_eq!(format_duration(0), "0us");
    }

    #[test]
    fn rejects_malformed() {
        for text in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "1 s",
            "1w",
            "99999999999999999999d",
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(
                err.to_string().contains("invalid duration"),
                "{text}: {err}"
            );
        }
    }
}
