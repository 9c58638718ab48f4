//! The connection strings a deployment uses: TLS with its own authority, an ACL user and
//! password, a unix socket — each against a real redis-server started here.

#![cfg(feature = "redis")]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluicegate::{
    Algorithm, Check, Limit, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support as support;

fn rule() -> Rule {
    Rule::new("conn", &RuleSpec::new(Algorithm::SlidingLog, 2, 60_000_000)).unwrap()
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

/// A certificate authority and a server certificate for 127.0.0.1, made with openssl.
fn certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect(
                "openssl is needed: run scripts/test (it installs it) or apt-get install openssl",
            );
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=sluicegate test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_deployments_own_authority() {
    let dir = std::env::temp_dir().join(format!("sluicegate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = |name: &str| dir.join(name).display().to_string();
    let (cert, key, ca) = (path("server.crt"), path("server.key"), path("ca.crt"));
    let tls_port_arg = tls_port.to_string();
    let _server = support::RedisServer::start(&[
        "--tls-port",
        &tls_port_arg,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let mut trusted = config(&url, "tls");
    trusted.tls_ca = Some(std::fs::read(dir.join("ca.crt")).unwrap());
    decides(&RedisStore::connect(trusted).await.expect("TLS with the CA")).await;

    // Without the authority the server's certificate is not trusted: a typed error.
    let err = RedisStore::connect(config(&url, "tls-untrusted"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
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
