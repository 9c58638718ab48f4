//! One domain's descriptor tree: built from the raw YAML, walked to match a request.

use std::collections::HashMap;

use sluicegate::{Algorithm, Rule};

use super::limit::{ConfiguredLimit, Entry};
use super::raw::{RawDescriptor, RawRateLimit};

/// The children of one level of the tree: matched by key and value first, then by a
/// wildcard value (`prefix*`, the longest prefix first), then by key alone.
#[derive(Debug, Default)]
pub(super) struct DescriptorTree {
    /// key → value → node.
    by_key_value: HashMap<String, HashMap<String, Node>>,
    /// key → (value prefix, node), longest prefix first.
    by_key_prefix: HashMap<String, Vec<(String, Node)>>,
    by_key: HashMap<String, Node>,
}

#[derive(Debug)]
pub(super) struct Node {
    limit: Option<ConfiguredLimit>,
    children: DescriptorTree,
}

/// The tree of `descriptors` of `domain` under `prefix` (the domain, or the path of the
/// parent).
pub(super) fn build(
    domain: &str,
    prefix: &str,
    descriptors: Vec<RawDescriptor>,
    default: Algorithm,
) -> Result<DescriptorTree, String> {
    let mut tree = DescriptorTree::default();
    for raw in descriptors {
        let path = match &raw.value {
            Some(value) => format!("{prefix}.{}_{value}", raw.key),
            None => format!("{prefix}.{}", raw.key),
        };
        let limit = match raw.rate_limit {
            None => None,
            Some(RawRateLimit {
                spec,
                algorithm_given,
                blocked,
                block_window,
                name,
                replaces,
                on_store_error,
            }) => {
                let rule = spec
                    .map(|mut spec| {
                        if !algorithm_given {
                            spec.algorithm = default;
                        }
                        // Named within its domain: another domain's rule of the same name
                        // keeps its own counters; the name is still reported as written.
                        Rule::new(name.as_deref().unwrap_or(&path), &spec)
                            .map_err(|e| format!("{path}: rate_limit.{e}"))
                            .map(|rule| rule.in_scope(domain))
                            .map(|rule| match on_store_error {
                                Some(policy) => rule.with_failure_policy(policy),
                                None => rule,
                            })
                    })
                    .transpose()?;
                Some(ConfiguredLimit {
                    rule,
                    blocked,
                    block_window,
                    path: path.clone(),
                    name,
                    replaces,
                    shadow_mode: raw.shadow_mode,
                    detailed_metric: raw.detailed_metric,
                })
            }
        };
        let node = Node {
            limit,
            children: build(domain, &path, raw.descriptors.0, default)?,
        };
        let duplicate = match raw.value {
            Some(value) if value.ends_with('*') => {
                let prefix = value.trim_end_matches('*').to_owned();
                let nodes = tree.by_key_prefix.entry(raw.key).or_default();
                let duplicate = nodes.iter().any(|(p, _)| *p == prefix);
                nodes.push((prefix, node));
                nodes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
                duplicate
            }
            Some(value) => tree
                .by_key_value
                .entry(raw.key)
                .or_default()
                .insert(value, node)
                .is_some(),
            None => tree.by_key.insert(raw.key, node).is_some(),
        };
        if duplicate {
            return Err(format!("{path}: duplicate descriptor (same key and value)"));
        }
    }
    Ok(tree)
}

impl DescriptorTree {
    /// The limit that applies to one request descriptor, as envoyproxy/ratelimit finds it:
    /// walk the tree entry by entry, preferring an exact `key`+`value` child, then a
    /// wildcard value, then a `key` child; the limit is that of the node reached by the
    /// last entry.
    pub(super) fn find(&self, entries: &[Entry]) -> Option<&ConfiguredLimit> {
        let mut level = self;
        let mut found = None;
        for (i, entry) in entries.iter().enumerate() {
            let exact = level
                .by_key_value
                .get(&entry.key)
                .and_then(|values| values.get(&entry.value));
            let wildcard = || {
                level.by_key_prefix.get(&entry.key).and_then(|nodes| {
                    nodes
                        .iter()
                        .find(|(prefix, _)| entry.value.starts_with(prefix.as_str()))
                        .map(|(_, node)| node)
                })
            };
            let node = exact
                .or_else(wildcard)
                .or_else(|| level.by_key.get(&entry.key))?;
            if i + 1 == entries.len() {
                found = node.limit.as_ref();
            }
            level = &node.children;
        }
        found
    }

    /// Appends every limit of the tree to `out`.
    pub(super) fn collect_limits<'a>(&'a self, out: &mut Vec<&'a ConfiguredLimit>) {
        let exact = self.by_key_value.values().flat_map(HashMap::values);
        let wildcard = self.by_key_prefix.values().flatten().map(|(_, node)| node);
        for node in exact.chain(wildcard).chain(self.by_key.values()) {
            out.extend(node.limit.as_ref());
            node.children.collect_limits(out);
        }
    }
}
