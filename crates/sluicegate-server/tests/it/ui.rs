//! The live page in a real browser: Debian's chromium, headless, loads `GET /ui` from a
//! running service while a client is being refused, on memory and on a real redis-server;
//! the page must show the loaded rules and a refusal counter that moves.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluicegate_test_support as support;

use crate::server;

use server::Server;

const CONFIG: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {window: 1h, requests_per_unit: 3}
  - key: route
    value: free
    rate_limit: {unlimited: true}
  - key: plan
    rate_limit: {algorithm: token-bucket, unit: second, requests_per_unit: 10, burst: 20}
";

fn config_file(tag: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("sluicegate-ui-{tag}-{}.yaml", std::process::id()));
    std::fs::write(&path, CONFIG).unwrap();
    path
}

fn check_user(server: &Server, user: &str) {
    let body = serde_json::json!({
        "domain": "shop",
        "descriptors": [{"entries": [{"key": "user", "value": user}]}],
    });
    let (status, answer) = server.request("POST", "/v1/check", &body.to_string());
    assert_eq!(status, 200, "{answer}");
}

/// The page as chromium renders it, after its scripts have run and its first poll has
/// been answered (virtual time runs the page's timers; the fetch is a real request).
fn rendered(address: &str) -> String {
    let profile = tempdir("chromium-profile");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.display()),
            "--virtual-time-budget=10000",
            "--dump-dom",
            &format!("http://{address}/ui"),
        ])
        .output()
        .expect("chromium runs (scripts/test installs Debian's chromium)");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluicegate-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The number the page shows in the `class` cell of the row of `rule`.
fn cell(dom: &str, rule: &str, class: &str) -> u64 {
    let row_start = dom
        .find(&format!("<tr data-rule=\"{rule}\">"))
        .unwrap_or_else(|| panic!("no row for {rule} in the page:\n{dom}"));
    let row = &dom[row_start..row_start + dom[row_start..].find("</tr>").unwrap()];
    let marker = format!("num {class}");
    let at = row
        .find(&marker)
        .unwrap_or_else(|| panic!("no {class} cell in {row}"));
    let value = &row[at + row[at..].find('>').unwrap() + 1..];
    value[..value.find('<').unwrap()]
        .replace(',', "")
        .parse()
        .unwrap_or_else(|e| panic!("{class} of {rule}: {e} in {row}"))
}

fn page_shows_rules_and_refusals_that_move(server: &Server) {
    // Ann is refused from her fourth check on; a client keeps being refused meanwhile.
    for _ in 0..5 {
        check_user(server, "ann");
    }
    let first = rendered(&server.address);
    for rule in ["shop.user", "shop.route_free", "shop.plan"] {
        assert!(
            first.contains(&format!("<tr data-rule=\"{rule}\">")),
            "{rule} missing from the page"
        );
    }
    assert!(first.contains("3 / 1 h"), "the limit is shown in words");
    assert!(first.contains("unlimited"));
    let refused_before = cell(&first, "shop.user", "refused");
    assert_eq!(refused_before, 2);
    assert!(first.contains("user=ann"), "ann is a top refused key");

    // Under load: a second client is refused all along while the page is looked at again.
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let second = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                check_user(server, "bob");
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent.load(Ordering::Relaxed) < 20 {
            assert!(Instant::now() < deadline, "the load never got going");
            std::thread::yield_now();
        }
        let second = rendered(&server.address);
        stop.store(true, Ordering::Relaxed);
        second
    });
    let refused_after = cell(&second, "shop.user", "refused");
    assert!(
        refused_after >= refused_before + 17,
        "the refusal counter moved: {refused_before} then {refused_after}"
    );
    assert!(cell(&second, "shop.user", "decisions") > refused_after);
}

#[test]
fn live_page_on_memory() {
    let config = config_file("memory");
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    page_shows_rules_and_refusals_that_move(&server);
    assert!(rendered(&server.address).contains("memory · ready"));
}

#[test]
fn live_page_on_redis() {
    let redis = support::RedisServer::start(&[]);
    let config = config_file("redis");
    let server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        &redis.url(),
    ]);
    page_shows_rules_and_refusals_that_move(&server);
    let page = rendered(&server.address);
    assert!(page.contains("redis · ready"));
    // The one node of a single server, its breaker closed, named under the badge.
    let (status, body) = server.request("GET", "/v1/overview?n=1", "");
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body).unwrap();
    let nodes = overview["store"]["nodes"].as_array().expect("store.nodes");
    assert_eq!(nodes.len(), 1, "{body}");
    let node = nodes[0]["node"].as_str().unwrap();
    assert!(node.contains(&redis.port.to_string()), "{body}");
    assert_eq!(nodes[0]["breaker"], "closed", "{body}");
    assert!(
        page.contains(&format!("title=\"{node}: closed\"")),
        "the breaker badge names the node"
    );
}

#[test]
fn no_ui_turns_the_page_off_but_not_the_overview() {
    let server = Server::start(&["--no-ui"]);
    let (status, body) = server.request("GET", "/ui", "");
    assert_eq!(status, 404);
    assert!(body.contains("--no-ui"), "{body}");
    let (status, body) = server.request("GET", "/v1/overview?n=1", "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request("GET", "/v1/overview?sort=nonsense", "");
    assert_eq!(status, 400, "{body}");
}

/// A Redis restarted without its data is shown in the header as a warning naming how many
/// nodes lost state, the store still ready.
#[test]
fn live_page_shows_lost_state() {
    let redis = support::RedisServer::start(&[]);
    let config = config_file("lost-state");
    let server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        &redis.url(),
        "--lost-state-check-interval",
        "100ms",
    ]);
    let page = rendered(&server.address);
    assert!(page.contains(r#"<span id="lost-wrap" hidden="""#), "{page}");
    redis.shutdown();
    let _redis = redis.restart(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server
        .request("GET", "/readyz", "")
        .1
        .contains("lost state")
    {
        assert!(Instant::now() < deadline, "the loss was never reported");
        std::thread::sleep(Duration::from_millis(20));
    }
    let page = rendered(&server.address);
    assert!(page.contains("redis · ready"), "{page}");
    assert!(page.contains(r#"<span id="lost-wrap">"#), "{page}");
    assert!(page.contains("lost on 1 node"), "{page}");
}
