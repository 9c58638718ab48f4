//! The service on a free loopback port, for end-to-end tests: in this process through
//! `sluicegate_server::serve` (the same flags as `sluicegate serve`), or as the real
//! binary where the process itself is under test (signals, exit status).

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluicegate_server::cli::ServeArgs;

/// `sluicegate serve`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    serve: ServeArgs,
}

enum Running {
    /// `serve` on a runtime of its own thread; dropping the sender stops it.
    InProcess {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<JoinHandle<anyhow::Result<()>>>,
    },
    Binary(Child),
}

pub struct Server {
    running: Running,
    /// A binary's standard error, line by line, as it comes.
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub address: String,
    /// With --grpc-listen: the gRPC-only address.
    pub grpc_address: Option<String>,
    /// With --debug-listen: the probes' and metrics' own address.
    pub debug_address: Option<String>,
}

/// How a server ended.
pub struct Stopped {
    success: bool,
}

impl Stopped {
    /// It stopped cleanly: exit status 0, or `serve` returned `Ok`.
    pub fn success(&self) -> bool {
        self.success
    }
}

impl Server {
    /// Serves `--listen 127.0.0.1:0 ARGS` in this process and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        Server::try_start(args).unwrap_or_else(|e| panic!("serve {args:?}: {e}"))
    }

    /// [`Server::start`], but flags that do not parse and a start that fails (a
    /// configuration that does not load, a store that cannot be opened) are an `Err` with
    /// the reason, for tests that expect some starts to fail.
    pub fn try_start(args: &[&str]) -> Result<Server, String> {
        let flags = Flags::try_parse_from(
            ["serve", "--listen", "127.0.0.1:0"]
                .iter()
                .chain(args)
                .copied(),
        )
        .map_err(|e| e.to_string())?;
        let (addresses, bound) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                // Loaded before the address is told: a test may edit the files at once.
                let prepared = sluicegate_server::prepare(flags.serve.options()?).await?;
                let listeners = flags.serve.listeners().await?;
                let main = listeners.main.local_addr()?.to_string();
                let address_of = |listener: &Option<tokio::net::TcpListener>| {
                    listener
                        .as_ref()
                        .map(|l| l.local_addr().map(|a| a.to_string()))
                        .transpose()
                };
                let grpc = address_of(&listeners.grpc_only)?;
                let debug = address_of(&listeners.debug)?;
                let _ = addresses.send((main, grpc, debug));
                prepared
                    .serve(listeners, async move {
                        let _ = stopped.await;
                    })
                    .await
            })
        });
        let Ok((address, grpc_address, debug_address)) = bound.recv() else {
            let failed = thread.join().expect("the server thread does not panic");
            return Err(match failed {
                Err(e) => format!("did not start: {e:#}"),
                Ok(()) => "serve returned before it listened".to_owned(),
            });
        };
        Ok(Server {
            logs: Default::default(),
            running: Running::InProcess {
                stop: Some(stop),
                thread: Some(thread),
            },
            address,
            grpc_address,
            debug_address,
        })
    }

    /// Starts the real binary, `sluicegate serve --listen 127.0.0.1:0 ARGS`, and waits for
    /// the addresses it logs.
    pub fn binary(args: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluicegate"));
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args);
        Server::spawn(command, args)
    }

    /// [`Server::binary`] with these environment variables set.
    pub fn binary_with_env(args: &[&str], env: &[(String, String)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluicegate"));
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)));
        Server::spawn(command, args)
    }

    /// [`Server::binary`] under a descriptor limit set by the shell's `ulimit` (`-Sn 64`:
    /// the soft limit only; `-n 64`: soft and hard).
    pub fn binary_with_ulimit(ulimit: &str, args: &[&str]) -> Server {
        let mut command = Command::new("sh");
        command
            .args(["-c", &format!("ulimit {ulimit} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args);
        Server::spawn(command, args)
    }

    fn spawn(mut command: Command, args: &[&str]) -> Server {
        let wants_grpc = args.contains(&"--grpc-listen");
        let wants_debug = args.contains(&"--debug-listen");
        let mut child = command
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (mut address, mut grpc_address, mut debug_address) = (None, None, None);
        for line in lines.by_ref().map_while(Result::ok) {
            // Text lines carry `address=…`; JSON lines (`--log-format json`) a field.
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) {
                let field = |name: &str| json["fields"][name].as_str().map(str::to_owned);
                address = address.or(field("address"));
                grpc_address = grpc_address.or(field("grpc_address"));
            }
            for word in line.split_whitespace() {
                if let Some(a) = word.strip_prefix("grpc_address=") {
                    grpc_address = Some(a.to_owned());
                } else if let Some(a) = word.strip_prefix("debug_address=") {
                    debug_address = Some(a.to_owned());
                } else if let Some(a) = word.strip_prefix("address=") {
                    address = Some(a.to_owned());
                }
            }
            logs.lock().unwrap().push(line);
            if address.is_some()
                && (grpc_address.is_some() || !wants_grpc)
                && (debug_address.is_some() || !wants_debug)
            {
                break;
            }
        }
        // Keep reading stderr so the server never blocks on a full pipe.
        let kept = std::sync::Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Server {
            logs,
            running: Running::Binary(child),
            address: address.expect("the server logs its address"),
            grpc_address,
            debug_address,
        }
    }

    /// Waits, 10 s at most, until a line of the binary's standard error satisfies `wanted`;
    /// that line.
    pub fn wait_for_log(&self, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // A copy, so that `wanted` may read the logs too.
            let lines = self.logs();
            if let Some(line) = lines.iter().find(|l| wanted(l)) {
                return line.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no such log line in {lines:#?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Every line of the binary's standard error so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The process id of a server started with [`Server::binary`].
    pub fn pid(&self) -> u32 {
        match &self.running {
            Running::Binary(child) => child.id(),
            Running::InProcess { .. } => panic!("an in-process server has no process of its own"),
        }
    }

    /// Sends `signal` (`TERM`, `INT`, …) to a server started with [`Server::binary`].
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Waits up to `limit` for a server started with [`Server::binary`] to exit: its exit
    /// code (`None` if a signal killed it), or `Err` if it still runs.
    pub fn exit_code_within(&mut self, limit: std::time::Duration) -> Result<Option<i32>, ()> {
        let Running::Binary(child) = &mut self.running else {
            panic!("an in-process server has no process of its own");
        };
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                return Ok(status.code());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Err(())
    }

    /// One HTTP/1.1 request, from a real client on a connection of its own: the status and
    /// the body. Blocks; call it from a test thread, not from inside a runtime.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.request_with_headers(method, path, body, &[])
    }

    /// [`Server::request`] with these headers added.
    pub fn request_with_headers(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        request_to(&self.address, method, path, body, headers)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// The value of a counter or gauge of `GET /metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        let (_, text) = self.request("GET", "/metrics", "");
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in\n{text}"))
    }

    /// Waits, 10 s at most (the server reloads on its own time), until the metric `name`
    /// reaches `want`.
    pub fn wait_for_metric(&self, name: &str, want: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.metric(name) < want {
            assert!(
                std::time::Instant::now() < deadline,
                "{name} never reached {want}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Stops the server — SIGTERM for the binary, the shutdown future for an in-process
    /// one — and says how it ended.
    pub fn stop(mut self) -> Stopped {
        match &mut self.running {
            Running::Binary(child) => {
                let pid = child.id().to_string();
                let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
                assert!(killed.success());
                Stopped {
                    success: child.wait().unwrap().success(),
                }
            }
            Running::InProcess { stop, thread } => {
                drop(stop.take());
                let ended = thread.take().unwrap().join().expect("serve does not panic");
                Stopped {
                    success: ended.is_ok(),
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        match &mut self.running {
            Running::Binary(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Running::InProcess { stop, thread } => {
                drop(stop.take());
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }
}

/// One HTTP/1.1 request to `address`, from a real client on a connection of its own: the
/// status and the body, or why no answer came (nothing listens, the connection broke).
/// Blocks; call it from a test thread, not from inside a runtime.
pub fn request_to(
    address: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut request = axum::http::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(axum::body::Bytes::from(body.to_owned())))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    })
}

/// Envoy's `ShouldRateLimit` request in `domain` of one descriptor of `pairs`, each
/// descriptor adding `hits` (0: Envoy's default, one).
pub fn rls_request(domain: &str, pairs: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }],
        hits_addend: hits,
    }
}
