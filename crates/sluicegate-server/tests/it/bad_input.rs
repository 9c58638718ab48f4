//! Bad input over a real socket: every refusal is the API's JSON error, with its status.

use crate::server;

use server::Server;

const CHECK: &str =
    r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"dora"}]}]}"#;

/// The largest body the API reads.
const MAX_BODY_BYTES: usize = 256 * 1024;

/// `CHECK` padded with trailing spaces (still valid JSON) to `len` bytes.
fn padded(len: usize) -> String {
    format!("{CHECK}{}", " ".repeat(len - CHECK.len()))
}

/// A body of 256 KiB is read; one byte more is refused with 413 and a JSON error, on
/// each endpoint that reads a body.
#[test]
fn a_body_over_256_kib_is_a_json_413() {
    let server = Server::start(&["--admin-token", "secret"]);
    let (status, body) = server.request("POST", "/v1/check", &padded(MAX_BODY_BYTES));
    assert_eq!(status, 200, "{body}");
    for path in ["/v1/check", "/json", "/v1/reset"] {
        let (status, body) = server.request("POST", path, &padded(MAX_BODY_BYTES + 1));
        assert_eq!(status, 413, "{path}: {body}");
        let error: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body:?}"));
        assert_eq!(
            error["error"], "request body: larger than 262144 bytes",
            "{path}: {body}"
        );
    }
    assert!(server.stop().success());
}
