//! `GET /v1/top`: per rule, the request descriptors refused most over the current and the
//! previous counting period (a minute each), from the service's bounded sketches.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::offenders::{DEFAULT_TOP_KEYS, Offender};
use crate::service::Service;

/// The keys one answer lists per rule unless `n` says.
const DEFAULT_N: usize = 10;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TopQuery {
    /// A configuration path (`domain.key_value.key`); every limited rule when absent.
    rule: Option<String>,
    /// How many keys per rule, 1 to the sketch's size.
    n: Option<usize>,
}

#[derive(Serialize)]
pub(super) struct RuleTop {
    rule: String,
    /// When the span the counts cover began, µs since the Unix epoch.
    since_us: u64,
    offenders: Vec<Offender>,
}

pub(super) async fn top(
    State(service): State<Arc<Service>>,
    query: Result<Query<TopQuery>, QueryRejection>,
) -> Result<axum::Json<Vec<RuleTop>>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let n = query.n.unwrap_or(DEFAULT_N);
    if !(1..=DEFAULT_TOP_KEYS).contains(&n) {
        return Err(ApiError::bad_request(format!(
            "n: {n} asked, 1 to {DEFAULT_TOP_KEYS} allowed (the sketch holds {DEFAULT_TOP_KEYS} keys per rule)"
        )));
    }
    let live = service.live();
    let now = service.now_micros();
    let report = |(rule, tracker): (&String, &Arc<crate::offenders::RuleOffenders>)| {
        let (offenders, since_us) = tracker.top(n, now);
        RuleTop {
            rule: rule.clone(),
            since_us,
            offenders,
        }
    };
    let mut answer: Vec<RuleTop> = match &query.rule {
        Some(rule) => {
            let tracker = live.offenders.get_key_value(rule).ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("rule: no limited rule at path {rule:?} (GET /v1/rules lists them)"),
                )
            })?;
            vec![report(tracker)]
        }
        None => live
            .offenders
            .iter()
            .map(report)
            .filter(|r| !r.offenders.is_empty())
            .collect(),
    };
    answer.sort_by(|a, b| a.rule.cmp(&b.rule));
    Ok(axum::Json(answer))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::super::tests::{post, test_app, user_check};

    async fn get(app: &axum::Router, uri: &str) -> (StatusCode, serde_json::Value) {
        let request = Request::get(uri).body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn top_lists_the_keys_refused_most_and_counts_only_refusals() {
        let app = test_app();
        // shop.user admits 2 per 10 s: ann is refused 3 times, bob once, cy never.
        for (user, checks) in [("ann", 5), ("bob", 3), ("cy", 2)] {
            for _ in 0..checks {
                post(&app, &user_check(user, 1)).await;
            }
        }
        let (status, top) = get(&app, "/v1/top?rule=shop.user&n=5").await;
        assert_eq!(status, StatusCode::OK);
        let listed: Vec<(String, u64)> = top[0]["offenders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["descriptor"].as_str().unwrap().to_owned(),
                    o["refused"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(listed, [("user=ann".into(), 3), ("user=bob".into(), 1)]);
        assert_eq!(top[0]["offenders"][0]["error"], 0);
        // Without a rule: every rule that refused anything, and only those.
        let (_, all) = get(&app, "/v1/top?n=1").await;
        assert_eq!(all.as_array().unwrap().len(), 1);
        assert_eq!(all[0]["rule"], "shop.user");
        assert_eq!(all[0]["offenders"].as_array().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn top_says_what_is_wrong_with_a_query() {
        let app = test_app();
        let (status, body) = get(&app, "/v1/top?rule=shop.nothing").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body["error"].as_str().unwrap().contains("shop.nothing"));
        for bad in [
            "/v1/top?n=0",
            "/v1/top?n=1000",
            "/v1/top?n=x",
            "/v1/top?limit=3",
        ] {
            let (status, body) = get(&app, bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(body["error"].is_string(), "{bad}: {body}");
        }
    }
}
