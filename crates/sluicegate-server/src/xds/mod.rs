//! The configuration over xDS (`--config-xds`): a state-of-the-world ADS client of a
//! management server such as Envoy Gateway's, as envoyproxy/ratelimit's
//! `CONFIG_TYPE=GRPC_XDS_SOTW` (`src/provider/xds_grpc_sotw_provider.go`).
//!
//! One stream of `StreamAggregatedResources` asks for `RateLimitConfig` resources. Each
//! push is validated whole, as a file reload is (`resource.rs`): a good one is put in
//! force at once and ACKed (its `version_info` and nonce); a bad one is NACKed, its
//! `error_detail` saying why and its `version_info` the last version ACKed, and the
//! configuration in force keeps answering. When the stream breaks the client waits
//! (`backoff.rs`) and connects again, sending the last version it ACKed; what is in
//! force meanwhile stays in force.

mod backoff;
mod resource;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::{mpsc, watch};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use self::backoff::BackoffOptions;
use self::backoff::{Backoff, Random};
use crate::config::{self, LoadOptions};
use crate::service::Service;

/// `google.rpc.Code.INVALID_ARGUMENT`: what a NACK's `error_detail` says of a push.
const INVALID_ARGUMENT: i32 = 3;

/// How long one attempt to reach the management server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 pings on the stream, so that a server gone silent is noticed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the configuration comes from, and how to reach it (`--config-xds` and friends).
#[derive(Clone, Debug)]
pub struct XdsOptions {
    /// The management server, `HOST:PORT`.
    pub server: String,
    /// The node id sent (`--config-xds-node-id`).
    pub node_id: String,
    /// The node's metadata, string values (`--config-xds-node-metadata`).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent on the stream (`--config-xds-header`).
    pub headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    /// TLS to the server; plaintext without it.
    pub tls: Option<XdsTls>,
    /// The wait between attempts to reach a server that does not answer.
    pub retry_interval: Duration,
    /// The wait before connecting again after a stream broke.
    pub backoff: BackoffOptions,
    /// The largest message received; tonic's (and grpc-go's) 4 MiB without it.
    pub max_message_bytes: Option<usize>,
    /// Serve at once, with no configuration, rather than wait for the first good push.
    pub start_without_config: bool,
}

/// TLS to the management server.
#[derive(Clone, Debug, Default)]
pub struct XdsTls {
    /// The authority the server's certificate is checked against; the system's without
    /// it.
    pub ca: Option<PathBuf>,
    /// The client certificate and key (PEM) for mTLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must carry; the host of the address without it.
    pub san: Option<String>,
}

/// Reads the TLS files (a file that cannot be used stops the start) and starts the client
/// on `service`. The receiver turns true once a first push is in force.
pub(crate) fn start(
    options: XdsOptions,
    load: LoadOptions,
    service: Arc<Service>,
) -> anyhow::Result<watch::Receiver<bool>> {
    endpoint(&options)?;
    let dial_options = options.clone();
    // The endpoint is made again for each attempt: certificate files replaced meanwhile
    // are read for the next connection.
    let dial: Dial = Box::new(move || {
        let options = dial_options.clone();
        Box::pin(async move { Ok(endpoint(&options)?.connect().await?) })
    });
    let (client, loaded) = Client::new(options, load, service, dial, backoff::random);
    tokio::spawn(client.run());
    Ok(loaded)
}

/// One attempt to reach the management server: a connected channel, or why not.
type Dial =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<Channel>> + Send>> + Send + Sync>;

/// The node this client says it is.
fn node(options: &XdsOptions) -> Node {
    let fields = options
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: options.node_id.clone(),
        metadata: Some(Struct { fields }),
        ..Node::default()
    }
}

/// The channel's settings, TLS files read.
fn endpoint(options: &XdsOptions) -> anyhow::Result<Endpoint> {
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", options.server))
        .with_context(|| format!("--config-xds {}: not HOST:PORT", options.server))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if let Some(tls) = &options.tls {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca)?)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &tls.client_identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(san) = &tls.san {
            config = config.domain_name(san.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .context("--config-xds TLS (--config-xds-ca, --config-xds-client-cert/-key)")?;
    }
    Ok(endpoint)
}

/// The client's state across streams.
struct Client {
    options: XdsOptions,
    load: LoadOptions,
    service: Arc<Service>,
    dial: Dial,
    node: Node,
    backoff: Backoff,
    /// Spreads the retry interval.
    random: Random,
    /// The `version_info` of the last push put in force: sent again on a new stream.
    acked: Option<String>,
    /// True once a push is in force.
    loaded: watch::Sender<bool>,
}

impl Client {
    /// A client of `service` reaching its server by `dial`, its waits drawn from
    /// `random`; the receiver turns true once a first push is in force.
    fn new(
        options: XdsOptions,
        load: LoadOptions,
        service: Arc<Service>,
        dial: Dial,
        random: impl Fn() -> Random,
    ) -> (Client, watch::Receiver<bool>) {
        let (loaded, first) = watch::channel(false);
        let client = Client {
            backoff: Backoff::new(options.backoff, random()),
            random: random(),
            node: node(&options),
            options,
            load,
            service,
            dial,
            acked: None,
            loaded,
        };
        (client, first)
    }

    /// Connects, follows the stream, and connects again when it breaks; for ever.
    async fn run(mut self) {
        tracing::info!(
            server = %self.options.server,
            node_id = %self.options.node_id,
            tls = self.options.tls.is_some(),
            "xDS: connecting to the management server"
        );
        loop {
            let channel = self.connect().await;
            tracing::info!(server = %self.options.server, "xDS: connected");
            self.service.metrics().xds().connected(true);
            let why = self.follow(channel).await;
            self.service.metrics().xds().connected(false);
            let wait = self.backoff.next_wait();
            tracing::warn!(
                server = %self.options.server,
                reason = %why,
                version = self.acked.as_deref().unwrap_or(""),
                retry_in = ?wait,
                "xDS: disconnected; the configuration in force keeps serving"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// A connected channel, after as many attempts as it takes.
    async fn connect(&mut self) -> Channel {
        loop {
            match (self.dial)().await {
                Ok(channel) => return channel,
                Err(e) => {
                    let wait = backoff::retry_wait(self.options.retry_interval, &mut self.random);
                    tracing::warn!(
                        server = %self.options.server,
                        error = %format!("{e:#}"),
                        retry_in = ?wait,
                        "xDS: cannot reach the management server"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Follows one stream until it ends; says why it did.
    async fn follow(&mut self, channel: Channel) -> String {
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(limit) = self.options.max_message_bytes {
            client = client.max_decoding_message_size(limit);
        }
        let (requests, outbound) = mpsc::unbounded_channel();
        // A new stream: the last version ACKed, no nonce (no response on it yet).
        let first = self.request(self.acked.clone().unwrap_or_default(), String::new(), None);
        // The receiver is in `outbound` until the stream ends.
        let _ = requests.send(first);
        let outbound = futures_util::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|request| (request, outbound))
        });
        let mut request = tonic::Request::new(outbound);
        for (name, value) in &self.options.headers {
            request.metadata_mut().append(name.clone(), value.clone());
        }
        let mut inbound = match client.stream_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return status_text(&status),
        };
        loop {
            match inbound.message().await {
                Ok(Some(response)) => {
                    let reply = self.apply(response);
                    if requests.send(reply).is_err() {
                        return "the stream closed".into();
                    }
                }
                Ok(None) => return "the server ended the stream".into(),
                Err(status) => return status_text(&status),
            }
        }
    }

    /// Validates a push whole, puts it in force if it is good, and answers it: ACK or
    /// NACK.
    fn apply(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let version = response.version_info;
        let nonce = response.nonce;
        let config = if response.type_url.is_empty() || response.type_url == resource::type_url() {
            resource::config_of(&response.resources, self.load)
        } else {
            Err(format!(
                "type {:?}: expected {}",
                response.type_url,
                resource::type_url()
            ))
        };
        match config {
            Ok(config) => {
                let changes = config.changes_from(&self.service.live().config);
                self.service.replace_config(config, Some(version.clone()));
                self.service.metrics().config_loaded();
                self.service.metrics().xds().acked(&version);
                tracing::info!(
                    version = %config::clipped(&version, config::MAX_QUOTED_NAME_BYTES),
                    resources = response.resources.len(),
                    added = %config::listed(&changes.added),
                    removed = %config::listed(&changes.removed),
                    edited = %config::listed(&changes.edited),
                    "xDS: configuration ACKed and in force"
                );
                self.acked = Some(version.clone());
                self.loaded.send_replace(true);
                self.request(version, nonce, None)
            }
            Err(reason) => {
                self.service.metrics().config_rejected();
                self.service.metrics().xds().nacked();
                tracing::error!(
                    version = %config::clipped(&version, config::MAX_QUOTED_NAME_BYTES),
                    error = %reason,
                    in_force = self.acked.as_deref().unwrap_or(""),
                    "xDS: configuration NACKed; the configuration in force keeps serving"
                );
                let detail = Status {
                    code: INVALID_ARGUMENT,
                    message: reason,
                    details: Vec::new(),
                };
                self.request(self.acked.clone().unwrap_or_default(), nonce, Some(detail))
            }
        }
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(self.node.clone()),
            type_url: resource::type_url(),
            response_nonce: nonce,
            error_detail: error,
            ..DiscoveryRequest::default()
        }
    }
}

/// A gRPC status as a log says it.
fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

#[cfg(test)]
mod tests;
