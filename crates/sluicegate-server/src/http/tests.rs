//! The HTTP API through its router: decisions, bad input, metrics, reset, shadow mode.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use sluicegate::{AnyStore, Limiter};

use super::app;
use crate::config::Config;
use crate::service::{Service, ServiceOptions};
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use std::path::Path;
use tower::ServiceExt;

const CONFIG: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {window: 10s, requests_per_unit: 2}
  - key: route
    value: free
    rate_limit: {unlimited: true}
  - key: route
    rate_limit: {algorithm: fixed-window, unit: day, requests_per_unit: 3}
";

pub(super) fn test_app() -> Router {
    app_with(CONFIG, Some("s3cret"))
}

pub(super) async fn post(app: &Router, body: &str) -> (StatusCode, serde_json::Value) {
    let request = Request::post("/v1/check")
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

pub(super) fn user_check(user: &str, cost: u64) -> String {
    serde_json::json!({
        "domain": "shop",
        "descriptors": [{"entries": [{"key": "user", "value": user}]}],
        "cost": cost,
    })
    .to_string()
}

#[tokio::test]
async fn check_decides_and_refuses() {
    let app = test_app();
    let (status, first) = post(&app, &user_check("ann", 1)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["allowed"], true);
    assert_eq!(first["decision"]["remaining"], 1);
    assert_eq!(first["descriptors"][0]["rule"], "shop.user");
    post(&app, &user_check("ann", 1)).await;
    let (_, third) = post(&app, &user_check("ann", 1)).await;
    assert_eq!(third["allowed"], false);
    assert_eq!(third["decision"]["remaining"], 0);
    assert!(third["decision"]["retry_after_us"].as_i64().unwrap() > 0);
    // Another user has their own window; a cost above the limit can never fit.
    let (_, other) = post(&app, &user_check("bob", 3)).await;
    assert_eq!(other["decision"]["retry_after_us"], -1);
}

#[tokio::test]
async fn descriptors_are_all_or_nothing_and_unmatched_pass() {
    let app = test_app();
    let body = |route: &str| {
        serde_json::json!({
            "domain": "shop",
            "descriptors": [
                {"entries": [{"key": "user", "value": "cy"}]},
                {"entries": [{"key": "route", "value": route}]},
                {"entries": [{"key": "unknown", "value": "x"}]},
            ],
        })
        .to_string()
    };
    let (_, a) = post(&app, &body("free")).await;
    assert_eq!(a["allowed"], true);
    assert_eq!(a["descriptors"][1]["rule"], "shop.route_free");
    assert!(a["descriptors"][1].get("decision").is_none());
    assert_eq!(a["descriptors"][2]["rule"], serde_json::Value::Null);
    post(&app, &body("cart")).await;
    let (_, refused) = post(&app, &body("cart")).await;
    assert_eq!(refused["allowed"], false);
    // The user rule refused; the route rule had room and recorded nothing.
    assert_eq!(refused["descriptors"][0]["decision"]["allowed"], false);
    assert_eq!(refused["descriptors"][1]["decision"]["allowed"], true);
    assert_eq!(refused["descriptors"][1]["decision"]["remaining"], 2);
}

#[tokio::test]
async fn bad_requests_say_what_is_wrong() {
    let app = test_app();
    let cases = [
        ("{", "invalid check request"),
        ("[]", "invalid check request"),
        (r#"{"domain":"shop"}"#, "missing field `descriptors`"),
        (
            r#"{"domain":"shop","descriptors":[]}"#,
            "descriptors: at least one",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[]}]}"#,
            "descriptors[0].entries",
        ),
        (
            &format!(
                r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}}]}}"#,
                "v".repeat(64 * 1024 + 1)
            ),
            "descriptors[0].entries[0].value: 65537 bytes, at most 65536 allowed",
        ),
        (
            r#"{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#,
            "unknown domain",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"cost":-1}"#,
            "invalid check request",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"cost":9007199254740992}"#,
            "not below 2^53",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"colour":1}"#,
            "unknown field `colour`",
        ),
    ];
    for (body, says) in cases {
        let (status, json) = post(&app, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let error = json["error"].as_str().unwrap();
        assert!(error.contains(says), "{body}: {error}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// Random bytes, and every truncation of a valid body, get 200 or a 400 that says
    /// what was wrong: never a panic, never a 5xx.
    #[test]
    fn arbitrary_bodies_are_answered(
        noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        cut in 0usize..120,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let app = test_app();
        let valid = user_check("fuzz", 1);
        let truncated = &valid.as_bytes()[..cut.min(valid.len())];
        for body in [noise.as_slice(), truncated] {
            let request = Request::post("/v1/check")
                .header("content-type", "application/json")
                .body(Body::from(body.to_vec()))
                .unwrap();
            let response = runtime.block_on(app.clone().oneshot(request)).unwrap();
            let status = response.status();
            proptest::prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{}", status);
        }
    }
}

#[tokio::test]
async fn metrics_count_rules_and_who_decided() {
    let app = test_app();
    for _ in 0..3 {
        post(&app, &user_check("dee", 1)).await;
    }
    let response = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    for line in [
        "sluicegate_rule_hits_total{rule=\"shop.user\",result=\"total\"} 3",
        "sluicegate_rule_hits_total{rule=\"shop.user\",result=\"over_limit\"} 1",
        "sluicegate_decisions_total{decided_by=\"store\"} 3",
        "sluicegate_check_duration_seconds_count 3",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    let ready = app
        .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

fn app_with(config: &str, admin_token: Option<&str>) -> Router {
    let config = Config::parse(
        Path::new("test.yaml"),
        config,
        crate::config::LoadOptions::new(crate::config::DEFAULT_ALGORITHM),
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(AnyStore::Memory(Default::default())));
    let options = ServiceOptions {
        admin_token: admin_token.map(Arc::from),
        response_headers: crate::service::ResponseHeaders::Ietf,
        ..ServiceOptions::default()
    };
    from_loopback(app(
        Arc::new(Service::new(config, limiter, options)),
        crate::telemetry::Telemetry::default(),
        true,
    ))
}

/// `router` as the server runs it for a client on this host: every request carries its
/// peer's address, a loopback one.
pub(super) fn from_loopback(router: Router) -> Router {
    from_peer(router, "127.0.0.1:40000")
}

/// `router` as the server runs it for a client at `peer`.
pub(super) fn from_peer(router: Router, peer: &str) -> Router {
    let peer: std::net::SocketAddr = peer.parse().unwrap();
    router.layer(axum::Extension(axum::extract::ConnectInfo(peer)))
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": domain, "descriptors": descriptors}).to_string()
}

#[tokio::test]
async fn shadow_mode_counts_but_never_refuses() {
    let app = app_with(
        "domain: d
descriptors:
  - key: user
    value: soft
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
",
        None,
    );
    let body = request("d", &[&[("user", "soft")], &[("user", "other")]]);
    for _ in 0..3 {
        let (_, json) = post(&app, &body).await;
        assert_eq!(json["allowed"], true, "{json}");
        assert_eq!(json["descriptors"][0]["shadow_mode"], true);
    }
    // The shadow rule's own decision says it is over; the others still recorded.
    let (_, json) = post(&app, &body).await;
    assert_eq!(json["descriptors"][0]["decision"]["allowed"], false);
    assert_eq!(json["descriptors"][1]["decision"]["remaining"], 96);
}

#[tokio::test]
async fn replaced_limits_and_blocks() {
    let app = app_with(
        "domain: d
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 1, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
",
        None,
    );
    // Both descriptors match; the 10/s limit replaces the 1/s one for this request.
    let both = request(
        "d",
        &[
            &[("key_1", "value_1"), ("user", "bkthomps")],
            &[("key_2", "value_2"), ("user", "bkthomps")],
        ],
    );
    for _ in 0..3 {
        let (_, json) = post(&app, &both).await;
        assert_eq!(json["allowed"], true, "{json}");
        assert_eq!(json["descriptors"][0]["rule"], serde_json::Value::Null);
    }
    // Alone, the 1/s limit applies and was untouched by the replaced requests.
    let alone = request("d", &[&[("key_1", "value_1"), ("user", "bkthomps")]]);
    assert_eq!(post(&app, &alone).await.1["allowed"], true);
    assert_eq!(post(&app, &alone).await.1["allowed"], false);
    // A block refuses every time.
    let (_, json) = post(&app, &request("d", &[&[("remote_address", "50.0.0.5")]])).await;
    assert_eq!(json["allowed"], false);
    assert_eq!(json["descriptors"][0]["decision"]["retry_after_us"], -1);
}

async fn post_to(
    app: &Router,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::post(path).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn envoys_json_endpoint_answers_429_over_the_limit() {
    let app = test_app();
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"jo"}]}]}"#;
    let (status, json) = post_to(&app, "/json", None, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(json["statuses"][0]["limitRemaining"], 1);
    post_to(&app, "/json", None, body).await;
    let (status, json) = post_to(&app, "/json", None, body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
}

/// An unknown domain: OK with no limit through Envoy's protocol, as envoyproxy/ratelimit
/// answers; sluicegate's own `/v1/check` refuses it (see `bad_requests_say_what_is_wrong`).
#[tokio::test]
async fn envoys_json_endpoint_answers_an_unknown_domain_ok() {
    let app = test_app();
    let body = r#"{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"jo"}]},{"entries":[{"key":"a","value":"b"}]}]}"#;
    let (status, json) = post_to(&app, "/json", None, body).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["overallCode"], "OK");
    let statuses = json["statuses"].as_array().unwrap();
    assert_eq!(statuses.len(), 2);
    for status in statuses {
        assert_eq!(status["code"], "OK");
        assert!(status.get("currentLimit").is_none(), "{status}");
    }
}

#[tokio::test]
async fn reset_needs_the_admin_token_and_forgets_state() {
    let app = test_app();
    let body = user_check("kim", 2);
    assert_eq!(post(&app, &body).await.1["allowed"], true);
    assert_eq!(post(&app, &body).await.1["allowed"], false);
    for token in [None, Some("wrong")] {
        let (status, json) = post_to(&app, "/v1/reset", token, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");
    }
    let (status, json) = post_to(&app, "/v1/reset", Some("s3cret"), &body).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["reset"], serde_json::json!(["shop.user"]));
    assert_eq!(post(&app, &body).await.1["allowed"], true);
    // Without a configured token the endpoint is off.
    let off = app_with("domain: d\n", None);
    let (status, _) = post_to(&off, "/v1/reset", Some("anything"), &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn healthz_and_rules() {
    let app = test_app();
    let response = app
        .clone()
        .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = app
        .oneshot(Request::get("/v1/rules").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let rules: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let paths: Vec<&str> = rules
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["shop.route", "shop.route_free", "shop.user"]);
}

/// A token bucket's rate is its limit per window; its burst is how much one check may
/// take. Neither `/v1/rules` nor `/json` may report the burst as the rate.
#[tokio::test]
async fn a_token_buckets_rate_is_reported_apart_from_its_burst() {
    let app = app_with(
        "domain: d
descriptors:
  - key: api
    rate_limit: {algorithm: token-bucket, unit: second, requests_per_unit: 10, burst: 20}
",
        None,
    );
    let response = app
        .clone()
        .oneshot(Request::get("/v1/rules").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let rules: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(rules[0]["limit"], 10, "{rules}");
    assert_eq!(rules[0]["capacity"], 20, "{rules}");
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"api","value":"a"}]}]}"#;
    let (_, json) = post_to(&app, "/json", None, body).await;
    let limit = &json["statuses"][0]["currentLimit"];
    assert_eq!(limit["requestsPerUnit"], 10, "{json}");
    assert_eq!(limit["unit"], "SECOND", "{json}");
    // The decision itself still counts against the burst.
    assert_eq!(json["statuses"][0]["limitRemaining"], 19, "{json}");
}
