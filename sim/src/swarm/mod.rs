//! Swarm mode: every seed draws its own world, so N seeds explore N different worlds.
//!
//! Hand-written scenarios test what their authors thought of. Here a seed draws the whole
//! scenario from distributions (as TigerBeetle's VOPR does): regions (2 to 5) with weights,
//! latencies and clocks off by up to several windows with drift, gateways off their agent's
//! clock; limits strict or eventual, every partition policy, with and without a rate cap,
//! windows from 1 s to a minute; keys and traffic shapes (constant, steps, flash crowds,
//! diurnal), unit and LLM costs with settles, retries; and a fault schedule (partitions of
//! every shape, leader losses, agent and gateway crashes, lossy links, restarts from an old
//! store, staggered config reloads). The drawn world is a scenario file ([`draw`]):
//! printable, replayable with `allot sim --scenario`, and a failing one shrinks ([`shrink()`])
//! to the smallest world that fails the same way, which becomes a regression test.
//!
//! Map: [`draw`](mod@draw) the distributions, [`faults`] the fault kinds (one function each),
//! [`world`] the drawn world and its YAML, [`run`] running and judging seeds, [`shrink`](mod@shrink)
//! the shrinker, [`summary`] the figures over a swarm.

pub mod cli;
pub mod draw;
pub mod faults;
mod rng;
pub mod run;
pub mod shrink;
pub mod summary;
pub mod world;

pub use run::{SeedOutcome, replay_command, run_seeds, run_world, scenario_of};
pub use shrink::{Shrunk, shrink};
pub use summary::Summary;
pub use world::World;

/// Seed `seed`'s world as scenario YAML (the same text for the same seed, always).
pub fn draw(seed: u64) -> String {
    draw::world(seed).to_yaml()
}
