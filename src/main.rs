//! `allot`: one binary, one subcommand per role.

mod check_config;

use clap::{Parser, Subcommand};

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
    /// Simulate a deployment from a scenario file and check every published guarantee.
    ///
    /// Runs each seed under the product's policy and the static-split baseline, prints a
    /// summary, and exits 1 if any invariant broke (printing each failing seed's replay
    /// command). See docs/sim.md.
    Sim(allot_sim::SimArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig {
            files,
            merge_domains,
        } => check_config::run(&files, merge_domains),
        Command::Sim(args) => allot_sim::cli_main(&args, allot_sim::CoreFactory::new),
    }
}
