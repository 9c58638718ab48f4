//! `--compat`: whose semantics the service keeps. Everything the switch changes is
//! decided here, so that the rest of the service asks this module rather than the switch.
//!
//! With `--compat envoy` the service behaves as envoyproxy/ratelimit with its defaults:
//! - rules that name no algorithm are fixed windows aligned to their unit
//!   ([`Compat::default_algorithm`]), as envoy's cache keys are (`(now/divider)*divider`,
//!   envoyproxy/ratelimit@f2fb157 src/limiter/cache_key.go:81-82); ours too are
//!   `floor(t / W)`, epoch-aligned (docs/SPEC.md, fixed-window);
//! - counting is envoy's ([`Compat::counting`]);
//! - on Redis, a fixed window counts in envoy's own counter, so that envoy's instances and
//!   these share it during a rolling replacement ([`Compat::envoy_counters`]), under
//!   envoy's key prefix, none unless `--prefix` gives one ([`Compat::default_prefix`]).
//! - a request's descriptors and their entries are not counted, and a descriptor without
//!   entries matches nothing ([`Compat::counts_descriptors`]).

use clap::ValueEnum;
use sluicegate::Algorithm;

/// Whose semantics the service keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Compat {
    /// sluicegate's own (docs/SPEC.md): refusals cost nothing, a request is all-or-nothing.
    #[default]
    #[value(name = "none", alias = "sluicegate")]
    None,
    /// envoyproxy/ratelimit's, so that a fleet can swap the image and keep its config.
    Envoy,
}

/// How the descriptors of one request are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Counting {
    /// sluicegate's: every enforced descriptor in one all-or-nothing check; a refusal
    /// records nothing anywhere.
    #[default]
    AllOrNothing,
    /// envoy's default: each descriptor is a check of its own that counts its hits whether
    /// or not they fit (envoy increments, then compares:
    /// envoyproxy/ratelimit@f2fb157 src/redis/fixed_cache_impl.go:161-220), so one over its
    /// limit does not stop the others from counting, and a descriptor listed twice counts
    /// twice.
    EachDescriptor,
    /// envoy's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: the descriptors are looked at
    /// together first; if none would go over, all count; if any would, only those over
    /// their limit count (envoyproxy/ratelimit@f2fb157 src/redis/fixed_cache_impl.go:44-72,
    /// 114-158).
    StopIncrementWhenOverLimit,
}

impl Compat {
    /// The algorithm of rules that name none, unless `--default-algorithm` names one.
    pub fn default_algorithm(self, given: Option<Algorithm>) -> Algorithm {
        given.unwrap_or(match self {
            Compat::None => Algorithm::SlidingLog,
            Compat::Envoy => Algorithm::FixedWindow,
        })
    }

    /// Whether a fixed window of whole seconds counts in envoyproxy/ratelimit's own Redis
    /// key, with its arithmetic (`Rule::with_envoy_counter`; docs/SPEC.md, "Envoy
    /// compatibility: shared counters").
    pub fn envoy_counters(self) -> bool {
        self == Compat::Envoy
    }

    /// The Redis key prefix unless `--prefix` gives one: envoy's `CACHE_KEY_PREFIX`
    /// default, none, so that its counters and ours are one
    /// (envoyproxy/ratelimit@f2fb157 src/limiter/cache_key.go:62).
    pub fn default_prefix(self) -> &'static str {
        match self {
            Compat::None => "sluicegate:",
            Compat::Envoy => "",
        }
    }

    /// Whether a request may carry at most 64 descriptors of 1 to 16 entries each
    /// (sluicegate's bounds). envoyproxy/ratelimit bounds neither count, only its message
    /// size does, and answers a descriptor without entries OK with no limit: `GetLimit`
    /// walks no entry and finds none (envoyproxy/ratelimit@f2fb157
    /// src/config/config_impl.go:446-673).
    pub fn counts_descriptors(self) -> bool {
        self == Compat::None
    }

    /// How requests are counted; `stop_increment_when_over_limit` is envoy's other
    /// behaviour and means nothing without `--compat envoy`.
    pub fn counting(self, stop_increment_when_over_limit: bool) -> Result<Counting, String> {
        match (self, stop_increment_when_over_limit) {
            (Compat::None, false) => Ok(Counting::AllOrNothing),
            (Compat::None, true) => Err("--stop-increment-when-over-limit changes envoy's \
                 counting: it needs --compat envoy"
                .into()),
            (Compat::Envoy, false) => Ok(Counting::EachDescriptor),
            (Compat::Envoy, true) => Ok(Counting::StopIncrementWhenOverLimit),
        }
    }
}
