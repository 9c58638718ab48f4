//! `sluicegate check`: one decision from a running service, from a shell — over HTTP
//! (`POST /v1/check`) or over gRPC (Envoy's `ShouldRateLimit`) — printed as JSON. Its
//! request flags and HTTP client serve `sluicegate explain` too.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use axum::body::Bytes;
use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::runtime::runtime;
use crate::envoy;
use crate::server::trusted_roots;

#[derive(Args)]
pub(super) struct CheckArgs {
    #[command(flatten)]
    request: Request,
    /// Ask over gRPC (Envoy's RateLimitService/ShouldRateLimit) instead of HTTP's
    /// POST /v1/check.
    #[arg(long, env = "SLUICEGATE_CHECK_GRPC")]
    grpc: bool,
}

/// One request to a running service, as `check` and `explain` send it.
#[derive(Args)]
pub(super) struct Request {
    /// The service's address, host:port.
    #[arg(long, env = "SLUICEGATE_CHECK_TARGET")]
    target: String,
    /// The descriptors' domain.
    #[arg(long, env = "SLUICEGATE_CHECK_DOMAIN")]
    domain: String,
    /// One descriptor: its entries as key=value, comma-separated (`user=alice` or
    /// `api=search,user=alice`). Repeat the flag for several descriptors.
    #[arg(long, env = "SLUICEGATE_CHECK_DESCRIPTOR", required = true, value_parser = parse_descriptor)]
    descriptor: Vec<Descriptor>,
    /// Units the request costs (`cost` over HTTP; over gRPC each descriptor's
    /// `hits_addend`, 0 only looking, as over HTTP).
    #[arg(long, env = "SLUICEGATE_CHECK_HITS", default_value_t = 1)]
    hits: u32,
    /// Over TLS, trusting the authority of this PEM file (a `serve --tls-cert` service);
    /// the certificate must name the target's host.
    #[arg(long, env = "SLUICEGATE_CHECK_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

/// A connection's byte stream: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// How to reach the target: its address, and the TLS client when asked for one.
#[derive(Clone)]
struct Connector {
    target: String,
    tls: Option<TlsConnector>,
}

impl Connector {
    /// `alpn`: the one protocol to offer over TLS (gRPC needs `h2`).
    fn new(args: &Request, alpn: &[u8]) -> Result<Connector> {
        let tls = match &args.tls_ca {
            Some(path) => {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let mut config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .context("TLS protocol versions")?
                    .with_root_certificates(trusted_roots(path)?)
                    .with_no_client_auth();
                config.alpn_protocols = vec![alpn.to_vec()];
                Some(TlsConnector::from(Arc::new(config)))
            }
            None => None,
        };
        Ok(Connector {
            target: args.target.clone(),
            tls,
        })
    }

    async fn open(&self) -> Result<Box<dyn Stream>> {
        let tcp = TcpStream::connect(&self.target)
            .await
            .with_context(|| format!("cannot connect to {}", self.target))?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = self
            .target
            .rsplit_once(':')
            .map_or(&*self.target, |(h, _)| h);
        let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
            .with_context(|| format!("--target {}: not a host name", self.target))?;
        let stream = tls
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS with {}", self.target))?;
        Ok(Box::new(stream))
    }
}

/// One descriptor's entries, in order.
#[derive(Clone, Debug, PartialEq)]
struct Descriptor(Vec<(String, String)>);

/// `key=value[,key=value…]`; neither part may be empty.
fn parse_descriptor(text: &str) -> Result<Descriptor, String> {
    text.split(',')
        .map(|entry| match entry.split_once('=') {
            Some((key, value)) if !key.is_empty() && !value.is_empty() => {
                Ok((key.to_owned(), value.to_owned()))
            }
            _ => Err(format!("{entry:?} is not key=value")),
        })
        .collect::<Result<_, _>>()
        .map(Descriptor)
}

/// Asks, prints the answer, and says whether it allowed; an error when no decision came.
pub(super) fn run(args: &CheckArgs) -> Result<bool> {
    let runtime = runtime()?;
    let (answer, allowed) = if args.grpc {
        runtime.block_on(over_grpc(&args.request))?
    } else {
        runtime.block_on(over_http(&args.request))?
    };
    println!("{answer}");
    Ok(allowed)
}

/// `POST /v1/check`: the service's answer as it sent it, and whether it allowed.
async fn over_http(args: &Request) -> Result<(String, bool)> {
    let (text, answer) = args.post("/v1/check", None).await?;
    let allowed = answer.get("allowed").and_then(Value::as_bool);
    let allowed = allowed.ok_or_else(|| anyhow!("the answer has no \"allowed\": {text}"))?;
    Ok((text, allowed))
}

impl Request {
    /// Posts this request as a `/v1/check` body to `path`, with `bearer` as its
    /// `Authorization` if given: the answer as sent, and as JSON; an error unless the
    /// service answered 2xx in JSON.
    pub(super) async fn post(&self, path: &str, bearer: Option<&str>) -> Result<(String, Value)> {
        let descriptors: Vec<Value> = self
            .descriptor
            .iter()
            .map(|Descriptor(entries)| {
                let entries: Vec<Value> = entries
                    .iter()
                    .map(|(key, value)| json!({"key": key, "value": value}))
                    .collect();
                json!({ "entries": entries })
            })
            .collect();
        let body = json!({"domain": self.domain, "descriptors": descriptors, "cost": self.hits});
        let mut request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.target)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .with_context(|| format!("--target {}", self.target))?;
        let stream = Connector::new(self, b"http/1.1")?.open().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP with {}", self.target))?;
        tokio::spawn(connection);
        let response = sender
            .send_request(request)
            .await
            .with_context(|| format!("no answer from {}", self.target))?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        let answer: Value = serde_json::from_str(&text)
            .map_err(|_| anyhow!("{} answered {status}: {text}", self.target))?;
        if !status.is_success() {
            let reason = answer.get("error").and_then(Value::as_str).unwrap_or(&text);
            bail!("{} answered {status}: {reason}", self.target);
        }
        Ok((text, answer))
    }
}

/// `ShouldRateLimit`: the response in proto3's JSON mapping, and whether it was OK.
async fn over_grpc(args: &Request) -> Result<(String, bool)> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", args.target))
        .map_err(|e| anyhow!("--target {}: {e}", args.target))?;
    let connector = Connector::new(args, b"h2")?;
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move { connector.open().await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| {
            // The connector's own error and its causes, rather than tonic's wrapping (whose
            // layers repeat the words of the one below).
            let mut causes: Vec<String> =
                std::iter::successors(std::error::Error::source(&e), |e| e.source())
                    .map(ToString::to_string)
                    .collect();
            causes.dedup();
            anyhow!("{}", causes.join(": "))
        })?;
    let request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: args
            .descriptor
            .iter()
            .map(|Descriptor(entries)| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                // Each descriptor's own, as Envoy's stream-done call sets them: on a usage
                // rule, hits above 0 are a report (docs/SPEC.md, "Modes").
                hits_addend: Some(UInt64Value {
                    value: args.hits.into(),
                }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: args.hits,
    };
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request)
        .await
        .map_err(|status| {
            anyhow!(
                "{} answered {:?}: {}",
                args.target,
                status.code(),
                status.message()
            )
        })?
        .into_inner();
    let allowed = response.overall_code == i32::from(Code::Ok);
    Ok((envoy::json::response(&response).to_string(), allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_read_as_key_value_lists() {
        let entry = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            parse_descriptor("api=search,user=alice"),
            Ok(Descriptor(vec![
                entry("api", "search"),
                entry("user", "alice")
            ]))
        );
        assert_eq!(
            parse_descriptor("user=a=b"),
            Ok(Descriptor(vec![entry("user", "a=b")]))
        );
        for bad in ["user", "=alice", "user=", "user=alice,"] {
            assert!(parse_descriptor(bad).is_err(), "{bad}");
        }
    }
}
