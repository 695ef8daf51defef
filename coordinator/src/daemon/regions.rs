//! The admin API's regions (`allot cluster regions|remove-region|add-region`):
//!
//! - `GET /v1/regions` on any node: the regions the table knows (named by the limits' weights or
//!   joined with the default weight), each with its weight, whether it was removed (and when),
//!   the limits whose floor the table reclaimed from it, and, on the leader, when it was last
//!   heard.
//! - `DELETE /v1/regions/{name}` on the leader: the region is removed. It stays in the table
//!   (what it holds still counts in every sum), is never grown nor asked to release again, and
//!   its SyncUps are refused. Under the closed policy its floor is reclaimed as a silent
//!   region's is, for windows starting after its view has certainly expired; under the floor and
//!   open policies it stays stranded (docs/coordinator.md, "Removing a region").
//! - `POST /v1/regions/{name}` on the leader: a removed region is added back; its next SyncUp
//!   is answered, its reclaims ending before that answer.
//!
//! Both changes are table commands committed through raft by the leader's task, as a round of
//! their own, so the rebalancer takes them in log order. A node that does not lead answers
//! `421` naming the leader, as the other admin calls do; a change that would do nothing is
//! refused before anything is committed.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::ids::{LimitId, RegionId};
use allot_core::rebalance::{ApplyOutcome, RejectReason, TableCommand};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::daemon::admin::{Admin, leader_status};
use crate::daemon::cluster;
use crate::daemon::leader::{COMMIT_TIMEOUT, Job};
use crate::daemon::metrics as m;
use crate::sync_service::{ClusterClock, system_now};

/// Longest region name a call takes (names are the limits' weight keys).
pub const MAX_REGION_NAME_BYTES: usize = 255;

/// How long a change waits for the leader's task to take the job and commit it (a round the
/// task had polled commits first).
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(3 * COMMIT_TIMEOUT.as_secs());

type Reply = (StatusCode, Json<Value>);

fn error(status: StatusCode, msg: impl Into<String>) -> Reply {
    (status, Json(json!({ "error": msg.into() })))
}

#[derive(Serialize)]
struct RegionEntry {
    region: RegionId,
    /// Its weight as a member in ppm; `None`: the default weight (or the limits' own).
    weight_ppm: Option<u32>,
    removed: bool,
    /// The leader's clock when it removed the region.
    removed_at_unix_ms: Option<u64>,
    /// Limits whose floor the table reclaimed from it, with the first window reclaimed.
    reclaimed: BTreeMap<LimitId, u64>,
    /// When the leader last heard it (on the leader, once heard since it leads).
    last_heard_unix_ms: Option<u64>,
    sync_lag_ms: Option<u64>,
}

/// `GET /v1/regions`.
pub async fn list(State(admin): State<Admin>) -> Json<Value> {
    let leader = leader_status(&admin).await;
    // The leader heard the regions on cluster time (D47).
    let clock =
        ClusterClock::with_offset(leader.as_ref().map_or(0, |l| l.cluster_clock_offset_nanos));
    let heard: BTreeMap<RegionId, u64> = leader
        .map(|l| {
            l.regions
                .into_iter()
                .map(|r| (r.region, r.last_heard_unix_ms))
                .collect()
        })
        .unwrap_or_default();
    let now_ms = clock.now().as_unix_millis();
    let (version, regions) = admin.state.read(|a| {
        let table = a.state.table();
        let members = a.state.regions();
        let regions: Vec<RegionEntry> = table
            .regions()
            .iter()
            .map(|r| {
                let removal = table.removed().get(r);
                let reclaimed = table
                    .reclaims()
                    .filter(|((_, region), _)| region == r)
                    .map(|((limit, _), rc)| (limit.clone(), rc.from_window.0))
                    .collect();
                let last_heard = heard.get(r).copied();
                RegionEntry {
                    region: r.clone(),
                    weight_ppm: members.get(r).and_then(|m| m.weight_ppm),
                    removed: removal.is_some(),
                    removed_at_unix_ms: removal.map(|rm| rm.at.as_unix_millis()),
                    reclaimed,
                    last_heard_unix_ms: last_heard,
                    sync_lag_ms: last_heard.map(|h| now_ms.saturating_sub(h)),
                }
            })
            .collect();
        (table.config_version(), regions)
    });
    let leads = cluster::leads(&admin.raft.metrics().borrow());
    Json(json!({ "config_version": version, "leader": leads, "regions": regions }))
}

/// `DELETE /v1/regions/{name}`.
pub async fn remove(State(admin): State<Admin>, Path(name): Path<String>) -> Reply {
    let at = system_now();
    let reply = change(&admin, &name, Change::Remove, |region| {
        TableCommand::RemoveRegion { region, at }
    })
    .await;
    count("remove", &reply);
    reply
}

/// `POST /v1/regions/{name}`.
pub async fn add(State(admin): State<Admin>, Path(name): Path<String>) -> Reply {
    let reply = change(&admin, &name, Change::AddBack, |region| {
        TableCommand::RestoreRegion { region }
    })
    .await;
    count("add", &reply);
    reply
}

fn count(action: &'static str, reply: &Reply) {
    let result = match reply.0 {
        StatusCode::OK => "committed",
        StatusCode::MISDIRECTED_REQUEST => "not_leader",
        s if s.is_server_error() => "failed",
        _ => "refused",
    };
    metrics::counter!(m::REGION_CHANGES, "action" => action, "result" => result).increment(1);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    Remove,
    AddBack,
}

async fn change(
    admin: &Admin,
    name: &str,
    what: Change,
    cmd: impl FnOnce(RegionId) -> TableCommand,
) -> Reply {
    if name.is_empty() || name.len() > MAX_REGION_NAME_BYTES {
        return error(
            StatusCode::BAD_REQUEST,
            format!("a region name has 1 to {MAX_REGION_NAME_BYTES} bytes"),
        );
    }
    let region = RegionId::new(name);
    let Some(jobs) = admin.slot.sender() else {
        return not_leader(admin);
    };
    // Checked before anything is committed: a change that would do nothing leaves no entry.
    let check = admin
        .state
        .read(|a| precheck(a.state.table(), &region, what));
    if let Err(reply) = check {
        return reply;
    }
    let (reply, answer) = oneshot::channel();
    let job = Job::Table {
        cmd: cmd(region.clone()),
        reply,
    };
    let committed = tokio::time::timeout(CHANGE_TIMEOUT, async {
        jobs.send(job).await.ok()?;
        answer.await.ok()
    })
    .await;
    match committed {
        Ok(Some(ApplyOutcome::Applied)) => {
            let verb = match what {
                Change::Remove => "removed",
                Change::AddBack => "added back",
            };
            tracing::info!(region = %region, "region {verb}");
            (
                StatusCode::OK,
                Json(json!({ "region": region, "removed": what == Change::Remove })),
            )
        }
        Ok(Some(ApplyOutcome::Rejected(reason))) => rejected(&region, &reason),
        Ok(None) | Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the leader gave up before the change was known to commit (leadership lost, or no \
             commit in time); it may still commit: read GET /v1/regions before trying again",
        ),
    }
}

/// What the table would refuse, as the answer it gets.
fn precheck(
    table: &allot_core::rebalance::AllowanceTable,
    region: &RegionId,
    what: Change,
) -> Result<(), Reply> {
    if table.regions().binary_search(region).is_err() {
        return Err(rejected(
            region,
            &RejectReason::UnknownRegion(region.clone()),
        ));
    }
    match (what, table.is_removed(region)) {
        (Change::Remove, true) => Err(rejected(
            region,
            &RejectReason::RegionRemoved(region.clone()),
        )),
        (Change::AddBack, false) => {
            Err(rejected(region, &RejectReason::NotRemoved(region.clone())))
        }
        _ => Ok(()),
    }
}

fn rejected(region: &RegionId, reason: &RejectReason) -> Reply {
    match reason {
        RejectReason::UnknownRegion(_) => error(
            StatusCode::NOT_FOUND,
            format!(
                "region {region} is not known to the table (regions come from the limits' \
                 weights or join with the default weight): GET /v1/regions lists them"
            ),
        ),
        RejectReason::RegionRemoved(_) => error(
            StatusCode::CONFLICT,
            format!("region {region} is already removed"),
        ),
        RejectReason::NotRemoved(_) => error(
            StatusCode::CONFLICT,
            format!("region {region} is not removed: nothing to add back"),
        ),
        other => error(
            StatusCode::CONFLICT,
            format!("the table refused the change: {other}"),
        ),
    }
}

/// `421` naming the leader, or `503` from a leader whose rebalancer is still starting.
fn not_leader(admin: &Admin) -> Reply {
    let metrics = admin.raft.metrics();
    let m = metrics.borrow();
    if cluster::leads(&m) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node leads but its rebalancer is starting: try again in a moment",
        );
    }
    cluster::misdirected(&m, &admin.leader_admin, "change the regions")
}
