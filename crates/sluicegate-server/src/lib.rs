//! The sluicegate service and its tools, as a library: the `sluicegate` binary is a thin
//! `main` over [`cli::main`], and tests run the service in-process.

pub mod cli;
mod config;
mod decide;
mod grpc;
mod http;
mod metrics;
mod tools;
