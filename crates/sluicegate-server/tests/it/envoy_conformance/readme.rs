//! The list of cases in this directory's README.md, generated from the case files:
//! `the_readme_lists_every_case` fails when it is stale, and with
//! `SLUICEGATE_CONFORMANCE_BLESS=1` writes the fresh one.

use super::cases::{self, Case, ConfigSource, Load, Mode};

const BEGIN: &str = "<!-- cases: generated from cases/*.yaml, do not edit -->";
const END: &str = "<!-- end of cases -->";

fn modes(case: &Case) -> String {
    let names: Vec<&str> = case.modes.iter().map(|m| m.name()).collect();
    names.join(", ")
}

fn config(case: &Case) -> String {
    match &case.config {
        ConfigSource::Path(path) => format!("`{path}`"),
        ConfigSource::Files(paths) => paths
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(" + "),
        ConfigSource::Inline { .. } => "inline".into(),
    }
}

fn render(cases: &[Case]) -> String {
    let mut out = vec![BEGIN.to_owned(), String::new()];
    out.push("| case | what it shows | modes | config | source |".into());
    out.push("|---|---|---|---|---|".into());
    for case in cases {
        let about = match (&case.load, case.counting) {
            (Load::Rejected(_), _) => format!("{} (rejected)", case.about),
            (_, true) => format!("{} (counting)", case.about),
            _ => case.about.clone(),
        };
        let source = case
            .source
            .trim_start_matches("envoyproxy/ratelimit@f2fb157 ");
        out.push(format!(
            "| `{}` | {about} | {} | {} | {source} |",
            case.id,
            modes(case),
            config(case)
        ));
    }
    out.push(String::new());
    out.push(
        "Counting cases — envoy's counting, expected to differ in default mode, where a refused \
         check costs nothing and a check is all-or-nothing:"
            .into(),
    );
    out.push(String::new());
    for case in cases
        .iter()
        .filter(|c| c.counting && c.modes.contains(&Mode::Default))
    {
        out.push(format!("- `{}`: {}", case.id, case.about));
    }
    out.push(String::new());
    out.push("Where sluicegate answers otherwise than envoy, on purpose:".into());
    out.push(String::new());
    for case in cases {
        if let Some(why) = &case.deviation {
            out.push(format!("- `{}`: {}", case.id, why.trim()));
        }
    }
    out.push(String::new());
    out.push(END.into());
    out.join("\n")
}

pub(crate) fn check(cases: &[Case]) {
    let path = cases::dir().join("README.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        panic!("{}: no {BEGIN} … {END} block", path.display());
    };
    let fresh = render(cases);
    let current = &text[begin..end + END.len()];
    if current == fresh {
        return;
    }
    if std::env::var_os("SLUICEGATE_CONFORMANCE_BLESS").is_some() {
        let updated = format!("{}{fresh}{}", &text[..begin], &text[end + END.len()..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "{} lists stale cases (SLUICEGATE_CONFORMANCE_BLESS=1 rewrites it); it should read:\n{fresh}",
        path.display()
    );
}
