//! Usage-based limits fed odd input through Envoy's `/json` endpoint (the gRPC mapping's
//! twin, docs/SPEC.md "Envoy compatibility: Modes"): descriptors that share a key, a bad
//! part of a mixed request, and what an unset or explicit `hits_addend` means.

use crate::server;

use serde_json::{Value, json};
use server::Server;

/// `model`: 1000 tokens a day, a usage rule; `route`: 100 requests a day. Per day, so
/// that no window boundary falls inside a test but once a day.
const CONFIG: &str = "domain: llm
descriptors:
  - key: model
    rate_limit:
      unit: day
      requests_per_unit: 1000
      usage: true
  - key: route
    rate_limit:
      unit: day
      requests_per_unit: 100
";

fn start(test: &str) -> Server {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-usage-input-{test}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    Server::start(&["--config", path.to_str().unwrap()])
}

/// A descriptor of `entries` (`key=value,…`), with `hitsAddend` when `hits` is a value.
fn descriptor(entries: &str, hits: Value) -> Value {
    let entries: Vec<Value> = entries
        .split(',')
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap();
            json!({"key": key, "value": value})
        })
        .collect();
    let mut d = json!({ "entries": entries });
    if !hits.is_null() {
        d["hitsAddend"] = hits;
    }
    d
}

/// The status and answer of a `/json` call of `descriptors`.
fn call(server: &Server, descriptors: &[(&str, Value)]) -> (u16, Value) {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(entries, hits)| descriptor(entries, hits.clone()))
        .collect();
    let body = json!({"domain": "llm", "descriptors": descriptors});
    let (status, text) = server.request("POST", "/json", &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

/// What `entries` has left: a peek (hits 0) answers as one unit, so one more than it
/// leaves when allowed.
fn free(server: &Server, entries: &str) -> u64 {
    let (status, answer) = call(server, &[(entries, json!(0))]);
    let remaining = answer["statuses"][0]["limitRemaining"]
        .as_u64()
        .unwrap_or(0);
    remaining + u64::from(status == 200)
}

/// Two reports of one key in one call both happened: they add up, as the usage metric
/// counts them. Two settles of one key under one id are ambiguous: refused, nothing
/// recorded.
#[test]
fn reports_of_one_key_add_up_and_two_settles_of_it_are_refused() {
    let server = start("sum");
    let (status, answer) = call(
        &server,
        &[
            ("model=m1,request_id=a", json!(300)),
            ("model=m1,request_id=a", json!(200)),
        ],
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(free(&server, "model=m1"), 500);
    assert_eq!(
        server.metric(r#"sluicegate_usage_units_total{domain="llm",mode="report"}"#),
        500
    );
    let (status, answer) = call(
        &server,
        &[
            ("model=m1,request_id=s,usage=settle", json!(10)),
            ("model=m1,request_id=s,usage=settle", json!(20)),
        ],
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer
            .to_string()
            .contains("descriptors[1]: settles the key"),
        "{answer}"
    );
    assert_eq!(free(&server, "model=m1"), 500);
}

/// A request whose usage part is bad input is refused whole, before any of it counts.
#[test]
fn a_bad_part_of_a_mixed_request_changes_nothing() {
    let server = start("mixed");
    let long_id = format!("model=m2,request_id={}", "x".repeat(300));
    let huge_hits = json!(u64::MAX);
    for (bad, hits, wanted) in [
        (
            long_id.as_str(),
            json!(5),
            "descriptors[1]: request id must be 1 to 256 bytes",
        ),
        ("model=m2,request_id=a", huge_hits, "descriptors[1]: cost"),
    ] {
        let (status, answer) = call(&server, &[("route=r1", json!(1)), (bad, hits)]);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(free(&server, "route=r1"), 100, "{wanted}");
        assert_eq!(free(&server, "model=m2"), 1000, "{wanted}");
        assert!(answer.to_string().contains(wanted), "{answer}");
    }
}

/// Two reports of one key add up: each below 2^53 but their sum not is refused before
/// any of the request counts, naming both.
#[test]
fn reports_of_one_key_that_add_up_past_2_53_change_nothing() {
    let server = start("summed");
    let half = json!(1u64 << 52);
    let (status, answer) = call(
        &server,
        &[
            ("route=r1", json!(1)),
            ("model=m9,request_id=a", half.clone()),
            ("model=m9,request_id=a", half),
        ],
    );
    assert_eq!(status, 400, "{answer}");
    assert_eq!(free(&server, "route=r1"), 100, "{answer}");
    assert_eq!(free(&server, "model=m9"), 1000);
    assert!(
        answer
            .to_string()
            .contains("descriptors[1], descriptors[2] count on one key"),
        "{answer}"
    );
}

/// On a usage rule only a descriptor's own `hits_addend` above 0 is a report (Envoy's
/// stream-done call): hits left unset, or set on the request alone, are a check of the
/// request's hits, refused once the key is spent; an explicit 0 is a check of nothing.
#[test]
fn only_a_descriptors_own_hits_are_a_report() {
    let server = start("hits");
    let (status, _) = call(&server, &[("model=m6,request_id=a", json!(1000))]);
    assert_eq!(status, 200, "the report spends the key");
    let (status, answer) = call(&server, &[("model=m6,request_id=b", Value::Null)]);
    assert_eq!(status, 429, "unset hits: a check of 1, refused: {answer}");
    assert_eq!(call(&server, &[("model=m6", json!(0))]).0, 429);

    let body = json!({"domain": "llm", "hitsAddend": 5,
        "descriptors": [{"entries": [{"key": "model", "value": "m7"}]}]});
    let (status, text) = server.request("POST", "/json", &body.to_string());
    assert_eq!(status, 200, "{text}");
    assert_eq!(free(&server, "model=m7"), 995, "a check of the request's 5");
    let (status, _) = call(&server, &[("model=m7,request_id=c", json!(995))]);
    assert_eq!(status, 200, "a report of 995 spends it");
    let (status, text) = server.request("POST", "/json", &body.to_string());
    assert_eq!(status, 429, "the request's hits are a check: {text}");
}

/// A descriptor that would reach a usage rule but puts its `request_id` or `usage`
/// entries wrong is bad input naming the entry, and records nothing; on a rule that is no
/// usage rule those names are part of the key as ever.
#[test]
fn misplaced_or_doubled_usage_entries_are_invalid() {
    let server = start("shape");
    for (entries, wanted) in [
        (
            "model=m4,request_id=a,request_id=b",
            "descriptors[0].entries[2]: a second request_id entry",
        ),
        (
            "model=m4,usage=report,request_id=a,usage=check",
            "descriptors[0].entries[3]: a second usage entry",
        ),
        (
            "request_id=a,model=m4",
            "descriptors[0].entries[0]: the request_id entry must come after",
        ),
        (
            "usage=report,model=m4,request_id=a",
            "descriptors[0].entries[0]: the usage entry must come after",
        ),
    ] {
        let (status, answer) = call(&server, &[(entries, json!(50))]);
        assert_eq!(status, 400, "{entries}: {answer}");
        assert!(answer.to_string().contains(wanted), "{answer}");
    }
    assert_eq!(free(&server, "model=m4"), 1000);
    // `route` is no usage rule: these are keys it has no rule for, unlimited as before.
    for entries in [
        "request_id=a,route=r",
        "route=r,usage=x,request_id=a,usage=y",
    ] {
        let (status, answer) = call(&server, &[(entries, json!(5))]);
        assert_eq!(status, 200, "{entries}: {answer}");
    }
}

/// proto3's JSON mapping reads null as unset: a descriptor's `"hitsAddend": null` is a
/// check of the request's hits (1), as if it were left out, and so is the request's.
#[test]
fn json_takes_null_hits_as_unset() {
    let server = start("null");
    let body = json!({"domain": "llm", "hitsAddend": null, "descriptors": [
        {"entries": [{"key": "model", "value": "m10"}], "hitsAddend": null}]});
    let (status, text) = server.request("POST", "/json", &body.to_string());
    assert_eq!(status, 200, "{text}");
    assert_eq!(free(&server, "model=m10"), 999, "a check of 1");
}

/// proto3's JSON mapping writes uint64 (a descriptor's `hitsAddend`) as a string, as Go's
/// protojson does: `/json` takes it as it takes the number.
#[test]
fn json_takes_uint64_hits_as_a_string() {
    let server = start("strings");
    let (status, answer) = call(&server, &[("model=m8,request_id=a", json!("300"))]);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(free(&server, "model=m8"), 700);
    let (status, answer) = call(&server, &[("model=m8,request_id=b", json!("many"))]);
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer
            .to_string()
            .contains("\\\"many\\\" is not an unsigned integer"),
        "{answer}"
    );
}
