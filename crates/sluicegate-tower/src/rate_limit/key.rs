//! Where a request's rate-limit key comes from. The peer address and the matched route
//! are what axum records about a request, so those two extractors need the `axum` feature.

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "axum")]
use axum::extract::MatchedPath;
use http::request::Parts;
use http::{HeaderName, StatusCode};

#[cfg(feature = "axum")]
use super::peer::{ForwardedHeader, IpNet, TrustedProxies};

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Takes one limit's key from a request.
#[derive(Clone)]
pub struct KeyExtractor {
    source: Source,
}

#[derive(Clone)]
enum Source {
    #[cfg(feature = "axum")]
    PeerIp(TrustedProxies),
    Header(HeaderName),
    Path,
    #[cfg(feature = "axum")]
    Route,
    Global,
    Custom {
        describe: &'static str,
        missing: StatusCode,
        extract: Arc<KeyFn>,
    },
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A request whose key cannot be extracted: answered with `status`, never a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingKey {
    /// The answer's status: 400 for something the client should have sent (a header),
    /// 401 for a missing authenticated user, 500 for a server set up without what the
    /// extractor needs (peer addresses).
    pub status: StatusCode,
    /// What was missing.
    pub detail: String,
}

impl KeyExtractor {
    /// The client's address: the TCP peer, unless the peer is a trusted proxy. By default
    /// no proxy is trusted and no forwarding header is read, so a client cannot choose its
    /// address. Needs the server to record peers
    /// (`into_make_service_with_connect_info::<SocketAddr>()`).
    ///
    /// Behind proxies, say which ones ([`KeyExtractor::trust_proxies`],
    /// [`KeyExtractor::trusted_hops`]) and, unless it is `X-Forwarded-For`, the header they
    /// write ([`KeyExtractor::forwarded_header`]): that header is read from the right,
    /// past the trusted hops, and the first address that is not a trusted proxy is the
    /// client. A missing, short or unreadable header gives the peer's address.
    #[cfg(feature = "axum")]
    pub fn peer_ip() -> Self {
        KeyExtractor {
            source: Source::PeerIp(TrustedProxies::default()),
        }
    }

    /// Trusts proxies at these addresses (peer IP only): the forwarding header is read only
    /// when the peer is one of them, and entries inside them are skipped as further
    /// proxies. With [`KeyExtractor::trusted_hops`] too, the peer must be one of them and
    /// the count says where the client is.
    #[cfg(feature = "axum")]
    pub fn trust_proxies(self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        self.with_proxies(|trusted| trusted.networks = proxies.into_iter().collect())
    }

    /// How many trusted proxies stand in front of the service, each appending to the
    /// forwarding header (peer IP only): the client is the `hops`-th entry from the right
    /// (1: the one the peer appended), then further left past any address of
    /// [`KeyExtractor::trust_proxies`]. Without `trust_proxies`, every peer is taken for
    /// the nearest proxy: use that only where clients cannot reach the service but
    /// through the proxies. 0 (the default): as many as `trust_proxies` says.
    #[cfg(feature = "axum")]
    pub fn trusted_hops(self, hops: usize) -> Self {
        self.with_proxies(|trusted| trusted.hops = hops)
    }

    /// The one header the trusted proxies write the client in (peer IP only); default
    /// [`ForwardedHeader::XForwardedFor`]. Every other forwarding header is ignored.
    #[cfg(feature = "axum")]
    pub fn forwarded_header(self, header: ForwardedHeader) -> Self {
        self.with_proxies(|trusted| trusted.header = header)
    }

    #[cfg(feature = "axum")]
    fn with_proxies(mut self, change: impl FnOnce(&mut TrustedProxies)) -> Self {
        if let Source::PeerIp(trusted) = &mut self.source {
            change(trusted);
        }
        self
    }

    /// A request header's value (e.g. an API key). Missing: 400.
    pub fn header(name: HeaderName) -> Self {
        KeyExtractor {
            source: Source::Header(name),
        }
    }

    /// The request path, e.g. `/users/42`.
    pub fn path() -> Self {
        KeyExtractor {
            source: Source::Path,
        }
    }

    /// The route pattern axum matched, e.g. `/users/{id}`: one counter per route. Falls
    /// back to the path outside an axum router.
    #[cfg(feature = "axum")]
    pub fn route() -> Self {
        KeyExtractor {
            source: Source::Route,
        }
    }

    /// One key for every request: a global cap.
    pub fn global() -> Self {
        KeyExtractor {
            source: Source::Global,
        }
    }

    /// An authenticated user put in the request's extensions by an earlier layer, as
    /// `T`; `id` names it. Missing: 401.
    pub fn user<T, F>(id: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        KeyExtractor {
            source: Source::Custom {
                describe: "an authenticated user",
                missing: StatusCode::UNAUTHORIZED,
                extract: Arc::new(move |parts: &Parts| parts.extensions.get::<T>().map(&id)),
            },
        }
    }

    /// Any function of the request; `None` answers 400.
    pub fn custom<F>(extract: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        KeyExtractor {
            source: Source::Custom {
                describe: "a custom key",
                missing: StatusCode::BAD_REQUEST,
                extract: Arc::new(extract),
            },
        }
    }

    fn describe(&self) -> String {
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PeerIp(_) => "the peer address".into(),
            Source::Header(name) => format!("header {name}"),
            Source::Path => "the path".into(),
            #[cfg(feature = "axum")]
            Source::Route => "the route".into(),
            Source::Global => "global".into(),
            Source::Custom { describe, .. } => (*describe).into(),
        }
    }

    /// The key of `parts`, or why there is none.
    pub fn extract(&self, parts: &Parts) -> Result<String, MissingKey> {
        let missing = |status, detail: String| Err(MissingKey { status, detail });
        match &self.source {
            #[cfg(feature = "axum")]
            Source::PeerIp(trusted) => match trusted.client_ip(parts) {
                Some(ip) => Ok(ip.to_string()),
                None => missing(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the server does not record peer addresses; serve with \
                     into_make_service_with_connect_info::<SocketAddr>()"
                        .into(),
                ),
            },
            Source::Header(name) => match parts.headers.get(name).map(|v| v.to_str()) {
                Some(Ok(value)) if !value.is_empty() => Ok(value.to_owned()),
                Some(_) => missing(
                    StatusCode::BAD_REQUEST,
                    format!("header {name} must be non-empty visible ASCII"),
                ),
                None => missing(
                    StatusCode::BAD_REQUEST,
                    format!("header {name} is required"),
                ),
            },
            Source::Path => Ok(parts.uri.path().to_owned()),
            #[cfg(feature = "axum")]
            Source::Route => Ok(parts
                .extensions
                .get::<MatchedPath>()
                .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned())),
            Source::Global => Ok(String::new()),
            Source::Custom {
                describe,
                missing: status,
                extract,
            } => match extract(parts) {
                Some(key) => Ok(key),
                None => missing(*status, format!("the request carries no {describe}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_have_documented_statuses() {
        let (bare, ()) = http::Request::builder()
            .uri("/x")
            .body(())
            .unwrap()
            .into_parts();
        let cases = [
            #[cfg(feature = "axum")]
            (KeyExtractor::peer_ip(), StatusCode::INTERNAL_SERVER_ERROR),
            (
                KeyExtractor::header(HeaderName::from_static("x-api-key")),
                StatusCode::BAD_REQUEST,
            ),
            (
                KeyExtractor::user(|id: &u64| id.to_string()),
                StatusCode::UNAUTHORIZED,
            ),
            (KeyExtractor::custom(|_| None), StatusCode::BAD_REQUEST),
        ];
        for (extractor, status) in cases {
            assert_eq!(
                extractor.extract(&bare).unwrap_err().status,
                status,
                "{extractor:?}"
            );
        }
        assert_eq!(KeyExtractor::global().extract(&bare).unwrap(), "");
        assert_eq!(KeyExtractor::path().extract(&bare).unwrap(), "/x");
    }
}
