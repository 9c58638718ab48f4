//! The service behind every front end: the configuration in force, the limiter and the
//! metrics. One rate-limit request, whatever protocol brought it, is a domain and
//! descriptors in and the matched rules' decisions out: HTTP and gRPC both call
//! [`Service::decide`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use sluicegate::internals::saturating_micros;
use sluicegate::{AnyStore, Limiter, Rule};

pub(crate) mod explain;

use crate::compat::Counting;
use crate::config::{Config, ConfiguredLimit, Entry, UnknownDomain};
use crate::history::History;
use crate::limit_override::LimitOverride;
use crate::metrics::{METRIC_SERIES_PART, Metrics, RuleMetrics, RuleTotals};
use crate::offenders::{
    DEFAULT_TOP_KEYS, DEFAULT_TOP_PERIOD, Offenders, RuleOffenders, TOP_OFFENDERS_PART,
};

mod answer;
mod counting;
mod options;
mod record;
mod usage;

pub(crate) use answer::{DecideError, Decided, DescriptorOutcome};
pub use options::{EnvoyHeaderNames, ResponseHeaders, ServiceOptions};
pub(crate) use usage::Modes;

/// A configuration in force, with the counters of its rules.
pub(crate) struct Live {
    pub(crate) config: Config,
    rule_metrics: HashMap<String, RuleMetrics>,
    /// Who each rule refused most lately, by configuration path.
    pub(crate) offenders: HashMap<String, Arc<RuleOffenders>>,
    /// 1 for the configuration the service started with, one more for each reload.
    pub(crate) version: u64,
    /// When it was put in force, µs since the Unix epoch.
    pub(crate) loaded_at_us: u64,
    /// The version its source gave it (an xDS push's `version_info`); none for files.
    pub(crate) source_version: Option<String>,
    /// No configuration has come yet: every decision is [`DecideError::NoConfiguration`].
    awaiting_configuration: bool,
}

/// What every front end shares.
pub(crate) struct Service {
    /// The configuration in force, replaced whole when a reload succeeds; a request keeps
    /// the one it started with.
    live: ArcSwap<Live>,
    limiter: Arc<Limiter<AnyStore>>,
    metrics: Metrics,
    offenders: Offenders,
    /// The last minutes of every rule's counters, for the live page.
    history: History,
    /// Which refusals get a log line.
    refusal_log: EvenSample,
    options: ServiceOptions,
}

/// Picks exactly `share` of what it is shown, evenly spread and without a random source:
/// the n-th is picked when ⌊n · share⌋ moves.
#[derive(Debug)]
struct EvenSample {
    share: f64,
    seen: AtomicU64,
}

impl EvenSample {
    fn new(share: f64) -> Self {
        EvenSample {
            share,
            seen: AtomicU64::new(0),
        }
    }

    fn pick(&self) -> bool {
        if self.share <= 0.0 {
            return false;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * self.share).floor() > (n * self.share).floor()
    }
}

/// The limit each descriptor matches in `domain` of the configuration in force, in request
/// order.
fn matched<'c>(
    live: &'c Live,
    domain: &str,
    descriptors: &[Vec<Entry>],
) -> Result<Vec<Option<&'c ConfiguredLimit>>, DecideError> {
    if live.awaiting_configuration {
        return Err(DecideError::NoConfiguration);
    }
    live.config
        .find_all(domain, descriptors)
        .map_err(|UnknownDomain| {
            DecideError::UnknownDomain(format!("domain: unknown domain {domain:?}"))
        })
}

/// envoyproxy/ratelimit's `replaces`: a matched limit that names another one takes its
/// place for this request. The replaced matches become `None`.
fn apply_replaces<'c>(matched: &mut [Option<&'c ConfiguredLimit>]) {
    let replaced: Vec<&'c str> = matched
        .iter()
        .flatten()
        .copied()
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    for limit in matched {
        if limit
            .and_then(|l| l.name.as_deref())
            .is_some_and(|n| replaced.contains(&n))
        {
            *limit = None;
        }
    }
}

/// The key each descriptor of `domain` counts under in its limit (`counter_key`).
fn counted_keys<E: AsRef<[Entry]>>(
    domain: &str,
    descriptors: &[E],
    matched: &[Option<&ConfiguredLimit>],
) -> Vec<String> {
    descriptors
        .iter()
        .zip(matched)
        .map(|(d, limit)| match limit {
            Some(l) => counter_key(domain, l, d.as_ref()),
            None => descriptor_key(d.as_ref()),
        })
        .collect()
}

/// The key a descriptor `entries` of `domain` counts under in `limit`: its entries, but a
/// `share_threshold` wildcard's values count as one (ConfiguredLimit::counted_entries);
/// for a rule kept in envoy's counter, envoy's cache key of them.
fn counter_key(domain: &str, limit: &ConfiguredLimit, entries: &[Entry]) -> String {
    let entries = limit.counted_entries(entries);
    if limit.rule.as_ref().is_some_and(Rule::envoy_counter) {
        envoy_cache_key(domain, &entries)
    } else {
        descriptor_key(&entries)
    }
}

/// envoyproxy/ratelimit's cache key of a descriptor, but for the prefix and the window
/// start (the store adds both: `sluicegate::internals::envoy_counter_key`):
/// `domain_key_value_key2_value2`, an empty value written as nothing
/// (envoyproxy/ratelimit@f2fb157 src/limiter/cache_key.go:62-81).
fn envoy_cache_key(domain: &str, entries: &[Entry]) -> String {
    let bytes: usize = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 2)
        .sum();
    let mut key = String::with_capacity(domain.len() + bytes);
    key.push_str(domain);
    for entry in entries {
        key.push('_');
        key.push_str(&entry.key);
        key.push('_');
        key.push_str(&entry.value);
    }
    key
}

/// The identity of a request descriptor within its rule: every entry, length-prefixed, so
/// that no two different descriptors encode alike whatever characters they hold.
pub(crate) fn descriptor_key(entries: &[Entry]) -> String {
    use std::fmt::Write as _;
    let bytes: usize = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 12)
        .sum();
    let mut key = String::with_capacity(bytes);
    for entry in entries {
        for part in [&entry.key, &entry.value] {
            // Writing to a String cannot fail.
            let _ = write!(key, "{}:{part}", part.len());
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

/// The most descriptors one request may carry (but under `--compat envoy`).
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry (but under `--compat envoy`).
pub(crate) const MAX_ENTRIES: usize = 16;
pub(crate) use crate::config::DEFAULT_MAX_ENTRY_BYTES;

impl Live {
    fn new(
        config: Config,
        metrics: &Metrics,
        offenders: &Offenders,
        version: u64,
        loaded_at_us: u64,
    ) -> Self {
        let rule_metrics = metrics.rules_of(&config);
        let limits = config.limits();
        let offenders = offenders.for_paths(
            limits
                .iter()
                .filter(|l| l.rule.is_some() || l.blocked())
                .map(|l| l.path.as_str()),
            loaded_at_us,
        );
        Live {
            config,
            rule_metrics,
            offenders,
            version,
            loaded_at_us,
            source_version: None,
            awaiting_configuration: false,
        }
    }

    /// Every rule's counters as they stand, by configuration path.
    pub(crate) fn rule_totals(&self) -> HashMap<String, RuleTotals> {
        self.rule_metrics
            .iter()
            .map(|(path, metrics)| (path.clone(), metrics.totals()))
            .collect()
    }
}

/// A request descriptor as people read it: `key=value` entries joined by `,`.
pub(crate) fn descriptor_text(entries: &[Entry]) -> String {
    let mut text = String::new();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&e.key);
        text.push('=');
        text.push_str(&e.value);
    }
    text
}

impl Service {
    /// A service deciding with `limiter` by the rules of `config`.
    pub(crate) fn new(
        config: Config,
        limiter: Arc<Limiter<AnyStore>>,
        options: ServiceOptions,
    ) -> Self {
        let memory = limiter.memory();
        let metrics = Metrics::new(
            options.near_limit_ratio,
            options.envoy_stats.clone(),
            memory.part(METRIC_SERIES_PART),
        );
        let offenders = Offenders::new(
            DEFAULT_TOP_KEYS,
            DEFAULT_TOP_PERIOD,
            memory.part(TOP_OFFENDERS_PART),
        );
        let now = saturating_micros(limiter.clock().now());
        let live = ArcSwap::from_pointee(Live::new(config, &metrics, &offenders, 1, now));
        Service {
            live,
            limiter,
            metrics,
            offenders,
            history: History::default(),
            refusal_log: EvenSample::new(options.refusal_log_share),
            options,
        }
    }

    /// A service deciding with `limiter` once a configuration is put in force
    /// ([`Service::replace_config`]); until then every decision fails
    /// ([`DecideError::NoConfiguration`]).
    pub(crate) fn awaiting_configuration(
        limiter: Arc<Limiter<AnyStore>>,
        options: ServiceOptions,
    ) -> Self {
        let service = Service::new(Config::default(), limiter, options);
        let awaiting = Live {
            awaiting_configuration: true,
            ..Live::new(
                Config::default(),
                &service.metrics,
                &service.offenders,
                1,
                service.now_micros(),
            )
        };
        service.live.store(Arc::new(awaiting));
        service
    }

    /// The configuration in force now.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts `config` in force for every request that starts from now on; its source
    /// calls it `source_version`, if anything.
    pub(crate) fn replace_config(&self, config: Config, source_version: Option<String>) {
        let version = self.live.load().version + 1;
        let live = Live {
            source_version,
            ..Live::new(
                config,
                &self.metrics,
                &self.offenders,
                version,
                self.now_micros(),
            )
        };
        self.live.store(Arc::new(live));
    }

    pub(crate) fn limiter(&self) -> &Limiter<AnyStore> {
        &self.limiter
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Samples every rule's counters into the history (the server does, every
    /// [`crate::history::SAMPLE_PERIOD`]).
    pub(crate) fn sample_history(&self) {
        let totals = self.live().rule_totals();
        self.history.record(self.now_micros(), totals);
    }

    /// Drops the `detailed_metric` series idle by now (the server does, every
    /// [`crate::history::SAMPLE_PERIOD`]).
    pub(crate) fn expire_detailed_series(&self) {
        let live = self.live();
        self.metrics
            .expire_detailed(self.now_micros(), |key| live.rule_metrics.contains_key(key));
    }

    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    /// Now, on the limiter's clock: what every part of the service reads the time from.
    pub(crate) fn now_micros(&self) -> u64 {
        saturating_micros(self.limiter.clock().now())
    }

    pub(crate) fn options(&self) -> &ServiceOptions {
        &self.options
    }

    /// Refuses a request too large or empty to decide, naming the field. Under `--compat
    /// envoy` neither descriptors nor entries are counted, and a descriptor without entries
    /// is decided (it matches nothing), as envoyproxy/ratelimit does: only the bytes of an
    /// entry, and the message's, bound a request then.
    fn validate(&self, descriptors: &[Vec<Entry>]) -> Result<(), DecideError> {
        if descriptors.is_empty() {
            return Err(DecideError::Invalid(
                "descriptors: at least one is required".into(),
            ));
        }
        let counted = self.options.compat.counts_descriptors();
        if counted && descriptors.len() > MAX_DESCRIPTORS {
            return Err(DecideError::Invalid(format!(
                "descriptors: {} given, at most {MAX_DESCRIPTORS} allowed",
                descriptors.len()
            )));
        }
        for (i, entries) in descriptors.iter().enumerate() {
            if counted && (entries.is_empty() || entries.len() > MAX_ENTRIES) {
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
        Ok(())
    }

    /// Matches every descriptor and decides all the limited ones: those in a mode that may
    /// refuse (`check`, `reserve`) in one check, all-or-nothing; the others in one check
    /// per mode and request id (docs/SPEC.md, "Envoy compatibility: counting"). Two
    /// descriptors that land on the same rule and key in one check share one limit and
    /// one answer.
    pub(crate) async fn decide(
        &self,
        domain: &str,
        descriptors: &[Vec<Entry>],
        costs: &[u64],
        overrides: &[Option<LimitOverride>],
        given: Modes<'_>,
    ) -> Result<Decided, DecideError> {
        self.validate(descriptors)?;
        let live = self.live();
        let config = &live.config;
        let mut matched = matched(&live, domain, descriptors)?;
        let usage::Resolved {
            entries: descriptors,
            modes,
        } = usage::resolve(given, descriptors, &mut matched, |e| {
            config.find(domain, e).ok().flatten()
        })?;
        // A descriptor's `limit` takes the place of what it matched (limit_override.rs);
        // Envoy sends none on most requests.
        let overridden = if overrides.iter().all(Option::is_none) {
            Vec::new()
        } else {
            descriptors
                .iter()
                .zip(&matched)
                .zip(overrides)
                .enumerate()
                .map(|(i, ((entries, configured), limit))| {
                    limit
                        .map(|o| {
                            o.apply(
                                domain,
                                entries,
                                *configured,
                                self.options.compat.envoy_counters(),
                            )
                        })
                        .transpose()
                        .map_err(|e| DecideError::Invalid(format!("descriptors[{i}].{e}")))
                })
                .collect::<Result<Vec<Option<ConfiguredLimit>>, DecideError>>()?
        };
        for (limit, overridden) in matched.iter_mut().zip(&overridden) {
            if let Some(overridden) = overridden {
                *limit = Some(overridden);
            }
        }
        apply_replaces(&mut matched);
        // A block refuses a request; a report, settle or refund is never refused.
        let blocked = matched.iter().zip(&modes).any(|(l, m)| {
            l.is_some_and(|l| l.blocked() && !l.shadow_mode) && m.charge.may_refuse()
        });

        let keys = counted_keys(domain, &descriptors, &matched);
        usage::validate(given, &matched, &keys, costs, &modes)?;
        let asked = Instant::now();
        let counted = match self.options.counting {
            Counting::EachDescriptor => self.decide_each(&matched, &keys, costs, &modes).await,
            together => {
                self.decide_grouped(&matched, &keys, costs, &modes, blocked, together)
                    .await
            }
        };
        if let Err(DecideError::RequestIdConflict(conflict)) = &counted {
            // Logged at a rule's 1st, 2nd, 4th, 8th… conflict: a client sending them by the
            // million writes a few dozen lines, and the metric counts every one.
            let count = self.metrics.request_id_conflict(&conflict.rule);
            if count.is_power_of_two() {
                tracing::warn!(
                    domain,
                    request_id = conflict.request_id,
                    rule = conflict.rule,
                    remembered = %conflict.remembered,
                    asked = %conflict.asked,
                    conflicts_so_far = count,
                    "request refused: its request id was used before for another request"
                );
            }
        }
        let (decisions, outcome, refusable) = counted?;
        let store_time = asked.elapsed();

        let descriptors = matched
            .iter()
            .zip(decisions)
            .zip(&descriptors)
            .zip(costs)
            .zip(&modes)
            .map(|((((limit, decision), entries), &cost), mode)| {
                let decision = match limit {
                    Some(l) if l.blocked() && mode.charge.may_refuse() => Some(self.block(l)),
                    _ => decision,
                };
                self.record(
                    &live,
                    domain,
                    record::DecidedDescriptor {
                        limit: *limit,
                        decision: decision.as_ref(),
                        entries,
                        cost,
                        charge: mode.charge,
                    },
                );
                DescriptorOutcome {
                    path: limit.map(|l| l.path.clone()),
                    name: limit.and_then(|l| l.name.clone()),
                    block_window: limit.and_then(|l| l.block_window),
                    rule: limit.and_then(|l| l.rule.clone()),
                    decision,
                    unlimited: limit.is_some_and(|l| l.rule.is_none() && !l.blocked()),
                    shadow: limit.is_some_and(|l| l.shadow_mode),
                    charge: mode.charge,
                }
            })
            .collect();
        Ok(Decided {
            descriptors,
            outcome,
            refusable,
            blocked,
            store_time,
        })
    }

    /// Forgets the state of every limit `descriptors` match, as if they had never been
    /// used; the paths of the limits forgotten.
    pub(crate) async fn forget(
        &self,
        domain: &str,
        descriptors: &[Vec<Entry>],
    ) -> Result<Vec<String>, DecideError> {
        let live = self.live();
        let mut forgotten = Vec::new();
        for (entries, limit) in descriptors.iter().zip(matched(&live, domain, descriptors)?) {
            if let Some((limit, rule)) = limit.and_then(|l| Some(l).zip(l.rule.as_ref())) {
                self.limiter
                    .store()
                    .forget(rule, &counter_key(domain, limit, entries))
                    .await?;
                forgotten.push(limit.path.clone());
            }
        }
        Ok(forgotten)
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
