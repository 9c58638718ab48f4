//! The shell examples of README.md and of every docs/*.md page, run as printed: every `sh`
//! block that an output block (`text` or `json`) follows directly is run by bash in a
//! scratch directory, with the `sluicegate` this build made first on the `PATH`, and what
//! it prints must be what the page shows. A block that talks to `localhost:8080` gets a
//! `sluicegate serve` of its own (the example rules, on a free port) in its place. And
//! every link between those pages leads to a file, and to a heading, that exists.

use crate::server;

use server::Server;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A shell block and the output block right after it.
struct Example {
    /// The page and the line the shell block starts on, for the failure message.
    page: String,
    line: usize,
    command: String,
    /// The output block's info string: `text` or `json`.
    kind: String,
    output: String,
}

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every docs/*.md page, as (path from the workspace's root, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(workspace().join("docs"))
        .expect("the docs directory")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(workspace().join(&name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect()
}

/// Every (shell block, output block) pair of a Markdown page.
fn examples(page: &str, markdown: &str) -> Vec<Example> {
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
            page: page.to_owned(),
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

fn scratch_dir(example: &Example) -> PathBuf {
    let page = example.page.replace(['/', '.'], "-");
    let dir = std::env::temp_dir().join(format!(
        "sluicegate-readme-{}-{page}-{}",
        std::process::id(),
        example.line
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `command` as the page's reader would, and returns stdout followed by stderr.
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
fn every_shell_example_prints_what_its_page_shows() {
    // BENCHMARKS.md's outputs are measurements of the machine they ran on, not answers
    // that another run must repeat.
    let examples: Vec<Example> = pages()
        .iter()
        .filter(|(page, _)| page != "docs/BENCHMARKS.md")
        .flat_map(|(page, text)| examples(page, text))
        .collect();
    // The check, the two configuration errors, replay and simulate at least: a parser
    // that found none would pass everything.
    assert!(examples.len() >= 5, "found {} examples", examples.len());
    for example in &examples {
        let dir = scratch_dir(example);
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
            "{} line {}:\n{}\nprinted:\n{printed}",
            example.page, example.line, example.command
        );
        if example.kind == "json" {
            let shown: serde_json::Value = serde_json::from_str(&example.output)
                .unwrap_or_else(|e| panic!("the page's JSON: {e}\n{context}"));
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

/// The lines of a Markdown text outside its fenced code blocks, numbered from 1.
fn prose(markdown: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut in_code = false;
    markdown
        .lines()
        .enumerate()
        .filter_map(move |(number, line)| {
            if line.starts_with("```") {
                in_code = !in_code;
                return None;
            }
            (!in_code).then_some((number + 1, line))
        })
}

/// The anchors GitHub gives a page's headings: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, the rest dropped; a repeated one numbered `-1`, `-2`, ….
fn anchors(markdown: &str) -> Vec<String> {
    let mut anchors = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (_, line) in prose(markdown) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let repeats = seen.entry(slug.clone()).or_default();
        anchors.push(if *repeats == 0 {
            slug
        } else {
            format!("{slug}-{repeats}")
        });
        *repeats += 1;
    }
    anchors
}

/// Every inline link target of a line: what `](` opens, up to its `)`.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

#[test]
fn every_link_between_the_pages_resolves() {
    let root = workspace();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (page, text) in pages() {
        let dir = root.join(&page).parent().unwrap().to_path_buf();
        for (line, content) in prose(&text) {
            for target in link_targets(content) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    root.join(&page)
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{page}:{line}: {target}: no such file"));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                let heads = std::fs::read_to_string(&file).map(|t| anchors(&t));
                if !heads.is_ok_and(|heads| heads.iter().any(|h| h == anchor)) {
                    broken.push(format!("{page}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(
        checked >= 50,
        "found {checked} links: the parser finds none"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
