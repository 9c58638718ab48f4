//! The Grafana dashboard (deploy/grafana/) queries only what the service exports: every
//! metric a query names is one `GET /metrics` of a service on a real redis-server
//! declares, and every label a query selects or groups by is one that metric carries.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use sluicegate_test_support as support;

use crate::server;

use server::Server;

const DASHBOARD: &str = include_str!("../../../../deploy/grafana/sluicegate-dashboard.json");

/// Labels Prometheus adds when it scrapes, or that a histogram's buckets carry.
const ADDED_LABELS: [&str; 3] = ["job", "instance", "le"];

/// Every `expr` and templating `query` string of the dashboard.
fn queries(value: &Value, out: &mut Vec<String>) {
    match value {
        // A datasource variable's `query` is the datasource's type, not a query.
        Value::Object(map) if map.get("type") == Some(&Value::from("datasource")) => {}
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(q)) => out.push(q.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The metric names a query mentions, each with the labels its selector names.
fn metrics_named(query: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("sluicegate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_owned();
        let mut labels = Vec::new();
        if let Some(selector) = tail[end..].strip_prefix('{') {
            let selector = &selector[..selector.find('}').expect("a closed selector")];
            for matcher in selector.split(',') {
                let label = matcher
                    .split(['=', '!', '~'])
                    .next()
                    .unwrap()
                    .trim()
                    .to_owned();
                labels.push(label);
            }
        }
        found.push((name, labels));
        rest = &tail[end..];
    }
    found
}

/// The labels of `by (…)` clauses.
fn grouped_by(query: &str) -> Vec<String> {
    query
        .match_indices("by (")
        .flat_map(|(at, _)| {
            let inner = &query[at + 4..];
            inner[..inner.find(')').unwrap()]
                .split(',')
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every sample name `/metrics` may carry (histograms as their `_bucket`, `_sum` and
/// `_count`), each with the labels seen on its samples.
fn exported(text: &str) -> HashMap<String, BTreeSet<String>> {
    let mut names: HashMap<String, BTreeSet<String>> = HashMap::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut parts = declared.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let suffixes: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.entry(format!("{name}{suffix}")).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let labels = names.entry(line[..name_end].to_owned()).or_default();
            if let Some(selector) = line[name_end..].strip_prefix('{') {
                for pair in selector[..selector.rfind('}').unwrap()].split("\",") {
                    labels.insert(pair.split('=').next().unwrap().to_owned());
                }
            }
        }
    }
    names
}

#[test]
fn every_dashboard_query_names_what_the_service_exports() {
    let redis = support::RedisServer::start(&[]);
    let server = Server::start(&["--store", &redis.url()]);
    // Traffic, so that the labelled families have samples whose labels can be checked.
    for _ in 0..7 {
        let body =
            r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
        assert_eq!(server.request("POST", "/v1/check", body).0, 200);
    }
    let (_, text) = server.request("GET", "/metrics", "");
    let exported = exported(&text);

    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut all = Vec::new();
    queries(&dashboard, &mut all);
    assert!(all.len() >= 12, "the dashboard has its queries: {all:?}");
    let mut checked = 0;
    for query in &all {
        let named = metrics_named(query);
        assert!(!named.is_empty(), "a query that names no metric: {query}");
        for (name, labels) in &named {
            let carried = exported
                .get(name)
                .unwrap_or_else(|| panic!("{query}: {name} is not exported"));
            checked += 1;
            // A family with no sample yet shows no labels to check against.
            if carried.is_empty() {
                continue;
            }
            for label in labels.iter().chain(&grouped_by(query)) {
                if ADDED_LABELS.contains(&label.as_str()) {
                    continue;
                }
                assert!(
                    named.iter().any(|(n, _)| exported[n].contains(label)),
                    "{query}: no metric of it carries the label {label:?} ({name} has {carried:?})"
                );
            }
        }
    }
    assert!(checked >= 20, "only {checked} metric references checked");
}
