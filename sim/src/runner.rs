//! Runs a scenario over a range of seeds, under the product's policy and the static-split
//! baseline, on several threads. Each run is independent and deterministic, so the report does
//! not depend on the number of threads or on which thread ran what.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::engine::{self, RunSpec};
use crate::error::{Result, SimError};
use crate::node::{NodeFactory, Policy};
use crate::report::{Report, TimedRun};
use crate::scenario::Scenario;

/// How to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Threads running seeds at once (at least one).
    pub jobs: usize,
    /// Time each run on the wall clock, for `sim_requests_per_wall_second`. Off, the report
    /// is byte-for-byte a function of the scenario and the seeds.
    pub wall_clock: bool,
}

/// Runs every seed of `seeds` under both policies and reports.
pub fn run_scenario<F: NodeFactory>(
    scenario: &Scenario,
    seeds: Range<u64>,
    options: RunOptions,
    factory: &F,
) -> Result<Report> {
    let specs: Vec<RunSpec> = seeds
        .clone()
        .flat_map(|seed| {
            [Policy::Rebalancing, Policy::StaticSplit].map(|policy| RunSpec { seed, policy })
        })
        .collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<TimedRun>>>> =
        Mutex::new(specs.iter().map(|_| None).collect());
    let worker = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(spec) = specs.get(i) else {
            return;
        };
        let started = options.wall_clock.then(Instant::now);
        let run = engine::run(scenario, factory, *spec).map(|outcome| TimedRun {
            outcome,
            wall: started.map_or(Duration::ZERO, |s| s.elapsed()),
        });
        if let Ok(mut all) = results.lock() {
            all[i] = Some(run);
        }
    };
    let jobs = options.jobs.clamp(1, specs.len().max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs).map(|_| scope.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| SimError::ThreadPanicked))
            .collect::<Result<Vec<()>>>()
    })?;
    let results = results.into_inner().map_err(|_| SimError::ThreadPanicked)?;
    let runs = results
        .into_iter()
        .map(|r| r.ok_or(SimError::ThreadPanicked)?)
        .collect::<Result<Vec<TimedRun>>>()?;
    Ok(Report::build(scenario, seeds, runs))
}
