//! Top offenders: per rule, the request descriptors refused most lately, in bounded
//! memory whatever the number of distinct clients. No per-key metric label (whose
//! cardinality a hostile client would choose): a Space-Saving sketch per rule instead.
//!
//! Space-Saving (Metwally, Agrawal, El Abbadi 2005) keeps `k` counters. A key already
//! counted is incremented; a new key takes a free counter, or else replaces the key of the
//! smallest counter and inherits its count as the error bound. It guarantees, for a stream
//! of `N` refusals: every key refused more than `N / k` times is held; a held key's count
//! is at least its true count and at most `error` more. Hand-written because it is this
//! small and the guarantee is what the tests check; the crates that offer it use a
//! filtered variant with weaker per-key bounds.
//!
//! Bounded in bytes as well as in keys: a descriptor's text is held whole up to
//! [`MAX_SHOWN_BYTES`]; a longer one is held (and shown) as its first bytes and a digest
//! of the whole ([`shown`]), so distinct long descriptors stay distinct. A rule's tracker
//! holds at most 2 × its keys × [`MAX_SHOWN_BYTES`] of text: 32 KiB at the defaults.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use sluicegate::BudgetPart;

/// Counters a rule's sketch keeps by default: keys refused more than 1/64 of the rule's
/// refusals are never missed.
pub(crate) const DEFAULT_TOP_KEYS: usize = 64;

/// How long one period of counting lasts by default, in µs; the report covers the
/// period under way and the one before it.
pub(crate) const DEFAULT_TOP_PERIOD: u64 = 60_000_000;

/// The memory budget's part the trackers are counted in.
pub(crate) const TOP_OFFENDERS_PART: &str = "top_offenders";

/// The longest descriptor text held (and shown) as it is, in bytes.
pub(crate) const MAX_SHOWN_BYTES: usize = 256;

/// What is kept of a longer text: its first bytes, up to this many, then the marker.
const SHOWN_PREFIX_BYTES: usize = 192;

/// A descriptor's text as the trackers hold it and the reports show it: whole when at most
/// [`MAX_SHOWN_BYTES`]; longer, its first bytes (up to 192, whole characters), then
/// `…[N bytes, sha256:H]` with its full length and the first 64 bits of the SHA-256 of the
/// whole text, at most [`MAX_SHOWN_BYTES`] in all.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_SHOWN_BYTES {
        return Cow::Borrowed(text);
    }
    let mut end = SHOWN_PREFIX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut out = String::with_capacity(MAX_SHOWN_BYTES);
    out.push_str(&text[..end]);
    let _ = write!(out, "…[{} bytes, sha256:", text.len());
    for byte in &digest.as_ref()[..8] {
        let _ = write!(out, "{byte:02x}");
    }
    out.push(']');
    Cow::Owned(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counter {
    count: u64,
    error: u64,
}

/// One Space-Saving sketch of at most `capacity` keys.
#[derive(Debug)]
struct SpaceSaving {
    capacity: usize,
    counters: HashMap<Box<str>, Counter>,
    /// The bytes its keys hold, with their slots.
    held: usize,
}

/// What one held key costs beside its text: its map slot and counter.
const ENTRY_BYTES: usize = size_of::<(Box<str>, Counter)>() + 8;

impl SpaceSaving {
    fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            counters: HashMap::new(),
            held: 0,
        }
    }

    fn record(&mut self, key: &str, weight: u64) {
        if let Some(counter) = self.counters.get_mut(key) {
            counter.count = counter.count.saturating_add(weight);
            return;
        }
        if self.counters.len() < self.capacity {
            self.held += ENTRY_BYTES + key.len();
            self.counters.insert(
                key.into(),
                Counter {
                    count: weight,
                    error: 0,
                },
            );
            return;
        }
        // A scan of at most `capacity` counters, on a refusal of a key not yet held: the
        // sketch is small, and refusals of new keys are the rare case for a real offender.
        let Some((smallest, min)) = self
            .counters
            .iter()
            .min_by_key(|(_, c)| c.count)
            .map(|(k, c)| (k.clone(), *c))
        else {
            return;
        };
        self.counters.remove(&smallest);
        self.held = self.held - smallest.len() + key.len();
        self.counters.insert(
            key.into(),
            Counter {
                count: min.count.saturating_add(weight),
                error: min.count,
            },
        );
    }
}

/// A key of a rule's report: how often it was refused, at most `error` fewer in truth.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Offender {
    /// The request descriptor, `key=value` entries joined by `,`, as [`shown`] keeps it.
    pub(crate) descriptor: String,
    /// Refused units counted for it (an over-estimate by at most `error`).
    pub(crate) refused: u64,
    /// How many of `refused` may belong to keys it replaced in the sketch.
    pub(crate) error: u64,
}

/// A rule's refusals over the current period and the one before it.
#[derive(Debug)]
struct Periods {
    started: u64,
    current: SpaceSaving,
    previous: SpaceSaving,
    /// What both sketches held when last counted in the memory budget.
    counted: usize,
}

/// One rule's tracker; shared by every configuration version that holds the rule's path,
/// so that a reload does not forget who was refused.
#[derive(Debug)]
pub(crate) struct RuleOffenders {
    period: u64,
    capacity: usize,
    periods: Mutex<Periods>,
    /// Where what the sketches hold is counted. They are bounded by construction
    /// (`capacity` keys of at most [`MAX_SHOWN_BYTES`] per period), so they are counted,
    /// never refused: a rule in force always has its tracker.
    memory: BudgetPart,
}

impl Drop for RuleOffenders {
    fn drop(&mut self) {
        self.memory.give_back(self.periods.get_mut().counted);
    }
}

impl RuleOffenders {
    /// A tracker of `capacity` keys per period, what it holds counted in `memory`.
    pub(crate) fn new(capacity: usize, period: u64, now: u64, memory: BudgetPart) -> Self {
        RuleOffenders {
            memory,
            period: period.max(1),
            capacity,
            periods: Mutex::new(Periods {
                started: now,
                current: SpaceSaving::new(capacity),
                previous: SpaceSaving::new(capacity),
                counted: 0,
            }),
        }
    }

    /// Counts in the memory budget what the sketches hold now.
    fn count(&self, periods: &mut Periods) {
        let held = periods.current.held + periods.previous.held;
        self.memory.resize(periods.counted, held);
        periods.counted = held;
    }

    /// Moves the periods on to `now`: a period that ended becomes the previous one; one
    /// that ended longer ago than a period is forgotten.
    fn roll(&self, periods: &mut Periods, now: u64) {
        let elapsed = now.saturating_sub(periods.started);
        if elapsed < self.period {
            return;
        }
        let fresh = SpaceSaving::new(self.capacity);
        periods.previous = if elapsed < 2 * self.period {
            std::mem::replace(&mut periods.current, fresh)
        } else {
            periods.current = fresh;
            SpaceSaving::new(self.capacity)
        };
        periods.started = now - elapsed % self.period;
    }

    /// Counts `weight` refused units of `descriptor` at `now`, under its [`shown`] text.
    pub(crate) fn record(&self, descriptor: &str, weight: u64, now: u64) {
        let descriptor = shown(descriptor);
        let mut periods = self.periods.lock();
        self.roll(&mut periods, now);
        periods.current.record(&descriptor, weight);
        self.count(&mut periods);
    }

    /// The `n` keys refused most over the current and the previous period, most first
    /// (ties by descriptor, so the order is stable), and when that span began.
    pub(crate) fn top(&self, n: usize, now: u64) -> (Vec<Offender>, u64) {
        let mut periods = self.periods.lock();
        self.roll(&mut periods, now);
        self.count(&mut periods);
        let mut merged: HashMap<&str, Counter> = HashMap::new();
        for sketch in [&periods.previous, &periods.current] {
            for (key, c) in &sketch.counters {
                let entry = merged.entry(key).or_insert(Counter { count: 0, error: 0 });
                entry.count += c.count;
                entry.error += c.error;
            }
        }
        let mut top: Vec<Offender> = merged
            .into_iter()
            .map(|(descriptor, c)| Offender {
                descriptor: descriptor.to_owned(),
                refused: c.count,
                error: c.error,
            })
            .collect();
        top.sort_by(|a, b| {
            b.refused
                .cmp(&a.refused)
                .then(a.descriptor.cmp(&b.descriptor))
        });
        top.truncate(n);
        (top, periods.started.saturating_sub(self.period))
    }
}

/// Every limited rule's tracker, by configuration path.
#[derive(Debug)]
pub(crate) struct Offenders {
    capacity: usize,
    period: u64,
    rules: Mutex<HashMap<String, Arc<RuleOffenders>>>,
    memory: BudgetPart,
}

impl Offenders {
    /// Trackers of `capacity` keys per `period`, counted in `memory`.
    pub(crate) fn new(capacity: usize, period: u64, memory: BudgetPart) -> Self {
        Offenders {
            capacity,
            period,
            rules: Mutex::new(HashMap::new()),
            memory,
        }
    }

    /// The trackers of `paths`, for a configuration being put in force at `now`: a path the last
    /// configuration had keeps its tracker; the others start empty, and the trackers of
    /// paths no longer configured are dropped.
    pub(crate) fn for_paths<'p>(
        &self,
        paths: impl IntoIterator<Item = &'p str>,
        now: u64,
    ) -> HashMap<String, Arc<RuleOffenders>> {
        let mut rules = self.rules.lock();
        let kept: HashMap<String, Arc<RuleOffenders>> = paths
            .into_iter()
            .map(|path| {
                let tracker = rules.get(path).cloned().unwrap_or_else(|| {
                    Arc::new(RuleOffenders::new(
                        self.capacity,
                        self.period,
                        now,
                        self.memory.clone(),
                    ))
                });
                (path.to_owned(), tracker)
            })
            .collect();
        rules.clone_from(&kept);
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unlimited() -> BudgetPart {
        sluicegate::MemoryBudget::unlimited().part(TOP_OFFENDERS_PART)
    }

    proptest! {
        /// The Space-Saving guarantees, against exact counts: every held key's count is
        /// between its true count and true + error; every key refused more than N / k
        /// times is held.
        #[test]
        fn space_saving_keeps_its_guarantees(
            capacity in 1usize..8,
            stream in prop::collection::vec((0u8..20, 1u64..4), 0..300),
        ) {
            let mut sketch = SpaceSaving::new(capacity);
            let mut exact: HashMap<String, u64> = HashMap::new();
            for (key, weight) in &stream {
                let key = key.to_string();
                sketch.record(&key, *weight);
                *exact.entry(key).or_default() += weight;
            }
            let total: u64 = exact.values().sum();
            prop_assert!(sketch.counters.len() <= capacity);
            for (key, c) in &sketch.counters {
                let truth = exact[&**key];
                prop_assert!(c.count >= truth && c.count - c.error <= truth,
                    "{key}: count {} error {} truth {truth}", c.count, c.error);
            }
            for (key, truth) in &exact {
                if *truth * capacity as u64 > total {
                    prop_assert!(sketch.counters.contains_key(key.as_str()),
                        "{key} refused {truth} of {total} is missing");
                }
            }
        }
    }

    #[test]
    fn the_report_spans_this_period_and_the_last_then_forgets() {
        let tracker = RuleOffenders::new(4, 10, 1_000, unlimited());
        tracker.record("user=a", 3, 1_000);
        tracker.record("user=b", 1, 1_005);
        // The next period: a and b carry over as the previous one.
        tracker.record("user=b", 5, 1_012);
        let (top, since) = tracker.top(10, 1_012);
        assert_eq!(since, 1_000);
        let named: Vec<(&str, u64)> = top
            .iter()
            .map(|o| (o.descriptor.as_str(), o.refused))
            .collect();
        assert_eq!(named, [("user=b", 6), ("user=a", 3)]);
        // Two periods later, only what was counted since is reported.
        tracker.record("user=c", 1, 1_031);
        let (top, since) = tracker.top(1, 1_031);
        assert_eq!(since, 1_020);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].descriptor, "user=c");
        // Nothing at all after a long silence.
        assert!(tracker.top(10, 2_000).0.is_empty());
    }

    #[test]
    fn long_descriptors_are_held_as_a_prefix_and_a_digest() {
        let tracker = RuleOffenders::new(4, 1_000, 0, unlimited());
        let long = |last: char| format!("user={}{last}", "é".repeat(30_000));
        tracker.record(&long('a'), 2, 0);
        tracker.record(&long('b'), 1, 0);
        tracker.record("user=short", 1, 0);
        let (top, _) = tracker.top(10, 0);
        assert_eq!(top.len(), 3, "{top:?}");
        for offender in &top {
            assert!(offender.descriptor.len() <= MAX_SHOWN_BYTES, "{offender:?}");
        }
        // Same first bytes, told apart by the digest of the whole.
        assert!(top[0].descriptor.starts_with("user=éé"));
        assert!(top[0].descriptor.contains("…[60006 bytes, sha256:"));
        assert_eq!(top[0].refused, 2);
        assert_eq!(top[1].descriptor, "user=short");
        assert!(top[2].descriptor.starts_with("user=éé"));
        assert_ne!(top[0].descriptor, top[2].descriptor);
        // The same text is held under the same key.
        assert_eq!(shown(&long('a')), shown(&long('a')));
    }

    #[test]
    fn a_reload_keeps_the_trackers_of_paths_still_configured() {
        let offenders = Offenders::new(4, 1_000, unlimited());
        let first = offenders.for_paths(["a", "b"], 0);
        first["a"].record("user=x", 2, 0);
        let second = offenders.for_paths(["a", "c"], 0);
        assert!(Arc::ptr_eq(&first["a"], &second["a"]));
        assert_eq!(second["a"].top(1, 0).0[0].refused, 2);
        assert!(!second.contains_key("b"));
        assert!(second["c"].top(1, 0).0.is_empty());
    }

    /// What the sketches hold is counted in the memory budget, and given back as periods
    /// end and trackers go.
    #[test]
    fn what_trackers_hold_is_counted_in_the_memory_budget() {
        let budget = sluicegate::MemoryBudget::unlimited();
        let offenders = Offenders::new(2, 1_000, budget.part(TOP_OFFENDERS_PART));
        let trackers = offenders.for_paths(["d.a", "d.b"], 0);
        assert_eq!(budget.used(), 0);
        trackers["d.a"].record("user=ann", 1, 0);
        trackers["d.a"].record("user=ann", 1, 0);
        trackers["d.b"].record("user=bo", 1, 0);
        assert_eq!(budget.used(), 2 * ENTRY_BYTES + 8 + 7);
        // Past its capacity a sketch replaces a key: the new key's bytes for the old's.
        trackers["d.b"].record("user=cy", 1, 0);
        trackers["d.b"].record("user=dorothy", 1, 0);
        assert_eq!(budget.used(), 3 * ENTRY_BYTES + 8 + 7 + 12);
        // Two periods on, d.a's sketches are empty again.
        trackers["d.a"].top(1, 2_000);
        assert_eq!(budget.used(), 2 * ENTRY_BYTES + 7 + 12);
        drop(trackers);
        drop(offenders.for_paths(["d.a"], 2_000));
        assert_eq!(budget.used(), 0, "d.b dropped");
    }
}
