//! allot-sim: the deterministic chaos and partition simulator.

pub mod check;
pub mod cli;
pub mod clock;
pub mod engine;
pub mod error;
pub mod link;
pub mod measure;
pub mod node;
pub mod plot;
pub mod queue;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod sizes;
pub mod traffic;

#[cfg(test)]
mod test_nodes;

pub use cli::{SimArgs, run_cli};
pub use error::{Result, ScenarioError, SimError};
pub use report::Report;
pub use runner::{RunOptions, run_scenario};
pub use scenario::Scenario;
