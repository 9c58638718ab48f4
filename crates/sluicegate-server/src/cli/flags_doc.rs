//! docs/flags.md is the command line's own description of itself: every command, every
//! flag with its environment variable and default, rendered from clap's command tree. The
//! test below holds the page equal to it, and rewrites it when `SLUICEGATE_UPDATE_DOCS` is
//! set, so a flag cannot be added, renamed or given a new default without the page.

use std::fmt::Write as _;

use clap::{Arg, Command, CommandFactory as _};

use super::Cli;

/// The variable that makes the test rewrite docs/flags.md instead of comparing it.
const UPDATE: &str = "SLUICEGATE_UPDATE_DOCS";

/// docs/flags.md, as the command line describes itself.
fn render(cli: &Command) -> String {
    let name = cli.get_name();
    let mut page = format!(
        "# Flags and environment variables\n\n\
         Every command of `{name}`, and every flag with the environment variable that sets\n\
         it and its default. A flag given on the command line wins over its variable. Under\n\
         `--compat envoy` (or run as `ratelimit`), envoyproxy/ratelimit's own variables set\n\
         these flags too: [envoy.md](envoy.md#the-drop-in-envoys-environment).\n\n\
         This page is generated from the command line's definition, and a test holds it\n\
         equal: `{UPDATE}=1 cargo test -p sluicegate-server --lib flags_doc`\n\
         rewrites it.\n\n\
         | command | what it does |\n|---|---|\n"
    );
    for command in cli.get_subcommands() {
        let full = format!("{name} {}", command.get_name());
        let _ = writeln!(
            page,
            "| [`{full}`](#{}) | {} |",
            full.replace(' ', "-"),
            cell(&about(command))
        );
    }
    for command in cli.get_subcommands() {
        let _ = write!(
            page,
            "\n## {name} {}\n\n{}\n",
            command.get_name(),
            about(command)
        );
        let args: Vec<&Arg> = command
            .get_arguments()
            .filter(|arg| {
                !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
            })
            .collect();
        if args.is_empty() {
            continue;
        }
        page.push_str("\n| flag | environment | default | meaning |\n|---|---|---|---|\n");
        for arg in args {
            let env = arg
                .get_env()
                .map(|env| format!("`{}`", env.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|value| value.to_string_lossy().into_owned())
                .collect();
            let default = if takes_value(arg) && !defaults.is_empty() {
                format!("`{}`", defaults.join(","))
            } else {
                String::new()
            };
            let mut meaning = arg
                .get_long_help()
                .or(arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|value| !value.is_hide_set())
                .map(|value| format!("`{}`", value.get_name()))
                .collect();
            if takes_value(arg) && !possible.is_empty() {
                let _ = write!(meaning, " One of: {}.", possible.join(", "));
            }
            let _ = writeln!(
                page,
                "| `{}` | {env} | {} | {} |",
                usage(arg),
                cell(&default),
                cell(&meaning)
            );
        }
    }
    page
}

/// A command's description: its long one when it has one.
fn about(command: &Command) -> String {
    command
        .get_long_about()
        .or(command.get_about())
        .map(ToString::to_string)
        .unwrap_or_default()
}

fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

/// How a flag is written: `-s, --long <VALUE>`, `[<VALUE>]` when the value may be left out.
fn usage(arg: &Arg) -> String {
    let mut usage = match (arg.get_short(), arg.get_long()) {
        (Some(short), Some(long)) => format!("-{short}, --{long}"),
        (Some(short), None) => format!("-{short}"),
        (None, Some(long)) => format!("--{long}"),
        (None, None) => String::new(),
    };
    if takes_value(arg) {
        let names: Vec<String> = match arg.get_value_names() {
            Some(names) => names.iter().map(|name| format!("<{name}>")).collect(),
            None => vec![format!("<{}>", arg.get_id().as_str().to_uppercase())],
        };
        let value = names.join(" ");
        let optional = arg
            .get_num_args()
            .is_some_and(|range| range.min_values() == 0);
        let value = if optional {
            format!("[{value}]")
        } else {
            value
        };
        usage = if usage.is_empty() {
            value
        } else {
            format!("{usage} {value}")
        };
    }
    usage
}

/// Text as one cell of a Markdown table: on one line, its pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[test]
fn docs_flags_md_is_the_command_line() {
    let rendered = render(&Cli::command());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md");
    if std::env::var_os(UPDATE).is_some() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    let first_difference = on_disk
        .lines()
        .zip(rendered.lines())
        .position(|(page, flags)| page != flags)
        .unwrap_or(on_disk.lines().count().min(rendered.lines().count()));
    assert!(
        on_disk == rendered,
        "docs/flags.md is not what the command line says, from its line {}:\n  page:  {}\n  flags: {}\n\
         Rewrite it with {UPDATE}=1 cargo test -p sluicegate-server --lib flags_doc",
        first_difference + 1,
        on_disk.lines().nth(first_difference).unwrap_or("(the end)"),
        rendered
            .lines()
            .nth(first_difference)
            .unwrap_or("(the end)"),
    );
}
