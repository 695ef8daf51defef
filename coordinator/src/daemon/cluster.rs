//! The admin API's cluster membership (`allot cluster members|add-node|remove-node`), and who
//! this node says leads (for the sync stream's redirects and every admin call's `421`).
//!
//! - `GET /v1/cluster/nodes` on any node: the voters and learners of the membership it holds,
//!   and the leader it knows.
//! - `POST /v1/cluster/nodes` `{"id": N, "address": "HOST:PORT"}` on the leader: the node is
//!   added as a learner (openraft's `add_learner`), the call waits until it has caught up to
//!   the membership entry that added it (at most [`CATCH_UP_TIMEOUT`]), then makes it a voter
//!   (`change_membership`, a joint entry then the new one).
//! - `DELETE /v1/cluster/nodes/{id}` on the leader: the voter is removed by
//!   `change_membership`. A follower is first left a learner, so that the entry saying it no
//!   longer votes reaches it (it then never stands for election), and then removed; the
//!   leader removes itself in one change and steps down once it is committed.
//!
//! A node that does not lead answers `421` naming the leader; membership entries change no
//! table row, so they do not go through the rebalancer's task. One change at a time per node
//! (a second one meanwhile is `409`), and openraft refuses a change while another is in its
//! joint phase.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{BasicNode, ChangeMembers, Membership, RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::daemon::admin::Admin;
use crate::network::LeaderAdmin;
use crate::sync_service::LeaderHint;
use crate::types::{NodeId, TypeConfig};

/// Longest an added node may take to catch up to the entry that added it before the call
/// gives up (it stays a learner: no vote, no quorum counted).
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest one membership change may take to commit (both its entries).
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a removal waits for the follower it removes to receive the entry that takes its
/// vote, before it removes it altogether (a stopped node never does).
pub const REMOVED_NOTICE_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest node address an add takes (`HOST:PORT`).
pub const MAX_ADDRESS_BYTES: usize = 255;

/// Largest body an add takes.
pub const MAX_ADD_BODY_BYTES: usize = 4 * 1024;

type Metrics = RaftMetrics<NodeId, BasicNode>;
type Reply = (StatusCode, Json<Value>);
type ChangeError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// This node's place in the membership it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Voter,
    Learner,
    /// Not in the membership: a node started with `--join` and not added yet, or one removed
    /// whose last membership no longer names it.
    NotMember,
}

pub fn role_of(membership: &Membership<NodeId, BasicNode>, id: NodeId) -> Role {
    if membership.voter_ids().any(|v| v == id) {
        Role::Voter
    } else if membership.get_node(&id).is_some() {
        Role::Learner
    } else {
        Role::NotMember
    }
}

/// This node leads (its rebalancer may still be starting).
pub fn leads(m: &Metrics) -> bool {
    m.state == ServerState::Leader && m.current_leader == Some(m.id)
}

/// The leader as this node knows it, never itself unless it leads: a leader that removed
/// itself keeps its own committed vote after it steps down.
pub fn known_leader(m: &Metrics) -> Option<NodeId> {
    m.current_leader.filter(|l| *l != m.id || leads(m))
}

/// Where this node sends an agent or an admin call: the known leader's address; a node that
/// does not vote (removed, or a learner) and knows no leader names a voter of the last
/// membership it holds, which sends the caller on to the leader.
pub fn redirect_address(m: &Metrics) -> Option<String> {
    redirect_target(m).map(|t| t.address)
}

/// [`redirect_address`] with the raft id of the node it names.
pub fn redirect_target(m: &Metrics) -> Option<LeaderHint> {
    let membership = m.membership_config.membership();
    let target = if let Some(leader) = known_leader(m) {
        leader
    } else if role_of(membership, m.id) == Role::Voter {
        return None;
    } else {
        membership.voter_ids().find(|v| *v != m.id)?
    };
    membership.get_node(&target).map(|n| LeaderHint {
        node_id: target,
        address: n.addr.clone(),
    })
}

fn error(status: StatusCode, msg: impl Into<String>) -> Reply {
    (status, Json(json!({ "error": msg.into() })))
}

/// `421 Misdirected Request` from a node that does not lead: the leader's id and raft address
/// as this node knows them (the address may be only a member that knows the leader, from a
/// removed node), and the leader's admin address where its clock probes named it to this node
/// (`leader_admin_http`, which the CLI follows).
pub fn misdirected(m: &Metrics, admin: &LeaderAdmin, to: &str) -> Reply {
    let leader = known_leader(m);
    (
        StatusCode::MISDIRECTED_REQUEST,
        Json(json!({
            "error": format!("node {} does not lead: {to} on the leader", m.id),
            "leader": leader,
            "leader_address": redirect_address(m),
            "leader_admin_http": leader.and_then(|l| admin.of(l)),
        })),
    )
}

#[derive(Serialize)]
struct Node {
    id: NodeId,
    address: String,
}

/// The membership `m` holds, as JSON.
fn members_json(m: &Metrics) -> Value {
    let membership = m.membership_config.membership();
    let node = |id: NodeId| Node {
        id,
        address: membership
            .get_node(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default(),
    };
    let voters: Vec<Node> = membership.voter_ids().map(node).collect();
    let learners: Vec<Node> = membership.learner_ids().map(node).collect();
    let leader = known_leader(m);
    json!({
        "node": m.id,
        "role": role_of(membership, m.id),
        "leader": leader,
        "leader_address": leader.and_then(|l| membership.get_node(&l).map(|n| n.addr.clone())),
        "voters": voters,
        "learners": learners,
        "joint": membership.get_joint_config().len() > 1,
        "membership_log_index": m.membership_config.log_id().as_ref().map(|l| l.index),
    })
}

/// `GET /v1/cluster/nodes`.
pub async fn members(State(admin): State<Admin>) -> Json<Value> {
    let m = admin.raft.metrics().borrow().clone();
    Json(members_json(&m))
}

/// The body of `POST /v1/cluster/nodes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddRequest {
    pub id: NodeId,
    /// The node's `--grpc` address as the other nodes (and agents) reach it.
    pub address: String,
}

/// `POST /v1/cluster/nodes`.
pub async fn add(State(admin): State<Admin>, body: Result<Bytes, BytesRejection>) -> Reply {
    let req = match parse_add(body) {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    let Ok(_one_at_a_time) = admin.membership.clone().try_lock_owned() else {
        return in_progress_here();
    };
    let m = admin.raft.metrics().borrow().clone();
    if !leads(&m) {
        return misdirected(&m, &admin.leader_admin, "change the membership");
    }
    if let Err(reply) = check_add(&m, &req) {
        return reply;
    }
    let node = BasicNode::new(req.address.clone());
    let added = change(admin.raft.add_learner(req.id, node, false)).await;
    let added = match added {
        Ok(w) => w,
        Err(reply) => return reply,
    };
    if let Err(reply) = catch_up(&admin, req.id, &req.address, added.log_id.index).await {
        return reply;
    }
    let voters = ChangeMembers::AddVoterIds(BTreeSet::from([req.id]));
    if let Err(reply) = change(admin.raft.change_membership(voters, false)).await {
        return reply;
    }
    tracing::info!(node = req.id, address = %req.address, "node added as a voter");
    let m = admin.raft.metrics().borrow().clone();
    (StatusCode::OK, Json(members_json(&m)))
}

fn parse_add(body: Result<Bytes, BytesRejection>) -> Result<AddRequest, Reply> {
    let body = body.map_err(|e| error(e.status(), format!("the body was not read: {e}")))?;
    let req: AddRequest = serde_json::from_slice(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("not a node to add ({e}): expected {{\"id\": N, \"address\": \"HOST:PORT\"}}"),
        )
    })?;
    check_address(&req.address).map_err(|msg| error(StatusCode::BAD_REQUEST, msg))?;
    Ok(req)
}

/// `HOST:PORT` with a port number; the host is resolved by the network on use.
fn check_address(address: &str) -> Result<(), String> {
    let bad = || format!("address {address:?}: expected HOST:PORT (the node's --grpc)");
    if address.is_empty() || address.len() > MAX_ADDRESS_BYTES {
        return Err(bad());
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.chars().any(char::is_whitespace) || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(())
}

/// An add that would change nothing or clash with a member: `409`.
fn check_add(m: &Metrics, req: &AddRequest) -> Result<(), Reply> {
    let membership = m.membership_config.membership();
    let conflict = |msg: String| Err(error(StatusCode::CONFLICT, msg));
    if let Some(n) = membership.get_node(&req.id) {
        if role_of(membership, req.id) == Role::Voter {
            return conflict(format!("node {} is already a voter at {}", req.id, n.addr));
        }
        if n.addr != req.address {
            return conflict(format!(
                "node {} is a learner at {}: remove it first to add it at another address",
                req.id, n.addr
            ));
        }
    }
    if let Some((other, _)) = membership
        .nodes()
        .find(|(id, n)| **id != req.id && n.addr == req.address)
    {
        return conflict(format!("node {other} already has address {}", req.address));
    }
    Ok(())
}

/// Waits until the leader has replicated to `id` the entry at `index` (the one that added
/// it): `504` if it does not in [`CATCH_UP_TIMEOUT`], `503` if this node stops leading.
async fn catch_up(admin: &Admin, id: NodeId, address: &str, index: u64) -> Result<(), Reply> {
    let mut metrics = admin.raft.metrics();
    let caught_up = |m: &Metrics| matched_index(m, id).is_some_and(|i| i >= index);
    let waited = tokio::time::timeout(
        CATCH_UP_TIMEOUT,
        metrics.wait_for(|m| caught_up(m) || !leads(m)),
    )
    .await;
    match waited {
        Ok(Ok(m)) if caught_up(&m) => Ok(()),
        Ok(_) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "this node stopped leading while node {id} caught up; it is a learner (no \
                 vote): add it again on the leader"
            ),
        )),
        Err(_) => Err(error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "node {id} was added as a learner at {address} but did not catch up within \
                 {CATCH_UP_TIMEOUT:?}: is it running there with --join? It stays a learner (no \
                 vote) until add-node is called again or remove-node removes it"
            ),
        )),
    }
}

/// The last log index the leader knows `id` holds.
fn matched_index(m: &Metrics, id: NodeId) -> Option<u64> {
    m.replication.as_ref()?.get(&id)?.as_ref().map(|l| l.index)
}

/// `DELETE /v1/cluster/nodes/{id}`.
pub async fn remove(State(admin): State<Admin>, Path(id): Path<String>) -> Reply {
    let Ok(id) = id.parse::<NodeId>() else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("node id {id:?} is not a number"),
        );
    };
    let Ok(_one_at_a_time) = admin.membership.clone().try_lock_owned() else {
        return in_progress_here();
    };
    let m = admin.raft.metrics().borrow().clone();
    if !leads(&m) {
        return misdirected(&m, &admin.leader_admin, "change the membership");
    }
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let removed = match role_of(membership, id) {
        Role::NotMember => {
            let ids: Vec<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
            return error(
                StatusCode::NOT_FOUND,
                format!("node {id} is not a member (members: {ids:?})"),
            );
        }
        Role::Voter if voters.len() == 1 => {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "node {id} is the last voter: removing it would leave no voter (add \
                     another node first)"
                ),
            );
        }
        Role::Learner => remove_nodes(&admin, id).await.map(|_| ()),
        Role::Voter if id == m.id => remove_voter(&admin, id, false).await.map(|_| ()),
        Role::Voter => remove_follower(&admin, id).await,
    };
    if let Err(reply) = removed {
        return reply;
    }
    tracing::info!(node = id, "node removed from the cluster");
    let after = admin.raft.metrics().borrow().clone();
    let mut answer = members_json(&after);
    answer["removed"] = json!(id);
    if id == m.id {
        answer["leader"] = Value::Null;
        answer["leader_address"] = Value::Null;
        answer["note"] = json!(
            "this node removed itself: it steps down, and the remaining voters elect a leader"
        );
    }
    (StatusCode::OK, Json(answer))
}

/// A follower's removal: first left a learner (still replicated to, so it receives the entry
/// that takes its vote and never stands for election), then removed.
async fn remove_follower(admin: &Admin, id: NodeId) -> Result<(), Reply> {
    let learner = remove_voter(admin, id, true).await?;
    let mut metrics = admin.raft.metrics();
    let heard = metrics
        .wait_for(|m| matched_index(m, id).is_some_and(|i| i >= learner.log_id.index) || !leads(m));
    if tokio::time::timeout(REMOVED_NOTICE_TIMEOUT, heard)
        .await
        .is_err()
    {
        tracing::info!(
            node = id,
            "the removed node did not receive its removal (stopped?): removing it anyway"
        );
    }
    remove_nodes(admin, id).await.map(|_| ())
}

async fn remove_voter(
    admin: &Admin,
    id: NodeId,
    retain: bool,
) -> Result<ClientWriteResponse<TypeConfig>, Reply> {
    let change_members = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
    change(admin.raft.change_membership(change_members, retain)).await
}

async fn remove_nodes(admin: &Admin, id: NodeId) -> Result<ClientWriteResponse<TypeConfig>, Reply> {
    let change_members = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
    change(admin.raft.change_membership(change_members, false)).await
}

/// One membership change, bounded by [`CHANGE_TIMEOUT`], its failure as an answer.
async fn change(
    changed: impl Future<Output = Result<ClientWriteResponse<TypeConfig>, ChangeError>>,
) -> Result<ClientWriteResponse<TypeConfig>, Reply> {
    match tokio::time::timeout(CHANGE_TIMEOUT, changed).await {
        Ok(Ok(written)) => Ok(written),
        Ok(Err(e)) => Err(change_failed(e)),
        Err(_) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the membership change was not known to commit within {CHANGE_TIMEOUT:?} (no \
                 quorum?); it may still commit: read GET /v1/cluster/nodes before trying again"
            ),
        )),
    }
}

fn change_failed(e: ChangeError) -> Reply {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => (
            StatusCode::MISDIRECTED_REQUEST,
            Json(json!({
                "error": "this node no longer leads: change the membership on the leader",
                "leader": f.leader_id,
                "leader_address": f.leader_node.map(|n| n.addr),
            })),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            let msg = match c {
                ChangeMembershipError::InProgress(p) => format!(
                    "another membership change is in progress ({p}): try again when it has \
                     committed"
                ),
                ChangeMembershipError::EmptyMembership(_) => {
                    "the change would leave no voter".to_owned()
                }
                ChangeMembershipError::LearnerNotFound(l) => l.to_string(),
            };
            error(StatusCode::CONFLICT, msg)
        }
        RaftError::Fatal(f) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("raft stopped: {f}"),
        ),
    }
}

fn in_progress_here() -> Reply {
    error(
        StatusCode::CONFLICT,
        "another membership change is being made on this node: try again when it is answered",
    )
}

/// The lock that keeps one membership change at a time on a node.
pub type ChangeLock = Arc<tokio::sync::Mutex<()>>;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parsed(body: &[u8]) -> Result<AddRequest, Reply> {
        parse_add(Ok(Bytes::copy_from_slice(body)))
    }

    /// What `check_address` must accept, written out on its own.
    fn valid_address(address: &str) -> bool {
        let Some((host, port)) = address.rsplit_once(':') else {
            return false;
        };
        address.len() <= MAX_ADDRESS_BYTES
            && !host.is_empty()
            && !host.chars().any(char::is_whitespace)
            && port.parse::<u16>().is_ok()
    }

    fn address() -> impl Strategy<Value = String> {
        let host = prop_oneof![
            Just(String::new()),
            "[a-z0-9.-]{1,20}",
            "\\[[0-9a-f:]{2,20}\\]",
            "[a-z]{1,5}[ \t\n][a-z]{1,5}",
            "\\PC{1,10}",
            "[a-z]{300}",
        ];
        let port = prop_oneof![
            Just(String::new()),
            (0u32..70_000).prop_map(|p| p.to_string()),
            "[0-9]{6,12}",
            "-[0-9]{1,4}",
            "[a-z]{1,4}",
        ];
        (host, prop::option::of(port)).prop_map(|(h, p)| match p {
            Some(p) => format!("{h}:{p}"),
            None => h,
        })
    }

    proptest! {
        /// Any bytes: a request, or a 400 with an error body; never a panic.
        #[test]
        fn any_body_is_a_node_or_a_bad_request(body in prop::collection::vec(any::<u8>(), 0..300)) {
            match parsed(&body) {
                Ok(req) => prop_assert!(valid_address(&req.address), "{req:?}"),
                Err((status, Json(v))) => {
                    prop_assert_eq!(status, StatusCode::BAD_REQUEST);
                    prop_assert!(v["error"].is_string());
                }
            }
        }

        /// Well-formed JSON around drawn ids and addresses: accepted exactly when the address
        /// is `HOST:PORT` as documented, with the id and address unchanged.
        #[test]
        fn a_node_is_accepted_exactly_when_its_address_is_host_port(
            id in any::<u64>(),
            address in address(),
            extra in prop::option::of("x_[a-z]{1,8}"),
        ) {
            let mut body = json!({ "id": id, "address": address });
            if let Some(field) = &extra {
                body[field.as_str()] = json!(1);
            }
            let known = extra.is_none();
            match parsed(body.to_string().as_bytes()) {
                Ok(req) => {
                    prop_assert!(known && valid_address(&address));
                    prop_assert_eq!(req.id, id);
                    prop_assert_eq!(req.address, address);
                }
                Err((status, Json(v))) => {
                    prop_assert!(!known || !valid_address(&address), "{v}");
                    prop_assert_eq!(status, StatusCode::BAD_REQUEST);
                }
            }
        }
    }

    #[test]
    fn the_documented_shape_parses_and_near_misses_say_what_is_expected() {
        let ok = parsed(br#"{"id": 4, "address": "10.0.0.4:7001"}"#).expect("a node");
        assert_eq!((ok.id, ok.address.as_str()), (4, "10.0.0.4:7001"));
        for bad in [
            &br#"{"id": -1, "address": "h:1"}"#[..],
            br#"{"id": 4}"#,
            br#"{"id": 4, "address": "h:1", "voter": true}"#,
            br#"{"id": 4, "address": "h"}"#,
            br#"{"id": 4, "address": "h:65536"}"#,
            br#"{"id": 4, "address": ":1"}"#,
            b"\xff\xfe",
        ] {
            let Err((status, Json(v))) = parsed(bad) else {
                panic!("accepted {:?}", String::from_utf8_lossy(bad));
            };
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let msg = v["error"].as_str().expect("an error");
            assert!(msg.contains("HOST:PORT"), "{msg}");
        }
    }
}
