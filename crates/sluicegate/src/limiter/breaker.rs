//! A circuit breaker for one node of the store (see `nodes`: the limiter keeps one per
//! node). It opens when, over the last `window`, at least
//! `min_calls` store calls ended and at least `failure_rate` of them failed; then it stops
//! calling the store for `cool_down` and lets one check through as a probe. Only that
//! probe's own result closes it (or opens it again for another cool-down).
//!
//! Why a rate and not N failures in a row: a stall a little longer than the store timeout
//! makes every check in flight time out at once, hundreds under load; counted in a row,
//! that blip opened the breaker and turned 70 ms into a second of failures. Over a window,
//! those few hundred weigh against the thousands that succeeded before them.
//!
//! Why generations: a check sent while the breaker was closed may end long after it
//! opened (its timeout running out), and one sent before a probe may end after the probe.
//! Each permit carries the generation it was given under; every state change starts a new
//! one, and a result from an older generation changes nothing. So when and whether the
//! breaker closes never depends on which stale call happens to finish last: it closes as
//! soon as a probe sent after the cool-down succeeds, one cool-down (plus the probe's
//! round trip) after the store answers again at the latest.
//!
//! Times are µs of the limiter's [`Clock`](crate::Clock), passed in by the caller, so tests
//! move a manual clock instead of sleeping.
//!
//! Cost: every check asks the breaker. While closed, asking reads one atomic, and a result
//! updates one counter of the window with a compare-and-swap; while open, asking reads two.
//! Only state changes take the lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// When the breaker opens, and for how long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    /// The share of store calls, in (0, 1], that must fail within `window` to open it.
    pub failure_rate: f64,
    /// How far back calls count.
    pub window: Duration,
    /// Fewer calls than this within `window` never open it; 0 never opens it at all.
    pub min_calls: u32,
    /// How long an open breaker waits before a probe.
    pub cool_down: Duration,
}

impl Default for BreakerConfig {
    /// Half the calls of the last second, 20 calls at least, then a second's rest: a blip
    /// of a few hundred milliseconds never opens it, a stall of a second or more does.
    fn default() -> Self {
        BreakerConfig {
            failure_rate: 0.5,
            window: Duration::from_secs(1),
            min_calls: 20,
            cool_down: Duration::from_secs(1),
        }
    }
}

/// The breaker's state, as a metric reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Checks go to the store.
    Closed,
    /// The store failed too often; checks fall back without calling it.
    Open,
    /// One probe is on its way to the store.
    HalfOpen,
}

impl BreakerState {
    const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    /// The name metrics and logs use.
    pub const fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    const fn bits(self) -> u64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }

    const fn from_bits(bits: u64) -> BreakerState {
        match bits & 0b11 {
            0 => BreakerState::Closed,
            1 => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }
}

/// How many times the breaker entered each state.
#[derive(Debug, Default)]
pub struct BreakerTransitions {
    counts: [AtomicU64; 3],
}

impl BreakerTransitions {
    /// Changes into `state` so far.
    pub fn to(&self, state: BreakerState) -> u64 {
        self.counts[state.bits() as usize].load(Ordering::Relaxed)
    }

    /// Every state with the changes into it so far.
    pub fn all(&self) -> impl Iterator<Item = (BreakerState, u64)> + '_ {
        BreakerState::ALL.into_iter().map(|s| (s, self.to(s)))
    }

    /// Adds `other`'s counts to these.
    pub(crate) fn add(&self, other: &BreakerTransitions) {
        for (mine, theirs) in self.counts.iter().zip(&other.counts) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    fn count(&self, state: BreakerState) {
        self.counts[state.bits() as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub(crate) struct Breaker {
    /// The node it guards, as logs name it.
    node: String,
    failure_rate: f64,
    min_calls: u64,
    /// µs.
    cool_down: u64,
    /// The generation in the high bits, the state in the low two. Written only under
    /// `changing`, so the lock orders every change; read without it on the way of every
    /// check.
    phase: AtomicU64,
    /// While open: when the probe may go (µs of the limiter's clock). Written under
    /// `changing` before `phase`, so a check that sees the open phase sees its deadline.
    open_until: AtomicU64,
    changing: Mutex<()>,
    window: Window,
    transitions: BreakerTransitions,
}

/// Whether a check may call the store.
#[derive(Debug)]
pub(crate) enum Permit<'a> {
    Call(Ticket<'a>),
    Refuse,
}

/// A call to the store under one generation of the breaker; its result goes back with
/// [`Ticket::finish`]. A probe dropped unfinished (its caller gave up) lets the next check
/// probe at once, so an abandoned probe cannot hold the breaker half open.
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    breaker: &'a Breaker,
    phase: u64,
    finished: bool,
}

impl Ticket<'_> {
    /// Whether this call is the probe of a half-open breaker.
    #[cfg(test)]
    pub(crate) fn is_probe(&self) -> bool {
        BreakerState::from_bits(self.phase) == BreakerState::HalfOpen
    }

    /// Reports how the call ended: `reachable` when the store answered (even with an
    /// error of its own), not when it could not be reached or did not answer in time.
    pub(crate) fn finish(mut self, reachable: bool, now: u64) {
        self.finished = true;
        self.breaker.finish(self.phase, reachable, now);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.finished && BreakerState::from_bits(self.phase) == BreakerState::HalfOpen {
            self.breaker.abandon(self.phase);
        }
    }
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig, node: String) -> Self {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Breaker {
            node,
            failure_rate: config.failure_rate,
            min_calls: u64::from(config.min_calls),
            cool_down: micros(config.cool_down),
            phase: AtomicU64::new(BreakerState::Closed.bits()),
            open_until: AtomicU64::new(0),
            changing: Mutex::new(()),
            window: Window::new(micros(config.window)),
            transitions: BreakerTransitions::default(),
        }
    }

    pub(crate) fn transitions(&self) -> &BreakerTransitions {
        &self.transitions
    }

    pub(crate) fn permit(&self, now: u64) -> Permit<'_> {
        let phase = self.phase.load(Ordering::Acquire);
        if BreakerState::from_bits(phase) == BreakerState::Closed {
            return self.ticket(phase);
        }
        // Refused without the lock until the cool-down is over.
        if BreakerState::from_bits(phase) == BreakerState::HalfOpen
            || now < self.open_until.load(Ordering::Acquire)
        {
            return Permit::Refuse;
        }
        let _changing = self.changing.lock();
        let phase = self.phase.load(Ordering::Acquire);
        match BreakerState::from_bits(phase) {
            BreakerState::Closed => self.ticket(phase),
            BreakerState::Open if now >= self.open_until.load(Ordering::Acquire) => {
                let probing = self.change(phase, BreakerState::HalfOpen, "the cool-down passed");
                self.ticket(probing)
            }
            BreakerState::Open | BreakerState::HalfOpen => Permit::Refuse,
        }
    }

    fn ticket(&self, phase: u64) -> Permit<'_> {
        Permit::Call(Ticket {
            breaker: self,
            phase,
            finished: false,
        })
    }

    fn finish(&self, phase: u64, reachable: bool, now: u64) {
        if self.phase.load(Ordering::Acquire) != phase {
            return;
        }
        match BreakerState::from_bits(phase) {
            BreakerState::Closed => {
                // A breaker that never opens keeps no window: no shared write per call.
                if self.min_calls == 0 {
                    return;
                }
                self.window.record(!reachable, now);
                if reachable {
                    return;
                }
                let (calls, failures) = self.window.totals(now);
                let rate = failures as f64 / calls.max(1) as f64;
                if calls >= self.min_calls && rate >= self.failure_rate {
                    let _changing = self.changing.lock();
                    if self.phase.load(Ordering::Acquire) == phase {
                        self.open_until
                            .store(now.saturating_add(self.cool_down), Ordering::Release);
                        self.change(
                            phase,
                            BreakerState::Open,
                            &format!("{failures} of the last {calls} store calls failed"),
                        );
                    }
                }
            }
            BreakerState::HalfOpen => {
                let _changing = self.changing.lock();
                if self.phase.load(Ordering::Acquire) != phase {
                    return;
                }
                if reachable {
                    self.window.clear();
                    self.change(phase, BreakerState::Closed, "the probe succeeded");
                } else {
                    self.open_until
                        .store(now.saturating_add(self.cool_down), Ordering::Release);
                    self.change(phase, BreakerState::Open, "the probe failed");
                }
            }
            // No ticket is given while open.
            BreakerState::Open => {}
        }
    }

    /// The probe of `phase` will not report: open again with the cool-down already over.
    fn abandon(&self, phase: u64) {
        let _changing = self.changing.lock();
        if self.phase.load(Ordering::Acquire) == phase {
            self.open_until.store(0, Ordering::Release);
            self.change(phase, BreakerState::Open, "the probe was abandoned");
        }
    }

    /// Moves from `phase` into `to`, a new generation; called under the lock. Returns the
    /// new phase.
    fn change(&self, phase: u64, to: BreakerState, why: &str) -> u64 {
        let next = ((phase >> 2).wrapping_add(1) << 2) | to.bits();
        self.phase.store(next, Ordering::Release);
        self.transitions.count(to);
        tracing::warn!(
            node = %self.node,
            from = BreakerState::from_bits(phase).name(),
            to = to.name(),
            "store circuit breaker of {} {}: {why}",
            self.node,
            to.name()
        );
        next
    }

    /// How long until the store is tried again (zero unless open).
    pub(crate) fn wait(&self, now: u64) -> Duration {
        if self.state_bits() == BreakerState::Closed {
            return Duration::ZERO;
        }
        Duration::from_micros(self.open_until.load(Ordering::Acquire).saturating_sub(now))
    }

    /// The node it guards.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    fn state_bits(&self) -> BreakerState {
        BreakerState::from_bits(self.phase.load(Ordering::Acquire))
    }

    /// The state now: open past its cool-down reads as half-open, the next check probing.
    pub(crate) fn state(&self, now: u64) -> BreakerState {
        match self.state_bits() {
            BreakerState::Open if now >= self.open_until.load(Ordering::Acquire) => {
                BreakerState::HalfOpen
            }
            state => state,
        }
    }
}

/// Buckets of the window: how many store calls ended in each slice of it, and how many
/// of those failed.
const BUCKETS: u64 = 10;

/// Store calls that ended, counted in [`BUCKETS`] slices of the window by the time they
/// ended. Each bucket is one atomic word: the slice it counts (its low 24 bits, to tell a
/// stale bucket from a current one), then calls and failures, 20 bits each, saturating.
#[derive(Debug)]
struct Window {
    /// µs per bucket.
    width: u64,
    buckets: [AtomicU64; BUCKETS as usize],
}

const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const SLICE_MASK: u64 = (1 << 24) - 1;

fn pack(slice: u64, calls: u64, failures: u64) -> u64 {
    ((slice & SLICE_MASK) << (2 * COUNT_BITS)) | (calls << COUNT_BITS) | failures
}

/// (slice, calls, failures).
fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * COUNT_BITS),
        (word >> COUNT_BITS) & COUNT_MAX,
        word & COUNT_MAX,
    )
}

impl Window {
    fn new(window: u64) -> Self {
        Window {
            width: window.div_ceil(BUCKETS).max(1),
            buckets: Default::default(),
        }
    }

    fn record(&self, failed: bool, now: u64) {
        let slice = now / self.width;
        let bucket = &self.buckets[(slice % BUCKETS) as usize];
        // The closure never declines, so this cannot fail.
        let _ = bucket.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
            let (counted, calls, failures) = unpack(word);
            let (calls, failures) = if counted == slice & SLICE_MASK {
                (calls, failures)
            } else {
                (0, 0)
            };
            Some(pack(
                slice,
                (calls + 1).min(COUNT_MAX),
                (failures + u64::from(failed)).min(COUNT_MAX),
            ))
        });
    }

    /// (calls, failures) that ended within the window up to `now`.
    fn totals(&self, now: u64) -> (u64, u64) {
        let slice = now / self.width;
        (0..BUCKETS.min(slice + 1))
            .map(|age| {
                let wanted = slice - age;
                let (counted, calls, failures) =
                    unpack(self.buckets[(wanted % BUCKETS) as usize].load(Ordering::Relaxed));
                if counted == wanted & SLICE_MASK {
                    (calls, failures)
                } else {
                    (0, 0)
                }
            })
            .fold((0, 0), |(c, f), (calls, failures)| {
                (c + calls, f + failures)
            })
    }

    /// Forgets every call: a closed breaker starts counting afresh.
    fn clear(&self) {
        for bucket in &self.buckets {
            bucket.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
