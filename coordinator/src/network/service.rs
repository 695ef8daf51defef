//! The receiving side: `allot.raft.v1.RaftService` handing openraft's messages to the local
//! `Raft`. The only place of the crate that speaks `tonic::Status`.

use allot_proto::raft::v1::raft_service_server::RaftService;
use allot_proto::raft::v1::{ClockProbe, ClockReading, RaftReply, RaftRequest};
use allot_proto::tls::{self, Peer};
use openraft::Raft;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::codec::{decode, encode};
use crate::daemon::metrics::{REFUSED_PEERS, SHED};
use crate::network::leader_admin::{LeaderAdmin, ProbeFrom};
use crate::places::{Place, Places};
use crate::sync_service::system_now;
use crate::types::{NodeId, TypeConfig};

/// Raft calls (appends, votes, snapshot chunks, clock probes) a node serves at once. A peer
/// sends one append or snapshot chunk at a time, a vote now and then and a probe a second, so
/// four peers use a few each; one more is refused at once (`RESOURCE_EXHAUSTED`, counted),
/// which raft takes as a lost message and sends again.
pub const MAX_RAFT_CALLS_IN_FLIGHT: usize = 64;

/// Raft calls one node's certificate may have in flight at once (mutual TLS only): so the
/// holder of one member's key cannot take the places of the others.
pub const MAX_RAFT_CALLS_PER_NODE: usize = 16;

/// The raft service of one node.
#[derive(Clone)]
pub struct RaftGrpcService {
    raft: Raft<TypeConfig>,
    cluster: String,
    /// Where the leader's admin HTTP is, as its probes named it.
    leader_admin: Arc<LeaderAdmin>,
    calls: RaftCalls,
}

/// The places of raft calls in flight: node-wide, and per calling node.
#[derive(Clone, Debug)]
struct RaftCalls {
    all: Arc<Semaphore>,
    nodes: Arc<Places<NodeId>>,
}

/// A raft call's places, given back when the call ends.
#[derive(Debug)]
struct RaftCall {
    _all: OwnedSemaphorePermit,
    _node: Option<Place<NodeId>>,
}

impl RaftCalls {
    fn new(all: usize, per_node: usize) -> RaftCalls {
        RaftCalls {
            all: Arc::new(Semaphore::new(all)),
            nodes: Arc::new(Places::new(per_node)),
        }
    }

    /// Places for one more call of `caller` (`None`: plaintext, unnamed), or the status that
    /// refuses it.
    fn take(&self, caller: Option<NodeId>) -> Result<RaftCall, Status> {
        let shed = |what: &'static str, msg: String| {
            metrics::counter!(SHED, "what" => what).increment(1);
            Status::resource_exhausted(msg)
        };
        let node = match caller {
            Some(id) => Some(self.nodes.take(&id).ok_or_else(|| {
                shed(
                    "raft_call_node",
                    format!(
                        "node {id} has {MAX_RAFT_CALLS_PER_NODE} raft calls in flight here: \
                         try again shortly"
                    ),
                )
            })?),
            None => None,
        };
        let all = self.all.clone().try_acquire_owned().map_err(|_| {
            shed(
                "raft_call",
                format!(
                    "this node has {MAX_RAFT_CALLS_IN_FLIGHT} raft calls in flight: try again \
                     shortly"
                ),
            )
        })?;
        Ok(RaftCall {
            _all: all,
            _node: node,
        })
    }
}

impl RaftGrpcService {
    pub fn new(
        raft: Raft<TypeConfig>,
        cluster: impl Into<String>,
        leader_admin: Arc<LeaderAdmin>,
    ) -> RaftGrpcService {
        RaftGrpcService {
            raft,
            cluster: cluster.into(),
            leader_admin,
            calls: RaftCalls::new(MAX_RAFT_CALLS_IN_FLIGHT, MAX_RAFT_CALLS_PER_NODE),
        }
    }

    /// Checks the sender's certificate, takes the call's places and checks its cluster, then
    /// decodes its request. The places are held until the call ends.
    fn open<Req: DeserializeOwned>(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<(Req, RaftCall), Status> {
        let caller = self.member_only(&request)?;
        let call = self.calls.take(caller)?;
        let request = request.into_inner();
        self.same_cluster(&request.cluster)?;
        let req = decode("raft request", &request.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok((req, call))
    }

    /// On TLS, the caller's certificate must name a member node: a node of this node's
    /// membership, or any node while this one has none yet (it waits to be added, and the
    /// leader adding it is not known to it before its first message). Plaintext: anyone.
    /// Returns the calling node, when named.
    fn member_only<T>(&self, request: &Request<T>) -> Result<Option<NodeId>, Status> {
        let refuse = |kind: &'static str, msg: String| {
            metrics::counter!(REFUSED_PEERS, "kind" => kind).increment(1);
            Status::permission_denied(msg)
        };
        let id = match tls::peer_of(request) {
            Ok(None) => return Ok(None),
            Ok(Some(Peer::Node(id))) => id,
            Ok(Some(other)) => {
                return Err(refuse(
                    "not_a_member",
                    format!("raft is between nodes; the certificate names {other}"),
                ));
            }
            Err(e) => return Err(refuse("unnamed", e.to_string())),
        };
        let metrics = self.raft.metrics();
        let membership = metrics.borrow().membership_config.clone();
        let mut nodes = membership.nodes().map(|(n, _)| *n).peekable();
        let known = nodes.peek().is_none() || membership.nodes().any(|(n, _)| *n == id);
        if !known {
            return Err(refuse(
                "not_a_member",
                format!("node {id} is not a member of this node's cluster"),
            ));
        }
        Ok(Some(id))
    }

    fn same_cluster(&self, cluster: &str) -> Result<(), Status> {
        if cluster != self.cluster {
            return Err(Status::failed_precondition(format!(
                "this node is of cluster {:?}, the message of cluster {cluster:?}",
                self.cluster
            )));
        }
        Ok(())
    }
}

/// Encodes raft's answer, an error included: the sender tells the two apart.
fn reply<T: Serialize>(answer: &T) -> Result<Response<RaftReply>, Status> {
    let payload = encode("raft reply", answer).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply { payload }))
}

#[tonic::async_trait]
impl RaftService for RaftGrpcService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let (req, _call) = self.open(request)?;
        reply(&self.raft.append_entries(req).await)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let (req, _call) = self.open(request)?;
        reply(&self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let (req, _call) = self.open(request)?;
        reply(&self.raft.install_snapshot(req).await)
    }

    async fn clock(&self, request: Request<ClockProbe>) -> Result<Response<ClockReading>, Status> {
        let received_at = system_now();
        let caller = self.member_only(&request)?;
        let _call = self.calls.take(caller)?;
        let probe = request.into_inner();
        self.same_cluster(&probe.cluster)?;
        if caller.is_some_and(|c| probe.leader_node != 0 && probe.leader_node != c) {
            return Err(Status::permission_denied(format!(
                "a probe naming node {} as its sender from node {}'s certificate",
                probe.leader_node,
                caller.unwrap_or_default()
            )));
        }
        if !probe.leader_admin_http.is_empty() {
            self.leader_admin.record(ProbeFrom {
                node: probe.leader_node,
                admin_http: probe.leader_admin_http,
            });
        }
        Ok(Response::new(ClockReading {
            received_at_unix_nanos: received_at.as_unix_nanos(),
            sent_at_unix_nanos: system_now().as_unix_nanos(),
            admin_http: self.leader_admin.own().unwrap_or_default().to_owned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_holds_at_most_its_share_and_all_at_most_the_node_cap() {
        let calls = RaftCalls::new(5, 3);
        let mut held: Vec<RaftCall> = (0..3)
            .map(|_| calls.take(Some(1)).expect("node 1's place"))
            .collect();
        let refused = calls.take(Some(1)).expect_err("node 1 is at its share");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("node 1"),
            "{}",
            refused.message()
        );
        held.push(calls.take(Some(2)).expect("node 2 has its own share"));
        held.push(
            calls
                .take(None)
                .expect("an unnamed caller takes from the node's cap"),
        );
        let refused = calls.take(Some(3)).expect_err("the node's cap is full");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(calls.nodes.open(&3), 0, "a refused call holds no place");
        drop(held.remove(0));
        assert!(
            calls.take(Some(1)).is_ok(),
            "a place came back when a call ended"
        );
    }
}
