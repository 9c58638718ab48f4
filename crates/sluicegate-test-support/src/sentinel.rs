//! A Sentinel deployment of real servers: one master, one replica, and sentinels watching
//! them (each a redis-server in sentinel mode) — in plain text and open to anyone, or over
//! TLS only, or with ACL users, or both.

use std::time::Duration;

use redis::{Value, cmd};

use crate::certificates::Authority;
use crate::poll::poll_until;
use crate::server::{Access, RedisServer};

/// One master, its replica, and the sentinels that monitor them as
/// [`MASTER_NAME`](Self::MASTER_NAME), all on loopback ports.
pub struct RedisSentinel {
    /// The master the sentinels were told to monitor.
    pub master: RedisServer,
    /// A replica of the master: the one a failover promotes.
    pub replica: RedisServer,
    /// The sentinels; query them with `SENTINEL …` commands.
    pub sentinels: Vec<RedisServer>,
}

/// How [`RedisSentinel::start_with`] sets a deployment up.
pub struct SentinelOptions<'a> {
    /// How many sentinels (≥ 1); a majority of them is the quorum.
    pub sentinels: usize,
    /// Every server and sentinel speaks TLS only (replication and the sentinels' own links
    /// too), with a certificate this authority signs; clients need not show one.
    pub tls: Option<&'a Authority>,
    /// The master and the replica require the ACL user [`RedisSentinel::USER`] (their
    /// default user is off), and the sentinels their own, [`RedisSentinel::SENTINEL_USER`].
    pub acl: bool,
}

impl RedisSentinel {
    /// The name the sentinels know the master by.
    pub const MASTER_NAME: &'static str = "sluicegate";
    /// With [`SentinelOptions::acl`]: the user the master and the replica require.
    pub const USER: &'static str = "sluicegate";
    /// [`USER`](Self::USER)'s password.
    pub const PASSWORD: &'static str = "secret";
    /// With [`SentinelOptions::acl`]: the user the sentinels require.
    pub const SENTINEL_USER: &'static str = "watcher";
    /// [`SENTINEL_USER`](Self::SENTINEL_USER)'s password.
    pub const SENTINEL_PASSWORD: &'static str = "watch-secret";

    /// Starts a plain-text deployment open to anyone with `sentinels` sentinels: see
    /// [`start_with`](Self::start_with).
    pub fn start(sentinels: usize) -> RedisSentinel {
        RedisSentinel::start_with(&SentinelOptions {
            sentinels,
            tls: None,
            acl: false,
        })
    }

    /// Starts the master, the replica and the sentinels as `options` say; a master that
    /// stops answering for one second is down. Returns once the replica is in sync and
    /// every sentinel knows the master, the replica and the other sentinels — the state a
    /// failover needs.
    pub fn start_with(options: &SentinelOptions<'_>) -> RedisSentinel {
        assert!(options.sentinels >= 1, "a deployment needs a sentinel");
        let tls_ca = options
            .tls
            .map(|authority| std::fs::read(authority.cert()).expect("the authority's certificate"));
        let tls = options.tls.map_or(String::new(), tls_config);
        let access = |user: &str, password: &str| Access {
            tls_ca: tls_ca.clone(),
            user: options.acl.then(|| (user.to_owned(), password.to_owned())),
        };
        let (user, password) = (RedisSentinel::USER, RedisSentinel::PASSWORD);
        let server_config = if options.acl {
            // The replica (and a demoted master) authenticates to its master as the user.
            format!(
                "{tls}{}masteruser {user}\nmasterauth {password}\n",
                acl(user, password)
            )
        } else {
            tls.clone()
        };
        let server_access = access(user, password);
        let master = RedisServer::start_configured(&server_config, &[], server_access.clone());
        let master_port = master.port.to_string();
        let replica = RedisServer::start_configured(
            &server_config,
            &["--replicaof", "127.0.0.1", &master_port],
            server_access,
        );
        let in_sync = poll_until(Duration::from_secs(10), || {
            replica
                .query::<String>(cmd("INFO").arg("replication"))
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        assert!(in_sync, "the replica on {} did not sync", replica.port);

        let name = RedisSentinel::MASTER_NAME;
        let quorum = options.sentinels / 2 + 1;
        // A sentinel that started a failover and lost the election (the votes split, or
        // the machine is too loaded for an answer in time) tries again only after twice
        // the failover timeout: six minutes by default. Ten seconds keeps the retry within
        // a test's patience, and still gives a loopback promotion ample time to finish.
        let mut config = format!(
            "{tls}sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 10000\n"
        );
        let (sentinel_user, sentinel_password) = (
            RedisSentinel::SENTINEL_USER,
            RedisSentinel::SENTINEL_PASSWORD,
        );
        if options.acl {
            // The servers' user for the master and its replicas; the sentinels' own user
            // for one another.
            config += &format!(
                "sentinel auth-user {name} {user}\nsentinel auth-pass {name} {password}\n\
                 {}sentinel sentinel-user {sentinel_user}\n\
                 sentinel sentinel-pass {sentinel_password}\n",
                acl(sentinel_user, sentinel_password)
            );
        }
        let sentinel_access = access(sentinel_user, sentinel_password);
        let sentinels: Vec<RedisServer> = (0..options.sentinels)
            .map(|_| {
                RedisServer::start_configured(&config, &["--sentinel"], sentinel_access.clone())
            })
            .collect();
        // Sentinels learn of the replica from the master's INFO and of each other from
        // hello messages on the master, every few seconds.
        let count = |sentinel: &RedisServer, what: &str| {
            sentinel
                .query::<Vec<Value>>(cmd("SENTINEL").arg(what).arg(name))
                .map_or(0, |found| found.len())
        };
        let acquainted = poll_until(Duration::from_secs(30), || {
            sentinels.iter().all(|sentinel| {
                count(sentinel, "replicas") == 1
                    && count(sentinel, "sentinels") == sentinels.len() - 1
            })
        });
        assert!(
            acquainted,
            "the sentinels did not discover the replica and each other"
        );
        RedisSentinel {
            master,
            replica,
            sentinels,
        }
    }

    /// Every sentinel's log, each under its port: for the message of a test whose failover
    /// did not happen, since the sentinels' log lines (`+odown`, `+elected-leader`,
    /// `-failover-abort-…`, `+tilt`) say which step stalled.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|sentinel| format!("--- sentinel on {} ---\n{}", sentinel.port, sentinel.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The configuration lines of a server or sentinel that speaks TLS only, with one
/// certificate `authority` signs for every process, to clients and to one another alike.
fn tls_config(authority: &Authority) -> String {
    let issued = authority.issue("sentinel-deployment");
    format!(
        "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
         tls-auth-clients no\ntls-replication yes\n",
        issued.cert.display(),
        issued.key.display(),
        authority.cert().display()
    )
}

/// The configuration lines that turn the default user off and let only `user` in, to
/// everything.
fn acl(user: &str, password: &str) -> String {
    format!("user default off\nuser {user} on >{password} ~* &* +@all\n")
}
