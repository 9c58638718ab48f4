//! An xDS push's `RateLimitConfig` resources into a [`Config`], through the very reader
//! that loads files: each resource is written out as the descriptor document it stands
//! for (JSON, which the YAML reader reads) and parsed as a file's text is, so a push is
//! refused for exactly what a file is refused for. envoyproxy/ratelimit does the same
//! (`src/config/config_xds.go` turns the message into its YAML structure, then loads that).
//!
//! The messages are envoy-types' `ratelimit.config.ratelimit.v3`, generated from
//! envoyproxy/ratelimit's `api/ratelimit/config/ratelimit/v3/rls_conf.proto` (the same
//! fields, numbers and enum values as at envoyproxy/ratelimit@f2fb157): no proto of our
//! own to vendor, and no code generation in the build.

use std::path::PathBuf;

use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::{Message as _, Name as _};
use serde_json::{Map, json};

use crate::config::{Config, ConfigError, LoadOptions};

/// The type of every resource this client asks for.
pub(crate) fn type_url() -> String {
    RateLimitConfig::type_url()
}

/// Every resource of one push, validated whole: one configuration, or why none.
pub(crate) fn config_of(resources: &[Any], options: LoadOptions) -> Result<Config, String> {
    // The message is bounded by --config-xds-max-message-bytes before it is decoded; a
    // push is a configuration, bounded as files are too.
    let bytes: usize = resources.iter().map(|any| any.value.len()).sum();
    if bytes > options.max_bytes {
        return Err(format!(
            "the push's resources hold {bytes} bytes, more than --max-config-bytes ({}) \
             allows a configuration; raise --max-config-bytes (SLUICEGATE_MAX_CONFIG_BYTES) \
             to take one this large",
            options.max_bytes
        ));
    }
    Config::combine(
        resources.iter().enumerate().map(|(i, any)| {
            let resource = decode(i, any)?;
            let source = source_name(i, &resource);
            // Pretty, so that an error's line and snippet point at one field.
            let text = serde_json::to_string_pretty(&document(&resource))
                .expect("a JSON value always serializes");
            Ok((source.clone(), Config::parse(&source, &text, options)?))
        }),
        options,
    )
    .map_err(|e| e.to_string())
}

/// The `i`-th resource as a `RateLimitConfig`.
fn decode(i: usize, any: &Any) -> Result<RateLimitConfig, ConfigError> {
    let refuse =
        |message: String| ConfigError::new(PathBuf::from(format!("xDS resource #{i}")), message);
    if any.type_url != type_url() {
        return Err(refuse(format!(
            "type {:?}: expected {}",
            any.type_url,
            type_url()
        )));
    }
    RateLimitConfig::decode(any.value.as_slice())
        .map_err(|e| refuse(format!("not a RateLimitConfig: {e}")))
}

/// What errors about a resource call it: its name, else its domain, else its place.
fn source_name(i: usize, resource: &RateLimitConfig) -> PathBuf {
    let name = [&resource.name, &resource.domain]
        .into_iter()
        .find(|n| !n.is_empty());
    PathBuf::from(match name {
        Some(name) => format!("xDS resource {name:?}"),
        None => format!("xDS resource #{i}"),
    })
}

/// The descriptor document a resource stands for. Its `name` only names it (as a file's
/// name does), so it is not part of the document.
fn document(resource: &RateLimitConfig) -> serde_json::Value {
    json!({
        "domain": resource.domain,
        "descriptors": descriptors(&resource.descriptors),
    })
}

fn descriptors(list: &[RateLimitDescriptor]) -> serde_json::Value {
    list.iter()
        .map(|d| {
            let mut fields = Map::new();
            fields.insert("key".into(), json!(d.key));
            fields.insert("value".into(), json!(d.value));
            fields.insert(
                "rate_limit".into(),
                d.rate_limit
                    .as_ref()
                    .map_or(serde_json::Value::Null, policy),
            );
            fields.insert("descriptors".into(), descriptors(&d.descriptors));
            fields.insert("shadow_mode".into(), json!(d.shadow_mode));
            fields.insert("detailed_metric".into(), json!(d.detailed_metric));
            fields.insert("quota_mode".into(), json!(d.quota_mode));
            if let Some(metadata) = &d.metadata {
                fields.insert("metadata".into(), structure(metadata));
            }
            serde_json::Value::Object(fields)
        })
        .collect()
}

/// A policy as envoyproxy/ratelimit writes it out: every field, the unit by its name in
/// the enum (`UNKNOWN` for none, which only an unlimited policy may have).
fn policy(p: &RateLimitPolicy) -> serde_json::Value {
    let unit = RateLimitUnit::try_from(p.unit)
        .map(|u| u.as_str_name().to_owned())
        .unwrap_or_else(|_| p.unit.to_string());
    let replaces: Vec<serde_json::Value> = p
        .replaces
        .iter()
        .map(|r| json!({ "name": r.name }))
        .collect();
    json!({
        "requests_per_unit": p.requests_per_unit,
        "unit": unit,
        "unlimited": p.unlimited,
        "name": p.name,
        "replaces": replaces,
    })
}

/// A `google.protobuf.Struct` as the JSON object it maps to.
fn structure(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

#[cfg(test)]
#[path = "resource_tests.rs"]
mod tests;
