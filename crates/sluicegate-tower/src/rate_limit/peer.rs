//! The client's address behind trusted proxies: the TCP peer as axum records it
//! (`ConnectInfo`), then the one forwarding header the operator names, read from the right
//! past the hops trusted proxies appended. Needs the `axum` feature.
//!
//! Only the right end of a forwarding header can be believed: a trusted proxy appends
//! what it saw, and everything to the left of that is what the client sent. So the
//! header is split from the right and each entry is read only when the walk reaches it;
//! garbage a client put on the left changes nothing, and an entry that cannot be read
//! where the client should be gives the peer, never a value further left.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderMap, HeaderName};

/// The header trusted proxies record the client in. Only this one is read; every other
/// forwarding header a request carries is ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …`: each proxy appends the address it received
    /// the request from (nginx's `$proxy_add_x_forwarded_for`, AWS ALB, HAProxy's
    /// `option forwardfor`, Envoy). The default.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1;proto=https, …`: each proxy appends an
    /// element, whose `for` parameter is read (quoted or not, IPv6 in brackets, a port
    /// allowed).
    Forwarded,
    /// A header holding one address that the trusted proxy sets, replacing whatever the
    /// client sent: `X-Real-IP` (nginx), `CF-Connecting-IP` (Cloudflare),
    /// `True-Client-IP`. A request carrying it twice, or a list, is not believed.
    Single(HeaderName),
}

/// Which proxies [`crate::KeyExtractor::peer_ip`] trusts, and where they write the client.
#[derive(Clone, Debug, Default)]
pub(crate) struct TrustedProxies {
    /// Addresses of trusted proxies (`trust_proxies`).
    pub(crate) networks: Arc<[IpNet]>,
    /// How many trusted proxies stand in front of the service (`trusted_hops`); 0: as
    /// many as the networks say.
    pub(crate) hops: usize,
    pub(crate) header: ForwardedHeader,
}

impl TrustedProxies {
    /// The client behind any trusted proxies, or `None` when the server records no peers.
    pub(crate) fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()?
            .0
            .ip()
            .to_canonical();
        Some(self.forwarded_client(peer, &parts.headers).unwrap_or(peer))
    }

    /// The client the trusted proxies name; `None` when the peer is not a trusted proxy,
    /// or the header is missing, too short or unreadable where the client should be.
    fn forwarded_client(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        let in_networks = |ip: IpAddr| self.networks.iter().any(|net| net.contains(ip));
        // Without networks, a hop count says every connection comes through the proxies.
        let peer_is_proxy = if self.networks.is_empty() {
            self.hops > 0
        } else {
            in_networks(peer)
        };
        if !peer_is_proxy {
            return None;
        }
        let (name, read): (&HeaderName, ReadEntry) = match &self.header {
            ForwardedHeader::Single(name) => return single_address(headers, name),
            ForwardedHeader::XForwardedFor => (&X_FORWARDED_FOR, parse_node),
            ForwardedHeader::Forwarded => (&http::header::FORWARDED, forwarded_for),
        };
        let entries: Vec<&[u8]> = headers
            .get_all(name)
            .iter()
            .flat_map(|value| value.as_bytes().split(|b| *b == b','))
            .collect();
        // The peer is the nearest trusted proxy; the other `hops - 1` appended the entries
        // right of the client's.
        let appended_by_proxies = self.hops.saturating_sub(1);
        let mut client = None;
        for entry in entries.iter().rev().skip(appended_by_proxies) {
            let ip = read(entry)?;
            client = Some(ip);
            if !in_networks(ip) {
                break;
            }
        }
        // Every address trusted: the farthest one is the client.
        client
    }
}

/// Reads the address out of one entry of a list header.
type ReadEntry = fn(&[u8]) -> Option<IpAddr>;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The one address of a single-value header; `None` if it is missing, repeated or not
/// one address.
fn single_address(headers: &HeaderMap, name: &HeaderName) -> Option<IpAddr> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    parse_node(value.as_bytes())
}

/// The `for` parameter of one `Forwarded` element: `for=192.0.2.1`,
/// `For="[2001:db8::1]:4711"`, among other parameters. `None` if it has none, has two, or
/// names no address (`unknown`, an obfuscated `_hidden`).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let element = std::str::from_utf8(element).ok()?;
    let mut node = None;
    for pair in element.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=')?;
        if name.trim_end().eq_ignore_ascii_case("for") {
            if node.is_some() {
                return None;
            }
            node = Some(value.trim_start());
        }
    }
    let node = node?;
    let node = match node.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => node,
    };
    if node.contains(['"', '\\']) {
        return None;
    }
    parse_node(node.as_bytes())
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:443`; IPv4-mapped IPv6 becomes IPv4.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(node.trim_ascii()).ok()?;
    let port_ok = |port: &str| {
        !port.is_empty()
            && port
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
    };
    let ip = if let Some(bracketed) = node.strip_prefix('[') {
        let (address, rest) = bracketed.split_once(']')?;
        if !rest.is_empty() && !rest.strip_prefix(':').is_some_and(port_ok) {
            return None;
        }
        IpAddr::V6(address.parse::<Ipv6Addr>().ok()?)
    } else if let Ok(ip) = node.parse::<IpAddr>() {
        ip
    } else {
        let (address, port) = node.rsplit_once(':')?;
        if !port_ok(port) {
            return None;
        }
        IpAddr::V4(address.parse::<Ipv4Addr>().ok()?)
    };
    Some(ip.to_canonical())
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

    /// The key `extractor` takes from a request by `peer` carrying `headers`.
    fn client(extractor: &KeyExtractor, peer: &str, headers: &[(&str, &[u8])]) -> String {
        let mut builder = http::Request::builder().uri("/users/42");
        for (name, value) in headers {
            builder = builder.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        parts
            .extensions
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        extractor.extract(&parts).unwrap()
    }

    fn behind(networks: &[&str]) -> KeyExtractor {
        KeyExtractor::peer_ip().trust_proxies(networks.iter().map(|n| n.parse().unwrap()))
    }

    const XFF: &str = "x-forwarded-for";

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
        let spoofed: &[(&str, &[u8])] = &[
            (XFF, b"1.2.3.4"),
            ("forwarded", b"for=1.2.3.4"),
            ("x-real-ip", b"1.2.3.4"),
        ];
        let peer = "203.0.113.7:5000";
        assert_eq!(
            client(&KeyExtractor::peer_ip(), peer, spoofed),
            "203.0.113.7"
        );
        assert_eq!(
            client(&behind(&["10.0.0.0/8"]), peer, spoofed),
            "203.0.113.7"
        );
        let counted = behind(&["10.0.0.0/8"]).trusted_hops(1);
        assert_eq!(client(&counted, peer, spoofed), "203.0.113.7");
        let real_ip = behind(&["10.0.0.0/8"]).forwarded_header(ForwardedHeader::Single(
            HeaderName::from_static("x-real-ip"),
        ));
        assert_eq!(client(&real_ip, peer, spoofed), "203.0.113.7");
        // A header named without any trusted proxy is never read.
        let untrusting = KeyExtractor::peer_ip().forwarded_header(ForwardedHeader::Forwarded);
        assert_eq!(client(&untrusting, peer, spoofed), "203.0.113.7");
    }

    #[test]
    fn trusted_networks_are_walked_right_to_left_past_spoofed_entries() {
        let extractor = behind(&["10.0.0.0/8"]);
        // The client forged the first entries; the trusted proxies appended the real ones.
        let chain: &[(&str, &[u8])] = &[(XFF, b"6.6.6.6, 7.7.7.7 ,198.51.100.9, 10.0.0.1")];
        assert_eq!(client(&extractor, "10.0.0.2:443", chain), "198.51.100.9");
        // Entries on several lines are one list, in order.
        let lines: &[(&str, &[u8])] = &[(XFF, b"6.6.6.6"), (XFF, b"198.51.100.9, 10.0.0.1")];
        assert_eq!(client(&extractor, "10.0.0.2:443", lines), "198.51.100.9");
        // Garbage the client put on the left is never read.
        let garbage: &[(&str, &[u8])] = &[(XFF, b"\xff\xfe, not an address, 198.51.100.9")];
        assert_eq!(client(&extractor, "10.0.0.2:443", garbage), "198.51.100.9");
        // Where the client should be: unreadable or absent gives the peer.
        for unreadable in [
            &b"unknown"[..],
            b"6.6.6.6, _hidden, 10.0.0.1",
            b"",
            b"1.2.3",
        ] {
            let headers: &[(&str, &[u8])] = &[(XFF, unreadable)];
            assert_eq!(client(&extractor, "10.0.0.2:443", headers), "10.0.0.2");
        }
        assert_eq!(client(&extractor, "10.0.0.2:443", &[]), "10.0.0.2");
        // Every address a trusted proxy: the farthest is the client.
        let internal: &[(&str, &[u8])] = &[(XFF, b"10.9.9.9, 10.0.0.1")];
        assert_eq!(client(&extractor, "10.0.0.2:443", internal), "10.9.9.9");
    }

    #[test]
    fn only_the_named_header_is_read() {
        let all: &[(&str, &[u8])] = &[
            ("forwarded", b"for=192.0.2.1"),
            (XFF, b"192.0.2.2"),
            ("x-real-ip", b"192.0.2.3"),
            ("cf-connecting-ip", b"2001:db8::4"),
        ];
        let peer = "10.0.0.2:443";
        let with = |header| behind(&["10.0.0.0/8"]).forwarded_header(header);
        let single = |name| ForwardedHeader::Single(HeaderName::from_static(name));
        assert_eq!(client(&behind(&["10.0.0.0/8"]), peer, all), "192.0.2.2");
        assert_eq!(
            client(&with(ForwardedHeader::Forwarded), peer, all),
            "192.0.2.1"
        );
        assert_eq!(
            client(&with(ForwardedHeader::XForwardedFor), peer, all),
            "192.0.2.2"
        );
        assert_eq!(client(&with(single("x-real-ip")), peer, all), "192.0.2.3");
        assert_eq!(
            client(&with(single("cf-connecting-ip")), peer, all),
            "2001:db8::4"
        );
        // The named header missing: the others are not a fallback.
        let no_xff = &all[..1];
        assert_eq!(client(&behind(&["10.0.0.0/8"]), peer, no_xff), "10.0.0.2");
        // A single-value header set twice, or holding a list, is not believed.
        let twice: &[(&str, &[u8])] = &[("x-real-ip", b"6.6.6.6"), ("x-real-ip", b"192.0.2.3")];
        assert_eq!(client(&with(single("x-real-ip")), peer, twice), "10.0.0.2");
        let list: &[(&str, &[u8])] = &[("x-real-ip", b"6.6.6.6, 192.0.2.3")];
        assert_eq!(client(&with(single("x-real-ip")), peer, list), "10.0.0.2");
    }

    #[test]
    fn hops_are_counted_from_the_right() {
        let chain: &[(&str, &[u8])] = &[(XFF, b"6.6.6.6, 198.51.100.9, 203.0.113.50")];
        let hops = |n| KeyExtractor::peer_ip().trusted_hops(n);
        // One proxy: the entry it appended. Two: the one the farther proxy appended.
        assert_eq!(client(&hops(1), "192.0.2.10:1", chain), "203.0.113.50");
        assert_eq!(client(&hops(2), "192.0.2.10:1", chain), "198.51.100.9");
        // Fewer entries than proxies: the header names no client.
        assert_eq!(client(&hops(4), "192.0.2.10:1", chain), "192.0.2.10");
        // With networks the peer must be in them, then the count says where the client is,
        // and addresses inside the networks left of it are proxies too.
        let both = behind(&["10.0.0.0/8"]).trusted_hops(2);
        assert_eq!(client(&both, "192.0.2.10:1", chain), "192.0.2.10");
        assert_eq!(client(&both, "10.0.0.2:1", chain), "198.51.100.9");
        let internal: &[(&str, &[u8])] = &[(XFF, b"6.6.6.6, 198.51.100.9, 10.0.0.7, 203.0.113.50")];
        assert_eq!(client(&both, "10.0.0.2:1", internal), "198.51.100.9");
        // A single-value header needs only a trusted peer.
        let real_ip = hops(2).forwarded_header(ForwardedHeader::Single(HeaderName::from_static(
            "x-real-ip",
        )));
        let set: &[(&str, &[u8])] = &[("x-real-ip", b"198.51.100.9")];
        assert_eq!(client(&real_ip, "192.0.2.10:1", set), "198.51.100.9");
    }

    #[test]
    fn forwarded_elements_quoting_ipv6_and_obfuscation() {
        let extractor = behind(&["10.0.0.0/8"]).forwarded_header(ForwardedHeader::Forwarded);
        let peer = "10.0.0.2:443";
        let cases: &[(&[u8], &str)] = &[
            (
                b"for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
                "2001:db8::1",
            ),
            (
                b"for=6.6.6.6, proto=https; For = 192.0.2.1:8080 ;by=10.0.0.2",
                "192.0.2.1",
            ),
            (b"for=\"[2001:db8::1]\"", "2001:db8::1"),
            (b"for=[2001:db8::2]:_port", "2001:db8::2"),
            (b"for=\"::ffff:192.0.2.5\"", "192.0.2.5"),
            (b"for=192.0.2.1, for=10.0.0.1", "192.0.2.1"),
            // No address where the client should be: the peer, never the entry left of it.
            (b"for=192.0.2.1, for=_hidden", "10.0.0.2"),
            (b"for=192.0.2.1, for=unknown", "10.0.0.2"),
            (b"for=192.0.2.1, proto=https", "10.0.0.2"),
            (b"for=192.0.2.1, for=\"192.0.2.7", "10.0.0.2"),
            (b"for=192.0.2.1, for=192.0.2.7;for=192.0.2.8", "10.0.0.2"),
            (b"for=192.0.2.1, for=\"[2001:db8::1]:4711", "10.0.0.2"),
            (b"for=192.0.2.1, for=\"1.2.\\\"3.4\"", "10.0.0.2"),
            // A client's unclosed quote on the left cannot swallow what proxies appended.
            (b"for=\"6.6.6.6, for=192.0.2.9", "192.0.2.9"),
        ];
        for (value, want) in cases {
            let headers: &[(&str, &[u8])] = &[("forwarded", value)];
            assert_eq!(
                client(&extractor, peer, headers),
                *want,
                "{}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn ipv4_mapped_peers_and_entries_are_ipv4() {
        // A dual-stack listener records IPv4 peers as ::ffff:a.b.c.d.
        let extractor = behind(&["10.0.0.0/8"]);
        let chain: &[(&str, &[u8])] = &[(XFF, b"::ffff:198.51.100.9")];
        assert_eq!(
            client(&extractor, "[::ffff:10.0.0.2]:443", chain),
            "198.51.100.9"
        );
        assert_eq!(
            client(&KeyExtractor::peer_ip(), "[::ffff:192.0.2.1]:1", &[]),
            "192.0.2.1"
        );
    }
}
