//! The rate-limit messages in proto3's JSON mapping, as envoyproxy/ratelimit's `/json`
//! endpoint reads and writes them: camelCase names, enums by name, durations as `"1.5s"`,
//! fields at their default value left out.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt64Value};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonRequest {
    domain: String,
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, deserialize_with = "proto_uint")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonDescriptor {
    entries: Vec<JsonEntry>,
    limit: Option<JsonLimit>,
    #[serde(default, deserialize_with = "optional_proto_uint")]
    hits_addend: Option<u64>,
}

/// A `RateLimitOverride`: proto3's JSON mapping writes the unit by name or by number.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonLimit {
    #[serde(default, deserialize_with = "proto_uint")]
    requests_per_unit: u32,
    #[serde(default)]
    unit: JsonUnit,
}

/// An unsigned integer as proto3's JSON mapping writes it: a number, or a string of
/// decimal digits (how uint64 and UInt64Value are written, by Go's protojson among
/// others; parsers take either for every integer type).
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUint {
    Number(u64),
    Text(String),
}

/// A field's integer, its default (0) when null: proto3's JSON mapping reads null as unset.
fn proto_uint<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + Default,
{
    optional_proto_uint(deserializer).map(Option::unwrap_or_default)
}

/// A field's integer, `None` when null (unset, as when it is left out).
fn optional_proto_uint<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let number = match Option::<JsonUint>::deserialize(deserializer)? {
        None => return Ok(None),
        Some(JsonUint::Number(n)) => n,
        Some(JsonUint::Text(text)) => text.parse().map_err(|_| {
            serde::de::Error::custom(format!("{text:?} is not an unsigned integer"))
        })?,
    };
    T::try_from(number)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("{number} is out of range")))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUnit {
    Number(i32),
    Name(String),
}

impl Default for JsonUnit {
    fn default() -> Self {
        JsonUnit::Number(0)
    }
}

impl JsonUnit {
    /// The unit's number; a name that is none is left to the mapping to refuse (-1).
    fn number(&self) -> i32 {
        match self {
            JsonUnit::Number(n) => *n,
            JsonUnit::Name(name) => RateLimitUnit::from_str_name(name).map_or(-1, i32::from),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

/// A `RateLimitRequest` from its JSON form; the error says what is malformed.
pub(crate) fn request(body: &[u8]) -> Result<RateLimitRequest, serde_json::Error> {
    let request: JsonRequest = serde_json::from_slice(body)?;
    Ok(RateLimitRequest {
        domain: request.domain,
        descriptors: request
            .descriptors
            .into_iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit: d.limit.map(|l| RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.number(),
                }),
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: request.hits_addend,
    })
}

/// A `RateLimitResponse` in its JSON form.
pub(crate) fn response(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        code_name(response.overall_code).into(),
    );
    let statuses: Vec<Value> = response.statuses.iter().map(status).collect();
    out.insert("statuses".into(), statuses.into());
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), headers.into());
    }
    out.into()
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

fn status(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), code_name(status.code).into());
    if let Some(limit) = &status.current_limit {
        let mut current = Map::new();
        if !limit.name.is_empty() {
            current.insert("name".into(), limit.name.clone().into());
        }
        if limit.requests_per_unit != 0 {
            current.insert("requestsPerUnit".into(), limit.requests_per_unit.into());
        }
        let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
        if unit != Unit::Unknown {
            current.insert("unit".into(), unit.as_str_name().into());
        }
        out.insert("currentLimit".into(), current.into());
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), status.limit_remaining.into());
    }
    if let Some(reset) = &status.duration_until_reset {
        out.insert("durationUntilReset".into(), duration(reset).into());
    }
    out.into()
}

/// proto3's JSON form of a Duration: seconds, with 3, 6 or 9 fractional digits when
/// there is a fraction.
fn duration(d: &ProtoDuration) -> String {
    let nanos = d.nanos.unsigned_abs();
    if nanos == 0 {
        format!("{}s", d.seconds)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}.{:03}s", d.seconds, nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}.{:06}s", d.seconds, nanos / 1_000)
    } else {
        format!("{}.{nanos:09}s", d.seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_fewest_of_3_6_or_9_digits() {
        let d = |seconds, nanos| duration(&ProtoDuration { seconds, nanos });
        assert_eq!(d(10, 0), "10s");
        assert_eq!(d(1, 500_000_000), "1.500s");
        assert_eq!(d(0, 250_000), "0.000250s");
        assert_eq!(d(0, 7), "0.000000007s");
    }

    #[test]
    fn defaults_are_left_out_and_enums_named() {
        let value = status(&DescriptorStatus {
            code: Code::OverLimit.into(),
            ..DescriptorStatus::default()
        });
        assert_eq!(value, json!({"code": "OVER_LIMIT"}));
    }

    #[test]
    fn per_descriptor_hits_and_overrides_survive_the_mapping() {
        let body = br#"{"domain":"d","hitsAddend":2,"descriptors":[
            {"entries":[{"key":"k","value":"v"}],"hitsAddend":3,"limit":{"requestsPerUnit":1,"unit":"DAY"}},
            {"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":7,"unit":2}}]}"#;
        let request = request(body).unwrap();
        assert_eq!(request.hits_addend, 2);
        assert_eq!(
            request.descriptors[0].hits_addend,
            Some(UInt64Value { value: 3 })
        );
        let limits: Vec<Option<RateLimitOverride>> =
            request.descriptors.iter().map(|d| d.limit).collect();
        let limit = |requests_per_unit, unit: RateLimitUnit| {
            Some(RateLimitOverride {
                requests_per_unit,
                unit: unit.into(),
            })
        };
        assert_eq!(
            limits,
            [
                limit(1, RateLimitUnit::Day),
                limit(7, RateLimitUnit::Minute)
            ]
        );
        assert!(super::request(br#"{"domain":"d","descriptors":[],"extra":1}"#).is_err());
    }

    #[test]
    fn integers_may_be_strings_as_proto3_json_writes_uint64() {
        let body = br#"{"domain":"d","hitsAddend":"2","descriptors":[
            {"entries":[{"key":"k","value":"v"}],"hitsAddend":"18446744073709551615",
             "limit":{"requestsPerUnit":"7","unit":"DAY"}}]}"#;
        let request = request(body).unwrap();
        assert_eq!(request.hits_addend, 2);
        let d = &request.descriptors[0];
        assert_eq!(d.hits_addend, Some(UInt64Value { value: u64::MAX }));
        assert_eq!(d.limit.map(|l| l.requests_per_unit), Some(7));
        for bad in [
            r#"{"domain":"d","hitsAddend":"-1","descriptors":[]}"#,
            r#"{"domain":"d","hitsAddend":"4294967296","descriptors":[]}"#,
            r#"{"domain":"d","hitsAddend":" 5","descriptors":[]}"#,
        ] {
            assert!(super::request(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
