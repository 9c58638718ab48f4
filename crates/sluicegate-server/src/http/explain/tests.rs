//! `/v1/explain` through the router: a refusal explained in numbers and words, metrics
//! untouched, bad input a clear 400.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::http::tests::{post, test_app, user_check};

async fn call(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn explain(app: &Router, body: &str) -> (StatusCode, serde_json::Value) {
    let request = Request::post("/v1/explain")
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let (status, text) = call(app, request).await;
    (status, serde_json::from_str(&text).unwrap())
}

/// `/metrics`' lines, sorted (a family's labelled series come in no fixed order).
async fn metrics(app: &Router) -> Vec<String> {
    let text = call(app, Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .1;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn a_refusal_is_explained_and_nothing_is_counted() {
    let app = test_app();
    post(&app, &user_check("ann", 2)).await;
    let before = metrics(&app).await;
    let (status, said) = explain(&app, &user_check("ann", 1)).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!(said["allowed"], false, "{said}");
    assert_eq!(said["refused_by"], serde_json::json!(["shop.user"]));
    assert_eq!(said["summary"], "a cost of 1 would be refused by shop.user");
    let d = &said["descriptors"][0];
    assert_eq!(d["numbers"]["algorithm"], "sliding-log", "{said}");
    assert_eq!(d["numbers"]["limit"], 2);
    assert_eq!(
        (&d["state"]["in_use"], &d["state"]["available"]),
        (&2.into(), &0.into())
    );
    let retry = d["state"]["retry_after_us"].as_i64().unwrap();
    assert!(retry > 0 && retry <= 10_000_000, "{said}");
    let words = d["state"]["words"].as_str().unwrap();
    assert!(
        words.starts_with("2 of 2 in use, 0 available; the next unit frees in"),
        "{words}"
    );
    assert_eq!(metrics(&app).await, before, "explain counted something");
}

#[tokio::test]
async fn bad_input_is_a_clear_400() {
    let app = test_app();
    for (body, error) in [
        (
            r#"{"domain": "shop"}"#,
            "invalid explain request: missing field `descriptors`",
        ),
        (
            &user_check("ann", 1).replace("shop", "nowhere"),
            "domain: unknown domain \"nowhere\"",
        ),
        (
            r#"{"domain": "shop", "descriptors": []}"#,
            "descriptors: at least one is required",
        ),
    ] {
        let (status, said) = explain(&app, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{said}");
        assert!(said["error"].as_str().unwrap().starts_with(error), "{said}");
    }
}

/// A cost the check rejects is rejected by explain with the same words.
#[tokio::test]
async fn a_cost_the_check_rejects_is_rejected_alike() {
    let app = test_app();
    let body = user_check("ann", 1 << 53);
    let (checked, refusal) = post(&app, &body).await;
    let (explained, said) = explain(&app, &body).await;
    assert_eq!(
        (checked, explained),
        (StatusCode::BAD_REQUEST, StatusCode::BAD_REQUEST)
    );
    assert_eq!(said, refusal);
}
