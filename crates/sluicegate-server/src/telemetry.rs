//! OpenTelemetry traces: one span per check, exported over OTLP/gRPC when
//! `--otlp-endpoint` names a collector. Off by default, and then nothing here runs but one
//! `Option` test per check: no exporter, no thread, no span.
//!
//! The front ends call [`Telemetry::check_span`] at the edge, with the request's headers
//! (gRPC metadata are headers too), and [`CheckSpan::end`] with what the service decided;
//! the decision code itself never sees a span.

use std::borrow::Cow;
use std::time::Duration;

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span, SpanKind, Status, Tracer, TracerProvider};
use opentelemetry::{KeyValue, StringValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

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
    /// Spans batched and sent to the OTLP/gRPC collector at `endpoint`
    /// (`http://host:4317`). The batch's schedule and size follow the SDK's `OTEL_BSP_*`
    /// variables. Needs a tokio runtime: the exporter's channel runs on it.
    pub(crate) fn otlp(endpoint: &str) -> anyhow::Result<Telemetry> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint}: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name("sluicegate").build())
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
