//! Reloading the configuration when its files change or on SIGHUP. A configuration that
//! does not load keeps the previous one serving; the error is logged and counted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Config, LoadOptions};
use crate::service::Service;

/// What to watch, and what it held when it was last loaded.
pub(super) struct Watch {
    pub(super) path: PathBuf,
    /// [`config::fingerprint`] of the files as last loaded.
    pub(super) seen: u64,
    pub(super) load: LoadOptions,
    pub(super) interval: Duration,
}

/// SIGHUP, where there is one.
pub(super) struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Starts listening for SIGHUP (must run inside the runtime).
    pub(super) fn listen() -> Self {
        Hangup {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Resolves at the next SIGHUP; never where there is none.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = self.signal.as_mut() {
            signal.recv().await;
            return;
        }
        std::future::pending::<()>().await;
    }
}

/// Checks the files every `watch.interval` and on SIGHUP; loads them when they changed
/// (or were signalled) and puts the result in force.
pub(super) async fn reload_on_change(mut watch: Watch, service: Arc<Service>, mut hangup: Hangup) {
    let mut tick = tokio::time::interval(watch.interval);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            () = hangup.recv() => true,
        };
        let now = config::fingerprint(
            &watch.path,
            watch.load.ignore_dotfiles,
            watch.load.max_bytes,
        );
        if !forced && now == watch.seen {
            continue;
        }
        watch.seen = now;
        match Config::load(&watch.path, watch.load) {
            Ok(config) => {
                let changes = config.changes_from(&service.live().config);
                service.replace_config(config, None);
                service.metrics().config_loaded();
                tracing::info!(
                    config = %watch.path.display(),
                    version = service.live().version,
                    added = %config::listed(&changes.added),
                    removed = %config::listed(&changes.removed),
                    edited = %config::listed(&changes.edited),
                    "configuration reloaded"
                );
            }
            Err(e) => {
                service.metrics().config_rejected();
                tracing::error!(error = %e, "configuration rejected; the previous one keeps serving");
            }
        }
    }
}
