//! What a request gets: each descriptor's outcome, the request's, or why it could not be
//! decided.

use std::time::Duration;

use sluicegate::{Charge, Decision, Outcome, RequestIdConflict, Rule, StoreError};

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
    /// Its mode; a report, settle or refund is never refused, its decision the standing.
    pub(crate) charge: Charge,
}

/// The answer to one request.
pub(crate) struct Decided {
    pub(crate) descriptors: Vec<DescriptorOutcome>,
    /// The enforced limits' outcome; `None` when no descriptor matched an enforced,
    /// limited rule. That of the descriptors in a mode that may refuse when there are
    /// any, else the standing after the reports, settles and refunds.
    pub(crate) outcome: Option<Outcome>,
    /// The outcome may refuse: it is a check's (or a reserve's), not a standing.
    pub(crate) refusable: bool,
    /// A matched block (`requests_per_unit: 0`) refuses the request.
    pub(crate) blocked: bool,
    /// How long the limiter's part took: the store's round trips (or what stood in for
    /// the store); next to nothing when no limited rule matched.
    #[cfg_attr(
        not(feature = "otel"),
        expect(dead_code, reason = "only the trace span reads it")
    )]
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
            charge: Charge::Check,
        };
        Decided {
            descriptors: (0..count).map(|_| nothing()).collect(),
            outcome: None,
            refusable: true,
            blocked: false,
            store_time: Duration::ZERO,
        }
    }

    /// Admitted, or, for a request of reports, settles and refunds only, the key not
    /// spent: one more unit would fit.
    pub(crate) fn allowed(&self) -> bool {
        !self.blocked && self.outcome.as_ref().is_none_or(|o| o.decision.allowed)
    }

    /// Refused: a block, or a check or reserve over its limit. A spent standing is not a
    /// refusal.
    pub(crate) fn refused(&self) -> bool {
        !self.allowed() && (self.blocked || self.refusable)
    }
}

/// Why a request could not be decided.
pub(crate) enum DecideError {
    /// The request is malformed: say what is wrong.
    Invalid(String),
    /// The request names a domain no configuration declares; the message says which.
    /// Envoy's protocol answers it OK with no limit, as envoyproxy/ratelimit does;
    /// sluicegate's own API refuses it as bad input.
    UnknownDomain(String),
    /// The request's id was used before for another request (another mode or cost):
    /// refused whole, nothing recorded. Not a store failure: no failure policy answers it.
    RequestIdConflict(RequestIdConflict),
    /// The store could not decide and no policy decided for it.
    Store(StoreError),
    /// No configuration is in force yet (started over xDS without waiting for the first
    /// push): nothing can be decided, and the caller's own failure mode says what happens,
    /// as envoyproxy/ratelimit fails such a call ("no rate limit configuration loaded",
    /// envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:118-121).
    NoConfiguration,
}

impl DecideError {
    /// What a caller is told of [`DecideError::NoConfiguration`].
    pub(crate) const NO_CONFIGURATION: &'static str =
        "no rate limit configuration loaded yet: the first xDS push has not come";
}

impl From<StoreError> for DecideError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCheck(message) => DecideError::Invalid(message),
            StoreError::RequestIdConflict(conflict) => DecideError::RequestIdConflict(conflict),
            other => DecideError::Store(other),
        }
    }
}
