//! The service behind every front end: the configuration in force, the limiter and the
//! metrics. One rate-limit request, whatever protocol brought it, is a domain and
//! descriptors in and the matched rules' decisions out: HTTP and gRPC both call
//! [`Service::decide`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sluicegate::{
    AnyStore, Charge, Check, Clock, DecidedBy, Decision, Limit, Limiter, Outcome, Rule, StoreError,
    SystemClock,
};

use crate::compat::{Compat, Counting};
use crate::config::{Config, ConfiguredLimit, Entry, UnknownDomain};
use crate::history::History;
use crate::limit_override::LimitOverride;
use crate::metrics::{Metrics, RuleMetrics, RuleTotals};
use crate::offenders::{DEFAULT_TOP_KEYS, DEFAULT_TOP_PERIOD, Offenders, RuleOffenders};

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
    /// Serve the live page at `GET /ui`.
    pub ui: bool,
    /// The share of refusals logged, one line each (`--log-refusals`, 0 to 1).
    pub refusal_log_share: f64,
    /// Whose semantics the service keeps (`--compat`).
    pub compat: Compat,
    /// How a request's descriptors are counted (`--compat` and
    /// `--stop-increment-when-over-limit`, resolved by [`Compat::counting`]).
    pub counting: Counting,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            shadow_mode: false,
            near_limit_ratio: crate::metrics::DEFAULT_NEAR_LIMIT_RATIO,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            response_headers: ResponseHeaders::None,
            envoy_header_names: EnvoyHeaderNames::default(),
            admin_token: None,
            require_noeviction: false,
            ui: true,
            refusal_log_share: 0.0,
            compat: Compat::None,
            counting: Counting::AllOrNothing,
        }
    }
}

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
    clock: Arc<dyn Clock>,
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
    /// How long the limiter's part took: the store's round trips (or what stood in for
    /// the store); next to nothing when no limited rule matched.
    pub(crate) store_time: Duration,
}

impl Decided {
    /// The answer when no limit applies to any of `count` descriptors: allowed, no store
    /// asked.
    pub(crate) fn unlimited(count: usize) -> Self {
        let nothing = || DescriptorOutcome {
            path: None,
            name: None,
            block_window: None,
            rule: None,
            decision: None,
            unlimited: false,
            shadow: false,
        };
        Decided {
            descriptors: (0..count).map(|_| nothing()).collect(),
            outcome: None,
            blocked: false,
            store_time: Duration::ZERO,
        }
    }

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
    /// The request names a domain no configuration declares; the message says which.
    /// Envoy's protocol answers it OK with no limit, as envoyproxy/ratelimit does;
    /// sluicegate's own API refuses it as bad input.
    UnknownDomain(String),
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
        .map_err(|UnknownDomain| {
            DecideError::UnknownDomain(format!("domain: unknown domain {domain:?}"))
        })
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
/// The longest key or value of an entry, in bytes, unless `--max-entry-bytes` says: 64 KiB,
/// no tighter than Envoy, whose default cap on a request's headers is 60 KiB
/// (`max_request_headers_kb`), so any header value Envoy forwards as a descriptor value
/// (a JWT claim, a path) fits. envoyproxy/ratelimit bounds entries only by its gRPC
/// message size, 4 MiB (grpc-go's default), which tonic's default also keeps for the
/// whole request here; HTTP bodies stop at 256 KiB.
pub(crate) const DEFAULT_MAX_ENTRY_BYTES: usize = 64 * 1024;

impl Live {
    fn new(config: Config, metrics: &Metrics, offenders: &Offenders, version: u64) -> Self {
        let rule_metrics = metrics.rules_of(&config);
        let loaded_at_us = offenders.now();
        let limits = config.limits();
        let offenders = offenders.for_paths(
            limits
                .iter()
                .filter(|l| l.rule.is_some() || l.blocked)
                .map(|l| l.path.as_str()),
        );
        Live {
            config,
            rule_metrics,
            offenders,
            version,
            loaded_at_us,
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
    let parts: Vec<String> = entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    parts.join(",")
}

impl Service {
    /// A service deciding with `limiter` by the rules of `config`.
    pub(crate) fn new(
        config: Config,
        limiter: Arc<Limiter<AnyStore>>,
        options: ServiceOptions,
    ) -> Self {
        let metrics = Metrics::new(options.near_limit_ratio);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let offenders = Offenders::new(Arc::clone(&clock), DEFAULT_TOP_KEYS, DEFAULT_TOP_PERIOD);
        let live = ArcSwap::from_pointee(Live::new(config, &metrics, &offenders, 1));
        Service {
            live,
            limiter,
            metrics,
            offenders,
            history: History::default(),
            clock,
            refusal_log: EvenSample::new(options.refusal_log_share),
            options,
        }
    }

    /// The configuration in force now.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts `config` in force for every request that starts from now on.
    pub(crate) fn replace_config(&self, config: Config) {
        let version = self.live.load().version + 1;
        let live = Live::new(config, &self.metrics, &self.offenders, version);
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
        self.history.record(self.clock.now_micros(), totals);
    }

    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    pub(crate) fn now_micros(&self) -> u64 {
        self.clock.now_micros()
    }

    pub(crate) fn offenders(&self) -> &Offenders {
        &self.offenders
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
        costs: &[u64],
        overrides: &[Option<LimitOverride>],
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
        // A descriptor's `limit` takes the place of what it matched (limit_override.rs).
        let overridden = descriptors
            .iter()
            .zip(&matched)
            .zip(overrides)
            .enumerate()
            .map(|(i, ((entries, configured), limit))| {
                limit
                    .map(|o| o.apply(domain, entries, *configured))
                    .transpose()
                    .map_err(|e| DecideError::Invalid(format!("descriptors[{i}].{e}")))
            })
            .collect::<Result<Vec<Option<ConfiguredLimit>>, DecideError>>()?;
        for (limit, overridden) in matched.iter_mut().zip(&overridden) {
            if let Some(overridden) = overridden {
                *limit = Some(overridden);
            }
        }
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

        // A descriptor counts under its limit by its entries, but a `share_threshold`
        // wildcard's values count as one (ConfiguredLimit::counted_entries).
        let keys: Vec<String> = descriptors
            .iter()
            .zip(&matched)
            .map(|(d, limit)| match limit {
                Some(l) => descriptor_key(&l.counted_entries(d)),
                None => descriptor_key(d),
            })
            .collect();
        let asked = Instant::now();
        let (decisions, outcome) = match self.options.counting {
            Counting::EachDescriptor => {
                self.decide_each(&matched, &keys, costs, request_id).await?
            }
            Counting::AllOrNothing => {
                self.decide_together(
                    &matched,
                    &keys,
                    costs,
                    request_id,
                    blocked,
                    Charge::Admitted,
                )
                .await?
            }
            Counting::StopIncrementWhenOverLimit => {
                self.decide_together(
                    &matched,
                    &keys,
                    costs,
                    request_id,
                    blocked,
                    Charge::Attempted,
                )
                .await?
            }
        };
        let store_time = asked.elapsed();

        let descriptors = matched
            .iter()
            .zip(decisions)
            .zip(descriptors)
            .zip(costs)
            .map(|(((limit, decision), entries), &cost)| {
                let decision = match limit {
                    Some(l) if l.blocked => Some(self.block(l)),
                    _ => decision,
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
                    if !decision.allowed
                        && !l.shadow_mode
                        && let Some(tracker) = live.offenders.get(&l.path)
                    {
                        let descriptor = descriptor_text(entries);
                        if self.refusal_log.pick() {
                            tracing::info!(
                                target: "sluicegate::refusal",
                                domain,
                                rule = %l.path,
                                descriptor = %descriptor,
                                cost,
                                limit = decision.limit,
                                retry_after_us = decision.retry_after.as_signed_micros(),
                                "refused"
                            );
                        }
                        tracker.record(&descriptor, cost, self.offenders.now());
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
            store_time,
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

    /// sluicegate's counting (and envoy's with `--stop-increment-when-over-limit`): the
    /// enforced limits in one check, under `charge`; shadow ones in another, so that they
    /// can never refuse or hold back the others. Two descriptors that land on the same
    /// rule and key share one limit and one answer (their costs: below). A block refuses
    /// the request without
    /// asking the store. Each descriptor's decision, and the enforced limits' outcome.
    async fn decide_together(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        request_id: Option<&str>,
        blocked: bool,
        charge: Charge,
    ) -> Result<(Vec<Option<Decision>>, Option<Outcome>), DecideError> {
        // Each limit at its own cost: two descriptors on one rule and key are one limit,
        // at the larger of their costs; under envoy's counting at their sum, as envoy
        // counts each.
        let mut enforced: Vec<(Limit<'_>, u64)> = Vec::new();
        let mut shadow: Vec<(Limit<'_>, u64)> = Vec::new();
        let mut slot_of: Vec<Option<(bool, usize)>> = Vec::new();
        for ((limit, key), &cost) in matched.iter().zip(keys).zip(costs) {
            let slot = limit.and_then(|l| {
                let rule = l.rule.as_ref()?;
                let list = if l.shadow_mode {
                    &mut shadow
                } else {
                    &mut enforced
                };
                let index = match list
                    .iter()
                    .position(|(x, _)| x.key == key && x.rule.same_identity(rule))
                {
                    Some(i) => {
                        list[i].1 = if charge == Charge::Attempted {
                            list[i].1.saturating_add(cost)
                        } else {
                            list[i].1.max(cost)
                        };
                        i
                    }
                    None => {
                        list.push((Limit { rule, key }, cost));
                        list.len() - 1
                    }
                };
                Some((l.shadow_mode, index))
            });
            slot_of.push(slot);
        }
        let outcome = if enforced.is_empty() || blocked {
            None
        } else {
            Some(self.run_costed(&enforced, request_id, charge).await?)
        };
        let shadow_outcome = if shadow.is_empty() {
            None
        } else {
            Some(self.run_costed(&shadow, request_id, charge).await?)
        };
        let decisions = slot_of
            .iter()
            .map(|slot| match slot {
                Some((false, i)) => outcome.as_ref().map(|o| o.limits()[*i]),
                Some((true, i)) => shadow_outcome.as_ref().map(|o| o.limits()[*i]),
                None => None,
            })
            .collect();
        Ok((decisions, outcome))
    }

    /// envoy's counting: each limited descriptor a check of its own, at its own cost, its
    /// refusal charged; in request order, as envoy's pipeline runs. The outcome combines
    /// the enforced ones (docs/SPEC.md, "Several rules in one check", for the fields).
    async fn decide_each(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        request_id: Option<&str>,
    ) -> Result<(Vec<Option<Decision>>, Option<Outcome>), DecideError> {
        let mut decisions = Vec::with_capacity(matched.len());
        let mut enforced = Vec::new();
        let mut decided_by = DecidedBy::Store;
        for ((limit, key), &cost) in matched.iter().zip(keys).zip(costs) {
            let Some((l, rule)) = limit.and_then(|l| Some(l).zip(l.rule.as_ref())) else {
                decisions.push(None);
                continue;
            };
            let outcome = self
                .run(
                    &[Limit { rule, key }],
                    cost,
                    &[],
                    request_id,
                    Charge::Attempted,
                )
                .await?;
            if !l.shadow_mode {
                enforced.push(outcome.decision);
                if outcome.decided_by != DecidedBy::Store {
                    decided_by = outcome.decided_by;
                }
            }
            decisions.push(Some(outcome.decision));
        }
        let outcome = Decision::combine(&enforced).map(|decision| {
            let mut outcome = Outcome::single(decision);
            outcome.decided_by = decided_by;
            outcome
        });
        Ok((decisions, outcome))
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
                    .forget(rule, &descriptor_key(&limit.counted_entries(entries)))
                    .await?;
                forgotten.push(limit.path.clone());
            }
        }
        Ok(forgotten)
    }

    /// One check of `limits`, each at its own cost.
    async fn run_costed(
        &self,
        limits: &[(Limit<'_>, u64)],
        request_id: Option<&str>,
        charge: Charge,
    ) -> Result<Outcome, DecideError> {
        let (limits, costs): (Vec<Limit<'_>>, Vec<u64>) = limits.iter().copied().unzip();
        // One cost for all, the common case, keeps the check's cheaper shape.
        let uniform = costs.iter().all(|&c| c == costs[0]);
        self.run(
            &limits,
            costs[0],
            if uniform { &[] } else { &costs },
            request_id,
            charge,
        )
        .await
    }

    /// One check of `limits`, timed and counted.
    async fn run(
        &self,
        limits: &[Limit<'_>],
        cost: u64,
        costs: &[u64],
        request_id: Option<&str>,
        charge: Charge,
    ) -> Result<Outcome, DecideError> {
        let check = Check {
            costs,
            request_id,
            charge,
            ..Check::new(limits, cost)
        };
        let started = Instant::now();
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
