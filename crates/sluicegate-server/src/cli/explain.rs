//! `sluicegate explain`: why a running service would allow or refuse a request
//! (`POST /v1/explain`), printed as the service's JSON or, with `--text`, a line per
//! descriptor. Nothing is counted.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::Args;
use serde_json::Value;

use super::args::read_token_file;
use super::check::Request;
use super::runtime::runtime;

#[derive(Args)]
pub(super) struct ExplainArgs {
    #[command(flatten)]
    request: Request,
    /// Print a short text, a line per descriptor, instead of the JSON.
    #[arg(long, env = "SLUICEGATE_EXPLAIN_TEXT")]
    text: bool,
    /// A file holding the service's read token (its --read-token-file), sent as
    /// Authorization: Bearer: explain needs it on a service's --listen unless asked from
    /// the same host or on its --debug-listen.
    #[arg(long, env = "SLUICEGATE_READ_TOKEN_FILE", value_name = "PATH")]
    read_token_file: Option<PathBuf>,
}

/// Asks, prints the explanation, and says whether the request would be admitted; an
/// error when no explanation came.
pub(super) fn run(args: &ExplainArgs) -> Result<bool> {
    let token = args
        .read_token_file
        .as_deref()
        .map(|path| read_token_file(path, "--read-token-file"))
        .transpose()?;
    let (text, answer) = runtime()?.block_on(args.request.post("/v1/explain", token.as_deref()))?;
    let allowed = answer
        .get("allowed")
        .and_then(Value::as_bool)
        .ok_or_else(|| anyhow!("the answer has no \"allowed\": {text}"))?;
    if args.text {
        print!("{}", in_words(&answer));
    } else {
        println!("{text}");
    }
    Ok(allowed)
}

/// The explanation as a few lines: the verdict, then each descriptor's match and state.
fn in_words(answer: &Value) -> String {
    let field =
        |v: &Value, name: &str| v.get(name).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut out = format!("{}\n", field(answer, "summary"));
    for d in answer
        .get("descriptors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let entries = field(d, "entries");
        let line = match (d.get("state"), d.get("numbers")) {
            (Some(state), Some(numbers)) => format!(
                "{}: {} ({} {} per {}): {}",
                entries,
                field(d, "rule"),
                field(numbers, "algorithm"),
                numbers.get("limit").unwrap_or(&Value::Null),
                window(
                    numbers
                        .get("window_us")
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                ),
                field(state, "words")
            ),
            _ => format!("{entries}: {}", field(d, "why")),
        };
        let refuses = if d.get("would_refuse") == Some(&Value::Bool(true)) {
            " [refuses]"
        } else {
            ""
        };
        out.push_str(&format!("  {line}{refuses}\n"));
    }
    out
}

/// A window in whole seconds when it is one, else in µs.
fn window(us: u64) -> String {
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else {
        format!("{us}µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explanation_reads_as_a_line_per_descriptor() {
        let answer = serde_json::json!({
            "summary": "a cost of 1 would be refused by d.user",
            "descriptors": [
                {"entries": "user=a", "rule": "d.user", "would_refuse": true,
                 "numbers": {"algorithm": "sliding-log", "limit": 2, "window_us": 1000000},
                 "state": {"words": "2 of 2 in use"}},
                {"entries": "x=y", "why": "no rule matched: …", "would_refuse": false},
            ],
        });
        assert_eq!(
            in_words(&answer),
            "a cost of 1 would be refused by d.user\n  user=a: d.user (sliding-log 2 per 1s): 2 of \
             2 in use [refuses]\n  x=y: no rule matched: …\n"
        );
    }
}
