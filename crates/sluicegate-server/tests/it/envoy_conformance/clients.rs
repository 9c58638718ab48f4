//! The two clients that play a case's steps against a running server: tonic with
//! `envoy-types`' stubs, and Python's grpcio with `xds-protos`' stubs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use super::cases::{Case, Mode};
use super::judge;

pub(crate) trait Client {
    /// Plays `case`'s steps against the server at `address`: `Ok`, or the first step whose
    /// answer is not the one expected and why.
    fn run(&mut self, case: &Case, mode: Mode, address: &str) -> Result<(), String>;
}

pub(crate) struct RustClient;

impl Client for RustClient {
    fn run(&mut self, case: &Case, mode: Mode, address: &str) -> Result<(), String> {
        // A runtime per case: dropping it closes the connection, so the server's
        // shutdown has no request in flight to wait for.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = RateLimitServiceClient::connect(format!("http://{address}"))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            for (n, step) in case.steps.iter().enumerate() {
                for i in 0..step.repeat {
                    let answer = client
                        .should_rate_limit(judge::request(step, i))
                        .await
                        .map(tonic::Response::into_inner);
                    judge::judge(step, i, mode, answer)
                        .map_err(|e| format!("step {n}, request {i}: {e}"))?;
                }
            }
            Ok(())
        })
    }
}

/// `tests/it/python/envoy_conformance.py`, one process for a whole suite: it reads the same
/// case files, is told on its standard input which case to play against which address,
/// and answers each with one JSON line.
pub(crate) struct PythonClient {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl PythonClient {
    pub(crate) fn start() -> PythonClient {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/python/envoy_conformance.py"
        );
        let mut child = Command::new("python3")
            .arg(script)
            .arg(super::cases::dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 (scripts/test installs grpcio, xds-protos and pyyaml)");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        PythonClient {
            child,
            input,
            output,
        }
    }
}

impl Client for PythonClient {
    fn run(&mut self, case: &Case, mode: Mode, address: &str) -> Result<(), String> {
        let ask = serde_json::json!({"case": case.id, "mode": mode.name(), "address": address});
        writeln!(self.input, "{ask}").expect("the python runner reads its input");
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        assert!(
            !line.is_empty(),
            "the python runner exited (scripts/test installs grpcio, xds-protos and pyyaml): {:?}",
            self.child.try_wait()
        );
        let answer: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the python runner answered {line:?}: {e}"));
        match answer["failure"].as_str() {
            None => Ok(()),
            Some(failure) => Err(failure.to_owned()),
        }
    }
}

impl Drop for PythonClient {
    fn drop(&mut self) {
        // It keeps nothing worth an orderly end: its answers are all read.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
