//! The sluicegate service and its tools, as a library: the `sluicegate` binary is a thin
//! `main` over [`cli::main`], and tests run the service in-process.

pub mod cli;
mod compat;
mod config;
mod envoy;
mod grpc;
mod history;
mod http;
mod limit_override;
mod metrics;
mod offenders;
mod readiness;
mod server;
mod service;
mod telemetry;
mod tools;
mod xds;

pub use compat::{Compat, Counting};
pub use config::Config;
pub use server::{
    ConnectionOptions, Listeners, Prepared, ServeOptions, TlsOptions, prepare, serve,
};
pub use service::{EnvoyHeaderNames, ResponseHeaders, ServiceOptions};
pub use xds::{BackoffOptions, XdsOptions, XdsTls};
