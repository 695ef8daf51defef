//! The admin API's limits configuration (`allot config put|get`):
//!
//! - `GET /v1/config` on any node: the version in force, the files it was put as, and its
//!   limit ids, from the applied state.
//! - `PUT /v1/config` on the leader: files, checked with the configuration loader against the
//!   version and regions in force, then committed through raft as one `PutConfig` entry by the
//!   leader's task (so its rebalancer takes the new table in log order). A follower answers
//!   `421` naming the leader; nothing is committed from a put that is refused. A put of the
//!   files in force (at no version, or at theirs) commits nothing and is answered `200` with
//!   their version and `"unchanged": true`: a retry whose first answer was lost to a leader
//!   change lands once, not as a second version.
//!
//! Agents take a new version from their next answer on the sync stream (the leader sends the
//! files to a region whose SyncUp names another version).

use std::time::Duration;

use allot_core::sync::{ConfigFile, ConfigFiles, MAX_CONFIG_BYTES};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::daemon::admin::Admin;
use crate::daemon::cluster;
use crate::daemon::leader::{COMMIT_TIMEOUT, Job};
use crate::daemon::metrics as m;
use crate::state::{ClusterCommand, CommandOutcome, Refusal};

/// Largest request body a put takes: the configuration's text, JSON-escaped (a quote or a
/// newline doubles), with room for the envelope.
pub const MAX_PUT_BODY_BYTES: usize = 4 * MAX_CONFIG_BYTES;

/// How long a put waits for the leader's task to take the job and commit it.
const PUT_TIMEOUT: Duration = Duration::from_secs(2 * COMMIT_TIMEOUT.as_secs());

/// The body of `PUT /v1/config`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PutRequest {
    /// The version to put at; absent: one above the version in force.
    #[serde(default)]
    pub version: Option<u64>,
    #[serde(default)]
    pub merge_domains: bool,
    pub files: Vec<PutFile>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PutFile {
    pub name: String,
    pub text: String,
}

type Reply = (StatusCode, Json<Value>);

fn error(status: StatusCode, msg: impl Into<String>) -> Reply {
    (status, Json(json!({ "error": msg.into() })))
}

/// `PUT /v1/config`.
pub async fn put(State(admin): State<Admin>, body: Result<Bytes, BytesRejection>) -> Reply {
    let reply = put_config(&admin, body).await;
    let result = match reply.0 {
        StatusCode::OK => "committed",
        StatusCode::MISDIRECTED_REQUEST => "not_leader",
        s if s.is_server_error() => "failed",
        _ => "refused",
    };
    metrics::counter!(m::CONFIG_PUTS, "result" => result).increment(1);
    reply
}

async fn put_config(admin: &Admin, body: Result<Bytes, BytesRejection>) -> Reply {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let msg = format!(
                "the request body was not read ({e}); a put carries at most {MAX_PUT_BODY_BYTES} bytes"
            );
            return error(e.status(), msg);
        }
    };
    let req: PutRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!(
                "not a configuration put ({e}): expected {{\"version\": N (optional), \
                 \"merge_domains\": bool, \"files\": [{{\"name\": ..., \"text\": ...}}]}}"
            );
            return error(StatusCode::BAD_REQUEST, msg);
        }
    };
    let Some(jobs) = admin.slot.sender() else {
        return not_leader(admin);
    };
    let in_force = admin.state.read(|a| a.state.config_in_force());
    let files = ConfigFiles {
        version: req
            .version
            .unwrap_or_else(|| in_force.version.saturating_add(1)),
        merge_domains: req.merge_domains,
        files: req
            .files
            .into_iter()
            .map(|f| ConfigFile {
                name: f.name,
                text: f.text,
            })
            .collect(),
    };
    let version_given = req.version.is_some();
    if let Some(version) = in_force_for(admin, &files, version_given) {
        return unchanged(admin, version);
    }
    // Checked before anything is committed: a refused put leaves no entry behind.
    if let Err(refusal) = in_force.check(&files) {
        return refused(&refusal);
    }
    let (reply, answer) = oneshot::channel();
    let job = Job::Write {
        cmd: ClusterCommand::PutConfig(files.clone()),
        reply,
    };
    let committed = tokio::time::timeout(PUT_TIMEOUT, async {
        jobs.send(job).await.ok()?;
        answer.await.ok()
    })
    .await;
    match committed {
        Ok(Some(CommandOutcome::Configured { version, .. })) => {
            let rules = admin.state.read(|a| a.state.limits().len());
            (
                StatusCode::OK,
                Json(json!({ "version": version, "rules": rules })),
            )
        }
        Ok(Some(CommandOutcome::Refused(refusal))) => {
            // The same put committed first (a retry racing the attempt it retries).
            match in_force_for(admin, &files, version_given) {
                Some(version) => unchanged(admin, version),
                None => refused(&refusal),
            }
        }
        Ok(Some(other)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the put applied as {other:?}"),
        ),
        Ok(None) | Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the leader gave up before the put was known to commit (leadership lost, or no \
             commit in time); it may still commit: read GET /v1/config before putting again",
        ),
    }
}

/// The version in force if `files` are what is in force (`ClusterState::version_in_force_for`).
fn in_force_for(admin: &Admin, files: &ConfigFiles, version_given: bool) -> Option<u64> {
    admin
        .state
        .read(|a| a.state.version_in_force_for(files, version_given))
}

/// `200` for a put of the configuration in force: nothing committed, its version named.
fn unchanged(admin: &Admin, version: u64) -> Reply {
    let rules = admin.state.read(|a| a.state.limits().len());
    (
        StatusCode::OK,
        Json(json!({ "version": version, "rules": rules, "unchanged": true })),
    )
}

fn refused(refusal: &Refusal) -> Reply {
    match refusal {
        Refusal::StaleVersion { current, .. } => (
            StatusCode::CONFLICT,
            Json(json!({ "error": refusal.to_string(), "current_version": current })),
        ),
        Refusal::BadConfig(problems) => (
            StatusCode::BAD_REQUEST,
            Json(json!({
                "error": "the limits do not load",
                "problems": problems.lines().collect::<Vec<_>>(),
            })),
        ),
        Refusal::RegionsChanged { .. } => error(StatusCode::CONFLICT, refusal.to_string()),
        other => error(StatusCode::BAD_REQUEST, other.to_string()),
    }
}

/// `421 Misdirected Request`, naming the leader as raft knows it (its raft and sync address:
/// the operator's list of admin addresses says which admin address that node has); `503`
/// from a leader whose rebalancer is still starting.
fn not_leader(admin: &Admin) -> Reply {
    let metrics = admin.raft.metrics();
    let m = metrics.borrow();
    if cluster::leads(&m) {
        // Elected, but its rebalancer (which commits every configuration change) is starting.
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node leads but its rebalancer is starting: put again in a moment",
        );
    }
    cluster::misdirected(&m, &admin.leader_admin, "put the configuration")
}

/// `GET /v1/config`: the configuration in force on this node's applied state.
pub async fn get(State(admin): State<Admin>) -> Json<Value> {
    let (version, files, limits) = admin.state.read(|a| {
        let limits: Vec<String> = a
            .state
            .limits()
            .iter()
            .map(|l| l.id.as_str().to_owned())
            .collect();
        (
            a.state.table().config_version(),
            a.state.config_files(),
            limits,
        )
    });
    Json(json!({
        "version": version,
        "merge_domains": files.as_ref().map(|f| f.merge_domains),
        "files": files.map(|f| {
            f.files
                .into_iter()
                .map(|f| json!({ "name": f.name, "text": f.text }))
                .collect::<Vec<_>>()
        }),
        "limits": limits,
    }))
}
