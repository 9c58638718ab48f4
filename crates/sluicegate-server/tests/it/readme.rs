//! The README's shell examples, run as printed: every `sh` block that an output block
//! (`text` or `json`) follows directly is run by bash in a scratch directory, with the
//! `sluicegate` this build made first on the `PATH`, and what it prints must be what the
//! README shows. A block that talks to `localhost:8080` gets a `sluicegate serve` of its
//! own (the example rules, on a free port) in its place.

use crate::server;

use server::Server;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A shell block and the output block right after it.
struct Example {
    /// The README line the shell block starts on, for the failure message.
    line: usize,
    command: String,
    /// The output block's info string: `text` or `json`.
    kind: String,
    output: String,
}

/// Every (shell block, output block) pair of a Markdown text.
fn examples(markdown: &str) -> Vec<Example> {
    struct Block {
        line: usize,
        info: String,
        body: String,
        /// Only blank lines between the previous block's end and this block's start.
        follows_directly: bool,
    }
    let mut blocks: Vec<Block> = Vec::new();
    let mut open: Option<Block> = None;
    let mut gap_is_blank = false;
    for (number, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    line: number + 1,
                    info: info.trim().to_owned(),
                    body: String::new(),
                    follows_directly: gap_is_blank,
                })
            }
            (Some(_), Some("")) => {
                blocks.extend(open.take());
                gap_is_blank = true;
            }
            (Some(block), _) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
            (None, None) => gap_is_blank &= line.trim().is_empty(),
        }
    }
    blocks
        .windows(2)
        .filter(|pair| {
            pair[0].info == "sh"
                && pair[1].follows_directly
                && matches!(pair[1].info.as_str(), "text" | "json")
        })
        .map(|pair| Example {
            line: pair[0].line,
            command: pair[0].body.clone(),
            kind: pair[1].info.clone(),
            output: pair[1].body.clone(),
        })
        .collect()
}

/// The one figure that changes from run to run: simulate's "in 0.3 s" elapsed time.
fn without_elapsed_time(text: &str) -> String {
    text.lines()
        .map(|line| match line.rsplit_once(", in ") {
            Some((head, tail))
                if tail
                    .strip_suffix(" s")
                    .is_some_and(|t| t.parse::<f64>().is_ok()) =>
            {
                format!("{head}, in … s")
            }
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn scratch_dir(line: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-readme-{}-{line}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `command` as the README reader would, and returns stdout followed by stderr.
fn run(command: &str, dir: &Path) -> String {
    let binary = Path::new(env!("CARGO_BIN_EXE_sluicegate"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", command])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .expect("bash runs");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn every_shell_example_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("the workspace README");
    let examples = examples(&readme);
    // The check, the two configuration errors, replay and simulate at least: a parser
    // that found none would pass everything.
    assert!(examples.len() >= 5, "found {} examples", examples.len());
    for example in &examples {
        let dir = scratch_dir(example.line);
        let server = example
            .command
            .contains("localhost:8080")
            .then(|| Server::binary(&[]));
        let command = match &server {
            Some(server) => example.command.replace("localhost:8080", &server.address),
            None => example.command.clone(),
        };
        let printed = run(&command, &dir);
        let context = format!(
            "README line {}:\n{}\nprinted:\n{printed}",
            example.line, example.command
        );
        if example.kind == "json" {
            let shown: serde_json::Value = serde_json::from_str(&example.output)
                .unwrap_or_else(|e| panic!("the README's JSON: {e}\n{context}"));
            let printed: serde_json::Value = serde_json::from_str(&printed)
                .unwrap_or_else(|e| panic!("not JSON: {e}\n{context}"));
            assert_eq!(printed, shown, "{context}");
        } else {
            assert_eq!(
                without_elapsed_time(printed.trim_end()),
                without_elapsed_time(example.output.trim_end()),
                "{context}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
