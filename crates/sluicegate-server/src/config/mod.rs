//! The descriptor configuration: envoyproxy/ratelimit's YAML format (`domain`, nested
//! `descriptors` with `key`, optional `value` and `rate_limit`), extended with sluicegate's
//! algorithms on `rate_limit`: `algorithm`, `window` (any duration instead of `unit`),
//! `burst`, `buckets`, `queue`, `layout` (zset or compact: a sliding log's Redis layout)
//! and `on_store_error` (error, allow, deny or local: this rule's fallback).
//!
//! Every rule is validated while the file is read, so an error names the file, the line
//! and the field.

mod changes;
mod files;
mod limit;
mod raw;
mod tree;
mod wildcard;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use sluicegate::Algorithm;

pub(crate) use changes::listed;
pub(crate) use files::fingerprint;
pub(crate) use limit::{ConfiguredLimit, Entry, with_envoy_counter};
#[cfg(test)]
pub(crate) use raw::DEFAULT_ALGORITHM;
use raw::RawFile;
pub(crate) use tree::place;
use tree::{Build, DescriptorTree};

/// The YAML nodes (mappings, sequences and scalars) one configuration file may hold by
/// default: the YAML reader's own budget, about 22,700 descriptors of one rule each.
pub(crate) const DEFAULT_MAX_NODES: usize = 250_000;

/// The bytes a configuration (every file of it together, or one xDS push) may hold by
/// default: 16 MiB. A file at the node budget is 2 to 4 MB of YAML, so this leaves room
/// for comments and long values, and for several files, while bounding what reading a
/// configuration costs (a few hundred MB at the worst, where an unbounded file cost 25
/// times its size). A Kubernetes ConfigMap holds 1 MiB at most.
pub(crate) const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// The most bytes of a source's words an error quotes: a value or line megabytes long is
/// cut there, so that no log line (nor an xDS NACK) carries a whole configuration.
const MAX_QUOTED_BYTES: usize = 1024;

/// The most bytes a log line quotes of one name a configuration brings (a rule path, an
/// xDS version).
pub(crate) const MAX_QUOTED_NAME_BYTES: usize = 256;

/// The longest key or value of an entry, in bytes, unless `--max-entry-bytes` says: 64 KiB,
/// no tighter than Envoy, whose default cap on a request's headers is 60 KiB
/// (`max_request_headers_kb`), so any header value Envoy forwards as a descriptor value
/// (a JWT claim, a path) fits. envoyproxy/ratelimit bounds entries only by its gRPC
/// message size, 4 MiB (grpc-go's default), which tonic's default also keeps for the
/// whole request here; HTTP bodies stop at 256 KiB.
pub(crate) const DEFAULT_MAX_ENTRY_BYTES: usize = 64 * 1024;

/// How configuration files are read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadOptions {
    /// The algorithm of a `rate_limit` that names none.
    pub(crate) default_algorithm: Algorithm,
    /// The most YAML nodes one file may hold: a bound on the memory and time a file
    /// costs to read, whoever wrote it.
    pub(crate) max_nodes: usize,
    /// The most bytes a configuration may hold, its files together (or one xDS push's
    /// resources): checked before a file is read into memory.
    pub(crate) max_bytes: usize,
    /// In a directory, skip files and directories whose name starts with a dot (editor
    /// swap files, Kubernetes' `..data` copies of a mounted ConfigMap).
    pub(crate) ignore_dotfiles: bool,
    /// Files that declare one domain add their descriptors to it (envoyproxy/ratelimit's
    /// MERGE_DOMAIN_CONFIG); without it a domain declared twice is an error.
    pub(crate) merge_domains: bool,
    /// Fixed windows of whole seconds count in envoy's own Redis keys
    /// (`limit::with_envoy_counter`).
    pub(crate) envoy_counters: bool,
    /// The longest key or value a request may carry (`--max-entry-bytes`): a descriptor's
    /// key or value longer than that could never be matched, and is refused.
    pub(crate) max_entry_bytes: usize,
}

#[cfg(test)]
impl LoadOptions {
    /// The default node budget, with `default_algorithm` for rules that name none; dot
    /// files skipped, domains not merged.
    pub(crate) fn new(default_algorithm: Algorithm) -> Self {
        LoadOptions {
            default_algorithm,
            max_nodes: DEFAULT_MAX_NODES,
            max_bytes: DEFAULT_MAX_BYTES,
            ignore_dotfiles: true,
            merge_domains: false,
            envoy_counters: false,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
        }
    }
}

/// A loaded configuration: one descriptor tree per domain.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, DescriptorTree>,
}

impl Config {
    /// Reads one YAML file, or every file of a directory and of the directories in it,
    /// whatever their names (as envoyproxy/ratelimit reads its runtime directory; dot
    /// files as `options` say). Each holds one domain. A directory without any file is
    /// an error: it would answer every check with an unknown domain.
    pub(crate) fn load(path: &Path, options: LoadOptions) -> Result<Config, ConfigError> {
        let error = |path: &Path, message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let files = files::files(path, options.ignore_dotfiles)
            .map_err(|e| error(path, format!("cannot read: {e}")))?;
        if files.is_empty() {
            return Err(error(
                path,
                "the directory holds no configuration (no file)".into(),
            ));
        }
        Config::load_files(&files, options)
    }

    /// Reads `files`, in this order, as one configuration of at most `options.max_bytes`
    /// bytes.
    fn load_files(files: &[PathBuf], options: LoadOptions) -> Result<Config, ConfigError> {
        let mut read = 0;
        Config::combine(
            files.iter().map(|file| {
                let error = |message: String| ConfigError {
                    path: file.clone(),
                    message,
                };
                let text =
                    files::read_at_most(file, options.max_bytes - read).map_err(|e| match e {
                        files::ReadError::Io(e) => error(format!("cannot read: {e}")),
                        files::ReadError::TooLarge(size) => {
                            error(too_large(size, read, options.max_bytes))
                        }
                    })?;
                read += text.len();
                Ok((file.clone(), Config::parse(file, &text, options)?))
            }),
            options,
        )
    }

    /// Puts `parts` (each read from the source its path names: a file, an xDS resource)
    /// together, in this order, as one configuration: a domain declared twice is merged
    /// with `options.merge_domains`, an error without.
    pub(crate) fn combine(
        parts: impl IntoIterator<Item = Result<(PathBuf, Config), ConfigError>>,
        options: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let error = |path: &Path, message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let mut config = Config::default();
        // The sources that declared each domain so far.
        let mut origin: HashMap<String, Vec<PathBuf>> = HashMap::new();
        for part in parts {
            let (source, part) = part?;
            for (domain, tree) in part.domains {
                let declared = origin.entry(domain.clone()).or_default();
                match config.domains.get_mut(&domain) {
                    Some(merged) if options.merge_domains => {
                        merged.absorb(tree).map_err(|e| {
                            let earlier: Vec<String> =
                                declared.iter().map(|f| f.display().to_string()).collect();
                            error(
                                &source,
                                format!(
                                    "{e}; domain {domain:?} is merged with {}",
                                    earlier.join(", ")
                                ),
                            )
                        })?;
                    }
                    Some(_) => {
                        return Err(error(
                            &source,
                            format!(
                                "domain: {domain:?} is already defined in {} (merge the two \
                                 with --merge-domain-config)",
                                declared[0].display()
                            ),
                        ));
                    }
                    None => {
                        config.domains.insert(domain, tree);
                    }
                }
                declared.push(source.clone());
            }
        }
        Ok(config)
    }

    /// Parses the YAML `text` of the file at `path` (the path only names it in errors).
    pub(crate) fn parse(
        path: &Path,
        text: &str,
        options: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let file: RawFile = serde_saphyr::from_str_with_options(text, reader_options(options))
            .map_err(|e| error(yaml_error(path, options, &e)))?;
        if file.domain.is_empty() {
            return Err(error("domain: must not be empty".into()));
        }
        let mut config = Config::default();
        let build = Build {
            domain: &file.domain,
            default: options.default_algorithm,
            envoy_counters: options.envoy_counters,
            path_bytes: std::cell::Cell::new(0),
            max_path_bytes: options.max_bytes,
            max_entry_bytes: options.max_entry_bytes,
        };
        let mut tree = DescriptorTree::default();
        tree.extend(&build, &file.domain, &[], file.descriptors.0)
            .map_err(error)?;
        config.domains.insert(file.domain, tree);
        Ok(config)
    }

    /// The limit that applies to one request descriptor, as envoyproxy/ratelimit finds it:
    /// walk the tree entry by entry, preferring an exact `key`+`value` child over a `key`
    /// child; the limit is that of the node reached by the last entry. `Err` for an
    /// unknown domain. (Requests go through [`Config::find_all`]; a usage descriptor's key
    /// without its mode entries is looked up alone.)
    pub(crate) fn find(
        &self,
        domain: &str,
        entries: &[Entry],
    ) -> Result<Option<&ConfiguredLimit>, UnknownDomain> {
        Ok(self.domains.get(domain).ok_or(UnknownDomain)?.find(entries))
    }

    /// The limit of each of a request's descriptors, in order, the domain looked up once.
    pub(crate) fn find_all<'c>(
        &'c self,
        domain: &str,
        descriptors: &[Vec<Entry>],
    ) -> Result<Vec<Option<&'c ConfiguredLimit>>, UnknownDomain> {
        let tree = self.domains.get(domain).ok_or(UnknownDomain)?;
        Ok(descriptors
            .iter()
            .map(|entries| tree.find(entries))
            .collect())
    }

    /// Why a request descriptor of `domain` matches no limit, in words (`explain`).
    pub(crate) fn miss(&self, domain: &str, entries: &[Entry]) -> Result<String, UnknownDomain> {
        Ok(self.domains.get(domain).ok_or(UnknownDomain)?.miss(entries))
    }

    /// Whether it declares no domain (an xDS push of no resource, or none yet).
    pub(crate) fn is_empty(&self) -> bool {
        self.domains.is_empty()
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

/// Why a file of `size` bytes (when known), read after `before` bytes of others, is not
/// read: the bound, and the flag that raises it.
fn too_large(size: Option<u64>, before: usize, max_bytes: usize) -> String {
    let what = match (size, before) {
        (Some(size), 0) => format!("{size} bytes, more than"),
        (None, 0) => "more bytes than".to_owned(),
        (Some(size), before) => {
            format!("{size} bytes, after {before} bytes of the files before it: more than")
        }
        (None, before) => format!("after {before} bytes of the files before it, more than"),
    };
    format!(
        "{what} --max-config-bytes ({max_bytes}) allows a configuration; raise \
         --max-config-bytes (SLUICEGATE_MAX_CONFIG_BYTES) to read one this large"
    )
}

/// The YAML reader's options: its default budget, with `options.max_nodes` nodes.
fn reader_options(options: LoadOptions) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    // A node is one parser event, a mapping or sequence two (it also ends): with four
    // events allowed per node, the node budget is the one that binds.
    let max_events = defaults.max_events.max(options.max_nodes.saturating_mul(4));
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: options.max_nodes,
            max_events: max_events,
        },
    }
}

/// A YAML reader's error as the message of a [`ConfigError`]: the snippet, headed by the
/// file's name rather than the reader's "<input>"; a file over the node budget says which
/// flag raises it.
fn yaml_error(path: &Path, options: LoadOptions, e: &serde_saphyr::Error) -> String {
    if let serde_saphyr::Error::Budget {
        breach: serde_saphyr::budget::BudgetBreach::Nodes { .. },
        ..
    } = e.without_snippet()
    {
        return format!(
            "more than {} YAML nodes; raise --max-config-nodes \
             (SLUICEGATE_MAX_CONFIG_NODES) to read a file this large",
            options.max_nodes
        );
    }
    let name = path.display().to_string();
    let rendered = e.render_with_options(serde_saphyr::render_options! {
        source_name: Some(&name),
    });
    // The reader heads its text with "error: ", which the caller already says.
    match rendered.strip_prefix("error: ") {
        Some(rest) => rest.to_owned(),
        None => rendered,
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

impl ConfigError {
    /// An error about the source `path` names (a file, an xDS resource).
    pub(crate) fn new(path: PathBuf, message: String) -> Self {
        ConfigError { path, message }
    }
}

impl fmt::Display for ConfigError {
    /// The source and the message, each cut at [`MAX_QUOTED_BYTES`]: a message may quote
    /// a value or a line of the source, whatever its length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display().to_string();
        write!(
            f,
            "{}: {}",
            clipped(&path, MAX_QUOTED_BYTES),
            clipped(&self.message, MAX_QUOTED_BYTES)
        )
    }
}

/// `text`, or its first `max` bytes (to a character's boundary) and how many are left out.
pub(crate) fn clipped(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end).into()
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod dir_tests;
#[cfg(test)]
pub(crate) mod envoy_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod tests;
