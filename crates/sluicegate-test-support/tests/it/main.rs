//! The integration tests of the test support: the Redis processes, clusters and the fault
//! proxy it starts, one binary.

mod cluster;
mod processes;
mod proxy;
