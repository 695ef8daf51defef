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

use crate::codec::{decode, encode};
use crate::daemon::metrics::REFUSED_PEERS;
use crate::network::leader_admin::{LeaderAdmin, ProbeFrom};
use crate::sync_service::system_now;
use crate::types::{NodeId, TypeConfig};

/// The raft service of one node.
#[derive(Clone)]
pub struct RaftGrpcService {
    raft: Raft<TypeConfig>,
    cluster: String,
    /// Where the leader's admin HTTP is, as its probes named it.
    leader_admin: Arc<LeaderAdmin>,
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
        }
    }

    /// Checks the sender's certificate and cluster and decodes its request.
    fn open<Req: DeserializeOwned>(&self, request: Request<RaftRequest>) -> Result<Req, Status> {
        self.member_only(&request)?;
        let request = request.into_inner();
        self.same_cluster(&request.cluster)?;
        decode("raft request", &request.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))
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
        let req = self.open(request)?;
        reply(&self.raft.append_entries(req).await)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = self.open(request)?;
        reply(&self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = self.open(request)?;
        reply(&self.raft.install_snapshot(req).await)
    }

    async fn clock(&self, request: Request<ClockProbe>) -> Result<Response<ClockReading>, Status> {
        let received_at = system_now();
        let caller = self.member_only(&request)?;
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
