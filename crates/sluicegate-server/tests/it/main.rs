//! The integration tests of the service, one binary: each module was a test of its own
//! (its name says what it holds), and `server`, `python` and `replay` are what they share —
//! the service on a loopback port, the Python gRPC clients, `sluicegate replay` as a
//! process. `grpc_allocations` stays a binary of its own: it counts every allocation of its
//! process.

mod allocator;
mod bad_input;
mod bench_redis_time;
mod check;
mod cli;
mod compat_counting;
mod config;
mod connections;
mod dashboard;
mod deploy;
mod domains;
mod envoy_answers;
mod envoy_config;
mod envoy_conformance;
mod envoy_env;
mod envoy_gateway;
mod envoy_metrics;
mod envoy_shared_counters;
mod envoy_statsd;
mod explain;
mod failed_runs;
mod grpc;
mod input_bounds;
mod limit_override;
mod load;
mod logs;
mod memory_attacks;
mod memory_full;
mod nodelay;
mod probes;
mod python;
mod readme;
mod reads;
mod redis_concurrency;
mod redis_eviction;
mod redis_faults;
mod redis_lost_state;
mod reload_usage;
mod replay;
mod server;
mod simulate;
mod spec_replay;
mod tls;
// The spans it reads are exported by OpenTelemetry, built only with the `otel` feature.
#[cfg(feature = "otel")]
mod traces;
mod ui;
mod usage;
mod usage_input;
mod xds;

/// Bytes as lowercase hexadecimal: trace and span ids, digests.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
