//! A store chosen at run time from a URL: what the binary and services use.

use std::sync::Arc;
use std::time::Duration;

use super::redis::{RedisStore, RedisStoreConfig};
use super::{Check, MemoryStore, MemoryStoreConfig, Outcome, Store, StoreError};
use crate::clock::SystemClock;

/// The in-memory store or a Redis one.
#[derive(Debug)]
pub enum AnyStore {
    /// `memory`.
    Memory(MemoryStore),
    /// `redis://…`, `rediss://…`, `redis+unix://…` or `redis-cluster://…`.
    Redis(RedisStore),
}

/// Where a store lives and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// `memory`, `redis://…`, `rediss://…`, `redis+unix://…`, `redis-cluster://host:port,…`,
    /// `rediss-cluster://…`.
    pub url: String,
    /// Redis key prefix.
    pub prefix: String,
    /// Per-call timeout for Redis.
    pub timeout: Duration,
    /// PEM certificate(s) of the authority behind a TLS server's certificate.
    pub tls_ca: Option<Vec<u8>>,
    /// The in-memory store's settings.
    pub memory: MemoryStoreConfig,
}

impl StoreOptions {
    /// Defaults for `url`.
    pub fn new(url: &str) -> Self {
        let redis = RedisStoreConfig::new(url);
        StoreOptions {
            url: url.to_owned(),
            prefix: redis.prefix,
            timeout: redis.timeout,
            tls_ca: None,
            memory: MemoryStoreConfig::default(),
        }
    }
}

impl AnyStore {
    /// Opens the store `options.url` names.
    pub async fn open(options: StoreOptions) -> Result<AnyStore, StoreError> {
        if options.url == "memory" {
            return Ok(AnyStore::Memory(MemoryStore::new(
                options.memory,
                Arc::new(SystemClock::new()),
            )));
        }
        let known = [
            "redis://",
            "redis+unix://",
            "unix://",
            "redis-cluster://",
            "rediss://",
        ];
        if !known.iter().any(|scheme| options.url.starts_with(scheme)) {
            return Err(StoreError::InvalidCheck(format!(
                "unknown store {:?}: expected memory, redis://host:port, rediss://host:port, \
                 redis+unix:///path or redis-cluster://host:port,host:port",
                options.url
            )));
        }
        let config = RedisStoreConfig {
            url: options.url,
            prefix: options.prefix,
            timeout: options.timeout,
            tls_ca: options.tls_ca,
        };
        RedisStore::connect(config).await.map(AnyStore::Redis)
    }

    /// Whether the store answers: always for memory; a PING within the timeout for Redis.
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
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
            AnyStore::Redis(store) => store.forget(rule, key).await,
        }
    }

    /// The in-memory store, if that is what this is (for sweeping).
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            AnyStore::Memory(store) => Some(store),
            AnyStore::Redis(_) => None,
        }
    }
}

impl Store for AnyStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        match self {
            AnyStore::Memory(store) => store.check_now(check),
            AnyStore::Redis(store) => store.check(check).await,
        }
    }
}
