//! The replicated allowance table: the only state the coordinator replicates (through raft).
//!
//! Per counter (limit, key, window) and region it holds an explicit allowance `a_r` with its
//! epoch and at most one pending release. A counter or region with no row has the default
//! `floor(w_r * L)`, so defaults cost no state and only escalated counters get rows.
//!
//! Every mutation goes through [`AllowanceTable::apply`], which is deterministic and refuses
//! (with a reason) any command that would break invariant 2: for every counter, the sum over
//! regions of `a_r` (explicit or default) is at most `L`. Each applied command re-checks it.
//!
//! Epochs: each command that changes what a region should enforce (grow, release request,
//! release completion, a reclaimed zero) bumps the row's epoch; grants and release requests share
//! that sequence, so a region that has seen a newer one ignores an older one. Epochs never go
//! back: rows dropped by a [`TableCommand::SetConfig`] leave their largest epoch as the limit's
//! floor, and a row created later starts there.
//!
//! Removed regions ([`TableCommand::RemoveRegion`], docs/coordinator.md "Removing a region")
//! stay members: their defaults and rows count in every sum until reclaimed, but no command
//! may raise what they hold or ask them for anything they would have to answer.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, LimitId, RegionId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::rebalance::hashed::OrderedMap;
use crate::sync::CounterRef;
use crate::time::{Timestamp, Window, WindowIndex};

/// Most explicit rows the table holds. A command that would create more is refused: the demand
/// behind it stays unmet (stranded quota), which is safe, and the table stays bounded.
pub const MAX_TABLE_ROWS: usize = 65_536;

/// A release asked of a region and not yet acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRelease {
    pub id: u64,
    pub units: u64,
    /// The epoch the request was sent with.
    pub epoch: Epoch,
}

/// One region's explicit allowance for one counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowanceRow {
    /// Still includes the units of a pending release: they are freed only by its ack.
    pub allowance_units: u64,
    /// The epoch of the last grant, release request or completion for this row.
    pub epoch: Epoch,
    pub pending: Option<PendingRelease>,
}

/// A closed-policy reclaim: the region's default is zero for windows from `from_window` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reclaim {
    pub from_window: WindowIndex,
}

/// An operator's removal of a region (`DELETE /v1/regions/{name}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// The leader's clock when it proposed the removal: for status only, never for a rule.
    pub at: Timestamp,
}

/// A mutation of the table, as committed through raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TableCommand {
    /// A new limits configuration and region membership. Rows of limits that are gone or
    /// whose allocation changed ([`allocation_changed`], or the membership changed) are
    /// dropped: they were computed under the old parameters, and regions drop theirs too.
    SetConfig {
        version: u64,
        limits: Vec<LimitSpec>,
        regions: Vec<RegionId>,
    },
    /// Raise `region`'s allowance to `allowance_units`, out of free quota only.
    Grow {
        counter: CounterRef,
        region: RegionId,
        /// The row's epoch the proposal was computed from; a stale proposal is refused.
        expected_epoch: Epoch,
        allowance_units: u64,
    },
    /// Ask `region` to give back up to `units`; the allowance stays until the ack commits.
    RequestRelease {
        counter: CounterRef,
        region: RegionId,
        expected_epoch: Epoch,
        units: u64,
    },
    /// The region acknowledged release `id`: it already lowered its own allowance.
    CompleteRelease {
        counter: CounterRef,
        region: RegionId,
        id: u64,
        released_units: u64,
    },
    /// The region has been silent past the deadline under the `closed` policy: its default
    /// is free for windows from `from_window` on.
    Reclaim {
        limit: LimitId,
        region: RegionId,
        from_window: WindowIndex,
    },
    /// The region is back; rows materialised as zero for it stay, other counters revert to
    /// its default.
    EndReclaim { limit: LimitId, region: RegionId },
    /// Drop the rows of windows before `before_window` (they have ended).
    CollectGarbage {
        limit: LimitId,
        before_window: WindowIndex,
    },
    /// The operator removes `region`: from now on it is never grown nor asked to release, and
    /// its reclaims never end; what it holds stays counted (its floor is reclaimed as a silent
    /// region's is, under the closed policy only). Last of the variants, with `RestoreRegion`:
    /// entries written before them decode.
    RemoveRegion { region: RegionId, at: Timestamp },
    /// The operator adds a removed region back: it is planned for again once it is heard.
    RestoreRegion { region: RegionId },
    /// The leader heard `region` enforce configuration `version`: recorded so that a later
    /// leader, which has not heard it yet, knows which version it may still enforce (a region
    /// cut off through a reload and a leader change). Last variant: entries written before it
    /// decode.
    RecordVersion { region: RegionId, version: u64 },
}

impl TableCommand {
    /// The one counter whose sum of allowances the command may change, for a row command;
    /// `None` for a command that may change any counter's (reclaims change defaults,
    /// configuration changes quotas and shares, collection drops rows).
    pub fn touched_counter(&self) -> Option<&CounterRef> {
        match self {
            TableCommand::Grow { counter, .. }
            | TableCommand::RequestRelease { counter, .. }
            | TableCommand::CompleteRelease { counter, .. } => Some(counter),
            TableCommand::SetConfig { .. }
            | TableCommand::Reclaim { .. }
            | TableCommand::EndReclaim { .. }
            | TableCommand::CollectGarbage { .. }
            | TableCommand::RemoveRegion { .. }
            | TableCommand::RestoreRegion { .. }
            | TableCommand::RecordVersion { .. } => None,
        }
    }
}

/// Why a command was refused. A refusal changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RejectReason {
    /// Applying it would make the sum of allowances exceed the quota.
    AboveQuota {
        counter: CounterRef,
        sum_units: u128,
        quota_units: u64,
    },
    UnknownLimit(LimitId),
    UnknownRegion(RegionId),
    /// The limit is eventual or unlimited: it has no allowance rows.
    NotStrict(LimitId),
    StaleEpoch {
        expected: Epoch,
        actual: Epoch,
    },
    /// A grow that would not raise the allowance, or a release of zero or more than held.
    BadAmount,
    /// The row already has a release pending (one at a time), or has none to complete.
    ReleasePending,
    NoSuchRelease {
        id: u64,
    },
    /// The counter's window was garbage-collected.
    WindowCollected,
    TableFull,
    StaleConfig {
        current_version: u64,
    },
    /// A reclaim for a limit without the closed policy, or one that already exists / does not.
    ReclaimNotAllowed,
    /// The region was removed: it is neither grown nor asked to release, its reclaims do not
    /// end, and it cannot be removed twice.
    RegionRemoved(RegionId),
    /// A restore of a region that is not removed.
    NotRemoved(RegionId),
    /// A region recorded on a version the table never had.
    FutureVersion {
        version: u64,
        current_version: u64,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::AboveQuota {
                counter,
                sum_units,
                quota_units,
            } => write!(
                f,
                "allowances of {counter:?} would sum to {sum_units}, above the quota {quota_units}"
            ),
            other => write!(f, "{other:?}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyOutcome {
    Applied,
    Rejected(RejectReason),
}

impl ApplyOutcome {
    pub fn is_applied(&self) -> bool {
        matches!(self, ApplyOutcome::Applied)
    }
}

/// The replicated state. Serialisable as a whole, for raft snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowanceTable {
    config_version: u64,
    limits: BTreeMap<LimitId, LimitSpec>,
    /// Sorted, no duplicates.
    regions: Vec<RegionId>,
    /// Looked up by every command, plan and answer; iterated in counter order (D42).
    counters: OrderedMap<CounterRef, BTreeMap<RegionId, AllowanceRow>>,
    reclaims: BTreeMap<(LimitId, RegionId), Reclaim>,
    /// Windows below this were collected; no row may be created for them again.
    collected_below: BTreeMap<LimitId, WindowIndex>,
    /// Per limit, one above the largest epoch of the rows a configuration change dropped: a
    /// row created later starts at it, so a region that applied one of the dropped rows still
    /// takes the next grant, and a proposal from before the change is stale (at most one entry
    /// per limit id ever configured: a limit removed and added back must still start above).
    #[serde(default)]
    epoch_floor: BTreeMap<LimitId, Epoch>,
    next_release_id: u64,
    row_count: usize,
    /// Regions the operator removed (members still). Snapshots written before it read through
    /// [`AllowanceTableV1`].
    removed: BTreeMap<RegionId, Removal>,
    /// Per member, the configuration version a leader last heard it enforce
    /// ([`TableCommand::RecordVersion`]). Last field: snapshots written before it read through
    /// [`AllowanceTableV2`].
    recorded_versions: BTreeMap<RegionId, u64>,
}

/// The table's layout before recorded versions (postcard keeps no field names).
#[derive(Deserialize)]
pub struct AllowanceTableV2 {
    config_version: u64,
    limits: BTreeMap<LimitId, LimitSpec>,
    regions: Vec<RegionId>,
    counters: OrderedMap<CounterRef, BTreeMap<RegionId, AllowanceRow>>,
    reclaims: BTreeMap<(LimitId, RegionId), Reclaim>,
    collected_below: BTreeMap<LimitId, WindowIndex>,
    epoch_floor: BTreeMap<LimitId, Epoch>,
    next_release_id: u64,
    row_count: usize,
    removed: BTreeMap<RegionId, Removal>,
}

impl From<AllowanceTableV2> for AllowanceTable {
    fn from(v2: AllowanceTableV2) -> Self {
        AllowanceTable {
            config_version: v2.config_version,
            limits: v2.limits,
            regions: v2.regions,
            counters: v2.counters,
            reclaims: v2.reclaims,
            collected_below: v2.collected_below,
            epoch_floor: v2.epoch_floor,
            next_release_id: v2.next_release_id,
            row_count: v2.row_count,
            removed: v2.removed,
            recorded_versions: BTreeMap::new(),
        }
    }
}

/// The table's layout before removals, for snapshots written before them (postcard keeps no
/// field names: a new field is a new layout).
#[derive(Deserialize)]
pub struct AllowanceTableV1 {
    config_version: u64,
    limits: BTreeMap<LimitId, LimitSpec>,
    regions: Vec<RegionId>,
    counters: BTreeMap<CounterRef, BTreeMap<RegionId, AllowanceRow>>,
    reclaims: BTreeMap<(LimitId, RegionId), Reclaim>,
    collected_below: BTreeMap<LimitId, WindowIndex>,
    epoch_floor: BTreeMap<LimitId, Epoch>,
    next_release_id: u64,
    row_count: usize,
}

impl From<AllowanceTableV1> for AllowanceTable {
    fn from(v1: AllowanceTableV1) -> Self {
        AllowanceTable {
            config_version: v1.config_version,
            limits: v1.limits,
            regions: v1.regions,
            counters: v1.counters.into_iter().collect(),
            reclaims: v1.reclaims,
            collected_below: v1.collected_below,
            epoch_floor: v1.epoch_floor,
            next_release_id: v1.next_release_id,
            row_count: v1.row_count,
            removed: BTreeMap::new(),
            recorded_versions: BTreeMap::new(),
        }
    }
}

/// Quota and window of a strict, finite limit: the only kind with rows.
#[derive(Clone, Copy, Debug)]
struct StrictQuota {
    units: u64,
    window: Window,
}

impl AllowanceTable {
    pub fn new() -> Self {
        AllowanceTable {
            next_release_id: 1,
            ..AllowanceTable::default()
        }
    }

    /// The same table, its counters hashed with `seed` (D42): a leader seeds its copy as it
    /// does its own maps. Changes no row, no order and no output.
    pub fn reseeded(mut self, seed: u64) -> Self {
        self.counters = std::mem::take(&mut self.counters).reseeded(seed);
        self
    }

    pub fn config_version(&self) -> u64 {
        self.config_version
    }

    pub fn regions(&self) -> &[RegionId] {
        &self.regions
    }

    pub fn limit(&self, id: &LimitId) -> Option<&LimitSpec> {
        self.limits.get(id)
    }

    /// The table's own copy of `id` (the same string), if it is a configured limit.
    pub fn limit_id(&self, id: &LimitId) -> Option<&LimitId> {
        self.limits.get_key_value(id).map(|(k, _)| k)
    }

    /// The table's own copy of `region` (the same string), if it is a member.
    pub fn region_id(&self, region: &RegionId) -> Option<&RegionId> {
        let i = self.regions.binary_search(region).ok()?;
        self.regions.get(i)
    }

    pub fn limits(&self) -> impl Iterator<Item = &LimitSpec> {
        self.limits.values()
    }

    pub fn row_count(&self) -> usize {
        self.row_count
    }

    pub fn row(&self, counter: &CounterRef, region: &RegionId) -> Option<&AllowanceRow> {
        self.counters.get(counter)?.get(region)
    }

    /// Every explicit row of `counter`, by region: one search of the table for what takes
    /// one per region through [`AllowanceTable::row`].
    pub fn rows(&self, counter: &CounterRef) -> Option<&BTreeMap<RegionId, AllowanceRow>> {
        self.counters.get(counter)
    }

    /// Counters with at least one explicit row, with their rows.
    pub fn counters(
        &self,
    ) -> impl Iterator<Item = (&CounterRef, &BTreeMap<RegionId, AllowanceRow>)> {
        self.counters.iter()
    }

    /// Regions the operator removed, with when.
    pub fn removed(&self) -> &BTreeMap<RegionId, Removal> {
        &self.removed
    }

    /// The configuration version a leader last heard `region` enforce, if one was recorded.
    pub fn recorded_version(&self, region: &RegionId) -> Option<u64> {
        self.recorded_versions.get(region).copied()
    }

    pub fn is_removed(&self, region: &RegionId) -> bool {
        self.removed.contains_key(region)
    }

    pub fn reclaims(&self) -> impl Iterator<Item = (&(LimitId, RegionId), &Reclaim)> {
        self.reclaims.iter()
    }

    pub fn reclaim(&self, limit: &LimitId, region: &RegionId) -> Option<&Reclaim> {
        self.reclaims.get(&(limit.clone(), region.clone()))
    }

    /// The epoch a row of `limit` starts at: the floor left by dropped rows, else 0.
    pub fn epoch_floor(&self, limit: &LimitId) -> Epoch {
        self.epoch_floor.get(limit).copied().unwrap_or_default()
    }

    /// The epoch of (`counter`, `region`): its row's, or the floor where it has none. A
    /// command on the row is proposed with it.
    pub fn epoch_of(&self, counter: &CounterRef, region: &RegionId) -> Epoch {
        self.epoch_of_row(counter, self.row(counter, region))
    }

    /// [`AllowanceTable::epoch_of`], given `row`, the row of (`counter`, the region).
    fn epoch_of_row(&self, counter: &CounterRef, row: Option<&AllowanceRow>) -> Epoch {
        row.map_or_else(|| self.epoch_floor(&counter.limit), |r| r.epoch)
    }

    /// `region`'s default for `counter`: `floor(w_r * L)`, or zero where reclaimed.
    pub fn default_allowance(&self, counter: &CounterRef, region: &RegionId) -> u64 {
        let Some(spec) = self.limits.get(&counter.limit) else {
            return 0;
        };
        let Quota::Units { units, .. } = spec.quota else {
            return 0;
        };
        if self.reclaims_window(counter, region) {
            return 0;
        }
        spec.weights.default_allowance(region, &self.regions, units)
    }

    /// `floor(w_r * L)` as configured, ignoring reclaims: what the region enforces for a
    /// counter it has received no grant for.
    pub fn configured_default(&self, counter: &CounterRef, region: &RegionId) -> u64 {
        match self.limits.get(&counter.limit).map(|s| (s, s.quota)) {
            Some((spec, Quota::Units { units, .. })) => {
                spec.weights.default_allowance(region, &self.regions, units)
            }
            _ => 0,
        }
    }

    /// The allowance the table grants `region` for `counter`, explicit or default.
    pub fn allowance(&self, counter: &CounterRef, region: &RegionId) -> u64 {
        self.allowance_of(counter, region, self.row(counter, region))
    }

    /// [`AllowanceTable::allowance`], given `row`, the row of (`counter`, `region`).
    pub fn allowance_of(
        &self,
        counter: &CounterRef,
        region: &RegionId,
        row: Option<&AllowanceRow>,
    ) -> u64 {
        match row {
            Some(row) => row.allowance_units,
            None => self.default_allowance(counter, region),
        }
    }

    /// Sum over regions (members and any region with a row) of the allowance for `counter`.
    pub fn allowance_sum(&self, counter: &CounterRef) -> u128 {
        self.allowance_sum_of(counter, self.counters.get(counter))
    }

    /// [`AllowanceTable::allowance_sum`], given `rows`, the rows of `counter`.
    fn allowance_sum_of(
        &self,
        counter: &CounterRef,
        rows: Option<&BTreeMap<RegionId, AllowanceRow>>,
    ) -> u128 {
        let mut sum: u128 = self
            .regions
            .iter()
            .filter(|r| rows.is_none_or(|rows| !rows.contains_key(*r)))
            .map(|r| u128::from(self.default_allowance(counter, r)))
            .sum();
        if let Some(rows) = rows {
            sum += rows
                .values()
                .map(|row| u128::from(row.allowance_units))
                .sum::<u128>();
        }
        sum
    }

    /// Free quota of `counter`: `L - sum a_r`, or zero for a limit without rows.
    pub fn free_units(&self, counter: &CounterRef) -> u64 {
        self.free_units_of(counter, self.counters.get(counter))
    }

    /// [`AllowanceTable::free_units`], given `rows`, the rows of `counter`.
    pub fn free_units_of(
        &self,
        counter: &CounterRef,
        rows: Option<&BTreeMap<RegionId, AllowanceRow>>,
    ) -> u64 {
        match self.strict_quota(&counter.limit) {
            Ok(q) => {
                u128::from(q.units).saturating_sub(self.allowance_sum_of(counter, rows)) as u64
            }
            Err(_) => 0,
        }
    }

    /// Invariant 2 for every counter with rows; used by tests and after config changes.
    pub fn check_invariants(&self) -> Result<(), RejectReason> {
        let counters: Vec<&CounterRef> = self.counters.keys().collect();
        for counter in counters {
            self.check_counter(counter)?;
        }
        let rows: usize = self.counters.values().map(BTreeMap::len).sum();
        assert_eq!(rows, self.row_count, "row count out of step");
        Ok(())
    }

    /// Invariant 2 for `counter` alone (nothing for a counter without rows: all defaults,
    /// whose sum fits by construction).
    pub fn check_counter_invariant(&self, counter: &CounterRef) -> Result<(), RejectReason> {
        if !self.counters.contains_key(counter) {
            return Ok(());
        }
        self.check_counter(counter)
    }

    /// [`AllowanceTable::apply`], then invariant 2 wherever the command may have moved a sum:
    /// its own counter for a row command (no other counter's rows, defaults or quota change),
    /// every counter for anything else. The replicated state machine applies entries through
    /// this, so a round of row commands costs what it touches, not the table's size.
    pub fn apply_checked(&mut self, cmd: TableCommand) -> Result<ApplyOutcome, RejectReason> {
        let touched = cmd.touched_counter().cloned();
        let outcome = self.apply(cmd);
        match touched {
            Some(counter) => self.check_counter_invariant(&counter)?,
            None => self.check_invariants()?,
        }
        Ok(outcome)
    }

    /// Apply one committed command. Deterministic; a refused command changes nothing.
    pub fn apply(&mut self, cmd: TableCommand) -> ApplyOutcome {
        let result = match cmd {
            TableCommand::SetConfig {
                version,
                limits,
                regions,
            } => self.set_config(version, limits, regions),
            TableCommand::Grow {
                counter,
                region,
                expected_epoch,
                allowance_units,
            } => self.grow(&counter, &region, expected_epoch, allowance_units),
            TableCommand::RequestRelease {
                counter,
                region,
                expected_epoch,
                units,
            } => self.request_release(&counter, &region, expected_epoch, units),
            TableCommand::CompleteRelease {
                counter,
                region,
                id,
                released_units,
            } => self.complete_release(&counter, &region, id, released_units),
            TableCommand::Reclaim {
                limit,
                region,
                from_window,
            } => self.start_reclaim(limit, region, from_window),
            TableCommand::EndReclaim { limit, region } => self.end_reclaim(limit, region),
            TableCommand::CollectGarbage {
                limit,
                before_window,
            } => {
                self.collect_garbage(limit, before_window);
                Ok(())
            }
            TableCommand::RemoveRegion { region, at } => self.remove_region(region, at),
            TableCommand::RestoreRegion { region } => self.restore_region(&region),
            TableCommand::RecordVersion { region, version } => self.record_version(region, version),
        };
        match result {
            Ok(()) => ApplyOutcome::Applied,
            Err(reason) => ApplyOutcome::Rejected(reason),
        }
    }

    fn strict_quota(&self, limit: &LimitId) -> Result<StrictQuota, RejectReason> {
        let spec = self
            .limits
            .get(limit)
            .ok_or_else(|| RejectReason::UnknownLimit(limit.clone()))?;
        match (spec.consistency, spec.quota) {
            (Consistency::Strict, Quota::Units { units, window }) => {
                Ok(StrictQuota { units, window })
            }
            _ => Err(RejectReason::NotStrict(limit.clone())),
        }
    }

    fn check_counter(&self, counter: &CounterRef) -> Result<(), RejectReason> {
        let quota = self.strict_quota(&counter.limit)?;
        let sum = self.allowance_sum(counter);
        if sum > u128::from(quota.units) {
            return Err(RejectReason::AboveQuota {
                counter: counter.clone(),
                sum_units: sum,
                quota_units: quota.units,
            });
        }
        Ok(())
    }

    /// Checks shared by every row command: a strict limit, a member region, a live window.
    fn check_row_target(
        &self,
        counter: &CounterRef,
        region: &RegionId,
    ) -> Result<StrictQuota, RejectReason> {
        let quota = self.strict_quota(&counter.limit)?;
        if self.regions.binary_search(region).is_err() {
            return Err(RejectReason::UnknownRegion(region.clone()));
        }
        // A removed region is refused on the sync stream: a grow would never reach it (and
        // take free quota from the others), a release request never be acknowledged.
        if self.is_removed(region) {
            return Err(RejectReason::RegionRemoved(region.clone()));
        }
        let collected = self
            .collected_below
            .get(&counter.limit)
            .is_some_and(|below| counter.window < *below);
        if collected {
            return Err(RejectReason::WindowCollected);
        }
        Ok(quota)
    }

    /// Rows a command on (`counter`, `region`) would create: the region's own, plus a zero row
    /// for every region whose default is reclaimed in this window, when the counter is new.
    /// Those zeroes are what the returning region is told before anything else.
    fn rows_to_create(&self, counter: &CounterRef, region: &RegionId) -> Vec<RegionId> {
        let mut new_rows = Vec::new();
        let rows = self.counters.get(counter);
        if rows.is_none() {
            new_rows.extend(self.reclaimed_in(counter).filter(|r| *r != region).cloned());
        }
        if rows.is_none_or(|rows| !rows.contains_key(region)) {
            new_rows.push(region.clone());
        }
        new_rows
    }

    /// The regions a reclaim covers in `counter`'s window: each holds an explicit zero in a
    /// counter that has rows.
    fn reclaimed_in<'a>(&'a self, counter: &'a CounterRef) -> impl Iterator<Item = &'a RegionId> {
        self.reclaims
            .iter()
            .filter(|((limit, _), rc)| *limit == counter.limit && counter.window >= rc.from_window)
            .map(|((_, r), _)| r)
    }

    /// The row for (`counter`, `region`), created at its default (and any reclaimed zeroes)
    /// if absent. Fails when the table is full.
    fn materialise(
        &mut self,
        counter: &CounterRef,
        region: &RegionId,
    ) -> Result<&mut AllowanceRow, RejectReason> {
        let new_rows = self.rows_to_create(counter, region);
        if self.row_count + new_rows.len() > MAX_TABLE_ROWS {
            return Err(RejectReason::TableFull);
        }
        let floor = self.epoch_floor(&counter.limit);
        for r in new_rows {
            let allowance_units = self.default_allowance(counter, &r);
            // A reclaimed zero is news to its region (its own default is its floor), so it gets
            // an epoch to be sent with; a row at the region's own default is not news.
            let epoch = if &r == region {
                floor
            } else {
                Epoch(floor.0 + 1)
            };
            self.counters.entry_or_default(counter).insert(
                r,
                AllowanceRow {
                    allowance_units,
                    epoch,
                    pending: None,
                },
            );
            self.row_count += 1;
        }
        self.counters
            .get_mut(counter)
            .and_then(|rows| rows.get_mut(region))
            .ok_or(RejectReason::TableFull)
    }

    fn grow(
        &mut self,
        counter: &CounterRef,
        region: &RegionId,
        expected_epoch: Epoch,
        allowance_units: u64,
    ) -> Result<(), RejectReason> {
        let quota = self.check_row_target(counter, region)?;
        // The counter's rows, searched for once for every question below.
        let rows = self.counters.get(counter);
        let row = rows.and_then(|rows| rows.get(region));
        let current = self.allowance_of(counter, region, row);
        let epoch = self.epoch_of_row(counter, row);
        if epoch != expected_epoch {
            return Err(RejectReason::StaleEpoch {
                expected: expected_epoch,
                actual: epoch,
            });
        }
        if row.is_some_and(|r| r.pending.is_some()) {
            return Err(RejectReason::ReleasePending);
        }
        if allowance_units <= current {
            return Err(RejectReason::BadAmount);
        }
        // Growing only ever draws on free quota: the new sum is the old plus the increase.
        let sum = self.allowance_sum_of(counter, rows) + u128::from(allowance_units - current);
        if sum > u128::from(quota.units) {
            return Err(RejectReason::AboveQuota {
                counter: counter.clone(),
                sum_units: sum,
                quota_units: quota.units,
            });
        }
        let row = self.materialise(counter, region)?;
        row.allowance_units = allowance_units;
        row.epoch = Epoch(row.epoch.0 + 1);
        self.assert_counter(counter);
        Ok(())
    }

    fn request_release(
        &mut self,
        counter: &CounterRef,
        region: &RegionId,
        expected_epoch: Epoch,
        units: u64,
    ) -> Result<(), RejectReason> {
        self.check_row_target(counter, region)?;
        let row = self.row(counter, region);
        let current = self.allowance_of(counter, region, row);
        let epoch = self.epoch_of_row(counter, row);
        if epoch != expected_epoch {
            return Err(RejectReason::StaleEpoch {
                expected: expected_epoch,
                actual: epoch,
            });
        }
        if row.is_some_and(|r| r.pending.is_some()) {
            return Err(RejectReason::ReleasePending);
        }
        if units == 0 || units > current {
            return Err(RejectReason::BadAmount);
        }
        let id = self.next_release_id;
        let row = self.materialise(counter, region)?;
        row.epoch = Epoch(row.epoch.0 + 1);
        row.pending = Some(PendingRelease {
            id,
            units,
            epoch: row.epoch,
        });
        self.next_release_id += 1;
        self.assert_counter(counter);
        Ok(())
    }

    fn complete_release(
        &mut self,
        counter: &CounterRef,
        region: &RegionId,
        id: u64,
        released_units: u64,
    ) -> Result<(), RejectReason> {
        let row = self
            .counters
            .get_mut(counter)
            .and_then(|rows| rows.get_mut(region))
            .ok_or(RejectReason::NoSuchRelease { id })?;
        let pending = match &row.pending {
            Some(p) if p.id == id => p.clone(),
            _ => return Err(RejectReason::NoSuchRelease { id }),
        };
        if released_units > pending.units {
            return Err(RejectReason::BadAmount);
        }
        // The region lowered its own allowance by exactly this much before acking, so lowering
        // ours by the same amount keeps its allowance at or below ours.
        row.allowance_units -= released_units;
        row.epoch = Epoch(row.epoch.0 + 1);
        row.pending = None;
        self.assert_counter(counter);
        Ok(())
    }

    fn start_reclaim(
        &mut self,
        limit: LimitId,
        region: RegionId,
        from_window: WindowIndex,
    ) -> Result<(), RejectReason> {
        self.strict_quota(&limit)?;
        let closed = self
            .limits
            .get(&limit)
            .is_some_and(|s| s.partition_policy == PartitionPolicy::Closed);
        if !closed || self.reclaims.contains_key(&(limit.clone(), region.clone())) {
            return Err(RejectReason::ReclaimNotAllowed);
        }
        if self.regions.binary_search(&region).is_err() {
            return Err(RejectReason::UnknownRegion(region));
        }
        // Counters that already have rows get an explicit zero for the region now (counters
        // that get rows later get theirs when created): the region holds no grant for them and
        // would use its floor on return, so the zero must be sent to it before anything else.
        let affected: Vec<CounterRef> = self
            .counters
            .iter()
            .filter(|(c, rows)| {
                c.limit == limit && c.window >= from_window && !rows.contains_key(&region)
            })
            .map(|(c, _)| c.clone())
            .collect();
        if self.row_count + affected.len() > MAX_TABLE_ROWS {
            return Err(RejectReason::TableFull);
        }
        for counter in affected {
            self.insert_zero_row(&counter, &region);
        }
        self.reclaims
            .insert((limit, region), Reclaim { from_window });
        Ok(())
    }

    fn insert_zero_row(&mut self, counter: &CounterRef, region: &RegionId) {
        let epoch = Epoch(self.epoch_floor(&counter.limit).0 + 1);
        let rows = self.counters.entry_or_default(counter);
        rows.insert(
            region.clone(),
            AllowanceRow {
                allowance_units: 0,
                epoch,
                pending: None,
            },
        );
        self.row_count += 1;
    }

    fn end_reclaim(&mut self, limit: LimitId, region: RegionId) -> Result<(), RejectReason> {
        // Its floor may already be in other regions' rows: it comes back only once restored
        // and heard, through the zero rows the reclaim left.
        if self.is_removed(&region) {
            return Err(RejectReason::RegionRemoved(region));
        }
        if self.reclaims.remove(&(limit, region)).is_none() {
            return Err(RejectReason::ReclaimNotAllowed);
        }
        // Counters with rows hold an explicit zero for the region (created with the counter or
        // at the reclaim); counters without rows go back to everyone's default, whose sum fits.
        Ok(())
    }

    fn remove_region(&mut self, region: RegionId, at: Timestamp) -> Result<(), RejectReason> {
        if self.regions.binary_search(&region).is_err() {
            return Err(RejectReason::UnknownRegion(region));
        }
        if self.is_removed(&region) {
            return Err(RejectReason::RegionRemoved(region));
        }
        // Nothing it holds changes: its rows and defaults still count in every sum, so the
        // others grow into them only through a reclaim (closed policy) or a committed ack.
        self.removed.insert(region, Removal { at });
        Ok(())
    }

    fn restore_region(&mut self, region: &RegionId) -> Result<(), RejectReason> {
        if self.removed.remove(region).is_none() {
            return Err(RejectReason::NotRemoved(region.clone()));
        }
        // Its reclaims stay until it is heard: the leader ends them before its first answer.
        Ok(())
    }

    fn record_version(&mut self, region: RegionId, version: u64) -> Result<(), RejectReason> {
        if self.regions.binary_search(&region).is_err() {
            return Err(RejectReason::UnknownRegion(region));
        }
        if version > self.config_version {
            return Err(RejectReason::FutureVersion {
                version,
                current_version: self.config_version,
            });
        }
        self.recorded_versions.insert(region, version);
        Ok(())
    }

    fn collect_garbage(&mut self, limit: LimitId, before_window: WindowIndex) {
        let doomed: Vec<CounterRef> = self
            .counters
            .iter()
            .filter(|(c, _)| c.limit == limit && c.window < before_window)
            .map(|(c, _)| c.clone())
            .collect();
        for counter in doomed {
            if let Some(rows) = self.counters.remove(&counter) {
                self.row_count -= rows.len();
            }
        }
        let below = self.collected_below.entry(limit).or_default();
        *below = (*below).max(before_window);
    }

    fn set_config(
        &mut self,
        version: u64,
        limits: Vec<LimitSpec>,
        mut regions: Vec<RegionId>,
    ) -> Result<(), RejectReason> {
        if version <= self.config_version && !self.limits.is_empty() {
            return Err(RejectReason::StaleConfig {
                current_version: self.config_version,
            });
        }
        regions.sort();
        regions.dedup();
        let mut next = self.clone();
        next.config_version = version;
        next.limits = limits.into_iter().map(|l| (l.id.clone(), l)).collect();
        let members_changed = next.regions != regions;
        next.recorded_versions
            .retain(|r, _| regions.binary_search(r).is_ok());
        next.regions = regions;
        next.drop_rows_of_changed_limits(&self.limits, members_changed);
        // Only rows of unchanged limits and members are left, and they fit as they did: a
        // change is never refused for rows computed under a quota that no longer applies.
        next.check_invariants()?;
        *self = next;
        Ok(())
    }

    /// Drop the rows (and so their pending releases) of limits that are gone, not strict, or
    /// whose allocation changed, or of every limit when the membership changed (defaults are
    /// shares among the members); their largest epoch becomes the limit's floor.
    fn drop_rows_of_changed_limits(
        &mut self,
        old: &BTreeMap<LimitId, LimitSpec>,
        members_changed: bool,
    ) {
        let keeps = |id: &LimitId, table: &AllowanceTable| {
            let (Ok(_), Some(old), Some(new)) =
                (table.strict_quota(id), old.get(id), table.limits.get(id))
            else {
                return false;
            };
            !members_changed && !allocation_changed(old, new)
        };
        let dropped: Vec<CounterRef> = self
            .counters
            .keys()
            .filter(|c| !keeps(&c.limit, self))
            .cloned()
            .collect();
        let mut top: BTreeMap<LimitId, Epoch> = BTreeMap::new();
        let mut dropped_rows = Vec::new();
        for counter in dropped {
            if let Some(rows) = self.counters.remove(&counter) {
                self.row_count -= rows.len();
                let e = rows.values().map(|r| r.epoch).max().unwrap_or_default();
                let t = top.entry(counter.limit.clone()).or_default();
                *t = (*t).max(e);
                // Under another window length the counter is another one: nothing to keep.
                let window_of = |l: &LimitSpec| match l.quota {
                    Quota::Units { window, .. } => Some(window),
                    Quota::Unlimited => None,
                };
                let new_window = self.window_of(&counter.limit);
                let same_window = new_window.is_some()
                    && old.get(&counter.limit).and_then(window_of) == new_window;
                // Only a closed limit's defaults are ever reclaimed.
                let closed = self
                    .limits
                    .get(&counter.limit)
                    .is_some_and(|s| s.partition_policy == PartitionPolicy::Closed);
                for (region, row) in rows.into_iter().filter(|_| same_window && closed) {
                    dropped_rows.push((counter.clone(), region, row.allowance_units));
                }
            }
        }
        // One above every epoch the old parameters used, rows or not: a proposal computed
        // before the change (compare-and-set on the epoch) can then never apply after it.
        let changed = old.keys().filter(|id| !keeps(id, self)).cloned();
        let changed: Vec<LimitId> = changed.collect();
        for id in changed {
            let t = top.get(&id).copied().unwrap_or_default();
            let floor = self.epoch_floor.entry(id).or_default();
            *floor = Epoch((*floor).max(t).0 + 1);
        }
        let members = &self.regions;
        self.removed.retain(|r, _| members.binary_search(r).is_ok());
        let limits = &self.limits;
        self.reclaims.retain(|(limit, _), _| {
            limits
                .get(limit)
                .is_some_and(|s| s.partition_policy == PartitionPolicy::Closed)
        });
        self.keep_dropped_rows(dropped_rows);
    }

    /// Whether a reclaim of `region` covers `counter`'s window: its default there is zero.
    fn reclaims_window(&self, counter: &CounterRef, region: &RegionId) -> bool {
        self.reclaim(&counter.limit, region)
            .is_some_and(|r| counter.window >= r.from_window)
    }

    /// A grant is spent where the region holds it, whatever happens to contact: a region
    /// may have admitted under a dropped row, and under the new parameters it holds what it
    /// used up to its new default (`closed_units` on the agent), or that default if it is
    /// heard. Dropped with no trace, the row would leave the region at its default, and a
    /// reclaim proposed later (its region silent, removed) would then zero that default in
    /// this very window, under units already spent; the others could be grown into them. So
    /// each row stays, cut to the region's new configured default (the defaults' sum fits
    /// the new quota): in a window a reclaim already covers, to what the old row held as
    /// well, since the region there is closed and holds at most what it used of the row.
    ///
    /// A counter left with rows holds an explicit zero for every region a reclaim covers
    /// there, as one created under the reclaim does (`rows_to_create`): without it, the
    /// reclaim's end would give the region its default back beside the others' rows grown
    /// into it, above the quota (swarm seed 3019340).
    fn keep_dropped_rows(&mut self, rows: Vec<(CounterRef, RegionId, u64)>) {
        let mut kept: Vec<CounterRef> = Vec::new();
        for (counter, region, units) in rows {
            let default = self.configured_default(&counter, &region);
            let units = if self.reclaims_window(&counter, &region) {
                units.min(default)
            } else {
                default
            };
            if units == 0 {
                continue;
            }
            // A row at the floor is no news to the region (it holds its default without a
            // grant); one cut below the default is, as a zero row is: above the floor, so the
            // answers carry it (swarm seed 3164930: a row of 87 left at the floor was never
            // sent, and the region enforced its new default, 1,625).
            let floor = self.epoch_floor(&counter.limit);
            let epoch = if units < default {
                Epoch(floor.0 + 1)
            } else {
                floor
            };
            let row = AllowanceRow {
                allowance_units: units,
                epoch,
                pending: None,
            };
            self.counters.entry_or_default(&counter).insert(region, row);
            self.row_count += 1;
            if kept.last() != Some(&counter) {
                kept.push(counter);
            }
        }
        for counter in kept {
            let unrowed: Vec<RegionId> = self
                .reclaimed_in(&counter)
                .filter(|r| self.row(&counter, r).is_none())
                .cloned()
                .collect();
            for region in unrowed {
                self.insert_zero_row(&counter, &region);
            }
        }
    }

    fn assert_counter(&self, counter: &CounterRef) {
        // Cheap (one pass over the regions) and the whole point of the table.
        assert!(
            self.check_counter(counter).is_ok(),
            "invariant 2 broken for {counter:?}"
        );
    }

    /// The window length of a strict limit, for callers that plan per window.
    pub fn window_of(&self, limit: &LimitId) -> Option<Window> {
        self.strict_quota(limit).ok().map(|q| q.window)
    }
}

/// The parameters a region's allocation is computed from differ: the quota (units or window),
/// the weights, the consistency mode or the partition policy. Grants and rows made under the
/// old ones do not hold under the new ones, on either side (`RegionBudget::set_limits`,
/// [`TableCommand::SetConfig`]).
pub fn allocation_changed(old: &LimitSpec, new: &LimitSpec) -> bool {
    old.quota != new.quota
        || old.weights != new.weights
        || old.consistency != new.consistency
        || old.partition_policy != new.partition_policy
        || old.enabled != new.enabled
}
