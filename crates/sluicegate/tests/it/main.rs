//! The integration tests of the library, one binary: each module was a test of its own (its
//! name says what it holds); `redis_trace` is what the Redis tests share — the random
//! traces, the cases, the stores on a test's own key prefix. `memory_key_bytes` stays a
//! binary of its own: it counts every allocation of its process.

mod leases;
mod memory_budget;
mod memory_store;
mod model;
mod redis_cluster_batching;
mod redis_cluster_nodes;
mod redis_cluster_slots;
mod redis_connections;
mod redis_durability;
mod redis_envoy_counters;
mod redis_functions;
mod redis_give_back;
mod redis_hot_keys;
mod redis_keys;
mod redis_lost_state;
mod redis_sentinel;
mod redis_stalls;
mod redis_store;
#[cfg(feature = "redis")]
mod redis_trace;
mod redis_usage;
mod resilience;
mod rule_changes;
mod spec_examples;
