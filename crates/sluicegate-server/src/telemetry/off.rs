//! A build without the `otel` feature: no exporter and no span. Asked for traces, it
//! refuses to start rather than serve without them.

use std::borrow::Cow;

use axum::http::HeaderMap;

use super::options::OtlpOptions;
use crate::service::{DecideError, Decided};

/// Traces go nowhere: this build cannot export them. Made with `default()`, as the
/// exporting build's is when traces are off.
#[derive(Clone, Debug, Default)]
pub(crate) struct Telemetry {}

impl Telemetry {
    /// Refuses: `--otlp-endpoint` asks for traces this build has no exporter for.
    pub(crate) fn otlp(options: &OtlpOptions) -> anyhow::Result<Telemetry> {
        anyhow::bail!(
            "--otlp-endpoint {}: this sluicegate was built without the `otel` feature, so \
             it cannot export traces (build it with `--features otel`, on by default)",
            options.endpoint
        )
    }

    /// Never: no spans are exported.
    pub(crate) fn is_on(&self) -> bool {
        false
    }

    /// No span.
    pub(crate) fn check_span(
        &self,
        _name: impl Into<Cow<'static, str>>,
        _headers: &HeaderMap,
    ) -> CheckSpan {
        CheckSpan
    }

    /// Nothing to send.
    pub(crate) async fn shutdown(&self) {}
}

/// No span.
pub(crate) struct CheckSpan;

impl CheckSpan {
    /// No span.
    pub(crate) fn off() -> CheckSpan {
        CheckSpan
    }

    /// Nothing to record.
    pub(crate) fn end(self, _domain: &str, _decided: Result<&Decided, &DecideError>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::options::OtlpProtocol;

    /// Traces asked of a build that cannot export them stop the start, naming the flag
    /// and the feature, rather than serving without them.
    #[test]
    fn an_otlp_endpoint_is_refused_without_the_feature() {
        let options = OtlpOptions {
            endpoint: "http://127.0.0.1:4317".to_owned(),
            protocol: OtlpProtocol::Grpc,
            service_name: "sluicegate".to_owned(),
            service_namespace: None,
            service_instance_id: None,
            sampling_ratio: 1.0,
        };
        let refused = Telemetry::otlp(&options).unwrap_err().to_string();
        assert!(refused.contains("--otlp-endpoint"), "{refused}");
        assert!(refused.contains("`otel` feature"), "{refused}");
    }
}
