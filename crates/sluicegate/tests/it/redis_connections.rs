//! The connection strings a deployment uses: TLS with its own authority, TLS with a client
//! certificate, an ACL user and password, a unix socket — each against a real
//! redis-server started here.

#![cfg(feature = "redis")]

use std::path::Path;
use std::time::Duration;

use sluicegate::{
    Algorithm, Check, Limit, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
    TlsClientIdentity,
};
use sluicegate_test_support as support;

fn rule() -> Rule {
    Rule::new(
        "conn",
        &RuleSpec::new(Algorithm::SlidingLog, 2, Duration::from_secs(60)),
    )
    .unwrap()
}

async fn decides(store: &RedisStore) {
    let rule = rule();
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let first = store.check(&Check::new(&limits, 1)).await.unwrap().decision;
    assert!(first.allowed);
    assert_eq!(first.remaining, 1);
}

fn config(url: &str, test: &str) -> RedisStoreConfig {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = format!("conn:{test}:{}:", std::process::id());
    config.timeout = Duration::from_secs(2);
    config
}

/// A redis-server speaking TLS alone, with a certificate of a new authority made in the
/// temporary directory `name`; `auth_clients` is its `tls-auth-clients` (`yes`: a client
/// must present a certificate of that authority). Its URL, the authority and the server.
fn tls_redis(
    name: &str,
    auth_clients: &str,
) -> (
    String,
    support::certificates::Authority,
    support::RedisServer,
) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let authority = support::certificates::Authority::new(&dir, "ca");
    let server_cert = authority.issue("server");
    let tls_port = support::free_port();
    let path = |path: &Path| path.display().to_string();
    let (cert, key, ca) = (
        path(&server_cert.cert),
        path(&server_cert.key),
        path(&authority.cert()),
    );
    let tls_port_arg = tls_port.to_string();
    let server = support::RedisServer::start(&[
        "--tls-port",
        &tls_port_arg,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        auth_clients,
    ]);
    (format!("rediss://127.0.0.1:{tls_port}"), authority, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_deployments_own_authority() {
    let (url, authority, _server) = tls_redis("sluicegate-tls", "no");
    let mut trusted = config(&url, "tls");
    trusted.tls_ca = Some(std::fs::read(authority.cert()).unwrap());
    decides(&RedisStore::connect(trusted).await.expect("TLS with the CA")).await;

    // Without the authority the server's certificate is not trusted: a typed error.
    let err = RedisStore::connect(config(&url, "tls-untrusted"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
}

/// A Redis that asks clients for a certificate (`tls-auth-clients yes`) answers one that
/// presents a certificate of its authority, and refuses one without, or with a
/// certificate of another authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let (url, authority, _server) = tls_redis("sluicegate-mtls", "yes");
    let identity = |issued: &support::certificates::Issued| TlsClientIdentity {
        cert: std::fs::read(&issued.cert).unwrap(),
        key: std::fs::read(&issued.key).unwrap(),
    };
    let with = |test: &str, client: Option<TlsClientIdentity>| {
        let mut config = config(&url, test);
        config.tls_ca = Some(std::fs::read(authority.cert()).unwrap());
        config.tls_client = client;
        config
    };

    let client = identity(&authority.issue("client"));
    let store = RedisStore::connect(with("mtls", Some(client)))
        .await
        .expect("TLS with a client certificate of the authority");
    decides(&store).await;

    let elsewhere =
        std::env::temp_dir().join(format!("sluicegate-mtls-other-{}", std::process::id()));
    let stranger = support::certificates::Authority::new(&elsewhere, "other").issue("stranger");
    for (test, client) in [
        ("mtls-none", None),
        ("mtls-stranger", Some(identity(&stranger))),
    ] {
        let err = RedisStore::connect(with(test, client)).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable { .. }),
            "{test}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_and_password() {
    // Each word of the ACL rule is its own argument.
    let server =
        support::RedisServer::start(&["--user", "limiter", "on", ">s3cret", "~*", "&*", "+@all"]);
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}", server.port);
    decides(
        &RedisStore::connect(config(&url, "acl"))
            .await
            .expect("the ACL user"),
    )
    .await;
    let wrong = format!("redis://limiter:nope@127.0.0.1:{}", server.port);
    let err = RedisStore::connect(config(&wrong, "acl-wrong"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(
        !err.to_string().contains("nope"),
        "the password is not in the error: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket() {
    let socket = std::env::temp_dir().join(format!("sluicegate-{}.sock", std::process::id()));
    let socket_arg = socket.display().to_string();
    let _server =
        support::RedisServer::start(&["--unixsocket", &socket_arg, "--unixsocketperm", "700"]);
    let url = format!("redis+unix://{}", socket.display());
    decides(
        &RedisStore::connect(config(&url, "unix"))
            .await
            .expect("the unix socket"),
    )
    .await;
}

/// Every connection to Redis has Nagle's algorithm off: a check is a few hundred bytes, and
/// with Nagle on, one sent while the previous one is unacknowledged waits for its ACK. Read
/// back from the kernel on this process's own sockets to each server.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_to_redis_sets_tcp_nodelay() {
    // Servers of its own: the sockets are told apart by the servers' ports, and other tests'
    // connections to the shared servers need not set TCP_NODELAY.
    let server = support::RedisServer::start(&[]);
    let cluster = support::RedisCluster::start(3, 0);
    let single = RedisStore::connect(config(&server.url(), "nodelay"))
        .await
        .unwrap();
    let clustered = RedisStore::connect(config(&cluster.url(), "nodelay"))
        .await
        .unwrap();
    decides(&single).await;
    decides(&clustered).await;
    let mut ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    ports.push(server.port);
    let to_redis: Vec<_> = support::own_tcp_sockets()
        .into_iter()
        .filter(|s| ports.contains(&s.peer.port()))
        .collect();
    assert!(
        to_redis.iter().any(|s| s.peer.port() == server.port),
        "no connection to the server: {to_redis:?}"
    );
    assert!(
        to_redis.iter().any(|s| s.peer.port() != server.port),
        "no connection to the cluster: {to_redis:?}"
    );
    assert!(to_redis.iter().all(|s| s.nodelay), "{to_redis:?}");
}
