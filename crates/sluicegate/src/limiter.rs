//! The one entry point every front end uses: rules, key, cost and request id in, a
//! decision out. Front ends never see which store decides.

use crate::decision::Decision;
use crate::rule::Rule;
use crate::store::{Check, Limit, MemoryStore, Outcome, Store, StoreError};

/// Decides checks against a store.
#[derive(Debug, Default)]
pub struct Limiter<S = MemoryStore> {
    store: S,
}

impl Limiter<MemoryStore> {
    /// A limiter on a fresh in-memory store with default settings and the system clock.
    pub fn in_memory() -> Self {
        Limiter::new(MemoryStore::default())
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter deciding with `store`.
    pub fn new(store: S) -> Self {
        Limiter { store }
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Takes `cost` units for `key` under `rule`.
    pub async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, StoreError> {
        let limits = [Limit { rule, key }];
        self.decide(&Check::new(&limits, cost))
            .await
            .map(|outcome| outcome.decision)
    }

    /// Decides a check of any shape: several limits (all-or-nothing), a request id, the
    /// caller's clock.
    pub async fn decide(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        // Every store validates the check itself, before touching state.
        self.store.check(check).await
    }
}
