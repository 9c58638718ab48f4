//! What a long key costs the in-memory store, measured by the allocator: this test binary
//! counts the bytes it allocates and frees, and 1,000 keys of 60 KiB (a descriptor built from a
//! header Envoy forwards whole) must hold a few hundred bytes each, not 60 KiB.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use sluicegate::{
    Algorithm, Check, Limit, ManualClock, MemoryStore, MemoryStoreConfig, Rule, RuleSpec,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn a_long_key_costs_the_store_a_digest_not_its_bytes() {
    const KEYS: usize = 1_000;
    let store = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::from_secs(3600))),
    );
    let rule = Rule::new(
        "long",
        &RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(3600)),
    )
    .unwrap();
    let region = Region::new(ALLOCATOR);
    let mut key = "v".repeat(60 * 1024);
    let stem = key.len();
    for i in 0..KEYS {
        key.truncate(stem);
        key.push_str(&i.to_string());
        let limits = [Limit {
            rule: &rule,
            key: &key,
        }];
        assert!(
            store
                .check_now(&Check::new(&limits, 1))
                .unwrap()
                .decision
                .allowed
        );
    }
    drop(key);
    assert_eq!(store.len(), KEYS);
    let change = region.change();
    let held = (change.bytes_allocated as isize - change.bytes_deallocated as isize
        + change.bytes_reallocated) as usize;
    // An entry, its share of the table and a 72-byte digest: well under 1 KiB a key.
    assert!(
        held < KEYS * 1024,
        "{KEYS} keys of 60 KiB hold {held} bytes: {} a key",
        held / KEYS
    );
}
