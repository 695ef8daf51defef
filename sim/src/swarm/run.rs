//! Runs drawn worlds under the product's policy and judges them as `allot sim` does.
//!
//! Only the product's policy runs: the static-split baseline is a yardstick for utilization,
//! and the swarm looks for broken invariants. A run that panics or outgrows a simulator bound
//! is a finding too, reported under the kinds [`PANIC`] and [`ERROR`].

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::world::{Consistency, CostDraw, Param, PartitionPolicy, RetryDraw, Shape, World};
use crate::check::Violation;
use crate::engine::{self, RunSpec};
use crate::error::Result;
use crate::node::{NodeFactory, Policy};
use crate::report::{Report, TimedRun};
use crate::scenario::{self, Scenario};

/// The kind a run that panicked is reported under.
pub const PANIC: &str = "panic";
/// The kind a run that failed with an error (a simulator bound) is reported under.
pub const ERROR: &str = "error";

/// How one seed went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedOutcome {
    pub seed: u64,
    /// Violations counted (all of them, beyond the details kept).
    pub violations: u64,
    /// Per kind, among the violations described (the first `MAX_VIOLATION_DETAILS` of the
    /// run), plus [`PANIC`] or [`ERROR`].
    pub kinds: BTreeMap<String, u64>,
    /// The first violation of each kind.
    pub first_of_kind: Vec<Violation>,
    /// Windows the run judged (every key's every window, on the true clock).
    pub windows_judged: u64,
    /// What the world was made of: modes, policies, fault kinds (see [`features`]).
    pub features: BTreeSet<String>,
    /// Requests the run made.
    pub requests: u64,
    /// Windows that admitted more than their quota (within their bound or not).
    pub windows_over_quota: u64,
    /// Windows whose stated bound was at least their quota (a bound of `L` or more above `L`).
    pub windows_bound_at_least_quota: u64,
}

impl SeedOutcome {
    pub fn failed(&self) -> bool {
        !self.kinds.is_empty()
    }

    /// The command that replays this seed.
    pub fn replay(&self) -> String {
        replay_command(self.seed)
    }
}

/// `allot sim --swarm --seeds S..S+1`.
pub fn replay_command(seed: u64) -> String {
    format!(
        "allot sim --swarm --seeds {seed}..{}",
        seed.saturating_add(1)
    )
}

/// What a world is made of, as words a summary counts: `strict`, `eventual`,
/// `sliding_window`, `floor`, `closed`, `open`, `rate_cap`, `no_rate_cap`, `llm`, `clock_offset`, `clock_drift`,
/// `gateway_clock_offset`, `gateway_clock_drift`, `envoy_fallback`, `weights`, `failure_open`, `retries`, `view_ttl`, `settle_overage`,
/// `reload:overage_restated`, `regions_N`, `shape:<rate shape>`, and
/// `fault:<kind>` for each fault kind present.
pub fn features(w: &World) -> BTreeSet<String> {
    let mut f = BTreeSet::new();
    let mut add = |s: &str| {
        f.insert(s.to_string());
    };
    for l in &w.limits {
        add(match l.consistency {
            Consistency::Strict => "strict",
            Consistency::Eventual => "eventual",
        });
        add(match l.policy {
            PartitionPolicy::Floor => "floor",
            PartitionPolicy::Closed => "closed",
            PartitionPolicy::Open { .. } => "open",
        });
        add(if l.rate_cap.is_some() {
            "rate_cap"
        } else {
            "no_rate_cap"
        });
        if !l.failure_closed {
            add("failure_open");
        }
        if l.sliding {
            add("sliding_window");
        }
    }
    for s in &w.sources {
        add(match s.shape {
            Shape::Constant { .. } => "shape:constant",
            Shape::Steps(_) => "shape:steps",
            Shape::Flash { .. } => "shape:flash_crowd",
            Shape::Diurnal { .. } => "shape:diurnal",
        });
        if matches!(s.cost, CostDraw::Llm { .. }) {
            add("llm");
        }
        if s.retry != RetryDraw::None {
            add("retries");
        }
    }
    if w.regions.iter().any(|r| r.offset_ms != 0) {
        add("clock_offset");
    }
    if w.regions.iter().any(|r| r.drift_ppm != 0) {
        add("clock_drift");
    }
    if w.regions.iter().any(|r| r.gateway_offset_ms != 0) {
        add("gateway_clock_offset");
    }
    if w.regions.iter().any(|r| r.gateway_drift_ppm != 0) {
        add("gateway_clock_drift");
    }
    if w.regions.iter().any(|r| r.envoy_fallback_units > 0) {
        add("envoy_fallback");
    }
    if w.regions.iter().any(|r| r.weight_ppm.is_some()) {
        add("weights");
    }
    if w.caps.message_items.is_some() {
        add("caps:message_items");
    }
    if w.caps.max_keys_per_limit.is_some() {
        add("caps:max_keys_per_limit");
    }
    if w.caps.max_tracked_counters.is_some() {
        add("caps:max_tracked_counters");
    }
    if w.view_ttl_ms.is_some() {
        add("view_ttl");
    }
    if w.limits.iter().any(|l| l.settle_overage_percent > 0) {
        add("settle_overage");
    }
    let restated = w.faults.iter().flat_map(|f| &f.params).any(|(_, p)| {
        matches!(p, Param::Limits(limits) if limits
            .iter()
            .any(|r| r.settle_overage_percent.is_some() || r.rlqs_fallback_units.is_some()))
    });
    if restated {
        add("reload:overage_restated");
    }
    add(&format!("regions_{}", w.regions.len()));
    for fault in &w.faults {
        add(&format!("fault:{}", fault.kind));
    }
    f
}

/// The world as a scenario, parsed as `allot sim --scenario` would parse its file.
pub fn scenario_of(world: &World) -> Result<Scenario> {
    let file = format!("swarm-{}.yaml", world.seed);
    Ok(scenario::parse(&file, &world.to_yaml())?)
}

/// Runs `world` once under the product's policy, with machines from `build`. Errors only
/// when the world cannot be built at all (a bug of the generator); a run's own failure,
/// panic or error, is an outcome.
pub fn run_world<F, B>(world: &World, build: &B) -> Result<SeedOutcome>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F>,
{
    let scenario = scenario_of(world)?;
    let factory = build(&scenario)?;
    let spec = RunSpec {
        seed: world.seed,
        policy: Policy::Rebalancing,
    };
    let mut outcome = SeedOutcome {
        seed: world.seed,
        violations: 0,
        kinds: BTreeMap::new(),
        first_of_kind: Vec::new(),
        windows_judged: 0,
        features: features(world),
        requests: 0,
        windows_over_quota: 0,
        windows_bound_at_least_quota: 0,
    };
    let run = catch_unwind(AssertUnwindSafe(|| engine::run(&scenario, &factory, spec)));
    let run = match run {
        Ok(Ok(run)) => run,
        Ok(Err(e)) => return Ok(outcome.with_failure(ERROR, e.to_string())),
        Err(panic) => return Ok(outcome.with_failure(PANIC, panic_message(&*panic))),
    };
    let timed = TimedRun {
        outcome: run,
        wall: Duration::ZERO,
    };
    let seeds = world.seed..world.seed.saturating_add(1);
    let report = Report::build(&scenario, seeds, vec![timed]);
    if let Some(seed) = report.per_seed.first() {
        outcome.violations = seed.figures.violations;
        outcome.windows_judged = seed.windows.len() as u64;
        outcome.requests = seed.stats.requests;
        let windows = seed.windows.iter();
        outcome.windows_over_quota =
            windows.clone().filter(|w| w.overshoot_units > 0).count() as u64;
        outcome.windows_bound_at_least_quota = windows
            .filter(|w| w.bound_units.is_some_and(|b| b >= w.quota_units))
            .count() as u64;
        for v in &seed.violation_details {
            let count = outcome.kinds.entry(v.kind.to_string()).or_insert(0);
            if *count == 0 {
                outcome.first_of_kind.push(v.clone());
            }
            *count += 1;
        }
    }
    Ok(outcome)
}

impl SeedOutcome {
    fn with_failure(mut self, kind: &'static str, detail: String) -> Self {
        self.violations += 1;
        self.kinds.insert(kind.to_string(), 1);
        self.first_of_kind.push(Violation {
            kind,
            at_ms: 0,
            detail,
        });
        self
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Draws and runs every seed of `seeds` on `jobs` threads, in seed order; past `deadline`
/// no new seed starts (the seeds run so far are returned). The outcomes do not depend on
/// `jobs`.
pub fn run_seeds<F, B>(
    seeds: Range<u64>,
    jobs: usize,
    deadline: Option<Instant>,
    build: &B,
) -> Result<Vec<SeedOutcome>>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F> + Sync,
{
    let next = AtomicU64::new(seeds.start);
    let results: Mutex<Vec<Result<SeedOutcome>>> = Mutex::new(Vec::new());
    let worker = || {
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            let seed = next.fetch_add(1, Ordering::Relaxed);
            if seed >= seeds.end {
                return;
            }
            let outcome = run_world(&super::draw::world(seed), build);
            if let Ok(mut all) = results.lock() {
                all.push(outcome);
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(worker);
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| crate::error::SimError::ThreadPanicked)?;
    let mut outcomes = results.into_iter().collect::<Result<Vec<_>>>()?;
    outcomes.sort_by_key(|o| o.seed);
    Ok(outcomes)
}
