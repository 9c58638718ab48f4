//! The service as Envoy Gateway runs it, end to end: its configuration over xDS, from a
//! management server we did not write (`tests/it/python/xds_server.py`, Python grpcio, state
//! of the world) to sluicegate's ADS client; Envoy Gateway's golden rate-limit
//! configurations (their origin is in `tests/fixtures/envoy-gateway/SOURCES.md`) and the
//! decisions Envoy gets for requests on its routes; ACKs, NACKs, updates, a restarted
//! management server, TLS both ways; and the real binary under Envoy Gateway's own
//! deployment environment.

use crate::python;
use crate::server;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use python::run_python;
use serde_json::{Value, json};
use server::Server;
use sluicegate_test_support::certificates::{Authority, Issued};
use sluicegate_test_support::{RedisServer, free_port};

/// The longest wait for a management server or the client, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// The resource type the client asks for and the server sends.
const RATE_LIMIT_CONFIG: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Envoy Gateway's node id for its rate-limit Deployment (deployments/default.yaml).
const NODE: &str = "envoy-ratelimit";

/// RateLimitResponse.Code: OK, OVER_LIMIT.
const OK: i64 = 1;
const OVER_LIMIT: i64 = 2;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

/// `ratelimit-config/NAME.yaml`, an Envoy Gateway golden configuration.
fn golden(name: &str) -> PathBuf {
    fixture(&format!("envoy-gateway/ratelimit-config/{name}.yaml"))
}

/// An empty directory of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-xds-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a RateLimitConfig resource of ours, as YAML, to `dir/name.yaml`.
fn resource(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `tests/it/python/xds_server.py` as a process: what it was told, and every event it printed.
struct ManagementServer {
    child: Child,
    /// Closing it stops the server.
    stdin: Option<ChildStdin>,
    events: Arc<(Mutex<Vec<Value>>, Condvar)>,
    port: u16,
}

impl ManagementServer {
    /// Starts `xds_server.py ARGS` and waits until it listens.
    fn start(args: &[&str]) -> ManagementServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/python/xds_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let events: Arc<(Mutex<Vec<Value>>, Condvar)> = Arc::default();
        let told = Arc::clone(&events);
        std::thread::spawn(move || {
            let (lock, changed) = &*told;
            // A test that failed while it read the events leaves the lock poisoned; the
            // events are still whole.
            let push = |event| {
                lock.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(event);
                changed.notify_all();
            };
            for line in stdout.lines().map_while(Result::ok) {
                push(
                    serde_json::from_str(&line)
                        .unwrap_or_else(|_| json!({"event": "unreadable", "line": line})),
                );
            }
            push(json!({"event": "exited"}));
        });
        let mut server = ManagementServer {
            stdin: child.stdin.take(),
            child,
            events,
            port: 0,
        };
        let listening = server.wait_for("that it listens", |events| {
            events.iter().find(|e| e["event"] == "listening").cloned()
        });
        server.port = u16::try_from(listening["port"].as_u64().unwrap()).unwrap();
        server
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Waits, [`PATIENCE`] at most, until `found` finds something in the events so far.
    fn wait_for(&self, what: &str, found: impl Fn(&[Value]) -> Option<Value>) -> Value {
        let (lock, changed) = &*self.events;
        let deadline = Instant::now() + PATIENCE;
        let mut events = lock.lock().unwrap();
        loop {
            if let Some(value) = found(&events) {
                return value;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && events.last().is_none_or(|e| e["event"] != "exited"),
                "the management server never told {what}: {events:#?}"
            );
            events = changed.wait_timeout(events, left).unwrap().0;
        }
    }

    /// Every event so far.
    fn events(&self) -> Vec<Value> {
        self.events.0.lock().unwrap().clone()
    }

    /// Every DiscoveryRequest so far.
    fn requests(&self) -> Vec<Value> {
        let mut events = self.events();
        events.retain(|e| e["event"] == "request");
        events
    }

    /// Serves the RateLimitConfig documents of `files` as `version`.
    fn push(&mut self, version: &str, files: &[PathBuf]) {
        let before = self.events().len();
        let mut line = format!("push {version}");
        for file in files {
            line.push(' ');
            line.push_str(text(file));
        }
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let told = self.wait_for(&format!("the push of {version}"), |events| {
            events[before.min(events.len())..]
                .iter()
                .find(|e| e["event"] == "error" || e["version_info"] == version)
                .cloned()
        });
        assert_eq!(told["event"], "pushed", "{line}: {told}");
    }

    /// The nonces of the responses that carried `version`.
    fn nonces_of(events: &[Value], version: &str) -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["event"] == "response" && e["version_info"] == version)
            .map(|e| e["nonce"].clone())
            .collect()
    }

    /// Waits for the ACK of `version`: a request that names it, answering a response that
    /// carried it, with no error. That request.
    fn wait_for_ack(&self, version: &str) -> Value {
        self.wait_for(&format!("an ACK of {version}"), |events| {
            let nonces = Self::nonces_of(events, version);
            events
                .iter()
                .find(|e| {
                    e["event"] == "request"
                        && e["version_info"] == version
                        && nonces.contains(&e["response_nonce"])
                        && e["error_detail"].is_null()
                })
                .cloned()
        })
    }

    /// Waits for the NACK of `version`: a request answering a response that carried it,
    /// with an error. That request.
    fn wait_for_nack(&self, version: &str) -> Value {
        self.wait_for(&format!("a NACK of {version}"), |events| {
            let nonces = Self::nonces_of(events, version);
            events
                .iter()
                .find(|e| {
                    e["event"] == "request"
                        && nonces.contains(&e["response_nonce"])
                        && !e["error_detail"].is_null()
                })
                .cloned()
        })
    }
}

impl Drop for ManagementServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The flags that point `serve` at `management` for Envoy Gateway's node, retrying fast.
fn xds_flags(management: &ManagementServer) -> Vec<String> {
    [
        "--config-xds",
        &management.address(),
        "--config-xds-node-id",
        NODE,
        "--config-xds-retry-interval",
        "100ms",
        "--config-xds-backoff-initial",
        "100ms",
        "--config-xds-backoff-max",
        "300ms",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `serve` in this process, configured by `management`, with `extra` flags.
fn serve_from(management: &ManagementServer, extra: &[&str]) -> Server {
    let mut args = xds_flags(management);
    args.extend(extra.iter().map(|&a| a.to_owned()));
    Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Plays `steps` (see `tests/it/python/eg_route_check.py`) against `address` in one process,
/// over TLS trusting `ca` if given: per step, the domains called.
fn play(address: &str, ca: Option<&Path>, steps: &Value) -> Vec<Vec<Value>> {
    let steps = steps.to_string();
    let mut args = vec![address, steps.as_str()];
    args.extend(ca.map(text));
    let out = run_python("eg_route_check.py", &args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The overall codes of `times` calls of one descriptor in `domain` (a failed call: its
/// status's name).
fn codes(address: &str, domain: &str, entries: &[(&str, &str)], times: usize) -> Vec<Value> {
    let steps = json!([{"domain": domain, "descriptors": [entries], "times": times}]);
    let played = play(address, None, &steps);
    codes_of(&played[0][0])
}

fn codes_of(called: &Value) -> Vec<Value> {
    called["codes"].as_array().unwrap().clone()
}

/// `ok` OKs, then OVER_LIMIT up to `calls`.
fn answers(calls: usize, ok: usize) -> Vec<Value> {
    (0..calls)
        .map(|i| json!(if i < ok { OK } else { OVER_LIMIT }))
        .collect()
}

/// A request on a route of Envoy Gateway, as Envoy gets it, and what the rate-limit service
/// must answer.
struct RouteCall {
    route: &'static str,
    headers: &'static [(&'static str, &'static str)],
    remote_address: &'static str,
    /// The domain Envoy calls for this route.
    domain: &'static str,
    /// The descriptors Envoy sends, from the route's actions; none: Envoy does not call.
    descriptors: &'static [&'static [(&'static str, &'static str)]],
    calls: usize,
    /// How many of the calls are OK before they are OVER_LIMIT.
    ok: usize,
    /// The `requests_per_unit` of each status of the last call, from the golden file.
    limits: &'static [u32],
}

/// One golden configuration and the calls made, in order, on one fresh service.
struct GoldenCase {
    file: &'static str,
    calls: &'static [RouteCall],
}

const ANYWHERE: &str = "10.0.0.1";

/// The cases, each citing envoyproxy/gateway@d32f282
/// `internal/xds/translator/testdata/out/ratelimit-config/FILE.yaml` for its numbers.
const GOLDEN_CASES: &[GoldenCase] = &[
    // RequestHeaders: a counter per value of x-user-id, 5 per second (lines 4-12).
    GoldenCase {
        file: "distinct-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "alice")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[("first-route", "first-route"), ("rule-0-match-0", "alice")]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "bob")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[("first-route", "first-route"), ("rule-0-match-0", "bob")]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
        ],
    },
    // HeaderValueMatch: x-user-id "one", 5 per second (lines 4-12); another value is not
    // limited, so Envoy does not call.
    GoldenCase {
        file: "value-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "one")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "two")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[],
                calls: 1,
                ok: 0,
                limits: &[],
            },
        ],
    },
    // HeaderValueMatch on :method: GET and PUT share rule-0-method, 5 per second (lines
    // 8-12); POST has rule-1-method, 50 per second (lines 22-26).
    GoldenCase {
        file: "method-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[(":method", "GET")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-0-method", "rule-0-method"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[(":method", "PUT")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-0-method", "rule-0-method"),
                ]],
                calls: 3,
                ok: 2,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[(":method", "POST")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-1-method", "rule-1-method"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[50],
            },
        ],
    },
    // HeaderValueMatch on :path, exact and safe regex: both rules match foo/bar, two
    // descriptors of 5 per second each (lines 8-12, 22-26).
    GoldenCase {
        file: "path-match",
        calls: &[RouteCall {
            route: "first-route",
            headers: &[(":path", "foo/bar")],
            remote_address: ANYWHERE,
            domain: "first-listener",
            descriptors: &[
                &[
                    ("first-route", "first-route"),
                    ("rule-0-path", "rule-0-path"),
                ],
                &[
                    ("first-route", "first-route"),
                    ("rule-1-path", "rule-1-path"),
                ],
            ],
            calls: 6,
            ok: 5,
            limits: &[5, 5],
        }],
    },
    // QueryParameterValueMatch: ?user=alice with x-user-id "one", 5 per second (lines 4-16).
    GoldenCase {
        file: "query-parameters-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "one"), (":path", "/?user=alice")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-0-match-0", "rule-0-match-0"),
                    ("rule-0-match-1", "rule-0-match-1"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "one"), (":path", "/?user=bob")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[],
                calls: 1,
                ok: 0,
                limits: &[],
            },
        ],
    },
    // RemoteAddressMatch, masked: every address of 192.168.0.0/16 shares one counter of 5
    // per second (lines 4-12); an address outside is not limited.
    GoldenCase {
        file: "masked-remote-address-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "192.168.3.4",
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("masked_remote_address", "192.168.0.0/16"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "192.168.200.1",
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("masked_remote_address", "192.168.0.0/16"),
                ]],
                calls: 3,
                ok: 2,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[],
                calls: 1,
                ok: 0,
                limits: &[],
            },
        ],
    },
    // RemoteAddressMatch, distinct: a counter per address of 192.168.0.0/16, 5 per second
    // (lines 4-16).
    GoldenCase {
        file: "distinct-remote-address-match",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "192.168.3.4",
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("masked_remote_address", "192.168.0.0/16"),
                    ("remote_address", "192.168.3.4"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "192.168.3.5",
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("masked_remote_address", "192.168.0.0/16"),
                    ("remote_address", "192.168.3.5"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
        ],
    },
    // RemoteAddressMatch, inverted: addresses outside 192.168.0.0/24 share 5 per second
    // (lines 4-12); one inside is not limited.
    GoldenCase {
        file: "ratelimit-sourceip-invert",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "10.1.2.3",
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("masked_remote_address", "invert:192.168.0.0/24"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "first-route",
                headers: &[],
                remote_address: "192.168.0.9",
                domain: "first-listener",
                descriptors: &[],
                calls: 1,
                ok: 0,
                limits: &[],
            },
        ],
    },
    // Shared policies, each its own domain: first-route and second-route share
    // test-policy-1's 5 per second (lines 28-39); third-route has test-policy-2's 10
    // (lines 55-66); fourth-route the listener's 10 (lines 1-12).
    GoldenCase {
        file: "global-shared-multiple-shared-policies",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "one")],
                remote_address: ANYWHERE,
                domain: "test-namespace/test-policy-1",
                descriptors: &[&[
                    (
                        "test-namespace/test-policy-1/rule/0",
                        "test-namespace/test-policy-1/rule/0",
                    ),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[5],
            },
            RouteCall {
                route: "second-route",
                headers: &[("x-user-id", "one")],
                remote_address: ANYWHERE,
                domain: "test-namespace/test-policy-1",
                descriptors: &[&[
                    (
                        "test-namespace/test-policy-1/rule/0",
                        "test-namespace/test-policy-1/rule/0",
                    ),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 3,
                ok: 2,
                limits: &[5],
            },
            RouteCall {
                route: "third-route",
                headers: &[("x-user-id", "two")],
                remote_address: ANYWHERE,
                domain: "test-namespace/test-policy-2",
                descriptors: &[&[
                    (
                        "test-namespace/test-policy-2/rule/0",
                        "test-namespace/test-policy-2/rule/0",
                    ),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[10],
            },
            RouteCall {
                route: "fourth-route",
                headers: &[("x-user-id", "three")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("fourth-route", "fourth-route"),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 3,
                ok: 3,
                limits: &[10],
            },
        ],
    },
    // Month and year: 5 per month on first-route (lines 4-12), 1 per year on second-route
    // (lines 27-35).
    GoldenCase {
        file: "month-year-rule",
        calls: &[
            RouteCall {
                route: "first-route",
                headers: &[("x-user-id", "one")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("first-route", "first-route"),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 6,
                ok: 5,
                limits: &[5],
            },
            RouteCall {
                route: "second-route",
                headers: &[("x-user-id", "two")],
                remote_address: ANYWHERE,
                domain: "first-listener",
                descriptors: &[&[
                    ("second-route", "second-route"),
                    ("rule-0-match-0", "rule-0-match-0"),
                ]],
                calls: 2,
                ok: 1,
                limits: &[1],
            },
        ],
    },
    // Two GenericKeys, no match of a header: every request of the route, 5 per second
    // (lines 4-12).
    GoldenCase {
        file: "empty-header-matches",
        calls: &[RouteCall {
            route: "first-route",
            headers: &[],
            remote_address: ANYWHERE,
            domain: "first-listener",
            descriptors: &[&[
                ("first-route", "first-route"),
                ("rule-0-match--1", "rule-0-match--1"),
            ]],
            calls: 6,
            ok: 5,
            limits: &[5],
        }],
    },
];

/// Every one of Envoy Gateway's golden configurations is a configuration sluicegate takes
/// as Envoy Gateway runs it (`--compat envoy`: envoy's fixed windows, which take
/// multiple-rules.yaml's limit of 4294967295 that a sliding log cannot hold): pushed one
/// after the other to one running service, each is ACKed, none NACKed.
#[test]
fn every_envoy_gateway_golden_configuration_is_acked() {
    let mut management = ManagementServer::start(&["--node", NODE]);
    let dir = fixture("envoy-gateway/ratelimit-config");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter_map(|name| {
            let stem = name.strip_suffix(".yaml")?;
            (!stem.ends_with(".routes")).then(|| stem.to_owned())
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 26, "{names:?}");
    management.push(&names[0], &[golden(&names[0])]);
    let _server = serve_from(&management, &["--compat", "envoy"]);
    management.wait_for_ack(&names[0]);
    for name in &names[1..] {
        management.push(name, &[golden(name)]);
        management.wait_for_ack(name);
    }
    let nacks: Vec<Value> = management
        .requests()
        .into_iter()
        .filter(|r| !r["error_detail"].is_null())
        .collect();
    assert!(nacks.is_empty(), "{nacks:#?}");
}

/// For requests on Envoy Gateway's routes, the descriptors Envoy derives from the routes'
/// actions get the answers the golden configurations' numbers say, in the right domain:
/// within the limit OK, past it OVER_LIMIT, shared counters shared, distinct ones not. In
/// the default mode, whose sliding log counts the last second wherever it starts: envoy's
/// fixed seconds would split a burst that crosses a second's edge.
#[test]
fn envoy_gateway_routes_get_the_golden_configurations_answers() {
    let mut management = ManagementServer::start(&["--node", NODE]);
    for case in GOLDEN_CASES {
        management.push(case.file, &[golden(case.file)]);
        let server = serve_from(&management, &[]);
        management.wait_for_ack(case.file);
        let routes = fixture(&format!(
            "envoy-gateway/ratelimit-config/{}.routes.yaml",
            case.file
        ));
        let steps: Vec<Value> = case
            .calls
            .iter()
            .map(|call| {
                json!({
                    "routes": text(&routes),
                    "route": call.route,
                    "headers": call.headers.iter().map(|&(name, value)| (name.to_owned(), json!(value))).collect::<serde_json::Map<_, _>>(),
                    "remote_address": call.remote_address,
                    "times": call.calls,
                })
            })
            .collect();
        let played = play(&server.address, None, &Value::Array(steps));
        for (call, called) in case.calls.iter().zip(&played) {
            let at = format!("{} {} {:?}", case.file, call.route, call.headers);
            let called = called
                .iter()
                .find(|c| c["domain"] == call.domain)
                .unwrap_or_else(|| panic!("{at}: domain {} not called: {called:?}", call.domain));
            assert_eq!(called["descriptors"], json!(call.descriptors), "{at}");
            let want = if call.descriptors.is_empty() {
                Vec::new()
            } else {
                answers(call.calls, call.ok)
            };
            assert_eq!(codes_of(called), want, "{at}: {called}");
            let limits: Vec<Option<u64>> = called["limits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|status| status[1].as_u64())
                .collect();
            let want: Vec<Option<u64>> = call.limits.iter().map(|&l| Some(l.into())).collect();
            assert_eq!(limits, want, "{at}: {called}");
        }
    }
}

/// A descriptor in shadow mode (global-shadow-mode.yaml lines 20-29: 5 per second, shadow)
/// is answered OK past its limit, as envoyproxy/ratelimit@f2fb157
/// src/limiter/base_limiter.go:134-139 answers. Sent as the golden file names it: the
/// route's actions ask x-user-id to be both "one" and "two", which no request is.
#[test]
fn a_golden_shadow_mode_limit_answers_ok_past_it() {
    let mut management = ManagementServer::start(&["--node", NODE]);
    management.push("shadow", &[golden("global-shadow-mode")]);
    let server = serve_from(&management, &[]);
    management.wait_for_ack("shadow");
    let steps = json!([{
        "domain": "first-listener",
        "descriptors": [[
            ["first-route", "first-route"],
            ["rule-0-match-0", "rule-0-match-0"],
            ["rule-0-match-1", "rule-0-match-1"],
            ["rule-0-match-2", "rule-0-match-2"],
            ["masked_remote_address", "0.0.0.0/0"],
        ]],
        "times": 7,
    }]);
    let called = &play(&server.address, None, &steps)[0][0];
    assert_eq!(codes_of(called), answers(7, 7), "{called}");
    assert_eq!(called["limits"], json!([[OK, 5]]), "{called}");
}

/// Our own resources, for the scenarios: domain `users`, 2 an hour per user (an hour: a
/// fixed window of envoy's, under `--compat envoy`, is all but never crossed by a test).
const USERS: &str = "name: users
domain: users
descriptors:
  - key: user
    rate_limit: {unit: HOUR, requests_per_unit: 2}
";

/// The same domain, limited per team instead: 1 an hour.
const TEAMS: &str = "name: users
domain: users
descriptors:
  - key: team
    rate_limit: {unit: HOUR, requests_per_unit: 1}
";

/// A resource envoyproxy/ratelimit refuses (its loader: "duplicate descriptor composite
/// key", envoyproxy/ratelimit@f2fb157 test/config/config_test.go:379).
const DUPLICATE_KEY: &str = "name: users
domain: users
descriptors:
  - key: user
    rate_limit: {unit: HOUR, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: HOUR, requests_per_unit: 5}
";

/// The first push is ACKed with its version and nonce, by a client that says who it is
/// (node id, metadata, headers) and asks for RateLimitConfig; a second push replaces the
/// rules while the service runs.
#[test]
fn a_push_is_acked_and_an_update_applies_without_a_restart() {
    let dir = scratch("update");
    let mut management = ManagementServer::start(&["--node", NODE]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let server = serve_from(
        &management,
        &[
            "--config-xds-node-metadata",
            "cluster=ratelimit,zone=eu",
            "--config-xds-header",
            "x-tenant:blue",
        ],
    );
    let ack = management.wait_for_ack("v1");
    assert_eq!(ack["node"], NODE, "{ack}");
    assert_eq!(ack["type_url"], RATE_LIMIT_CONFIG, "{ack}");
    assert_eq!(
        ack["metadata"],
        json!({"cluster": "ratelimit", "zone": "eu"}),
        "{ack}"
    );
    assert_eq!(ack["headers"]["x-tenant"], "blue", "{ack}");
    // The stream opened with a request that had seen nothing yet.
    let first = &management.requests()[0];
    assert_eq!(
        (&first["version_info"], &first["response_nonce"]),
        (&json!(""), &json!("")),
        "{first}"
    );
    let address = &server.address;
    assert_eq!(codes(address, "users", &[("user", "u")], 3), answers(3, 2));

    management.push("v2", &[resource(&dir, "teams", TEAMS)]);
    management.wait_for_ack("v2");
    assert_eq!(codes(address, "users", &[("team", "t")], 2), answers(2, 1));
    assert_eq!(
        codes(address, "users", &[("user", "u")], 3),
        answers(3, 3),
        "v2 has no rule for user"
    );
}

/// State of the world: a push with no resource is a world with no rules, ACKed, and what
/// the last push limited is limited no more.
#[test]
fn an_empty_push_takes_every_rule_away() {
    let dir = scratch("empty");
    let mut management = ManagementServer::start(&["--node", NODE]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let server = serve_from(&management, &[]);
    management.wait_for_ack("v1");
    let address = &server.address;
    assert_eq!(codes(address, "users", &[("user", "u")], 3), answers(3, 2));

    management.push("v2", &[]);
    management.wait_for_ack("v2");
    assert_eq!(codes(address, "users", &[("user", "u")], 3), answers(3, 3));
}

/// A push the service cannot load is NACKed — the version it still runs, the nonce of the
/// refused response, an error detail — and the previous rules go on answering; the next
/// good push is ACKed.
#[test]
fn a_bad_push_is_nacked_and_the_previous_configuration_still_answers() {
    let dir = scratch("nack");
    let mut management = ManagementServer::start(&["--node", NODE]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let server = serve_from(&management, &[]);
    management.wait_for_ack("v1");

    management.push("v2", &[resource(&dir, "bad", DUPLICATE_KEY)]);
    let nack = management.wait_for_nack("v2");
    assert_eq!(
        nack["version_info"], "v1",
        "the version still in force: {nack}"
    );
    let message = nack["error_detail"]["message"].as_str().unwrap();
    assert!(!message.is_empty(), "{nack}");
    let address = &server.address;
    assert_eq!(codes(address, "users", &[("user", "u")], 3), answers(3, 2));

    management.push("v3", &[resource(&dir, "teams", TEAMS)]);
    management.wait_for_ack("v3");
    assert_eq!(codes(address, "users", &[("team", "t")], 2), answers(2, 1));
}

/// The management server stops: the rules it gave go on answering. It comes back on the
/// same address: the client reconnects by itself, says who it is again, and ACKs what the
/// new server serves.
#[test]
fn the_configuration_outlives_the_management_server_and_the_client_reconnects() {
    let dir = scratch("restart");
    // A port held for this test, so that nothing else takes it while the server is away.
    let port = free_port().to_string();
    let mut management = ManagementServer::start(&["--node", NODE, "--port", &port]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let server = serve_from(&management, &[]);
    management.wait_for_ack("v1");
    drop(management);

    let address = &server.address;
    assert_eq!(codes(address, "users", &[("user", "u")], 3), answers(3, 2));

    let mut restarted = ManagementServer::start(&["--node", NODE, "--port", &port]);
    restarted.push("v2", &[resource(&dir, "teams", TEAMS)]);
    let ack = restarted.wait_for_ack("v2");
    assert_eq!(ack["node"], NODE, "{ack}");
    assert_eq!(codes(address, "users", &[("team", "t")], 2), answers(2, 1));
}

/// TLS to a management server that asks for no client certificate: the client checks the
/// server's against `--config-xds-ca` and presents none.
#[test]
fn tls_to_the_management_server_without_a_client_certificate() {
    let dir = scratch("tls");
    let authority = Authority::new(&dir, "ca");
    let pair = authority.issue("envoy-gateway");
    let mut management =
        ManagementServer::start(&["--node", NODE, "--tls", text(&pair.cert), text(&pair.key)]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let ca = authority.cert();
    let server = serve_from(
        &management,
        &["--config-xds-tls", "--config-xds-ca", text(&ca)],
    );
    management.wait_for_ack("v1");
    assert_eq!(
        codes(&server.address, "users", &[("user", "u")], 3),
        answers(3, 2)
    );
}

/// mTLS with the management server, both ways: a server that requires a client certificate
/// of its authority gets the client's and serves it; a server whose certificate comes from
/// an authority the client does not trust is refused, and nothing it serves is used.
#[test]
fn mtls_to_the_management_server_both_ways() {
    let dir = scratch("mtls");
    let authority = Authority::new(&dir, "ca");
    let management_pair = authority.issue("envoy-gateway");
    let client = authority.issue("envoy-ratelimit");
    let ca = authority.cert();
    let tls_args = |pair: &Issued| {
        [
            "--node",
            NODE,
            "--tls",
            text(&pair.cert),
            text(&pair.key),
            "--client-ca",
            text(&ca),
        ]
        .map(str::to_owned)
    };
    let client_flags = [
        "--config-xds-tls",
        "--config-xds-ca",
        text(&ca),
        "--config-xds-client-cert",
        text(&client.cert),
        "--config-xds-client-key",
        text(&client.key),
    ];

    let args = tls_args(&management_pair);
    let mut management = ManagementServer::start(&args.each_ref().map(String::as_str));
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let server = serve_from(&management, &client_flags);
    let ack = management.wait_for_ack("v1");
    assert_eq!(ack["node"], NODE, "{ack}");
    assert_eq!(
        codes(&server.address, "users", &[("user", "u")], 3),
        answers(3, 2)
    );
    drop(server);

    let stranger = Authority::new(&dir, "stranger").issue("impostor");
    let args = tls_args(&stranger);
    let mut impostor = ManagementServer::start(&args.each_ref().map(String::as_str));
    impostor.push("v1", &[resource(&dir, "users", USERS)]);
    let mut flags = xds_flags(&impostor);
    flags.push("--start-without-config".to_owned());
    flags.extend(client_flags.map(str::to_owned));
    let refusing = Server::binary(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    // The client says why it cannot use the management server: its certificate.
    let told = refusing.wait_for_log(|line| {
        let lower = line.to_lowercase();
        line.contains("WARN")
            && line.contains("xDS")
            && ["certificate", "issuer", "handshake"]
                .iter()
                .any(|word| lower.contains(word))
    });
    assert!(
        impostor.requests().is_empty(),
        "{told}: {:#?}",
        impostor.requests()
    );
    let answered = codes(&refusing.address, "users", &[("user", "u")], 3);
    assert!(
        !answered.contains(&json!(OVER_LIMIT)),
        "rules from an untrusted server: {answered:?}"
    );
}

/// `--start-without-config` (envoy's FORCE_START_WITHOUT_INITIAL_CONFIG): the service
/// listens before the first push, but decides nothing until it comes — every check fails
/// UNAVAILABLE, so Envoy's failure mode decides, as envoyproxy/ratelimit fails it
/// (envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:118-121) — and takes the push
/// when it comes.
#[test]
fn start_without_config_serves_before_the_first_push() {
    let dir = scratch("force-start");
    let mut management = ManagementServer::start(&["--node", NODE]);
    let server = serve_from(&management, &["--start-without-config"]);
    management.wait_for("the client's first request", |events| {
        events.iter().find(|e| e["event"] == "request").cloned()
    });
    let (status, body) = server.request("GET", "/healthcheck", "");
    assert_eq!(status, 200, "{body}");
    let before = codes(&server.address, "users", &[("user", "early")], 3);
    assert_eq!(before, vec![json!("UNAVAILABLE"); 3]);

    management.push("v1", &[resource(&dir, "users", USERS)]);
    management.wait_for_ack("v1");
    assert_eq!(
        codes(&server.address, "users", &[("user", "u")], 3),
        answers(3, 2)
    );
}

/// Without it, as envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:467-471 waits for
/// the first configuration before it serves: the binary, connected to a management server
/// that has nothing yet, does not answer the probe; after the first push it does, with
/// those rules.
#[test]
fn without_start_without_config_nothing_is_served_before_the_first_push() {
    let dir = scratch("wait-start");
    let mut management = ManagementServer::start(&["--node", NODE]);
    let address = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["serve".to_owned(), "--listen".to_owned(), address.clone()];
    args.extend(xds_flags(&management));
    let binary = Binary::spawn(Command::new(env!("CARGO_BIN_EXE_sluicegate")).args(&args));
    management.wait_for("the client's first request", |events| {
        events.iter().find(|e| e["event"] == "request").cloned()
    });
    let early = server::request_to(&address, "GET", "/healthcheck", "", &[]);
    assert!(
        !matches!(early, Ok((200, _))),
        "answered before any configuration: {early:?}"
    );

    management.push("v1", &[resource(&dir, "users", USERS)]);
    management.wait_for_ack("v1");
    wait_until_healthy(&address, &binary);
    assert_eq!(codes(&address, "users", &[("user", "u")], 3), answers(3, 2));
}

/// The binary as a child process, its standard error kept; killed when dropped.
struct Binary {
    child: Mutex<Child>,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Binary {
    fn spawn(command: &mut Command) -> Binary {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let logs: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Binary {
            child: Mutex::new(child),
            logs,
        }
    }

    /// How it ended and what it logged, if it has ended.
    fn exited(&self) -> Option<String> {
        let status = self.child.lock().unwrap().try_wait().unwrap()?;
        Some(format!("{status}: {:#?}", self.logs.lock().unwrap()))
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Polls `GET /healthcheck` at `address` until it is 200, [`PATIENCE`] at most, while
/// `binary` runs.
fn wait_until_healthy(address: &str, binary: &Binary) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match server::request_to(address, "GET", "/healthcheck", "", &[]) {
            Ok((200, _)) => return,
            answer => {
                if let Some(why) = binary.exited() {
                    panic!("the service exited: {why}");
                }
                assert!(
                    Instant::now() < deadline,
                    "never healthy at {address}: {answer:?}"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `env` of the container of Envoy Gateway's rate-limit Deployment
/// (deployments/default.yaml), in order.
fn envoy_gateway_environment() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(fixture("envoy-gateway/deployments/default.yaml")).unwrap();
    let deployment: Value = serde_saphyr::from_str(&text).unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "envoy-ratelimit");
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|variable| {
            let name = variable["name"].as_str().unwrap().to_owned();
            let value = variable["value"].as_str().unwrap().to_owned();
            (name, value)
        })
        .collect()
}

/// envoyproxy/ratelimit's listener variables (HOST, PORT, GRPC_*, DEBUG_*) on free ports
/// of the loopback, and the addresses they make.
struct EnvoyListeners {
    variables: Vec<(String, String)>,
    http: String,
    grpc: String,
}

impl EnvoyListeners {
    fn on_loopback() -> EnvoyListeners {
        let (http, grpc, debug) = (free_port(), free_port(), free_port());
        let variables = [
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", http.to_string()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            ("GRPC_PORT", grpc.to_string()),
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", debug.to_string()),
        ]
        .map(|(name, value)| (name.to_owned(), value))
        .to_vec();
        EnvoyListeners {
            variables,
            http: format!("127.0.0.1:{http}"),
            grpc: format!("127.0.0.1:{grpc}"),
        }
    }
}

/// envoyproxy/ratelimit's xDS variables (src/settings/settings.go:58-82) reach the
/// management server as envoy's own client sends them: the node id, the node metadata
/// (`k=v` pairs, src/provider/xds_grpc_sotw_provider.go:190-203), the additional headers
/// (envconfig's `k1:v1,k2:v2` map) on the stream; Go's durations are taken; and without
/// FORCE_START_WITHOUT_INITIAL_CONFIG the service serves once the first push is in.
#[test]
fn envoys_xds_variables_reach_the_management_server() {
    let dir = scratch("xds-variables");
    let mut management = ManagementServer::start(&["--node", "rls-7"]);
    management.push("v1", &[resource(&dir, "users", USERS)]);
    let redis = RedisServer::start(&[]);
    let listeners = EnvoyListeners::on_loopback();
    let mut env: Vec<(String, String)> = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", management.address()),
        ("CONFIG_GRPC_XDS_NODE_ID", "rls-7".to_owned()),
        (
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "cluster=ratelimit,zone=eu".to_owned(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-tenant:blue,x-team:red".to_owned(),
        ),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "1m30s".to_owned(),
        ),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1m30s".to_owned()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]
    .map(|(name, value)| (name.to_owned(), value))
    .to_vec();
    env.extend(listeners.variables.iter().cloned());
    let binary = Binary::spawn(
        Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--compat", "envoy"])
            .env_clear()
            .envs(env.iter().map(|(n, v)| (n, v))),
    );
    wait_until_healthy(&listeners.http, &binary);
    let ack = management.wait_for_ack("v1");
    assert_eq!(ack["node"], "rls-7", "{ack}");
    assert_eq!(
        ack["metadata"],
        json!({"cluster": "ratelimit", "zone": "eu"}),
        "{ack}"
    );
    assert_eq!(
        (&ack["headers"]["x-tenant"], &ack["headers"]["x-team"]),
        (&json!("blue"), &json!("red")),
        "{ack}"
    );
    assert_eq!(
        codes(&listeners.grpc, "users", &[("user", "u")], 3),
        answers(3, 2)
    );
}

/// The binary under Envoy Gateway's deployment environment, verbatim but for the ports and
/// paths (the addresses of this machine; the certificate Secret made here by one authority,
/// as Envoy Gateway's is): it starts and stays up, takes its configuration from an mTLS
/// management server as node `envoy-ratelimit`, speaks only TLS on its gRPC port — to a
/// client without a certificate too, since envoyproxy/ratelimit does not read
/// GRPC_SERVER_TLS_CA_CERT — answers the kubelet's plain-HTTP probe on PORT, decides as the
/// golden configuration says, keeps its counts in REDIS_URL's Redis and serves `/metrics`
/// on PROMETHEUS_ADDR, named by the mapping file of Envoy Gateway's ConfigMap.
#[test]
fn envoy_gateways_deployment_environment() {
    let dir = scratch("deployment");
    let environment = envoy_gateway_environment();
    let names: Vec<&str> = environment.iter().map(|(n, _)| n.as_str()).collect();
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ] {
        assert!(
            environment.contains(&(name.to_owned(), value.to_owned())),
            "{name}={value} not in {names:?}"
        );
    }

    // The Secret mounted at /certs: one pair for the gRPC listener and the xDS client.
    let certs = dir.join("certs");
    let authority = Authority::new(&certs, "ca");
    let pair = authority.issue("tls");
    let management_pair = authority.issue("envoy-gateway");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::create_dir_all(dir.join("etc/statsd-exporter")).unwrap();
    std::fs::copy(
        fixture("envoy-gateway/deployments/statsd_conf.yaml"),
        dir.join("etc/statsd-exporter/conf.yaml"),
    )
    .unwrap();
    assert!(pair.cert.ends_with("certs/tls.crt") && pair.key.ends_with("certs/tls.key"));

    let ca = certs.join("ca.crt");
    let mut management = ManagementServer::start(&[
        "--node",
        NODE,
        "--tls",
        text(&management_pair.cert),
        text(&management_pair.key),
        "--client-ca",
        text(&ca),
    ]);
    management.push("eg-1", &[golden("month-year-rule")]);
    let redis = RedisServer::start(&[]);
    let prometheus = free_port();
    let mut env: Vec<(String, String)> = environment
        .into_iter()
        .map(|(name, value)| {
            let value = match name.as_str() {
                "CONFIG_GRPC_XDS_SERVER_URL" => management.address(),
                "REDIS_URL" => format!("127.0.0.1:{}", redis.port),
                "PROMETHEUS_ADDR" => format!("127.0.0.1:{prometheus}"),
                _ => match value.strip_prefix('/') {
                    Some(path) => text(&dir.join(path)).to_owned(),
                    None => value,
                },
            };
            (name, value)
        })
        .collect();
    // The Deployment leaves the listeners at envoy's defaults (8080, 8081, 6070 on every
    // interface); here, free ports of the loopback.
    let listeners = EnvoyListeners::on_loopback();
    env.extend(listeners.variables.iter().cloned());

    let binary = Binary::spawn(
        Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--compat", "envoy"])
            .env_clear()
            .envs(env.iter().map(|(n, v)| (n, v))),
    );

    wait_until_healthy(&listeners.http, &binary);
    let ack = management.wait_for_ack("eg-1");
    assert_eq!(ack["node"], NODE, "{ack}");

    // TLS only on the gRPC port: a plaintext call gets no answer.
    let grpc = &listeners.grpc;
    let plaintext = run_python("rls_check.py", &[grpc, "first-listener", "k", "v"]);
    assert!(plaintext.starts_with("UNAVAILABLE\n"), "{plaintext}");

    // month-year-rule.yaml: second-route 1 a year (lines 27-35), first-route 5 a month
    // (lines 4-12), counted by envoy's fixed windows under --compat envoy.
    let routes = fixture("envoy-gateway/ratelimit-config/month-year-rule.routes.yaml");
    let step = |route: &str, user: &str, times: usize| {
        json!({"routes": text(&routes), "route": route, "headers": {"x-user-id": user},
               "remote_address": ANYWHERE, "times": times})
    };
    let played = play(
        grpc,
        Some(&ca),
        &json!([
            step("second-route", "two", 2),
            step("first-route", "one", 6)
        ]),
    );
    assert_eq!(codes_of(&played[0][0]), answers(2, 1), "{played:?}");
    assert_eq!(codes_of(&played[1][0]), answers(6, 5), "{played:?}");
    assert!(binary.exited().is_none(), "the service is still up");

    let keys: u64 = redis
        .query(&sluicegate_test_support::cmd("DBSIZE"))
        .unwrap();
    assert!(keys > 0, "nothing in REDIS_URL's Redis");
    let scraped = server::request_to(
        &format!("127.0.0.1:{prometheus}"),
        "GET",
        "/metrics",
        "",
        &[],
    );
    let (status, metrics) = scraped.unwrap();
    assert_eq!(status, 200, "{metrics}");
    // Envoy's statistics under the names and labels of Envoy Gateway's mapping file.
    for counted in [
        "total_hits{domain=\"first-listener\",key1=\"second-route_second-route\",key2=\"rule-0-match-0_rule-0-match-0\"} 2",
        "over_limit{domain=\"first-listener\",key1=\"second-route_second-route\",key2=\"rule-0-match-0_rule-0-match-0\"} 1",
        "total_hits{domain=\"first-listener\",key1=\"first-route_first-route\",key2=\"rule-0-match-0_rule-0-match-0\"} 6",
        "within_limit{domain=\"first-listener\",key1=\"first-route_first-route\",key2=\"rule-0-match-0_rule-0-match-0\"} 5",
    ] {
        let line = format!("ratelimit_service_rate_limit_{counted}\n");
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
}
