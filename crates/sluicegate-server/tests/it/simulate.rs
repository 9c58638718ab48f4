//! `sluicegate trace`, `simulate` and `plan` end to end, as a user runs them.

use sluicegate_test_support::{self as support, cmd};

use std::path::{Path, PathBuf};
use std::process::Command;

fn sluicegate(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluicegate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The row of `algorithm` in simulate's table without its parenthesised notes, split on
/// whitespace: name, allowed, wrongly allowed, wrongly rejected, max in any W, memory….
fn row(table: &str, algorithm: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|line| line.starts_with(&format!("{algorithm} ")))
        .unwrap_or_else(|| panic!("no {algorithm} row in\n{table}"));
    let mut plain = String::new();
    let mut depth = 0;
    for c in line.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain.split_whitespace().map(str::to_owned).collect()
}

fn max_in_window(row: &[String]) -> u64 {
    row[4].parse().unwrap()
}

#[test]
fn a_boundary_attack_doubles_fixed_windows_and_not_the_log() {
    let trace = scratch("attack.csv");
    let csv = sluicegate(&[
        "trace",
        "--pattern",
        "boundary-attack",
        "--rate",
        "50",
        "--keys",
        "4",
        "--duration",
        "10m",
        "--window",
        "1m",
        "--seed",
        "11",
    ]);
    std::fs::write(&trace, csv).unwrap();
    let limit = 100;
    let chart = scratch("attack.svg");
    let table = sluicegate(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--limit",
        "100",
        "--window",
        "1m",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let fixed = max_in_window(&row(&table, "fixed-window"));
    let log = max_in_window(&row(&table, "sliding-log"));
    let counter = max_in_window(&row(&table, "sliding-counter"));
    assert!(
        fixed >= 2 * limit * 9 / 10,
        "fixed-window admitted {fixed} in one window\n{table}"
    );
    assert!(log <= limit, "{table}");
    // The counter's estimate weighs the sliding-out bucket by time, so the units actually
    // in a window exceed L by at most that bucket's count, itself at most L.
    assert!(counter > limit && counter <= 2 * limit, "{table}");
    assert_eq!(
        row(&table, "sliding-log")[2],
        "0",
        "the log is the reference"
    );
    assert_svg(&chart);
}

/// The chart is well-formed XML: the offered load on a panel of its own, then one panel
/// per algorithm on shared axes with the limit line, the exact log as the reference and
/// marks where it admitted more than L; axes and legend labelled.
fn assert_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    // Well-formed: every element closes, in order.
    let mut open: Vec<String> = Vec::new();
    let mut rest = svg.as_str();
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("every tag closes") + start;
        let tag = &rest[start + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop().as_deref(), Some(name), "mismatched </{name}>");
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().unwrap().to_owned());
        }
        rest = &rest[end + 1..];
    }
    assert!(open.is_empty(), "unclosed {open:?}");
    let panel = |name: &str| {
        let start = svg
            .find(&format!("<g class=\"panel\" data-panel=\"{name}\">"))
            .unwrap_or_else(|| panic!("no panel for {name}"));
        &svg[start..start + svg[start..].find("</g>").unwrap()]
    };
    // The offered load has a panel of its own, with its unit.
    assert!(panel("offered").contains(">units/s</text>"));
    assert_eq!(svg.matches("<g class=\"panel\"").count(), 6, "offered + 5");
    for algorithm in [
        "sliding-log",
        "sliding-counter",
        "fixed-window",
        "token-bucket",
        "leaky-bucket",
    ] {
        let panel = panel(algorithm);
        for part in [
            format!("<polyline class=\"series\" data-series=\"{algorithm}\""),
            "<line class=\"limit\"".to_owned(),
            "<polygon class=\"reference\"".to_owned(),
            ">units in 1m, one key</text>".to_owned(),
            format!(">{algorithm}</tspan>"),
        ] {
            assert_eq!(panel.matches(&part).count(), 1, "{algorithm}: {part}");
        }
        // Over-admission is marked exactly where an algorithm passes L.
        let marked = panel.contains("class=\"over-limit\"");
        let exceeds = !matches!(algorithm, "sliding-log" | "leaky-bucket");
        assert_eq!(marked, exceeds, "{algorithm}: over-limit marks");
    }
    // Every panel's limit line is at the same height: the axes are shared.
    let limit_heights: std::collections::BTreeSet<String> = svg
        .match_indices("<line class=\"limit\"")
        .map(|(at, _)| {
            let y1 = &svg[at..][svg[at..].find("y1=\"").unwrap() + 4..];
            let y1 = &y1[..y1.find('"').unwrap()];
            let top = svg[..at].rfind("<rect class=\"frame\"").unwrap();
            let top = &svg[top..][svg[top..].find("y=\"").unwrap() + 3..];
            let offset =
                y1.parse::<f64>().unwrap() - top[..top.find('"').unwrap()].parse::<f64>().unwrap();
            format!("{offset:.1}")
        })
        .collect();
    assert_eq!(limit_heights.len(), 1, "{limit_heights:?}");
    assert!(svg.contains("limit L = 100</text>"), "the legend names L");
    assert!(svg.contains(">exact sliding log (reference)</text>"));
    assert!(svg.contains("time since the trace's first request"));
    assert!(svg.contains(">9m</text>"), "time ticks");
}

#[test]
fn access_logs_parse_and_malformed_lines_are_counted() {
    let log = scratch("access.log");
    std::fs::write(
        &log,
        "\
203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 2326\n\
203.0.113.9 - - [10/Oct/2000:13:55:37 -0700] \"GET /b HTTP/1.0\" 200 2326\n\
this is not a log line\n\
198.51.100.4 - - [10/Oct/2000:13:55:38 -0700] \"GET /a HTTP/1.0\" 200 17\n\
203.0.113.9 - - [10/Oct/2000:13:55:39 -0700] \"GET /c HTTP/1.0\" 404 0\n",
    )
    .unwrap();
    let table = sluicegate(&[
        "simulate",
        "--trace",
        log.to_str().unwrap(),
        "--format",
        "clf",
        "--limit",
        "2",
        "--window",
        "1m",
    ]);
    assert!(table.starts_with("4 requests, 2 keys"), "{table}");
    assert!(
        table.contains("1 malformed lines skipped (first: line 3: "),
        "{table}"
    );
    // 203.0.113.9 sends three within the minute: the log admits two.
    assert_eq!(row(&table, "sliding-log")[1], "3");
    let by_path = sluicegate(&[
        "simulate",
        "--trace",
        log.to_str().unwrap(),
        "--format",
        "clf",
        "--key-field",
        "path",
        "--limit",
        "1",
        "--window",
        "1m",
    ]);
    assert!(by_path.starts_with("4 requests, 3 keys"), "{by_path}");
}

#[test]
fn plan_computes_memory_per_algorithm() {
    let table = sluicegate(&[
        "plan", "--qps", "1000", "--window", "1m", "--keys", "100", "--limit", "100",
    ]);
    assert!(table.contains("100 live entries per key"), "{table}");
    assert!(
        table.contains("window 1m:"),
        "the window as written: {table}"
    );
    for label in [
        "sliding-log (zset)",
        "sliding-log (compact)",
        "sliding-counter",
        "fixed-window",
        "token-bucket",
        "leaky-bucket",
    ] {
        assert!(table.contains(label), "{label} in\n{table}");
    }
}

#[test]
fn plan_measures_on_a_real_redis_and_cleans_up() {
    let server = support::standalone();
    let table = sluicegate(&[
        "plan",
        "--qps",
        "1000",
        "--window",
        "1m",
        "--keys",
        "100",
        "--limit",
        "200",
        "--redis",
        &server.url(),
    ]);
    let compact = table
        .lines()
        .find(|l| l.starts_with("sliding-log (compact)"))
        .unwrap();
    // 200 live entries of 4 bytes (W = 1 min), plus the header and the key: at most 10 B an
    // entry, within a quarter of the estimate.
    let number =
        |line: &str, i: usize| -> u64 { line.split_whitespace().nth(i).unwrap().parse().unwrap() };
    let (estimated, measured) = (number(compact, 2), number(compact, 6));
    assert!(measured <= 10 * 200, "{table}");
    assert!(4 * measured.abs_diff(estimated) <= estimated, "{table}");
    let zset = table
        .lines()
        .find(|l| l.starts_with("sliding-log (zset)"))
        .unwrap();
    let measured_zset: u64 = zset.split_whitespace().nth(6).unwrap().parse().unwrap();
    assert!(measured_zset > 4 * measured, "{table}");
    let left: Vec<String> = server.query(cmd("KEYS").arg("sluicegate:plan:*")).unwrap();
    assert!(left.is_empty(), "plan left keys behind: {left:?}");
}

/// A cost no store decides (2^53) is a malformed line, counted, and the run goes on.
#[test]
fn a_cost_of_2_to_the_53_is_a_malformed_line() {
    let trace = scratch("huge-cost.csv");
    std::fs::write(&trace, "0,a,1\n1,a,9007199254740992\n2,a,1\n").unwrap();
    let table = sluicegate(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--limit",
        "5",
        "--window",
        "1m",
    ]);
    assert!(table.starts_with("2 requests, 1 keys"), "{table}");
    assert!(
        table.contains(
            "1 malformed lines skipped (first: line 2: cost 9007199254740992 is not below 2^53"
        ),
        "{table}"
    );
}
