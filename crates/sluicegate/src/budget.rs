//! The memory budget: one count of the bytes the service's state holds, against one limit,
//! shared by every part that holds state per key or per value a client chooses (the
//! in-memory store, the negative cache, the local fallback, and whatever else the service
//! counts). A part takes bytes before it keeps something and gives them back when it
//! forgets it; what does not fit is decided by the part's own policy, never by an error.
//!
//! Cheap on the decision path: a clone is a reference count, and taking or giving back
//! bytes is an atomic on the whole and one on the part; no lock is taken. Parts are
//! registered under a lock, once, when they are made.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// A byte budget shared by parts that each count what they hold against it.
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: usize,
    used: AtomicUsize,
    rule_share: f64,
    parts: Mutex<Vec<Arc<PartInner>>>,
}

/// One part of a [`MemoryBudget`]: what it holds is counted under its name and in the whole.
#[derive(Clone)]
pub struct BudgetPart {
    budget: MemoryBudget,
    part: Arc<PartInner>,
}

struct PartInner {
    name: &'static str,
    used: AtomicUsize,
}

/// A budget that cannot be honoured.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum BudgetError {
    /// A budget of zero bytes holds nothing at all.
    Zero,
    /// A rule's share must be above 0 and at most 1.
    RuleShare(f64),
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::Zero => f.write_str("a memory budget of 0 bytes can hold no key"),
            BudgetError::RuleShare(share) => write!(
                f,
                "a rule's share of the memory budget must be above 0 and at most 1, got {share}"
            ),
        }
    }
}

impl std::error::Error for BudgetError {}

/// What a new key gets when there is no room for it: the memory budget, the key cap, or its
/// rule's share of either is reached (docs/SPEC.md, "When memory is full"). Keys already
/// held keep deciding exactly whatever the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnFull {
    /// Refused, with a Retry-After of one sweep interval, and nothing recorded.
    Refuse,
    /// Allowed without being counted: the key is not limited until there is room.
    Allow,
    /// Room is made by evicting idle keys that still have room under their limit (the
    /// least recently written of a sample, the new key's own rule's first); when there is
    /// none, refused as [`OnFull::Refuse`] is.
    #[default]
    EvictIdle,
}

impl OnFull {
    /// `refuse`, `allow`, `evict-idle`: the flag's values.
    pub fn name(self) -> &'static str {
        match self {
            OnFull::Refuse => "refuse",
            OnFull::Allow => "allow",
            OnFull::EvictIdle => "evict-idle",
        }
    }
}

impl std::str::FromStr for OnFull {
    type Err = String;

    /// One of the names [`OnFull::name`] gives.
    fn from_str(text: &str) -> Result<Self, String> {
        [OnFull::Refuse, OnFull::Allow, OnFull::EvictIdle]
            .into_iter()
            .find(|policy| policy.name() == text)
            .ok_or_else(|| format!("{text:?} is not one of refuse, allow, evict-idle"))
    }
}

impl MemoryBudget {
    /// The share of the budget and of the key cap one rule may hold unless configured:
    /// half, so that a flood of new keys under one rule leaves the other half to every
    /// other rule.
    pub const DEFAULT_RULE_SHARE: f64 = 0.5;

    /// A budget of `limit` bytes, of which one rule may hold `rule_share` (above 0, at most 1).
    pub fn new(limit: usize, rule_share: f64) -> Result<Self, BudgetError> {
        if limit == 0 {
            return Err(BudgetError::Zero);
        }
        // Written so that NaN fails too.
        if !(rule_share > 0.0 && rule_share <= 1.0) {
            return Err(BudgetError::RuleShare(rule_share));
        }
        Ok(MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicUsize::new(0),
                rule_share,
                parts: Mutex::new(Vec::new()),
            }),
        })
    }

    /// A budget that counts but never runs out, with no share per rule: the library's
    /// default, where the key cap alone bounds a store.
    pub fn unlimited() -> Self {
        MemoryBudget::new(usize::MAX, 1.0).expect("a valid budget")
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// The bytes counted now, across every part.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// The share of the budget (and of a store's key cap) one rule may hold.
    pub fn rule_share(&self) -> f64 {
        self.inner.rule_share
    }

    /// `whole` cut to one rule's share, at least 1.
    pub fn share_of(&self, whole: usize) -> usize {
        if self.inner.rule_share >= 1.0 {
            return whole;
        }
        ((whole as f64 * self.inner.rule_share) as usize).max(1)
    }

    /// The part named `name`, registered on first use: parts of one name share one count.
    pub fn part(&self, name: &'static str) -> BudgetPart {
        let mut parts = self.inner.parts.lock();
        let part = match parts.iter().find(|p| p.name == name) {
            Some(part) => Arc::clone(part),
            None => {
                let part = Arc::new(PartInner {
                    name,
                    used: AtomicUsize::new(0),
                });
                parts.push(Arc::clone(&part));
                part
            }
        };
        BudgetPart {
            budget: self.clone(),
            part,
        }
    }

    /// Every part's name and the bytes it holds now, in the order they were registered.
    pub fn parts(&self) -> Vec<(&'static str, usize)> {
        self.inner
            .parts
            .lock()
            .iter()
            .map(|p| (p.name, p.used.load(Ordering::Relaxed)))
            .collect()
    }

    /// Whether two handles count against the same budget.
    pub fn same(&self, other: &MemoryBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget::unlimited()
    }
}

/// Two handles are equal when they count against the same budget.
impl PartialEq for MemoryBudget {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for MemoryBudget {}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .field("rule_share", &self.rule_share())
            .finish()
    }
}

impl BudgetPart {
    /// Takes `bytes` if the whole budget has room for them; nothing otherwise.
    pub fn try_take(&self, bytes: usize) -> bool {
        let limit = self.budget.inner.limit;
        let taken = self
            .budget
            .inner
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= limit)
            })
            .is_ok();
        if taken {
            self.part.used.fetch_add(bytes, Ordering::Relaxed);
        }
        taken
    }

    /// Counts `bytes` already held whether or not they fit (memory that grew with something
    /// the part had to keep, such as a key's state after an admission): later takes then
    /// find less room, until they are given back.
    pub fn add(&self, bytes: usize) {
        self.budget.inner.used.fetch_add(bytes, Ordering::Relaxed);
        self.part.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives back `bytes` taken or added before.
    pub fn give_back(&self, bytes: usize) {
        self.budget.inner.used.fetch_sub(bytes, Ordering::Relaxed);
        self.part.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Counts a change of `before` to `after` bytes of something held.
    pub fn resize(&self, before: usize, after: usize) {
        match after.cmp(&before) {
            std::cmp::Ordering::Greater => self.add(after - before),
            std::cmp::Ordering::Less => self.give_back(before - after),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// The bytes this part holds now.
    pub fn used(&self) -> usize {
        self.part.used.load(Ordering::Relaxed)
    }

    /// The part's name.
    pub fn name(&self) -> &'static str {
        self.part.name
    }

    /// The budget this part counts in.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}

impl PartialEq for BudgetPart {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.part, &other.part)
    }
}

impl Eq for BudgetPart {}

impl fmt::Debug for BudgetPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetPart")
            .field("name", &self.name())
            .field("used", &self.used())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_count_in_the_whole_and_the_whole_has_a_limit() {
        let budget = MemoryBudget::new(100, 0.5).unwrap();
        let store = budget.part("store");
        let cache = budget.part("negative-cache");
        assert!(store.try_take(60));
        assert!(!cache.try_take(41), "past the whole");
        assert!(cache.try_take(40));
        assert_eq!(budget.used(), 100);
        store.give_back(60);
        assert_eq!(budget.parts(), vec![("store", 0), ("negative-cache", 40)]);
        // A part asked for again is the same count.
        budget.part("store").add(5);
        assert_eq!(store.used(), 5);
        assert_eq!(budget.share_of(10), 5);
        assert_eq!(budget.share_of(1), 1);
    }

    #[test]
    fn a_budget_that_holds_nothing_is_refused() {
        assert_eq!(MemoryBudget::new(0, 0.5).unwrap_err(), BudgetError::Zero);
        for share in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(matches!(
                MemoryBudget::new(10, share),
                Err(BudgetError::RuleShare(_))
            ));
        }
    }
}
