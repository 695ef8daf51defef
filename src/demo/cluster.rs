//! The demo's deployment: three `allot coordinator` nodes and one `allot agent` per region,
//! real child processes on free loopback ports, each with its own data directory and log
//! in the demo's folder; a region that `--partition` names reaches every node through a relay
//! the demo can cut.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allot_proto::tls::Peer;

use super::children::{self, Running};
use super::plan::REGIONS;
use super::relay::Relay;
use crate::certs_cmd;

/// The coordinator cluster's size: a leader's loss leaves a majority.
pub const NODES: u64 = 3;

/// How a node is started, again after a kill.
struct NodeSpec {
    grpc: String,
    http: String,
    args: Vec<String>,
    log: PathBuf,
}

pub struct Cluster {
    specs: BTreeMap<u64, NodeSpec>,
    /// The nodes running now (a killed one is absent until restarted).
    pub nodes: BTreeMap<u64, Running>,
    /// One per region, in [`REGIONS`] order; `None` once it exited.
    pub agents: Vec<Option<Running>>,
    /// The agents' addresses, kept after an exit: (gRPC, admin HTTP).
    pub agent_addrs: Vec<(String, String)>,
    /// The relays of the partitioned region, one per node.
    relays: Vec<Relay>,
}

/// A loopback port nothing listens on now (the child binds it next; `allot_proto::ports`). A
/// node's ports are fixed before it starts: the others name it by them, and a restart keeps
/// them.
fn free_port() -> Result<u16, String> {
    allot_proto::ports::free_loopback_port().map_err(|e| format!("no free port: {e}"))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

impl Cluster {
    /// Starts the nodes, then the agents (`relayed`: that region's agent reaches the nodes
    /// through relays); every child has printed its ready line when this returns.
    /// `tls`: a CA and certificates are made in `dir/certs` first, and every daemon link is
    /// mutual TLS.
    pub async fn start(
        dir: &Path,
        limits: &Path,
        relayed: Option<usize>,
        tls: bool,
    ) -> Result<Cluster, String> {
        let certs = if tls { Some(make_certs(dir)?) } else { None };
        let mut specs = node_specs(dir, limits)?;
        if let Some(certs) = &certs {
            for (id, spec) in &mut specs {
                spec.args.extend(tls_args(certs, &format!("node-{id}")));
            }
        }
        let mut nodes = BTreeMap::new();
        for (id, spec) in &specs {
            let r =
                blocking(|| children::start(&format!("coordinator {id}"), &spec.args, &spec.log))?;
            nodes.insert(*id, r);
        }
        let direct: Vec<String> = specs.values().map(|s| s.grpc.clone()).collect();
        let mut relays = Vec::new();
        if relayed.is_some() {
            for s in specs.values() {
                relays.push(Relay::start(s.grpc.clone()).await?);
            }
        }
        let mut agents = Vec::new();
        let mut agent_addrs = Vec::new();
        for (i, region) in REGIONS.iter().enumerate() {
            let coordinators = if relayed == Some(i) {
                // ID=ADDR: a redirect to node ID goes through its relay too (D35).
                let by_id = specs.keys().zip(&relays);
                by_id
                    .map(|(id, r)| format!("{id}={}", r.addr))
                    .collect::<Vec<_>>()
            } else {
                direct.clone()
            };
            let mut args = agent_args(dir, limits, region, &coordinators.join(","));
            if let Some(certs) = &certs {
                args.extend(tls_args(certs, &format!("region-{region}")));
            }
            let log = dir.join(format!("agent-{region}.log"));
            let r = blocking(|| children::start(&format!("agent {region}"), &args, &log))?;
            agent_addrs.push((r.grpc.clone(), r.http.clone()));
            agents.push(Some(r));
        }
        Ok(Cluster {
            specs,
            nodes,
            agents,
            agent_addrs,
            relays,
        })
    }

    /// The nodes' admin HTTP addresses, by id (a killed node's too).
    pub fn node_https(&self) -> Vec<(u64, String)> {
        self.specs
            .iter()
            .map(|(id, s)| (*id, s.http.clone()))
            .collect()
    }

    /// SIGKILL a node; false if it was not running.
    pub fn kill(&mut self, id: u64) -> bool {
        match self.nodes.remove(&id) {
            Some(mut r) => {
                r.kill();
                true
            }
            None => false,
        }
    }

    /// Starts a killed node again, on its data directory and addresses.
    pub fn restart(&mut self, id: u64) -> Result<(), String> {
        let spec = self.specs.get(&id).ok_or_else(|| format!("no node {id}"))?;
        let r = blocking(|| children::start(&format!("coordinator {id}"), &spec.args, &spec.log))?;
        self.nodes.insert(id, r);
        Ok(())
    }

    /// Cut or heal the relayed region's links to every node.
    pub fn set_cut(&self, cut: bool) {
        for r in &self.relays {
            r.set_cut(cut);
        }
    }

    /// Children that exited since the last look, each reported once: what, how, its log.
    pub fn exits(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        self.nodes.retain(|_, r| match r.exited() {
            Some(how) => {
                gone.push(exit_line(r, &how));
                false
            }
            None => true,
        });
        for slot in &mut self.agents {
            if let Some(r) = slot
                && let Some(how) = r.exited()
            {
                gone.push(exit_line(r, &how));
                *slot = None;
            }
        }
        gone
    }

    /// Stops every child: agents first (each flushes its store and ends its stream), then the
    /// nodes. Returns the children that had to be killed.
    pub fn stop(&mut self) -> Vec<String> {
        let mut killed = Vec::new();
        let agents = self.agents.iter_mut().flatten();
        for r in agents.chain(self.nodes.values_mut()) {
            if !blocking(|| r.stop()) {
                killed.push(format!(
                    "{} (pid {}) ignored SIGTERM and was killed",
                    r.name,
                    r.pid()
                ));
            }
        }
        killed
    }
}

fn exit_line(r: &Running, how: &str) -> String {
    format!(
        "{} (pid {}) exited unexpectedly ({how}); its log: {}",
        r.name,
        r.pid(),
        r.log.display()
    )
}

fn node_specs(dir: &Path, limits: &Path) -> Result<BTreeMap<u64, NodeSpec>, String> {
    let mut addrs = BTreeMap::new();
    for id in 1..=NODES {
        let grpc = format!("127.0.0.1:{}", free_port()?);
        let http = format!("127.0.0.1:{}", free_port()?);
        addrs.insert(id, (grpc, http));
    }
    let peers: Vec<String> = addrs
        .iter()
        .map(|(id, (g, _))| format!("{id}={g}"))
        .collect();
    let peers = peers.join(",");
    let limits = limits.display().to_string();
    Ok(addrs
        .into_iter()
        .map(|(id, (grpc, http))| {
            let data = dir.join(format!("coordinator-{id}")).display().to_string();
            let id_text = id.to_string();
            let args = strings(&[
                "coordinator",
                "--id",
                &id_text,
                "--peers",
                &peers,
                "--grpc",
                &grpc,
                "--http",
                &http,
                "--data",
                &data,
                "--limits",
                &limits,
            ]);
            let log = dir.join(format!("coordinator-{id}.log"));
            (
                id,
                NodeSpec {
                    grpc,
                    http,
                    args,
                    log,
                },
            )
        })
        .collect())
}

/// The demo's CA and a certificate per node and region, in `dir/certs`.
fn make_certs(dir: &Path) -> Result<PathBuf, String> {
    let certs = dir.join("certs");
    let mut peers: Vec<Peer> = (1..=NODES).map(Peer::Node).collect();
    peers.extend(REGIONS.iter().map(|r| Peer::Region((*r).to_owned())));
    certs_cmd::write_set(&certs, &peers, &["127.0.0.1".to_owned()])?;
    Ok(certs)
}

/// `--tls-cert`, `--tls-key` and `--tls-ca` for the certificate `stem` in `certs`.
fn tls_args(certs: &Path, stem: &str) -> Vec<String> {
    let path = |name: String| certs.join(name).display().to_string();
    vec![
        "--tls-cert".to_owned(),
        path(format!("{stem}.pem")),
        "--tls-key".to_owned(),
        path(format!("{stem}-key.pem")),
        "--tls-ca".to_owned(),
        path("ca.pem".to_owned()),
    ]
}

fn agent_args(dir: &Path, limits: &Path, region: &str, coordinators: &str) -> Vec<String> {
    let data = dir.join(format!("agent-{region}")).display().to_string();
    let limits = limits.display().to_string();
    strings(&[
        "agent",
        "--region",
        region,
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--data",
        &data,
        "--config",
        &limits,
        "--coordinator",
        coordinators,
    ])
}

/// Runs blocking work (waiting for a child) without stalling the runtime's other tasks: the
/// relays and the gateways run meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}
