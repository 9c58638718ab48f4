//! Redis Sentinel: the store talks to the master the sentinels name. `connect` asks them at
//! connect, and again every [`LOOKUP_EVERY`]; when they name another server (a failover),
//! the connection moves there. Checks sent to the old master meanwhile fail (refused
//! connections, READONLY from a demoted master) and are reported as errors like any other.

use std::time::Duration;

use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ErrorKind, IntoConnectionInfo, TlsCertificates, TlsMode};

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

/// The master's client, as the sentinels name it now, within `timeout`. A failure says
/// whose connection failed, the sentinels' or the master's: a wrong password or an
/// untrusted certificate is fixed in a different place for each.
pub(super) async fn master(
    sentinels: &mut SentinelClient,
    timeout: Duration,
) -> Result<redis::Client, String> {
    let within = |what: &str| format!("{what} did not answer within {timeout:?}");
    let err = match tokio::time::timeout(timeout, sentinels.async_get_client()).await {
        Ok(Ok(master)) => return Ok(master),
        Ok(Err(err)) => err,
        Err(_) => return Err(within("the sentinels or the master")),
    };
    if err.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        return Err(format!("no master from the sentinels: {err}"));
    }
    // The redis crate reports a sentinel's failure and the master's alike; a sentinel asked
    // alone (the same credentials, the same TLS) tells them apart.
    match tokio::time::timeout(timeout, sentinels.async_get_sentinel_client()).await {
        Ok(Ok(_)) => Err(format!(
            "the connection to the master the sentinels name failed: {err}"
        )),
        Ok(Err(sentinel_err)) => Err(format!(
            "the connection to the sentinels failed: {sentinel_err}"
        )),
        Err(_) => Err(within("the sentinels")),
    }
}
