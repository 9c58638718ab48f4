//! Where a request's rate-limit key comes from.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, MatchedPath};
use http::request::Parts;
use http::{HeaderName, StatusCode};

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Takes one limit's key from a request.
#[derive(Clone)]
pub struct KeyExtractor {
    source: Source,
}

#[derive(Clone)]
enum Source {
    PeerIp {
        trusted: Arc<[IpNet]>,
    },
    Header(HeaderName),
    Path,
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
    /// The client's address: the TCP peer, unless the peer is one of the trusted proxies
    /// given with [`KeyExtractor::trust_proxies`], in which case `Forwarded` (or else
    /// `X-Forwarded-For`) is followed right to left past trusted proxies to the first
    /// address that is not one. By default no proxy is trusted, so a client cannot spoof
    /// its address with those headers. Needs the server to record peers
    /// (`into_make_service_with_connect_info::<SocketAddr>()`).
    pub fn peer_ip() -> Self {
        KeyExtractor {
            source: Source::PeerIp {
                trusted: Arc::from([]),
            },
        }
    }

    /// Trusts these proxies' forwarding headers (peer IP only).
    pub fn trust_proxies(self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        match self.source {
            Source::PeerIp { .. } => KeyExtractor {
                source: Source::PeerIp {
                    trusted: proxies.into_iter().collect(),
                },
            },
            other => KeyExtractor { source: other },
        }
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
            Source::PeerIp { .. } => "the peer address".into(),
            Source::Header(name) => format!("header {name}"),
            Source::Path => "the path".into(),
            Source::Route => "the route".into(),
            Source::Global => "global".into(),
            Source::Custom { describe, .. } => (*describe).into(),
        }
    }

    /// The key of `parts`, or why there is none.
    pub fn extract(&self, parts: &Parts) -> Result<String, MissingKey> {
        let missing = |status, detail: String| Err(MissingKey { status, detail });
        match &self.source {
            Source::PeerIp { trusted } => match client_ip(parts, trusted) {
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

/// The client behind any trusted proxies (see [`KeyExtractor::peer_ip`]).
fn client_ip(parts: &Parts, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>()?.0.ip();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(*ip));
    if !is_trusted(&peer) {
        return Some(peer);
    }
    let hops = forwarded_hops(parts);
    let mut client = peer;
    for hop in hops.iter().rev() {
        // An unreadable hop ends the chain: the last trusted sender is all we know.
        let Some(ip) = hop else { break };
        client = *ip;
        if !is_trusted(ip) {
            break;
        }
    }
    Some(client)
}

/// The addresses proxies recorded, oldest first: `Forwarded: for=…` if present, else
/// `X-Forwarded-For`. `None` marks a hop that is not an address (`unknown`, obfuscated).
fn forwarded_hops(parts: &Parts) -> Vec<Option<IpAddr>> {
    let forwarded: Vec<Option<IpAddr>> = parts
        .headers
        .get_all(http::header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.trim().split_once('=')?;
                name.eq_ignore_ascii_case("for")
                    .then(|| parse_forwarded_node(value.trim().trim_matches('"')))
            })
        })
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
    parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|hop| hop.trim().parse().ok())
        .collect()
}

/// `192.0.2.1`, `192.0.2.1:8080`, `[2001:db8::1]` or `[2001:db8::1]:443`.
fn parse_forwarded_node(node: &str) -> Option<IpAddr> {
    if let Some(rest) = node.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    node.parse()
        .ok()
        .or_else(|| node.rsplit_once(':')?.0.parse().ok())
}

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32` (a bare address is a /32 or
/// /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    address: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = match s.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (s, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or network"))?;
        let most = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => most,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= most)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {most}"))?,
        };
        Ok(IpNet { address, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::builder().uri("/users/42");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        parts
            .extensions
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        parts
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn networks_contain_what_they_should() {
        let net: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.255.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        let six: IpNet = "2001:db8::/32".parse().unwrap();
        assert!(six.contains("2001:db8:1::9".parse().unwrap()));
        assert!(
            "0.0.0.0/0"
                .parse::<IpNet>()
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("ten".parse::<IpNet>().is_err());
    }

    #[test]
    fn spoofed_headers_from_untrusted_peers_are_ignored() {
        let plain = KeyExtractor::peer_ip();
        let p = parts("203.0.113.7:5000", &[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(plain.extract(&p).unwrap(), "203.0.113.7");
        let trusting = KeyExtractor::peer_ip().trust_proxies(nets(&["10.0.0.0/8"]));
        assert_eq!(trusting.extract(&p).unwrap(), "203.0.113.7");
    }

    #[test]
    fn trusted_proxies_are_walked_right_to_left() {
        let extractor = KeyExtractor::peer_ip().trust_proxies(nets(&["10.0.0.0/8"]));
        // The client forged its first hop; the trusted proxies appended the real ones.
        let p = parts(
            "10.0.0.2:443",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.0.0.1")],
        );
        assert_eq!(extractor.extract(&p).unwrap(), "198.51.100.9");
        let p = parts(
            "10.0.0.2:443",
            &[(
                "forwarded",
                "for=6.6.6.6, for=\"[2001:db8::5]:4711\";proto=https",
            )],
        );
        assert_eq!(extractor.extract(&p).unwrap(), "2001:db8::5");
        let p = parts("10.0.0.2:443", &[("x-forwarded-for", "unknown")]);
        assert_eq!(extractor.extract(&p).unwrap(), "10.0.0.2");
    }

    #[test]
    fn missing_keys_have_documented_statuses() {
        let (bare, ()) = http::Request::builder()
            .uri("/x")
            .body(())
            .unwrap()
            .into_parts();
        let cases = [
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
