//! A Redis that lost what the service wrote (here, restarted without persistence) is
//! reported: a warning in the log naming the node and the reason, a counter by node and
//! reason, the node in `/readyz`'s body (still ready: the service decides) and in the live
//! page's overview.

use crate::server;

use server::Server;
use sluicegate_test_support::RedisServer;

#[test]
fn a_restart_without_persistence_is_logged_counted_and_shown() {
    let redis = RedisServer::start(&[]);
    let server = Server::binary(&[
        "--store",
        &redis.url(),
        "--lost-state-check-interval",
        "100ms",
    ]);
    assert_eq!(
        server.request("GET", "/readyz", ""),
        (200, "ready\n".to_owned())
    );
    redis.shutdown();
    let redis = redis.restart(&[]);

    let counter = format!(
        "sluicegate_store_state_lost_total{{node=\"{}\",reason=\"restarted\"}}",
        redis.url()
    );
    let line = server.wait_for_log(|line| line.contains("lost state sluicegate wrote"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&redis.url()), "names the node: {line}");
    assert!(line.contains("restarted"), "names the reason: {line}");
    assert_eq!(server.metric(&counter), 1);

    let (status, body) = server.request("GET", "/readyz", "");
    assert_eq!(status, 200, "still ready: {body}");
    assert!(body.starts_with("ready\nwarning: "), "{body}");
    assert!(
        body.contains(&format!("redis at {} lost state", redis.url())),
        "{body}"
    );
    assert!(body.contains("still deciding"), "{body}");

    let (status, overview) = server.request("GET", "/v1/overview", "");
    assert_eq!(status, 200, "{overview}");
    let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
    let lost = &overview["store"]["lost_state"];
    assert_eq!(lost[0]["node"], redis.url().as_str(), "{lost}");
    assert_eq!(lost[0]["reason"], "restarted", "{lost}");
    assert_eq!(lost[0]["count"], 1, "{lost}");
    assert!(overview["store"]["ready"].as_bool().unwrap());
}
