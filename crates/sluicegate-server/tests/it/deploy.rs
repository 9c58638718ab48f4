//! The Dockerfile, the Kubernetes manifests of deploy/kubernetes and the Envoy example of
//! deploy/envoy name paths, ports and flags; no container runtime runs here, so this reads
//! them and checks each against the binary itself: it is started with the flags and the
//! environment they give, on the configuration laid out as the kubelet mounts it, and the
//! probe paths, the check and Envoy's gRPC call are made against it. The release binary's
//! link order, which the image builds, is held to the build it was written for.

use crate::server;

use server::Server;

use std::path::{Path, PathBuf};
use std::process::Command;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn workspace(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// What crates/sluicegate-server/symbol-order.txt says it was written for: its `# NAME: `
/// line.
fn link_order_written_for(name: &str) -> String {
    let text =
        std::fs::read_to_string(workspace("crates/sluicegate-server/symbol-order.txt")).unwrap();
    let prefix = format!("# {name}: ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("symbol-order.txt has no {prefix:?} line"))
        .to_owned()
}

/// The release binary's link order (build.rs) names functions by their symbols, whose hashes
/// follow the compiler's version and the packages' versions, features and profile: a list
/// written for another build lays nothing out, and nothing says so. Whoever changes the
/// version, the lock file or the manifests writes the list again (the Dockerfile's compiler:
/// `the_dockerfile_builds_locked_and_runs_what_the_binary_accepts`).
#[test]
fn the_link_order_is_written_for_this_version_lock_file_and_manifests() {
    let rerun = "write it again with scripts/symbol-order \
                 (docs/BENCHMARKS.md, \"The service's memory and allocations\")";
    let sha256 = |bytes: &[u8]| crate::hex(&Sha256::digest(bytes));
    assert_eq!(
        link_order_written_for("version"),
        env!("CARGO_PKG_VERSION"),
        "{rerun}"
    );
    let lock = std::fs::read(workspace("Cargo.lock")).unwrap();
    assert_eq!(
        link_order_written_for("Cargo.lock"),
        format!("sha256 {}", sha256(&lock)),
        "{rerun}"
    );
    // "sha256 DIGEST (FILE FILE …)": the digest of the files, one after another.
    let manifests = link_order_written_for("manifests");
    let (digest, files) = manifests
        .strip_prefix("sha256 ")
        .and_then(|rest| rest.split_once(" ("))
        .and_then(|(digest, files)| Some((digest, files.strip_suffix(')')?)))
        .unwrap_or_else(|| panic!("manifests: {manifests:?}"));
    let files: Vec<&str> = files.split(' ').collect();
    assert!(files.contains(&"Cargo.toml"), "{files:?}");
    let joined: Vec<u8> = files
        .iter()
        .flat_map(|file| std::fs::read(workspace(file)).unwrap())
        .collect();
    assert_eq!(sha256(&joined), digest, "{files:?}: {rerun}");
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(workspace(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value at a JSON pointer, which must be there.
fn at<'a>(value: &'a Value, pointer: &str) -> &'a Value {
    value
        .pointer(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {value}"))
}

fn strings(value: &Value) -> Vec<String> {
    let items = value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"));
    items
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// The value following `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args.iter().position(|a| a == flag);
    at.and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
}

/// `serve`'s arguments with `--listen`'s and `--config`'s values put aside: the test
/// listens on a free loopback port and reads the configuration from where it laid it.
fn serve_args(args: &[String], config: &Path) -> Vec<String> {
    assert_eq!(args.first().map(String::as_str), Some("serve"), "{args:?}");
    let mut rest = Vec::new();
    let mut words = args[1..].iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "--listen" => {
                words.next();
            }
            "--config" => {
                words.next();
                rest.extend(["--config".to_owned(), config.display().to_string()]);
            }
            _ => rest.push(word.clone()),
        }
    }
    rest
}

/// `files` written into `dir` the way the kubelet mounts a ConfigMap: the files in a
/// timestamped directory, `..data` a link to it, and each name a link through `..data`.
fn mount_like_the_kubelet(dir: &Path, files: &[(String, String)]) {
    let version = dir.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&version).unwrap();
    std::os::unix::fs::symlink(version.file_name().unwrap(), dir.join("..data")).unwrap();
    for (name, text) in files {
        std::fs::write(version.join(name), text).unwrap();
        std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name)).unwrap();
    }
}

/// A ConfigMap update as the kubelet makes it: the new files in a new directory, then
/// `..data` replaced by a link to it in one rename.
fn swap_like_the_kubelet(dir: &Path, files: &[(String, String)]) {
    let version = dir.join("..2026_01_01_00_00_01.000000002");
    std::fs::create_dir_all(&version).unwrap();
    for (name, text) in files {
        std::fs::write(version.join(name), text).unwrap();
    }
    std::os::unix::fs::symlink(version.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-deploy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The probes answer on the paths given, each with its own answer: an unknown path also
/// answers 200 (as an unimplemented gRPC call), so the status alone proves nothing.
fn assert_probes(server: &Server, paths: &[&str]) {
    for path in paths {
        let expected = match *path {
            "/healthz" => "ok",
            "/readyz" => "ready",
            other => panic!("{other} is not a probe path of the service"),
        };
        let (status, body) = server.request("GET", path, "");
        assert_eq!((status, body.trim()), (200, expected), "GET {path}");
    }
}

/// The Deployment, with the Service and the ConfigMap it names: every port and path
/// agrees, and the binary serves what they say started as the Deployment starts it.
#[test]
fn the_kubernetes_manifests_name_what_the_binary_serves() {
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let service = yaml("deploy/kubernetes/service.yaml");
    let config_map = yaml("deploy/kubernetes/configmap.yaml");
    let pod = at(&deployment, "/spec/template/spec");
    let container = at(pod, "/containers/0");
    let args = strings(at(container, "/args"));

    // Non-root, as the image is.
    assert_eq!(at(pod, "/securityContext/runAsNonRoot"), true);
    assert_ne!(at(pod, "/securityContext/runAsUser"), 0);

    // One port: --listen's, the container's, the probes' and the Service's target.
    let listen = flag(&args, "--listen");
    assert!(
        listen.starts_with("0.0.0.0:"),
        "{listen}: reachable from outside the pod"
    );
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let port_name = at(container, "/ports/0/name").as_str().unwrap();
    assert_eq!(at(container, "/ports/0/containerPort"), port);
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            at(container, &format!("/{probe}/httpGet/port")),
            port_name,
            "{probe}"
        );
    }
    assert_eq!(at(&service, "/spec/ports/0/targetPort"), port_name);
    assert_eq!(
        at(&service, "/spec/selector"),
        at(&deployment, "/spec/template/metadata/labels")
    );

    // The ConfigMap is mounted where --config reads.
    let mount = at(container, "/volumeMounts/0");
    assert_eq!(at(mount, "/mountPath"), flag(&args, "--config"));
    let volume = at(pod, "/volumes/0");
    assert_eq!(at(volume, "/name"), at(mount, "/name"));
    assert_eq!(
        at(volume, "/configMap/name"),
        at(&config_map, "/metadata/name")
    );

    // Started as the Deployment starts it, on the ConfigMap as mounted.
    let files: Vec<(String, String)> = at(&config_map, "/data")
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, text)| (name.clone(), text.as_str().unwrap().to_owned()))
        .collect();
    let config = scratch("configmap");
    mount_like_the_kubelet(&config, &files);
    let env: Vec<(String, String)> = at(container, "/env")
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = at(e, "/name").as_str().unwrap().to_owned();
            (name, at(e, "/value").as_str().unwrap().to_owned())
        })
        .collect();
    let serve = serve_args(&args, &config);
    let server =
        Server::binary_with_env(&serve.iter().map(String::as_str).collect::<Vec<_>>(), &env);
    let probe_paths = ["livenessProbe", "readinessProbe"].map(|probe| {
        at(container, &format!("/{probe}/httpGet/path"))
            .as_str()
            .unwrap()
            .to_owned()
    });
    assert_probes(
        &server,
        &probe_paths.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // The rules in force are the ConfigMap's, not the built-in example.
    let (_, rules) = server.request("GET", "/v1/rules", "");
    assert!(rules.contains("remote_address"), "{rules}");
    assert!(!rules.contains("search"), "{rules}");

    // A ConfigMap edit: the kubelet writes a new directory and swaps `..data` to it.
    let edited: Vec<(String, String)> = files
        .iter()
        .map(|(name, text)| (name.clone(), text.replace("remote_address", "client_ip")))
        .collect();
    swap_like_the_kubelet(&config, &edited);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server
        .request("GET", "/v1/rules", "")
        .1
        .contains("client_ip")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the edit was not reloaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        server.stop().success(),
        "SIGTERM within the grace period ends it cleanly"
    );
}

/// The Dockerfile: multi-stage, locked, non-root on a minimal base, and its command is
/// one the binary accepts, serving the probes on the port it exposes.
#[test]
fn the_dockerfile_builds_locked_and_runs_what_the_binary_accepts() {
    let text = std::fs::read_to_string(workspace("Dockerfile")).unwrap();
    // Instructions, continuation lines joined, comments dropped.
    let joined = text.replace("\\\n", " ");
    let instructions: Vec<(&str, &str)> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    let all = |name: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter(|(i, _)| *i == name)
            .map(|(_, a)| *a)
            .collect()
    };
    let stages = all("FROM");
    assert!(stages.len() >= 2, "multi-stage: {stages:?}");
    assert!(stages.last().unwrap().contains("distroless"), "{stages:?}");
    // The build stage's toolchain is the one the binary's link order names functions for.
    let toolchain = link_order_written_for("rustc");
    let version = toolchain.split(' ').nth(1).expect("rustc VERSION (…)");
    assert!(
        stages[0].starts_with(&format!("rust:{version}-")),
        "the image builds with {stages:?}, the link order is written for {toolchain}"
    );
    assert!(
        all("RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "built with the lock file"
    );
    let user = all("USER").last().copied().expect("a USER");
    assert!(
        !user.starts_with("root") && !user.starts_with('0'),
        "{user}"
    );

    let json_array = |name: &str| -> Vec<String> {
        let value: Value = serde_json::from_str(all(name).last().unwrap()).unwrap();
        strings(&value)
    };
    let entrypoint = json_array("ENTRYPOINT");
    let command = json_array("CMD");
    // The binary is copied to where the entrypoint runs it.
    assert!(
        all("COPY")
            .iter()
            .any(|c| c.ends_with(&format!(" {}", entrypoint[0]))),
        "{entrypoint:?}"
    );
    // envoyproxy/ratelimit's command runs the same binary (invoked as `ratelimit`, it is
    // `serve --compat envoy`: tests/it/envoy_env.rs).
    let source_of = |to: &str| {
        all("COPY")
            .iter()
            .find_map(|c| c.strip_suffix(&format!(" {to}")))
            .map(|from| from.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(source_of("/bin/ratelimit"), source_of(&entrypoint[0]));
    let listen = flag(&command, "--listen");
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    assert_eq!(all("EXPOSE"), [listen.rsplit_once(':').unwrap().1]);
    // The image's own rules are copied into the directory --config reads.
    let config_dir = flag(&command, "--config");
    let copied = all("COPY")
        .into_iter()
        .find_map(|c| {
            c.split_once(' ')
                .filter(|(_, to)| to.starts_with(config_dir))
        })
        .expect("rules copied under --config");
    let config = scratch("image");
    let name = Path::new(copied.1).file_name().unwrap();
    std::fs::copy(workspace(copied.0), config.join(name)).unwrap();

    let serve = serve_args(&command, &config);
    let server = Server::binary(&serve.iter().map(String::as_str).collect::<Vec<_>>());
    assert_probes(&server, &["/healthz", "/readyz"]);
    assert!(server.stop().success());
}

/// Envoy's example points at the Service's name and port over HTTP/2, asks for the
/// ConfigMap's domain, and each descriptor its actions make matches a rule: asked over
/// gRPC as Envoy asks, each is decided by a rule of its own.
#[test]
fn the_envoy_example_asks_what_the_deployment_answers() {
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let service = yaml("deploy/kubernetes/service.yaml");
    let config_map = yaml("deploy/kubernetes/configmap.yaml");
    let filters = at(
        &envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config",
    );
    // The edge makes its own request ids: a client's x-request-id never reaches a report.
    assert_eq!(at(filters, "/use_remote_address"), true);
    assert_eq!(at(filters, "/preserve_external_request_id"), false);
    let ratelimit = at(filters, "/http_filters/0/typed_config");
    let cluster_name = at(
        ratelimit,
        "/rate_limit_service/grpc_service/envoy_grpc/cluster_name",
    );
    let clusters = at(&envoy, "/static_resources/clusters").as_array().unwrap();
    let cluster = clusters
        .iter()
        .find(|c| at(c, "/name") == cluster_name)
        .expect("the rate-limit cluster");
    let socket = at(
        cluster,
        "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address",
    );
    assert_eq!(at(socket, "/address"), at(&service, "/metadata/name"));
    assert_eq!(
        at(socket, "/port_value"),
        at(&service, "/spec/ports/0/port")
    );
    let options = at(cluster, "/typed_extension_protocol_options").to_string();
    assert!(
        options.contains("http2_protocol_options"),
        "gRPC needs HTTP/2: {options}"
    );
    assert_eq!(
        at(ratelimit, "/rate_limit_service/transport_api_version"),
        "V3"
    );

    // The descriptor keys the route's actions produce.
    let domain = at(ratelimit, "/domain").as_str().unwrap();
    let limits = at(route(filters, "/"), "/route/rate_limits");
    let keys: Vec<String> = limits
        .as_array()
        .unwrap()
        .iter()
        .map(|limit| {
            let action = at(limit, "/actions/0");
            match action.pointer("/request_headers/descriptor_key") {
                Some(key) => key.as_str().unwrap().to_owned(),
                None if action.get("remote_address").is_some() => "remote_address".to_owned(),
                None => panic!("an action this test does not know: {action}"),
            }
        })
        .collect();
    assert!(keys.len() >= 2, "{keys:?}");

    let config = scratch("envoy");
    for (name, text) in at(&config_map, "/data").as_object().unwrap() {
        std::fs::write(config.join(name), text.as_str().unwrap()).unwrap();
    }
    let server = Server::binary(&["--config", config.to_str().unwrap()]);
    for key in &keys {
        let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args([
                "check",
                "--grpc",
                "--target",
                &server.address,
                "--domain",
                domain,
            ])
            .args(["--descriptor", &format!("{key}=192.0.2.7")])
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{key}: {printed}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_str(&printed).unwrap();
        // A descriptor that matched no rule has no current limit (and a rule names itself
        // in the answer only when the configuration names it, as envoy answers).
        let limit = at(&answer, "/statuses/0/currentLimit/requestsPerUnit");
        assert!(limit.as_u64().is_some_and(|n| n > 0), "{key}: {answer}");
    }
}

/// The Envoy example's route whose match is `prefix`.
fn route<'a>(filters: &'a Value, prefix: &str) -> &'a Value {
    at(filters, "/route_config/virtual_hosts/0/routes")
        .as_array()
        .unwrap()
        .iter()
        .find(|r| at(r, "/match/prefix") == prefix)
        .unwrap_or_else(|| panic!("no route for {prefix}"))
}

/// The descriptor keys a `rate_limits` entry's `request_headers` actions produce.
fn header_keys(limit: &Value) -> Vec<String> {
    at(limit, "/actions")
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            at(a, "/request_headers/descriptor_key")
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The Envoy example's LLM route, asked of the binary as Envoy asks: at request time its
/// first `rate_limits` entry at 0 hits, when the stream is done its second at the tokens
/// the metadata holds, with the request id (sent twice, as a retry would). The model's
/// usage is then exactly the tokens reported, and a model that is spent is refused at
/// request time.
#[test]
fn the_envoy_token_route_reports_each_response_once() {
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let config_map = yaml("deploy/kubernetes/configmap.yaml");
    let filters = at(
        &envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config",
    );
    let domain = at(filters, "/http_filters/0/typed_config/domain")
        .as_str()
        .unwrap()
        .to_owned();
    let limits = at(route(filters, "/v1/chat/completions"), "/route/rate_limits");
    let (done, asked): (Vec<&Value>, Vec<&Value>) = limits
        .as_array()
        .unwrap()
        .iter()
        .partition(|l| l.get("apply_on_stream_done") == Some(&Value::Bool(true)));
    let ([asked], [done]) = (asked.as_slice(), done.as_slice()) else {
        panic!("one request-time and one stream-done entry: {limits}");
    };
    assert_eq!(at(asked, "/hits_addend/number"), 0);
    let format = at(done, "/hits_addend/format").as_str().unwrap();
    assert!(format.starts_with("%DYNAMIC_METADATA("), "{format}");
    let (asked_keys, done_keys) = (header_keys(asked), header_keys(done));

    let config = scratch("envoy-tokens");
    for (name, text) in at(&config_map, "/data").as_object().unwrap() {
        std::fs::write(config.join(name), text.as_str().unwrap()).unwrap();
    }
    let server = Server::binary(&["--config", config.to_str().unwrap()]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
            .await
            .unwrap();
        // Envoy's request headers: the model, and the id it gives every request.
        let mut ask = async |keys: &[String], request_id: &str, hits: u64| -> RateLimitResponse {
            let header = |key: &str| match key {
                "model" => "gpt-x".to_owned(),
                "request_id" => request_id.to_owned(),
                other => panic!("a header this test does not send: {other}"),
            };
            let descriptor = RateLimitDescriptor {
                entries: keys
                    .iter()
                    .map(|key| Entry {
                        key: key.clone(),
                        value: header(key),
                    })
                    .collect(),
                hits_addend: Some(UInt64Value { value: hits }),
                ..RateLimitDescriptor::default()
            };
            let request = RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![descriptor],
                hits_addend: 0,
            };
            client
                .should_rate_limit(request)
                .await
                .unwrap()
                .into_inner()
        };
        let ok = i32::from(Code::Ok);
        let tokens = [4000, 2500, 1200];
        for (i, &used) in tokens.iter().enumerate() {
            let id = format!("req-{i}");
            assert_eq!(ask(&asked_keys, &id, 0).await.overall_code, ok);
            for _ in 0..2 {
                assert_eq!(ask(&done_keys, &id, used).await.overall_code, ok);
            }
        }
        // A peek answers as one unit.
        let left = ask(&asked_keys, "req-3", 0).await.statuses[0].limit_remaining;
        assert_eq!(u64::from(left), 1_000_000 - tokens.iter().sum::<u64>() - 1);
        assert_eq!(ask(&done_keys, "req-3", 1_000_000).await.overall_code, ok);
        let spent = ask(&asked_keys, "req-4", 0).await;
        assert_eq!(spent.overall_code, i32::from(Code::OverLimit));
    });
}
