//! The client's address behind trusted proxies: the TCP peer as axum records it
//! (`ConnectInfo`), then the `Forwarded` or `X-Forwarded-For` hops that trusted proxies
//! appended. Needs the `axum` feature.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use axum::extract::ConnectInfo;
use http::request::Parts;

/// The client behind any trusted proxies (see [`crate::KeyExtractor::peer_ip`]).
pub(crate) fn client_ip(parts: &Parts, trusted: &[IpNet]) -> Option<IpAddr> {
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

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`, or a bare address (a /32 or
/// /128): an [`ipnet::IpNet`] that also parses a bare address, as proxy lists write them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet(ipnet::IpNet);

impl IpNet {
    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }
}

impl From<ipnet::IpNet> for IpNet {
    fn from(net: ipnet::IpNet) -> Self {
        IpNet(net)
    }
}

impl From<IpAddr> for IpNet {
    fn from(address: IpAddr) -> Self {
        IpNet(address.into())
    }
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<ipnet::IpNet>()
            .map(IpNet)
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                format!(
                    "{s:?} is not an IP address or network (an address, then optionally / and \
                     a prefix length of 0 to 32 for IPv4, 0 to 128 for IPv6)"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyExtractor;

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
        let one: IpNet = "192.0.2.7".parse().unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let host: IpNet = "2001:db8::1".parse().unwrap();
        assert!(!host.contains("2001:db8::2".parse().unwrap()));
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
}
