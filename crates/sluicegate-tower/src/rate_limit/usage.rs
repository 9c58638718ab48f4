//! Usage-based limits: what a response cost, charged after it (docs/SPEC.md, "Usage").
//! Where that cost is read, what the request-time check takes, the per-request ids, and
//! the counters that show what went wrong. The after-charge itself is `after.rs`.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, HeaderName, Response};
use sluicegate::{Charge, Check};

use super::in_flight::InFlight;

/// What a response cost, put in its extensions by the inner service, for a layer that
/// reads its cost with [`Usage::from_extension`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseCost(pub u64);

/// How a layer charges requests whose cost is known only once the response comes back
/// (the tokens an LLM answer used): set with
/// [`RateLimitLayer::charge_after`](crate::RateLimitLayer::charge_after).
///
/// At request time the layer either peeks (the default: a check of 0 units, which refuses
/// a key that is spent — in debt or exactly at its limit — and takes nothing) or reserves
/// an estimate ([`Usage::reserve`]). When the inner service's response head comes back,
/// its cost is read and charged under a request id of the layer's making: a report of the
/// cost after a peek, a settle after a reservation (the difference charged or refunded).
/// The response is returned at once; the charge runs beside it, retried with the same id
/// on a store error (so a retry never counts twice), and never fails or holds the
/// response. At shutdown, [`Usage::drain`] waits for the charges still in flight.
#[derive(Clone)]
pub struct Usage {
    cost: CostSource,
    estimate: Option<Estimate>,
    when_missing: Option<u64>,
    keep_header: bool,
    pub(super) attempts: u32,
    pub(super) attempt_timeout: Duration,
    ids: Arc<RequestIds>,
    pub(super) stats: Arc<UsageStats>,
    pub(super) in_flight: InFlight,
}

#[derive(Clone)]
enum CostSource {
    Header(HeaderName),
    Extension,
}

/// What a reservation takes at request time.
#[derive(Clone, Debug)]
pub enum Estimate {
    /// The same number of units for every request.
    Fixed(u64),
    /// A request header's value (a client's `max_tokens`, say); `default` when the header
    /// is missing or not a whole number below 2^53.
    Header {
        /// The request header.
        name: HeaderName,
        /// The estimate when the header does not give one.
        default: u64,
    },
}

/// How many times the after-charge is tried unless [`Usage::attempts`] says otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 4;

/// How long one try of the after-charge may take unless [`Usage::attempt_timeout`] says
/// otherwise: a store that does not answer by then is tried again.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

impl Usage {
    /// The cost is the response header `name`, a whole number of units (e.g.
    /// `x-usage-tokens`). The header is removed from the response unless
    /// [`Usage::keep_header`]: it is the inner service's word to the layer.
    pub fn from_header(name: HeaderName) -> Self {
        Usage::new(CostSource::Header(name))
    }

    /// The cost is the [`ResponseCost`] the inner service put in the response's extensions.
    pub fn from_extension() -> Self {
        Usage::new(CostSource::Extension)
    }

    fn new(cost: CostSource) -> Self {
        Usage {
            cost,
            estimate: None,
            when_missing: None,
            keep_header: false,
            attempts: DEFAULT_ATTEMPTS,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            ids: Arc::new(RequestIds::new()),
            stats: Arc::default(),
            in_flight: InFlight::default(),
        }
    }

    /// Reserves `estimate` at request time instead of peeking: a request is admitted only
    /// if its estimate fits, and the settle after the response charges the difference
    /// between the real cost and the estimate, or refunds it.
    pub fn reserve(mut self, estimate: Estimate) -> Self {
        self.estimate = Some(estimate);
        self
    }

    /// What a response whose cost is missing or unreadable is charged. By default its
    /// estimate: a reservation stands as it was taken, and after a peek nothing is charged
    /// (there was no estimate). Either way the response is counted in
    /// [`UsageStats::missing_costs`] and logged.
    pub fn when_missing(mut self, cost: u64) -> Self {
        self.when_missing = Some(cost);
        self
    }

    /// Keeps the cost header in the response the client gets (removed by default).
    pub fn keep_header(mut self, keep: bool) -> Self {
        self.keep_header = keep;
        self
    }

    /// How many times the after-charge is tried when the store fails or takes longer than
    /// [`Usage::attempt_timeout`] (at least 1; [`DEFAULT_ATTEMPTS`] by default), waiting
    /// 100 ms, 200 ms, … between tries. Every try carries the same request id, so a try
    /// whose answer was lost is not counted twice. An invalid check (a
    /// [`Usage::when_missing`] cost of 2^53 or more) is not tried again.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// How long one try of the after-charge may take ([`DEFAULT_ATTEMPT_TIMEOUT`] by
    /// default); a try that takes longer counts as a failed one.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The counters of this usage and of every layer it was given to.
    pub fn stats(&self) -> Arc<UsageStats> {
        Arc::clone(&self.stats)
    }

    /// The after-charges of this usage (and of every layer it was given to) still in
    /// flight.
    pub fn pending(&self) -> usize {
        self.in_flight.len()
    }

    /// Waits up to `timeout` for the after-charges in flight, for a graceful shutdown once
    /// the server has stopped taking requests; gives up those still pending then, each
    /// counted in [`UsageStats::failed`] and logged, and returns how many it gave up. After
    /// a drain that ran out of time every later charge is given up at once.
    pub async fn drain(&self, timeout: Duration) -> u64 {
        self.in_flight.drain(timeout).await
    }

    /// A request id no other request of any layer, in this process or another, is given.
    pub(crate) fn next_request_id(&self) -> String {
        self.ids.next()
    }

    /// The request-time check's mode and cost: a peek, or the reservation of the estimate.
    pub(crate) fn request_charge(&self, parts: &Parts) -> (Charge, u64) {
        match &self.estimate {
            None => (Charge::Check, 0),
            Some(Estimate::Fixed(units)) => (Charge::Reserve, *units),
            Some(Estimate::Header { name, default }) => (
                Charge::Reserve,
                units_of(&parts.headers, name).unwrap_or(*default),
            ),
        }
    }

    /// What `response` cost, taking the cost header out unless it is kept; the fallback
    /// (counted, logged) when it gives none. `estimate` is what the request-time check took.
    pub(crate) fn response_cost<B>(&self, response: &mut Response<B>, estimate: u64) -> u64 {
        let found = match &self.cost {
            CostSource::Header(name) => {
                let units = units_of(response.headers(), name);
                if !self.keep_header {
                    response.headers_mut().remove(name);
                }
                units
            }
            CostSource::Extension => response
                .extensions()
                .get::<ResponseCost>()
                .map(|cost| cost.0)
                .filter(|&units| units <= Check::MAX_COST),
        };
        found.unwrap_or_else(|| {
            let charged = self.when_missing.unwrap_or(estimate);
            self.stats.missing_costs.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                source = %self.cost,
                charged,
                "rate limit usage: the response gives no readable cost"
            );
            charged
        })
    }
}

impl fmt::Display for CostSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostSource::Header(name) => write!(f, "header {name}"),
            CostSource::Extension => f.write_str("extension ResponseCost"),
        }
    }
}

/// A header's value as a whole number of units below 2^53, surrounding spaces allowed.
fn units_of(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let value = headers.get(name)?.to_str().ok()?;
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&units| units <= Check::MAX_COST)
}

/// What the after-charges did, for a metric or a test. Every count only grows.
#[derive(Debug, Default)]
pub struct UsageStats {
    recorded: AtomicU64,
    nothing_to_charge: AtomicU64,
    missing_costs: AtomicU64,
    retries: AtomicU64,
    failed: AtomicU64,
}

impl UsageStats {
    /// Responses whose after-charge the store recorded.
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Responses after a peek that cost 0 units: no report is sent (it would record
    /// nothing).
    pub fn nothing_to_charge(&self) -> u64 {
        self.nothing_to_charge.load(Ordering::Relaxed)
    }

    /// Responses that gave no readable cost, charged [`Usage::when_missing`].
    pub fn missing_costs(&self) -> u64 {
        self.missing_costs.load(Ordering::Relaxed)
    }

    /// After-charges tried again after a store error.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// After-charges given up after every attempt failed: their units were not recorded.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn count_recorded(&self) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_nothing_to_charge(&self) {
        self.nothing_to_charge.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Request ids: 128 random bits, made once, and a sequence number. The bits come from the
/// standard library's per-process random hash keys (seeded by the operating system), so
/// two instances — processes, hosts — sharing a store never make the same id, without a
/// dependency for it.
struct RequestIds {
    instance: u128,
    sequence: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        let high = RandomState::new().hash_one(std::process::id());
        let low = RandomState::new().hash_one(high);
        RequestIds {
            instance: (u128::from(high) << 64) | u128::from(low),
            sequence: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("{:032x}-{sequence:x}", self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(header: Option<&str>) -> Response<()> {
        let mut builder = Response::builder();
        if let Some(value) = header {
            builder = builder.header("x-usage-tokens", value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn costs_are_read_and_the_header_taken_out() {
        let usage = Usage::from_header(HeaderName::from_static("x-usage-tokens"));
        let mut ok = response(Some(" 42 "));
        assert_eq!(usage.response_cost(&mut ok, 7), 42);
        assert!(ok.headers().get("x-usage-tokens").is_none());
        for garbled in [None, Some("many"), Some("-1"), Some("9007199254740992")] {
            assert_eq!(
                usage.response_cost(&mut response(garbled), 7),
                7,
                "{garbled:?}"
            );
        }
        assert_eq!(usage.stats().missing_costs(), 4);
        let kept = usage.keep_header(true).when_missing(0);
        let mut ok = response(Some("3"));
        assert_eq!(kept.response_cost(&mut ok, 7), 3);
        assert_eq!(ok.headers()["x-usage-tokens"], "3");
        assert_eq!(kept.response_cost(&mut response(None), 7), 0);
    }

    #[test]
    fn request_ids_differ_across_instances_and_requests() {
        let one = Usage::from_extension();
        let other = Usage::from_extension();
        let ids = [
            one.next_request_id(),
            one.next_request_id(),
            other.next_request_id(),
        ];
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0][..32], ids[2][..32]);
        assert!(ids.iter().all(|id| id.len() <= Check::MAX_REQUEST_ID_BYTES));
    }
}
