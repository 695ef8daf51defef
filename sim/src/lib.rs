//! allot-sim: the deterministic chaos and partition simulator.
//!
//! It runs the core's state machines across regions, gateways, traffic and faults on a virtual
//! clock, seeded, and checks the guarantees of the design after every sample of every run; any
//! failure replays from its seed. Users run it to size a deployment (sync interval, lease
//! sizes, TTLs) before going live. `docs/sim.md` documents the scenario format and the report.
//!
//! Map:
//! - [`scenario`]: scenario YAML to [`Scenario`], every bad input located.
//! - [`engine`]: one run: the event loop, gateways, links, faults, the request path.
//! - [`node`]: the traits the regional budget machine and the coordinator plug in through;
//!   [`machines`]: the real ones behind them ([`CoreFactory`]).
//! - [`clock`], [`link`], [`traffic`], [`queue`]: per-region clocks, lossy links, arrivals,
//!   costs and retries, the ordered event queue.
//! - [`measure`], [`check`], [`sizes`]: tallies per key, window and region; the invariant
//!   checker; message size estimates.
//! - [`report`], [`plot`], [`runner`], [`cli`]: the JSON report, the SVG plot, seeds in
//!   parallel, and `allot sim`.
//! - [`swarm`]: swarm mode: every seed draws its own world (regions, limits, traffic, faults),
//!   runs it, and a failing one shrinks to the smallest world that still fails.
//!
//! Randomness comes only from the run's seed (ChaCha8 streams); the wall clock is read only by
//! the runner, to report the simulation's speed.

pub mod allocation;
pub mod check;
pub mod cli;
pub mod clock;
pub mod clock_frame;
pub mod engine;
pub mod error;
pub mod link;
pub mod machines;
pub mod measure;
pub mod node;
pub mod plot;
pub mod queue;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod sizes;
pub mod swarm;
pub mod traffic;

#[cfg(test)]
mod test_nodes;

pub use cli::{SimArgs, cli_main, run_cli, run_swarm_cli};
pub use error::{Result, ScenarioError, SimError};
pub use machines::CoreFactory;
pub use report::Report;
pub use runner::{RunOptions, run_scenario};
pub use scenario::Scenario;
