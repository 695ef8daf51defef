//! `allot`: one binary, one subcommand per role.

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
    CheckConfig {
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { files } => {
            eprintln!("check-config is not written yet ({} files)", files.len());
            std::process::ExitCode::FAILURE
        }
    }
}
