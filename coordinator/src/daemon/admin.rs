//! The node's admin HTTP: the dashboard at `/` ([`dashboard`]), `/healthz`, `/v1/status`
//! (JSON), `/metrics` (Prometheus), `/v1/config` (the limits configuration: [`config`]),
//! `/v1/cluster/nodes` (the membership: [`cluster`]) and `/v1/regions` (regions removed and
//! added back: [`regions`]).
//!
//! Every node answers `/v1/status` with what raft and the committed state say (members,
//! leader, term, configuration, member regions); the leader adds what only its rebalancer
//! knows: regions as last heard (clock offset, sync lag) and per limit the live bound with its
//! terms (`Coordinator::bound`). `/v1/status` may be read by a page of any origin: the
//! dashboard served by a follower reads the leader's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use allot_core::ids::RegionId;
use allot_proto::tls;
use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::header;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use metrics_exporter_prometheus::PrometheusHandle;
use openraft::Raft;
use serde::Serialize;
use tokio::sync::{Semaphore, oneshot};

use crate::daemon::cluster::{self, Role};
use crate::daemon::config;
use crate::daemon::dashboard;
use crate::daemon::handler::LeaderSlot;
use crate::daemon::leader::{
    CounterStatus, Job, LeaderStatus, RegionHeard, RowHeard, STATUS_TIMEOUT, counters_status,
};
use crate::daemon::regions;
use crate::network::LeaderAdmin;
use crate::store::StateReader;
use crate::sync_service::ClusterClock;
use crate::types::{NodeId, TypeConfig};

#[derive(Clone)]
pub struct Admin {
    pub raft: Raft<TypeConfig>,
    pub state: StateReader,
    pub slot: Arc<LeaderSlot>,
    pub prometheus: PrometheusHandle,
    /// Held by a membership change being made on this node.
    pub membership: cluster::ChangeLock,
    /// Where the leader's admin HTTP is, as its clock probes named it.
    pub leader_admin: Arc<LeaderAdmin>,
    /// This node's own admin address.
    pub admin_http: String,
    /// What a change must carry (D60); `None`: anyone may make one.
    pub admin_token_sha256: Option<[u8; 32]>,
    /// What a read must carry, if anything (D63): this token or the admin token.
    pub read_token_sha256: Option<[u8; 32]>,
}

pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/", get(dashboard::page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(render_metrics))
        .route("/v1/status", get(status).options(status_preflight))
        .route(
            "/v1/config",
            get(config::get)
                .put(config::put)
                .layer(DefaultBodyLimit::max(config::MAX_PUT_BODY_BYTES)),
        )
        .route(
            "/v1/cluster/nodes",
            get(cluster::members)
                .post(cluster::add)
                .layer(DefaultBodyLimit::max(cluster::MAX_ADD_BODY_BYTES)),
        )
        .route("/v1/cluster/nodes/{id}", delete(cluster::remove))
        .route("/v1/regions", get(regions::list))
        .route(
            "/v1/regions/{name}",
            delete(regions::remove).post(regions::add),
        )
        .layer(middleware::from_fn_with_state(
            admin.clone(),
            calls_need_their_token,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::new(Semaphore::new(MAX_ADMIN_CALLS_IN_FLIGHT)),
            shed_past_the_cap,
        ))
        .with_state(admin)
}

/// Admin HTTP requests handled at once; one more is answered 503 at once. Operators, the CLI
/// and dashboards make a few a second: this bounds what a flood of them (each status read
/// takes the state's lock and asks the rebalancer) can take from the leader's work.
pub const MAX_ADMIN_CALLS_IN_FLIGHT: usize = 64;

/// Longest a request's body may take to arrive. It is read before the request takes one of
/// the places above, so that slow senders cannot hold them.
pub const ADMIN_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the body (at most [`config::MAX_PUT_BODY_BYTES`], within [`ADMIN_BODY_TIMEOUT`]: 413
/// or 408 otherwise), then takes a place: 503 with `Retry-After: 1` past
/// [`MAX_ADMIN_CALLS_IN_FLIGHT`], counted, never queued.
async fn shed_past_the_cap(
    State(permits): State<Arc<Semaphore>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, config::MAX_PUT_BODY_BYTES);
    let body = match tokio::time::timeout(ADMIN_BODY_TIMEOUT, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            let why = format!(
                "the body is over {} bytes, or broke off",
                config::MAX_PUT_BODY_BYTES
            );
            return refusal(StatusCode::PAYLOAD_TOO_LARGE, why);
        }
        Err(_) => {
            let why = format!("the body did not arrive within {ADMIN_BODY_TIMEOUT:?}");
            return refusal(StatusCode::REQUEST_TIMEOUT, why);
        }
    };
    let Ok(_permit) = permits.try_acquire() else {
        metrics::counter!(crate::daemon::metrics::SHED, "what" => "admin_http").increment(1);
        let why = format!(
            "this coordinator node is serving {MAX_ADMIN_CALLS_IN_FLIGHT} admin requests at \
             once: try again shortly"
        );
        let mut answer = refusal(StatusCode::SERVICE_UNAVAILABLE, why);
        let retry = axum::http::HeaderValue::from_static("1");
        answer.headers_mut().insert(header::RETRY_AFTER, retry);
        return answer;
    };
    let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(body));
    next.run(request).await
}

fn refusal(status: StatusCode, why: String) -> Response {
    (status, Json(serde_json::json!({ "error": why }))).into_response()
}

/// Every change (any method but GET, HEAD and OPTIONS) needs `Authorization: Bearer TOKEN` of
/// the admin token's digest; with a read token configured (D63), every read but the
/// dashboard's page and `/healthz` needs that token or the admin token. 401 otherwise,
/// counted. A CORS preflight carries no token and says nothing: it passes.
async fn calls_need_their_token(
    State(admin): State<Admin>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let open_path = matches!(request.uri().path(), "/" | "/healthz");
    let wanted: &[Option<[u8; 32]>] = match *request.method() {
        Method::OPTIONS => &[],
        _ if read && (open_path || admin.read_token_sha256.is_none()) => &[],
        _ if read => &[admin.read_token_sha256, admin.admin_token_sha256],
        _ if admin.admin_token_sha256.is_none() => &[],
        _ => &[admin.admin_token_sha256],
    };
    if wanted.is_empty() {
        return next.run(request).await;
    }
    let presented = tls::bearer_sha256(request.headers());
    if presented.is_some() && wanted.contains(&presented) {
        return next.run(request).await;
    }
    let (kind, error) = if read {
        (
            "read_token",
            "a read needs `Authorization: Bearer TOKEN` with the token whose SHA-256 this node \
             was started with (--read-token-sha256; the CLI sends ALLOT_READ_TOKEN), or the \
             admin token; the dashboard takes it as #token=TOKEN after its address",
        )
    } else {
        (
            "admin_token",
            "a change needs `Authorization: Bearer TOKEN` with the token whose SHA-256 this node \
             was started with (--admin-token-sha256; the CLI sends ALLOT_ADMIN_TOKEN)",
        )
    };
    metrics::counter!(crate::daemon::metrics::REFUSED_PEERS, "kind" => kind).increment(1);
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            // The dashboard reading another node learns it needs the token, not a network error.
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
        ],
        Json(serde_json::json!({ "error": error })),
    )
        .into_response()
}

/// The browser's question before the dashboard reads another node's status with a token.
async fn status_preflight() -> impl IntoResponse {
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, "authorization"),
            (header::ACCESS_CONTROL_ALLOW_METHODS, "GET"),
            (header::ACCESS_CONTROL_MAX_AGE, "600"),
        ],
    )
}

async fn render_metrics(State(admin): State<Admin>) -> String {
    admin.prometheus.render()
}

#[derive(Serialize)]
struct Member {
    id: NodeId,
    /// Its raft and sync address.
    address: String,
    /// Its admin HTTP address as this node knows it: its own; the leader's, from its probes;
    /// on the leader, every node's, from their answers to its probes. The dashboard reads on
    /// through another node's when its own dies.
    admin_http: Option<String>,
    /// voter or learner.
    role: Role,
}

#[derive(Serialize)]
struct RegionStatus {
    region: RegionId,
    /// `None`: the default weight.
    weight_ppm: Option<u32>,
    /// Removed by the operator (`/v1/regions`): its syncs are refused.
    removed: bool,
    /// The configuration version a leader last recorded it on (D64), on every node: a leader
    /// that has not heard the region counts it on this one.
    recorded_version: Option<u64>,
    /// Its boots as a leader last replicated them (D78), on every node: absent before the
    /// first.
    #[serde(skip_serializing_if = "Option::is_none")]
    boots: Option<BootsStatus>,
    /// As the leader last heard it (absent on a follower, or before the region syncs).
    #[serde(flatten)]
    heard: Option<HeardStatus>,
}

#[derive(Serialize)]
struct BootsStatus {
    /// The newest boot heard: a restart or a restore takes another.
    boot: u64,
    /// The boots it superseded, the latest last: a late message of one is old.
    retired: Vec<u64>,
    /// The newest boot was a declared restore not answered yet when recorded.
    restored: bool,
}

#[derive(Serialize)]
struct HeardStatus {
    last_heard_unix_ms: u64,
    /// Time since its last SyncUp arrived.
    sync_lag_ms: u64,
    clock_offset_nanos: Option<i64>,
    round_trip_ms: Option<u64>,
    view_expired: bool,
    config_version: u64,
}

#[derive(Serialize)]
struct Status {
    node: NodeId,
    /// leader, follower, candidate, learner.
    state: String,
    /// This node's place in the membership it holds: voter, learner or not_member (started
    /// with `--join` and not added yet, or removed).
    role: Role,
    term: u64,
    leader: Option<NodeId>,
    leader_address: Option<String>,
    /// The leader's admin HTTP address: this node's own on the leader; on a follower, the one
    /// the leader's clock probes named (none until its first probe arrives). The dashboard on
    /// a follower reads the leader's status there.
    leader_admin_http: Option<String>,
    members: Vec<Member>,
    last_log_index: Option<u64>,
    /// The index the state below (`config_version`, `regions`, `counters`' rows) was read at,
    /// under the same lock: two reads at one index show the same rows.
    last_applied_index: Option<u64>,
    config_version: u64,
    regions: Vec<RegionStatus>,
    /// Rows of the applied table per escalated counter (the first `MAX_STATUS_COUNTERS`),
    /// with each region's use on the leader.
    counters: Vec<CounterStatus>,
    /// The live bound per limit; on the leader only (followers name the leader instead).
    limits: Option<Vec<crate::daemon::leader::LimitBound>>,
    limits_left_out: usize,
    /// On the leader: the other nodes' clocks against cluster time, from its latest probes
    /// (D43, D47).
    node_clocks: Option<Vec<crate::state::NodeClock>>,
    /// On the leader: cluster time minus its wall clock (D47); its times are on cluster time.
    cluster_clock_offset_nanos: Option<i64>,
    /// On the leader: the node through whose entry in the last clock frame it read cluster
    /// time, when it was not in that frame itself (D50).
    cluster_clock_via: Option<NodeId>,
    /// The last clock frame committed (D47), on any node: the next leader reads cluster time
    /// from it. `None` before the first.
    clock_frame: Option<ClockFrameStatus>,
}

/// Who recorded the clock frame in force and which nodes' clocks it holds.
#[derive(Serialize)]
struct ClockFrameStatus {
    recorded_by: NodeId,
    leader_term: u64,
    nodes: Vec<NodeId>,
}

/// Read-only, so open to any origin (behind the read token when one is set, D63): the
/// dashboard a follower serves reads the leader's status from the page (no proxy).
async fn status(State(admin): State<Admin>) -> impl IntoResponse {
    (
        [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
        Json(status_now(&admin).await),
    )
}

async fn status_now(admin: &Admin) -> Status {
    let leader = leader_status(admin).await;
    let mut s = raft_status(admin);
    let mut heard: BTreeMap<RegionId, RegionHeard> = BTreeMap::new();
    if let Some(l) = leader {
        heard = l
            .regions
            .into_iter()
            .map(|r| (r.region.clone(), r))
            .collect();
        s.limits = Some(l.limits);
        add_heard(&mut s.counters, &l.counters);
        s.limits_left_out = l.limits_left_out;
        s.node_clocks = Some(l.node_clocks);
        s.cluster_clock_offset_nanos = Some(l.cluster_clock_offset_nanos);
        s.cluster_clock_via = l.cluster_clock_via;
    }
    // The leader heard the regions on cluster time.
    let clock = ClusterClock::with_offset(s.cluster_clock_offset_nanos.unwrap_or(0));
    let now_ms = clock.now().as_unix_millis();
    for r in &mut s.regions {
        r.heard = heard.remove(&r.region).map(|h| HeardStatus {
            last_heard_unix_ms: h.last_heard_unix_ms,
            sync_lag_ms: now_ms.saturating_sub(h.last_heard_unix_ms),
            clock_offset_nanos: h.clock_offset_nanos,
            round_trip_ms: h.round_trip_ms,
            view_expired: h.view_expired,
            config_version: h.config_version,
        });
    }
    s
}

/// `node`'s admin HTTP address as this node (`me`) knows it.
fn admin_http_of(admin: &Admin, me: NodeId, node: NodeId) -> Option<String> {
    if node == me {
        return Some(admin.admin_http.clone());
    }
    admin
        .leader_admin
        .of(node)
        .or_else(|| admin.leader_admin.node(node))
}

/// What raft and the committed state say, on any node.
fn raft_status(admin: &Admin) -> Status {
    let metrics = admin.raft.metrics();
    let m = metrics.borrow();
    let membership = m.membership_config.membership();
    let members = membership
        .nodes()
        .map(|(id, n)| Member {
            id: *id,
            address: n.addr.clone(),
            admin_http: admin_http_of(admin, m.id, *id),
            role: cluster::role_of(membership, *id),
        })
        .collect();
    let leader = cluster::known_leader(&m);
    let leader_address = leader.and_then(|id| membership.get_node(&id).map(|n| n.addr.clone()));
    let leader_admin_http = match leader {
        Some(id) if id == m.id => Some(admin.admin_http.clone()),
        Some(id) => admin.leader_admin.of(id),
        None => None,
    };
    let (applied, config_version, regions, counters, clock_frame) = admin.state.read(|a| {
        let regions = a
            .state
            .regions()
            .iter()
            .map(|(r, member)| RegionStatus {
                region: r.clone(),
                weight_ppm: member.weight_ppm,
                removed: a.state.table().is_removed(r),
                recorded_version: a.state.table().recorded_version(r),
                boots: a.state.boots().get(r).map(|b| BootsStatus {
                    boot: b.boots.boot,
                    retired: b.boots.retired.clone(),
                    restored: b.boots.restored,
                }),
                heard: None,
            })
            .collect();
        let counters = counters_status(a.state.table(), |_, _| RowHeard::default());
        let applied = a.last_applied.map(|l| l.index);
        let clock_frame = a.state.clock_source().map(|c| ClockFrameStatus {
            recorded_by: c.leader,
            leader_term: c.leader_term,
            nodes: c.nodes.iter().map(|n| n.node).collect(),
        });
        let version = a.state.table().config_version();
        (applied, version, regions, counters, clock_frame)
    });
    Status {
        node: m.id,
        state: format!("{:?}", m.state).to_lowercase(),
        role: cluster::role_of(membership, m.id),
        term: m.current_term,
        leader,
        leader_address,
        leader_admin_http,
        members,
        last_log_index: m.last_log_index,
        last_applied_index: applied,
        config_version,
        regions,
        counters,
        limits: None,
        limits_left_out: 0,
        node_clocks: None,
        cluster_clock_offset_nanos: None,
        cluster_clock_via: None,
        clock_frame,
    }
}

/// Adds the use and demand the leader's rebalancer last heard to the applied rows. The rows
/// stay the applied state's (read with `last_applied_index`), not the rebalancer's copy, which
/// may be a round behind or ahead of the index read beside it.
fn add_heard(applied: &mut [CounterStatus], leader: &[CounterStatus]) {
    let heard: BTreeMap<_, _> = leader.iter().map(|c| (&c.counter, &c.regions)).collect();
    for c in applied {
        let Some(rows) = heard.get(&c.counter) else {
            continue;
        };
        for (region, row) in &mut c.regions {
            row.heard = rows.get(region).map(|r| r.heard).unwrap_or_default();
        }
    }
}

/// The rebalancer's part, if this node runs one and it answers in time.
pub(crate) async fn leader_status(admin: &Admin) -> Option<LeaderStatus> {
    let jobs = admin.slot.sender()?;
    let (reply, answer) = oneshot::channel();
    jobs.try_send(Job::Status { reply }).ok()?;
    tokio::time::timeout(STATUS_TIMEOUT, answer)
        .await
        .ok()?
        .ok()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use tokio::sync::Notify;
    use tower::ServiceExt;

    use super::*;

    /// With every place taken, a request is answered 503 with `Retry-After` at once; when
    /// the place comes back, the next one is served.
    #[tokio::test]
    async fn a_request_past_the_places_is_answered_503_at_once() {
        let release = Arc::new(Notify::new());
        let held = release.clone();
        let router = Router::new()
            .route(
                "/slow",
                get(move || async move {
                    held.notified().await;
                    "done"
                }),
            )
            .route("/fast", get(|| async { "fast" }))
            .layer(middleware::from_fn_with_state(
                Arc::new(Semaphore::new(1)),
                shed_past_the_cap,
            ));
        let get_ = |path: &str| {
            let request = axum::http::Request::get(path)
                .body(Body::empty())
                .expect("a request");
            router.clone().oneshot(request)
        };
        let slow = tokio::spawn(get_("/slow"));
        // Until the slow one holds the place, /fast may get it: wait for the refusal.
        let refused = loop {
            let answer = get_("/fast").await.expect("answered");
            if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
                break answer;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        release.notify_one();
        assert_eq!(
            slow.await.expect("task").expect("answered").status(),
            StatusCode::OK
        );
        let after = get_("/fast").await.expect("answered");
        assert_eq!(after.status(), StatusCode::OK, "the place came back");
    }
}
