//! What a reload changed, rule by rule, for the log line it writes.

use std::collections::HashMap;

use sluicegate::RuleSpec;

use super::{Config, ConfiguredLimit};

/// The limits of a new configuration against the one it replaces, by path.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    pub(crate) added: Vec<String>,
    pub(crate) removed: Vec<String>,
    /// Present in both, with other numbers, algorithm, name, mode or replacements.
    pub(crate) edited: Vec<String>,
}

/// What decides how a limit answers; two limits of a path alike in this are unchanged.
fn behaviour(
    l: &ConfiguredLimit,
) -> (
    Option<RuleSpec>,
    bool,
    bool,
    bool,
    &[String],
    &Option<String>,
) {
    (
        l.rule.as_ref().map(sluicegate::Rule::spec),
        l.blocked(),
        l.shadow_mode,
        l.detailed_metric,
        &l.replaces,
        &l.name,
    )
}

impl Config {
    /// What `self` changes of `before`, each list sorted by path.
    pub(crate) fn changes_from(&self, before: &Config) -> Changes {
        let old: HashMap<&str, &ConfiguredLimit> = before
            .limits()
            .into_iter()
            .map(|l| (l.path.as_str(), l))
            .collect();
        let new = self.limits();
        let mut changes = Changes::default();
        for limit in &new {
            match old.get(limit.path.as_str()) {
                None => changes.added.push(limit.path.clone()),
                Some(was) if behaviour(was) != behaviour(limit) => {
                    changes.edited.push(limit.path.clone());
                }
                Some(_) => {}
            }
        }
        let kept: std::collections::HashSet<&str> = new.iter().map(|l| l.path.as_str()).collect();
        changes.removed = old
            .keys()
            .filter(|path| !kept.contains(*path))
            .map(|path| (*path).to_owned())
            .collect();
        changes.removed.sort();
        changes
    }
}

/// The most rule paths a log line lists of each kind.
const LISTED_PATHS: usize = 32;

/// `paths` for a log line, comma-separated: the first [`LISTED_PATHS`], each cut at
/// [`super::MAX_QUOTED_NAME_BYTES`], then how many more there are; so that a configuration of many
/// rules, or of values megabytes long, is not written out whole in the log.
pub(crate) fn listed(paths: &[String]) -> String {
    let mut shown: Vec<_> = paths
        .iter()
        .take(LISTED_PATHS)
        .map(|path| super::clipped(path, super::MAX_QUOTED_NAME_BYTES))
        .collect();
    let more = paths.len().saturating_sub(LISTED_PATHS);
    if more > 0 {
        shown.push(format!("… {more} more").into());
    }
    shown.join(",")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{DEFAULT_ALGORITHM, LoadOptions};

    #[test]
    fn a_log_line_lists_few_paths_and_cuts_long_ones() {
        let paths: Vec<String> = (0..40).map(|i| format!("d.k_{i}")).collect();
        let line = listed(&paths);
        assert!(line.starts_with("d.k_0,d.k_1,"), "{line}");
        assert!(line.ends_with(",d.k_31,… 8 more"), "{line}");
        let long = listed(&["d.".to_owned() + &"v".repeat(1_000_000)]);
        assert!(long.len() < 300, "{}", long.len());
        assert!(long.ends_with("… (999746 more bytes)"), "{long}");
        assert_eq!(listed(&[]), "");
    }

    fn parse(text: &str) -> Config {
        Config::parse(
            Path::new("t.yaml"),
            text,
            LoadOptions::new(DEFAULT_ALGORITHM),
        )
        .unwrap()
    }

    #[test]
    fn a_reload_names_the_rules_added_removed_and_edited() {
        let before = parse(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
             - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
             - key: c\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        let after = parse(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
             - key: b\n    rate_limit: {unit: minute, requests_per_unit: 6}\n  \
             - key: e\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        assert_eq!(
            after.changes_from(&before),
            Changes {
                added: vec!["d.e".into()],
                removed: vec!["d.c".into()],
                edited: vec!["d.b".into()],
            }
        );
        assert_eq!(after.changes_from(&after), Changes::default());
    }
}
