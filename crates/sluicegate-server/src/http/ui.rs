//! The operator's live page: `GET /ui` (one HTML file compiled into the binary: no CDN,
//! works offline) and the JSON it polls, `GET /v1/overview` — the rules with their
//! numbers and recent rates, the store's health and breaker, the configuration's
//! version, the top refused keys. Search, sort and the row cap are applied here, so the
//! page stays light at thousands of rules.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluicegate::internals::saturating_micros;
use sluicegate::{AnyStore, Rule};

use super::error::ApiError;
use crate::history::{SAMPLE_PERIOD, Series};
use crate::metrics::RuleTotals;
use crate::service::Service;

/// The page.
const PAGE: &str = include_str!("../../assets/ui.html");

/// Rules one overview lists unless `n` says; and the most it lists.
const DEFAULT_ROWS: usize = 50;
const MAX_ROWS: usize = 500;

/// Top refused keys listed over every rule.
const TOP_KEYS: usize = 10;

/// `GET /ui`; 404 with `--no-ui`.
pub(super) async fn page(State(service): State<Arc<Service>>) -> Response {
    if !service.options().ui {
        return ApiError::new(StatusCode::NOT_FOUND, "the live page is off (--no-ui)")
            .into_response();
    }
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

/// How the rules are ordered.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum SortBy {
    /// By configuration path.
    #[default]
    Path,
    /// Most decisions first.
    Decisions,
    /// Most refusals first.
    Refused,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OverviewQuery {
    /// Only rules whose path contains this (case-insensitive).
    q: Option<String>,
    sort: Option<SortBy>,
    /// How many rules to list, 1 to 500.
    n: Option<usize>,
}

#[derive(Serialize)]
struct StoreBody {
    kind: &'static str,
    ready: bool,
    /// Why it is not ready.
    error: Option<String>,
    /// The whole store's breaker: open while any node's is (see `Limiter::breaker_state`).
    breaker: &'static str,
    /// Each node's breaker: a server, or a master of a cluster.
    nodes: Vec<NodeBody>,
    /// Every Redis node found to have lost state sluicegate wrote, by reason.
    lost_state: Vec<LostStateRow>,
}

#[derive(Serialize)]
struct NodeBody {
    /// `host:port` (a single server: the store's URL without credentials).
    node: String,
    breaker: &'static str,
}

#[derive(Serialize)]
struct LostStateRow {
    node: String,
    reason: &'static str,
    count: u64,
    detail: String,
    at_us: u64,
}

#[derive(Serialize)]
struct RuleRow {
    path: String,
    /// Null for an unlimited rule or a block.
    algorithm: Option<String>,
    limit: Option<u64>,
    capacity: Option<u64>,
    window_us: Option<u64>,
    unlimited: bool,
    blocked: bool,
    shadow: bool,
    totals: RuleTotals,
    series: Series,
}

#[derive(Serialize)]
struct TopKey {
    rule: String,
    descriptor: String,
    refused: u64,
}

#[derive(Serialize)]
pub(super) struct Overview {
    now_us: u64,
    version: u64,
    /// The xDS `version_info` of the configuration in force; none for files.
    xds_version: Option<String>,
    loaded_at_us: u64,
    config_loads: u64,
    config_errors: u64,
    store: StoreBody,
    sample_period_s: u64,
    /// Rules configured, and how many of them the search matched.
    rule_count: usize,
    matched: usize,
    rules: Vec<RuleRow>,
    top: Vec<TopKey>,
}

/// `GET /v1/overview?q=…&sort=path|decisions|refused&n=…`.
pub(super) async fn overview(
    State(service): State<Arc<Service>>,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Result<axum::Json<Overview>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let n = query.n.unwrap_or(DEFAULT_ROWS);
    if !(1..=MAX_ROWS).contains(&n) {
        return Err(ApiError::bad_request(format!(
            "n: {n} asked, 1 to {MAX_ROWS} allowed"
        )));
    }
    let live = service.live();
    let totals = live.rule_totals();
    let limits = live.config.limits();
    let needle = query.q.as_deref().unwrap_or("").to_lowercase();
    let mut rows: Vec<(&crate::config::ConfiguredLimit, RuleTotals)> = limits
        .iter()
        .filter(|l| l.path.to_lowercase().contains(&needle))
        .map(|l| (*l, totals.get(&l.path).copied().unwrap_or_default()))
        .collect();
    match query.sort.unwrap_or_default() {
        SortBy::Path => rows.sort_by(|a, b| a.0.path.cmp(&b.0.path)),
        // Ties by path, so that rows do not swap places between polls.
        SortBy::Decisions => {
            rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.path.cmp(&b.0.path)));
        }
        SortBy::Refused => {
            rows.sort_by(|a, b| (b.1.over_limit.cmp(&a.1.over_limit)).then(a.0.path.cmp(&b.0.path)))
        }
    }
    let matched = rows.len();
    let rules = rows
        .into_iter()
        .take(n)
        .map(|(l, totals)| RuleRow {
            path: l.path.clone(),
            algorithm: l.rule.as_ref().map(|r| r.algorithm().to_string()),
            limit: l.rule.as_ref().map(Rule::limit),
            capacity: l.rule.as_ref().map(Rule::capacity),
            window_us: l.rule.as_ref().map(|rule| saturating_micros(rule.window())),
            unlimited: l.rule.is_none() && !l.blocked(),
            blocked: l.blocked(),
            shadow: l.shadow_mode,
            totals,
            series: service.history().series(&l.path),
        })
        .collect();
    let now_us = service.now_micros();
    let mut top: Vec<TopKey> = live
        .offenders
        .iter()
        .flat_map(|(rule, tracker)| {
            tracker.top(TOP_KEYS, now_us).0.into_iter().map(|o| TopKey {
                rule: rule.clone(),
                descriptor: o.descriptor,
                refused: o.refused,
            })
        })
        .collect();
    top.sort_by(|a, b| b.refused.cmp(&a.refused).then(a.rule.cmp(&b.rule)));
    top.truncate(TOP_KEYS);
    let (config_loads, config_errors) = service.metrics().config_counts();
    let store = service.limiter().store();
    // The one answer every probe gives (eviction risk and --require-noeviction included).
    let ready = crate::readiness::readiness(&service).await;
    Ok(axum::Json(Overview {
        now_us,
        version: live.version,
        xds_version: live.source_version.clone(),
        loaded_at_us: live.loaded_at_us,
        config_loads,
        config_errors,
        store: StoreBody {
            kind: match store {
                AnyStore::Memory(_) => "memory",
                AnyStore::Redis(_) => "redis",
            },
            ready: ready.is_ready(),
            error: match ready {
                crate::readiness::Readiness::NotReady(why) => Some(why),
                _ => None,
            },
            breaker: service.limiter().breaker_state().name(),
            lost_state: match store {
                AnyStore::Memory(_) => Vec::new(),
                AnyStore::Redis(redis) => redis
                    .lost_state()
                    .losses
                    .into_iter()
                    .map(|loss| LostStateRow {
                        node: loss.node,
                        reason: loss.reason.label(),
                        count: loss.count,
                        detail: loss.detail,
                        at_us: loss
                            .at
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, saturating_micros),
                    })
                    .collect(),
            },
            nodes: service
                .limiter()
                .node_breakers()
                .into_iter()
                .map(|node| NodeBody {
                    node: node.name.to_owned(),
                    breaker: node.state.name(),
                })
                .collect(),
        },
        sample_period_s: SAMPLE_PERIOD.as_secs(),
        rule_count: limits.len(),
        matched,
        rules,
        top,
    }))
}
