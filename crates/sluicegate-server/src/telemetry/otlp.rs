//! The spans exported over OTLP (gRPC, or HTTP with protobuf bodies) when
//! `--otlp-endpoint` names a collector. Off by default, and then nothing here runs but one
//! `Option` test per check: no exporter, no thread, no span.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Request, Response};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span, SpanKind, Status, Tracer, TracerProvider};
use opentelemetry::{KeyValue, StringValue, Value};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider,
};

use super::options::{OtlpOptions, OtlpProtocol};
use crate::service::{DecideError, Decided};

/// Where traces go, or nowhere. Cheap to clone: the exporter is shared.
#[derive(Clone, Debug, Default)]
pub(crate) struct Telemetry {
    export: Option<Export>,
}

#[derive(Clone, Debug)]
struct Export {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Telemetry {
    /// Spans batched and sent to the OTLP collector `options` name. The batch's schedule
    /// and size follow the SDK's `OTEL_BSP_*` variables. Needs a tokio runtime: the
    /// exporter's channel runs on it.
    pub(crate) fn otlp(options: &OtlpOptions) -> anyhow::Result<Telemetry> {
        let endpoint = options.endpoint.as_str();
        let refused =
            |why: &dyn std::fmt::Display| anyhow::anyhow!("--otlp-endpoint {endpoint}: {why}");
        let uri: axum::http::Uri = endpoint.parse().map_err(|e| refused(&e))?;
        // No TLS to a collector here: an https endpoint would fail every export.
        if uri.scheme_str() != Some("http") {
            return Err(refused(&"only http:// collectors are supported (no TLS)"));
        }
        anyhow::ensure!(
            (0.0..=1.0).contains(&options.sampling_ratio),
            "--otlp-sampling-ratio {}: not between 0 and 1",
            options.sampling_ratio
        );
        let exporter = match options.protocol {
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build(),
            OtlpProtocol::Http => {
                let traces = if matches!(uri.path(), "" | "/") {
                    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
                } else {
                    endpoint.to_owned()
                };
                let client = OnRuntime {
                    client: Arc::new(HyperClient::with_default_connector(HTTP_TIMEOUT, None)),
                    runtime: tokio::runtime::Handle::current(),
                };
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(traces)
                    .build()
            }
        }
        .map_err(|e| refused(&e))?;
        let instance = options.service_instance_id.clone().unwrap_or_else(|| {
            // 128 random bits, written as a UUID as envoyproxy/ratelimit writes its own.
            let bits = format!("{:032x}", RandomIdGenerator::default().new_trace_id());
            format!(
                "{}-{}-{}-{}-{}",
                &bits[..8],
                &bits[8..12],
                &bits[12..16],
                &bits[16..20],
                &bits[20..]
            )
        });
        let mut resource = Resource::builder()
            .with_service_name(options.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", instance));
        if let Some(namespace) = &options.service_namespace {
            resource =
                resource.with_attribute(KeyValue::new("service.namespace", namespace.clone()));
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                options.sampling_ratio,
            ))))
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("sluicegate");
        Ok(Telemetry {
            export: Some(Export { provider, tracer }),
        })
    }

    /// Whether spans are exported at all.
    pub(crate) fn is_on(&self) -> bool {
        self.export.is_some()
    }

    /// A span for one check, started now, named `name`, a child of the caller's span
    /// when `headers` carry W3C trace context (`traceparent`, `tracestate`).
    pub(crate) fn check_span(
        &self,
        name: impl Into<Cow<'static, str>>,
        headers: &HeaderMap,
    ) -> CheckSpan {
        CheckSpan(self.export.as_ref().map(|export| {
            let parent = TraceContextPropagator::new().extract(&Headers(headers));
            export
                .tracer
                .span_builder(name)
                .with_kind(SpanKind::Server)
                .start_with_context(&export.tracer, &parent)
        }))
    }

    /// Sends the spans still batched and stops the exporter. Blocking work, done off the
    /// runtime's workers: the export itself runs on them.
    pub(crate) async fn shutdown(&self) {
        let Some(export) = self.export.clone() else {
            return;
        };
        let stopped = tokio::task::spawn_blocking(move || {
            export.provider.shutdown_with_timeout(FLUSH_TIMEOUT)
        })
        .await;
        match stopped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("traces: the last spans were not sent: {e}"),
            Err(e) => tracing::warn!("traces: the exporter's shutdown failed: {e}"),
        }
    }
}

/// How long an OTLP/HTTP export may take (the OpenTelemetry exporters' default).
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP/HTTP client: hyper's, run on the service's runtime. The batch processor
/// exports from a thread of its own, outside any runtime, and hyper needs one.
#[derive(Debug)]
struct OnRuntime {
    client: Arc<HyperClient>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = Arc::clone(&self.client);
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// How long a shutdown waits for the last batch to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// One check's span; nothing when traces are off. Ended by [`CheckSpan::end`], or when
/// dropped (a request abandoned midway still shows).
pub(crate) struct CheckSpan(Option<opentelemetry_sdk::trace::Span>);

impl CheckSpan {
    /// No span: traces are off.
    pub(crate) fn off() -> CheckSpan {
        CheckSpan(None)
    }

    /// Records what `domain`'s check came to and ends the span: the matched rules, the
    /// decision, who decided and the time spent asking the store; or the error.
    pub(crate) fn end(self, domain: &str, decided: Result<&Decided, &DecideError>) {
        let Some(mut span) = self.0 else {
            return;
        };
        span.set_attribute(KeyValue::new("sluicegate.domain", domain.to_owned()));
        match decided {
            Ok(decided) => {
                let rules: Vec<StringValue> = decided
                    .descriptors
                    .iter()
                    .filter_map(|d| d.path.clone().map(StringValue::from))
                    .collect();
                let decision = if decided.allowed() {
                    "allowed"
                } else {
                    "over_limit"
                };
                let decided_by = decided
                    .outcome
                    .as_ref()
                    .map_or("none", |o| o.decided_by.name());
                // In µs with the fraction kept: a memory store decides in well under one.
                let store_us = decided.store_time.as_secs_f64() * 1e6;
                span.set_attributes([
                    KeyValue::new("sluicegate.rules", Value::Array(rules.into())),
                    KeyValue::new("sluicegate.decision", decision),
                    KeyValue::new("sluicegate.decided_by", decided_by),
                    KeyValue::new("sluicegate.store_time_us", store_us),
                ]);
            }
            Err(DecideError::Invalid(message) | DecideError::UnknownDomain(message)) => {
                span.set_status(Status::error(message.clone()));
            }
            Err(DecideError::Store(e)) => span.set_status(Status::error(e.to_string())),
            Err(DecideError::RequestIdConflict(conflict)) => {
                span.set_status(Status::error(conflict.to_string()))
            }
            Err(DecideError::NoConfiguration) => {
                span.set_status(Status::error(DecideError::NO_CONFIGURATION))
            }
        }
        span.end();
    }
}

/// Request headers as the propagator reads them.
struct Headers<'h>(&'h HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
