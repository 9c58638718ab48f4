//! One domain's descriptor tree: built from the raw YAML, walked to match a request.
//!
//! A level is matched as envoyproxy/ratelimit matches it (`GetLimit` in
//! `src/config/config_impl.go`): the entry's key and value exactly (a wildcard's own text
//! too), else the first wildcard of that key, in the order the file declares them, that
//! the value matches, else the key alone. Unlike envoyproxy/ratelimit, which joins key
//! and value with `_`, keys and values are kept apart: `{key: a_b}` and
//! `{key: a, value: b}` are two descriptors, and `a*` never matches a key `a_b`.

use std::collections::HashMap;

use sluicegate::{Algorithm, Rule};

use super::limit::{ConfiguredLimit, Entry, with_envoy_counter};
use super::raw::{RawDescriptor, RawRateLimit, with_lease};
use super::wildcard::Wildcard;

/// One level of the tree: its nodes, and how an entry finds one.
#[derive(Debug, Default)]
pub(super) struct DescriptorTree {
    nodes: Vec<Node>,
    /// key → value → node, wildcard values by their text.
    by_key_value: HashMap<String, HashMap<String, usize>>,
    /// key → its wildcard values, in the order declared.
    wildcards: HashMap<String, Vec<(Wildcard, usize)>>,
    /// key → the node of that key without a value.
    by_key: HashMap<String, usize>,
}

#[derive(Debug)]
struct Node {
    /// The key it matches, and its value if it has one.
    matched: (String, Option<String>),
    /// `domain.key_value…`, as errors and metrics name it.
    path: String,
    /// Where its `key` is written.
    line: u64,
    limit: Option<ConfiguredLimit>,
    children: DescriptorTree,
}

/// The scope of the rule at `path` of `domain`: its identity with its name, whatever its
/// numbers (the domain's length first, as a domain may hold dots).
pub(crate) fn place(domain: &str, path: &str) -> String {
    format!("{}:{path}", domain.len())
}

/// What building a level needs besides its descriptors.
pub(super) struct Build<'a> {
    pub(super) domain: &'a str,
    pub(super) default: Algorithm,
    /// Fixed windows count in envoy's own Redis keys (`limit::with_envoy_counter`).
    pub(super) envoy_counters: bool,
    /// The bytes of the descriptor paths built so far, and the most they may come to. A
    /// path spells every key and value above its node, so values nested deep make paths
    /// that hold far more than the text they came from: bounded like the text is.
    pub(super) path_bytes: std::cell::Cell<usize>,
    pub(super) max_path_bytes: usize,
    /// The longest key or value a request may carry: a longer one here matches nothing.
    pub(super) max_entry_bytes: usize,
}

impl DescriptorTree {
    /// Adds `descriptors` to this level, whose path is `prefix` (the domain, or the path of
    /// the parent) and whose ancestors' `share_threshold` wildcards are `shared`, one per
    /// level above.
    pub(super) fn extend(
        &mut self,
        build: &Build<'_>,
        prefix: &str,
        shared: &[Option<String>],
        descriptors: Vec<RawDescriptor>,
    ) -> Result<(), String> {
        for raw in descriptors {
            let node = node(build, prefix, shared, raw)?;
            self.insert(node)?;
        }
        Ok(())
    }

    /// Adds the nodes of `other`, a level of the same place read from another file, after
    /// this one's (its wildcards are tried after these).
    pub(super) fn absorb(&mut self, other: DescriptorTree) -> Result<(), String> {
        for node in other.nodes {
            self.insert(node)?;
        }
        Ok(())
    }

    /// Files `node` under its key and value, last among its key's wildcards; a node of
    /// the same key and value already here is an error, and leaves the level as it was.
    fn insert(&mut self, node: Node) -> Result<(), String> {
        let index = self.nodes.len();
        let (key, value) = node.matched.clone();
        let taken = match &value {
            Some(value) => self
                .by_key_value
                .get(&key)
                .is_some_and(|values| values.contains_key(value)),
            None => self.by_key.contains_key(&key),
        };
        if taken {
            return Err(format!(
                "line {}: {}: duplicate descriptor (same key and value at one level)",
                node.line, node.path
            ));
        }
        match value {
            Some(value) => {
                if let Some(wildcard) = Wildcard::new(&value) {
                    self.wildcards
                        .entry(key.clone())
                        .or_default()
                        .push((wildcard, index));
                }
                self.by_key_value
                    .entry(key)
                    .or_default()
                    .insert(value, index);
            }
            None => {
                self.by_key.insert(key, index);
            }
        }
        self.nodes.push(node);
        Ok(())
    }

    /// The limit that applies to one request descriptor: walk the tree entry by entry
    /// (see the module's comment for how a level is matched); the limit is that of the
    /// node reached by the last entry.
    pub(super) fn find(&self, entries: &[Entry]) -> Option<&ConfiguredLimit> {
        self.walk(entries).ok()?.limit.as_ref()
    }

    /// Why one request descriptor matches no limit, in words: where the walk stopped.
    pub(super) fn miss(&self, entries: &[Entry]) -> String {
        match self.walk(entries) {
            Ok(node) => match &node.limit {
                Some(_) => format!("{} has a limit", node.path),
                None => format!("{} has no rate_limit of its own", node.path),
            },
            Err((i, level)) => {
                let Some(entry) = entries.get(i) else {
                    return "a descriptor without entries matches nothing".to_owned();
                };
                // Wildcard values are filed among the values too.
                let known = level.by_key_value.contains_key(&entry.key);
                let place = if i == 0 {
                    "the domain".to_owned()
                } else {
                    format!("entries[{}]'s node", i - 1)
                };
                if known {
                    format!(
                        "entries[{i}]: {place} has rules for key {:?}, none for value {:?} \
                         and none for the key alone",
                        entry.key, entry.value
                    )
                } else {
                    format!("entries[{i}]: {place} has no rule for key {:?}", entry.key)
                }
            }
        }
    }

    /// The node the last of `entries` reaches, or the index of the entry no node of its
    /// level matches, with that level.
    fn walk(&self, entries: &[Entry]) -> Result<&Node, (usize, &DescriptorTree)> {
        let mut level = self;
        let mut reached = None;
        for (i, entry) in entries.iter().enumerate() {
            let exact = level
                .by_key_value
                .get(&entry.key)
                .and_then(|values| values.get(&entry.value));
            let wildcard = || {
                level.wildcards.get(&entry.key).and_then(|wildcards| {
                    wildcards
                        .iter()
                        .find(|(wildcard, _)| wildcard.matches(&entry.value))
                        .map(|(_, index)| index)
                })
            };
            let index = exact
                .or_else(wildcard)
                .or_else(|| level.by_key.get(&entry.key))
                .ok_or((i, level))?;
            let node = &level.nodes[*index];
            reached = Some(node);
            level = &node.children;
        }
        // A descriptor without entries reaches no node (under `--compat envoy` it is
        // decided: it matches nothing, as in envoyproxy/ratelimit).
        reached.ok_or((0, self))
    }

    /// Appends every limit of the tree to `out`.
    pub(super) fn collect_limits<'a>(&'a self, out: &mut Vec<&'a ConfiguredLimit>) {
        for node in &self.nodes {
            out.extend(node.limit.as_ref());
            node.children.collect_limits(out);
        }
    }
}

/// The node of one descriptor, its children built.
fn node(
    build: &Build<'_>,
    prefix: &str,
    shared: &[Option<String>],
    raw: RawDescriptor,
) -> Result<Node, String> {
    let line = raw.key.referenced.line();
    let key = raw.key.value.clone();
    let value = raw.value().map(str::to_owned);
    let path = match &value {
        Some(value) => format!("{prefix}.{key}_{value}"),
        None => format!("{prefix}.{key}"),
    };
    for (field, text) in [("key", Some(key.as_str())), ("value", value.as_deref())] {
        let Some(text) = text.filter(|t| t.len() > build.max_entry_bytes) else {
            continue;
        };
        // The message before the path: a path this long is cut where the error is shown.
        return Err(format!(
            "line {line}: {field}: {} bytes, longer than --max-entry-bytes ({}) lets a \
             request carry, so no request could match it: {path}",
            text.len(),
            build.max_entry_bytes
        ));
    }
    let total = build.path_bytes.get().saturating_add(path.len());
    if total > build.max_path_bytes {
        // The message before the path: a path this long is cut where the error is shown.
        return Err(format!(
            "line {line}: the descriptor paths of this file (the domain, and each key and \
             value above a descriptor, for every descriptor) come to more than \
             --max-config-bytes ({}) here: values nest too deep or are too long: {path}",
            build.max_path_bytes
        ));
    }
    build.path_bytes.set(total);
    let error = |field: &str, message: &str| format!("line {line}: {path}: {field}: {message}");
    if key.is_empty() {
        return Err(error("key", "must not be empty"));
    }
    let wildcard = value.as_deref().filter(|v| v.contains('*'));
    if raw.share_threshold && wildcard.is_none() {
        // As envoyproxy/ratelimit: sharing needs values to share among.
        return Err(error(
            "share_threshold",
            "only a wildcard value (one with *) shares its threshold",
        ));
    }
    let mut shared = shared.to_vec();
    shared.push(wildcard.filter(|_| raw.share_threshold).map(str::to_owned));
    let flags = Flags {
        shadow_mode: raw.shadow_mode,
        detailed_metric: raw.detailed_metric,
    };
    let limit = raw
        .rate_limit
        .map(|rate_limit| configured_limit(build, &path, &shared, flags, rate_limit))
        .transpose()
        .map_err(|e| format!("line {line}: {e}"))?;
    let mut children = DescriptorTree::default();
    children.extend(build, &path, &shared, raw.descriptors.0)?;
    Ok(Node {
        matched: (key, value),
        path,
        line,
        limit,
        children,
    })
}

/// What a descriptor says of its limit besides its `rate_limit`.
#[derive(Clone, Copy)]
struct Flags {
    shadow_mode: bool,
    detailed_metric: bool,
}

/// The limit a descriptor's `rate_limit` sets, its rule built under the server's default
/// algorithm if it names none.
fn configured_limit(
    build: &Build<'_>,
    path: &str,
    shared: &[Option<String>],
    flags: Flags,
    rate_limit: RawRateLimit,
) -> Result<ConfiguredLimit, String> {
    let RawRateLimit {
        spec,
        algorithm_given,
        block_window,
        name,
        replaces,
        on_store_error,
        lease,
        usage,
    } = rate_limit;
    let rule = spec
        .map(|mut spec| {
            if !algorithm_given {
                spec.algorithm = build.default;
            }
            // Its identity is its place: scoped by the domain and the descriptor path (the
            // domain's length first, as it may hold dots), so another domain's or
            // descriptor's rule of the same name keeps its own counters, and a reload that
            // changes only numbers keeps usage. The name is still reported as written.
            let place = place(build.domain, path);
            Rule::new(name.as_deref().unwrap_or(path), &spec)
                .and_then(|rule| with_lease(rule, lease))
                .map_err(|e| format!("{path}: rate_limit.{e}"))
                .map(|rule| rule.in_scope(&place))
                .map(|rule| match on_store_error {
                    Some(policy) => rule.with_failure_policy(policy),
                    None => rule,
                })
                .map(|rule| with_envoy_counter(rule, build.envoy_counters, usage))
        })
        .transpose()?;
    Ok(ConfiguredLimit {
        rule,
        block_window,
        path: path.to_owned(),
        name,
        replaces,
        shadow_mode: flags.shadow_mode,
        detailed_metric: flags.detailed_metric,
        usage,
        shared_values: if shared.iter().any(Option::is_some) {
            shared.to_vec()
        } else {
            Vec::new()
        },
    })
}
