//! `allot`: one binary, one subcommand per role.

mod admin_http;
mod agent_cmd;
mod certs_cmd;
mod check_config;
mod cluster_cmd;
mod config_cmd;
mod coordinator_cmd;
mod demo;

use clap::{Parser, Subcommand};

/// mimalloc, not the system allocator: the leader's round makes and drops many small
/// allocations per counter (decoded ids, views, encoded answers), and glibc's malloc spent a
/// fifth of the round on them (docs/decisions.md, D45).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "allot", version, about = "Multi-region quota coordinator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load limits configuration files and print the rules, or every error.
    ///
    /// Prints one line per rule to stdout and exits 0; or prints every error in every file
    /// to stderr (file:line:column: path: problem) and exits 1.
    CheckConfig {
        /// envoyproxy/ratelimit YAML files, with optional `allot:` blocks.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Merge files of the same domain instead of rejecting the duplicate domain
        /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
        #[arg(long)]
        merge_domains: bool,
    },
    /// Run the regional agent: the lease API and Envoy's rate limit service on gRPC, admin
    /// HTTP, state in a local store. Every flag has an ALLOT_* environment variable.
    Agent(agent_cmd::AgentArgs),
    /// Run one node of the coordinator cluster: raft and the agents' sync stream on gRPC,
    /// admin HTTP. With no flags: a single-node cluster on loopback. See docs/coordinator.md.
    Coordinator(coordinator_cmd::CoordinatorArgs),
    /// Print a coordinator node's status: members, leader, regions, and per limit the live
    /// bound (from the leader). Exits 2 when the node cannot be read.
    Status(coordinator_cmd::StatusArgs),
    /// The coordinator cluster's limits configuration: `put` checks files and replicates them
    /// as a new version (agents take it from the sync stream), `get` prints the version in
    /// force. See docs/coordinator.md.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// The coordinator cluster's membership: `members` lists the voters and learners,
    /// `add-node` adds a node started with `allot coordinator --join`, `remove-node` removes
    /// one (the leader too); its regions: `regions` lists them, `remove-region` removes one
    /// (its allowances reclaimed safely), `add-region` adds a removed one back. See
    /// docs/coordinator.md.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Call a running agent's Acquire once and print the decision as JSON.
    ///
    /// Exits 0 whether allowed or denied; 2 on a connection or input error.
    Acquire(agent_cmd::AcquireArgs),
    /// Call a running agent's ShouldRateLimit (Envoy RLS) once and print the response as
    /// JSON.
    Rls(agent_cmd::RlsArgs),
    /// Simulate a deployment from a scenario file and check every published guarantee.
    ///
    /// Runs each seed under the product's policy and the static-split baseline, prints a
    /// summary, and exits 1 if any invariant broke (printing each failing seed's replay
    /// command). With --swarm, each seed draws its own world instead (and --shrink reduces a
    /// failing one to the smallest world that still fails). See docs/sim.md.
    Sim(allot_sim::SimArgs),
    /// Run the whole system on this machine, live: 3 coordinator nodes, 3 regions, moving
    /// demand.
    ///
    /// The coordinator nodes and regional agents run as child processes, gateways in this
    /// process spend a shared quota with demand following the sun and a flash crowd, and a
    /// table is printed every second. Optionally kills the leader, cuts a region off, prints
    /// a JSON summary. See docs/demo.md.
    Demo(demo::DemoArgs),
    /// Certificates for mutual TLS between the daemons: `init` writes a development CA and a
    /// certificate per node, region and gateway. See docs/security.md.
    #[command(subcommand)]
    Certs(certs_cmd::CertsCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig {
            files,
            merge_domains,
        } => check_config::run(&files, merge_domains),
        Command::Agent(args) => agent_cmd::agent(args),
        Command::Coordinator(args) => coordinator_cmd::coordinator(args),
        Command::Status(args) => coordinator_cmd::status(args),
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Cluster(cmd) => cluster_cmd::run(cmd),
        Command::Acquire(args) => agent_cmd::acquire(args),
        Command::Rls(args) => agent_cmd::rls(args),
        Command::Sim(args) => allot_sim::cli_main(&args, allot_sim::CoreFactory::new),
        Command::Demo(args) => demo::run(args),
        Command::Certs(cmd) => certs_cmd::run(cmd),
    }
}
