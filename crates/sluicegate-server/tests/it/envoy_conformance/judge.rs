//! One step of a case through tonic and Envoy's generated stubs: the request it sends and
//! whether the answer is the one expected (`tests/it/python/envoy_conformance.py` judges
//! the same way from Python).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

use super::cases::{self, Descriptor, Expect, Mode, Step};

/// The request of `step` at iteration `i`.
pub(crate) fn request(step: &Step, i: u32) -> RateLimitRequest {
    let descriptors = step
        .request
        .descriptors
        .iter()
        .map(|descriptor| {
            let entries = descriptor
                .entries()
                .iter()
                .map(|(key, value)| Entry {
                    key: key.clone(),
                    value: value.replace("{i}", &i.to_string()),
                })
                .collect();
            let (hits_addend, limit) = match descriptor {
                Descriptor::Entries(_) => (None, None),
                Descriptor::Full {
                    hits_addend, limit, ..
                } => (
                    hits_addend.map(|value| UInt64Value { value }),
                    limit.as_ref().map(|l| RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: unit(&l.unit) as i32,
                    }),
                ),
            };
            RateLimitDescriptor {
                entries,
                limit,
                hits_addend,
                ..RateLimitDescriptor::default()
            }
        })
        .collect();
    RateLimitRequest {
        domain: step.request.domain.clone(),
        descriptors,
        hits_addend: step.request.hits_addend,
    }
}

fn unit(name: &str) -> Unit {
    Unit::from_str_name(name).unwrap_or_else(|| panic!("no unit {name}"))
}

fn code_name(code: i32) -> String {
    Code::try_from(code).map_or_else(|_| code.to_string(), |c| c.as_str_name().to_owned())
}

fn unit_name(unit: i32) -> String {
    Unit::try_from(unit).map_or_else(|_| unit.to_string(), |u| u.as_str_name().to_owned())
}

/// `Ok` when the answer to `step`'s request at iteration `i` is the one expected, or the
/// first difference.
pub(crate) fn judge(
    step: &Step,
    i: u32,
    mode: Mode,
    answer: Result<RateLimitResponse, tonic::Status>,
) -> Result<(), String> {
    match (&step.expect, answer) {
        (Expect::Error { grpc_error }, Err(status)) => {
            // tonic's names are CamelCase, the case files use the proto's.
            let got = format!("{:?}", status.code());
            if got.to_lowercase() == grpc_error.replace('_', "").to_lowercase() {
                Ok(())
            } else {
                Err(format!(
                    "gRPC {got} ({}), want {grpc_error}",
                    status.message()
                ))
            }
        }
        (Expect::Error { grpc_error }, Ok(response)) => Err(format!(
            "answered {}, want gRPC {grpc_error}",
            code_name(response.overall_code)
        )),
        (Expect::Answer { .. }, Err(status)) => {
            Err(format!("gRPC {:?}: {}", status.code(), status.message()))
        }
        (
            Expect::Answer {
                overall_code,
                statuses,
                response_headers,
            },
            Ok(response),
        ) => {
            // Every difference of the answer, not only the first: what a fix must cover.
            let mut differences = Vec::new();
            let got = code_name(response.overall_code);
            if &got != overall_code {
                differences.push(format!("overall_code {got}, want {overall_code}"));
            }
            if let Some(statuses) = statuses {
                check_statuses(statuses, &response.statuses, i, mode, &mut differences);
            }
            differences.extend(check_headers(response_headers, &response).err());
            if differences.is_empty() {
                Ok(())
            } else {
                Err(differences.join("; "))
            }
        }
    }
}

fn check_statuses(
    want: &[cases::Status],
    got: &[DescriptorStatus],
    i: u32,
    mode: Mode,
    differences: &mut Vec<String>,
) {
    if want.len() != got.len() {
        differences.push(format!("{} statuses, want {}", got.len(), want.len()));
        return;
    }
    for (n, (want, got)) in want.iter().zip(got).enumerate() {
        let at = |what: &str| format!("statuses[{n}].{what}");
        let code = code_name(got.code);
        if code != want.code {
            differences.push(format!("{} {code}, want {}", at("code"), want.code));
        }
        let shown =
            |l: &RateLimit| format!("{:?} {}/{}", l.name, l.requests_per_unit, unit_name(l.unit));
        let wanted = |l: &cases::Limit| format!("{:?} {}/{}", l.name, l.requests_per_unit, l.unit);
        match (&want.current_limit, &got.current_limit) {
            (None, None) => {}
            (None, Some(g)) => {
                differences.push(format!("{} {}, want none", at("current_limit"), shown(g)));
            }
            (Some(w), None) => {
                differences.push(format!("{} none, want {}", at("current_limit"), wanted(w)));
            }
            (Some(w), Some(g)) => {
                if shown(g) != wanted(w) {
                    differences.push(format!(
                        "{} {}, want {}",
                        at("current_limit"),
                        shown(g),
                        wanted(w)
                    ));
                }
            }
        }
        let remaining = want.limit_remaining.at(i);
        if i64::from(got.limit_remaining) != remaining {
            differences.push(format!(
                "{} {}, want {remaining}",
                at("limit_remaining"),
                got.limit_remaining
            ));
        }
        if let Err(e) = check_reset(got, mode) {
            differences.push(format!("{}: {e}", at("duration_until_reset")));
        }
    }
}

/// A limited status says when its window resets: within one unit, in whole seconds in
/// envoy's mode (as envoyproxy/ratelimit@f2fb157 src/utils/utilities.go:41-45
/// `CalculateReset`); a status without a limit says nothing.
fn check_reset(got: &DescriptorStatus, mode: Mode) -> Result<(), String> {
    let Some(limit) = &got.current_limit else {
        return match &got.duration_until_reset {
            None => Ok(()),
            Some(d) => Err(format!("{d:?} on a status without a limit")),
        };
    };
    let Some(reset) = &got.duration_until_reset else {
        return Err("absent on a limited status".into());
    };
    if reset.seconds < 0 || reset.nanos < 0 {
        return Err(format!("negative: {reset:?}"));
    }
    if let Some(unit) = cases::unit_seconds(&unit_name(limit.unit)) {
        let micros = reset.seconds as u64 * 1_000_000 + reset.nanos as u64 / 1000;
        if micros > unit * 1_000_000 {
            return Err(format!("{reset:?} exceeds the unit, {unit} s"));
        }
    }
    // envoy's CalculateReset: the unit less the time into it, whole seconds, never 0.
    if mode == Mode::Envoy && (reset.nanos != 0 || reset.seconds == 0) {
        return Err(format!("{reset:?}, envoy sends whole seconds, at least 1"));
    }
    Ok(())
}

fn check_headers(want: &[cases::Header], response: &RateLimitResponse) -> Result<(), String> {
    let got: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    let fits = |w: &cases::Header, (key, value): (&str, &str)| {
        key.eq_ignore_ascii_case(&w.key)
            && w.value.as_deref().is_none_or(|v| v == value)
            && w.between
                .is_none_or(|(lo, hi)| value.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n)))
    };
    let all_fit = want.len() == got.len()
        && want
            .iter()
            .all(|w| got.iter().filter(|g| fits(w, **g)).count() == 1);
    if all_fit {
        Ok(())
    } else {
        let want: Vec<String> = want
            .iter()
            .map(|w| match (&w.value, w.between) {
                (Some(v), _) => format!("{}: {v}", w.key),
                (None, Some((lo, hi))) => format!("{}: {lo}..={hi}", w.key),
                (None, None) => w.key.clone(),
            })
            .collect();
        Err(format!("response_headers_to_add {got:?}, want {want:?}"))
    }
}
