//! The descriptor configuration: envoyproxy/ratelimit's YAML format (`domain`, nested
//! `descriptors` with `key`, optional `value` and `rate_limit`), extended with sluicegate's
//! algorithms on `rate_limit`: `algorithm`, `window` (any duration instead of `unit`),
//! `burst`, `buckets`, `queue`, `layout` (zset or compact: a sliding log's Redis layout)
//! and `on_store_error` (error, allow, deny or local: this rule's fallback).
//!
//! Every rule is validated while the file is read, so an error names the file, the line
//! and the field.

mod files;
mod limit;
mod raw;
mod tree;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use sluicegate::Algorithm;

pub(crate) use files::{FileStamp, fingerprint};
pub(crate) use limit::{ConfiguredLimit, Entry};
#[cfg(test)]
pub(crate) use raw::DEFAULT_ALGORITHM;
use raw::RawFile;
use tree::DescriptorTree;

/// A loaded configuration: one descriptor tree per domain.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, DescriptorTree>,
}

impl Config {
    /// Reads one YAML file, or every `.yaml` and `.yml` file of a directory (one domain
    /// each, as envoyproxy/ratelimit reads its runtime directory).
    pub(crate) fn load(path: &Path, default: Algorithm) -> Result<Config, ConfigError> {
        let error = |path: &Path, message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let files = files::files(path).map_err(|e| error(path, format!("cannot read: {e}")))?;
        let mut config = Config::default();
        let mut origin: HashMap<String, PathBuf> = HashMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| error(&file, format!("cannot read: {e}")))?;
            for (domain, tree) in Config::parse(&file, &text, default)?.domains {
                if let Some(first) = origin.get(&domain) {
                    return Err(error(
                        &file,
                        format!(
                            "domain: {domain:?} is already defined in {}",
                            first.display()
                        ),
                    ));
                }
                origin.insert(domain.clone(), file.clone());
                config.domains.insert(domain, tree);
            }
        }
        Ok(config)
    }

    /// Parses the YAML `text` of the file at `path` (the path only names it in errors);
    /// a `rate_limit` without an `algorithm` gets `default`.
    pub(crate) fn parse(
        path: &Path,
        text: &str,
        default: Algorithm,
    ) -> Result<Config, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let file: RawFile = serde_saphyr::from_str(text).map_err(|e| {
            // The snippet's header names the file, not the reader's "<input>".
            let name = path.display().to_string();
            error(e.render_with_options(serde_saphyr::render_options! {
                source_name: Some(&name),
            }))
        })?;
        if file.domain.is_empty() {
            return Err(error("domain: must not be empty".into()));
        }
        let mut config = Config::default();
        let tree =
            tree::build(&file.domain, &file.domain, file.descriptors.0, default).map_err(error)?;
        config.domains.insert(file.domain, tree);
        Ok(config)
    }

    /// The limit that applies to one request descriptor, as envoyproxy/ratelimit finds it:
    /// walk the tree entry by entry, preferring an exact `key`+`value` child over a `key`
    /// child; the limit is that of the node reached by the last entry. `Err` for an
    /// unknown domain.
    pub(crate) fn find(
        &self,
        domain: &str,
        entries: &[Entry],
    ) -> Result<Option<&ConfiguredLimit>, UnknownDomain> {
        Ok(self.domains.get(domain).ok_or(UnknownDomain)?.find(entries))
    }

    /// Every configured limit, for listing.
    pub(crate) fn limits(&self) -> Vec<&ConfiguredLimit> {
        let mut out = Vec::new();
        for tree in self.domains.values() {
            tree.collect_limits(&mut out);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

/// The request named a domain no configuration file declares.
#[derive(Debug)]
pub(crate) struct UnknownDomain;

/// A configuration that cannot be used: names the file and, where the YAML reader knows
/// them, the line, column and field.
#[derive(Debug)]
pub(crate) struct ConfigError {
    path: PathBuf,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests;
