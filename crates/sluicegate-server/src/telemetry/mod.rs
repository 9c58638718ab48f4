//! OpenTelemetry traces (`--otlp-*`): one span per check, exported to an OTLP collector,
//! behind the `otel` cargo feature (on by default). A build without it has the same
//! flags, and a start that asks for traces stops, naming the flag and the feature.
//!
//! The front ends call [`Telemetry::check_span`] at the edge, with the request's headers
//! (gRPC metadata are headers too), and [`CheckSpan::end`] with what the service decided;
//! the decision code itself never sees a span.

#[cfg(not(feature = "otel"))]
mod off;
mod options;
#[cfg(feature = "otel")]
mod otlp;

#[cfg(not(feature = "otel"))]
pub(crate) use off::{CheckSpan, Telemetry};
pub use options::{OtlpOptions, OtlpProtocol};
#[cfg(feature = "otel")]
pub(crate) use otlp::{CheckSpan, Telemetry};
