//! What the xDS configuration source (`--config-xds`) counts: pushes put in force (ACK)
//! and refused (NACK), whether the stream to the management server is up, and the
//! version in force as a label. Zero without `--config-xds`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

/// The xDS client's counters.
#[derive(Debug)]
pub(crate) struct XdsMetrics {
    acks: Counter,
    nacks: Counter,
    connected: Gauge,
    /// One series, at 1, labelled with the version in force; the previous one removed.
    version: Family<VersionLabels, Gauge>,
    in_force: parking_lot::Mutex<Option<String>>,
}

impl XdsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let acks = Counter::default();
        registry.register(
            "sluicegate_xds_acks",
            "xDS pushes validated and put in force (ACKed)",
            acks.clone(),
        );
        let nacks = Counter::default();
        registry.register(
            "sluicegate_xds_nacks",
            "xDS pushes refused (NACKed); the configuration in force kept serving",
            nacks.clone(),
        );
        let connected = Gauge::default();
        registry.register(
            "sluicegate_xds_connected",
            "1 while the stream to the xDS management server is up",
            connected.clone(),
        );
        let version = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "sluicegate_xds_config_version",
            "The xDS version_info of the configuration in force (1, labelled)",
            version.clone(),
        );
        XdsMetrics {
            acks,
            nacks,
            connected,
            version,
            in_force: parking_lot::Mutex::default(),
        }
    }

    /// Counts a push put in force as `version`.
    pub(crate) fn acked(&self, version: &str) {
        self.acks.inc();
        let mut in_force = self.in_force.lock();
        if let Some(previous) = in_force.take() {
            self.version.remove(&VersionLabels { version: previous });
        }
        self.version
            .get_or_create(&VersionLabels {
                version: version.to_owned(),
            })
            .set(1);
        *in_force = Some(version.to_owned());
    }

    /// Counts a push refused.
    pub(crate) fn nacked(&self) {
        self.nacks.inc();
    }

    /// The stream to the management server went up or down.
    pub(crate) fn connected(&self, up: bool) {
        self.connected.set(i64::from(up));
    }
}
