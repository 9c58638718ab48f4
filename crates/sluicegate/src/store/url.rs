//! Where a store lives: the one parser of the URLs that name stores.

use std::fmt;
use std::str::FromStr;

/// Where a store lives, parsed from the URL that names it:
///
/// - `memory`: the in-memory store;
/// - `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS),
///   `redis+unix:///path/to.sock` (or `unix://…`): one Redis server;
/// - `redis-cluster://[user:password@]host:port,host:port,…`, `rediss-cluster://…` (TLS):
///   the seed nodes of a Redis Cluster;
/// - `redis+sentinel://[user:password@]host:port[,host:port…]/master-name`,
///   `rediss+sentinel://…` (TLS to the sentinels and the master): the master the
///   sentinels at those addresses know by that name, followed through failovers. The
///   credentials are the master's; `?sentinel_username=…&sentinel_password=…` gives the
///   sentinels' own.
///
/// Shown (`Display`, `Debug`) without its password, so it can be logged and named in
/// errors.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    target: Target,
}

/// What a [`StoreUrl`] names.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Memory,
    #[cfg(feature = "redis")]
    Redis(RedisUrl),
}

/// A Redis server or cluster, as the Redis store connects to it.
#[cfg(feature = "redis")]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedisUrl {
    /// The URL without its password.
    pub(crate) shown: String,
    /// Whether every connection uses TLS.
    pub(crate) tls: bool,
    pub(crate) topology: Topology,
}

/// One server or a cluster; each URL in the form the redis crate reads (user, password,
/// database).
#[cfg(feature = "redis")]
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    Server(String),
    /// The seed nodes, each with the cluster URL's credentials.
    Cluster(Vec<String>),
    Sentinel(SentinelUrl),
}

/// A master found through sentinels.
#[cfg(feature = "redis")]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// The sentinels, each `host:port`.
    pub(crate) sentinels: Vec<String>,
    /// The name the sentinels know the master by.
    pub(crate) master_name: String,
    /// The master's user and password, as the URL wrote them (`user:password`), if any.
    pub(crate) master_credentials: Option<String>,
    /// The sentinels' own user and password, if any.
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

/// A Redis URL scheme, and what it says about the connection.
#[cfg_attr(
    not(feature = "redis"),
    expect(
        dead_code,
        reason = "without Redis a scheme is only recognised, to say so"
    )
)]
struct RedisScheme {
    scheme: &'static str,
    tls: bool,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Cluster,
    Sentinel,
}

const REDIS_SCHEMES: [RedisScheme; 8] = [
    RedisScheme::server("redis://", false),
    RedisScheme::server("rediss://", true),
    RedisScheme::server("redis+unix://", false),
    RedisScheme::server("unix://", false),
    RedisScheme::cluster("redis-cluster://", false),
    RedisScheme::cluster("rediss-cluster://", true),
    RedisScheme::sentinel("redis+sentinel://", false),
    RedisScheme::sentinel("rediss+sentinel://", true),
];

impl RedisScheme {
    const fn server(scheme: &'static str, tls: bool) -> Self {
        RedisScheme {
            scheme,
            tls,
            kind: Kind::Server,
        }
    }

    const fn cluster(scheme: &'static str, tls: bool) -> Self {
        RedisScheme {
            scheme,
            tls,
            kind: Kind::Cluster,
        }
    }

    const fn sentinel(scheme: &'static str, tls: bool) -> Self {
        RedisScheme {
            scheme,
            tls,
            kind: Kind::Sentinel,
        }
    }
}

impl StoreUrl {
    /// The in-memory store.
    pub const MEMORY: StoreUrl = StoreUrl {
        target: Target::Memory,
    };

    /// Parses `url`; see [`StoreUrl`] for the forms.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreUrlError> {
        if url == "memory" {
            return Ok(StoreUrl::MEMORY);
        }
        let error = |reason| StoreUrlError {
            url: redact(url),
            reason,
        };
        match REDIS_SCHEMES.iter().find(|s| url.starts_with(s.scheme)) {
            None => Err(error(Reason::Unknown)),
            #[cfg(feature = "redis")]
            Some(scheme) => Ok(StoreUrl {
                target: Target::Redis(RedisUrl::parse(url, scheme).map_err(error)?),
            }),
            #[cfg(not(feature = "redis"))]
            Some(_) => Err(error(Reason::WithoutRedis)),
        }
    }

    /// Whether this is the in-memory store.
    pub fn is_memory(&self) -> bool {
        self.target == Target::Memory
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }
}

#[cfg(feature = "redis")]
impl RedisUrl {
    /// `url`, which starts with `scheme`.
    fn parse(url: &str, scheme: &RedisScheme) -> Result<RedisUrl, Reason> {
        let rest = &url[scheme.scheme.len()..];
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials), hosts),
            None => (None, rest),
        };
        let topology = match scheme.kind {
            Kind::Server => Topology::Server(url.to_owned()),
            Kind::Cluster => {
                let node_scheme = if scheme.tls { "rediss://" } else { "redis://" };
                let credentials = credentials.map(|c| format!("{c}@")).unwrap_or_default();
                Topology::Cluster(
                    hosts
                        .split(',')
                        .map(|host| format!("{node_scheme}{credentials}{}", host.trim()))
                        .collect(),
                )
            }
            Kind::Sentinel => Topology::Sentinel(SentinelUrl::parse(credentials, hosts)?),
        };
        Ok(RedisUrl {
            shown: redact(url),
            tls: scheme.tls,
            topology,
        })
    }
}

#[cfg(feature = "redis")]
impl SentinelUrl {
    /// `hosts` is `host:port[,host:port…]/master-name[?sentinel_username=…&sentinel_password=…]`.
    fn parse(credentials: Option<&str>, hosts: &str) -> Result<SentinelUrl, Reason> {
        let (hosts, query) = hosts.split_once('?').unwrap_or((hosts, ""));
        let (hosts, master_name) = hosts.split_once('/').ok_or(Reason::NoMasterName)?;
        if master_name.is_empty() || master_name.contains('/') {
            return Err(Reason::NoMasterName);
        }
        let sentinels: Vec<String> = hosts.split(',').map(|h| h.trim().to_owned()).collect();
        if sentinels.iter().any(|h| !is_host_and_port(h)) {
            return Err(Reason::BadSentinel);
        }
        let (mut sentinel_username, mut sentinel_password) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_username", user)) => sentinel_username = Some(user.to_owned()),
                Some(("sentinel_password", password)) => {
                    sentinel_password = Some(password.to_owned());
                }
                _ => return Err(Reason::UnknownParameter),
            }
        }
        Ok(SentinelUrl {
            sentinels,
            master_name: master_name.to_owned(),
            master_credentials: credentials.map(str::to_owned),
            sentinel_username,
            sentinel_password,
        })
    }
}

/// `host:port`, the port a number.
#[cfg(feature = "redis")]
fn is_host_and_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        StoreUrl::parse(url)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Memory => f.write_str("memory"),
            #[cfg(feature = "redis")]
            Target::Redis(redis) => f.write_str(&redis.shown),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.to_string()).finish()
    }
}

/// Why a URL names no store this build can open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrlError {
    /// The URL without its password.
    url: String,
    reason: Reason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Unknown,
    #[cfg(feature = "redis")]
    NoMasterName,
    #[cfg(feature = "redis")]
    BadSentinel,
    #[cfg(feature = "redis")]
    UnknownParameter,
    #[cfg(not(feature = "redis"))]
    WithoutRedis,
}

impl StoreUrlError {
    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl fmt::Display for StoreUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = &self.url;
        match self.reason {
            Reason::Unknown => write!(
                f,
                "unknown store {url:?}: expected memory, redis://host:port, rediss://host:port, \
                 redis+unix:///path, redis-cluster://host:port,host:port, \
                 rediss-cluster://host:port,host:port or \
                 redis+sentinel://host:port,host:port/master-name"
            ),
            #[cfg(feature = "redis")]
            Reason::NoMasterName => write!(
                f,
                "store {url:?} names no master: expected \
                 redis+sentinel://host:port[,host:port]/master-name"
            ),
            #[cfg(feature = "redis")]
            Reason::BadSentinel => write!(
                f,
                "store {url:?}: every sentinel must be host:port, the port a number"
            ),
            #[cfg(feature = "redis")]
            Reason::UnknownParameter => write!(
                f,
                "store {url:?}: the only parameters are sentinel_username and \
                 sentinel_password"
            ),
            #[cfg(not(feature = "redis"))]
            Reason::WithoutRedis => write!(
                f,
                "store {url:?} is a Redis store, and sluicegate was built without the redis \
                 feature"
            ),
        }
    }
}

impl std::error::Error for StoreUrlError {}

/// The URL without its passwords (the user's, and a sentinel's in the query), for error
/// messages and logs.
fn redact(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    match url.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| !pair.starts_with("sentinel_password="))
                .collect();
            if kept.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        }
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact("redis://app:secret@db:6379/0"), "redis://db:6379/0");
        assert_eq!(redact("redis-cluster://a:1,b:2"), "redis-cluster://a:1,b:2");
        assert_eq!(
            redact("redis+unix:///run/redis.sock"),
            "redis+unix:///run/redis.sock"
        );
    }

    #[test]
    fn memory_is_memory() {
        let url = StoreUrl::parse("memory").unwrap();
        assert!(url.is_memory());
        assert_eq!(url.to_string(), "memory");
        assert_eq!("memory".parse::<StoreUrl>(), Ok(StoreUrl::MEMORY));
    }

    #[test]
    fn unknown_schemes_are_refused_without_their_passwords() {
        for url in [
            "",
            "Memory",
            "memcached://a:1",
            "http://redis:6379",
            "redis:/a",
        ] {
            let err = StoreUrl::parse(url).unwrap_err();
            assert!(err.to_string().starts_with("unknown store"), "{url}: {err}");
        }
        let err = StoreUrl::parse("mysql://app:secret@db").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn every_documented_redis_scheme_parses() {
        let parsed = |url: &str| match StoreUrl::parse(url).unwrap().target {
            Target::Redis(redis) => redis,
            Target::Memory => panic!("{url} is not memory"),
        };
        for (url, tls) in [
            ("redis://app:secret@db:6379/2", false),
            ("rediss://db:6380", true),
            ("redis+unix:///run/redis.sock", false),
            ("unix:///run/redis.sock", false),
        ] {
            let redis = parsed(url);
            assert_eq!(redis.tls, tls, "{url}");
            assert!(redis.topology == Topology::Server(url.to_owned()), "{url}");
        }
        let redis = parsed("rediss-cluster://app:secret@a:7000, b:7001");
        assert!(redis.tls);
        assert!(
            redis.topology
                == Topology::Cluster(vec![
                    "rediss://app:secret@a:7000".to_owned(),
                    "rediss://app:secret@b:7001".to_owned(),
                ])
        );
        assert_eq!(redis.shown, "rediss-cluster://a:7000, b:7001");
        let redis = parsed("redis-cluster://a:7000");
        assert!(!redis.tls);
        assert!(redis.topology == Topology::Cluster(vec!["redis://a:7000".to_owned()]));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_sentinel_url_names_its_sentinels_master_and_credentials() {
        let url = "rediss+sentinel://app:secret@a:26379, b:26380/mymaster\
                   ?sentinel_username=watch&sentinel_password=hidden";
        let Target::Redis(redis) = StoreUrl::parse(url).unwrap().target else {
            panic!("{url} is not memory");
        };
        assert!(redis.tls);
        assert_eq!(
            redis.shown,
            "rediss+sentinel://a:26379, b:26380/mymaster?sentinel_username=watch"
        );
        let Topology::Sentinel(sentinel) = redis.topology else {
            panic!("{url} is not a sentinel URL");
        };
        assert_eq!(sentinel.sentinels, ["a:26379", "b:26380"]);
        assert_eq!(sentinel.master_name, "mymaster");
        assert_eq!(sentinel.master_credentials.as_deref(), Some("app:secret"));
        assert_eq!(sentinel.sentinel_username.as_deref(), Some("watch"));
        assert_eq!(sentinel.sentinel_password.as_deref(), Some("hidden"));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_sentinel_url_without_a_master_or_with_a_bad_sentinel_is_refused() {
        for (url, says) in [
            ("redis+sentinel://a:26379", "names no master"),
            ("redis+sentinel://a:26379/", "names no master"),
            ("redis+sentinel://a:26379/m/0", "names no master"),
            ("redis+sentinel://a:26379,b/m", "host:port"),
            ("redis+sentinel://:x:secret@a:huge/m", "host:port"),
            ("redis+sentinel://a:26379/m?db=2", "only parameters"),
        ] {
            let err = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_redis_url_is_shown_without_its_password() {
        let url = StoreUrl::parse("redis://app:secret@db:6379/0").unwrap();
        assert!(!url.is_memory());
        assert_eq!(url.to_string(), "redis://db:6379/0");
        assert_eq!(format!("{url:?}"), r#"StoreUrl("redis://db:6379/0")"#);
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn redis_urls_need_the_redis_feature() {
        for url in ["redis://db:6379", "rediss-cluster://app:secret@a:1,b:2"] {
            let err = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains("built without the redis feature"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
