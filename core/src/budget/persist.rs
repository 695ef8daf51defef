//! Persistence hooks: what the agent writes to its store before answering, and how a region
//! comes back from it.
//!
//! Every mutation marks what it touched; `drain_dirty` turns the marks into records holding
//! the current state of each touched item (or a tombstone when it is gone). Applying drained
//! batches in order, or a `snapshot`, through `restore` rebuilds the same durable state.
//! Soft state is not persisted: the remote view and escalation come back with the next sync,
//! and statistics restart. A key's excess over its allowance (settle overage, fail-open) is
//! durable: a restarted region is above its allowance by exactly what it was before.
//!
//! Each record names one store key: `Meta`; `Key`/`KeyEvicted` by (limit, key); `Lease`/
//! `LeaseEnded` by lease id; `Slot`/`SlotEnded` by slot id; `ReleaseAck`/`ReleaseForgotten` by
//! request id; `Idempotency`/`IdempotencyUnfingerprinted`/`IdempotencyExpired` by request id; `Stats`/`StatsForgotten` by
//! (limit, window); `Allocation` by limit; `RestoredBefore` and `RestoreAwaiting` alone (one
//! store key); `ConfigVersion` and `Boot` alone. `Reset` clears everything but `Meta`; `LimitRemoved`
//! clears a limit's keys, leases, slots, stats and allocation.
//!
//! A limit's `Allocation` record holds the parameters its grants were made under. A region
//! started with a configuration whose parameters differ (a reload reached it, or happened,
//! while it was down) drops those grants as a live reload would (`RegionBudget::set_limits`),
//! or forgets the limit's keys if the window length changed.

use std::collections::BTreeMap;
use std::mem;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::idempotency::IdempotencyEntry;
use super::key::{EpochRule, KeyState, WindowAllowance};
use super::lease::Lease;
use super::limits::LimitState;
use super::restore::Restore;
use super::shared::{Dirty, DirtySet, KeyRef};
use super::slots::SlotHome;
use super::stats::{LimitStats, WindowStats};
use super::sync::AckEntry;
use super::timebase::ClockCorrection;
use super::{BudgetConfig, Outcome, RegionBudget, RequestFingerprint};
use crate::algo::concurrency::{HeldSlot, SlotId};
use crate::algo::gcra::GcraState;
use crate::error::Result;
use crate::ids::{Epoch, KeyId, LeaseId, LimitId, RequestId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota, RegionWeights};
use crate::sync::{BoundFigures, ReleaseAck};
use crate::time::{Timestamp, Window, WindowIndex};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PersistRecord {
    /// Forget every key, lease, slot, ack and idempotency entry (a full snapshot follows).
    Reset,
    Meta(MetaRecord),
    LimitRemoved {
        limit: LimitId,
    },
    Key(KeyRecord),
    KeyEvicted {
        limit: LimitId,
        key: KeyId,
    },
    Lease(LeaseRecord),
    LeaseEnded {
        lease: LeaseId,
    },
    Slot(SlotRecord),
    SlotEnded {
        slot: SlotId,
    },
    ReleaseAck(AckRecord),
    ReleaseForgotten {
        id: u64,
    },
    /// An idempotency entry as stores written before entries kept their request's
    /// fingerprint hold it: read (it replays on the call kind alone, as it did then), and
    /// written again only for such an entry. Its place and name stay, so those stores read
    /// unchanged.
    #[serde(rename = "Idempotency")]
    IdempotencyUnfingerprinted(UnfingerprintedIdempotencyRecord),
    IdempotencyExpired {
        request: RequestId,
    },
    /// The summed bound figures of one limit and window (the peak rate is not summed and
    /// restarts; the coordinator keeps its max).
    Stats(StatsRecord),
    StatsForgotten {
        limit: LimitId,
        window: WindowIndex,
    },
    /// The allocation parameters a limit's grants in the store were made under. Last, so that
    /// the layouts written before it existed still read (they hold none).
    Allocation(AllocationRecord),
    /// A restored start closed the windows that began before `before` (its start, on its
    /// clock): they stay closed across later restarts (docs/budget.md, "Restores").
    RestoredBefore {
        before: Timestamp,
    },
    /// The correction the timebase had measured (`budget::Timebase`, D22): a restart reads
    /// windows on the clock its counters were written on, not on the raw one, which may be
    /// windows behind (it would count again in windows it has left) or ahead.
    ClockCorrection(ClockCorrection),
    /// An idempotency entry with its request's fingerprint (what is written now). Last, so
    /// that the layouts written before it existed still read (they hold none).
    #[serde(rename = "FingerprintedIdempotency")]
    Idempotency(IdempotencyRecord),
    /// A key whose window's end band counted units against the next window too
    /// (`carry_units`, docs/budget.md, edge band): its next window starts at them. Written
    /// instead of `Key` while there are any, under the same store key. Last, so that the
    /// layouts written before it existed still read (they hold none).
    KeyCarried {
        key: KeyRecord,
        carry_units: u64,
    },
    /// A window's summed bound figures with units used and charged nowhere (settles clamped
    /// at their cap, gateways' admissions no lease held): a restart must still report them,
    /// or the coordinator would state the window bounded. Written instead of `Stats` while
    /// there are any, under the same store key. Last, so that the layouts written before it
    /// existed still read (they hold none).
    StatsUncharged {
        stats: StatsRecord,
        settle_clamped_units: u64,
        uncharged_units: u64,
    },
    /// A restored start still waiting for its boot's first answer (`started_at` on its clock;
    /// `declared` by the operator, else an empty store): a restart before that answer comes
    /// back from the restored copy, not from the region's own latest state, so it waits again
    /// and closes the same windows once answered. Replaced by `RestoredBefore` (under the same
    /// store key) when answered. Last, so that the layouts written before it existed still
    /// read (they hold none).
    RestoreAwaiting {
        started_at: Timestamp,
        declared: bool,
    },
    /// The configuration version in force when the state was written, which the grants in
    /// the store were made under: a start under a version that is neither it nor the next
    /// applies the skipped-version rule (`RegionBudget::set_config_version`), since the table
    /// may have dropped rows at a version the region never saw, even when the version it
    /// starts under has the same parameters as the stored one (swarm seed 3187824). Last, so
    /// that the layouts written before it existed still read (they hold none: no skip is
    /// seen at their first start). After a skip that no answer at the new version has yet
    /// followed it is the version before the skip, so a restart then skips again.
    ConfigVersion {
        version: u64,
    },
    /// The boot number of the start that wrote the state (`SyncUp::boot`): the next start
    /// takes a larger one even when the clock went back across the restart (an NTP step, a
    /// VM resumed from a snapshot), or the coordinator would drop every SyncUp of that start
    /// as older than the last it heard. Last, so that the layouts written before it existed
    /// still read (they hold none: the next boot is the clock's, as before).
    Boot {
        boot: u64,
    },
    /// The latest time a call had passed in when the batch was drained
    /// (`RegionBudget::time_floor`): written with every batch that carries a change, so that
    /// whatever the store holds was done by then. Last, so that the layouts written before
    /// it existed still read (they hold none: a restart reads its clock as it is).
    TimeSeen {
        at: Timestamp,
    },
}

/// A limit's parameters its allocation is computed from: what [`allocation_changed`]
/// compares, so that a start under different ones is told from one under the same.
///
/// [`allocation_changed`]: crate::rebalance::table::allocation_changed
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub limit: LimitId,
    pub quota: Quota,
    pub weights: RegionWeights,
    pub consistency: Consistency,
    pub partition_policy: PartitionPolicy,
    pub enabled: bool,
}

impl AllocationRecord {
    pub fn of(spec: &LimitSpec) -> Self {
        AllocationRecord {
            limit: spec.id.clone(),
            quota: spec.quota,
            weights: spec.weights.clone(),
            consistency: spec.consistency,
            partition_policy: spec.partition_policy,
            enabled: spec.enabled,
        }
    }

    fn window(&self) -> Option<Window> {
        match self.quota {
            Quota::Units { window, .. } => Some(window),
            Quota::Unlimited => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsRecord {
    pub limit: LimitId,
    pub window: WindowIndex,
    pub time_open: Duration,
    pub fail_open_units: u64,
    pub settle_overage_units: u64,
}

/// Counters of the region's own state that must never go back after a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRecord {
    pub next_lease_id: u64,
    pub next_slot_id: u64,
    pub next_seq: u64,
}

/// One key: its own counter entries (invariant 6), its explicit allowances (a restarted
/// region must not fall back to a default above what it was left with) and rate state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub limit: LimitId,
    pub key: KeyId,
    pub window: WindowIndex,
    pub granted_units: u64,
    pub refunded_units: u64,
    /// For `window` and pre-issued later windows.
    pub allowances: Vec<AllowanceRecord>,
    pub rate_tat: Option<Timestamp>,
    pub open_rate_tat: Option<Timestamp>,
    /// Units policy let in beyond the allowance in `window` (settle overage, fail-open,
    /// shadow): a restarted region may still be above its allowance by exactly these
    /// (invariant 1). Absent from records written before it was kept: 0.
    #[serde(default)]
    pub excess_units: u64,
    /// The fail-open part of `excess_units`: the open policy's budget for the window is
    /// spent by these, restart or not.
    #[serde(default)]
    pub fail_open_units: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowanceRecord {
    pub window: WindowIndex,
    pub allowance_units: u64,
    pub epoch: Epoch,
}

impl From<WindowAllowance> for AllowanceRecord {
    fn from(a: WindowAllowance) -> Self {
        AllowanceRecord {
            window: a.window,
            allowance_units: a.allowance_units,
            epoch: a.epoch,
        }
    }
}

impl From<AllowanceRecord> for WindowAllowance {
    fn from(a: AllowanceRecord) -> Self {
        WindowAllowance {
            window: a.window,
            allowance_units: a.allowance_units,
            epoch: a.epoch,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease: LeaseId,
    pub limit: LimitId,
    pub key: KeyId,
    pub window: WindowIndex,
    pub units: u64,
    pub expires_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub slot: SlotId,
    pub limit: LimitId,
    pub key: KeyId,
    pub expires_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRecord {
    pub ack: ReleaseAck,
    /// Not yet confirmed received by the coordinator: still to be sent.
    pub pending: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    pub request: RequestId,
    pub expires_at: Timestamp,
    pub outcome: Outcome,
    /// The request the outcome answered: the same id with another is refused.
    pub fingerprint: RequestFingerprint,
}

/// [`IdempotencyRecord`] as written before it kept its request's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnfingerprintedIdempotencyRecord {
    pub request: RequestId,
    pub expires_at: Timestamp,
    pub outcome: Outcome,
}

impl RegionBudget {
    /// Records for everything changed since the last drain. The agent writes them (in
    /// order) before it answers the call that caused them, and before sending a SyncUp.
    pub fn drain_dirty(&mut self) -> Vec<PersistRecord> {
        if self.dirty.take_overflow() {
            return self.snapshot();
        }
        let mut records: Vec<PersistRecord> = self
            .dirty
            .take()
            .into_iter()
            .map(|d| self.record_of(d))
            .collect();
        // Idempotency entries go out in expiry order, so a restore keeps its ring in order.
        records.sort_by_key(idempotency_order);
        if !records.is_empty() && self.time_seen > self.time_seen_written {
            self.time_seen_written = self.time_seen;
            records.push(PersistRecord::TimeSeen { at: self.time_seen });
        }
        records
    }

    /// Forgets what changed since the last drain without turning it into records, leaving the
    /// tracker as [`RegionBudget::drain_dirty`] would: for a driver that keeps no store (a
    /// simulated region the run never restarts).
    pub fn discard_dirty(&mut self) {
        self.dirty.clear();
    }

    /// The whole durable state, behind a `Reset`.
    pub fn snapshot(&self) -> Vec<PersistRecord> {
        let mut out = vec![PersistRecord::Reset, PersistRecord::Meta(self.meta())];
        for lim in self.limits.values() {
            out.push(PersistRecord::Allocation(AllocationRecord::of(
                &lim.params.spec,
            )));
        }
        match self.restore_record() {
            // Closes nothing: the same as no record.
            PersistRecord::RestoredBefore {
                before: Timestamp::ZERO,
            } => {}
            r => out.push(r),
        }
        if let Some(c) = self.view.clock_correction() {
            out.push(PersistRecord::ClockCorrection(c));
        }
        if self.config_version != 0 {
            out.push(PersistRecord::ConfigVersion {
                version: self.stored_config_version(),
            });
        }
        let boot = self.boot_to_keep();
        if boot != 0 {
            out.push(PersistRecord::Boot { boot });
        }
        if self.time_seen != Timestamp::ZERO {
            out.push(PersistRecord::TimeSeen { at: self.time_seen });
        }
        for lim in self.limits.values() {
            for (name, ks) in &lim.keys {
                out.push(key_persist_record(lim, name, ks));
            }
        }
        for (id, lease) in self.leases.iter() {
            out.push(PersistRecord::Lease(lease_record(*id, lease)));
        }
        for (id, home) in self.slots.iter() {
            out.push(PersistRecord::Slot(slot_record(*id, home)));
        }
        for e in self.sync.acks.iter() {
            out.push(PersistRecord::ReleaseAck(ack_record(e)));
        }
        for lim in self.limits.values() {
            for (window, w) in lim.stats.windows().filter(|(_, w)| w.saved) {
                out.push(stats_record(lim.id(), window, w));
            }
        }
        for (id, e) in self.idempotency.iter() {
            out.push(idempotency_record(id, e));
        }
        out.sort_by_key(idempotency_order);
        out
    }

    /// A region rebuilt from persisted records (drained batches in order, snapshots, or
    /// both). Records of limits no longer configured are skipped. Own counters the
    /// coordinator resends are merged by max on top (`handle_sync_down`), so a restarted
    /// region never sees less than it admitted. A limit whose stored allocation parameters
    /// differ from `limits`' loses its grants, or its keys, as a reload to `limits` would.
    pub fn restore(
        cfg: BudgetConfig,
        limits: impl IntoIterator<Item = LimitSpec>,
        records: impl IntoIterator<Item = PersistRecord>,
    ) -> Result<Self> {
        let mut b = RegionBudget::new(cfg, limits)?;
        let mut stored = BTreeMap::new();
        for r in records {
            match &r {
                PersistRecord::Allocation(a) => {
                    stored.insert(a.limit.clone(), a.clone());
                    continue;
                }
                PersistRecord::LimitRemoved { limit } => {
                    stored.remove(limit);
                }
                PersistRecord::Reset => stored.clear(),
                _ => {}
            }
            b.apply_record(r);
        }
        b.rebuild_indexes();
        // Restoring is not a change: nothing needs writing back, but what the configuration
        // now in force changed.
        b.dirty = DirtySet::default();
        b.reconcile_allocations(&stored);
        Ok(b)
    }

    /// Limits whose stored allocation differs from the configuration in force: drop their
    /// grants (the window length kept) or forget their keys (it changed), as `set_limits`
    /// does on a live reload, so the region enforces what the table expects of it under the
    /// new configuration. A limit with no stored allocation (a store written before it was
    /// kept, or a limit new to this start) keeps what it stored; its record is written now.
    fn reconcile_allocations(&mut self, stored: &BTreeMap<LimitId, AllocationRecord>) {
        let mut limits = mem::take(&mut self.limits);
        for (id, lim) in &mut limits {
            let now_in_force = AllocationRecord::of(&lim.params.spec);
            match stored.get(id) {
                Some(a) if *a == now_in_force => continue,
                Some(a) if a.window() != now_in_force.window() => {
                    lim.keys.clear();
                    lim.stats = LimitStats::default();
                    self.forget_limit(id);
                }
                Some(_) => self.drop_grants(id, lim),
                None => {}
            }
            self.dirty.mark(Dirty::Allocation(id.clone()));
        }
        self.limits = limits;
    }

    /// The boot the store keeps: the stored one until this start takes its own
    /// (`set_boot_clock`), never less.
    fn boot_to_keep(&self) -> u64 {
        self.sync.boot.max(self.sync.stored_boot)
    }

    fn meta(&self) -> MetaRecord {
        MetaRecord {
            next_lease_id: self.leases.ids.durable_next_id(self.leases.next_id),
            next_slot_id: self.slots.ids.durable_next_id(self.slots.next_id),
            next_seq: self.sync.next_seq,
        }
    }

    /// What the store keeps of a restore: its wait, or its closing. A closing at zero closes
    /// nothing (a normal start, or one the coordinator did not know, which replaces its wait).
    fn restore_record(&self) -> PersistRecord {
        match self.view.restore {
            Restore::Awaiting {
                started_at,
                declared,
            } => PersistRecord::RestoreAwaiting {
                started_at,
                declared,
            },
            Restore::Normal => PersistRecord::RestoredBefore {
                before: Timestamp::ZERO,
            },
            Restore::Closed { before } => PersistRecord::RestoredBefore { before },
        }
    }

    fn record_of(&self, d: Dirty) -> PersistRecord {
        match d {
            Dirty::Meta => PersistRecord::Meta(self.meta()),
            Dirty::Restore => self.restore_record(),
            // Marked only once a correction was set.
            Dirty::Clock => PersistRecord::ClockCorrection(self.view.clock_correction().unwrap_or(
                ClockCorrection {
                    correction_nanos: 0,
                    slowed_from: None,
                },
            )),
            Dirty::ConfigVersion => PersistRecord::ConfigVersion {
                version: self.stored_config_version(),
            },
            Dirty::Boot => PersistRecord::Boot {
                boot: self.boot_to_keep(),
            },
            Dirty::Limit(limit) => PersistRecord::LimitRemoved { limit },
            Dirty::Allocation(limit) => match self.limits.get(&limit) {
                Some(lim) => PersistRecord::Allocation(AllocationRecord::of(&lim.params.spec)),
                // Gone: its removal, written with it, took its record.
                None => PersistRecord::LimitRemoved { limit },
            },
            Dirty::Key(limit, key) => {
                let found = self
                    .limits
                    .get(&limit)
                    .and_then(|l| l.keys.get_key_value(key.as_str()).map(|kv| (l, kv)));
                match found {
                    Some((lim, (name, ks))) => key_persist_record(lim, name, ks),
                    None => PersistRecord::KeyEvicted { limit, key },
                }
            }
            Dirty::Lease(id) => match self.leases.get(id) {
                Some(l) => PersistRecord::Lease(lease_record(id, l)),
                None => PersistRecord::LeaseEnded { lease: id },
            },
            Dirty::Slot(id) => match self.slots.get(id) {
                Some(h) => PersistRecord::Slot(slot_record(id, h)),
                None => PersistRecord::SlotEnded { slot: id },
            },
            Dirty::Ack(id) => match self.sync.acks.get(id) {
                Some(e) => PersistRecord::ReleaseAck(ack_record(e)),
                None => PersistRecord::ReleaseForgotten { id },
            },
            Dirty::Idempotency(id) => match self.idempotency.entry(id) {
                Some(e) => idempotency_record(id, e),
                None => PersistRecord::IdempotencyExpired { request: id },
            },
            Dirty::Stats(limit, window) => {
                let kept = self
                    .limits
                    .get(&limit)
                    .and_then(|l| l.stats.window(window).map(|w| (l, w)));
                match kept {
                    Some((lim, w)) => stats_record(lim.id(), window, w),
                    None => PersistRecord::StatsForgotten { limit, window },
                }
            }
        }
    }

    fn apply_record(&mut self, r: PersistRecord) {
        match r {
            PersistRecord::Reset => {
                for lim in self.limits.values_mut() {
                    lim.keys.clear();
                }
                self.leases.clear();
                self.slots.clear();
                self.sync.acks.clear();
                self.idempotency.clear();
            }
            PersistRecord::Meta(m) => {
                self.leases.next_id = self.leases.next_id.max(m.next_lease_id);
                self.slots.next_id = self.slots.next_id.max(m.next_slot_id);
                self.sync.next_seq = self.sync.next_seq.max(m.next_seq);
            }
            PersistRecord::LimitRemoved { limit } => {
                if let Some(lim) = self.limits.get_mut(&limit) {
                    lim.keys.clear();
                    lim.stats = LimitStats::default();
                }
                self.leases.remove_limit(&limit);
                self.slots.remove_limit(&limit);
            }
            PersistRecord::Key(rec) => self.restore_key(rec),
            PersistRecord::KeyCarried { key, carry_units } => {
                self.restore_carry(&key, carry_units);
                self.restore_key(key);
            }
            PersistRecord::KeyEvicted { limit, key } => {
                if let Some(lim) = self.limits.get_mut(&limit) {
                    lim.keys.remove(key.as_str());
                }
            }
            PersistRecord::Lease(l) => {
                let lease = Lease {
                    limit: l.limit,
                    key: l.key,
                    window: l.window,
                    units: l.units,
                    expires_at: l.expires_at,
                    spend: None,
                    overage_units: 0,
                };
                self.leases.insert(l.lease, lease);
            }
            PersistRecord::LeaseEnded { lease } => {
                self.leases.remove(lease);
            }
            PersistRecord::Slot(s) => {
                let home = SlotHome {
                    limit: s.limit,
                    key: s.key,
                    expires_at: s.expires_at,
                };
                self.slots.insert(s.slot, home);
            }
            PersistRecord::SlotEnded { slot } => {
                self.slots.remove(slot);
            }
            PersistRecord::ReleaseAck(a) => {
                self.sync.acks.insert(AckEntry {
                    ack: a.ack,
                    pending: a.pending,
                });
            }
            PersistRecord::ReleaseForgotten { id } => self.sync.acks.remove(id),
            PersistRecord::Idempotency(i) => {
                let entry = IdempotencyEntry {
                    expires_at: i.expires_at,
                    outcome: i.outcome,
                    fingerprint: Some(i.fingerprint),
                };
                self.idempotency.restore(i.request, entry);
            }
            PersistRecord::IdempotencyUnfingerprinted(i) => {
                let entry = IdempotencyEntry {
                    expires_at: i.expires_at,
                    outcome: i.outcome,
                    fingerprint: None,
                };
                self.idempotency.restore(i.request, entry);
            }
            PersistRecord::IdempotencyExpired { request } => self.idempotency.remove(request),
            PersistRecord::Stats(r) => self.restore_stats(r, 0, 0),
            PersistRecord::StatsUncharged {
                stats,
                settle_clamped_units,
                uncharged_units,
            } => self.restore_stats(stats, settle_clamped_units, uncharged_units),
            PersistRecord::StatsForgotten { limit, window } => {
                if let Some(lim) = self.limits.get_mut(&limit) {
                    lim.stats.forget(window);
                }
            }
            // Compared with the configuration in force once every record is in (`restore`).
            PersistRecord::Allocation(_) => {}
            PersistRecord::RestoredBefore { before } => self.view.restore.keep_closed(before),
            PersistRecord::RestoreAwaiting {
                started_at,
                declared,
            } => self.view.restore.keep_awaiting(started_at, declared),
            PersistRecord::ClockCorrection(c) => {
                self.view.set_clock_correction(c);
            }
            // The version the caller then sets is compared with it (`set_config_version`).
            PersistRecord::ConfigVersion { version } => self.config_version = version,
            // The boot this start takes is larger (`RegionBudget::set_boot_clock`).
            PersistRecord::Boot { boot } => {
                self.sync.stored_boot = self.sync.stored_boot.max(boot);
            }
            PersistRecord::TimeSeen { at } => {
                self.time_seen = self.time_seen.max(at);
                self.time_seen_written = self.time_seen;
            }
        }
    }

    /// A window's summed bound figures, merged by max (they only grow).
    fn restore_stats(&mut self, r: StatsRecord, settle_clamped_units: u64, uncharged_units: u64) {
        if let Some(lim) = self.limits.get_mut(&r.limit) {
            let figures = BoundFigures {
                time_open: r.time_open,
                fail_open_units: r.fail_open_units,
                settle_overage_units: r.settle_overage_units,
                peak_grant_units_per_sec: 0,
                settle_clamped_units,
                uncharged_units,
            };
            lim.stats.restore(r.window, figures);
        }
    }

    /// The key a record of `rec.window` merges into: created, or reset if it holds an older
    /// window; `None` if it holds a later one (the record is stale) or the limit is gone.
    fn key_of_record(&mut self, rec: &KeyRecord) -> Option<&mut KeyState> {
        let lim = self.limits.get_mut(&rec.limit)?;
        let ks = lim
            .keys
            .entry(rec.key.as_str().into())
            .or_insert_with(|| KeyState::new(rec.window));
        if rec.window > ks.window {
            *ks = KeyState::new(rec.window);
        }
        (rec.window == ks.window).then_some(ks)
    }

    /// What a key's end band carried into its next window, merged by max like its entries
    /// (it only grows within a window); before the record itself, which creates the key.
    fn restore_carry(&mut self, rec: &KeyRecord, carry_units: u64) {
        if let Some(ks) = self.key_of_record(rec) {
            let hot = ks.hot_mut();
            hot.carry_units = hot.carry_units.max(carry_units);
        }
    }

    /// A key record replaces an older window's state and merges into the same window's by
    /// max (entries are monotone); allowances apply by epoch.
    fn restore_key(&mut self, rec: KeyRecord) {
        let Some(ks) = self.key_of_record(&rec) else {
            return;
        };
        ks.granted_units = ks.granted_units.max(rec.granted_units);
        ks.refunded_units = ks.refunded_units.max(rec.refunded_units);
        let window = ks.window;
        if let Some(hot) = ks.hot.as_mut() {
            // Records come in the order they were written: this one holds the key's grants as
            // they are now, so a grant an earlier one held and a reload dropped stays dropped.
            hot.allowance = None;
            hot.future.clear();
        }
        for a in rec.allowances {
            ks.hot_mut()
                .apply_allowance(window, a.into(), EpochRule::SameToo);
        }
        if let Some(t) = rec.rate_tat {
            ks.hot_mut().rate = Some(GcraState::from_tat(t));
        }
        if let Some(t) = rec.open_rate_tat {
            ks.hot_mut().open_rate = Some(GcraState::from_tat(t));
        }
        // Like the entries, these only grow within a window: merged by max.
        if rec.excess_units > 0 || rec.fail_open_units > 0 {
            let hot = ks.hot_mut();
            hot.excess_units = hot.excess_units.max(rec.excess_units);
            hot.fail_open_units = hot.fail_open_units.max(rec.fail_open_units);
        }
    }

    /// Per-key lease lists and slot sets, and the set of reported keys, from the tables.
    fn rebuild_indexes(&mut self) {
        let mut orphans = Vec::new();
        for (id, lease) in self.leases.iter() {
            let ks = self
                .limits
                .get_mut(&lease.limit)
                .and_then(|l| l.keys.get_mut(lease.key.as_str()))
                .filter(|ks| ks.window == lease.window);
            match ks {
                Some(ks) => ks.hot_mut().leases.push(*id),
                None => orphans.push(*id),
            }
        }
        for id in orphans {
            // Its key's window was already over when the state was written: spent.
            self.leases.remove(id);
        }
        let mut orphans = Vec::new();
        for (id, home) in self.slots.iter() {
            let ks = self
                .limits
                .get_mut(&home.limit)
                .and_then(|l| l.keys.get_mut(home.key.as_str()));
            match ks {
                Some(ks) => ks.hot_mut().slots.restore(HeldSlot {
                    id: *id,
                    expires_at: home.expires_at,
                }),
                None => orphans.push(*id),
            }
        }
        for id in orphans {
            self.slots.remove(id);
        }
        for (limit, lim) in &mut self.limits {
            for (name, ks) in &mut lim.keys {
                let Some(hot) = ks.hot.as_mut() else { continue };
                if hot.allowance.is_some() {
                    // The coordinator granted or released here: it follows this counter.
                    hot.mentioned = true;
                    self.sync.report(KeyRef {
                        limit: limit.clone(),
                        key: KeyId::new(name.as_ref()),
                    });
                }
            }
        }
    }
}

/// Sort key keeping every record in place except idempotency entries, which sort among
/// themselves by expiry then id (tombstones first). The sort is stable and idempotency
/// records always come last.
fn idempotency_order(r: &PersistRecord) -> (bool, Timestamp, RequestId) {
    match r {
        PersistRecord::Idempotency(i) => (true, i.expires_at, i.request),
        PersistRecord::IdempotencyUnfingerprinted(i) => (true, i.expires_at, i.request),
        PersistRecord::IdempotencyExpired { request } => (true, Timestamp::ZERO, *request),
        _ => (false, Timestamp::ZERO, RequestId(0)),
    }
}

/// A key's record: `KeyCarried` while its end band has carried units into the next window.
fn key_persist_record(lim: &LimitState, name: &str, ks: &KeyState) -> PersistRecord {
    let key = key_record(lim, name, ks);
    match ks.hot.as_deref().map_or(0, |h| h.carry_units) {
        0 => PersistRecord::Key(key),
        carry_units => PersistRecord::KeyCarried { key, carry_units },
    }
}

fn key_record(lim: &LimitState, name: &str, ks: &KeyState) -> KeyRecord {
    let hot = ks.hot.as_deref();
    let current = hot.and_then(|h| {
        h.allowance.map(|units| AllowanceRecord {
            window: ks.window,
            allowance_units: units,
            epoch: h.epoch,
        })
    });
    let future = hot
        .into_iter()
        .flat_map(|h| h.future.iter().copied().map(AllowanceRecord::from));
    KeyRecord {
        limit: lim.id().clone(),
        key: KeyId::new(name),
        window: ks.window,
        granted_units: ks.granted_units,
        refunded_units: ks.refunded_units,
        allowances: current.into_iter().chain(future).collect(),
        rate_tat: hot.and_then(|h| h.rate).map(|s| s.tat()),
        open_rate_tat: hot.and_then(|h| h.open_rate).map(|s| s.tat()),
        excess_units: hot.map_or(0, |h| h.excess_units),
        fail_open_units: hot.map_or(0, |h| h.fail_open_units),
    }
}

/// A window's summed figures: `StatsUncharged` while it has uncharged units, else `Stats`.
fn stats_record(limit: &LimitId, window: WindowIndex, w: &WindowStats) -> PersistRecord {
    let stats = StatsRecord {
        limit: limit.clone(),
        window,
        time_open: w.time_open,
        fail_open_units: w.fail_open_units,
        settle_overage_units: w.settle_overage_units,
    };
    if w.settle_clamped_units == 0 && w.uncharged_units == 0 {
        return PersistRecord::Stats(stats);
    }
    PersistRecord::StatsUncharged {
        stats,
        settle_clamped_units: w.settle_clamped_units,
        uncharged_units: w.uncharged_units,
    }
}

fn lease_record(id: LeaseId, l: &Lease) -> LeaseRecord {
    LeaseRecord {
        lease: id,
        limit: l.limit.clone(),
        key: l.key.clone(),
        window: l.window,
        units: l.units,
        expires_at: l.expires_at,
    }
}

fn slot_record(id: SlotId, h: &SlotHome) -> SlotRecord {
    SlotRecord {
        slot: id,
        limit: h.limit.clone(),
        key: h.key.clone(),
        expires_at: h.expires_at,
    }
}

fn ack_record(e: &AckEntry) -> AckRecord {
    AckRecord {
        ack: e.ack.clone(),
        pending: e.pending,
    }
}

fn idempotency_record(id: RequestId, e: &IdempotencyEntry) -> PersistRecord {
    match e.fingerprint {
        Some(fingerprint) => PersistRecord::Idempotency(IdempotencyRecord {
            request: id,
            expires_at: e.expires_at,
            outcome: e.outcome.clone(),
            fingerprint,
        }),
        None => PersistRecord::IdempotencyUnfingerprinted(UnfingerprintedIdempotencyRecord {
            request: id,
            expires_at: e.expires_at,
            outcome: e.outcome.clone(),
        }),
    }
}
