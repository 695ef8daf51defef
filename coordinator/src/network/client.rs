//! openraft's `RaftNetwork` over a tonic channel to one peer.
//!
//! The channel is opened on first use and dropped after a transport failure, so a peer that
//! restarts is reached again on the next call; openraft itself backs off between attempts at
//! an unreachable peer. Each call is bounded by openraft's hard TTL for it.

use std::time::Duration;

use allot_proto::raft::v1::raft_service_client::RaftServiceClient;
use allot_proto::raft::v1::{RaftReply, RaftRequest};
use allot_proto::tls::Dialer;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RPCTypes};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::codec::{decode, encode};
use crate::types::{NodeId, TypeConfig};

/// How long opening a connection to a peer may take before the call counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Makes a [`PeerClient`] for each peer openraft replicates to or asks for votes.
#[derive(Clone, Debug)]
pub struct GrpcNetwork {
    /// This node's id and cluster, sent with every message.
    node_id: NodeId,
    cluster: String,
    /// Plaintext, or TLS with this node's certificate.
    dialer: Dialer,
}

impl GrpcNetwork {
    pub fn new(node_id: NodeId, cluster: impl Into<String>, dialer: Dialer) -> GrpcNetwork {
        GrpcNetwork {
            node_id,
            cluster: cluster.into(),
            dialer,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            node_id: self.node_id,
            cluster: self.cluster.clone(),
            target,
            addr: node.addr.clone(),
            dialer: self.dialer.clone(),
            client: None,
        }
    }
}

/// The connection to one peer.
pub struct PeerClient {
    node_id: NodeId,
    cluster: String,
    target: NodeId,
    /// `host:port` of the peer's gRPC listener, as its membership entry names it.
    addr: String,
    dialer: Dialer,
    client: Option<RaftServiceClient<Channel>>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl PeerClient {
    async fn client<E: std::error::Error>(&mut self) -> RpcResult<RaftServiceClient<Channel>, E> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let endpoint = self
            .dialer
            .endpoint(&self.addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let client = RaftServiceClient::new(channel);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Sends `req` as `action` and decodes the peer's answer: its response, or the error its
    /// raft returned (a remote error).
    async fn call<Req, Resp, E>(
        &mut self,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = encode("raft request", req).map_err(|e| network_error(&e))?;
        let request = RaftRequest {
            cluster: self.cluster.clone(),
            payload,
        };
        let mut client = self.client().await?;
        let sent = async {
            match action {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let timeout = option.hard_ttl();
        let reply: RaftReply = match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => return Err(self.status_error(status)),
            Err(_) => {
                return Err(RPCError::Timeout(Timeout {
                    action,
                    id: self.node_id,
                    target: self.target,
                    timeout,
                }));
            }
        };
        let answer: Result<Resp, E> =
            decode("raft reply", &reply.payload).map_err(|e| network_error(&e))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// A transport failure drops the channel (the next call reconnects); a refusal by the
    /// peer's service (another cluster, a payload it cannot read) is a network error.
    fn status_error<E: std::error::Error>(
        &mut self,
        status: tonic::Status,
    ) -> RPCError<NodeId, BasicNode, E> {
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                self.client = None;
                RPCError::Unreachable(Unreachable::new(&status))
            }
            _ => network_error(&status),
        }
    }
}

fn network_error<E: std::error::Error>(
    e: &(impl std::error::Error + 'static),
) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(e))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.call(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(RPCTypes::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(RPCTypes::Vote, &rpc, &option).await
    }
}
