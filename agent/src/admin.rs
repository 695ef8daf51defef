//! The admin HTTP surface (axum): `/metrics` (Prometheus text), `/healthz` (the process
//! answers), `/readyz` (state restored, configuration loaded, listeners up, not shutting
//! down), `/v1/keys?domain=D&descriptor=k=v,k2=v2`, one key's state as JSON, and `/v1/status`,
//! the sync link and each limit's partition state as JSON. The same port serves the lease
//! API as HTTP/JSON (`crate::service::http`). With `--read-token-sha256` every route here but
//! the two health checks needs the read token (D63).

use std::collections::HashMap;
use std::sync::Arc;

use allot_core::budget::inspect::PreviousWindow;
use allot_core::limit::{Consistency, PartitionPolicy};
use allot_proto::tls;
use axum::Json;
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use crate::callers::LiveCallers;
use crate::convert;
use crate::grpc_link::LinkStatus;
use crate::metrics;
use crate::request::Target;
use crate::service::http as lease_http;
use crate::service::lease::LeaseApi;
use crate::service::shed::Shed;
use crate::settings::{MAX_DOMAIN_BYTES, MAX_ENTRIES_PER_DESCRIPTOR, MAX_ENTRY_BYTES};
use crate::state::Agent;

#[derive(Clone)]
struct Admin {
    agent: Arc<Agent>,
    link: Arc<LinkStatus>,
    metrics: PrometheusHandle,
}

pub fn router(
    agent: Arc<Agent>,
    link: Arc<LinkStatus>,
    metrics: PrometheusHandle,
    shed: Shed,
    callers: Arc<LiveCallers>,
) -> Router {
    let read_token = agent.settings().read_token_sha256;
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/v1/keys", get(key))
        .route("/v1/keys/watch", post(watch_key))
        .route("/v1/status", get(status))
        // Only the routes above: the lease API merged below has its callers (D59).
        .route_layer(middleware::from_fn_with_state(
            read_token,
            reads_need_the_token,
        ))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(Admin {
            agent: agent.clone(),
            link,
            metrics,
        })
        .merge(lease_http::router(
            LeaseApi::new(agent.clone()),
            callers,
            shed,
        ))
}

/// With a read token configured (D63), an operator's call needs `Authorization: Bearer TOKEN`
/// of its digest: 401 otherwise, counted as a refused caller of kind `read_token`.
async fn reads_need_the_token(
    State(want): State<Option<[u8; 32]>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(want) = want else {
        return next.run(request).await;
    };
    let presented = tls::bearer_sha256(request.headers());
    if presented == Some(want) {
        return next.run(request).await;
    }
    metrics::refused_caller("read_token");
    let body = json!({
        "error": "this agent's admin reads need `Authorization: Bearer TOKEN` with the token \
                  whose SHA-256 it was started with (--read-token-sha256)"
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(body),
    )
        .into_response()
}

/// The sync link and the machine's view: whether the coordinator answers, and whether the
/// view has expired (then each limit's partition policy applies).
fn sync_json(a: &Admin) -> Value {
    let (state, lag_secs) = a.agent.sync_status();
    let link = a.link.snapshot();
    json!({
        "mode": if a.agent.settings().is_coordinated() { "coordinated" } else { "single_region" },
        "connected": link.connected,
        "address": link.address,
        "leader": link.leader,
        "last_answer_age_secs": link.last_answer_age_secs,
        "reconnects": link.reconnects,
        "dropped_sync_ups": link.dropped_sync_ups,
        "bad_answers": link.bad_answers,
        "last_error": link.last_error,
        "partition_state": state,
        "view_expired": state == "expired",
        "view_age_secs": lag_secs.is_finite().then_some(lag_secs),
    })
}

fn policy_name(p: &PartitionPolicy) -> &'static str {
    match p {
        PartitionPolicy::Floor => "floor",
        PartitionPolicy::Closed => "closed",
        PartitionPolicy::Open { .. } => "open",
    }
}

fn consistency_name(c: Consistency) -> &'static str {
    match c {
        Consistency::Strict => "strict",
        Consistency::Eventual => "eventual",
    }
}

/// `/v1/status`: the region, its sync link, and per limit whether its partition policy is in
/// force (the view is the region's, so it expires for every limit at once; what each limit
/// then does is its own policy).
async fn status(State(a): State<Admin>) -> Response {
    let sync = sync_json(&a);
    let expired = sync["view_expired"].as_bool().unwrap_or(false);
    let limits = a.agent.limits();
    let rules: Vec<Value> = limits
        .config
        .rules()
        .map(|r| {
            let spec = &r.spec;
            json!({
                "rule": spec.id.as_str(),
                "consistency": consistency_name(spec.consistency),
                "partition_policy": policy_name(&spec.partition_policy),
                "view_expired": expired,
            })
        })
        .collect();
    Json(json!({
        "region": a.agent.settings().region.as_str(),
        "config_version": limits.version,
        "config_source": limits.source.as_str(),
        "sync": sync,
        "limits": rules,
    }))
    .into_response()
}

async fn render_metrics(State(a): State<Admin>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        a.metrics.render(),
    )
        .into_response()
}

async fn ready(State(a): State<Admin>) -> Response {
    if a.agent.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn key(State(a): State<Admin>, Query(q): Query<HashMap<String, String>>) -> Response {
    key_view(a, q, false)
}

/// `POST /v1/keys/watch`: the key's view, and from now on its closed windows' counts.
async fn watch_key(State(a): State<Admin>, Query(q): Query<HashMap<String, String>>) -> Response {
    key_view(a, q, true)
}

fn key_view(a: Admin, q: HashMap<String, String>, watch: bool) -> Response {
    let target = match parse_target(&q) {
        Ok(t) => t,
        Err(msg) => {
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response();
        }
    };
    let state = match a.agent.key_state_watching(&target, watch) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let body = json!({ "domain": target.domain, "rule": null, "reason": "no_rule" });
            return (StatusCode::NOT_FOUND, Json(body)).into_response();
        }
        Err(e) => {
            let body = json!({ "error": e.to_string() });
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
        }
    };
    let v = &state.view;
    let leases: Vec<_> = v
        .leases
        .iter()
        .map(|l| {
            json!({
                "lease_id": l.lease.0,
                "units": l.units,
                "expires_at_unix_ms": l.expires_at.as_unix_millis(),
            })
        })
        .collect();
    let body = json!({
        "domain": target.domain,
        "rule": state.rule.id.as_str(),
        "key": state.key.as_str(),
        "quota_units": state.rule.quota_units,
        "window_ms": state.rule.window.map(|w| w.as_millis() as u64),
        "shadow_mode": state.rule.shadow_mode,
        "window": v.window.0,
        "window_start_unix_ms": v.window_start.as_unix_millis(),
        "window_end_unix_ms": v.window_end.as_unix_millis(),
        "granted_units": v.granted_units,
        "refunded_units": v.refunded_units,
        "carried_in_units": v.carried_in_units,
        "net_units": v.granted_units.saturating_sub(v.refunded_units),
        "allowance_units": v.allowance_units,
        "explicit_allowance": v.explicit_allowance,
        "weighted_allowance_units": v.weighted_allowance_units,
        "remaining_units": v.remaining_units,
        "reason": convert::reason_name(v.reason),
        "leases": leases,
        "slots_in_use": v.slots_in_use,
        "reported": v.reported,
        "tracked": v.tracked,
        "previous_window": v.previous_window.map(closed_json),
        "watched": v.watched,
        "closed_windows": v.closed_windows.iter().copied().map(closed_json).collect::<Vec<_>>(),
        "negative_cache_until_unix_ms": state.negative_cache_until.map(|t| t.as_unix_millis()),
        "partition_policy": a
            .agent
            .limits()
            .config
            .limit(&state.rule.id)
            .map(|spec| policy_name(&spec.partition_policy)),
        "sync": sync_json(&a),
    });
    Json(body).into_response()
}

fn closed_json(p: PreviousWindow) -> Value {
    json!({ "window": p.window.0, "net_units": p.net_units })
}

/// `domain=D` and `descriptor=k=v,k2=v2` (values cannot hold commas here).
fn parse_target(q: &HashMap<String, String>) -> Result<Target, String> {
    let domain = q.get("domain").cloned().unwrap_or_default();
    if domain.is_empty() || domain.len() > MAX_DOMAIN_BYTES {
        return Err(format!("domain: 1 to {MAX_DOMAIN_BYTES} bytes expected"));
    }
    let descriptor = q.get("descriptor").map(String::as_str).unwrap_or_default();
    let entries = parse_descriptor(descriptor)?;
    Ok(Target { domain, entries })
}

/// `k=v,k2=v2` into ordered entries; a bare `k` has an empty value.
pub fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, String> {
    if text.is_empty() {
        return Err("descriptor: at least one k=v entry expected".to_owned());
    }
    let entries: Vec<(String, String)> = text
        .split(',')
        .map(|part| match part.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (part.to_owned(), String::new()),
        })
        .collect();
    if entries.len() > MAX_ENTRIES_PER_DESCRIPTOR {
        return Err(format!(
            "descriptor: at most {MAX_ENTRIES_PER_DESCRIPTOR} entries"
        ));
    }
    for (k, v) in &entries {
        if k.is_empty() || k.len() > MAX_ENTRY_BYTES || v.len() > MAX_ENTRY_BYTES {
            return Err(format!(
                "descriptor: entry '{k}={v}' needs a key and at most {MAX_ENTRY_BYTES} bytes each"
            ));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_parse_in_order() {
        assert_eq!(
            parse_descriptor("api_key=abc,route=orders_post,flag").expect("ok"),
            vec![
                ("api_key".to_owned(), "abc".to_owned()),
                ("route".to_owned(), "orders_post".to_owned()),
                ("flag".to_owned(), String::new()),
            ]
        );
        // Only the first '=' splits: values may hold more.
        assert_eq!(
            parse_descriptor("q=a=b").expect("ok"),
            vec![("q".to_owned(), "a=b".to_owned())]
        );
        assert!(parse_descriptor("").is_err());
        assert!(parse_descriptor("=v").is_err());
    }
}
