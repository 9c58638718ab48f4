//! What the service allocates per `ShouldRateLimit` call, counted by the allocator of
//! this test process, where the service runs; the calls come from `sluicegate load`, a
//! process of its own, so only the service's allocations are counted. A bound rather
//! than a speed: allocations are a measurable share of a call's CPU (tonic's default
//! buffers alone would be 8 KiB for the request and again for the answer, per call), and
//! an allocation or a copy that creeps back onto the path of every call shows here first.

#[path = "it/server/mod.rs"]
mod server;

use std::alloc::System;
use std::process::Command;

use server::Server;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Calls of the measured run.
const CALLS: u64 = 2_000;
/// The most bytes the service may allocate per call. Measured: 15.0 KiB in 60 allocations,
/// most of it the futures of a call (the boxed `ShouldRateLimit` future ~4 KiB, axum's
/// route ~1.8 KiB, hyper's task for the stream ~1.4 KiB) and tonic's two 1 KiB buffers.
/// It would be 30 KiB with tonic's default buffers of 8 KiB, and 16 KiB with room for a
/// shadow check in every call's future.
const MOST_BYTES_PER_CALL: u64 = 15 * 1024;

/// `sluicegate load` over gRPC, `requests` calls of one key admitted every time; its
/// report.
fn load(server: &Server, requests: u64) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["load", "--target", &server.address, "--protocol", "grpc"])
        .args(["--key", "hot", "--values", "1", "--concurrency", "8"])
        .args(["--requests", &requests.to_string(), "--json"])
        .output()
        .expect("run sluicegate load");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "load: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout {:?}, stderr {stderr}", out.stdout));
    assert_eq!(report["decisions"], requests, "{report}");
    assert_eq!(report["allowed"], requests, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    report
}

#[test]
fn a_grpc_call_allocates_a_few_kilobytes_in_the_service() {
    let config = std::env::temp_dir().join(format!("grpc-allocations-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        "domain: example\ndescriptors:\n  - key: hot\n    rate_limit: \
         { algorithm: fixed-window, unit: minute, requests_per_unit: 1000000000 }\n",
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    // Warm: connections, the first key, the runtime's threads.
    load(&server, 200);
    let region = Region::new(ALLOCATOR);
    load(&server, CALLS);
    let stats = region.change();
    drop(server);
    let _ = std::fs::remove_file(&config);
    let bytes = stats.bytes_allocated as u64 / CALLS;
    let allocations = stats.allocations as u64 / CALLS;
    eprintln!("per call: {bytes} bytes in {allocations} allocations");
    assert!(
        bytes <= MOST_BYTES_PER_CALL,
        "{bytes} bytes allocated per call ({allocations} allocations), at most \
         {MOST_BYTES_PER_CALL} expected"
    );
}
