//! Redis Sentinel: the store talks to the master the sentinels name. `connect` asks them at
//! connect, and again every [`LOOKUP_EVERY`]; when they name another server (a failover),
//! the connection moves there. Checks sent to the old master meanwhile fail (refused
//! connections, READONLY from a demoted master) and are reported as errors like any other.

use std::time::Duration;

use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, TlsCertificates, TlsMode};

use crate::store::url::SentinelUrl;

/// How often the sentinels are asked which server is the master.
pub(super) const LOOKUP_EVERY: Duration = Duration::from_millis(500);

/// A client of the sentinels at `url`, which finds their master for `url`'s name; TLS to
/// both when `tls`, certificates checked against `certificates` when given; every
/// connection with `tcp`.
pub(super) fn sentinels(
    url: &SentinelUrl,
    tls: bool,
    certificates: Option<&TlsCertificates>,
    tcp: &TcpSettings,
) -> redis::RedisResult<SentinelClient> {
    let scheme = if tls { "rediss" } else { "redis" };
    let addresses = url
        .sentinels
        .iter()
        .map(|address| {
            let info = format!("{scheme}://{address}").into_connection_info()?;
            Ok(info.addr().clone())
        })
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let mut builder =
        SentinelClientBuilder::new(addresses, &url.master_name, SentinelServerType::Master)?
            .set_client_to_redis_tcp_settings(tcp.clone())
            .set_client_to_sentinel_tcp_settings(tcp.clone());
    if tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates.clone());
        }
    }
    if let Some(credentials) = &url.master_credentials {
        // The redis crate reads (and percent-decodes) them as it would a server URL's.
        let info = format!("redis://{credentials}@sentinel.invalid").into_connection_info()?;
        let settings = info.redis_settings();
        if let Some(user) = settings.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
    }
    if let Some(user) = &url.sentinel_username {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &url.sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    builder.build()
}

/// The master's client, as the sentinels name it now, within `timeout`.
pub(super) async fn master(
    sentinels: &mut SentinelClient,
    timeout: Duration,
) -> Result<redis::Client, String> {
    tokio::time::timeout(timeout, sentinels.async_get_client())
        .await
        .map_err(|_| format!("no sentinel answered within {timeout:?}"))?
        .map_err(|e| format!("no master from the sentinels: {e}"))
}
