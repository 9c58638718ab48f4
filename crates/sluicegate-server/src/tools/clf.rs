//! Common and Combined Log Format access-log lines, as traces:
//! `host ident user [10/Oct/2000:13:55:36 -0700] "GET /path HTTP/1.0" 200 2326 "referer" "agent"`.

use anyhow::{Context as _, Result, anyhow};

/// Which field of a log line is the rate-limit key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KeyField {
    /// The client address (the first field).
    Host,
    /// The authenticated user (the third field).
    User,
    /// The request path.
    Path,
    /// The user agent (Combined Log Format).
    Agent,
}

/// The time (µs since the epoch) and key of one log line, or what is wrong with it.
pub(crate) fn parse_line(line: &str, key_field: KeyField) -> Result<(u64, String)> {
    let mut rest = line.trim_end();
    let mut word = || -> Result<&str> {
        let trimmed = rest.trim_start();
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (w, tail) = trimmed.split_at(end);
        rest = tail;
        if w.is_empty() {
            Err(anyhow!("the line ends early"))
        } else {
            Ok(w)
        }
    };
    let host = word()?.to_owned();
    let _ident = word()?;
    let user = word()?.to_owned();
    let after_user = rest.trim_start();
    let date = after_user
        .strip_prefix('[')
        .and_then(|s| s.split_once(']'))
        .context("no [date] field")?;
    let time = parse_clf_time(date.0)?;
    let mut tail = date.1.trim_start();
    let mut quoted = || -> Option<String> {
        let body = tail.strip_prefix('"')?;
        let end = body.find('"')?;
        let value = body[..end].to_owned();
        tail = body[end + 1..].trim_start();
        // Skip the unquoted status and size between the request and the referer.
        while !tail.is_empty() && !tail.starts_with('"') {
            tail = tail.split_once(' ').map_or("", |(_, r)| r).trim_start();
        }
        Some(value)
    };
    let request = quoted().context("no \"request\" field")?;
    let key = match key_field {
        KeyField::Host => host,
        KeyField::User => user,
        KeyField::Path => request
            .split(' ')
            .nth(1)
            .context("the request has no path")?
            .to_owned(),
        KeyField::Agent => {
            let _referer = quoted().context("no \"referer\" field (not Combined Log Format)")?;
            quoted().context("no \"user agent\" field (not Combined Log Format)")?
        }
    };
    Ok((time, key))
}

/// `10/Oct/2000:13:55:36 -0700` → µs since the epoch.
fn parse_clf_time(text: &str) -> Result<u64> {
    let bad = || anyhow!("bad date {text:?}");
    let (stamp, zone) = text.split_once(' ').ok_or_else(bad)?;
    let mut parts = stamp.split(['/', ':']);
    let mut next = || parts.next().ok_or_else(bad);
    let day: i64 = next()?.parse().map_err(|_| bad())?;
    let month = match next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return Err(bad()),
    };
    let year: i64 = next()?.parse().map_err(|_| bad())?;
    let hour: i64 = next()?.parse().map_err(|_| bad())?;
    let minute: i64 = next()?.parse().map_err(|_| bad())?;
    let second: i64 = next()?.parse().map_err(|_| bad())?;
    let valid = (1..=31).contains(&day) && hour < 24 && minute < 60 && second <= 60;
    let (sign, digits) = zone.split_at(1);
    let offset: i64 = digits.parse().map_err(|_| bad())?;
    if !valid || digits.len() != 4 || !matches!(sign, "+" | "-") {
        return Err(bad());
    }
    let offset_seconds =
        (offset / 100 * 3600 + offset % 100 * 60) * if sign == "-" { -1 } else { 1 };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_seconds;
    u64::try_from(seconds)
        .map(|s| s * 1_000_000)
        .map_err(|_| anyhow!("date {text:?} is before 1970"))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMBINED: &str = r#"203.0.113.9 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;

    #[test]
    fn the_apache_example_parses() {
        // 2000-10-10 20:55:36 UTC.
        let (t, key) = parse_line(COMBINED, KeyField::Host).unwrap();
        assert_eq!(t, 971_211_336_000_000);
        assert_eq!(key, "203.0.113.9");
        assert_eq!(parse_line(COMBINED, KeyField::User).unwrap().1, "frank");
        assert_eq!(
            parse_line(COMBINED, KeyField::Path).unwrap().1,
            "/apache_pb.gif"
        );
        assert_eq!(
            parse_line(COMBINED, KeyField::Agent).unwrap().1,
            "Mozilla/4.08 [en] (Win98; I ;Nav)"
        );
    }

    #[test]
    fn malformed_lines_say_why() {
        let common = r#"10.0.0.1 - - [01/Jan/2024:00:00:00 +0000] "GET / HTTP/1.1" 200 5"#;
        assert_eq!(
            parse_line(common, KeyField::Host).unwrap().0,
            1_704_067_200_000_000
        );
        assert!(
            parse_line(common, KeyField::Agent)
                .unwrap_err()
                .to_string()
                .contains("Combined")
        );
        for (line, says) in [
            ("", "ends early"),
            ("10.0.0.1 - -", "no [date]"),
            (
                r#"10.0.0.1 - - [32/Jan/2024:00:00:00 +0000] "GET /""#,
                "bad date",
            ),
            (
                r#"10.0.0.1 - - [01/Foo/2024:00:00:00 +0000] "GET /""#,
                "bad date",
            ),
            (
                r#"10.0.0.1 - - [01/Jan/2024:00:00:00 +0000] GET"#,
                "request",
            ),
        ] {
            let err = parse_line(line, KeyField::Host).unwrap_err().to_string();
            assert!(err.contains(says), "{line:?}: {err}");
        }
    }

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }
}
