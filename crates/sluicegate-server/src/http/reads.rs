//! Who may read what the service saw: `/v1/top`, `/v1/overview`, `/ui` and `/v1/explain`
//! show request values (user ids, addresses, keys). The debug listener serves them to
//! anyone who reaches it (an operator's port, as envoyproxy/ratelimit's). On the main
//! listener, with a read token (`--read-token-file`) they need `Authorization: Bearer
//! <token>`; without one, only loopback peers get them, so a local `serve` shows its live
//! page. Everyone else gets 403 saying where to read them.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::service::Service;

/// Answers `request` if its sender may read request values on the main listener, 403
/// otherwise. A request whose peer is unknown is no loopback peer.
pub(super) async fn guard(
    State(service): State<Arc<Service>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = match service.options().read_token.as_deref() {
        Some(token) => bearer(request.headers()).is_some_and(|presented| {
            super::admin::constant_time_eq(presented.as_bytes(), token.as_bytes())
        }),
        None => request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .is_some_and(|ConnectInfo(peer)| peer.ip().to_canonical().is_loopback()),
    };
    if allowed {
        return next.run(request).await;
    }
    let path = request.uri().path();
    let how = if service.options().read_token.is_some() {
        "send Authorization: Bearer <the token of --read-token-file>"
    } else {
        "ask from this host, or start the service with --read-token-file and send \
         Authorization: Bearer <token>"
    };
    ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "{path} shows request values: read it on the debug listener (--debug-listen), \
             or {how}"
        ),
    )
    .into_response()
}

/// The bearer token of an `Authorization` header.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use axum::Router;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use sluicegate::{AnyStore, Limiter};
    use tower::ServiceExt;

    use super::*;
    use crate::config::{Config, DEFAULT_ALGORITHM, LoadOptions};
    use crate::http::tests::from_peer;
    use crate::service::ServiceOptions;
    use crate::telemetry::Telemetry;

    const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
";

    const CHECK: &str =
        r#"{"domain": "d", "descriptors": [{"entries": [{"key": "user", "value": "ann"}]}]}"#;

    fn service(read_token: Option<&str>) -> Arc<Service> {
        let config = Config::parse(
            Path::new("r.yaml"),
            RULES,
            LoadOptions::new(DEFAULT_ALGORITHM),
        )
        .unwrap();
        let limiter = Arc::new(Limiter::new(AnyStore::Memory(Default::default())));
        let options = ServiceOptions {
            read_token: read_token.map(Arc::from),
            ..ServiceOptions::default()
        };
        Arc::new(Service::new(config, limiter, options))
    }

    fn main_listener(read_token: Option<&str>) -> Router {
        crate::http::app(service(read_token), Telemetry::default(), true)
    }

    /// The status and body of `method path` (a check's body for a POST) with `bearer`.
    async fn ask(router: &Router, method: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(token) = bearer {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = if method == "POST" { CHECK } else { "" };
        let response = router
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    const GUARDED: [(&str, &str); 4] = [
        ("GET", "/v1/top"),
        ("GET", "/v1/overview"),
        ("GET", "/ui"),
        ("POST", "/v1/explain"),
    ];

    const OPEN: [(&str, &str); 4] = [
        ("GET", "/v1/rules"),
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("POST", "/v1/check"),
    ];

    #[tokio::test]
    async fn without_a_token_only_loopback_peers_read_request_values() {
        let remote = from_peer(main_listener(None), "192.0.2.7:5000");
        for (method, path) in GUARDED {
            let (status, body) = ask(&remote, method, path, None).await;
            assert_eq!(status, 403, "{path}: {body}");
            let error: serde_json::Value = serde_json::from_str(&body).unwrap();
            let message = error["error"].as_str().unwrap();
            assert!(message.contains("--debug-listen"), "{message}");
            assert!(message.contains("--read-token-file"), "{message}");
        }
        for (method, path) in OPEN {
            assert_eq!(ask(&remote, method, path, None).await.0, 200, "{path}");
        }
        // Loopback, over IPv4, IPv6, and IPv4 mapped into IPv6 (a dual-stack listener).
        for peer in [
            "127.0.0.1:1",
            "127.8.9.10:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            let local = from_peer(main_listener(None), peer);
            for (method, path) in GUARDED {
                assert_eq!(
                    ask(&local, method, path, None).await.0,
                    200,
                    "{peer} {path}"
                );
            }
        }
        // A mapped address that is not loopback is not.
        let mapped = from_peer(main_listener(None), "[::ffff:192.0.2.7]:1");
        assert_eq!(ask(&mapped, "GET", "/v1/top", None).await.0, 403);
        // A request whose peer is unknown is refused.
        let unknown = main_listener(None);
        assert_eq!(ask(&unknown, "GET", "/v1/top", None).await.0, 403);
    }

    #[tokio::test]
    async fn with_a_token_every_peer_needs_it() {
        for peer in ["127.0.0.1:1", "192.0.2.7:5000"] {
            let router = from_peer(main_listener(Some("s3cret")), peer);
            for (method, path) in GUARDED {
                let (status, body) = ask(&router, method, path, None).await;
                assert_eq!(status, 403, "{peer} {path}: {body}");
                assert!(body.contains("Authorization: Bearer"), "{body}");
                assert_eq!(ask(&router, method, path, Some("s3cre")).await.0, 403);
                assert_eq!(ask(&router, method, path, Some("s3cret!")).await.0, 403);
                assert_eq!(
                    ask(&router, method, path, Some("s3cret")).await.0,
                    200,
                    "{path}"
                );
            }
            for (method, path) in OPEN {
                assert_eq!(ask(&router, method, path, None).await.0, 200, "{path}");
            }
        }
    }

    #[tokio::test]
    async fn the_debug_listener_serves_them_to_anyone() {
        for token in [None, Some("s3cret")] {
            let debug = from_peer(crate::http::debug(service(token)), "192.0.2.7:5000");
            for (method, path) in GUARDED {
                assert_eq!(ask(&debug, method, path, None).await.0, 200, "{path}");
            }
            // Still nothing that decides.
            assert_eq!(ask(&debug, "POST", "/v1/check", None).await.0, 404);
        }
    }
}
