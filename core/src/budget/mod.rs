//! The regional budget state machine: what an agent runs.
//!
//! [`RegionBudget`] holds a region's allowances and counters for every (limit, key, window),
//! answers gateways (acquire, lease, renew, release, settle, concurrency slots) from them with
//! no network hop, and exchanges counter entries, demand, grants and release requests with the
//! coordinator. It is deterministic and does no IO, in the style of quinn-proto: time comes in
//! as `now`, inputs go in through `handle_*` and the gateway calls, outputs come out of
//! `poll_transmit` (the next SyncUp), `poll_timeout` (when to call `handle_timeout`) and
//! `drain_dirty` (what the agent must write to disk before answering).
//!
//! Map:
//! - [`config`]: [`BudgetConfig`] and the fixed bounds.
//! - [`api`]: gateway requests and outcomes.
//! - `admit`: the allowance in force, admission, escalation (shared by acquire and lease).
//! - `key`: compact per-key state; `limits`: per-limit state, key map, eviction.
//! - `lease`, `slots`: leases (reserve, renew, release, settle) and concurrency slots.
//! - `idempotency`: request-id cache; `view`: contact with the coordinator, clock sample.
//! - `sync`: producing SyncUps, applying SyncDowns; `timeout`: timers, expiry, sweeps.
//! - [`persist`]: records for the agent's store, snapshot and restore.
//! - [`stats`]: per-limit, per-window measurements for the bound.
//! - [`inspect`]: read-only views of a key, for operators.
//!
//! The rules themselves are written up in `docs/budget.md`.

mod admit;
pub mod api;
pub mod config;
mod fallback;
mod idempotency;
pub mod inspect;
mod key;
mod lease;
mod limits;
pub mod persist;
mod restore;
mod shared;
mod sliding;
mod slots;
pub mod stats;
mod sync;
pub mod timebase;
mod timeout;
mod view;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

pub use api::{
    AcquireRequest, Decision, LeaseGrant, LeaseOutcome, LeaseRequest, LeaseReturn, Outcome, Reason,
    ReleaseOutcome, RenewOutcome, RequestFingerprint, ReservationDelta, ReturnedLease,
    SettleOutcome, SlotOutcome,
};
pub use config::BudgetConfig;
pub use fallback::{FallbackCharge, MAX_FALLBACK_KEYS};
pub use persist::PersistRecord;
pub use restore::RestoreStart;
pub use stats::{LimitStats, RegionStats, WindowStats};
pub use timebase::{ClockCorrection, ClockGuard, Timebase};

use admit::{Ctx, Want};
use api::Remembered;
use idempotency::IdempotencyCache;
use idempotency::Reserved;
use lease::LeaseTable;
use limits::{LimitParams, LimitState};
use shared::{Dirty, DirtySet, KeyRef};
use slots::SlotTable;
use sync::SyncState;
use view::View;

use crate::error::{Error, Result};
use crate::ids::{KeyId, LeaseId, LimitId, RegionId, RequestId};
use crate::limit::LimitSpec;
use crate::rebalance::table::allocation_changed;
use crate::sync::{ClockSample, CounterRef};
use crate::time::{Timestamp, WindowIndex};

/// One region's budget: allowances, counters, leases and slots for every limit it enforces.
#[derive(Debug)]
pub struct RegionBudget {
    cfg: BudgetConfig,
    limits: BTreeMap<LimitId, LimitState>,
    leases: LeaseTable,
    slots: SlotTable,
    idempotency: IdempotencyCache,
    view: View,
    sync: SyncState,
    dirty: DirtySet,
    stats: RegionStats,
    /// Version of the limits configuration in force, reported in every SyncUp.
    config_version: u64,
    /// The coordinator's configuration version, as of its last message.
    coordinator_config_version: Option<u64>,
    /// Latest `now` seen by `handle_timeout`, so past deadlines are not asked for again.
    last_timeout: Timestamp,
    /// The latest time any call passed in, and the latest of it a drained batch carried
    /// (`PersistRecord::TimeSeen`): a restart reads on from it ([`RegionBudget::time_floor`]).
    time_seen: Timestamp,
    time_seen_written: Timestamp,
    /// Gateways' fallback admissions charged against their rules' allowances (D69).
    fallback: fallback::FallbackTally,
}

/// A key's own counter entries, as the region holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterState {
    pub window: WindowIndex,
    pub granted_units: u64,
    pub refunded_units: u64,
}

impl CounterState {
    pub fn net_units(&self) -> u64 {
        self.granted_units.saturating_sub(self.refunded_units)
    }
}

/// One key as [`RegionBudget::key_accounts`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyAccount {
    /// The key's counter, for the window it was last used in.
    pub counter: CounterRef,
    pub granted_units: u64,
    pub refunded_units: u64,
    /// `a_r` for that window as the region enforces it now (for an eventual limit in view
    /// mode it falls as the others' use grows, so it may end below what was admitted).
    pub allowance_units: u64,
    /// Units policy let in beyond the allowance in that window (settle overage, fail-open,
    /// shadow).
    pub excess_units: u64,
    /// A restored start closed that window (docs/budget.md, "Restores"): nothing more is
    /// admitted in it, and its use may be above `allowance_units` by what the lost copy of the
    /// state admitted, which the coordinator sent back.
    pub restore_closed: bool,
    /// A restored start awaits its boot's first answer: it admits nothing from its
    /// allowances, and states `allowance_units` at its own count of use, the old copy's,
    /// which may include units the lost copy refunded after the copy was taken.
    pub restore_awaiting: bool,
    /// Units the end band admitted in that window that also count in the next one
    /// (docs/budget.md, edge band): the next window's counter starts at them.
    pub carry_units: u64,
}

/// The range of a restored start's boot salt (`RegionBudget::salt_restored_boot`): 2^30
/// nanoseconds, about a second of boot numbers, so that two restores from one copy collide
/// about once in a billion.
pub const BOOT_SALT_NANOS: u64 = 1 << 30;

impl RegionBudget {
    pub fn new(cfg: BudgetConfig, limits: impl IntoIterator<Item = LimitSpec>) -> Result<Self> {
        cfg.validate()?;
        let limits = limits
            .into_iter()
            .map(|spec| {
                let params = LimitParams::new(spec, &cfg);
                (params.spec.id.clone(), LimitState::new(params))
            })
            .collect();
        let mut b = RegionBudget {
            idempotency: IdempotencyCache::new(cfg.idempotency_capacity, cfg.idempotency_ttl),
            view: View::new(cfg.view_ttl),
            cfg,
            limits,
            leases: LeaseTable::default(),
            slots: SlotTable::default(),
            sync: SyncState::default(),
            dirty: DirtySet::default(),
            stats: RegionStats::default(),
            config_version: 0,
            coordinator_config_version: None,
            last_timeout: Timestamp::ZERO,
            time_seen: Timestamp::ZERO,
            time_seen_written: Timestamp::ZERO,
            fallback: fallback::FallbackTally::default(),
        };
        // The parameters every limit starts under, so a start under others can tell.
        let ids: Vec<LimitId> = b.limits.keys().cloned().collect();
        for id in ids {
            b.dirty.mark(Dirty::Allocation(id));
        }
        Ok(b)
    }

    /// Configuration reload. Limits that still exist keep their keys (unless their window
    /// length changed: then the old counters count for different windows and are dropped);
    /// removed limits lose their keys, leases and slots. A limit whose allocation changed
    /// ([`allocation_changed`]: quota, weights, consistency, partition policy) keeps its
    /// counters, since those units were admitted, but drops what the coordinator gave under
    /// the old parameters (explicit and pre-issued allowances, release acks not yet taken):
    /// it enforces its default under the new ones until granted again. Epochs are kept, so
    /// they never go back and later grants still apply (docs/budget.md, reload). The new
    /// parameters are persisted with the grants: a region that restarts under parameters
    /// other than the stored ones drops its grants the same way (`restore`).
    pub fn set_limits(&mut self, now: Timestamp, limits: impl IntoIterator<Item = LimitSpec>) {
        self.saw_time(now);
        self.account_open_time(now);
        let mut old = std::mem::take(&mut self.limits);
        for spec in limits {
            let mut params = LimitParams::new(spec, &self.cfg);
            let id = params.spec.id.clone();
            let state = match old.remove(&id) {
                Some(mut s) if s.params.quota.map(|q| q.1) == params.quota.map(|q| q.1) => {
                    let changed = allocation_changed(&s.params.spec, &params.spec);
                    // Under a fixed window a cold key forgets its window before when it
                    // rolls: a switch to the sliding one starts counting again (D54). An
                    // eventual sliding window also takes a key unreported in the window
                    // before as counted by the others at its default share there (D83),
                    // which a change of weights or consistency leaves unknown.
                    let same_shares = !params.is_eventual() || !changed;
                    if s.params.spec.algorithm == params.spec.algorithm && same_shares {
                        params.prev_known_from = s.params.prev_known_from;
                    }
                    s.params = params;
                    if changed {
                        self.drop_grants(&id, &mut s);
                    }
                    s
                }
                Some(_) => {
                    self.forget_limit(&id);
                    LimitState::new(params)
                }
                None => LimitState::new(params),
            };
            self.dirty.mark(Dirty::Allocation(id.clone()));
            self.limits.insert(id, state);
        }
        for id in old.into_keys() {
            self.forget_limit(&id);
        }
        self.refit_fallback_tallies();
    }

    /// Forget what the coordinator gave a limit's keys under parameters that changed; keep
    /// counters and epochs (a grant made under the new ones has a larger epoch).
    fn drop_grants(&mut self, id: &LimitId, lim: &mut LimitState) {
        for (name, ks) in lim.keys.iter_mut() {
            let Some(hot) = ks.hot.as_mut() else { continue };
            if hot.allowance.is_none() && hot.future.is_empty() {
                continue;
            }
            hot.allowance = None;
            hot.future.clear();
            self.dirty
                .mark(Dirty::Key(id.clone(), KeyId::new(name.as_ref())));
        }
        let stale: Vec<u64> = self
            .sync
            .acks
            .iter()
            .filter(|e| e.pending && &e.ack.counter.limit == id)
            .map(|e| e.ack.id)
            .collect();
        for ack in stale {
            self.sync.acks.remove(ack);
            self.dirty.mark(Dirty::Ack(ack));
        }
    }

    /// Dates this start's boot number ([`SyncUp::boot`]) at `local`, the region's own clock,
    /// uncorrected. Call it once, right after building the machine. The coordinator takes a
    /// larger boot for a restart and drops a smaller one's messages as old, so boots must grow
    /// from one start to the next: the own clock does, where a corrected one need not (a
    /// restored start reads its own clock until its first sample, behind the correction the
    /// lost copy ran on when the region is behind, and its messages were dropped as old).
    ///
    /// It is kept with the state (`PersistRecord::Boot`), and the next start takes one larger
    /// than it whatever its clock reads: a clock stepped back across a restart gave a smaller
    /// boot, and the coordinator dropped every SyncUp of that start as old.
    pub fn set_boot_clock(&mut self, local: Timestamp) {
        self.sync.boot = local
            .as_unix_nanos()
            .max(self.sync.stored_boot.saturating_add(1))
            .max(1);
        self.dirty.mark(Dirty::Boot);
    }

    /// A start that may have lost state (`start_restored`) adds `salt` (taken below
    /// [`BOOT_SALT_NANOS`]) to its boot. Its copy's boot plus one is all it knows to be above,
    /// and its clock may read below that (stepped back): two restores from one copy then took
    /// the same boot, and the leader took the second for late messages of the first (it was
    /// never heard as a restart, so it got no reach and no grants again). Random low bits make
    /// them differ; which is larger does not matter, since a boot that says `restored` is a
    /// restart whatever its number (`RegionView::is_later_boot` on the leader's side).
    pub fn salt_restored_boot(&mut self, salt: u64) {
        debug_assert!(self.sync.boot > 0, "salted after set_boot_clock");
        self.sync.boot = self.sync.boot.saturating_add(salt % BOOT_SALT_NANOS);
        self.dirty.mark(Dirty::Boot);
    }

    /// Every call that takes the time passes it here: what the region did, it did by then.
    fn saw_time(&mut self, now: Timestamp) {
        self.time_seen = self.time_seen.max(now);
    }

    /// The latest time the state was written at, as restored (zero for a new machine): the
    /// clock a restart reads must not be earlier. Its counters, pruned windows, expired
    /// leases and statistics are all of that time, so a clock stepped back across the
    /// restart (an NTP step, a VM resumed from a snapshot) would take the region back into
    /// windows whose counters it has dropped, and it would admit their allowances again.
    /// The driver's clock reads on from it (`Timebase::restarted`; `Agent::now` and the
    /// simulator's region hold at it without a timebase).
    pub fn time_floor(&self) -> Timestamp {
        self.time_seen
    }

    /// This start, at `now`, may have lost what an earlier copy of the state admitted
    /// (docs/budget.md, "Restores"): the operator declared a restore, or the store was empty.
    /// Call it once, right after building the machine and before any admission.
    ///
    /// Lease and slot ids restart from a floor taken from the clock: the lost copy handed out
    /// ids past what this store recorded, and gateways still hold leases under them, so an id
    /// reused here would let a release or settle of a lost lease end a new one.
    ///
    /// The windows it closes are those that begin before `now` plus `max_edge_band`: the lost
    /// copy's end band may have counted units against the window after its last (docs/budget.md,
    /// edge band).
    pub fn start_restored(&mut self, now: Timestamp, why: RestoreStart) {
        self.saw_time(now);
        let floor = restore::id_floor(now);
        self.leases.next_id = self.leases.next_id.max(floor);
        self.slots.next_id = self.slots.next_id.max(floor);
        let start = now + self.cfg.max_edge_band.unwrap_or_default();
        self.view.restore = restore::Restore::start(start, why, self.cfg.coordinated);
        // Persisted whatever it is: a restart before the first answer reads the restored
        // copy again, and must wait again rather than take it for its own latest state, and
        // hand out ids above the floor (a restart does not take it again).
        self.dirty.mark(Dirty::Restore);
        self.dirty.mark(Dirty::Meta);
    }

    /// The version of the limits configuration now in force (reported in SyncUps).
    ///
    /// A change to any version but the next may have skipped one this region never saw, at
    /// which the coordinator's table dropped the rows of a limit whose parameters changed
    /// (`set_limits` compares only the two versions it sees): every grant is then held at no
    /// more than the default share. That is at most the table's row whether it kept the row
    /// or dropped it, and the coordinator grants more again at a newer epoch (swarm seeds
    /// 800739, 800740), unless a reclaim put the row below the default at the version
    /// skipped. So under the closed policy a strict key also holds at its use within its
    /// grant until an answer at the new version, which brings every row below the default
    /// the region has not confirmed (swarm seed 3161221: a removed region kept a grant of
    /// 2,961 through a version that gave it 0). The grants themselves stay: a row below the
    /// default the region confirmed before the skip is not sent again, and without its grant
    /// the region would enforce its default over it (swarm seed 3234414).
    ///
    /// A region restored from its store starts at the version stored with its grants
    /// (`PersistRecord::ConfigVersion`), so the first call after a restart applies the same
    /// rule to the versions it missed while down (swarm seed 3187824), and to a skip whose
    /// answer had not come when it went down.
    pub fn set_config_version(&mut self, version: u64) {
        let old = self.config_version;
        let skipped = old != 0 && version != old && version != old.saturating_add(1);
        if old != 0 && version != old {
            self.view.version_unheard = true;
        }
        if version != old {
            self.dirty.mark(Dirty::ConfigVersion);
        }
        self.config_version = version;
        if skipped {
            if self.cfg.coordinated {
                // An uncoordinated region has no answer to wait for, and no grants.
                self.view.version_skipped_from.get_or_insert(old);
            }
            self.hold_grants_at_defaults();
        }
    }

    /// Every explicit allowance, current or pre-issued, held at no more than the default.
    fn hold_grants_at_defaults(&mut self) {
        for (id, lim) in self.limits.iter_mut() {
            let default = lim.params.default_units;
            for (name, ks) in lim.keys.iter_mut() {
                let Some(hot) = ks.hot.as_mut() else { continue };
                let mut held = false;
                if hot.allowance.is_some_and(|u| u > default) {
                    hot.allowance = Some(default);
                    held = true;
                }
                for f in hot
                    .future
                    .iter_mut()
                    .filter(|f| f.allowance_units > default)
                {
                    f.allowance_units = default;
                    held = true;
                }
                if held {
                    self.dirty
                        .mark(Dirty::Key(id.clone(), KeyId::new(name.as_ref())));
                }
            }
        }
    }

    /// The version the stored grants were made under: the one in force, or the one before a
    /// skip no answer has yet followed.
    pub(crate) fn stored_config_version(&self) -> u64 {
        self.view
            .version_skipped_from
            .unwrap_or(self.config_version)
    }

    /// The configuration version in force here.
    pub fn config_version(&self) -> u64 {
        self.config_version
    }

    /// The coordinator's configuration version, from its latest SyncDown.
    pub fn coordinator_config_version(&self) -> Option<u64> {
        self.coordinator_config_version
    }

    /// Decide one request of `cost_units`, and charge it if allowed.
    pub fn acquire(&mut self, now: Timestamp, req: AcquireRequest) -> Result<Decision> {
        self.saw_time(now);
        let request = req.request_id.map(|id| (id, req.fingerprint()));
        self.once(now, request, |b| b.acquire_once(now, req))
    }

    fn acquire_once(&mut self, now: Timestamp, req: AcquireRequest) -> Result<Decision> {
        let ctx = ctx_of(&self.cfg, &self.view, now);
        let lim = self
            .limits
            .get_mut(&req.limit)
            .ok_or_else(|| Error::UnknownLimit(req.limit.clone()))?;
        if let Some(d) = unmetered_decision(&lim.params, now) {
            return Ok(d);
        }
        let mut touched = Vec::new();
        let res = lim.with_key(
            now,
            &req.key,
            self.cfg.max_keys_per_limit,
            &mut touched,
            |p, ks, stats| {
                let adm = admit::admit(p, ks, stats, &ctx, now, Want::Exact(req.cost_units));
                (decision_of(p, ks, &adm, now), adm.escalated)
            },
        );
        let unsaved = lim.stats.take_unsaved();
        self.mark_touched(&req.limit, touched);
        self.mark_stats(&req.limit, unsaved);
        let (decision, escalated) = res?;
        self.key_changed(&req.limit, &req.key, escalated);
        Ok(decision)
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.cfg
    }

    pub fn region(&self) -> &RegionId {
        &self.cfg.region
    }

    /// The limit as configured here (after the last `set_limits`).
    pub fn limit_spec(&self, limit: &LimitId) -> Option<&LimitSpec> {
        self.limits.get(limit).map(|l| &l.params.spec)
    }

    /// Per-window measurements of one limit (settle overage, fail-open, time open, denials).
    pub fn stats(&self, limit: &LimitId) -> Option<&LimitStats> {
        self.limits.get(limit).map(|l| &l.stats)
    }

    pub fn region_stats(&self) -> RegionStats {
        RegionStats {
            dirty_overflows: self.dirty.overflows(),
            ..self.stats.clone()
        }
    }

    /// The key's own counter entries (for the window it was last used in).
    pub fn counter(&self, limit: &LimitId, key: &KeyId) -> Option<CounterState> {
        let ks = self.limits.get(limit)?.keys.get(key.as_str())?;
        Some(CounterState {
            window: ks.window,
            granted_units: ks.granted_units,
            refunded_units: ks.refunded_units,
        })
    }

    /// Every key's own counter with the allowance it is judged against and the excess policy
    /// let in (invariant 1: `net <= allowance + excess` at admission), in limit then key
    /// order: for observers such as the simulator's checker, not for the request path.
    pub fn key_accounts(&self, now: Timestamp) -> Vec<KeyAccount> {
        let ctx = ctx_of(&self.cfg, &self.view, now);
        let mut out = Vec::new();
        for (id, lim) in &self.limits {
            if lim.params.is_unmetered() {
                continue;
            }
            for (name, ks) in &lim.keys {
                let allowance = admit::allowance(&lim.params, ks, ks.window, &ctx);
                let start = lim.params.window_start(ks.window);
                out.push(KeyAccount {
                    counter: CounterRef {
                        limit: id.clone(),
                        key: KeyId::new(name.as_ref()),
                        window: ks.window,
                    },
                    granted_units: ks.granted_units,
                    refunded_units: ks.refunded_units,
                    allowance_units: allowance.units,
                    excess_units: ks.hot.as_ref().map_or(0, |h| h.excess_units),
                    restore_closed: ctx.restore.closes(start),
                    restore_awaiting: ctx.restore.is_awaiting(),
                    carry_units: ks.hot.as_ref().map_or(0, |h| h.carry_units),
                });
            }
        }
        out
    }

    /// The allowance `a_r` the region enforces for the key at `now`.
    pub fn allowance_units(&self, now: Timestamp, limit: &LimitId, key: &KeyId) -> Result<u64> {
        let lim = self
            .limits
            .get(limit)
            .ok_or_else(|| Error::UnknownLimit(limit.clone()))?;
        let window = lim.params.window_index(now);
        let ctx = ctx_of(&self.cfg, &self.view, now);
        let fresh = key::KeyState::new(window);
        let ks = lim.keys.get(key.as_str()).unwrap_or(&fresh);
        Ok(admit::allowance(&lim.params, ks, window.max(ks.window), &ctx).units)
    }

    /// Contact with the coordinator is older than `view_ttl`, or never happened.
    pub fn is_view_expired(&self, now: Timestamp) -> bool {
        self.view.is_expired(now)
    }

    /// Send time (own clock) of the latest SyncUp the coordinator answered.
    pub fn last_contact(&self) -> Option<Timestamp> {
        self.view.contact_at()
    }

    /// The clock sample of the last answered round trip.
    pub fn clock_sample(&self) -> Option<ClockSample> {
        self.view.clock()
    }

    /// The last answered round trip's send time (own clock) and clock sample: what a
    /// [`Timebase`] takes.
    pub fn clock_round_trip(&self) -> Option<(Timestamp, ClockSample)> {
        self.view.clock_round_trip()
    }

    /// The timebase's edge band and guard (docs/budget.md, edge band): from now on, strict
    /// admissions keep `band` clear of every window edge (`Duration::MAX`: none at all), and
    /// SyncUps carry `guard`. `None` for both: admission as without a timebase.
    pub fn set_clock_guard(&mut self, band: Option<Duration>, guard: Option<ClockGuard>) {
        self.view.set_clock_guard(band, guard);
    }

    /// The timebase's correction (`Timebase::correction`), kept with the durable state: a
    /// restart reads windows on the clock its counters were written on.
    pub fn set_clock_correction(&mut self, correction: ClockCorrection) {
        if self.view.set_clock_correction(correction) {
            self.dirty.mark(Dirty::Clock);
        }
    }

    /// The correction last set, or read back from the store.
    pub fn clock_correction(&self) -> Option<ClockCorrection> {
        self.view.clock_correction()
    }

    /// Whether the clock guard's edge band covers every instant of `limit`'s windows, so that
    /// its strict keys admit nothing new (`admit::edge_band`): the timebase's uncertainty is
    /// above its maximum, or a restart waits for its first sample.
    pub fn strict_held_by_clock(&self, limit: &LimitId) -> bool {
        let (Some(e), Some(l)) = (self.view.edge_band(), self.limits.get(limit)) else {
            return false;
        };
        admit::band_covers_window(e, l.params.window_len())
    }

    /// A restored start (`start_restored`) was dated on a clock the first sample since then
    /// corrected: it started at `start` on the corrected one. Windows that began before it
    /// (and within `max_edge_band` after it) are the lost copy's (on its corrected clock) and
    /// close; the start only moves later.
    pub fn restore_started_no_earlier_than(&mut self, start: Timestamp) {
        let start = start + self.cfg.max_edge_band.unwrap_or_default();
        if self.view.restore.start_no_earlier_than(start) {
            self.dirty.mark(Dirty::Restore);
        }
    }

    pub fn key_count(&self, limit: &LimitId) -> usize {
        self.limits.get(limit).map_or(0, |l| l.keys.len())
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// The start and end of the window a live lease counts in (own clock), for observers
    /// that attribute its spends to the window it was charged to.
    pub fn lease_window(&self, lease: LeaseId) -> Option<(Timestamp, Timestamp)> {
        let l = self.leases.get(lease)?;
        let p = &self.limits.get(&l.limit)?.params;
        Some((p.window_start(l.window), p.window_end(l.window)))
    }

    /// Run a mutating call at most once per request id: a retry within the TTL (same request
    /// id, same request) gets the first outcome back and changes nothing; the id sent with
    /// another request (its fingerprint differs, or another kind of call) is refused with
    /// [`Error::IdempotencyConflict`]. A call that fails is not remembered.
    fn once<T: Remembered>(
        &mut self,
        now: Timestamp,
        request: Option<(RequestId, RequestFingerprint)>,
        op: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let Some((id, fingerprint)) = request else {
            return op(self);
        };
        let ticket = match self.idempotency.reserve(now, id, fingerprint) {
            Reserved::Ticket(t) => t,
            Reserved::Replay(first) => return replayed(&first, fingerprint),
        };
        let result = op(self);
        match &result {
            Ok(out) => {
                let (stats, dirty) = (&mut self.stats, &mut self.dirty);
                self.idempotency.fill(ticket, out.to_outcome(), |old| {
                    stats.idempotency_evicted_early += 1;
                    dirty.mark(Dirty::Idempotency(old));
                });
            }
            Err(_) => self.idempotency.cancel(ticket),
        }
        // Either way the id's record changed (a new entry, or an expired one dropped).
        self.dirty.mark(Dirty::Idempotency(id));
        result
    }

    /// Persist keys changed on the side of a call (evicted, rolled, compacted).
    fn mark_touched(&mut self, limit: &LimitId, touched: Vec<Box<str>>) {
        for name in touched {
            self.dirty
                .mark(Dirty::Key(limit.clone(), KeyId::new(name.as_ref())));
        }
    }

    /// Persist the summed bound figures of these windows of a limit.
    fn mark_stats(&mut self, limit: &LimitId, windows: Vec<WindowIndex>) {
        for w in windows {
            self.dirty.mark(Dirty::Stats(limit.clone(), w));
        }
    }

    /// Bookkeeping after a key changed: persist it, and report it to the coordinator from
    /// now on if it escalated.
    fn key_changed(&mut self, limit: &LimitId, key: &KeyId, escalated: bool) {
        self.dirty.mark(Dirty::Key(limit.clone(), key.clone()));
        if escalated {
            self.sync.report(KeyRef {
                limit: limit.clone(),
                key: key.clone(),
            });
        }
    }

    /// A limit's keys are gone (removed, or its window changed): end its leases and slots.
    fn forget_limit(&mut self, id: &LimitId) {
        self.dirty.mark(Dirty::Limit(id.clone()));
        for lease in self.leases.remove_limit(id) {
            self.dirty.mark(Dirty::Lease(lease));
        }
        for slot in self.slots.remove_limit(id) {
            self.dirty.mark(Dirty::Slot(slot));
        }
    }
}

fn ctx_of(cfg: &BudgetConfig, view: &View, now: Timestamp) -> Ctx {
    let coordinated = cfg.coordinated;
    Ctx {
        coordinated,
        view_expired: coordinated && view.is_expired(now),
        fresh_since: view.fresh_since(now),
        view_ttl: cfg.view_ttl,
        sync_interval: cfg.sync_interval,
        edge_band: view.edge_band().filter(|_| coordinated),
        open_from: view
            .expired_span(now)
            .filter(|_| coordinated)
            .map(|(from, _)| from),
        restore: view.restore.gate(),
        version_unheard: coordinated && view.version_unheard,
        version_skipped: coordinated && view.version_skipped_from.is_some(),
        below_default_left: coordinated && view.below_default_left,
        clock_unknown: cfg.max_edge_band.is_some() && view.clock_correction().is_none(),
    }
}

/// The first outcome of a request id, if this call is that request again. An entry restored
/// from a store written before fingerprints has none: it is checked on the call kind alone.
fn replayed<T: Remembered>(
    first: &idempotency::IdempotencyEntry,
    fingerprint: RequestFingerprint,
) -> Result<T> {
    let conflict = || Error::IdempotencyConflict {
        first: first.outcome.kind(),
        this: T::KIND,
    };
    if first.fingerprint.is_some_and(|f| f != fingerprint) {
        return Err(conflict());
    }
    T::from_outcome(&first.outcome).ok_or_else(conflict)
}

/// Disabled and unlimited limits admit everything and count nothing.
fn unmetered_decision(p: &LimitParams, now: Timestamp) -> Option<Decision> {
    if !p.is_unmetered() {
        return None;
    }
    let window = p.window_index(now);
    Some(Decision {
        allowed: true,
        remaining_units: p.quota_units(),
        retry_after: None,
        reset_after: p.quota.map_or(Duration::ZERO, |_| {
            p.window_end(window).saturating_duration_since(now)
        }),
        limit_units: p.quota_units(),
        shadow_denied: false,
        reason: if p.spec.enabled {
            Reason::Unlimited
        } else {
            Reason::Disabled
        },
    })
}

fn decision_of(
    p: &LimitParams,
    ks: &key::KeyState,
    adm: &admit::Admission,
    now: Timestamp,
) -> Decision {
    Decision {
        allowed: adm.allowed,
        remaining_units: adm.allowance.units.saturating_sub(ks.net_units()),
        retry_after: if adm.allowed { None } else { adm.retry_after },
        reset_after: p.window_end(ks.window).saturating_duration_since(now),
        limit_units: p.quota_units(),
        shadow_denied: adm.shadow_denied,
        reason: adm.reason,
    }
}
