//! A scenario: regions, limits, traffic and faults on a timeline, read from a YAML file.
//!
//! Scenarios are data, so that users size their own deployment without writing code. The
//! format is documented in `docs/sim.md`; [`parse`] turns a file into a [`Scenario`] and
//! reports every bad input with its file, line, column and field.
//!
//! All times on the timeline are offsets from the start of the run, on the true clock (which
//! is also the coordinator's clock).

mod limits;
mod parse;
mod yaml;

use std::time::Duration;

use allot_core::ids::{KeyId, LimitId, RegionId};
use allot_core::time::Timestamp;

pub use limits::{LimitInfo, QuotaReload, load as load_limits};
pub use parse::{MAX_SAMPLES, load, parse};

use crate::clock::ClockSpec;
use crate::link::LinkFaults;
use crate::traffic::{CostModel, RateProfile, RetryPolicy};

/// Most regions a scenario may name (region indices are stored in 16 bits).
pub const MAX_REGIONS: usize = 64;
/// The agents' maximum clock uncertainty when a scenario names none: the agent's default
/// (`--max-clock-uncertainty-ms`, D22).
pub const DEFAULT_MAX_CLOCK_UNCERTAINTY: Duration = Duration::from_millis(250);
/// Most gateways per region.
pub const MAX_GATEWAYS_PER_REGION: u32 = 256;
/// Largest `regions[].envoy_fallback_units`.
pub const MAX_ENVOY_FALLBACK_UNITS: u64 = 1_000_000_000;
/// Most traffic sources per scenario.
pub const MAX_SOURCES: usize = 10_000;
/// Most faults per scenario.
pub const MAX_FAULTS: usize = 1_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// The file it was read from, as given (replay commands name it).
    pub file: String,
    /// True time at which the run starts; aligned to the Unix epoch like everything else.
    pub start: Timestamp,
    pub duration: Duration,
    /// How often each agent syncs with the coordinator.
    pub sync_interval: Duration,
    /// Eventual mode: a view of the other regions older than this is not used.
    pub view_ttl: Duration,
    /// Each agent reads windows on a corrected clock and keeps an edge band of its measured
    /// uncertainty, up to this (docs/bound.md, skew): [`DEFAULT_MAX_CLOCK_UNCERTAINTY`] unless
    /// the scenario says otherwise; `None` (`max_clock_uncertainty: off`): on its own clock.
    pub max_clock_uncertainty: Option<Duration>,
    pub lease: LeaseSettings,
    pub coordinator: CoordinatorSettings,
    /// The product's per-message and per-limit caps, lowered so that a few keys reach them.
    pub caps: Caps,
    pub measure: MeasureSettings,
    pub regions: Vec<RegionSpec>,
    pub limits: LimitsSection,
    pub traffic: Vec<SourceSpec>,
    pub faults: Vec<Fault>,
}

impl Scenario {
    pub fn end(&self) -> Timestamp {
        self.start + self.duration
    }

    pub fn region_ids(&self) -> Vec<RegionId> {
        self.regions.iter().map(|r| r.id.clone()).collect()
    }

    pub fn limit(&self, id: &LimitId) -> Option<&LimitInfo> {
        self.limits.limits.iter().find(|l| &l.id == id)
    }
}

/// Lease sizes and lifetimes, for the agents (TTL) and the gateways (sizing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    pub initial_units: u64,
    pub max_units: u64,
    pub ttl: Duration,
    /// A lease is sized to last this long at the key's observed rate.
    pub target: Duration,
    pub idle_release_after: Duration,
    pub max_leases_per_key: usize,
    /// Gateways refill the lease they spend (the agent's `top_up`) rather than take another.
    pub refill_in_place: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorSettings {
    /// Time for a proposal to commit through the replicated log.
    pub commit_latency: Duration,
}

/// The caps a region and the leader keep whatever the key count (`caps:`); `None` keeps the
/// product's default. Lowered, they bind with the few keys a run can afford: a SyncUp or
/// SyncDown that cannot carry every counter, a region that evicts or refuses keys, a leader
/// that drops reports of counters past its cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// Items of each kind per SyncUp, and items per SyncDown (`BudgetConfig::message_items`,
    /// `CoordinatorConfig::message_items`).
    pub message_items: Option<usize>,
    /// Keys a region tracks per limit (`BudgetConfig::max_keys_per_limit`).
    pub max_keys_per_limit: Option<usize>,
    /// Counters the leader keeps views of (`CoordinatorConfig::max_tracked_counters`).
    pub max_tracked_counters: Option<usize>,
}

/// How a run is judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeasureSettings {
    /// Width of one time-series bucket (plots, convergence).
    pub sample_interval: Duration,
    /// A denial is false while the global remainder is above this percentage of the quota.
    pub false_denial_threshold_percent: u8,
    /// A bucket has converged when false denials are at most this percentage of its demand.
    pub convergence_tolerance_percent: u8,
    /// ... and it has converged for good once that holds for this long.
    pub convergence_hold: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    pub id: RegionId,
    /// Default share of every limit, in parts per million.
    pub weight_ppm: u32,
    /// One-way latency to the coordinator, each direction.
    pub latency: Duration,
    pub clock: ClockSpec,
    /// The region's gateways' clock relative to their agent's (`regions[].gateway_clock`):
    /// read from the agent's clock as the agent's is from the true clock. Default: the same.
    pub gateway_clock: ClockSpec,
    pub gateways: u32,
    /// `regions[].envoy_fallback_units`: what each of the region's gateways admits of one key
    /// in one window on its own while it holds no lease and cannot reach its agent, as
    /// Envoy's RLQS fallback does; reported to the agent once it is back (0: none).
    pub envoy_fallback_units: u64,
}

/// The `limits:` section: envoyproxy/ratelimit YAML (plus allot's `allot:` blocks), kept as
/// text for the configuration loader, and the few facts the simulator measures against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsSection {
    pub yaml: String,
    /// Line of the scenario file on which the embedded YAML starts.
    pub first_line: usize,
    /// Column of the scenario file on which the embedded YAML's lines start.
    pub first_column: usize,
    pub limits: Vec<LimitInfo>,
}

/// One traffic source: arrivals for one key of one limit, entering through one region.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSpec {
    pub region: usize,
    pub limit: LimitId,
    pub key: KeyId,
    pub rate: RateProfile,
    pub arrivals: ArrivalProcess,
    pub cost: CostModel,
    pub retry: RetryPolicy,
    /// Offsets from the start of the run; the source is silent outside.
    pub start: Duration,
    pub end: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalProcess {
    /// Exponential gaps: independent clients.
    Poisson,
    /// Evenly spaced at the current rate: a single steady client, or a load generator.
    Uniform,
}

/// Which regions a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionSel {
    All,
    One(usize),
}

impl RegionSel {
    pub fn includes(self, region: usize) -> bool {
        match self {
            RegionSel::All => true,
            RegionSel::One(r) => r == region,
        }
    }
}

/// Direction of a link between a region and the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Region to coordinator.
    Up,
    /// Coordinator to region.
    Down,
    Both,
}

impl Direction {
    pub fn includes(self, d: Direction) -> bool {
        self == Direction::Both || self == d
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Messages between the regions and the coordinator are lost during `[start, end)`.
    Partition {
        regions: RegionSel,
        direction: Direction,
        start: Duration,
        end: Duration,
    },
    /// Leader loss: the coordinator answers nothing during `[start, end)`, then a new leader
    /// serves from the replicated table with its soft state (counters, demand) lost.
    CoordinatorOutage { start: Duration, end: Duration },
    /// The agent stops at `at` and restarts `restart_after` later from its persisted records.
    AgentCrash {
        region: usize,
        at: Duration,
        restart_after: Duration,
    },
    /// The agent stops at `at` and restarts at once from its store as it was at `from`
    /// (earlier): a restored backup, or a lost disk. What it wrote after `from` is gone.
    AgentRestore {
        region: usize,
        at: Duration,
        from: Duration,
    },
    /// The gateway stops at `at` with its leases (they expire at the agent); its clients use
    /// the region's other gateways. It restarts empty `restart_after` later, if given.
    GatewayCrash {
        region: usize,
        gateway: u32,
        at: Duration,
        restart_after: Option<Duration>,
    },
    /// A new limits configuration: the coordinator's table takes it at `at` (a new version),
    /// each region `stagger[r]` later (a rollout). Reloads come in time order; the n-th (from
    /// 0) is configuration version n + 2, the scenario's own `limits:` being version 1. The
    /// same limits with the same windows: quotas, weights, modes and policies may change.
    ConfigReload {
        at: Duration,
        limits: LimitsSection,
        /// Per region (by index), how long after `at` it reloads.
        stagger: Vec<Duration>,
    },
    /// The operator removes the region from the quota's split at `at` (a table command
    /// through the replicated log, as `allot cluster remove-region` commits), and adds it back
    /// `restore_after` later, if given. The region's agent keeps running: the leader refuses
    /// its SyncUps while it is removed, so it spends only what it holds.
    RegionRemoval {
        region: usize,
        at: Duration,
        restore_after: Option<Duration>,
    },
    /// The clock of the region's agent host steps by `by_nanos` at `at` (either way; an NTP
    /// step, a VM resumed from a snapshot). Its gateways' clocks do not.
    ClockStep {
        region: usize,
        at: Duration,
        by_nanos: i64,
    },
    /// Loss, duplication, reordering and delay on links during `[start, end)`.
    Link {
        regions: RegionSel,
        direction: Direction,
        start: Duration,
        end: Duration,
        faults: LinkFaults,
    },
}

impl Fault {
    /// When the fault is over and the system should recover (a heal), if it ever is.
    pub fn heals_at(&self) -> Option<Duration> {
        match self {
            Fault::Partition { end, .. }
            | Fault::CoordinatorOutage { end, .. }
            | Fault::Link { end, .. } => Some(*end),
            Fault::AgentCrash {
                at, restart_after, ..
            } => Some(*at + *restart_after),
            Fault::AgentRestore { at, .. } | Fault::ClockStep { at, .. } => Some(*at),
            Fault::ConfigReload { at, stagger, .. } => {
                Some(*at + stagger.iter().copied().max().unwrap_or_default())
            }
            Fault::GatewayCrash {
                at, restart_after, ..
            } => restart_after.map(|r| *at + r),
            Fault::RegionRemoval {
                at, restore_after, ..
            } => restore_after.map(|r| *at + r),
        }
    }
}
