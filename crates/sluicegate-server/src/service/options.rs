//! How the front ends answer, beside what the configuration says: the options `serve`'s
//! flags set.

use std::sync::Arc;

use crate::compat::{Compat, Counting};
use crate::metrics::EnvoyStatsOptions;

use super::DEFAULT_MAX_ENTRY_BYTES;

/// The rate-limit headers an Envoy answer asks Envoy to add to the client's response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponseHeaders {
    /// None: what a configuration names stays between Envoy and the service.
    #[default]
    None,
    /// envoyproxy/ratelimit's three (`LIMIT_RESPONSE_HEADERS_ENABLED`), named by
    /// [`EnvoyHeaderNames`], from the descriptor closest to its limit.
    Envoy,
    /// IETF `RateLimit` and `RateLimit-Policy`, `Retry-After` on a refusal, and who decided.
    Ietf,
}

/// The names of envoyproxy/ratelimit's headers (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyHeaderNames {
    /// The limit's requests per unit.
    pub limit: String,
    /// What remains of it.
    pub remaining: String,
    /// Whole seconds until it resets.
    pub reset: String,
}

impl Default for EnvoyHeaderNames {
    /// envoyproxy/ratelimit's defaults (envoyproxy/ratelimit@f2fb157
    /// src/settings/settings.go:117-121).
    fn default() -> Self {
        EnvoyHeaderNames {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// How the front ends answer, beside what the configuration says.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// Envoy answers are OK even over the limit (`--shadow-mode`).
    pub shadow_mode: bool,
    /// A hit is near its limit past this share of it (`--near-limit-ratio`).
    pub near_limit_ratio: f32,
    /// The longest descriptor key or value accepted, in bytes.
    pub max_entry_bytes: usize,
    /// The headers Envoy answers ask to add (gRPC and `/json`).
    pub response_headers: ResponseHeaders,
    /// The names of [`ResponseHeaders::Envoy`]'s headers.
    pub envoy_header_names: EnvoyHeaderNames,
    /// The bearer token `/v1/reset` needs; `None` turns it off.
    pub admin_token: Option<Arc<str>>,
    /// The bearer token the main listener's `/v1/top`, `/v1/overview`, `/ui` and
    /// `/v1/explain` need (`--read-token-file`); `None`: they answer loopback peers only.
    pub read_token: Option<Arc<str>>,
    /// Not ready (`/readyz` 503) while a Redis server's `maxmemory-policy` may evict keys,
    /// or cannot be read.
    pub require_noeviction: bool,
    /// Serve the live page at `GET /ui`.
    pub ui: bool,
    /// The share of refusals logged, one line each (`--log-refusals`, 0 to 1).
    pub refusal_log_share: f64,
    /// Whose semantics the service keeps (`--compat`).
    pub compat: Compat,
    /// How a request's descriptors are counted (`--compat` and
    /// `--stop-increment-when-over-limit`, resolved by [`Compat::counting`]).
    pub counting: Counting,
    /// How envoyproxy/ratelimit's statistics are written in `/metrics`.
    pub envoy_stats: EnvoyStatsOptions,
    /// Not ready while the configuration in force declares no domain
    /// (`--healthy-with-config`).
    pub healthy_with_config: bool,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            shadow_mode: false,
            near_limit_ratio: crate::metrics::DEFAULT_NEAR_LIMIT_RATIO,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            response_headers: ResponseHeaders::None,
            envoy_header_names: EnvoyHeaderNames::default(),
            admin_token: None,
            read_token: None,
            require_noeviction: false,
            ui: true,
            refusal_log_share: 0.0,
            compat: Compat::None,
            counting: Counting::AllOrNothing,
            envoy_stats: EnvoyStatsOptions::default(),
            healthy_with_config: false,
        }
    }
}
