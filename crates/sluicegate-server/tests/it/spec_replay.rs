//! docs/SPEC.md's worked examples of usage-based limits, run through the real
//! `sluicegate replay` as printed: each example's input block is fed on standard input and
//! the output must be the example's output block, line for line. The inputs and outputs
//! are read from the SPEC itself, so the text and the binary cannot drift apart; only the
//! rule each example names in words is spelled out here as flags.

use crate::replay;

use replay::replay;

/// The SPEC section that holds the examples.
const SECTION: &str = "### Usage: worked examples";

/// Each example by the start of its bold lead, with the flags of the rule it describes.
const EXAMPLES: [(&str, &[&str]); 4] = [
    (
        "**A report into debt (sliding-log, W = 1 s, L = 3).**",
        &[
            "--algorithm",
            "sliding-log",
            "--limit",
            "3",
            "--window",
            "1s",
        ],
    ),
    (
        "**A token bucket in debt (L = 10 per 1 s, B = 10",
        &[
            "--algorithm",
            "token-bucket",
            "--limit",
            "10",
            "--window",
            "1s",
            "--burst",
            "10",
        ],
    ),
    (
        "**Reserve, then settle (fixed-window, W = 1 min, L = 100).**",
        &[
            "--algorithm",
            "fixed-window",
            "--limit",
            "100",
            "--window",
            "1m",
        ],
    ),
    (
        "**A refund (sliding-log, W = 1 s, L = 3).**",
        &[
            "--algorithm",
            "sliding-log",
            "--limit",
            "3",
            "--window",
            "1s",
        ],
    ),
];

/// The text of the section `heading` of `markdown`, up to the next heading of its level
/// or above.
fn section<'a>(markdown: &'a str, heading: &str) -> &'a str {
    let start = markdown
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/SPEC.md has no {heading:?}"));
    let body = &markdown[start + heading.len() + 2..];
    let end = body
        .find("\n## ")
        .into_iter()
        .chain(body.find("\n### "))
        .min()
        .unwrap_or(body.len());
    &body[..end]
}

/// The first two fenced blocks after `lead` in `text`: the input and the output.
fn blocks_after<'a>(text: &'a str, lead: &str) -> (&'a str, &'a str) {
    let start = text
        .find(lead)
        .unwrap_or_else(|| panic!("no example {lead:?} in {SECTION:?}"));
    let mut fences = text[start..].split("```\n").skip(1).step_by(2);
    let (Some(input), Some(output)) = (fences.next(), fences.next()) else {
        panic!("example {lead:?} lacks its input and output blocks");
    };
    (input, output)
}

/// The report of `sluicegate replay ARGS` on `input`, which must succeed.
fn replayed(args: &[&str], input: &str) -> String {
    let out = replay(args, input);
    assert!(
        out.status.success(),
        "replay {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_usage_examples_replay_as_printed() {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/SPEC.md"))
        .unwrap();
    let examples = section(&spec, SECTION);
    for (lead, args) in EXAMPLES {
        let (input, output) = blocks_after(examples, lead);
        assert_eq!(replayed(args, input), output, "{lead}");
    }
}
