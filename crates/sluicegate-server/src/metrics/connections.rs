//! What the listeners count: connections open, accepted, refused at a cap, failed TLS
//! handshakes, and closed by each timeout.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimeoutLabels {
    timeout: &'static str,
}

/// Which timeout closed a connection (or answered a request 408).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnectionTimeout {
    /// The TLS handshake did not finish within the header timeout.
    Handshake,
    /// A request's headers did not arrive in time.
    Header,
    /// Nothing was asked for the idle timeout.
    Idle,
    /// A request body was not received in time (answered 408).
    Body,
}

impl ConnectionTimeout {
    const ALL: [ConnectionTimeout; 4] = [
        ConnectionTimeout::Handshake,
        ConnectionTimeout::Header,
        ConnectionTimeout::Idle,
        ConnectionTimeout::Body,
    ];

    fn name(self) -> &'static str {
        match self {
            ConnectionTimeout::Handshake => "handshake",
            ConnectionTimeout::Header => "header",
            ConnectionTimeout::Idle => "idle",
            ConnectionTimeout::Body => "body",
        }
    }
}

/// Why a connection was closed at once, without a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `--max-connections` are open.
    Total,
    /// Its client (an IPv4 address, an IPv6 /64) holds `--max-connections-per-address`.
    ClientShare,
}

/// What the listeners count: connections open, accepted, refused at the cap, failed TLS
/// handshakes, and closed by each timeout.
pub(crate) struct ConnectionMetrics {
    open: Gauge,
    accepted: Counter,
    refused: Counter,
    refused_client_share: Counter,
    handshake_failures: Counter,
    /// One counter per entry of [`ConnectionTimeout::ALL`].
    timed_out: Vec<Counter>,
}

impl ConnectionMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let open = Gauge::default();
        registry.register(
            "sluicegate_connections_open",
            "Connections open now, on every listener",
            open.clone(),
        );
        let accepted = Counter::default();
        registry.register(
            "sluicegate_connections_accepted",
            "Connections accepted",
            accepted.clone(),
        );
        let refused = Counter::default();
        registry.register(
            "sluicegate_connections_refused",
            "Connections closed at once because --max-connections were open",
            refused.clone(),
        );
        let refused_client_share = Counter::default();
        registry.register(
            "sluicegate_connections_refused_per_address",
            "Connections closed at once because their client address (IPv6: its /64) held \
             --max-connections-per-address",
            refused_client_share.clone(),
        );
        let handshake_failures = Counter::default();
        registry.register(
            "sluicegate_tls_handshake_failures",
            "TLS handshakes that failed (a client certificate missing or not trusted, bad TLS)",
            handshake_failures.clone(),
        );
        let timeouts = Family::<TimeoutLabels, Counter>::default();
        registry.register(
            "sluicegate_connection_timeouts",
            "Connections closed (or, for body, requests answered 408) by a timeout",
            timeouts.clone(),
        );
        let timed_out = ConnectionTimeout::ALL
            .iter()
            .map(|t| timeouts.get_or_create_owned(&TimeoutLabels { timeout: t.name() }))
            .collect();
        ConnectionMetrics {
            open,
            accepted,
            refused,
            refused_client_share,
            handshake_failures,
            timed_out,
        }
    }

    /// Counts a connection accepted; it is open until the guard is dropped.
    pub(crate) fn accepted(&self) -> OpenConnection {
        self.accepted.inc();
        self.open.inc();
        OpenConnection(self.open.clone())
    }

    /// Counts a connection closed at once at a cap.
    pub(crate) fn refused(&self, why: Refused) {
        match why {
            Refused::Total => self.refused.inc(),
            Refused::ClientShare => self.refused_client_share.inc(),
        };
    }

    /// Counts a failed TLS handshake.
    pub(crate) fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Counts a connection (or request) ended by `timeout`.
    pub(crate) fn timed_out(&self, timeout: ConnectionTimeout) {
        if let Some(i) = ConnectionTimeout::ALL.iter().position(|t| *t == timeout) {
            self.timed_out[i].inc();
        }
    }
}

/// One open connection in `sluicegate_connections_open`, until dropped.
pub(crate) struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}
