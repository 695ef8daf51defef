//! `allot cluster members|add-node|remove-node`: the coordinator cluster's membership, through
//! the nodes' admin HTTP (`/v1/cluster/nodes`, `coordinator/src/daemon/cluster.rs`);
//! `allot cluster regions|remove-region|add-region`: the regions the table knows, removed and
//! added back (`/v1/regions`, `coordinator/src/daemon/regions.rs`).
//!
//! A change is sent to each `--coordinator` address in turn until the leader takes it (a
//! follower answers `421`), as `allot config put` does.

use std::process::ExitCode;
use std::time::Duration;

use allot_coordinator::daemon::cluster::{
    CATCH_UP_TIMEOUT, CHANGE_TIMEOUT, REMOVED_NOTICE_TIMEOUT,
};
use allot_coordinator::daemon::regions;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::config_cmd::{CoordinatorNodes, Targets, fail, request};

/// Room above the node's own bounds for the answer to arrive.
const ANSWER_MARGIN: Duration = Duration::from_secs(5);

/// Time for one node to read its membership.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Print the voters and learners a coordinator node holds, and the leader it knows.
    Members(MembersArgs),
    /// Add a node started with `allot coordinator --join`: the leader adds it as a learner,
    /// waits until it has caught up, then makes it a voter. Exits 1 when the cluster refuses
    /// (nothing changes), 2 when no node made the change.
    AddNode(AddArgs),
    /// Remove a node (the leader too: it steps down and the others elect a leader). Exits 1
    /// when the cluster refuses (an unknown id, the last voter), 2 when no node made the
    /// change.
    RemoveNode(RemoveArgs),
    /// Print the regions the table knows: weight, whether removed, the limits whose floor was
    /// reclaimed from it, and (from the leader) when it was last heard.
    Regions(MembersArgs),
    /// Remove a region: it gets no new grant, its syncs are refused, and under the closed
    /// policy its floor goes to the others from the first window that starts after its view
    /// has certainly expired (docs/coordinator.md, "Removing a region"). Exits 1 when the
    /// cluster refuses (an unknown or already removed region), 2 when no node made the change.
    RemoveRegion(RegionArgs),
    /// Add a removed region back: its next sync is answered. Exits 1 when the cluster refuses
    /// (an unknown region, or one not removed), 2 when no node made the change.
    AddRegion(RegionArgs),
}

#[derive(Args)]
pub struct RegionArgs {
    #[command(flatten)]
    nodes: CoordinatorNodes,
    /// The region's name, as the agent's --region and the limits' weights give it.
    name: String,
}

#[derive(Args)]
pub struct MembersArgs {
    /// A coordinator node's admin HTTP address (its --http).
    #[arg(long, env = "ALLOT_COORDINATOR_HTTP", default_value = "127.0.0.1:7071")]
    coordinator: String,
    /// Print the node's JSON as it is.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AddArgs {
    #[command(flatten)]
    nodes: CoordinatorNodes,
    /// The new node's raft id (its --id).
    #[arg(long)]
    id: u64,
    /// The new node's gRPC address (its --grpc) as the other nodes and the agents reach it.
    #[arg(long)]
    grpc: String,
}

#[derive(Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    nodes: CoordinatorNodes,
    /// The raft id of the node to remove.
    #[arg(long)]
    id: u64,
}

pub fn run(cmd: ClusterCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(2, &format!("cannot start the runtime: {e}")),
    };
    match cmd {
        ClusterCommand::Members(args) => runtime.block_on(read(args, "/v1/cluster/nodes", summary)),
        ClusterCommand::Regions(args) => {
            runtime.block_on(read(args, "/v1/regions", regions_summary))
        }
        ClusterCommand::RemoveRegion(args) => runtime.block_on(
            region_change("remove-region", "DELETE", &args).send(&args.nodes.coordinator),
        ),
        ClusterCommand::AddRegion(args) => runtime
            .block_on(region_change("add-region", "POST", &args).send(&args.nodes.coordinator)),
        ClusterCommand::AddNode(args) => {
            let body = json!({ "id": args.id, "address": args.grpc }).to_string();
            // The leader waits for the catch-up, then commits two entries.
            let timeout = CATCH_UP_TIMEOUT + 2 * CHANGE_TIMEOUT + ANSWER_MARGIN;
            let change = Change {
                what: format!("add-node {}", args.id),
                method: "POST",
                path: "/v1/cluster/nodes".to_owned(),
                body: Some(body),
                timeout,
                summary,
            };
            runtime.block_on(change.send(&args.nodes.coordinator))
        }
        ClusterCommand::RemoveNode(args) => {
            // A follower's removal is two changes with a wait for its notice between.
            let timeout = 4 * CHANGE_TIMEOUT + REMOVED_NOTICE_TIMEOUT + ANSWER_MARGIN;
            let change = Change {
                what: format!("remove-node {}", args.id),
                method: "DELETE",
                path: format!("/v1/cluster/nodes/{}", args.id),
                body: None,
                timeout,
                summary,
            };
            runtime.block_on(change.send(&args.nodes.coordinator))
        }
    }
}

/// A read of one node: its JSON as it is, or for a person.
async fn read(args: MembersArgs, path: &str, summary: fn(&Value) -> String) -> ExitCode {
    let answer = tokio::time::timeout(READ_TIMEOUT, request(&args.coordinator, "GET", path, None))
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {READ_TIMEOUT:?}")));
    match answer {
        Ok((200, v)) if args.json => println!("{v}"),
        Ok((200, v)) => print!("{}", summary(&v)),
        Ok((status, v)) => {
            return fail(2, &format!("{}: {status} {}", args.coordinator, v["error"]));
        }
        Err(e) => return fail(2, &format!("{}: {e}", args.coordinator)),
    }
    ExitCode::SUCCESS
}

/// The membership for a person.
fn summary(v: &Value) -> String {
    let list = |key: &str| {
        let nodes: Vec<String> = v[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("{}={}", n["id"], n["address"].as_str().unwrap_or("?")))
            .collect();
        if nodes.is_empty() {
            "none".to_owned()
        } else {
            nodes.join(" ")
        }
    };
    let leader = match v["leader"].as_u64() {
        Some(id) => format!(
            "node {id} at {}",
            v["leader_address"].as_str().unwrap_or("unknown")
        ),
        None => "unknown".to_owned(),
    };
    let mut out = format!(
        "leader: {leader}\nvoters: {}\nlearners: {}\n",
        list("voters"),
        list("learners")
    );
    if v["joint"] == true {
        out += "a membership change is in progress (joint configuration)\n";
    }
    if let Some(removed) = v["removed"].as_u64() {
        out = format!("node {removed} removed\n{out}");
    }
    out
}

/// The regions for a person: one line each.
fn regions_summary(v: &Value) -> String {
    let mut out = format!("config version {}\n", v["config_version"]);
    for r in v["regions"].as_array().into_iter().flatten() {
        let name = r["region"].as_str().unwrap_or("?");
        let weight = match r["weight_ppm"].as_u64() {
            Some(ppm) => format!("weight {ppm} ppm"),
            None => "default weight".to_owned(),
        };
        let state = match r["removed_at_unix_ms"].as_u64() {
            Some(at) => format!("removed (at {at} ms)"),
            None => "active".to_owned(),
        };
        let mut line = format!("{name}: {state}, {weight}");
        if let Some(reclaimed) = r["reclaimed"].as_object().filter(|m| !m.is_empty()) {
            let limits: Vec<String> = reclaimed
                .iter()
                .map(|(l, w)| format!("{l} from window {w}"))
                .collect();
            line += &format!(", floor reclaimed: {}", limits.join(", "));
        }
        if let Some(lag) = r["sync_lag_ms"].as_u64() {
            line += &format!(", last heard {lag} ms ago");
        }
        out += &line;
        out.push('\n');
    }
    if v["leader"] != true {
        out += "(not the leader: last heard is known on the leader only)\n";
    }
    out
}

fn region_change_summary(v: &Value) -> String {
    let name = v["region"].as_str().unwrap_or("?");
    if v["removed"] == true {
        format!("region {name} removed\n")
    } else {
        format!("region {name} added back\n")
    }
}

/// A region name as one path segment: every byte outside the unreserved set escaped.
fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A region change: the node's own bound, and room for the answer.
const REGION_CHANGE_TIMEOUT: Duration =
    Duration::from_secs(regions::CHANGE_TIMEOUT.as_secs() + ANSWER_MARGIN.as_secs());

/// `remove-region` (`DELETE`) or `add-region` (`POST`) of the region `args` names.
fn region_change(verb: &str, method: &'static str, args: &RegionArgs) -> Change {
    Change {
        what: format!("{verb} {}", args.name),
        method,
        path: format!("/v1/regions/{}", path_segment(&args.name)),
        body: None,
        timeout: REGION_CHANGE_TIMEOUT,
        summary: region_change_summary,
    }
}

/// One membership or region change, sent to each address until the leader takes it.
struct Change {
    what: String,
    method: &'static str,
    path: String,
    body: Option<String>,
    timeout: Duration,
    /// The answer for a person.
    summary: fn(&Value) -> String,
}

impl Change {
    async fn send(&self, addresses: &[String]) -> ExitCode {
        if let Err(e) = crate::config_cmd::admin_authorization() {
            return fail(1, &e);
        }
        let mut tried = Vec::new();
        let mut targets = Targets::new(addresses);
        while let Some(addr) = targets.next() {
            let addr = &addr;
            let sent = request(addr, self.method, &self.path, self.body.as_deref());
            let answer = tokio::time::timeout(self.timeout, sent)
                .await
                .unwrap_or_else(|_| Err(format!("no answer in {:?}", self.timeout)));
            match answer {
                Ok((200, v)) => {
                    print!("{}", (self.summary)(&v));
                    if let Some(note) = v["note"].as_str() {
                        println!("{note}");
                    }
                    return ExitCode::SUCCESS;
                }
                Ok((421, v)) => {
                    targets.follow(addr, &v);
                    tried.push(format!(
                        "{addr}: not the leader (leader: node {} at {})",
                        v["leader"],
                        v["leader_address"].as_str().unwrap_or("unknown")
                    ));
                }
                Ok((status, v)) if (400..500).contains(&status) => {
                    let error = v["error"].as_str().unwrap_or("refused");
                    return fail(1, &format!("{} refused by {addr}: {error}", self.what));
                }
                Ok((status, v)) => tried.push(format!(
                    "{addr}: {status} {}",
                    v["error"].as_str().unwrap_or("")
                )),
                Err(e) => tried.push(format!("{addr}: {e}")),
            }
        }
        fail(
            2,
            &format!(
                "{}: no node made the change: {}",
                self.what,
                tried.join("; ")
            ),
        )
    }
}
