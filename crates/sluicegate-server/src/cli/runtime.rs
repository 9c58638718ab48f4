//! The tokio runtime the asynchronous commands run in.

use anyhow::{Context as _, Result};

/// A multi-threaded runtime with every driver (I/O and time) enabled.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
}
