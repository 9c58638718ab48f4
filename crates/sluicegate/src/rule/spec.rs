//! What a user writes: the algorithm, its parameters, and the error that names a field
//! breaking a bound.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The five algorithms of docs/SPEC.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Exact sliding-window log: every admitted unit is remembered for one window.
    SlidingLog,
    /// Sliding-window counter: N sub-buckets, the oldest one weighted (Cloudflare's estimate).
    SlidingCounter,
    /// Fixed windows aligned to the epoch.
    FixedWindow,
    /// GCRA token bucket with burst B.
    TokenBucket,
    /// Leaky bucket: a fixed outflow rate and a queue of Q that drops when full.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in docs/SPEC.md's order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    /// The name used in configuration, on the command line and in docs/SPEC.md.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingCounter => "sliding-counter",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::LeakyBucket => "leaky-bucket",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                RuleError::new(
                    "algorithm",
                    format!(
                        "unknown algorithm {s:?}; expected one of sliding-log, sliding-counter, \
                         fixed-window, token-bucket, leaky-bucket"
                    ),
                )
            })
    }
}

/// How a `sliding-log` rule keeps its entries in Redis. Decisions are identical; the
/// in-memory store ignores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LogLayout {
    /// The naive sorted-set script's layout: score = time, one member per unit; inspectable with
    /// `ZRANGE key 0 -1 WITHSCORES`.
    #[default]
    Zset,
    /// A ring of times, each in 3 to 7 bytes (by the window: modulo a span over twice it),
    /// in one string sized to what is live: a fraction of the memory, constant work per
    /// check but for a rewrite when the string grows or shrinks.
    Compact,
}

impl LogLayout {
    /// The name used in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            LogLayout::Zset => "zset",
            LogLayout::Compact => "compact",
        }
    }
}

impl FromStr for LogLayout {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "zset" => Ok(LogLayout::Zset),
            "compact" => Ok(LogLayout::Compact),
            _ => Err(RuleError::new(
                "layout",
                format!("unknown layout {s:?}; expected zset or compact"),
            )),
        }
    }
}

/// A rule's parameters as written by a user, before validation.
///
/// `buckets`, `burst` and `queue` belong to one algorithm each; giving one to another
/// algorithm is an error rather than something silently ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    /// Which algorithm decides.
    pub algorithm: Algorithm,
    /// L: units per window.
    pub limit: u64,
    /// W, the window: counted in whole µs ([`Rule::new`] says what it does with the rest).
    ///
    /// [`Rule::new`]: crate::Rule::new
    pub window: Duration,
    /// N, sliding-counter only (default 10).
    pub buckets: Option<u64>,
    /// B, token-bucket only (default L).
    pub burst: Option<u64>,
    /// Q, leaky-bucket only (default 0).
    pub queue: Option<u64>,
    /// Redis layout, sliding-log only (default zset).
    pub layout: Option<LogLayout>,
}

impl RuleSpec {
    /// A spec with only the three common parameters set.
    pub const fn new(algorithm: Algorithm, limit: u64, window: Duration) -> Self {
        RuleSpec {
            algorithm,
            limit,
            window,
            buckets: None,
            burst: None,
            queue: None,
            layout: None,
        }
    }
}

/// A rule that breaks a bound of docs/SPEC.md: names the field and says which bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    field: &'static str,
    message: String,
}

impl RuleError {
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        RuleError {
            field,
            message: message.into(),
        }
    }

    /// The offending field: `algorithm`, `limit`, `window`, `buckets`, `burst`, `queue`,
    /// `layout`, `lease` or `lease_for`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What is wrong, without the field prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for RuleError {}
