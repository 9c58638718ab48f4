//! The service behind every front end: the configuration in force, the limiter and the
//! metrics. One rate-limit request, whatever protocol brought it, is a domain and
//! descriptors in and the matched rules' decisions out: HTTP and gRPC both call
//! [`Service::decide`].

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sluicegate::{AnyStore, Check, Decision, Limit, Limiter, Outcome, Rule, StoreError};

use crate::compat::Compat;
use crate::config::{Config, ConfiguredLimit, Entry, UnknownDomain};
use crate::metrics::{Metrics, RuleMetrics};

/// The rate-limit headers an Envoy answer asks Envoy to add to the client's response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponseHeaders {
    /// None: what a configuration names stays between Envoy and the service.
    #[default]
    None,
    /// envoyproxy/ratelimit's three (`LIMIT_RESPONSE_HEADERS_ENABLED`), named by
    /// [`EnvoyHeaderNames`], from the descriptor closest to its limit.
    Envoy,
    /// IETF `RateLimit` and `RateLimit-Policy`, `Retry-After` on a refusal, and who decided.
    Ietf,
}

/// The names of envoyproxy/ratelimit's headers (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyHeaderNames {
    /// The limit's requests per unit.
    pub limit: String,
    /// What remains of it.
    pub remaining: String,
    /// Whole seconds until it resets.
    pub reset: String,
}

impl Default for EnvoyHeaderNames {
    /// envoyproxy/ratelimit's defaults (envoyproxy/ratelimit@f2fb157
    /// src/settings/settings.go:117-121).
    fn default() -> Self {
        EnvoyHeaderNames {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// How the front ends answer, beside what the configuration says.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// Whose semantics the answers keep (`--compat`).
    pub compat: Compat,
    /// Envoy answers are OK even over the limit (`--shadow-mode`).
    pub shadow_mode: bool,
    /// A hit is near its limit past this share of it (`--near-limit-ratio`).
    pub near_limit_ratio: f32,
    /// The longest descriptor key or value accepted, in bytes.
    pub max_entry_bytes: usize,
    /// The headers Envoy answers ask to add (gRPC and `/json`).
    pub response_headers: ResponseHeaders,
    /// The names of [`ResponseHeaders::Envoy`]'s headers.
    pub envoy_header_names: EnvoyHeaderNames,
    /// The bearer token `/v1/reset` needs; `None` turns it off.
    pub admin_token: Option<Arc<str>>,
    /// Not ready (`/readyz` 503) while a Redis server's `maxmemory-policy` may evict keys,
    /// or cannot be read.
    pub require_noeviction: bool,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            compat: Compat::Sluicegate,
            shadow_mode: false,
            near_limit_ratio: crate::metrics::DEFAULT_NEAR_LIMIT_RATIO,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            response_headers: ResponseHeaders::None,
            envoy_header_names: EnvoyHeaderNames::default(),
            admin_token: None,
            require_noeviction: false,
        }
    }
}

/// A configuration in force, with the counters of its rules.
pub(crate) struct Live {
    pub(crate) config: Config,
    rule_metrics: HashMap<String, RuleMetrics>,
}

/// What every front end shares.
pub(crate) struct Service {
    /// The configuration in force, replaced whole when a reload succeeds; a request keeps
    /// the one it started with.
    live: ArcSwap<Live>,
    limiter: Arc<Limiter<AnyStore>>,
    metrics: Metrics,
    options: ServiceOptions,
}

/// What became of each request descriptor.
pub(crate) struct DescriptorOutcome {
    /// The matched configuration path; `None` when nothing matched (or the match was
    /// replaced by another limit of the request).
    pub(crate) path: Option<String>,
    /// The matched limit's `name`, when the configuration gives one.
    pub(crate) name: Option<String>,
    /// A matched block's unit in µs, when it names one.
    pub(crate) block_window: Option<u64>,
    /// The matched rule; `None` for `unlimited`, for a block (`requests_per_unit: 0`),
    /// or no match.
    pub(crate) rule: Option<Rule>,
    /// The rule's decision; `None` when no limited rule matched.
    pub(crate) decision: Option<Decision>,
    /// The matched limit is `unlimited`.
    pub(crate) unlimited: bool,
    /// The limit is in shadow mode: decided and counted, never enforced.
    pub(crate) shadow: bool,
}

/// The answer to one request.
pub(crate) struct Decided {
    pub(crate) descriptors: Vec<DescriptorOutcome>,
    /// The enforced limits' outcome; `None` when no descriptor matched an enforced,
    /// limited rule.
    pub(crate) outcome: Option<Outcome>,
    /// A matched block (`requests_per_unit: 0`) refuses the request.
    pub(crate) blocked: bool,
}

impl Decided {
    pub(crate) fn allowed(&self) -> bool {
        !self.blocked && self.outcome.as_ref().is_none_or(|o| o.decision.allowed)
    }
}

/// A block's decision: over the limit, and it will never pass. Its reset is the end of
/// its unit's window, when it names a unit ([`Service::block`]).
const BLOCKED: Decision = Decision {
    allowed: false,
    limit: 0,
    remaining: 0,
    retry_after: sluicegate::RetryAfter::Never,
    reset_after: 0,
    delay: 0,
};

/// Why a request could not be decided.
pub(crate) enum DecideError {
    /// The request is malformed: say what is wrong.
    Invalid(String),
    /// The store could not decide and no policy decided for it.
    Store(StoreError),
}

impl From<StoreError> for DecideError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCheck(message) => DecideError::Invalid(message),
            other => DecideError::Store(other),
        }
    }
}

/// The limit each descriptor matches in `domain` of `config`, in request order.
fn matched<'c>(
    config: &'c Config,
    domain: &str,
    descriptors: &[Vec<Entry>],
) -> Result<Vec<Option<&'c ConfiguredLimit>>, DecideError> {
    config
        .find_all(domain, descriptors)
        .map_err(|UnknownDomain| DecideError::Invalid(format!("domain: unknown domain {domain:?}")))
}

/// The identity of a request descriptor within its rule: every entry, length-prefixed, so
/// that no two different descriptors encode alike whatever characters they hold.
pub(crate) fn descriptor_key(entries: &[Entry]) -> String {
    let mut key = String::new();
    for entry in entries {
        for part in [&entry.key, &entry.value] {
            key.push_str(&part.len().to_string());
            key.push(':');
            key.push_str(part);
        }
    }
    key
}

/// A `detailed_metric` limit's stat key for one request descriptor: the domain, then each
/// entry's `key_value`, as envoyproxy/ratelimit builds it (src/config/config_impl.go:480-498).
fn detailed_key(domain: &str, entries: &[Entry]) -> String {
    let mut key = domain.to_owned();
    for entry in entries {
        key.push('.');
        key.push_str(&entry.key);
        key.push('_');
        key.push_str(&entry.value);
    }
    key
}

/// The most descriptors one request may carry.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 16;
/// The longest key or value of an entry, in bytes, unless `--max-entry-bytes` says.
pub(crate) const DEFAULT_MAX_ENTRY_BYTES: usize = 1024;

impl Live {
    fn new(config: Config, metrics: &Metrics) -> Self {
        let rule_metrics = metrics.rules_of(&config);
        Live {
            config,
            rule_metrics,
        }
    }
}

impl Service {
    /// A service deciding with `limiter` by the rules of `config`.
    pub(crate) fn new(
        config: Config,
        limiter: Arc<Limiter<AnyStore>>,
        options: ServiceOptions,
    ) -> Self {
        let metrics = Metrics::new(options.near_limit_ratio);
        let live = ArcSwap::from_pointee(Live::new(config, &metrics));
        Service {
            live,
            limiter,
            metrics,
            options,
        }
    }

    /// The configuration in force now.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts `config` in force for every request that starts from now on.
    pub(crate) fn replace_config(&self, config: Config) {
        self.live.store(Arc::new(Live::new(config, &self.metrics)));
    }

    pub(crate) fn limiter(&self) -> &Limiter<AnyStore> {
        &self.limiter
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn options(&self) -> &ServiceOptions {
        &self.options
    }

    /// Matches every descriptor and decides all the limited ones in one check, all-or-nothing.
    /// Two descriptors that land on the same rule and key share one limit and one answer.
    pub(crate) async fn decide(
        &self,
        domain: &str,
        descriptors: &[Vec<Entry>],
        cost: u64,
        request_id: Option<&str>,
    ) -> Result<Decided, DecideError> {
        if descriptors.is_empty() {
            return Err(DecideError::Invalid(
                "descriptors: at least one is required".into(),
            ));
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(DecideError::Invalid(format!(
                "descriptors: {} given, at most {MAX_DESCRIPTORS} allowed",
                descriptors.len()
            )));
        }
        for (i, entries) in descriptors.iter().enumerate() {
            if entries.is_empty() || entries.len() > MAX_ENTRIES {
                return Err(DecideError::Invalid(format!(
                    "descriptors[{i}].entries: 1 to {MAX_ENTRIES} entries are required, {} given",
                    entries.len()
                )));
            }
            for (j, entry) in entries.iter().enumerate() {
                for (field, text) in [("key", &entry.key), ("value", &entry.value)] {
                    if text.len() > self.options.max_entry_bytes {
                        return Err(DecideError::Invalid(format!(
                            "descriptors[{i}].entries[{j}].{field}: {} bytes, at most \
                         {} allowed",
                            text.len(),
                            self.options.max_entry_bytes
                        )));
                    }
                }
            }
        }
        let live = self.live();
        let config = &live.config;
        let mut matched = matched(config, domain, descriptors)?;
        // envoyproxy/ratelimit's `replaces`: a matched limit that names another one takes its
        // place for this request.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        for limit in &mut matched {
            if limit
                .and_then(|l| l.name.as_deref())
                .is_some_and(|n| replaced.contains(&n))
            {
                *limit = None;
            }
        }
        let blocked = matched
            .iter()
            .flatten()
            .any(|l| l.blocked && !l.shadow_mode);

        // Enforced limits are decided together, all-or-nothing; shadow ones apart, so that
        // they can never refuse or hold back the others.
        let keys: Vec<String> = descriptors.iter().map(|d| descriptor_key(d)).collect();
        let mut enforced: Vec<Limit<'_>> = Vec::new();
        let mut shadow: Vec<Limit<'_>> = Vec::new();
        let mut slot_of: Vec<Option<(bool, usize)>> = Vec::new();
        for (limit, key) in matched.iter().zip(&keys) {
            let slot = limit.and_then(|l| {
                let rule = l.rule.as_ref()?;
                let list = if l.shadow_mode {
                    &mut shadow
                } else {
                    &mut enforced
                };
                let index = list
                    .iter()
                    .position(|x| x.key == key && x.rule.same_identity(rule))
                    .unwrap_or_else(|| {
                        list.push(Limit { rule, key });
                        list.len() - 1
                    });
                Some((l.shadow_mode, index))
            });
            slot_of.push(slot);
        }
        // A block refuses the request without asking the store.
        let outcome = if enforced.is_empty() || blocked {
            None
        } else {
            Some(self.run(&enforced, cost, request_id).await?)
        };
        let shadow_outcome = if shadow.is_empty() {
            None
        } else {
            Some(self.run(&shadow, cost, request_id).await?)
        };

        let descriptors = matched
            .iter()
            .zip(&slot_of)
            .zip(descriptors)
            .map(|((limit, slot), entries)| {
                let decision = match (limit, slot) {
                    (Some(l), _) if l.blocked => Some(self.block(l)),
                    (_, Some((false, i))) => outcome.as_ref().map(|o| o.limits()[*i]),
                    (_, Some((true, i))) => shadow_outcome.as_ref().map(|o| o.limits()[*i]),
                    _ => None,
                };
                if let (Some(l), Some(decision)) = (limit, &decision) {
                    match live.rule_metrics.get(&l.path) {
                        // Labelled by the request's values: looked up per decision.
                        _ if l.detailed_metric => self
                            .metrics
                            .rule_metrics(&detailed_key(domain, entries))
                            .count(decision, cost, l.shadow_mode),
                        Some(counters) => counters.count(decision, cost, l.shadow_mode),
                        None => {
                            self.metrics
                                .rule_metrics(&l.path)
                                .count(decision, cost, l.shadow_mode)
                        }
                    }
                }
                DescriptorOutcome {
                    path: limit.map(|l| l.path.clone()),
                    name: limit.and_then(|l| l.name.clone()),
                    block_window: limit.and_then(|l| l.block_window),
                    rule: limit.and_then(|l| l.rule.clone()),
                    decision,
                    unlimited: limit.is_some_and(|l| l.rule.is_none() && !l.blocked),
                    shadow: limit.is_some_and(|l| l.shadow_mode),
                }
            })
            .collect();
        Ok(Decided {
            descriptors,
            outcome,
            blocked,
        })
    }

    /// A block's decision now: it resets when its unit's window, aligned to the epoch as a
    /// fixed window's, ends (as envoyproxy/ratelimit reports it).
    fn block(&self, limit: &ConfiguredLimit) -> Decision {
        let now = self.limiter.clock().now_micros();
        Decision {
            reset_after: limit.block_window.map_or(0, |window| window - now % window),
            ..BLOCKED
        }
    }

    /// Forgets the state of every limit `descriptors` match, as if they had never been
    /// used; the paths of the limits forgotten.
    pub(crate) async fn forget(
        &self,
        domain: &str,
        descriptors: &[Vec<Entry>],
    ) -> Result<Vec<String>, DecideError> {
        let live = self.live();
        let config = &live.config;
        let mut forgotten = Vec::new();
        for (entries, limit) in descriptors
            .iter()
            .zip(matched(config, domain, descriptors)?)
        {
            if let Some((limit, rule)) = limit.and_then(|l| Some(l).zip(l.rule.as_ref())) {
                self.limiter
                    .store()
                    .forget(rule, &descriptor_key(entries))
                    .await?;
                forgotten.push(limit.path.clone());
            }
        }
        Ok(forgotten)
    }

    /// One check of `limits`, timed and counted.
    async fn run(
        &self,
        limits: &[Limit<'_>],
        cost: u64,
        request_id: Option<&str>,
    ) -> Result<Outcome, DecideError> {
        let check = Check {
            request_id,
            ..Check::new(limits, cost)
        };
        let started = std::time::Instant::now();
        let outcome = self.limiter.decide(&check).await?;
        self.metrics.check(outcome.decided_by, started.elapsed());
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_keys_do_not_collide() {
        let e = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        let pairs = [
            vec![e("a", "b:c")],
            vec![e("a:b", "c")],
            vec![e("a", "b"), e("c", "")],
            vec![e("a", "b1:c0:")],
        ];
        let keys: Vec<String> = pairs.iter().map(|p| descriptor_key(p)).collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
