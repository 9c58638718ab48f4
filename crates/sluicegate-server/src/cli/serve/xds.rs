//! `serve`'s flags for the configuration over xDS (`--config-xds` and friends), named
//! after envoyproxy/ratelimit's CONFIG_GRPC_XDS_* settings, whose value formats they
//! also accept.

use std::path::PathBuf;

use clap::Args;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

use super::super::args::{DurationArg, parse_duration_arg};
use crate::xds::{BackoffOptions, XdsOptions, XdsTls};

/// The flags of the xDS configuration source.
#[derive(Args)]
pub(super) struct XdsArgs {
    /// Take the configuration from this xDS management server (HOST:PORT), over ADS
    /// (state of the world), instead of files: envoyproxy/ratelimit's
    /// CONFIG_TYPE=GRPC_XDS_SOTW.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS", value_name = "HOST:PORT", conflicts_with = "config", value_parser = parse_server)]
    config_xds: Option<String>,
    /// The node id sent to the xDS server.
    #[arg(
        long,
        env = "SLUICEGATE_CONFIG_XDS_NODE_ID",
        default_value = "default",
        requires = "config_xds"
    )]
    config_xds_node_id: String,
    /// The node's metadata sent to the xDS server: K=V or K:V pairs, comma separated.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_NODE_METADATA", value_name = "K=V,…", requires = "config_xds", value_parser = parse_node_metadata)]
    config_xds_node_metadata: Option<NodeMetadata>,
    /// gRPC metadata sent on the xDS stream, NAME:VALUE (repeat the flag, or separate
    /// pairs with commas).
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_HEADER", value_name = "NAME:VALUE", requires = "config_xds", value_parser = parse_headers)]
    config_xds_header: Vec<Headers>,
    /// TLS to the xDS server.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_TLS", requires = "config_xds")]
    config_xds_tls: bool,
    /// mTLS to the xDS server: the client certificate (PEM).
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_CLIENT_CERT", requires_all = ["config_xds_tls", "config_xds_client_key"])]
    config_xds_client_cert: Option<PathBuf>,
    /// mTLS to the xDS server: the client certificate's key (PEM).
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_CLIENT_KEY", requires_all = ["config_xds_tls", "config_xds_client_cert"])]
    config_xds_client_key: Option<PathBuf>,
    /// The authority (PEM) the xDS server's certificate is checked against; the system's
    /// without it.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_CA", requires = "config_xds_tls")]
    config_xds_ca: Option<PathBuf>,
    /// The name the xDS server's certificate must carry; the host of --config-xds
    /// without it.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_SAN", requires = "config_xds_tls")]
    config_xds_san: Option<String>,
    /// The wait (spread by ±50%) between attempts to reach an xDS server that does not
    /// answer.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_RETRY_INTERVAL", default_value = "3s", value_parser = parse_duration_arg)]
    config_xds_retry_interval: DurationArg,
    /// After the xDS stream broke: the first wait before connecting again.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_BACKOFF_INITIAL", default_value = "10s", value_parser = parse_duration_arg)]
    config_xds_backoff_initial: DurationArg,
    /// After the xDS stream broke: the longest wait.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_BACKOFF_MAX", default_value = "60s", value_parser = parse_duration_arg)]
    config_xds_backoff_max: DurationArg,
    /// After the xDS stream broke: each wait is the first times this factor to the
    /// number of waits so far (envoy's XDS_CLIENT_BACKOFF_RANDOM_FACTOR; below 1, every
    /// wait is the first).
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_factor)]
    config_xds_backoff_random_factor: f64,
    /// After the xDS stream broke: draw each wait between the first and the product.
    #[arg(long, env = "SLUICEGATE_CONFIG_XDS_BACKOFF_JITTER", default_value_t = true, action = clap::ArgAction::Set)]
    config_xds_backoff_jitter: bool,
    /// The largest message taken from the xDS server, in bytes; 0 (as envoy's unset
    /// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES) is the default, 4 MiB.
    #[arg(
        long,
        env = "SLUICEGATE_CONFIG_XDS_MAX_MESSAGE_BYTES",
        default_value_t = 0
    )]
    config_xds_max_message_bytes: u32,
    /// With --config-xds: listen at once rather than wait for the first push; until it
    /// comes every check fails (gRPC UNAVAILABLE, HTTP 503), so the caller's failure mode
    /// decides.
    #[arg(long, env = "SLUICEGATE_START_WITHOUT_CONFIG")]
    start_without_config: bool,
    /// Not ready (/readyz, /healthcheck, gRPC health) while the configuration in force
    /// declares no domain: before the first xDS push, or after an empty one.
    #[arg(long, env = "SLUICEGATE_HEALTHY_WITH_CONFIG")]
    pub(super) healthy_with_config: bool,
}

impl XdsArgs {
    /// The xDS source these flags describe; none without --config-xds.
    pub(super) fn options(&self) -> Option<XdsOptions> {
        let server = self.config_xds.clone()?;
        let tls = self.config_xds_tls.then(|| XdsTls {
            ca: self.config_xds_ca.clone(),
            client_identity: self
                .config_xds_client_cert
                .clone()
                .zip(self.config_xds_client_key.clone()),
            san: self.config_xds_san.clone(),
        });
        Some(XdsOptions {
            server,
            node_id: self.config_xds_node_id.clone(),
            node_metadata: self
                .config_xds_node_metadata
                .clone()
                .map(|m| m.0)
                .unwrap_or_default(),
            headers: self
                .config_xds_header
                .iter()
                .flat_map(|h| h.0.iter().cloned())
                .collect(),
            tls,
            retry_interval: self.config_xds_retry_interval.duration(),
            backoff: BackoffOptions {
                initial: self.config_xds_backoff_initial.duration(),
                max: self.config_xds_backoff_max.duration(),
                factor: self.config_xds_backoff_random_factor,
                jitter: self.config_xds_backoff_jitter,
            },
            max_message_bytes: (self.config_xds_max_message_bytes > 0)
                .then_some(self.config_xds_max_message_bytes as usize),
            start_without_config: self.start_without_config,
        })
    }
}

/// `--config-xds`: HOST:PORT, as a URI's authority.
fn parse_server(text: &str) -> Result<String, String> {
    match text.parse::<axum::http::uri::Authority>() {
        Ok(authority) if authority.port_u16().is_some() && !authority.host().is_empty() => {
            Ok(text.to_owned())
        }
        _ => Err(format!(
            "{text:?} is not HOST:PORT (e.g. envoy-gateway:18001)"
        )),
    }
}

/// `--config-xds-node-metadata`, as envoy's CONFIG_GRPC_XDS_NODE_METADATA.
#[derive(Clone, Debug)]
struct NodeMetadata(Vec<(String, String)>);

/// Pairs separated by commas, each `K=V` or `K:V` (split at the first `=` if there is
/// one, else at the first `:`); empty pairs are skipped. envoyproxy/ratelimit documents
/// both forms but splits at `=` only and drops a `K:V` pair unread; here a pair that is
/// neither is refused rather than dropped.
fn parse_node_metadata(text: &str) -> Result<NodeMetadata, String> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .or_else(|| pair.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("{pair:?} is neither K=V nor K:V"))
        })
        .collect::<Result<_, _>>()
        .map(NodeMetadata)
}

/// One `--config-xds-header`: one or more gRPC metadata entries.
#[derive(Clone, Debug)]
struct Headers(Vec<(AsciiMetadataKey, AsciiMetadataValue)>);

/// `NAME:VALUE`, or envoy's map form `k1:v1,k2:v2` (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS,
/// read by envconfig: pairs split at commas, each at its first `:`).
fn parse_headers(text: &str) -> Result<Headers, String> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair
                .split_once(':')
                .ok_or_else(|| format!("{pair:?} is not NAME:VALUE"))?;
            let key = AsciiMetadataKey::from_bytes(name.trim().as_bytes())
                .map_err(|_| format!("{name:?} is not a gRPC metadata name"))?;
            let value = AsciiMetadataValue::try_from(value)
                .map_err(|_| format!("{name}: {value:?} is not a gRPC metadata value"))?;
            Ok((key, value))
        })
        .collect::<Result<_, String>>()
        .map(Headers)
}

/// `--config-xds-backoff-random-factor`: a finite number above 0.
fn parse_factor(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err(format!(
            "{text:?} is not a number above 0, such as 0.5 or 2"
        )),
    }
}
