//! What the simulator's integration tests share: the shipped scenarios and where they live.

#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::path::PathBuf;

use allot_sim::runner::{RunOptions, run_scenario};
use allot_sim::{CoreFactory, Report, Scenario, scenario};

/// Every scenario the simulator ships: the ten the simulator's issue names, and the real
/// network partition's schedule (tests/partition_netns.rs), run on both sides for
/// docs/benchmarks.md.
pub const SHIPPED: [&str; 13] = [
    "follow-the-sun",
    "flash-crowd",
    "hot-key",
    "partition",
    "coordinator-failover",
    "agent-crash",
    "clock-skew",
    "retry-storm",
    "llm-tokens",
    "lossy-network",
    "lab-partition",
    "sliding-partition",
    "sliding-eventual",
];

pub fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// A shipped scenario, loaded.
pub fn shipped(name: &str) -> Scenario {
    let path = scenarios_dir().join(format!("{name}.yaml"));
    scenario::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `seeds` of `s` over the real machines, two at a time; a scenario the factory refuses or a
/// run that errs fails the test.
pub fn run(s: &Scenario, seeds: std::ops::Range<u64>) -> Report {
    let factory = CoreFactory::new(s).unwrap_or_else(|e| panic!("{e}"));
    let options = RunOptions {
        jobs: 2,
        wall_clock: false,
    };
    run_scenario(s, seeds, options, &factory).unwrap_or_else(|e| panic!("{e}"))
}
