//! What `--otlp-*` asks of the traces, in either build.

/// How OTLP reaches the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (a collector's port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318), POSTed to `/v1/traces`.
    Http,
}

/// Where spans go and what they say of the service.
#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// The collector: `http://host:4317` for gRPC; for HTTP its base URL
    /// (`http://host:4318`, `/v1/traces` appended) or the full traces URL.
    pub endpoint: String,
    /// gRPC or HTTP.
    pub protocol: OtlpProtocol,
    /// The resource's `service.name`.
    pub service_name: String,
    /// The resource's `service.namespace`, if any.
    pub service_namespace: Option<String>,
    /// The resource's `service.instance.id`; a random one without it.
    pub service_instance_id: Option<String>,
    /// The share (0 to 1) of traces begun here that are sampled; a span whose caller's
    /// trace context says sampled (or not) follows the caller.
    pub sampling_ratio: f64,
}
