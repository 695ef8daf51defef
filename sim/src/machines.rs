//! The product's state machines behind the node traits: [`CoreFactory`] builds, for each run,
//! one `allot_core::budget::RegionBudget` per region and one `allot_core::rebalance::Coordinator`
//! leader, configured from the scenario, and maps the gateways' messages onto them as the agent
//! daemon does.
//!
//! - Limits: the scenario's `limits:` text through the configuration loader
//!   (`LimitsConfig::load`), each limit without weights of its own taking the scenario's region
//!   weights.
//! - Under [`Policy::StaticSplit`] every region runs the same budget machine uncoordinated, each
//!   limit's quota cut to the region's fixed share `floor(w_r * L)`, and nobody talks to the
//!   coordinator.
//! - The coordinator's bound, computed from what the regions sent it, is stated per window
//!   ([`CoreCoordinator`]).

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::budget::config::STATS_WINDOWS_KEPT;
use allot_core::budget::{
    BudgetConfig, Decision, LeaseOutcome, LeaseRequest, PersistRecord, Reason, RegionBudget,
    ReservationDelta, RestoreStart, Timebase,
};
use allot_core::gateway::{
    LeaseDenial, LeaseGrant, LeaseRelease, LeaseSettle, LeaseWanted, SettleDelta,
};
use allot_core::ids::{KeyId, LeaseId, LimitId, RegionId};
use allot_core::limit::{Consistency, FailureMode, LimitSpec, Quota, RegionWeights};
use allot_core::rebalance::{AllowanceTable, Coordinator, CoordinatorConfig, TableCommand};
use allot_core::sync::{CounterRef, SyncDown, SyncUp};
use allot_core::time::{Timestamp, WindowIndex};

use crate::clock::RegionClock;
use crate::clock_frame::{ClockFrames, Replicated};
use crate::engine::derive_seed;
use crate::error::SimError;
use crate::node::{
    AllowanceView, Bound, BoundTerm, CoordinatorNode, CoordinatorObservation, CoordinatorSetup,
    LeaseAnswer, NodeFactory, Policy, RegionNode, RegionObservation, RegionSetup, TableRow,
};
use crate::scenario::{Fault, LimitsSection, Scenario};

/// Records an agent's store holds before it is rewritten as one snapshot (what a sled tree
/// does by upserting keys; here the log of drained batches is compacted instead).
pub const STORE_COMPACT_RECORDS: usize = 50_000;

/// Terms of a window's bound that are measured and may still grow after the window ended on
/// every region's clock (late settles, a partitioned region's time open reported after the
/// heal). The others are taken while some region may still be in the window: a region whose
/// clock is behind admits in a window that ended on the coordinator's clock
/// (`Coordinator::live_window_range`).
const LATE_TERMS: [&str; 2] = ["settle_overage", "fail_open"];

/// Builds the real machines for the runs of one scenario.
#[derive(Clone, Debug)]
pub struct CoreFactory {
    regions: Vec<RegionId>,
    limits: Vec<LimitSpec>,
    budgets: Vec<BudgetConfig>,
    coordinator: CoordinatorConfig,
    lease_ttl: Duration,
    /// The agents' timebase (`max_clock_uncertainty`), if the scenario built from has one.
    max_clock_uncertainty: Option<Duration>,
    /// The limits of each `config_reload` fault, in order.
    reloads: Vec<Vec<LimitSpec>>,
}

/// The configuration version of the scenario's own `limits:`; the n-th reload (from 0) is
/// version `FIRST_CONFIG_VERSION + 1 + n`.
const FIRST_CONFIG_VERSION: u64 = 1;

fn reload_version(reload: usize) -> u64 {
    FIRST_CONFIG_VERSION + 1 + reload as u64
}

impl CoreFactory {
    /// Loads the scenario's limits and derives every machine's settings; an error names the
    /// scenario file and the line of the problem.
    pub fn new(scenario: &Scenario) -> Result<Self, SimError> {
        let regions = scenario.region_ids();
        let limits = load_limits(scenario, &scenario.limits)?;
        let reloads = scenario
            .faults
            .iter()
            .filter_map(|f| match f {
                Fault::ConfigReload { limits, .. } => Some(load_limits(scenario, limits)),
                _ => None,
            })
            .collect::<Result<Vec<_>, _>>()?;
        let budgets = scenario
            .regions
            .iter()
            .map(|r| budget_config(scenario, &r.id, r.gateways))
            .collect();
        let factory = CoreFactory {
            coordinator: coordinator_config(scenario),
            regions,
            limits,
            budgets,
            lease_ttl: scenario.lease.ttl,
            max_clock_uncertainty: scenario.max_clock_uncertainty,
            reloads,
        };
        for r in 0..factory.regions.len() {
            for policy in [Policy::Rebalancing, Policy::StaticSplit] {
                let (cfg, limits) = factory.region_settings(r, policy);
                for reload in &factory.reloads {
                    let limits = factory.region_limits(&cfg.region, policy, reload);
                    RegionBudget::new(cfg.clone(), limits)?;
                }
                RegionBudget::new(cfg, limits)?;
            }
        }
        Ok(factory)
    }

    /// The limits as the machines see them.
    pub fn limits(&self) -> &[LimitSpec] {
        &self.limits
    }

    fn region_settings(&self, region: usize, policy: Policy) -> (BudgetConfig, Vec<LimitSpec>) {
        let cfg = self.budgets[region].clone();
        let limits = self.region_limits(&cfg.region, policy, &self.limits);
        match policy {
            Policy::Rebalancing => (cfg, limits),
            Policy::StaticSplit => {
                let cfg = BudgetConfig {
                    coordinated: false,
                    ..cfg
                };
                (cfg, limits)
            }
        }
    }

    /// `limits` as `region` enforces them under `policy`.
    fn region_limits(
        &self,
        region: &RegionId,
        policy: Policy,
        limits: &[LimitSpec],
    ) -> Vec<LimitSpec> {
        match policy {
            Policy::Rebalancing => limits.to_vec(),
            Policy::StaticSplit => limits
                .iter()
                .map(|l| fixed_share(l, region, &self.regions))
                .collect(),
        }
    }

    /// The region's machine from `records`, under the configuration it reads at its start
    /// (`setup.reload`), as the agent builds it from its store.
    fn budget(&self, setup: &RegionSetup<'_>, records: Vec<PersistRecord>) -> RegionBudget {
        let (cfg, mut limits) = self.region_settings(setup.region_index, setup.policy);
        let mut version = FIRST_CONFIG_VERSION;
        if let Some((n, reloaded)) = setup.reload.and_then(|n| Some((n, self.reloads.get(n)?))) {
            limits = self.region_limits(&cfg.region, setup.policy, reloaded);
            version = reload_version(n);
        }
        let mut budget = RegionBudget::restore(cfg, limits, records)
            // Every region's settings (and every reload's) were built once in `new`, which
            // returns their error.
            .unwrap_or_else(|e| unreachable!("validated when the factory was built: {e}"));
        budget.set_config_version(version);
        budget
    }

    fn core_region(
        &self,
        setup: &RegionSetup<'_>,
        budget: RegionBudget,
        restarted_at_local: Option<Timestamp>,
    ) -> CoreRegion {
        let coordinated = setup.policy == Policy::Rebalancing;
        let timebase =
            self.max_clock_uncertainty
                .filter(|_| coordinated)
                .map(|u| match restarted_at_local {
                    Some(local) => Timebase::restarted(
                        u,
                        budget.clock_correction(),
                        budget.time_floor(),
                        local,
                    ),
                    None => Timebase::new(u),
                });
        // Without a timebase the clock holds at the floor, as `Agent::now` does.
        let last_now = budget.time_floor();
        CoreRegion {
            budget,
            timebase,
            restore_started_local: None,
            lease_ttl: self.lease_ttl,
            coordinated: setup.policy == Policy::Rebalancing,
            sync_interval: self.coordinator.sync_interval,
            last_now,
            refused_calls: 0,
            used_at_reload: BTreeMap::new(),
            config: setup.reload,
            observer_unsaved: false,
            reloads: self
                .reloads
                .iter()
                .map(|l| self.region_limits(&self.regions[setup.region_index], setup.policy, l))
                .collect(),
        }
    }
}

/// A limit whose quota is `region`'s fixed share, for the static-split baseline.
fn fixed_share(spec: &LimitSpec, region: &RegionId, regions: &[RegionId]) -> LimitSpec {
    let quota = match spec.quota {
        Quota::Units { units, window } => Quota::Units {
            units: spec.weights.default_allowance(region, regions, units),
            window,
        },
        Quota::Unlimited => Quota::Unlimited,
    };
    LimitSpec {
        quota,
        ..spec.clone()
    }
}

fn budget_config(scenario: &Scenario, region: &RegionId, gateways: u32) -> BudgetConfig {
    let defaults = BudgetConfig::new(region.clone(), scenario.region_ids());
    // Each gateway holds up to its own limit per key, plus one the agent still counts for a
    // few milliseconds after the gateway dropped it early (its expiry margin).
    let per_gateway = scenario.lease.max_leases_per_key + 1;
    BudgetConfig {
        sync_interval: scenario.sync_interval,
        view_ttl: scenario.view_ttl,
        lease_ttl_max: scenario.lease.ttl,
        max_leases_per_key: per_gateway * gateways as usize,
        max_edge_band: scenario.max_clock_uncertainty,
        message_items: scenario
            .caps
            .message_items
            .unwrap_or(defaults.message_items),
        max_keys_per_limit: scenario
            .caps
            .max_keys_per_limit
            .unwrap_or(defaults.max_keys_per_limit),
        ..defaults
    }
}

fn coordinator_config(scenario: &Scenario) -> CoordinatorConfig {
    let defaults = CoordinatorConfig::default();
    CoordinatorConfig {
        sync_interval: scenario.sync_interval,
        view_ttl: scenario.view_ttl,
        message_items: scenario
            .caps
            .message_items
            .unwrap_or(defaults.message_items),
        max_tracked_counters: scenario
            .caps
            .max_tracked_counters
            .unwrap_or(defaults.max_tracked_counters),
        ..defaults
    }
}

/// The scenario's `limits:` text through the product's loader (`scenario::load_limits`);
/// limits configured without weights take the scenario's region weights.
fn load_limits(scenario: &Scenario, section: &LimitsSection) -> Result<Vec<LimitSpec>, SimError> {
    let config = crate::scenario::load_limits(
        &scenario.file,
        section.first_line,
        section.first_column,
        &section.yaml,
    )
    .map_err(SimError::Scenario)?;
    let weights = scenario_weights(scenario);
    Ok(config
        .rules()
        .map(|rule| {
            let mut spec = rule.spec.clone();
            if spec.weights.is_empty() {
                spec.weights = weights.clone();
            }
            spec
        })
        .collect())
}

fn scenario_weights(scenario: &Scenario) -> RegionWeights {
    let ppm = scenario
        .regions
        .iter()
        .map(|r| (r.id.clone(), r.weight_ppm))
        .collect();
    // The scenario parser refuses weights above one in total.
    RegionWeights::new(ppm).unwrap_or_default()
}

impl NodeFactory for CoreFactory {
    type Region = CoreRegion;
    type Coordinator = CoreCoordinator;

    fn region(&self, setup: &RegionSetup<'_>, now: Timestamp) -> CoreRegion {
        let mut budget = self.budget(setup, Vec::new());
        budget.set_boot_clock(now);
        self.core_region(setup, budget, None)
    }

    fn restore_region(
        &self,
        setup: &RegionSetup<'_>,
        store: &CoreStore,
        now: Timestamp,
    ) -> CoreRegion {
        let mut budget = self.budget(setup, store.records.clone());
        // As the agent does: the boot on the region's own clock, which grows across starts.
        budget.set_boot_clock(now);
        let restarted = (!store.records.is_empty()).then_some(now);
        let mut region = self.core_region(setup, budget, restarted);
        // As the agent starts: a declared restore, or an empty store, may have lost state.
        let why = if setup.restored {
            Some(RestoreStart::Declared)
        } else {
            store.records.is_empty().then_some(RestoreStart::EmptyStore)
        };
        if let Some(why) = why {
            // Without a timebase the clock reads on from the store's time (`clock_floor`).
            let start = match region.timebase.as_mut() {
                Some(tb) => tb.read(now),
                None => now.max(region.clock_floor()),
            };
            region.budget.start_restored(start, why);
            region
                .budget
                .salt_restored_boot(derive_seed(setup.seed, now.as_unix_nanos()));
            region.restore_started_local = region.timebase.is_some().then_some(now);
        }
        region.used_at_reload.clone_from(&store.used_at_reload);
        if store.config != setup.reload {
            // A reload reached the region while it was down: what it had admitted, it
            // admitted under the configuration before, as if the reload had reached it live.
            for k in region.budget.key_accounts(now) {
                let used = region.used_at_reload.entry(k.counter).or_default();
                *used = (*used).max(k.granted_units.saturating_sub(k.refunded_units));
            }
            region.observer_unsaved = true;
        }
        region
    }

    fn coordinator(&self, setup: &CoordinatorSetup<'_>, now: Timestamp) -> CoreCoordinator {
        let mut table = AllowanceTable::new();
        // The configuration is the first entry of every leader's table; later commands are
        // replayed on top by the engine.
        let outcome = table.apply(TableCommand::SetConfig {
            version: FIRST_CONFIG_VERSION,
            limits: self.limits.clone(),
            regions: self.regions.clone(),
        });
        debug_assert!(outcome.is_applied(), "{outcome:?}");
        let frames = ClockFrames::new(
            derive_seed(setup.seed, setup.leader_term),
            setup.scenario.coordinator.commit_latency,
            now,
        );
        let coordinator = leader(
            self.coordinator.clone(),
            table,
            now,
            setup.leader_term,
            &frames,
        );
        CoreCoordinator {
            frames,
            tick: self.coordinator.sync_interval,
            next_tick: now + self.coordinator.sync_interval,
            coordinator,
            active: setup.policy == Policy::Rebalancing,
            limits: self.limits.clone(),
            stated: BTreeMap::new(),
            first_judged_at: earliest_local_reading(setup.scenario),
            rejected_commands: 0,
        }
    }

    fn failure_mode(&self, limit: &LimitId) -> FailureMode {
        self.limits
            .iter()
            .find(|l| &l.id == limit)
            .map_or(FailureMode::default(), |l| l.failure_mode)
    }

    fn reload_command(&self, reload: usize) -> Option<Replicated> {
        Some(Replicated::Table(TableCommand::SetConfig {
            version: reload_version(reload),
            limits: self.reloads.get(reload)?.clone(),
            regions: self.regions.clone(),
        }))
    }

    fn region_command(
        &self,
        region: &RegionId,
        removed: bool,
        now: Timestamp,
    ) -> Option<Replicated> {
        let region = region.clone();
        Some(Replicated::Table(if removed {
            TableCommand::RemoveRegion { region, at: now }
        } else {
            TableCommand::RestoreRegion { region }
        }))
    }

    fn corrects_clocks(&self) -> bool {
        self.max_clock_uncertainty.is_some()
    }

    fn max_use_units(&self, limit: &LimitId, reserved_units: u64) -> u64 {
        let cap = self
            .limits
            .iter()
            .find(|l| &l.id == limit)
            .map_or(0, |l| l.max_settle_overage_units(reserved_units));
        reserved_units.saturating_add(cap)
    }
}

/// One region's agent over `RegionBudget`.
pub struct CoreRegion {
    budget: RegionBudget,
    lease_ttl: Duration,
    coordinated: bool,
    sync_interval: Duration,
    /// The latest time any input carried: observations read the allowance as of then.
    last_now: Timestamp,
    /// The corrected clock the budget reads windows on (`max_clock_uncertainty`), if any:
    /// every `now` passed in is on the region's own clock and goes through it.
    timebase: Option<Timebase>,
    /// A restored start, on the local clock, until the first clock sample dates it on the
    /// corrected one (the store's correction may be missing or old).
    restore_started_local: Option<Timestamp>,
    /// Gateway messages the machine refused (a release of a lease that already expired at the
    /// agent, a settle for one it forgot): expected in small numbers, never a panic.
    pub refused_calls: u64,
    /// The limits of each `config_reload`, as this region enforces them.
    reloads: Vec<Vec<LimitSpec>>,
    /// Net use per counter when the last reload was taken: the new allowance may be below it
    /// (the units were admitted under the old one), which invariant 1 allows.
    used_at_reload: BTreeMap<CounterRef, u64>,
    /// The configuration in force (`RegionSetup::reload`).
    config: Option<usize>,
    /// `used_at_reload` or `config` changed since the last `persist`.
    observer_unsaved: bool,
}

/// What survives a crash of a [`CoreRegion`]: its store's records, and beside them what the
/// observer must remember across a restart (not the agent: the checker's bookkeeping), the
/// configuration the records were written under and what each counter had admitted when a
/// reload reached the region.
#[derive(Clone, Debug, Default)]
pub struct CoreStore {
    pub records: Vec<PersistRecord>,
    config: Option<usize>,
    used_at_reload: BTreeMap<CounterRef, u64>,
}

/// A step back of the local clock moves the timebase's correction (`Timebase::read`): kept
/// with the durable state as a sample's is, once there is one to keep, or a restart would read
/// its windows on the correction from before the step, as the agent does
/// (`Agent::clock_guard`).
fn keep_correction(budget: &mut RegionBudget, tb: &Timebase) {
    if budget.clock_correction().is_some() {
        budget.set_clock_correction(tb.correction());
    }
}

impl CoreRegion {
    /// Takes an input at `local` (the region's own clock): the time the budget reads, on the
    /// corrected clock when there is a timebase, with its edge band and guard as of then.
    /// Never earlier than the last one, as the agent reads it (`Agent::now`): a clock stepped
    /// back holds.
    fn saw(&mut self, local: Timestamp) -> Timestamp {
        let now = match self.timebase.as_mut() {
            Some(tb) => {
                let band = tb.band(local);
                self.budget.set_clock_guard(band, tb.guard());
                let now = tb.read(local);
                keep_correction(&mut self.budget, tb);
                now
            }
            None => local.max(self.last_now),
        };
        self.last_now = self.last_now.max(now);
        now
    }

    /// A round trip just answered: the timebase takes its clock sample.
    fn take_clock_sample(&mut self, local: Timestamp) {
        let (Some(tb), Some((sent_at, sample))) =
            (self.timebase.as_mut(), self.budget.clock_round_trip())
        else {
            return;
        };
        if tb.on_sample(local, sent_at, sample) {
            self.budget.set_clock_correction(tb.correction());
            if let Some(start) = self.restore_started_local.take() {
                self.budget
                    .restore_started_no_earlier_than(tb.estimate(start));
            }
            let band = tb.band(local);
            self.budget.set_clock_guard(band, tb.guard());
        }
    }

    /// How long the gateway keeps the key denied. The machine's retry-after for an allowance
    /// refusal is the window's end, the one certain time; a coordinated region may be granted
    /// more at its next sync, so its gateways ask again after at most one sync interval.
    fn deny_for(&self, d: &Decision) -> Duration {
        let certain = d.retry_after.unwrap_or(d.reset_after);
        let may_grow = matches!(
            d.reason,
            Reason::Allowance
                | Reason::GlobalView
                | Reason::PartitionClosed
                | Reason::TooManyLeases
                | Reason::Restoring
        );
        if self.coordinated && may_grow {
            certain.min(self.sync_interval)
        } else {
            certain
        }
    }
}

impl RegionNode for CoreRegion {
    type Store = CoreStore;

    fn handle_lease_wanted(&mut self, now: Timestamp, want: &LeaseWanted) -> LeaseAnswer {
        let now = self.saw(now);
        let req = LeaseRequest {
            limit: want.limit.clone(),
            key: want.key.clone(),
            units_wanted: want.units,
            min_units: want.min_units,
            denied_units: want.denied_units,
            rate_units_per_sec: want.rate_units_per_sec,
            ttl: self.lease_ttl,
            request_id: None,
        };
        let outcome = match want.refill {
            Some(lease) => self.budget.top_up(now, lease, req),
            None => self.budget.lease(now, req),
        };
        match outcome {
            Ok(LeaseOutcome::Granted(g)) => LeaseAnswer::Granted(LeaseGrant {
                lease: g.lease,
                units: g.units,
                ttl: g.expires_at.saturating_duration_since(now),
                remaining_units: g.remaining_units,
            }),
            Ok(LeaseOutcome::Denied(d)) => LeaseAnswer::Denied(LeaseDenial {
                retry_after: self.deny_for(&d),
            }),
            // Nothing to count: spend freely. Id 0 is never a real lease, so its release is
            // refused harmlessly.
            Ok(LeaseOutcome::Unmetered { units, .. }) => LeaseAnswer::Granted(LeaseGrant {
                lease: LeaseId(0),
                units,
                ttl: self.lease_ttl,
                remaining_units: units,
            }),
            Err(_) => {
                self.refused_calls += 1;
                LeaseAnswer::Denied(LeaseDenial {
                    retry_after: self.sync_interval,
                })
            }
        }
    }

    fn handle_release(&mut self, now: Timestamp, release: &LeaseRelease) {
        let now = self.saw(now);
        if self
            .budget
            .release(now, release.lease, release.units, None)
            .is_err()
        {
            self.refused_calls += 1;
        }
    }

    fn handle_gateway_fallback(
        &mut self,
        now: Timestamp,
        limit: &LimitId,
        key: &KeyId,
        units: u64,
    ) {
        let now = self.saw(now);
        self.budget
            .record_gateway_fallback(limit, Some(key), now, units);
    }

    fn handle_settle(&mut self, now: Timestamp, settle: &LeaseSettle) {
        let now = self.saw(now);
        let delta = match settle.delta {
            SettleDelta::Refund { units } => ReservationDelta::Refund { units },
            SettleDelta::Overage { units } => ReservationDelta::Overage { units },
        };
        if self
            .budget
            .settle_reservation(now, settle.lease, delta, None)
            .is_err()
        {
            self.refused_calls += 1;
        }
    }

    fn handle_sync_down(&mut self, now: Timestamp, msg: SyncDown) {
        let corrected = self.saw(now);
        self.budget.handle_sync_down(corrected, msg);
        self.take_clock_sample(now);
    }

    fn poll_transmit(&mut self, now: Timestamp) -> Option<SyncUp> {
        let now = self.saw(now);
        self.budget.poll_transmit(now)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let at = self.budget.poll_timeout()?;
        Some(self.timebase.as_ref().map_or(at, |tb| tb.to_local(at)))
    }

    fn clock_floor(&self) -> Timestamp {
        match self.timebase {
            Some(_) => Timestamp::ZERO,
            None => self.budget.time_floor(),
        }
    }

    fn window_clock(&self, local: Timestamp, lease: Option<LeaseId>) -> Timestamp {
        let Some(tb) = &self.timebase else {
            return local.max(self.last_now);
        };
        let reading = tb.peek(local);
        match lease.and_then(|l| self.budget.lease_window(l)) {
            Some((start, end)) => reading.clamp(start, end - Duration::from_nanos(1)),
            None => reading,
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.saw(now);
        self.budget.handle_timeout(now);
    }

    fn persist(&mut self, store: &mut CoreStore) {
        if std::mem::take(&mut self.observer_unsaved) {
            store.config = self.config;
            store.used_at_reload.clone_from(&self.used_at_reload);
        }
        let store = &mut store.records;
        let records = self.budget.drain_dirty();
        if records.is_empty() {
            return;
        }
        if store.capacity() == 0 {
            // Sized once for the log's longest: growing it by doubling copies the whole log
            // each time, and a compaction would throw the room away to grow it again.
            store.reserve_exact(STORE_COMPACT_RECORDS + records.len());
        }
        store.extend(records);
        if store.len() > STORE_COMPACT_RECORDS {
            store.clear();
            store.extend(self.budget.snapshot());
        }
    }

    fn discard_durable(&mut self) {
        self.budget.discard_dirty();
    }

    fn observe(&self, out: &mut RegionObservation) {
        let region = self.budget.region();
        out.config_version = Some(self.budget.config_version());
        for k in self.budget.key_accounts(self.last_now) {
            let strict = self.coordinated && self.is_strict(&k.counter.limit);
            let quota = self.quota_units(&k.counter.limit);
            out.entries.push(allot_core::sync::CounterEntry {
                counter: k.counter.clone(),
                region: region.clone(),
                granted_units: k.granted_units,
                refunded_units: k.refunded_units,
            });
            // An eventual region's allowance falls as the others' use grows, below what it
            // admitted earlier: what holds at every instant is its own use within `L`.
            let allowance = if strict {
                k.allowance_units
            } else if self.coordinated {
                quota
            } else {
                k.allowance_units
            };
            // A reload may lower the allowance below what was admitted under the old one, and a
            // restore's closed window may hold use the lost copy admitted (sent back by the
            // coordinator) above what the region now holds: nothing more is admitted there.
            let admitted_before_reload = self.used_at_reload.get(&k.counter).copied();
            let net = k.granted_units.saturating_sub(k.refunded_units);
            let admitted_before_reload = if k.restore_closed {
                Some(admitted_before_reload.unwrap_or(0).max(net))
            } else if k.restore_awaiting && !strict {
                // Awaiting its boot's first answer, an eventual region holds at its own count,
                // which the answer's entries may have raised to what the lost copy admitted
                // under an earlier, larger quota: the copy kept no record of that reload
                // (swarm seed 3037612). It is judged at what it enforces, its own count.
                Some(admitted_before_reload.unwrap_or(0).max(k.allowance_units))
            } else {
                admitted_before_reload
            };
            // Awaiting its boot's first answer, a restored region admits nothing from its
            // allowances and states them at its own count of use. That count is the old
            // copy's: it may hold units the lost copy refunded later, and released, so it
            // may be above the table's row. Nothing is left to admit; the answer brings the
            // region's entries back and its count down. Judged against the row only if it
            // could admit more.
            let held_at_own_count =
                k.restore_awaiting && k.allowance_units <= net.saturating_sub(k.excess_units);
            // Held at what it had admitted when the last reload reached it: it admits nothing
            // more, and what it admitted was judged against the table of its version then.
            // The table's rows for the new version may give it less (a removed region's floor
            // reclaimed under it while the region holds at its use under the closed policy),
            // an overlap the bound's `reload` term counts (swarm seed 3127231).
            let held_at_reload_use = self
                .used_at_reload
                .get(&k.counter)
                .is_some_and(|used| k.allowance_units <= *used);
            // Its clock guard holds strict admission (the timebase's uncertainty is above its
            // maximum, or a restart waits for its first sample): it admits nothing, whatever
            // window its reading is in. A region restarted after its clock stepped back reads
            // a window it had left, the one its stored correction puts it in, until that
            // sample moves it on; the table may have changed that window's rows since.
            let held_by_clock = self.budget.strict_held_by_clock(&k.counter.limit);
            // A window a restored start closed admits nothing more, ever: what it states
            // there is the lost copy's grant, which the table has since moved on from (swarm
            // seed 3384823). Its use is judged above, against what it held.
            let closed_by_restore = k.restore_closed;
            out.allowances.push(AllowanceView {
                net_units: k.granted_units.saturating_sub(k.refunded_units),
                limit_units: allowance
                    .max(admitted_before_reload.unwrap_or(0))
                    .saturating_add(k.excess_units),
                strict_allowance_units: (strict
                    && !held_at_own_count
                    && !held_at_reload_use
                    && !held_by_clock
                    && !closed_by_restore)
                    .then_some(k.allowance_units),
                counter: k.counter,
            });
        }
    }

    fn reload(&mut self, now: Timestamp, reload: usize) {
        let Some(limits) = self.reloads.get(reload).cloned() else {
            return;
        };
        let now = self.saw(now);
        // What the old configuration admitted: each key's counter, and what its end band
        // already carried into the next window's (a reload lowers that allowance too).
        let mut used = BTreeMap::new();
        for k in self.budget.key_accounts(now) {
            if k.carry_units > 0 {
                let next = CounterRef {
                    window: k.counter.window.next(),
                    ..k.counter.clone()
                };
                used.insert(next, k.carry_units);
            }
            used.insert(k.counter, k.granted_units.saturating_sub(k.refunded_units));
        }
        self.used_at_reload = used;
        self.budget.set_limits(now, limits);
        self.budget.set_config_version(reload_version(reload));
        self.config = Some(reload);
        self.observer_unsaved = true;
    }
}

impl CoreRegion {
    fn spec(&self, limit: &LimitId) -> Option<&LimitSpec> {
        self.budget.limit_spec(limit)
    }

    fn is_strict(&self, limit: &LimitId) -> bool {
        self.spec(limit)
            .is_some_and(|s| s.consistency == Consistency::Strict)
    }

    fn quota_units(&self, limit: &LimitId) -> u64 {
        match self.spec(limit).map(|s| s.quota) {
            Some(Quota::Units { units, .. }) => units,
            _ => 0,
        }
    }
}

/// The coordinator leader over `Coordinator`, and the bound it states per window.
pub struct CoreCoordinator {
    coordinator: Coordinator,
    /// The clock frames it replays, adopts and records.
    frames: ClockFrames,
    /// False for the static-split baseline: nobody talks to it and it states nothing.
    active: bool,
    limits: Vec<LimitSpec>,
    /// The leader works on its own between messages (reclaims, garbage collection, the next
    /// window's grants), and publishes the bound, this often.
    tick: Duration,
    next_tick: Timestamp,
    /// The bound stated so far per limit and window, each term at its largest
    /// ([`Bound::merge`]); the last `STATS_WINDOWS_KEPT` windows of each limit.
    stated: BTreeMap<(LimitId, WindowIndex), Bound>,
    /// The earliest time any region's clock reads during the run (the run's start, or
    /// earlier for a region behind): windows that ended before it are never judged, so no
    /// bound is stated for them. Windows a region behind the true clock admits in before the
    /// run started on the true clock are judged on its clock, and stated here.
    first_judged_at: Timestamp,
    /// Committed commands the table refused (a stale proposal): expected, and harmless.
    pub rejected_commands: u64,
}

impl CoreCoordinator {
    /// States the bound of every limit: in full for the windows some region may still be in,
    /// and for the windows that ended on every region's clock only the measured terms that
    /// can still grow.
    fn state_bounds(&mut self, now: Timestamp) {
        if !self.active {
            return;
        }
        for spec in &self.limits {
            let Quota::Units { window, .. } = spec.quota else {
                continue;
            };
            let current = window.index(now);
            let oldest = current.0.saturating_sub(STATS_WINDOWS_KEPT as u64);
            let first_judged = window.index(self.first_judged_at).0;
            let first_live = self
                .coordinator
                .live_window_range(&spec.id, now)
                .map_or(current, |(first, _)| first.min(current));
            for w in oldest.max(first_judged)..=current.0 {
                let Some(b) = self.coordinator.bound(now, &spec.id, WindowIndex(w)) else {
                    continue;
                };
                let mut b = sim_bound(&b);
                if w < first_live.0 {
                    b.terms.retain(|t| LATE_TERMS.contains(&t.name.as_str()));
                }
                self.stated
                    .entry((spec.id.clone(), WindowIndex(w)))
                    .and_modify(|s| s.merge(&b))
                    .or_insert(b);
            }
            self.stated
                .retain(|(l, w), _| l != &spec.id || w.0 >= oldest);
        }
    }
}

/// The earliest reading of any region's clock during the run: at its start, as the offsets
/// are fixed and drifts are small (a clock behind reads earliest then).
fn earliest_local_reading(scenario: &Scenario) -> Timestamp {
    scenario
        .regions
        .iter()
        .map(|r| RegionClock::new(scenario.start, r.clock).local(scenario.start))
        .fold(scenario.start, Timestamp::min)
}

fn sim_bound(b: &allot_core::rebalance::Bound) -> Bound {
    Bound {
        terms: b
            .terms
            .iter()
            .map(|t| BoundTerm {
                name: t.name.clone(),
                units: t.units,
                measured_units: t.measured_units,
            })
            .collect(),
        total_units: b.total_units,
        unbounded: b.unbounded.is_some(),
        unwatched: b.unwatched,
    }
}

impl CoordinatorNode for CoreCoordinator {
    type Command = Replicated;

    fn handle_sync_up(&mut self, now: Timestamp, msg: SyncUp) -> bool {
        self.frames.adopt(now, &mut self.coordinator);
        let region = msg.region.clone();
        // Only the scenario's regions exist, and the table knows them all; it refuses the
        // ones an operator removed.
        match self.coordinator.handle_sync_up(now, msg) {
            Ok(()) => {
                // Only a rebalancing leader proposes anything (its static baseline never does).
                if self.active {
                    self.frames.note_boots(&self.coordinator, &region);
                }
                true
            }
            Err(allot_core::Error::RegionRemoved(_)) => false,
            Err(e) => {
                debug_assert!(false, "a sync the deployment never sends: {e}");
                false
            }
        }
    }

    fn poll_sync_down(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        reply_to_seq: u64,
    ) -> Option<SyncDown> {
        match self.coordinator.poll_sync_down(now, region, reply_to_seq) {
            Ok(down) => Some(down),
            Err(allot_core::Error::RegionRemoved(_)) => None,
            Err(e) => {
                debug_assert!(false, "an answer the deployment never refuses: {e}");
                None
            }
        }
    }

    fn poll_proposals(&mut self, now: Timestamp) -> Vec<Replicated> {
        self.frames.adopt(now, &mut self.coordinator);
        let mut out: Vec<Replicated> = (self.coordinator.poll_proposals(now).into_iter())
            .map(Replicated::Table)
            .collect();
        if self.active {
            out.extend(self.frames.take_boots());
            out.extend(self.frames.poll(now, &self.coordinator));
        }
        out
    }

    /// As the daemon's new leader starts (`coordinator/src/daemon/leader.rs`): from the
    /// replicated table, with none of an earlier leader's soft state. Replaying the log through
    /// `handle_committed` would rebuild some of it (the configurations a reload replaced, with
    /// the largest rows then), which the daemon's leader never has: a region cut off through a
    /// reload and a leader change was bounded here and not there (D64).
    fn restore(&mut self, now: Timestamp, log: &[Replicated]) {
        let mut table = self.coordinator.table().clone();
        for cmd in log {
            match cmd {
                Replicated::Table(cmd) => {
                    if !table.apply(cmd.clone()).is_applied() {
                        self.rejected_commands += 1;
                    } else if let TableCommand::SetConfig { limits, .. } = cmd {
                        self.limits = limits.clone();
                    }
                }
                Replicated::ClockFrame { .. } | Replicated::Boots { .. } => {
                    self.handle_committed(now, cmd)
                }
            }
        }
        let term = self.coordinator.leader_term();
        let cfg = self.coordinator.config().clone();
        self.coordinator = leader(cfg, table, now, term, &self.frames);
    }

    fn handle_committed(&mut self, now: Timestamp, cmd: &Replicated) {
        let cmd = match cmd {
            Replicated::Table(cmd) => cmd,
            Replicated::ClockFrame {
                leader_term,
                samples,
            } => {
                let own = self.coordinator.leader_term();
                self.frames.committed(own, *leader_term, samples);
                return;
            }
            Replicated::Boots { leader_term, boots } => {
                self.frames.boots_committed(*leader_term, boots);
                return;
            }
        };
        if !self.coordinator.handle_committed(now, cmd).is_applied() {
            self.rejected_commands += 1;
        } else if let TableCommand::SetConfig { limits, .. } = cmd {
            // The bound is stated for the limits in force.
            self.limits = limits.clone();
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.active
            .then_some(self.next_tick.min(self.frames.next_at()))
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.frames.adopt(now, &mut self.coordinator);
        // The timer also fires for a clock frame, which `poll_proposals` records.
        if self.next_tick > now {
            return;
        }
        while self.next_tick <= now {
            self.next_tick = self.next_tick + self.tick;
        }
        self.state_bounds(now);
    }

    fn observe(&self, now: Timestamp, out: &mut CoordinatorObservation) {
        let table = self.coordinator.table();
        for (counter, _) in table.counters() {
            let Some(Quota::Units { units, .. }) = table.limit(&counter.limit).map(|l| l.quota)
            else {
                continue;
            };
            out.strict_rows.push(TableRow {
                counter: counter.clone(),
                allowance_sum_units: u64::try_from(table.allowance_sum(counter))
                    .unwrap_or(u64::MAX),
                quota_units: units,
            });
        }
        if !self.active {
            return;
        }
        for ((limit, window), b) in &self.stated {
            out.bounds.push((limit.clone(), *window, b.clone()));
        }
        // And as of this very instant.
        for spec in &self.limits {
            if let Quota::Units { window, .. } = spec.quota
                && let Some(b) = self.coordinator.bound(now, &spec.id, window.index(now))
            {
                out.bounds
                    .push((spec.id.clone(), window.index(now), sim_bound(&b)));
            }
        }
    }

    fn config_version(&self) -> Option<u64> {
        Some(self.coordinator.table().config_version())
    }

    fn table_allowance(&self, counter: &CounterRef, region: &RegionId) -> Option<u64> {
        let table = self.coordinator.table();
        let spec = table.limit(&counter.limit)?;
        let strict = self.active && spec.consistency == Consistency::Strict;
        strict.then(|| table.allowance(counter, region))
    }
}

/// A leader on `table`. Every leader of a run reads the one true clock, and knows every earlier
/// leader's by a probe whose error is drawn (`clock_frame`): samples regions measured with an
/// earlier leader's answers carry over by it, and so does the last clock frame replayed from
/// the log.
fn leader(
    cfg: CoordinatorConfig,
    table: AllowanceTable,
    now: Timestamp,
    leader_term: u64,
    frames: &ClockFrames,
) -> Coordinator {
    let mut coordinator = Coordinator::new(cfg, table, now, leader_term);
    for earlier in 0..leader_term {
        coordinator.adopt_clocks(earlier, frames.hop(earlier), Vec::new());
    }
    coordinator
}

#[cfg(test)]
mod tests {
    use allot_core::ids::KeyId;
    use allot_core::limit::{Consistency, PartitionPolicy};

    use super::*;
    use crate::test_nodes::scenario;

    /// Two regions weighted 0.6 / 0.4; `api/t` 100 per second without weights of its own,
    /// `other/u` eventual with its own weights, in a second YAML document.
    const YAML: &str = r#"
name: machines-test
duration: 5s
regions:
  - id: a
    weight: 0.6
    latency: 10ms
    gateways: 2
  - id: b
    weight: 0.4
    latency: 20ms
limits: |
  domain: api
  descriptors:
    - key: t
      rate_limit: {unit: second, requests_per_unit: 100}
  ---
  domain: other
  descriptors:
    - key: u
      rate_limit: {unit: minute, requests_per_unit: 1000}
      allot:
        consistency: eventual
        partition_policy: closed
        weights: {a: 0.5, b: 0.5}
traffic:
  - region: a
    limit: api/t
    key: t=1
    rate: {constant_per_sec: 10}
"#;

    fn setup<'a>(s: &'a Scenario, region: usize, policy: Policy) -> RegionSetup<'a> {
        RegionSetup {
            scenario: s,
            region_index: region,
            region: &s.regions[region].id,
            policy,
            seed: 0,
            reload: None,
            restored: false,
        }
    }

    /// A gateway's request for a lease of `units`, at least `min_units`.
    fn want(units: u64, min_units: u64) -> LeaseWanted {
        use allot_core::gateway::{Gateway, GatewayConfig, ToAgent};
        let mut g = Gateway::new(GatewayConfig::default()).unwrap();
        let (limit, key) = (LimitId::from("api/t"), KeyId::from("t=1"));
        let h = g.key(Timestamp::ZERO, &limit, &key).unwrap();
        g.try_spend(Timestamp::ZERO, h, min_units);
        let Some(ToAgent::LeaseWanted(w)) = g.poll_transmit(Timestamp::ZERO) else {
            panic!("an empty key asks for a lease");
        };
        LeaseWanted {
            units,
            min_units,
            ..w
        }
    }

    #[test]
    fn limits_come_from_the_loader_with_the_scenario_s_weights_where_they_set_none() {
        let s = scenario(YAML);
        let f = CoreFactory::new(&s).unwrap();
        let ids: Vec<&str> = f.limits().iter().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["api/t", "other/u"], "both documents load");
        let regions = s.region_ids();
        let api = &f.limits()[0];
        assert_eq!(
            api.weights.default_allowance(&regions[0], &regions, 100),
            60
        );
        let other = &f.limits()[1];
        assert_eq!(other.consistency, Consistency::Eventual);
        assert_eq!(other.partition_policy, PartitionPolicy::Closed);
        assert_eq!(
            other
                .weights
                .default_allowance(&regions[0], &regions, 1_000),
            500,
            "its own weights stand"
        );
    }

    #[test]
    fn a_limit_the_loader_refuses_is_located_in_the_scenario_file() {
        // The scenario's parse reads the section through the loader (the one reader of
        // limits files), so the machines are never built from a section it refuses.
        let bad = YAML.replace("consistency: eventual", "consistency: sometimes");
        let Err(e) = crate::scenario::parse("test.yaml", &bad) else {
            panic!("expected a located error");
        };
        assert_eq!(e.file, "test.yaml");
        // The scenario text starts with a newline; `consistency:` is on its line 23, the value
        // at column 22 (the block is indented by 2).
        assert_eq!((e.line, e.column), (23, 22), "{e}");
        assert!(e.field.contains("consistency"), "{e}");
        assert!(e.message.contains("sometimes"), "{e}");
    }

    #[test]
    fn a_lease_wanted_becomes_a_lease_of_the_real_machine() {
        // Region a's default share of 100 is 60.
        let s = scenario(YAML);
        let f = CoreFactory::new(&s).unwrap();
        let mut a = f.region(&setup(&s, 0, Policy::Rebalancing), s.start);
        let now = s.start + Duration::from_millis(400);
        let LeaseAnswer::Granted(g) = a.handle_lease_wanted(now, &want(50, 1)) else {
            panic!("granted");
        };
        assert_eq!((g.units, g.remaining_units), (50, 10));
        // The lease ends with the window, 600 ms later.
        assert_eq!(g.ttl, Duration::from_millis(600));
        // 10 left cannot serve a request of 20: denied, and a coordinated region's gateways
        // ask again after one sync interval, not at the window's end.
        let LeaseAnswer::Denied(d) = a.handle_lease_wanted(now, &want(20, 20)) else {
            panic!("denied");
        };
        assert_eq!(d.retry_after, s.sync_interval);
        // Giving 30 back makes room for it.
        a.handle_release(
            now,
            &LeaseRelease {
                lease: g.lease,
                units: 30,
            },
        );
        assert!(matches!(
            a.handle_lease_wanted(now, &want(20, 20)),
            LeaseAnswer::Granted(_)
        ));
    }

    #[test]
    fn the_static_split_is_the_same_machine_on_a_fixed_share() {
        let s = scenario(YAML);
        let f = CoreFactory::new(&s).unwrap();
        let mut b = f.region(&setup(&s, 1, Policy::StaticSplit), s.start);
        let now = s.start + Duration::from_millis(400);
        // b's share of 100 is 40: no more, and nothing to sync.
        let LeaseAnswer::Granted(g) = b.handle_lease_wanted(now, &want(100, 1)) else {
            panic!("granted");
        };
        assert_eq!(g.units, 40);
        let LeaseAnswer::Denied(d) = b.handle_lease_wanted(now, &want(1, 1)) else {
            panic!("denied");
        };
        assert_eq!(
            d.retry_after,
            Duration::from_millis(600),
            "until the window resets"
        );
        assert!(b.poll_transmit(now).is_none());
    }

    #[test]
    fn a_restarted_agent_comes_back_from_its_store_however_long_it_grew() {
        let s = scenario(YAML);
        let f = CoreFactory::new(&s).unwrap();
        let setup = setup(&s, 0, Policy::Rebalancing);
        let mut a = f.region(&setup, s.start);
        let mut store = CoreStore::default();
        // Thousands of one-unit leases, each released: more records than the store keeps
        // before compacting to a snapshot.
        let mut leased = 0;
        for i in 0..40_000u64 {
            let now = s.start + Duration::from_micros(100 * i);
            if let LeaseAnswer::Granted(g) = a.handle_lease_wanted(now, &want(1, 1)) {
                leased += 1;
                if i % 2 == 0 {
                    a.handle_release(
                        now,
                        &LeaseRelease {
                            lease: g.lease,
                            units: 1,
                        },
                    );
                }
            }
            a.persist(&mut store);
        }
        assert!(leased > 0);
        assert!(store.records.len() <= STORE_COMPACT_RECORDS + 8);
        let mut before = RegionObservation::default();
        a.observe(&mut before);
        let restored = f.restore_region(&setup, &store, s.start + Duration::from_secs(4));
        let mut after = RegionObservation::default();
        restored.observe(&mut after);
        assert_eq!(after.entries, before.entries);
    }

    #[test]
    fn the_coordinator_answers_for_strict_limits_only() {
        let s = scenario(YAML);
        let f = CoreFactory::new(&s).unwrap();
        let setup = CoordinatorSetup {
            scenario: &s,
            policy: Policy::Rebalancing,
            seed: 0,
            leader_term: 0,
        };
        let c = f.coordinator(&setup, s.start);
        let counter = |limit: &str| CounterRef {
            limit: LimitId::from(limit),
            key: KeyId::from("t=1"),
            window: WindowIndex(0),
        };
        let a = RegionId::from("a");
        assert_eq!(c.table_allowance(&counter("api/t"), &a), Some(60));
        assert_eq!(c.table_allowance(&counter("other/u"), &a), None);
        let baseline = f.coordinator(
            &CoordinatorSetup {
                policy: Policy::StaticSplit,
                ..setup
            },
            s.start,
        );
        assert_eq!(baseline.table_allowance(&counter("api/t"), &a), None);
        assert_eq!(
            baseline.poll_timeout(),
            None,
            "the baseline's coordinator idles"
        );
    }

    #[test]
    fn a_reservation_may_use_its_units_plus_its_limit_s_settle_cap() {
        let yaml = YAML.replace(
            "weights: {a: 0.5, b: 0.5}",
            "weights: {a: 0.5, b: 0.5}\n        max_settle_overage: 0.25",
        );
        let f = CoreFactory::new(&scenario(&yaml)).unwrap();
        assert_eq!(
            f.max_use_units(&LimitId::from("api/t"), 100),
            100,
            "no cap: 0"
        );
        assert_eq!(f.max_use_units(&LimitId::from("other/u"), 100), 125);
        assert_eq!(
            f.max_use_units(&LimitId::from("other/u"), 3),
            3,
            "rounded down"
        );
        assert_eq!(f.max_use_units(&LimitId::from("unknown"), 7), 7);
    }
}
