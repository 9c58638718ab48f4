//! TLS on the service's listeners, from TLS clients of other stacks: curl (OpenSSL) for
//! HTTP/1.1 and HTTP/2, Python's grpcio (BoringSSL) for gRPC; mTLS; a certificate swapped
//! while the service runs.

use crate::server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::certificates::{Authority, Issued};

/// The longest wait for a reload, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(10);

const CHECK: &str =
    r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;

/// An empty directory of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-tls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The service over TLS with `pair`, and `extra` flags.
fn tls_server(pair: &Issued, extra: &[&str]) -> Server {
    let mut args = vec!["--tls-cert", text(&pair.cert), "--tls-key", text(&pair.key)];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// curl's exit status (0: an answer) and what it printed.
fn curl(args: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is needed: run scripts/test (it installs it) or apt-get install curl");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), printed)
}

/// `GET /healthz` over TLS, trusting `authority`, with a client certificate if given.
fn healthz(server: &Server, authority: &Authority, client: Option<&Issued>) -> (i32, String) {
    let url = format!("https://{}/healthz", server.address);
    let ca = authority.cert();
    let mut args = vec!["--cacert", text(&ca)];
    if let Some(client) = client {
        args.extend(["--cert", text(&client.cert), "--key", text(&client.key)]);
    }
    args.push(&url);
    curl(&args)
}

/// One ShouldRateLimit from Python's grpcio over TLS: what tests/it/python/rls_check.py printed.
fn grpc_check(server: &Server, authority: &Authority, client: Option<&Issued>) -> String {
    grpc_check_at(&server.address, Some(authority), client)
}

/// One ShouldRateLimit from Python's grpcio to `address`, over TLS trusting `authority`
/// (with the client certificate `client`), or in plaintext without one.
fn grpc_check_at(address: &str, authority: Option<&Authority>, client: Option<&Issued>) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/python/rls_check.py");
    let mut python = Command::new("python3");
    python.args([script, address, "example", "user", "carol"]);
    if let Some(authority) = authority {
        python.env("RLS_CHECK_CA", authority.cert());
    }
    if let Some(client) = client {
        python
            .env("RLS_CHECK_CERT", &client.cert)
            .env("RLS_CHECK_KEY", &client.key);
    }
    let out = python.output().expect("python3");
    assert!(
        out.status.success(),
        "python grpcio call failed (scripts/test installs grpcio and xds-protos): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// curl checks over TLS on HTTP/1.1 and on HTTP/2; a client that does not trust the
/// authority, or speaks plain HTTP, gets no answer.
#[test]
fn http_over_tls_from_curl() {
    let dir = scratch("curl");
    let authority = Authority::new(&dir, "ca");
    let server = tls_server(&authority.issue("server"), &[]);
    let url = format!("https://{}/v1/check", server.address);
    for version in ["--http1.1", "--http2"] {
        let (status, answer) = curl(&[
            version,
            "--cacert",
            text(&authority.cert()),
            "-H",
            "content-type: application/json",
            "-d",
            CHECK,
            "-w",
            " %{http_version}",
            &url,
        ]);
        assert_eq!(status, 0, "{answer}");
        assert!(answer.contains(r#""allowed":true"#), "{answer}");
        let spoken = if version == "--http2" { " 2" } else { " 1.1" };
        assert!(answer.ends_with(spoken), "{version}: {answer}");
    }
    let (status, answer) = curl(&[&url, "-d", CHECK]);
    assert_eq!(status, 60, "an untrusted certificate: {answer}");
    let (status, answer) = curl(&[&format!("http://{}/healthz", server.address)]);
    assert_ne!(status, 0, "plain HTTP on a TLS port: {answer}");
}

/// Python's grpcio calls the rate-limit service over TLS.
#[test]
fn grpc_over_tls_from_python_grpcio() {
    let dir = scratch("grpcio");
    let authority = Authority::new(&dir, "ca");
    let server = tls_server(&authority.issue("server"), &[]);
    let answer = grpc_check(&server, &authority, None);
    assert!(answer.starts_with("1\n"), "{answer}");
    // Trusting another authority, the call fails.
    let stranger = Authority::new(&dir, "stranger");
    let refused = grpc_check(&server, &stranger, None);
    assert!(refused.starts_with("UNAVAILABLE\n"), "{refused}");
}

/// With --tls-client-ca, clients without a certificate of that authority are refused in
/// the handshake, and counted; those with one are answered, over HTTP and gRPC.
#[test]
fn mtls_refuses_clients_without_a_trusted_certificate() {
    let dir = scratch("mtls");
    let authority = Authority::new(&dir, "ca");
    let ca = authority.cert();
    let server = tls_server(&authority.issue("server"), &["--tls-client-ca", text(&ca)]);
    let client = authority.issue("client");
    let stranger = Authority::new(&dir, "other").issue("stranger");

    let (status, answer) = healthz(&server, &authority, Some(&client));
    assert_eq!((status, answer.as_str()), (0, "ok\n"));
    for refused in [None, Some(&stranger)] {
        let (status, answer) = healthz(&server, &authority, refused);
        assert_ne!(
            status, 0,
            "answered without a trusted client certificate: {answer}"
        );
    }
    assert!(grpc_check(&server, &authority, Some(&client)).starts_with("1\n"));
    let refused = grpc_check(&server, &authority, None);
    assert!(refused.starts_with("UNAVAILABLE\n"), "{refused}");

    let url = format!("https://{}/metrics", server.address);
    let (_, metrics) = curl(&[
        "--cacert",
        text(&ca),
        "--cert",
        text(&client.cert),
        "--key",
        text(&client.key),
        &url,
    ]);
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluicegate_tls_handshake_failures_total "))
        .unwrap_or_else(|| panic!("no handshake failures counted in\n{metrics}"));
    assert!(failures.parse::<u32>().unwrap() >= 3, "{failures}");
}

/// Two authorities, a pair of each, and the files the service is started on (holding the
/// first pair), for the tests that replace them while it runs.
struct Rotation {
    first_ca: Authority,
    second_ca: Authority,
    second: Issued,
    live: Issued,
}

impl Rotation {
    fn new(test: &str) -> Rotation {
        let dir = scratch(test);
        let (first_ca, second_ca) = (
            Authority::new(&dir, "first"),
            Authority::new(&dir, "second"),
        );
        let (first, second) = (first_ca.issue("one"), second_ca.issue("two"));
        let live = Issued {
            cert: dir.join("live.crt"),
            key: dir.join("live.key"),
        };
        install(&live, &first);
        Rotation {
            first_ca,
            second_ca,
            second,
            live,
        }
    }
}

/// Copies `pair` over the files of `live`, key first.
fn install(live: &Issued, pair: &Issued) {
    std::fs::copy(&pair.key, &live.key).unwrap();
    std::fs::copy(&pair.cert, &live.cert).unwrap();
}

/// Replacing the certificate and key files while the service runs: new handshakes present
/// the new certificate.
#[test]
fn a_swapped_certificate_is_used_for_new_handshakes() {
    let Rotation {
        first_ca,
        second_ca,
        second,
        live,
        ..
    } = Rotation::new("swap");
    let server = tls_server(&live, &["--reload-interval", "100ms"]);
    assert_eq!(healthz(&server, &first_ca, None).0, 0);
    assert_eq!(healthz(&server, &second_ca, None).0, 60);

    install(&live, &second);
    let start = Instant::now();
    while healthz(&server, &second_ca, None).0 != 0 {
        assert!(
            start.elapsed() < PATIENCE,
            "the new certificate is not served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(healthz(&server, &first_ca, None).0, 60);
}

/// A certificate file half-written by a deployment is rejected once, logged, and the pair in
/// force keeps serving; the finished file is then put in force.
#[test]
fn a_broken_certificate_keeps_the_previous_one_serving() {
    let Rotation {
        first_ca,
        second_ca,
        second,
        live,
    } = Rotation::new("broken");
    // The real binary: its log is read.
    let server = Server::binary(&[
        "--tls-cert",
        text(&live.cert),
        "--tls-key",
        text(&live.key),
        "--reload-interval",
        "100ms",
    ]);

    let half = std::fs::read(&second.cert).unwrap();
    std::fs::write(&live.cert, &half[..half.len() / 2]).unwrap();
    server.wait_for_log(|line| line.contains("TLS certificate rejected"));
    assert_eq!(healthz(&server, &first_ca, None).0, 0);

    install(&live, &second);
    server.wait_for_log(|line| line.contains("TLS certificate reloaded"));
    assert_eq!(healthz(&server, &second_ca, None).0, 0);
    let rejections = server
        .logs()
        .iter()
        .filter(|line| line.contains("TLS certificate rejected"))
        .count();
    assert_eq!(rejections, 1, "one broken file is logged once");
}

/// Certificate files that cannot be read stop the start, saying which.
#[test]
fn a_missing_certificate_stops_the_start() {
    let dir = scratch("missing");
    let key = Authority::new(&dir, "ca").issue("server").key;
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-key", text(&key)])
        .args(["--tls-cert", text(&dir.join("absent.crt"))])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("cannot read") && said.contains("absent.crt"),
        "{said}"
    );
}

/// The service with TLS on its gRPC port alone (`--grpc-tls-*`, envoy's
/// GRPC_SERVER_USE_TLS), `extra` flags too.
fn grpc_tls_server(pair: &Issued, extra: &[&str]) -> Server {
    let mut args = vec![
        "--grpc-listen",
        "127.0.0.1:0",
        "--grpc-tls-cert",
        text(&pair.cert),
        "--grpc-tls-key",
        text(&pair.key),
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// With --grpc-tls-cert, the gRPC port answers over TLS and refuses plaintext; the main
/// port stays plain HTTP (its probes answer) and answers gRPC PERMISSION_DENIED, so no
/// gRPC is served past the TLS.
#[test]
fn grpc_tls_is_on_the_grpc_port_alone() {
    let dir = scratch("grpc-port");
    let authority = Authority::new(&dir, "ca");
    let server = grpc_tls_server(&authority.issue("server"), &[]);
    let grpc = server.grpc_address.clone().expect("a gRPC address");

    let answer = grpc_check_at(&grpc, Some(&authority), None);
    assert!(answer.starts_with("1\n"), "{answer}");
    let plaintext = grpc_check_at(&grpc, None, None);
    assert!(plaintext.starts_with("UNAVAILABLE\n"), "{plaintext}");

    let (status, answer) = curl(&[&format!("http://{}/healthz", server.address)]);
    assert_eq!((status, answer.as_str()), (0, "ok\n"));
    let refused = grpc_check_at(&server.address, None, None);
    assert!(
        refused.starts_with("PERMISSION_DENIED\n")
            && refused.contains("gRPC is served over TLS on the gRPC port"),
        "{refused}"
    );
}

/// mTLS on the gRPC port: a client without a certificate, or with one of another
/// authority, is refused in the handshake; one of the authority is answered.
#[test]
fn grpc_mtls_refuses_clients_without_a_trusted_certificate() {
    let dir = scratch("grpc-mtls");
    let authority = Authority::new(&dir, "ca");
    let ca = authority.cert();
    let server = grpc_tls_server(
        &authority.issue("server"),
        &["--grpc-tls-client-ca", text(&ca)],
    );
    let grpc = server.grpc_address.clone().expect("a gRPC address");
    let client = authority.issue("client");
    let stranger = Authority::new(&dir, "other").issue("stranger");

    let answer = grpc_check_at(&grpc, Some(&authority), Some(&client));
    assert!(answer.starts_with("1\n"), "{answer}");
    for refused in [None, Some(&stranger)] {
        let answer = grpc_check_at(&grpc, Some(&authority), refused);
        assert!(answer.starts_with("UNAVAILABLE\n"), "{answer}");
    }
}

/// With --grpc-tls-client-san, a client certificate of the authority that does not carry
/// the name is refused too (envoy's GRPC_CLIENT_TLS_SAN).
#[test]
fn grpc_mtls_refuses_a_client_certificate_without_the_name() {
    let dir = scratch("grpc-san");
    let authority = Authority::new(&dir, "ca");
    let ca = authority.cert();
    let server = grpc_tls_server(
        &authority.issue("server"),
        &[
            "--grpc-tls-client-ca",
            text(&ca),
            "--grpc-tls-client-san",
            "envoy.gateway.example",
        ],
    );
    let grpc = server.grpc_address.clone().expect("a gRPC address");
    let named = authority.issue_for("named", "DNS:envoy.gateway.example");
    let other = authority.issue_for("other-name", "DNS:someone.else.example");

    let answer = grpc_check_at(&grpc, Some(&authority), Some(&named));
    assert!(answer.starts_with("1\n"), "{answer}");
    let refused = grpc_check_at(&grpc, Some(&authority), Some(&other));
    assert!(refused.starts_with("UNAVAILABLE\n"), "{refused}");
}
