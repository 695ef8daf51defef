//! One coordinator node's raft, wired: its storage in the data directory, the gRPC network
//! to its peers and the raft service on its listener. The daemon adds the sync stream and the
//! rebalancer driver beside it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_proto::raft::v1::raft_service_server::RaftServiceServer;
use openraft::storage::RaftLogStorage;
use openraft::{Config, Raft, Vote};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;

use allot_proto::tls::{Dialer, Serving, Tls, tls_incoming};

use crate::error::{Error, Result};
use crate::network::{GrpcNetwork, LeaderAdmin, RaftGrpcService};
use crate::raft_config::MAX_RAFT_MESSAGE_BYTES;
use crate::store::{self, StateReader};
use crate::types::{NodeId, TypeConfig};

/// Longest a stopping node waits for its open streams to end before closing them.
pub const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a node is started with.
#[derive(Debug)]
pub struct NodeSettings {
    pub id: NodeId,
    /// Where the raft log, vote and snapshots live.
    pub data_dir: PathBuf,
    /// openraft's settings; its `cluster_name` is checked on every message between nodes.
    pub raft: Config,
    /// Mutual TLS on raft and the sync stream (D58); `None`: plaintext.
    pub tls: Option<Tls>,
}

/// A running node: its raft handle, a reader of its applied state, and its gRPC server.
pub struct RaftNode {
    pub raft: Raft<TypeConfig>,
    pub state: StateReader,
    /// Where the leader's admin HTTP is, as its clock probes named it.
    pub leader_admin: Arc<LeaderAdmin>,
    /// How this node dials the others (TLS with its certificate, or plaintext).
    pub dialer: Dialer,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

/// A node that finds its own committed vote in its directory keeps the vote but not the
/// leadership: the vote is stored again uncommitted, so the node stands for a new term like
/// any other instead of leading again in the stored one (what openraft does with a committed
/// vote for itself, at once, with no election and no entry of its own). A directory that went
/// back in time (a restored copy) holds an old committed vote with an old log: leading again in
/// that term, the node wrote entries under log ids the others already hold for other entries,
/// which they took as the same ones and committed, each node then applying its own (D36).
/// Standing in a new term, it must win an election, which a log behind the others' cannot.
async fn stand_down_from_a_stored_leadership(log: &mut store::LogStore, id: NodeId) -> Result<()> {
    let stored = log
        .read_vote()
        .await
        .map_err(|e| Error::Raft(format!("read the stored vote: {e}")))?;
    let Some(vote) = stored else {
        return Ok(());
    };
    if !vote.is_committed() || vote.leader_id().voted_for() != Some(id) {
        return Ok(());
    }
    let uncommitted = Vote::new(vote.leader_id().term, id);
    log.save_vote(&uncommitted)
        .await
        .map_err(|e| Error::Raft(format!("store the vote uncommitted: {e}")))?;
    tracing::info!(
        term = vote.leader_id().term,
        "led before the restart: stands for a new term"
    );
    Ok(())
}

impl RaftNode {
    /// Opens the storage in `settings.data_dir` (recovering what a previous run left), starts
    /// raft and serves it on `listener`.
    pub async fn start(settings: NodeSettings, listener: TcpListener) -> Result<RaftNode> {
        Self::start_with(settings, listener, |_, _| Routes::default()).await
    }

    /// As [`RaftNode::start`], serving beside raft the services `extra` builds from the raft
    /// handle and the state reader (the daemon's sync stream).
    pub async fn start_with(
        settings: NodeSettings,
        listener: TcpListener,
        extra: impl FnOnce(&Raft<TypeConfig>, &StateReader) -> Routes,
    ) -> Result<RaftNode> {
        let (mut log_store, state_machine) = store::open(&settings.data_dir)?;
        stand_down_from_a_stored_leadership(&mut log_store, settings.id).await?;
        let state = state_machine.reader();
        let cluster = settings.raft.cluster_name.clone();
        let dialer = settings
            .tls
            .as_ref()
            .map_or_else(Dialer::plaintext, Dialer::with_tls);
        let network = GrpcNetwork::new(settings.id, cluster.clone(), dialer.clone());
        let raft = Raft::new(
            settings.id,
            Arc::new(settings.raft),
            network,
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;
        let leader_admin = Arc::new(LeaderAdmin::default());
        let service = RaftGrpcService::new(raft.clone(), cluster, leader_admin.clone());
        let service = RaftServiceServer::new(service)
            .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        let (stop, mut stopped) = watch::channel(false);
        let routes = extra(&raft, &state).add_service(service);
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let builder = tonic::transport::Server::builder().add_routes(routes);
        let server = match &settings.tls {
            // The handshakes are this node's own, so that replaced certificate files apply
            // to the next connection without a restart (D58).
            Some(tls) => {
                let incoming = tls_incoming(listener, tls.clone(), Serving::Peers);
                tokio::spawn(builder.serve_with_incoming_shutdown(incoming, shutdown))
            }
            None => {
                let incoming = TcpListenerStream::new(listener).map(|conn| {
                    // Heartbeats and votes are one small frame each: without this, Nagle holds
                    // them back behind the peer's delayed acknowledgement.
                    conn.and_then(|s| s.set_nodelay(true).map(|()| s))
                });
                tokio::spawn(builder.serve_with_incoming_shutdown(incoming, shutdown))
            }
        };
        Ok(RaftNode {
            raft,
            state,
            leader_admin,
            dialer,
            stop,
            server,
        })
    }

    /// Stops raft (its storage is flushed at every durable step, so nothing more is written)
    /// and the gRPC server.
    pub async fn shutdown(self) -> Result<()> {
        let stopped = self.raft.shutdown().await;
        let _ = self.stop.send(true);
        let mut server = self.server;
        let served = match tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut server).await {
            Ok(joined) => joined.map_err(|e| Error::Raft(format!("raft server task: {e}")))?,
            Err(_) => {
                // A stream that neither ends nor sends (until its idle timeout) must not hold
                // the node: its connections go with the task.
                server.abort();
                Ok(())
            }
        };
        served.map_err(|e| Error::Raft(format!("raft server: {e}")))?;
        stopped.map_err(|e| Error::Raft(format!("raft shutdown: {e}")))
    }
}
