//! A store chosen at run time from a URL: what the binary and services use.

use std::sync::Arc;
use std::time::Duration;

use super::check::{
    Check, DEFAULT_EVICTION_CHECK_INTERVAL, DEFAULT_EXPIRATION_JITTER_MAX,
    DEFAULT_LOST_STATE_CHECK_INTERVAL, DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT, NodeId, Nodes,
    Outcome, Store,
};
use super::durability::Durability;
use super::error::StoreError;
use super::memory::{MemoryStore, MemoryStoreConfig};
#[cfg(feature = "redis")]
use super::redis::{RedisStore, RedisStoreConfig, Scripting};
use super::url::{StoreUrl, Target};
use crate::clock::SystemClock;

/// The in-memory store or a Redis one.
#[derive(Debug)]
pub enum AnyStore {
    /// `memory`.
    Memory(MemoryStore),
    /// `redis://…`, `rediss://…`, `redis+unix://…`, `redis-cluster://…`,
    /// `rediss-cluster://…`, `redis+sentinel://…` or `rediss+sentinel://…`.
    #[cfg(feature = "redis")]
    Redis(RedisStore),
}

/// Where a store lives and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// A [`StoreUrl`]: `memory`, `redis://…`, `rediss://…`, `redis+unix://…`,
    /// `redis-cluster://host:port,…`, `rediss-cluster://…`,
    /// `redis+sentinel://host:port,…/master-name`, `rediss+sentinel://…`.
    pub url: String,
    /// Redis key prefix (kept without the `redis` feature, which has no use for it, so
    /// that code setting it builds either way).
    pub prefix: String,
    /// Per-call timeout for Redis.
    pub timeout: Duration,
    /// PEM certificate(s) of the authority behind a TLS server's certificate.
    pub tls_ca: Option<Vec<u8>>,
    /// For TLS: the certificate this client presents, for a server that asks for one.
    pub tls_client: Option<TlsClientIdentity>,
    /// How often Redis' `maxmemory-policy` is read again after connecting; zero: at
    /// connect only.
    pub eviction_check_interval: Duration,
    /// How often Redis is checked for state it lost (a restart without persistence, a
    /// failover that lost writes, a flush); zero: never (no epoch marker is written).
    pub lost_state_check_interval: Duration,
    /// How much longer than its window an envoy counter may live in Redis, at most
    /// (`RedisStoreConfig::expiration_jitter_max`).
    pub expiration_jitter_max: Duration,
    /// Whether a check that recorded units answers only once a Redis replica has them;
    /// the in-memory store has none, and refuses [`Durability::Replicated`].
    pub durability: Durability,
    /// The in-memory store's settings.
    pub memory: MemoryStoreConfig,
}

/// A client's certificate and its private key (PEM), presented to a TLS server that asks
/// for one (Redis' `tls-auth-clients`).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsClientIdentity {
    /// The certificate chain, leaf first.
    pub cert: Vec<u8>,
    /// Its private key.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("TlsClientIdentity").finish_non_exhaustive()
    }
}

impl StoreOptions {
    /// Defaults for `url`.
    pub fn new(url: &str) -> Self {
        StoreOptions {
            url: url.to_owned(),
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            timeout: DEFAULT_REDIS_TIMEOUT,
            tls_ca: None,
            tls_client: None,
            eviction_check_interval: DEFAULT_EVICTION_CHECK_INTERVAL,
            lost_state_check_interval: DEFAULT_LOST_STATE_CHECK_INTERVAL,
            expiration_jitter_max: DEFAULT_EXPIRATION_JITTER_MAX,
            durability: Durability::Async,
            memory: MemoryStoreConfig::default(),
        }
    }
}

impl AnyStore {
    /// Opens the store `options.url` names; a URL that names none is an invalid check.
    pub async fn open(options: StoreOptions) -> Result<AnyStore, StoreError> {
        let url =
            StoreUrl::parse(&options.url).map_err(|e| StoreError::InvalidCheck(e.to_string()))?;
        match url.target() {
            Target::Memory if options.durability == Durability::Replicated => {
                Err(StoreError::InvalidCheck(
                    "store durability replicated needs Redis replicas; the in-memory store \
                     has none"
                        .to_owned(),
                ))
            }
            Target::Memory => Ok(AnyStore::Memory(MemoryStore::new(
                options.memory,
                Arc::new(SystemClock::new()),
            ))),
            #[cfg(feature = "redis")]
            Target::Redis(redis) => RedisStore::open(
                redis,
                RedisStoreConfig {
                    url: options.url.clone(),
                    prefix: options.prefix,
                    timeout: options.timeout,
                    tls_ca: options.tls_ca,
                    tls_client: options.tls_client,
                    eviction_check_interval: options.eviction_check_interval,
                    lost_state_check_interval: options.lost_state_check_interval,
                    scripting: Scripting::Auto,
                    expiration_jitter_max: options.expiration_jitter_max,
                    durability: options.durability,
                },
            )
            .await
            .map(AnyStore::Redis),
        }
    }

    /// Whether the store answers: always for memory; a PING within the timeout for Redis.
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.ping().await,
        }
    }

    /// Forgets the state `rule` holds for `key`, as if it had never been used.
    pub async fn forget(&self, rule: &crate::Rule, key: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(store) => {
                store.forget(rule, key);
                Ok(())
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.forget(rule, key).await,
        }
    }

    /// The in-memory store, if that is what this is (for sweeping).
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            AnyStore::Memory(store) => Some(store),
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => None,
        }
    }
}

impl Store for AnyStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        match self {
            AnyStore::Memory(store) => store.check_now(check),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.check(check).await,
        }
    }

    fn may_lose_state(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.may_lose_state(),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.may_lose_state(),
        }
    }

    fn lost_state_generation(&self, check: &Check<'_>) -> u64 {
        match self {
            AnyStore::Memory(store) => store.lost_state_generation(check),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.lost_state_generation(check),
        }
    }

    fn nodes(&self, check: &Check<'_>) -> Nodes {
        match self {
            AnyStore::Memory(store) => store.nodes(check),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.nodes(check),
        }
    }

    fn node_name(&self, node: NodeId) -> Option<String> {
        match self {
            AnyStore::Memory(store) => store.node_name(node),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.node_name(node),
        }
    }

    fn node_refused(&self, node: NodeId) {
        match self {
            AnyStore::Memory(store) => store.node_refused(node),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.node_refused(node),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Redis scheme the docs name gets past the URL to the connection (port 1 on
    /// loopback refuses it), `rediss-cluster://` among them.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn every_redis_scheme_reaches_a_connection() {
        for url in [
            "redis://127.0.0.1:1",
            "rediss://127.0.0.1:1",
            "redis+unix:///nonexistent/redis.sock",
            "redis-cluster://127.0.0.1:1",
            "rediss-cluster://127.0.0.1:1",
        ] {
            let mut options = StoreOptions::new(url);
            options.timeout = Duration::from_millis(100);
            match AnyStore::open(options).await {
                Err(StoreError::Unavailable { server, .. }) => assert_eq!(server, url),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_unknown_store_is_refused() {
        let err = AnyStore::open(StoreOptions::new("memcached://127.0.0.1:1"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidCheck(m) if m.starts_with("unknown store")),
            "{err:?}"
        );
    }
}
