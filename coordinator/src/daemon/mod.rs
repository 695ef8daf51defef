//! The coordinator daemon: one raft node serving raft and the agents' sync stream on its gRPC
//! address and the admin API on its HTTP address, with the leader's rebalancer beside it.
//!
//! - [`handler`]: the sync stream's handler (the leader's rebalancer takes the SyncUp, a
//!   follower names the leader) and the supervisor that runs the rebalancer while this node
//!   leads.
//! - [`leader`]: the rebalancer task and the driver contract over raft.
//! - [`admin`]: `/healthz`, `/v1/status`, `/metrics`; [`config`]: `/v1/config`, the limits
//!   configuration put (`allot config put`) and read; [`cluster`]: `/v1/cluster/nodes`, the
//!   membership read and changed (`allot cluster`); [`regions`]: `/v1/regions`, regions
//!   removed and added back (`allot cluster remove-region|add-region`).
//! - [`limits`]: the limits files given at start, put through raft when the cluster has an
//!   older version.
//!
//! Everything the rebalancer decides is in `allot_core`; this module only moves messages
//! between the wire, the rebalancer and raft.

pub mod admin;
pub mod cluster;
pub mod config;
pub mod dashboard;
pub mod handler;
pub mod leader;
pub mod limits;
pub mod metrics;
pub mod regions;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use allot_core::rebalance::CoordinatorConfig;
use allot_proto::tls::{Peer, Tls, TlsListener};
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Raft};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::error::{Error, Result};
use crate::node::{NodeSettings, RaftNode};
use crate::store::StateReader;
use crate::sync_service::SyncService;
use crate::types::{NodeId, TypeConfig};
use handler::{LeaderSlot, RaftSyncHandler};

/// What a daemon is started with.
#[derive(Debug)]
pub struct DaemonSettings {
    pub id: NodeId,
    /// Every initial member's id and gRPC address (raft and sync), this node included. Empty:
    /// a single-node cluster at this node's gRPC listener. Used only to initialise a fresh
    /// cluster; afterwards the membership is what raft committed.
    pub peers: BTreeMap<NodeId, String>,
    /// Start empty and wait to be added (`allot cluster add-node`): never initialise a
    /// cluster, even a single-node one. Excludes `peers`.
    pub join: bool,
    pub data_dir: PathBuf,
    pub raft: openraft::Config,
    /// The rebalancer's settings; `sync_interval` and `view_ttl` must be the agents'.
    pub rebalance: CoordinatorConfig,
    /// Limits to put when the cluster holds an older version.
    pub limits: Option<limits::StartLimits>,
    /// Mutual TLS on raft and the sync stream (D58); `None`: plaintext, logged loudly.
    pub tls: Option<Tls>,
    /// The SHA-256 of the token the admin HTTP's changes (configuration, membership,
    /// regions) must carry as `Authorization: Bearer` (D60); `None`: anyone may, warned.
    pub admin_token_sha256: Option<[u8; 32]>,
    /// The SHA-256 of the token the admin HTTP's reads (status, configuration, members,
    /// regions, metrics) must carry, or the admin token (D63); `None`: reads are open. The
    /// dashboard's page and `/healthz` stay open.
    pub read_token_sha256: Option<[u8; 32]>,
    /// Serve the admin HTTP over TLS with `tls`'s certificate (D60).
    pub admin_tls: bool,
}

/// A running coordinator node.
pub struct Daemon {
    node: RaftNode,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Opens the node's storage in `settings.data_dir`, serves raft and sync on `grpc` and
    /// the admin API on `http`, initialises a fresh cluster with `settings.peers` (unless it
    /// joins: then it waits for the cluster to add it), and runs the rebalancer whenever this
    /// node leads.
    pub async fn start(
        settings: DaemonSettings,
        grpc: TcpListener,
        http: TcpListener,
    ) -> Result<Daemon> {
        let prometheus = metrics::install()?;
        let grpc_addr = local_addr(&grpc)?;
        let http_addr = local_addr(&http)?;
        let members = if settings.join {
            if !settings.peers.is_empty() {
                return Err(Error::Config(
                    "a joining node takes no --peers: the cluster adds it".to_owned(),
                ));
            }
            None
        } else {
            Some(initial_members(settings.id, &settings.peers, grpc_addr)?)
        };
        check_identity(settings.id, settings.tls.as_ref())?;
        let admin_tls = match (settings.admin_tls, &settings.tls) {
            (true, Some(tls)) => Some(tls.clone()),
            (true, None) => {
                return Err(Error::Config(
                    "--admin-tls needs --tls-cert, --tls-key and --tls-ca".to_owned(),
                ));
            }
            (false, _) => None,
        };
        if settings.admin_token_sha256.is_none() {
            tracing::warn!(
                "no admin token: anyone who reaches the admin HTTP may change the limits, the \
                 membership and the regions (--admin-token-sha256, docs/security.md)"
            );
        }
        let slot = Arc::new(LeaderSlot::default());
        let (stop, stopping) = watch::channel(false);
        let node = start_node(&settings, grpc, slot.clone(), stopping.clone()).await?;
        if let Some(members) = members {
            initialize(&node.raft, members).await?;
        }
        node.leader_admin.set_own(http_addr.to_string());
        let mut tasks = vec![tokio::spawn(handler::supervise(
            node.raft.clone(),
            node.state.clone(),
            slot.clone(),
            settings.rebalance.clone(),
            node.leader_admin.clone(),
            node.dialer.clone(),
            stopping.clone(),
        ))];
        if let Some(start_limits) = settings.limits {
            let put = limits::put_when_older(
                node.state.clone(),
                slot.clone(),
                start_limits,
                stopping.clone(),
            );
            tasks.push(tokio::spawn(put));
        }
        let admin = admin::Admin {
            raft: node.raft.clone(),
            state: node.state.clone(),
            slot,
            prometheus,
            membership: cluster::ChangeLock::default(),
            leader_admin: node.leader_admin.clone(),
            admin_http: http_addr.to_string(),
            admin_token_sha256: settings.admin_token_sha256,
            read_token_sha256: settings.read_token_sha256,
        };
        tasks.push(tokio::spawn(serve_admin(http, admin_tls, admin, stopping)));
        Ok(Daemon {
            node,
            grpc_addr,
            http_addr,
            stop,
            tasks,
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.node.raft
    }

    /// The applied state, read beside raft.
    pub fn state(&self) -> &StateReader {
        &self.node.state
    }

    /// Stops the node: agents' streams are refused from now on (they go to another node),
    /// the rebalancer is dropped, then raft and both servers stop.
    pub async fn shutdown(self) -> Result<()> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        self.node.shutdown().await
    }
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr> {
    listener
        .local_addr()
        .map_err(|e| Error::Config(format!("listener address: {e}")))
}

/// The members a fresh cluster starts with: `peers`, or this node alone at `grpc_addr`.
fn initial_members(
    id: NodeId,
    peers: &BTreeMap<NodeId, String>,
    grpc_addr: SocketAddr,
) -> Result<BTreeMap<NodeId, BasicNode>> {
    if peers.is_empty() {
        return Ok(BTreeMap::from([(
            id,
            BasicNode::new(grpc_addr.to_string()),
        )]));
    }
    if !peers.contains_key(&id) {
        return Err(Error::Config(format!(
            "--peers does not name this node's id {id}"
        )));
    }
    Ok(peers
        .iter()
        .map(|(id, addr)| (*id, BasicNode::new(addr.clone())))
        .collect())
}

/// The raft node, with the sync stream served beside raft.
async fn start_node(
    settings: &DaemonSettings,
    grpc: TcpListener,
    slot: Arc<LeaderSlot>,
    stopping: watch::Receiver<bool>,
) -> Result<RaftNode> {
    let node_settings = NodeSettings {
        id: settings.id,
        data_dir: settings.data_dir.clone(),
        raft: settings.raft.clone(),
        tls: settings.tls.clone(),
    };
    RaftNode::start_with(node_settings, grpc, move |raft, _| {
        let handler = RaftSyncHandler::new(raft.clone(), slot, stopping);
        Routes::new(SyncService::new(Arc::new(handler)).into_server())
    })
    .await
}

/// A node's certificate must name it: the others check raft messages against it. Without
/// TLS, every port trusts whoever reaches it, which is said loudly.
fn check_identity(id: NodeId, tls: Option<&Tls>) -> Result<()> {
    let Some(tls) = tls else {
        tracing::warn!(
            "plaintext: raft and the sync stream are unauthenticated, and any process that \
             reaches the gRPC port is trusted as a node or a region (start with --tls-cert, \
             --tls-key and --tls-ca; `allot certs init` makes a development set)"
        );
        return Ok(());
    };
    if *tls.me() != Peer::Node(id) {
        return Err(Error::Config(format!(
            "--tls-cert names {}, but this is node {id}",
            tls.me()
        )));
    }
    Ok(())
}

/// Initialises a fresh node's cluster. Every initial member does it with the same members,
/// which openraft allows; a node that already holds a log or a vote keeps its membership.
async fn initialize(raft: &Raft<TypeConfig>, members: BTreeMap<NodeId, BasicNode>) -> Result<()> {
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;
    if initialized {
        return Ok(());
    }
    match raft.initialize(members).await {
        Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(Error::Raft(format!("initialise the cluster: {e}"))),
    }
}

async fn serve_admin(
    http: TcpListener,
    tls: Option<Tls>,
    admin: admin::Admin,
    mut stopping: watch::Receiver<bool>,
) {
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let router = admin::router(admin);
    let served = match tls {
        Some(tls) => {
            let listener = TlsListener::new(http, tls);
            axum::serve(listener, router)
                .with_graceful_shutdown(stopped)
                .await
        }
        None => {
            axum::serve(http, router)
                .with_graceful_shutdown(stopped)
                .await
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "admin HTTP server failed");
    }
}

/// Parses `--peers 1=HOST:PORT,2=HOST:PORT,...`.
pub fn parse_peers(text: &str) -> std::result::Result<BTreeMap<NodeId, String>, String> {
    let mut peers = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("peer '{item}': expected ID=HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|e| format!("peer '{item}': bad id: {e}"))?;
        let addr = addr.trim();
        if addr.is_empty() {
            return Err(format!("peer '{item}': empty address"));
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            return Err(format!("peer id {id} named twice"));
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_are_named() {
        let peers = parse_peers("1=127.0.0.1:7070, 2=10.0.0.2:7070").expect("parses");
        assert_eq!(peers[&2], "10.0.0.2:7070");
        assert!(parse_peers("1=a:1,1=b:2").unwrap_err().contains("twice"));
        assert!(parse_peers("x=a:1").unwrap_err().contains("bad id"));
        assert!(parse_peers("1").unwrap_err().contains("ID=HOST:PORT"));
    }
}
