//! Values as envoy's Go reads them (kelseyhightower/envconfig over Go's strconv and time
//! packages), so that what envoy accepts is accepted and what it refuses is refused.

use std::time::Duration;

/// strconv.ParseBool.
pub(super) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// strconv.ParseInt(text, 0, 64): a sign, then decimal, `0x` hex, `0o` or `0` octal,
/// `0b` binary; `_` between digits.
pub(super) fn parse_int(text: &str) -> Option<i64> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.chars().all(|c| c == '_' || c.is_digit(radix))
    {
        return None;
    }
    let magnitude = i128::from_str_radix(&digits.replace('_', ""), radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// strconv.ParseFloat(text, 64).
pub(super) fn parse_float(text: &str) -> Option<f64> {
    text.parse().ok()
}

/// time.ParseDuration: `300ms`, `1.5h`, `1m30s`, `0`; units ns, us (µs), ms, s, m, h.
/// A negative duration, which Go reads, asks for nothing a timer can do: `None` too.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = unsigned;
    let mut nanos: f64 = 0.0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        nanos += number.parse::<f64>().ok()? * scale;
    }
    // Go's durations are int64 nanoseconds.
    (nanos <= i64::MAX as f64).then(|| Duration::from_nanos(nanos.round() as u64))
}

/// envconfig's `map[string]string`: `k1:v1,k2:v2`, each item exactly one colon; empty is
/// no item. The error is the item envconfig would name.
pub(super) fn parse_map(text: &str) -> Result<Vec<(&str, &str)>, &str> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|item| match item.split(':').collect::<Vec<_>>()[..] {
            [key, value] => Ok((key, value)),
            _ => Err(item),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_reads_them() {
        for (text, expected) in [
            ("0", Some(Duration::ZERO)),
            ("10s", Some(Duration::from_secs(10))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("300ms", Some(Duration::from_millis(300))),
            ("250us", Some(Duration::from_micros(250))),
            ("2µs", Some(Duration::from_micros(2))),
            ("24h", Some(Duration::from_secs(86_400))),
            (".5s", Some(Duration::from_millis(500))),
            ("10", None),
            ("", None),
            ("1d", None),
            ("-1s", None),
            ("s", None),
            ("1..5s", None),
        ] {
            assert_eq!(parse_duration(text), expected, "{text}");
        }
    }

    #[test]
    fn ints_read_as_go_reads_them() {
        for (text, expected) in [
            ("8080", Some(8080)),
            ("-3", Some(-3)),
            ("0x1F", Some(31)),
            ("010", Some(8)),
            ("0b101", Some(5)),
            ("1_000", Some(1000)),
            ("0", Some(0)),
            ("", None),
            ("8o", None),
            ("1.5", None),
            ("_1", None),
        ] {
            assert_eq!(parse_int(text), expected, "{text}");
        }
    }

    #[test]
    fn maps_read_as_envconfig_reads_them() {
        assert_eq!(parse_map("a:1,b:2"), Ok(vec![("a", "1"), ("b", "2")]));
        assert_eq!(parse_map(""), Ok(vec![]));
        assert_eq!(parse_map("a:1,b"), Err("b"));
        assert_eq!(parse_map("url:http://x"), Err("url:http://x"));
        assert_eq!(parse_bool("True"), Some(true));
        assert_eq!(parse_bool("yes"), None);
    }
}
