//! Redis Sentinel: the store talks to the master the sentinels name. `connect` asks them at
//! connect, and again every [`LOOKUP_EVERY`]; when they name another server (a failover),
//! the connection moves there. Checks sent to the old master meanwhile fail (refused
//! connections, READONLY from a demoted master) and are reported as errors like any other.

use std::sync::Arc;
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

/// The master's client, as the sentinels name it now, within `timeout`: at connect, and
/// every [`LOOKUP_EVERY`] after to follow it. A failure says whose connection failed, the
/// sentinels' or the master's, where that can be told: a wrong password or an untrusted
/// certificate is fixed in a different place for each, and a master down while the
/// sentinels answer (before they fail it over) is not the sentinels' failure. Telling
/// them apart takes a second round trip, only once the lookup has failed.
pub(super) async fn master(
    sentinels: &mut SentinelClient,
    timeout: Duration,
) -> Result<redis::Client, String> {
    let err = match lookup(sentinels, timeout).await {
        Ok(master) => return Ok(master),
        Err(Lookup::TimedOut) => return Err(within(timeout, "the sentinels or the master")),
        Err(Lookup::Failed(err)) => err,
    };
    if err.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        return Err(format!("no master from the sentinels: {err}"));
    }
    // The redis crate reports a sentinel's failure and the master's alike; a sentinel asked
    // alone (the same credentials, the same TLS) tells them apart when it fails. When it
    // answers, the error may still be another sentinel's (one down while the master is
    // too); only a failure the sentinel just passed, its password or its TLS, is the
    // master's.
    match tokio::time::timeout(timeout, sentinels.async_get_sentinel_client()).await {
        Ok(Ok(_)) if is_credentials_or_tls(&err) => Err(format!(
            "the connection to the master the sentinels name failed: {err}"
        )),
        Ok(Ok(_)) => Err(format!(
            "a sentinel answers; no usable master from them: {err}"
        )),
        Ok(Err(sentinel_err)) => Err(format!(
            "the connection to the sentinels failed: {sentinel_err}"
        )),
        Err(_) => Err(within(timeout, "the sentinels")),
    }
}

/// Why the sentinels named no master.
enum Lookup {
    TimedOut,
    Failed(redis::RedisError),
}

async fn lookup(
    sentinels: &mut SentinelClient,
    timeout: Duration,
) -> Result<redis::Client, Lookup> {
    match tokio::time::timeout(timeout, sentinels.async_get_client()).await {
        Ok(Ok(master)) => Ok(master),
        Ok(Err(err)) => Err(Lookup::Failed(err)),
        Err(_) => Err(Lookup::TimedOut),
    }
}

fn within(timeout: Duration, what: &str) -> String {
    format!("{what} did not answer within {timeout:?}")
}

/// Whether `err` is a refused password or user, or a failed TLS handshake (an untrusted
/// certificate, a wrong name): failures of a server's configuration, not of its being down.
fn is_credentials_or_tls(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed || io_cause(err).is_some_and(is_tls)
}

/// The I/O error inside `err`, which the redis crate keeps behind an `Arc`.
fn io_cause(err: &redis::RedisError) -> Option<&std::io::Error> {
    let source = std::error::Error::source(err)?;
    source.downcast_ref::<std::io::Error>().or_else(|| {
        source
            .downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()?
            .downcast_ref::<std::io::Error>()
    })
}

/// tokio-rustls reports a failed handshake as an I/O error carrying the rustls error.
fn is_tls(err: &std::io::Error) -> bool {
    err.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_handshake_and_a_refused_password_are_configuration_a_refusal_is_not() {
        let handshake = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert!(is_credentials_or_tls(&handshake.into()));
        let password = redis::RedisError::from((ErrorKind::AuthenticationFailed, "denied"));
        assert!(is_credentials_or_tls(&password));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_credentials_or_tls(&refused.into()));
    }
}
