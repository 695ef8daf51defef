//! The receiving side: `allot.raft.v1.RaftService` handing openraft's messages to the local
//! `Raft`. The only place of the crate that speaks `tonic::Status`.

use allot_proto::raft::v1::raft_service_server::RaftService;
use allot_proto::raft::v1::{ClockProbe, ClockReading, RaftReply, RaftRequest};
use openraft::Raft;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use std::sync::Arc;

use crate::codec::{decode, encode};
use crate::network::leader_admin::{LeaderAdmin, ProbeFrom};
use crate::sync_service::system_now;
use crate::types::TypeConfig;

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

    /// Checks the sender's cluster and decodes its request.
    fn open<Req: DeserializeOwned>(&self, request: Request<RaftRequest>) -> Result<Req, Status> {
        let request = request.into_inner();
        self.same_cluster(&request.cluster)?;
        decode("raft request", &request.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))
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
        let probe = request.into_inner();
        self.same_cluster(&probe.cluster)?;
        if !probe.leader_admin_http.is_empty() {
            self.leader_admin.record(ProbeFrom {
                node: probe.leader_node,
                admin_http: probe.leader_admin_http,
            });
        }
        Ok(Response::new(ClockReading {
            received_at_unix_nanos: received_at.as_unix_nanos(),
            sent_at_unix_nanos: system_now().as_unix_nanos(),
        }))
    }
}
