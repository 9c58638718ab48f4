//! Whether the service can decide: one answer for every probe — `/readyz`,
//! envoyproxy/ratelimit's `/healthcheck` and gRPC's `grpc.health.v1.Health`.

use sluicegate::AnyStore;

use crate::service::Service;

/// What the probes report.
pub(crate) enum Readiness {
    /// The store answers; `warning` names a risk that does not stop the service (a Redis
    /// that may evict keys; under `--store-durability replicated`, a server without a
    /// replica, where checks that admit fail and their policy answers), and state Redis
    /// was found to have lost.
    Ready { warning: Option<String> },
    /// The store does not answer, or a risk the operator refused
    /// (`--require-noeviction`): why.
    NotReady(String),
}

impl Readiness {
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready { .. })
    }
}

/// Asks the store now; with `--healthy-with-config`, first whether a domain is configured.
pub(crate) async fn readiness(service: &Service) -> Readiness {
    // envoyproxy/ratelimit's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: healthy only while
    // the configuration in force declares a domain (its SetConfig marks the config
    // component failed for a load without any, and a refused load changes nothing).
    if service.options().healthy_with_config && service.live().config.is_empty() {
        return Readiness::NotReady(
            "not ready (--healthy-with-config): no configuration loaded yet".into(),
        );
    }
    let store = service.limiter().store();
    if let Err(e) = store.ready().await {
        return Readiness::NotReady(format!("not ready: {e}"));
    }
    let (eviction_risk, unreplicated, lost_state) = match store {
        AnyStore::Redis(redis) => (
            redis.eviction().warning(),
            redis.replication().warning(redis.durability()),
            redis.lost_state().warning(),
        ),
        AnyStore::Memory(_) => (None, None, None),
    };
    match eviction_risk {
        Some(risk) if service.options().require_noeviction => {
            Readiness::NotReady(format!("not ready (--require-noeviction): {risk}"))
        }
        // Lost state is history, not a present fault: the service decides exactly again
        // once the limits of the node's keys have started over, so it stays ready.
        risk => {
            let warnings: Vec<String> = risk
                .into_iter()
                .chain(unreplicated)
                .chain(lost_state)
                .collect();
            Readiness::Ready {
                warning: (!warnings.is_empty()).then(|| warnings.join("\nwarning: ")),
            }
        }
    }
}
