//! The leader's rebalancer, quinn style: SyncUps in, table commands and SyncDowns out.
//!
//! - [`Coordinator::handle_sync_up`] records a region's counter entries, demand, release acks,
//!   clock sample and the time it was heard.
//! - [`Coordinator::poll_proposals`] returns what should be committed through raft: release
//!   completions, reclaims, grows, release requests and garbage collection.
//! - The driver commits each and calls [`Coordinator::handle_committed`], which applies it to
//!   the leader's copy of the table.
//! - [`Coordinator::poll_sync_down`] answers a region from COMMITTED state only: a grant is
//!   never sent before the allowance it carries is in the table (grow: commit, then send).
//!
//! Driver contract: after `handle_sync_up`, call `poll_proposals` and commit (or abandon)
//! everything it and earlier polls returned before calling `poll_sync_down` for that region
//! ([`Coordinator::has_uncommitted_proposals`] is then false). A region returning from a
//! closed-policy reclaim then finds the reclaim ended in the table and gets the zeroes for every
//! counter whose rows used its floor in the same answer that makes its view fresh again.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound as RangeBound;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::budget::config::STATS_WINDOWS_KEPT;
use crate::error::{Error, Result};
use crate::ids::{Epoch, KeyId, LimitId, RegionId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::rebalance::bound::{Bound, BoundInputs, RegionBoundStats, bound, skew_reach_windows};
use crate::rebalance::plan::{CounterPlanInput, PlanAction, RegionState, plan_counter};
use crate::rebalance::reload::{Held, KeptConfigs};
use crate::rebalance::table::{AllowanceTable, ApplyOutcome, TableCommand};
use crate::rebalance::views::{CounterView, DemandView, PreviousVersion, RegionView};
use crate::sync::{
    AllowanceGrant, BoundFigures, CounterEntry, CounterRef, LimitWindowStats,
    MAX_ITEMS_PER_MESSAGE, ReleaseAck, ReleaseRequest, SyncDown, SyncUp,
};
use crate::time::{Timestamp, Window, WindowIndex, duration_nanos};

/// Most windows either side of the judged one whose allowances the skew term reads for a
/// region with a clock sample; a clock further off reads as unknown (every window counts).
pub const MAX_SKEW_REACH_WINDOWS: u64 = 64;

/// Most commands one `poll_proposals` returns; the rest waits for the next round.
pub const MAX_PROPOSALS_PER_POLL: usize = 1024;

/// Sync intervals a release needs before its units can be used elsewhere: the request waits
/// for the releasing region's next SyncUp to be answered, its ack for the one after, and the
/// grant of the freed units for the receiving region's next SyncUp. With less of a window
/// left, the current window's counters are not asked to release (the units would end the
/// window in transit, used by nobody); counters of later windows always may be.
pub const RELEASE_HANDOFF_SYNC_INTERVALS: u32 = 3;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorConfig {
    /// How often agents sync. A grant is resent for a reported mismatch only once it has been
    /// out this long (until then it is probably still in flight).
    pub sync_interval: Duration,
    /// A region not heard for this long is frozen: neither grown nor asked to release, and
    /// its view (on its side) has expired.
    pub view_ttl: Duration,
    /// Extra silence, beyond `view_ttl` and the measured clock uncertainty, before a closed
    /// region's floor is reclaimed: covers the drift of clock rates over that time.
    pub drift_margin: Duration,
    /// Grows and releases smaller than this are not made: no churn for tiny changes.
    pub rebalance_hysteresis_units: u64,
    /// How long before a window starts its allocations are issued ("start the window where
    /// demand is").
    pub pre_issue_lead: Duration,
    /// Most counters the leader keeps views of; reports for more are dropped (their demand
    /// goes unmet, which is safe).
    pub max_tracked_counters: usize,
    /// A proposal neither committed nor abandoned after this long is forgotten, so the
    /// counter can be planned again.
    pub proposal_timeout: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            sync_interval: Duration::from_millis(250),
            view_ttl: Duration::from_secs(2),
            drift_margin: Duration::from_millis(500),
            rebalance_hysteresis_units: 1,
            pre_issue_lead: Duration::from_secs(1),
            max_tracked_counters: 65_536,
            proposal_timeout: Duration::from_secs(5),
        }
    }
}

/// What an in-flight proposal is about: at most one per key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ProposalKey {
    Counter(CounterRef),
    /// Starting and ending a reclaim are separate keys: a reclaim proposed while its region
    /// was silent can still commit after the region is heard again, so its end is proposed
    /// behind it without waiting for it.
    StartReclaim(LimitId, RegionId),
    EndReclaim(LimitId, RegionId),
    Gc(LimitId),
}

fn proposal_key(cmd: &TableCommand) -> Option<ProposalKey> {
    match cmd {
        TableCommand::Grow { counter, .. }
        | TableCommand::RequestRelease { counter, .. }
        | TableCommand::CompleteRelease { counter, .. } => {
            Some(ProposalKey::Counter(counter.clone()))
        }
        TableCommand::Reclaim { limit, region, .. } => {
            Some(ProposalKey::StartReclaim(limit.clone(), region.clone()))
        }
        TableCommand::EndReclaim { limit, region } => {
            Some(ProposalKey::EndReclaim(limit.clone(), region.clone()))
        }
        TableCommand::CollectGarbage { limit, .. } => Some(ProposalKey::Gc(limit.clone())),
        // Configuration and the operator's removals are not the rebalancer's proposals.
        TableCommand::SetConfig { .. }
        | TableCommand::RemoveRegion { .. }
        | TableCommand::RestoreRegion { .. } => None,
    }
}

pub struct Coordinator {
    cfg: CoordinatorConfig,
    table: AllowanceTable,
    started_at: Timestamp,
    /// This leader's term ([`SyncDown::leader_term`]): larger than every earlier leader's.
    leader_term: u64,
    regions: BTreeMap<RegionId, RegionView>,
    counters: BTreeMap<CounterRef, CounterView>,
    /// Acks whose release is still pending in the table, waiting to be committed.
    acks: BTreeMap<(CounterRef, RegionId), ReleaseAck>,
    /// Epoch of the last grant sent per row, and when.
    sent: BTreeMap<(CounterRef, RegionId), (Epoch, Timestamp)>,
    /// Rows whose region reported an allowance other than the table's: grant to resend.
    resend: BTreeSet<(CounterRef, RegionId)>,
    /// Per key, when its proposals were made and how many of them are still uncommitted: a
    /// round's plan for a counter goes out as one batch, and the counter is planned again
    /// only once the whole batch is in.
    in_flight: BTreeMap<ProposalKey, (Timestamp, usize)>,
    /// Rows whose region has shown (demand report or release ack) that it enforces at most the
    /// row. A row below the region's configured default that is not confirmed may be unknown to
    /// the region, which would then enforce its default: such a row is neither grown nor
    /// shrunk, and its grant leads every answer, until confirmed.
    confirmed: BTreeSet<(CounterRef, RegionId)>,
    /// Per region, the last counter whose entries fitted in an answer: the next answer starts
    /// after it, so no counter starves when there are more entries than fit.
    entry_cursor: BTreeMap<RegionId, CounterRef>,
    /// Per region, the counters its newest SyncUp carried (sorted, at most
    /// `2 * MAX_ITEMS_PER_MESSAGE`): their entries lead the answer to it.
    carried: BTreeMap<RegionId, Vec<CounterRef>>,
    /// What regions measured for the bound, per limit and window (their clocks), merged by
    /// max; the last `STATS_WINDOWS_KEPT` windows of each limit.
    region_stats: BTreeMap<(LimitId, WindowIndex), BTreeMap<RegionId, BoundFigures>>,
    /// Configurations this leader replaced, for the bound while regions still enforce them.
    kept_configs: KeptConfigs,
    /// Per limit, the first window still live when views were last forgotten: never tracked
    /// again, though a wider clock sample later widens the live range (a counter forgotten
    /// and tracked anew from a late message would relay less than it relayed before).
    /// Kept with the window length it counts in: a reload that changes the length starts a
    /// new mark (indices of another length are not comparable).
    forgotten_before: BTreeMap<LimitId, (Window, WindowIndex)>,
}

impl Coordinator {
    /// A leader starting at `now` over the committed `table`. `leader_term` must be larger
    /// than every earlier leader's (the raft term it was elected in): regions resend their
    /// soft state when they see it grow.
    pub fn new(
        cfg: CoordinatorConfig,
        table: AllowanceTable,
        now: Timestamp,
        leader_term: u64,
    ) -> Self {
        Coordinator {
            cfg,
            table,
            started_at: now,
            leader_term,
            regions: BTreeMap::new(),
            counters: BTreeMap::new(),
            acks: BTreeMap::new(),
            sent: BTreeMap::new(),
            resend: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            confirmed: BTreeSet::new(),
            entry_cursor: BTreeMap::new(),
            carried: BTreeMap::new(),
            region_stats: BTreeMap::new(),
            kept_configs: KeptConfigs::default(),
            forgotten_before: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    pub fn table(&self) -> &AllowanceTable {
        &self.table
    }

    /// True while a polled command has been neither committed nor forgotten (after
    /// `proposal_timeout`; a reclaim's start is never forgotten, see `poll_proposals`).
    pub fn has_uncommitted_proposals(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Net use of `region` on `counter` as last reported, if the counter is tracked.
    pub fn used_units(&self, counter: &CounterRef, region: &RegionId) -> Option<u64> {
        self.counters.get(counter).map(|v| v.used_units(region))
    }

    /// Record one SyncUp. Old or duplicated messages are harmless: entries merge by max,
    /// acks are matched by id, and demand is taken only from a newer message: a larger
    /// `(boot, seq)`. A larger boot is a restart, perhaps from an old copy of the region's
    /// state: every grant of its rows is sent again and its rows count as unconfirmed.
    pub fn handle_sync_up(&mut self, now: Timestamp, msg: SyncUp) -> Result<()> {
        if self.table.regions().binary_search(&msg.region).is_err() {
            return Err(Error::InvalidRequest(format!(
                "sync from unknown region {}",
                msg.region
            )));
        }
        // Refused before anything of it is taken: the region is no longer heard, so its view
        // expires on its side and, under the closed policy, its floor becomes reclaimable.
        if self.table.is_removed(&msg.region) {
            return Err(Error::RegionRemoved(msg.region.clone()));
        }
        let started_at = self.started_at;
        let known = self.known_before(&msg);
        let view = self
            .regions
            .entry(msg.region.clone())
            .or_insert_with(|| RegionView::new(started_at));
        let newer = view
            .last_seq
            .is_none_or(|s| (msg.boot, msg.seq) > (view.boot, s));
        let restarted = view.last_seq.is_some() && msg.boot > view.boot;
        // Even a late message proves the region answers: its view is aged from the message's
        // own send time, which is before now, so hearing it "now" is never optimistic.
        view.last_heard = view.last_heard.max(now);
        view.heard = true;
        view.first_heard_at.get_or_insert(now);
        if newer {
            view.boot = msg.boot;
            view.last_seq = Some(msg.seq);
            view.last_received_at = now;
            // A region that ran on a corrected clock restarts on its own: the sample of the
            // corrected one no longer describes it.
            let reclocked = restarted && view.clock_guard.is_some();
            view.clock = if reclocked {
                msg.clock
            } else {
                msg.clock.or(view.clock)
            };
            view.clock_guard = msg.clock_guard;
            view.view_expired = msg.view_expired;
            if let Some(old) = view.config_version
                && old != msg.config_version
            {
                view.previous_version = Some(PreviousVersion {
                    version: old,
                    switched_at: now,
                    uncertainty_at_switch: view.clock_uncertainty(),
                });
            }
            view.config_version = Some(msg.config_version);
        }
        if let Some(k) = known {
            view.known_before_boot = k;
        }
        if restarted {
            self.forget_sent(&msg.region);
        }
        for e in msg.entries.iter().take(MAX_ITEMS_PER_MESSAGE) {
            if e.region == msg.region
                && self.track(now, &e.counter)
                && let Some(v) = self.counters.get_mut(&e.counter)
            {
                v.merge(e);
            }
        }
        if newer {
            self.record_demand(now, &msg);
            self.record_carried(&msg);
        }
        for ack in msg.release_acks.iter().take(MAX_ITEMS_PER_MESSAGE) {
            self.record_ack(&msg.region, ack);
        }
        for st in msg.stats.iter().take(MAX_ITEMS_PER_MESSAGE) {
            self.record_stats(now, &msg.region, st);
        }
        Ok(())
    }

    /// For the first message of a boot: whether this leader knew the region before it (an
    /// earlier boot heard, a row of its table, or an entry of a counter it tracks), so that a
    /// region that found its store empty learns whether it lost it. `None` for other
    /// messages. Scans the table and the tracked counters once a boot.
    fn known_before(&self, msg: &SyncUp) -> Option<bool> {
        let view = self.regions.get(&msg.region);
        let first_of_boot = view.is_none_or(|v| v.last_seq.is_none() || msg.boot > v.boot);
        if !first_of_boot {
            return None;
        }
        let earlier_boot = view.is_some_and(|v| v.last_seq.is_some());
        let region = &msg.region;
        Some(
            earlier_boot
                || self
                    .table
                    .counters()
                    .any(|(_, rows)| rows.contains_key(region))
                || self.table.reclaims().any(|((_, r), _)| r == region)
                || self.counters.values().any(|v| v.entry(region) != (0, 0)),
        )
    }

    /// The counters `msg` carried (entries and demand, both capped per message), whose
    /// entries the answer sends first.
    fn record_carried(&mut self, msg: &SyncUp) {
        let entries = msg.entries.iter().take(MAX_ITEMS_PER_MESSAGE);
        let demand = msg.demand.iter().take(MAX_ITEMS_PER_MESSAGE);
        let mut counters: Vec<CounterRef> = entries
            .map(|e| e.counter.clone())
            .chain(demand.map(|d| d.counter.clone()))
            .collect();
        counters.sort();
        counters.dedup();
        self.carried.insert(msg.region.clone(), counters);
    }

    /// The region restarted: what was sent to it may be lost with its state, so every grant
    /// goes again (its rows count as unsent) and below-default rows must be confirmed again.
    fn forget_sent(&mut self, region: &RegionId) {
        self.sent.retain(|(_, r), _| r != region);
        self.confirmed.retain(|(_, r)| r != region);
        self.resend.retain(|(_, r)| r != region);
    }

    /// Keep a region's bound figures for a window that is recent on our clock (its own clock
    /// may put the index one window either side), merged by max.
    fn record_stats(&mut self, now: Timestamp, region: &RegionId, st: &LimitWindowStats) {
        let Some(window) = self.finite_window(&st.limit) else {
            return;
        };
        let (first, last) = self.live_windows(window, now);
        let first = forgotten_mark(&self.forgotten_before, &st.limit, window)
            .map_or(first, |f| first.max(f));
        let oldest = first.0.saturating_sub(STATS_WINDOWS_KEPT as u64);
        if st.window.0 < oldest || st.window > last.next() {
            return;
        }
        let figures = self
            .region_stats
            .entry((st.limit.clone(), st.window))
            .or_default()
            .entry(region.clone())
            .or_default();
        *figures = figures.max(st.figures);
    }

    fn record_demand(&mut self, now: Timestamp, msg: &SyncUp) {
        for d in msg.demand.iter().take(MAX_ITEMS_PER_MESSAGE) {
            if !self.track(now, &d.counter) {
                continue;
            }
            if let Some(v) = self.counters.get_mut(&d.counter) {
                v.demand.insert(
                    msg.region.clone(),
                    DemandView {
                        micro_units_per_sec: d.demand_micro_units_per_sec,
                        allowance_units: d.allowance_units,
                        carried: false,
                    },
                );
            }
            let lost_grant = self.table.row(&d.counter, &msg.region).is_some_and(|row| {
                row.pending.is_none() && row.allowance_units != d.allowance_units
            });
            let key = (d.counter.clone(), msg.region.clone());
            let at_most_row = self
                .table
                .row(&d.counter, &msg.region)
                .is_some_and(|row| d.allowance_units <= row.allowance_units);
            if at_most_row {
                self.confirmed.insert(key.clone());
            }
            if lost_grant {
                self.resend.insert(key);
            } else {
                self.resend.remove(&key);
            }
        }
    }

    fn record_ack(&mut self, region: &RegionId, ack: &ReleaseAck) {
        let pending = self
            .table
            .row(&ack.counter, region)
            .and_then(|row| row.pending.as_ref());
        // Duplicated or late acks (the release already completed) match nothing and vanish.
        if pending.is_some_and(|p| p.id == ack.id) {
            self.acks
                .insert((ack.counter.clone(), region.clone()), ack.clone());
        }
    }

    /// Starts tracking `counter` if there is room and it is worth tracking; true if tracked.
    fn track(&mut self, now: Timestamp, counter: &CounterRef) -> bool {
        if self.counters.contains_key(counter) {
            return true;
        }
        let Some(window) = self.finite_window(&counter.limit) else {
            return false;
        };
        let (first, last) = self.live_windows(window, now);
        let forgotten = forgotten_mark(&self.forgotten_before, &counter.limit, window)
            .is_some_and(|w| counter.window < w);
        let live = !forgotten && counter.window >= first && counter.window <= last.next();
        if !live || self.counters.len() >= self.cfg.max_tracked_counters {
            return false;
        }
        self.counters
            .insert(counter.clone(), CounterView::default());
        true
    }

    fn finite_window(&self, limit: &LimitId) -> Option<Window> {
        match self.table.limit(limit)?.quota {
            Quota::Units { window, .. } => Some(window),
            Quota::Unlimited => None,
        }
    }

    /// Apply a committed command to the leader's table.
    pub fn handle_committed(&mut self, now: Timestamp, cmd: &TableCommand) -> ApplyOutcome {
        if let Some(key) = proposal_key(cmd)
            && let Some((_, left)) = self.in_flight.get_mut(&key)
        {
            *left -= 1;
            if *left == 0 {
                self.in_flight.remove(&key);
            }
        }
        if let TableCommand::EndReclaim { limit, region } = cmd {
            // Whatever was proposed before this end has committed by now or never will (log
            // order): a start of the reclaim can no longer take effect behind the region's back.
            self.in_flight
                .remove(&ProposalKey::StartReclaim(limit.clone(), region.clone()));
        }
        let ack = match cmd {
            TableCommand::CompleteRelease {
                counter, region, ..
            } => self.acks.remove(&(counter.clone(), region.clone())),
            _ => None,
        };
        let before = matches!(cmd, TableCommand::SetConfig { .. }).then(|| self.table.clone());
        let outcome = self.table.apply(cmd.clone());
        if let (Some(ack), true) = (ack, outcome.is_applied()) {
            self.confirm_from_ack(&ack, cmd);
        }
        if let (Some(before), true) = (before, outcome.is_applied()) {
            self.kept_configs.remember(&before, now);
            self.forget_dropped_rows();
        }
        outcome
    }

    /// After a configuration change: what was sent, confirmed or acked for rows the table
    /// dropped belongs to the old parameters.
    fn forget_dropped_rows(&mut self) {
        let table = &self.table;
        let kept = |(c, r): &(CounterRef, RegionId)| table.row(c, r).is_some();
        self.sent.retain(|k, _| kept(k));
        self.resend.retain(kept);
        self.confirmed.retain(kept);
        self.acks.retain(|k, _| kept(k));
    }

    /// Every region this leader heard reports the table's configuration version: only then
    /// is a counter planned, since a region on another version neither takes the grants nor
    /// enforces the defaults the plan counts it at.
    fn versions_agree(&self) -> bool {
        // A removed region never syncs again, so it would hold planning up for good; it is
        // frozen (the plan counts it at what the table holds), and what it may still enforce
        // under an older version is in the bound's reload term, which counts every member.
        let current = self.table.config_version();
        self.regions
            .iter()
            .filter(|(r, _)| !self.table.is_removed(r))
            .all(|(_, v)| v.config_version.is_none_or(|c| c == current))
    }

    fn confirm_from_ack(&mut self, ack: &ReleaseAck, cmd: &TableCommand) {
        let TableCommand::CompleteRelease {
            counter, region, ..
        } = cmd
        else {
            return;
        };
        let row_units = self.table.allowance(counter, region);
        if ack.allowance_after_units <= row_units {
            self.confirmed.insert((counter.clone(), region.clone()));
        }
    }

    /// A row below the region's configured default that the region has not confirmed.
    fn unconfirmed_below_default(&self, counter: &CounterRef, region: &RegionId) -> bool {
        self.table.row(counter, region).is_some_and(|row| {
            row.allowance_units < self.table.configured_default(counter, region)
                && !self.confirmed.contains(&(counter.clone(), region.clone()))
        })
    }

    /// What the rebalancer wants committed now.
    pub fn poll_proposals(&mut self, now: Timestamp) -> Vec<TableCommand> {
        let timeout = self.cfg.proposal_timeout;
        // A reclaim's start is not forgotten: it may still commit after its region is heard
        // again, and must then have an end proposed behind it (`propose_reclaims`).
        self.in_flight.retain(|key, (at, _)| {
            matches!(key, ProposalKey::StartReclaim(..))
                || now.saturating_duration_since(*at) < timeout
        });
        self.forget_ended(now);
        self.pre_issue(now);
        let mut out = Vec::new();
        self.propose_completions(&mut out);
        self.propose_reclaims(now, &mut out);
        self.propose_rebalance(now, &mut out);
        self.propose_gc(now, &mut out);
        out.truncate(MAX_PROPOSALS_PER_POLL);
        for cmd in &out {
            if let Some(key) = proposal_key(cmd) {
                self.in_flight.entry(key).or_insert((now, 0)).1 += 1;
            }
        }
        out
    }

    fn is_in_flight(&self, key: &ProposalKey) -> bool {
        self.in_flight.contains_key(key)
    }

    fn propose_completions(&self, out: &mut Vec<TableCommand>) {
        for ((counter, region), ack) in &self.acks {
            if self.is_in_flight(&ProposalKey::Counter(counter.clone())) {
                continue;
            }
            out.push(TableCommand::CompleteRelease {
                counter: counter.clone(),
                region: region.clone(),
                id: ack.id,
                released_units: ack.released_units,
            });
        }
    }

    fn region_view(&self, region: &RegionId) -> RegionView {
        self.regions
            .get(region)
            .cloned()
            .unwrap_or_else(|| RegionView::new(self.started_at))
    }

    /// Silent long enough that its view (on its own clock) has expired.
    fn is_silent(&self, region: &RegionId, now: Timestamp) -> bool {
        self.region_view(region).silent_for(now) >= self.cfg.view_ttl
    }

    /// When `region`, silent since it was last heard, has certainly closed itself: `view_ttl`
    /// after its last contact on its own clock, plus the drift margin, plus how far its clock
    /// may be from ours. `None` without a clock sample: its clock may be any number of windows
    /// away, so nothing is reclaimed (a new leader learns the sample from the region's next
    /// SyncUp, which carries its latest one).
    fn reclaim_deadline(&self, region: &RegionId) -> Option<Timestamp> {
        let view = self.region_view(region);
        let uncertainty = view.clock_uncertainty()?;
        Some(view.last_heard + self.cfg.view_ttl + self.cfg.drift_margin + uncertainty)
    }

    fn propose_reclaims(&self, now: Timestamp, out: &mut Vec<TableCommand>) {
        for spec in self.table.limits() {
            let (Consistency::Strict, PartitionPolicy::Closed, Quota::Units { window, .. }) =
                (spec.consistency, spec.partition_policy, spec.quota)
            else {
                continue;
            };
            for region in self.table.regions() {
                let (limit, r) = (&spec.id, region);
                let starting =
                    self.is_in_flight(&ProposalKey::StartReclaim(limit.clone(), r.clone()));
                let ending = self.is_in_flight(&ProposalKey::EndReclaim(limit.clone(), r.clone()));
                let deadline = self
                    .reclaim_deadline(region)
                    .filter(|d| now >= *d && self.closes_when_silent(limit, region));
                let active = self.table.reclaim(&spec.id, region).is_some();
                // A start still in flight commits before an end proposed now (log order): if
                // the region is back, end it too, so that both commit before its answer (the
                // driver commits everything polled before answering). Should the start be
                // abandoned instead, the table refuses the end and nothing changes.
                if let (false, false, Some(deadline)) = (active, starting, deadline) {
                    out.push(TableCommand::Reclaim {
                        limit: spec.id.clone(),
                        region: region.clone(),
                        from_window: first_window_starting_at_or_after(window, deadline),
                    });
                } else if (active || starting) && !ending && self.has_returned(region, now) {
                    out.push(TableCommand::EndReclaim {
                        limit: spec.id.clone(),
                        region: region.clone(),
                    });
                }
            }
        }
    }

    /// The region was last heard on a version under which `limit` is strict with the closed
    /// policy (the table's, which the caller checked, or a kept one): it closes itself when its
    /// view expires. A region silent since before a reload to the closed policy may still be
    /// admitting under the old version's policy (floor, open, eventual) for as long as the
    /// reload takes to reach it, which the leader cannot know: its floor is not reclaimed.
    fn closes_when_silent(&self, limit: &LimitId, region: &RegionId) -> bool {
        let current = self.table.config_version();
        match self.region_view(region).config_version {
            Some(v) if v != current => self.kept_configs.closes_when_silent(v, limit),
            _ => true,
        }
    }

    /// Heard by this leader, no longer silent, and not removed (a region removed moments
    /// after it was heard is not silent yet, but will not be heard again).
    fn has_returned(&self, region: &RegionId, now: Timestamp) -> bool {
        self.regions.get(region).is_some_and(|v| v.heard)
            && !self.is_silent(region, now)
            && !self.table.is_removed(region)
    }

    /// A limit with a reclaim whose region is back: its floor must not be planned with until
    /// the reclaim's end is committed.
    fn reclaim_ending(&self, limit: &LimitId, now: Timestamp) -> bool {
        self.table
            .reclaims()
            .any(|((l, r), _)| l == limit && self.has_returned(r, now))
    }

    fn propose_rebalance(&self, now: Timestamp, out: &mut Vec<TableCommand>) {
        // A counter with a completion in this batch is planned next round, from its result.
        let taken: BTreeSet<ProposalKey> = out.iter().filter_map(proposal_key).collect();
        for (counter, view) in &self.counters {
            if taken.contains(&ProposalKey::Counter(counter.clone())) {
                continue;
            }
            if out.len() >= MAX_PROPOSALS_PER_POLL {
                return;
            }
            let Some(spec) = self.table.limit(&counter.limit) else {
                continue;
            };
            let planable = spec.consistency == Consistency::Strict
                && self.versions_agree()
                && !self.is_in_flight(&ProposalKey::Counter(counter.clone()))
                && !self.reclaim_ending(&counter.limit, now);
            if !planable || view.demand.is_empty() {
                continue;
            }
            if let Some(input) = self.plan_input(now, spec, counter, view) {
                self.push_actions(counter, plan_counter(&input).actions, out);
            }
        }
    }

    fn plan_input(
        &self,
        now: Timestamp,
        spec: &LimitSpec,
        counter: &CounterRef,
        view: &CounterView,
    ) -> Option<CounterPlanInput> {
        let Quota::Units { units, window } = spec.quota else {
            return None;
        };
        let time_left = time_left(window, counter.window, now)?;
        let regions = self.table.regions();
        let states = regions
            .iter()
            .map(|r| {
                let silent = self.is_silent(r, now);
                let demand = if silent {
                    0
                } else {
                    view.demand.get(r).map_or(0, |d| d.micro_units_per_sec)
                };
                let row = self.table.row(counter, r);
                let reclaimed = self
                    .table
                    .reclaim(&counter.limit, r)
                    .is_some_and(|rc| counter.window >= rc.from_window);
                RegionState {
                    region: r.clone(),
                    weight_ppm: spec.weights.share_ppm(r, regions),
                    default_units: spec.weights.default_allowance(r, regions, units),
                    used_units: view.used_units(r),
                    need_units: need_units(demand, time_left),
                    allowance_units: self.table.allowance(counter, r),
                    pending_release_units: row
                        .and_then(|row| row.pending.as_ref().map(|p| p.units)),
                    frozen: silent
                        || reclaimed
                        || self.table.is_removed(r)
                        || self.unconfirmed_below_default(counter, r),
                }
            })
            .collect();
        let handoff = self.cfg.sync_interval * RELEASE_HANDOFF_SYNC_INTERVALS;
        let current = window.index(now) == counter.window;
        Some(CounterPlanInput {
            quota_units: units,
            free_units: self.table.free_units(counter),
            hysteresis_units: self.cfg.rebalance_hysteresis_units,
            releases_useful: !current || window.remaining(now) >= handoff,
            regions: states,
        })
    }

    fn push_actions(
        &self,
        counter: &CounterRef,
        actions: Vec<PlanAction>,
        out: &mut Vec<TableCommand>,
    ) {
        // The whole plan of one round at once: its grows share the free quota between them
        // (one at a time, the first region in order would take every round's share), and the
        // counter is planned again only from the committed result of the whole batch, so no
        // two rounds count on the same free quota.
        let epoch_of = |region: &RegionId| self.table.epoch_of(counter, region);
        out.extend(actions.into_iter().map(|action| match action {
            PlanAction::Grow {
                region,
                allowance_units,
            } => TableCommand::Grow {
                counter: counter.clone(),
                expected_epoch: epoch_of(&region),
                region,
                allowance_units,
            },
            PlanAction::Release { region, units } => TableCommand::RequestRelease {
                counter: counter.clone(),
                expected_epoch: epoch_of(&region),
                region,
                units,
            },
        }));
    }

    /// How far from ours a member region's clock may read now: the largest clock uncertainty
    /// measured (`|offset| + rtt / 2`) plus the drift margin once every member has sent this
    /// leader a clock sample; the full reach ([`MAX_SKEW_REACH_WINDOWS`] windows of any limit,
    /// capped where it is used) while one has not. Windows are aligned on each region's own
    /// clock, so a window that ended on ours may still be a region's current one for this
    /// long: its rows, views and statistics are kept, and its reports taken. A new leader
    /// holds no samples (they are soft state): judging on the slack of the regions heard so
    /// far would collect the rows of a window that a region whose clock is behind is still
    /// in (leaving it enforcing a grant the table no longer holds), and forget its reports
    /// for good (the bound's figures of that window with them).
    fn clock_slack(&self) -> Duration {
        let mut widest = Duration::ZERO;
        for r in self.table.regions() {
            match self.regions.get(r).and_then(RegionView::clock_uncertainty) {
                Some(u) => widest = widest.max(u),
                None => return Duration::MAX,
            }
        }
        widest.saturating_add(self.cfg.drift_margin)
    }

    /// The first and last window of `limit` that some region may be in at `now` (our clock,
    /// widened by the regions' clock slack): a window before the first has ended on every
    /// region's clock, so only its measured terms (late settles, time open reported after a
    /// heal) can still grow. `None` for a limit without windows.
    pub fn live_window_range(
        &self,
        limit: &LimitId,
        now: Timestamp,
    ) -> Option<(WindowIndex, WindowIndex)> {
        let window = self.finite_window(limit)?;
        Some(self.live_windows(window, now))
    }

    /// The first and last window of `window` that some region may be in at `now` (our clock):
    /// its rows, views and statistics are kept, and its reports taken.
    fn live_windows(&self, window: Window, now: Timestamp) -> (WindowIndex, WindowIndex) {
        let slack = self.clock_slack();
        let last = window.index(now + slack.min(window.len() * MAX_SKEW_REACH_WINDOWS as u32));
        (first_live(window, now, slack), last)
    }

    /// Rows of windows that ended on every region's clock (ours less the clock slack, or the
    /// full reach while a member's clock is unknown, see `clock_slack`) are collected: late acks
    /// for them are then ignored, which only strands the released units.
    fn propose_gc(&self, now: Timestamp, out: &mut Vec<TableCommand>) {
        let mut oldest: BTreeMap<&LimitId, WindowIndex> = BTreeMap::new();
        for (counter, _) in self.table.counters() {
            let w = oldest.entry(&counter.limit).or_insert(counter.window);
            *w = (*w).min(counter.window);
        }
        for (limit, oldest_window) in oldest {
            let Some(window) = self.table.window_of(limit) else {
                continue;
            };
            let before = first_live(window, now, self.clock_slack());
            if oldest_window < before && !self.is_in_flight(&ProposalKey::Gc(limit.clone())) {
                out.push(TableCommand::CollectGarbage {
                    limit: limit.clone(),
                    before_window: before,
                });
            }
        }
    }

    /// Drop soft state of windows that have ended.
    fn forget_ended(&mut self, now: Timestamp) {
        let slack = self.clock_slack();
        for spec in self.table.limits() {
            if let Quota::Units { window, .. } = spec.quota {
                let first = first_live(window, now, slack);
                let mark = self
                    .forgotten_before
                    .entry(spec.id.clone())
                    .or_insert((window, first));
                *mark = if mark.0 == window {
                    (window, mark.1.max(first))
                } else {
                    (window, first)
                };
            }
        }
        let table = &self.table;
        let forgotten = &self.forgotten_before;
        let ended = |c: &CounterRef| match table.limit(&c.limit).map(|s| s.quota) {
            Some(Quota::Units { window, .. }) => {
                forgotten_mark(forgotten, &c.limit, window).is_some_and(|w| c.window < w)
            }
            _ => true,
        };
        self.counters.retain(|c, _| !ended(c));
        self.sent.retain(|(c, _), _| !ended(c));
        self.resend.retain(|(c, _)| !ended(c));
        self.acks.retain(|(c, _), _| !ended(c));
        self.confirmed.retain(|(c, _)| !ended(c));
        self.region_stats.retain(|(limit, w), _| {
            forgotten
                .get(limit)
                .is_some_and(|(_, f)| w.0 >= f.0.saturating_sub(STATS_WINDOWS_KEPT as u64))
        });
        self.forgotten_before
            .retain(|limit, _| self.table.limit(limit).is_some());
    }

    /// Near the end of a window, carry the demand of its hot counters over to the next one so
    /// that the next window's allocations are planned (and granted) before it starts.
    fn pre_issue(&mut self, now: Timestamp) {
        let mut carried: Vec<(CounterRef, BTreeMap<RegionId, DemandView>)> = Vec::new();
        for (counter, view) in &self.counters {
            let Some(window) = self.finite_window(&counter.limit) else {
                continue;
            };
            let current = window.index(now);
            let near_end = window.remaining(now) <= self.cfg.pre_issue_lead;
            let hot = view.demand.values().any(|d| d.micro_units_per_sec > 0);
            if counter.window == current && near_end && hot {
                let next = CounterRef {
                    window: current.next(),
                    ..counter.clone()
                };
                carried.push((next, view.demand.clone()));
            }
        }
        for (next, demand) in carried {
            if !self.track(now, &next) {
                continue;
            }
            if let Some(v) = self.counters.get_mut(&next) {
                // The latest demand of this window is the forecast for the next, until the
                // region reports on the next window itself.
                for (region, d) in demand {
                    let forecast = DemandView {
                        micro_units_per_sec: d.micro_units_per_sec,
                        allowance_units: 0,
                        carried: true,
                    };
                    let slot = v.demand.entry(region).or_insert(forecast);
                    if slot.carried {
                        *slot = forecast;
                    }
                }
            }
        }
    }

    /// The answer to `region`'s SyncUp `reply_to_seq`, from committed state only. Order of
    /// precedence within `MAX_ITEMS_PER_MESSAGE`: unconfirmed grants below the region's default
    /// (reclaimed zeroes; repeated in every answer until confirmed, since a region that missed
    /// one would enforce its default), release requests, other grants, then other regions'
    /// entries (round-robin over counters across answers).
    pub fn poll_sync_down(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        reply_to_seq: u64,
    ) -> SyncDown {
        let view = self.region_view(region);
        let mut budget = MAX_ITEMS_PER_MESSAGE;
        let (grants, release_requests) = self.grants_and_releases(now, region, &mut budget);
        for g in &grants {
            let key = (g.counter.clone(), region.clone());
            self.resend.remove(&key);
            self.sent.insert(key, (g.epoch, now));
        }
        let entries = self.entries_for(now, region, budget);
        SyncDown {
            reply_to_seq,
            leader_term: self.leader_term,
            received_at: view.last_received_at,
            sent_at: now,
            config_version: self.table.config_version(),
            entries,
            grants,
            release_requests,
            known_region: view.known_before_boot,
            config: None,
        }
    }

    fn grants_and_releases(
        &self,
        now: Timestamp,
        region: &RegionId,
        budget: &mut usize,
    ) -> (Vec<AllowanceGrant>, Vec<ReleaseRequest>) {
        let mut below_default = Vec::new();
        let mut releases = Vec::new();
        let mut grants = Vec::new();
        for (counter, rows) in self.table.counters() {
            // Rows start at the limit's epoch floor: one still at it is no news to the region.
            let floor = self.table.epoch_floor(&counter.limit);
            let Some(row) = rows.get(region) else {
                continue;
            };
            let key = (counter.clone(), region.clone());
            if let Some(p) = &row.pending {
                releases.push(ReleaseRequest {
                    id: p.id,
                    counter: counter.clone(),
                    units: p.units,
                    epoch: p.epoch,
                });
                // The row as it was just before the request (a request changes only the
                // epoch), unless sent: after a restart from an old copy of its state the
                // region must release from the row, not from an allowance it held earlier.
                // It leads the answer, so it is never cut while its release goes.
                let before = Epoch(p.epoch.0.saturating_sub(1));
                if before > floor && self.sent.get(&key).is_none_or(|(e, _)| *e < before) {
                    below_default.push(AllowanceGrant {
                        counter: counter.clone(),
                        region: region.clone(),
                        allowance_units: row.allowance_units,
                        epoch: before,
                    });
                }
                continue;
            }
            let sent = self.sent.get(&key);
            let unsent = sent.is_none_or(|(e, _)| *e < row.epoch);
            // A mismatch reported less than a sync interval after sending is most likely the
            // grant still in flight: resend only once it has had time to arrive.
            let overdue = sent
                .is_none_or(|(_, at)| now.saturating_duration_since(*at) >= self.cfg.sync_interval);
            let lost = self.resend.contains(&key) && overdue;
            let must_deliver = self.unconfirmed_below_default(counter, region);
            if row.epoch > floor && (unsent || lost || must_deliver) {
                let g = AllowanceGrant {
                    counter: counter.clone(),
                    region: region.clone(),
                    allowance_units: row.allowance_units,
                    epoch: row.epoch,
                };
                if must_deliver {
                    below_default.push(g)
                } else {
                    grants.push(g)
                }
            }
        }
        below_default.truncate(*budget);
        *budget -= below_default.len();
        releases.truncate(*budget);
        *budget -= releases.len();
        grants.truncate(*budget);
        *budget -= grants.len();
        below_default.extend(grants);
        (below_default, releases)
    }

    /// Every region's entries, `region`'s own included (it recovers them by max after a start
    /// from an old copy of its state), for the counters it takes part in: every tracked
    /// counter of a live window (a mentioned counter is reported from then on, so every
    /// region's use of an escalated key becomes known). A counter goes whole or waits for the
    /// next answer: the region trusts its view of a counter once it got its entries. The
    /// counters the region's last SyncUp carried go first (it is using them), then the others
    /// round-robin across answers, so no counter starves when there are more than fit.
    fn entries_for(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        budget: usize,
    ) -> Vec<CounterEntry> {
        let first = self.carried.remove(region).unwrap_or_default();
        let mut out = Vec::new();
        for counter in &first {
            if !self.push_counter_entries(now, counter, budget, &mut out) {
                break;
            }
        }
        let order: Vec<&CounterRef> = match self.entry_cursor.get(region) {
            Some(c) => self
                .counters
                .range((RangeBound::Excluded(c), RangeBound::Unbounded))
                .chain(self.counters.range(..=c))
                .map(|(k, _)| k)
                .collect(),
            None => self.counters.keys().collect(),
        };
        let mut last_fitted = None;
        for counter in order {
            if first.binary_search(counter).is_ok() {
                continue;
            }
            if !self.push_counter_entries(now, counter, budget, &mut out) {
                break;
            }
            last_fitted = Some(counter.clone());
        }
        if let Some(c) = last_fitted {
            self.entry_cursor.insert(region.clone(), c);
        }
        out
    }

    /// Appends every entry held for `counter`, if tracked and of a live window. False when they
    /// do not fit in `budget` (nothing appended).
    fn push_counter_entries(
        &self,
        now: Timestamp,
        counter: &CounterRef,
        budget: usize,
        out: &mut Vec<CounterEntry>,
    ) -> bool {
        let live = self
            .finite_window(&counter.limit)
            .is_some_and(|w| counter.window >= self.live_windows(w, now).0);
        let Some(view) = self.counters.get(counter).filter(|_| live) else {
            return true;
        };
        if out.len() + view.reporters.len() > budget {
            return false;
        }
        for r in view.reporting_regions() {
            let (granted_units, refunded_units) = view.entry(r);
            out.push(CounterEntry {
                counter: counter.clone(),
                region: r.clone(),
                granted_units,
                refunded_units,
            });
        }
        true
    }

    /// The bound of `limit` for `window` (every key: see [`Coordinator::bound_inputs`]), from
    /// the leader's views and what the regions reported. `None` for an unknown limit. A window
    /// that ended before this leader started is stated unbounded: this leader did not watch
    /// it (an earlier one may have, and bounded it; docs/bound.md), and only the terms the
    /// regions still report are known to it.
    pub fn bound(&self, now: Timestamp, limit: &LimitId, window: WindowIndex) -> Option<Bound> {
        let spec = self.table.limit(limit)?;
        let mut inputs = self.bound_inputs(now, limit, window, None);
        let unknown = self.reload_inputs(limit, window, &mut inputs);
        let mut b = bound(spec, window, &inputs);
        if let Some(why) = unknown.or_else(|| self.clamped_settles(limit, window)) {
            b.unbounded = Some(why);
        }
        if let Some(w) = self.finite_window(limit)
            && w.end(window) <= self.started_at
        {
            b.unbounded = Some(format!(
                "the window ended before this leader started (at {:?})",
                self.started_at
            ));
        }
        Some(b)
    }

    /// Measurements for [`crate::rebalance::bound::bound`]: from the leader, allowances (per
    /// key if `key` is given, else the largest over keys) of the window and of those a
    /// region's clock may put inside it, clock uncertainties, partitioned regions and their
    /// last seen use; from the regions' reports, time open, settle overage and peak grant
    /// rates. A region silent under the open policy may be admitting right now: its time open
    /// also counts from its last report on (`live_time_open`). A region this leader first
    /// heard after the window started may have been partitioned, and open, from the window's
    /// start until then: it counts as partitioned (last seen use 0) for the window.
    pub fn bound_inputs(
        &self,
        now: Timestamp,
        limit: &LimitId,
        window: WindowIndex,
        key: Option<&KeyId>,
    ) -> BoundInputs {
        let regions = self.table.regions().to_vec();
        let mut inputs = BoundInputs::new(regions.clone(), self.cfg.view_ttl);
        for r in &regions {
            let view = self.region_view(r);
            if let Some(c) = view.clock {
                inputs.clock_offset_nanos.insert(r.clone(), c.offset_nanos);
                inputs
                    .round_trip_nanos
                    .insert(r.clone(), c.round_trip_nanos);
            }
            if self.guarded_through(limit, window, &view) {
                inputs.clock_guarded.insert(r.clone());
            }
            inputs
                .allowance_units
                .insert(r.clone(), self.largest_allowance(limit, window, key, r));
            inputs.neighbour_allowance_units.insert(
                r.clone(),
                self.neighbour_allowances(limit, window, key, r, &view),
            );
            if self.unheard_in(limit, window, &view) {
                inputs.partitioned.insert(r.clone(), 0);
            } else if self.is_silent(r, now) || view.view_expired {
                // Silent, or heard but admitting by its partition policy (its answers are
                // lost): either way the others do not see what it may still admit up to its
                // floor.
                let last_seen = key.map_or(0, |k| {
                    let c = CounterRef {
                        limit: limit.clone(),
                        key: k.clone(),
                        window,
                    };
                    self.used_units(&c, r).unwrap_or(0)
                });
                inputs.partitioned.insert(r.clone(), last_seen);
            }
            self.add_region_stats(now, limit, window, r, &mut inputs);
        }
        inputs
    }

    /// The region kept its edge band on a corrected clock through all of `window` (docs/bound.md,
    /// skew): its guard began, on our clock, at least its maximum uncertainty plus one window
    /// before the window did (a lease granted before the guard ends within a window).
    fn guarded_through(&self, limit: &LimitId, window: WindowIndex, view: &RegionView) -> bool {
        let (Some(g), Some(w)) = (view.clock_guard, self.finite_window(limit)) else {
            return false;
        };
        g.since + g.max_uncertainty + w.len() <= w.start(window)
    }

    /// While regions report different configuration versions: what each may enforce under the
    /// version it reports (docs/bound.md, reload). Returns why the window is unbounded when a
    /// region reports a version this leader does not know, or one under which the limit
    /// admits everything.
    ///
    /// A region that switched versions counts under both for the windows its clock may have
    /// reached before it switched (`admitted_under_previous`): a region whose clock is ahead
    /// admitted, under the old version, in windows that start on ours after the reload; one
    /// whose clock is behind admits, under the new version, in windows that started (and may
    /// have ended) on ours before it. The term is taken against the smaller of the table's
    /// quota and the one in force when the window started on our clock: a window that started
    /// under a smaller quota is judged against it.
    fn reload_inputs(
        &self,
        limit: &LimitId,
        window: WindowIndex,
        inputs: &mut BoundInputs,
    ) -> Option<String> {
        let under_previous: Vec<Option<u64>> = self
            .table
            .regions()
            .iter()
            .map(|r| self.admitted_under_previous(limit, window, r))
            .collect();
        if self.versions_agree() && under_previous.iter().all(Option::is_none) {
            return None;
        }
        let current = self.table.config_version();
        inputs.reload_quota_units = self
            .finite_window(limit)
            .and_then(|w| self.kept_configs.quota_units_at(limit, w, w.start(window)));
        for (r, previous) in self.table.regions().iter().zip(under_previous) {
            let version = self.region_view(r).config_version.unwrap_or(current);
            let mut units = 0u64;
            for v in std::iter::once(version).chain(previous) {
                let held = if v == current {
                    Held::Units(self.largest_allowance(limit, window, None, r))
                } else {
                    self.kept_configs.held(v, limit, r)
                };
                match held {
                    Held::Units(u) => units = units.max(u),
                    Held::Unmetered => {
                        return Some(format!("{r} enforces version {v}, unmetered there"));
                    }
                    Held::UnknownVersion => {
                        return Some(format!("{r} reports version {v}, unknown here"));
                    }
                }
            }
            inputs.reload_held_units.insert(r.clone(), units);
        }
        None
    }

    /// The version `region` enforced before its current one, if its clock may have put
    /// `window` (of `limit`) in progress while it still did: the window starts (on our clock)
    /// before we first heard the new version plus the region's clock uncertainty and the
    /// drift margin (the full reach while its clock is unknown).
    fn admitted_under_previous(
        &self,
        limit: &LimitId,
        window: WindowIndex,
        region: &RegionId,
    ) -> Option<u64> {
        let view = self.regions.get(region)?;
        let previous = view.previous_version?;
        let w = self.finite_window(limit)?;
        let uncertainty = previous
            .uncertainty_at_switch
            .map(|then| then.max(view.clock_uncertainty().unwrap_or(Duration::ZERO)));
        let reach = uncertainty
            .map_or(Duration::MAX, |u| u.saturating_add(self.cfg.drift_margin))
            .min(w.len() * MAX_SKEW_REACH_WINDOWS as u32);
        (w.start(window) < previous.switched_at + reach).then_some(previous.version)
    }

    /// Why the window is unbounded when a region clamped settles in it: units a spender used
    /// beyond the settle cap that the `settle_overage` term rests on, charged nowhere.
    fn clamped_settles(&self, limit: &LimitId, window: WindowIndex) -> Option<String> {
        let by_region = self.region_stats.get(&(limit.clone(), window))?;
        let (region, figures) = by_region.iter().find(|(_, f)| f.settle_clamped_units > 0)?;
        Some(format!(
            "{region} clamped {} settled units above the settle cap (used, not charged)",
            figures.settle_clamped_units
        ))
    }

    /// The window started before this leader first heard the region: what it did from the
    /// window's start until then is unknown here.
    fn unheard_in(&self, limit: &LimitId, window: WindowIndex, view: &RegionView) -> bool {
        let Some(w) = self.finite_window(limit) else {
            return false;
        };
        view.first_heard_at.is_none_or(|h| w.start(window) < h)
    }

    /// The allowances of the windows `region`'s clock may put inside `window` (docs/bound.md,
    /// skew): those within its reach either side, or, with its clock unknown, every window the
    /// table holds for it and its default twice (any two windows may be the ones).
    fn neighbour_allowances(
        &self,
        limit: &LimitId,
        window: WindowIndex,
        key: Option<&KeyId>,
        region: &RegionId,
        view: &RegionView,
    ) -> Vec<u64> {
        let Some(w) = self.finite_window(limit) else {
            return Vec::new();
        };
        let allowance = |i: u64| self.largest_allowance(limit, WindowIndex(i), key, region);
        let reach = skew_reach_windows(view.clock_uncertainty(), w.len())
            .filter(|r| *r <= MAX_SKEW_REACH_WINDOWS);
        match reach {
            Some(reach) => {
                let below = window.0.saturating_sub(reach)..window.0;
                let above = window.0.saturating_add(1)..=window.0.saturating_add(reach);
                below.chain(above).map(allowance).collect()
            }
            None => {
                let any_key = CounterRef {
                    limit: limit.clone(),
                    key: key.cloned().unwrap_or_else(|| KeyId::from("")),
                    window,
                };
                let default = self.table.default_allowance(&any_key, region);
                // Per window, the largest over keys (one key's windows are what a clock moves).
                let mut by_window: BTreeMap<WindowIndex, u64> = BTreeMap::new();
                let rows = self
                    .table
                    .counters()
                    .filter(|(c, _)| &c.limit == limit && c.window != window)
                    .filter(|(c, _)| key.is_none_or(|k| &c.key == k));
                for (c, rows) in rows {
                    if let Some(row) = rows.get(region) {
                        let slot = by_window.entry(c.window).or_default();
                        *slot = (*slot).max(row.allowance_units);
                    }
                }
                let mut held: Vec<u64> = by_window.into_values().collect();
                held.extend([default, default]);
                held
            }
        }
    }

    fn add_region_stats(
        &self,
        now: Timestamp,
        limit: &LimitId,
        window: WindowIndex,
        region: &RegionId,
        inputs: &mut BoundInputs,
    ) {
        let reported = self
            .region_stats
            .get(&(limit.clone(), window))
            .and_then(|by_region| by_region.get(region))
            .copied()
            .unwrap_or_default();
        let live = self.live_time_open(now, limit, window, region);
        if reported.peak_grant_units_per_sec > 0 {
            inputs
                .peak_rate_units_per_sec
                .insert(region.clone(), reported.peak_grant_units_per_sec);
        }
        let stats = RegionBoundStats {
            time_open: reported.time_open + live,
            settle_overage_units: reported.settle_overage_units,
        };
        if stats != RegionBoundStats::default() {
            inputs.stats.insert(region.clone(), stats);
        }
    }

    /// Time a region may have been open in `window` (open policy) that it has not reported:
    /// while silent, since we last heard it less its round trip (a bound on the delay of that
    /// report, as docs/bound.md assumes; the view TTL before any sample), up to now; and from
    /// the window's start until this leader first heard it (before that, nothing is known).
    fn live_time_open(
        &self,
        now: Timestamp,
        limit: &LimitId,
        window: WindowIndex,
        region: &RegionId,
    ) -> Duration {
        let open = self
            .table
            .limit(limit)
            .is_some_and(|s| matches!(s.partition_policy, PartitionPolicy::Open { .. }));
        let Some(w) = self.finite_window(limit).filter(|_| open) else {
            return Duration::ZERO;
        };
        let view = self.region_view(region);
        let to = now.min(w.end(window));
        let unknown_until = view.first_heard_at.map_or(to, |h| h.min(to));
        let unknown = unknown_until.saturating_duration_since(w.start(window));
        if view.first_heard_at.is_none() || !self.is_silent(region, now) {
            return unknown;
        }
        let delay = view.clock.map_or(self.cfg.view_ttl, |c| {
            Duration::from_nanos(c.round_trip_nanos)
        });
        let from = (view.last_heard - delay).max(w.start(window));
        unknown + to.saturating_duration_since(from)
    }

    fn largest_allowance(
        &self,
        limit: &LimitId,
        window: WindowIndex,
        key: Option<&KeyId>,
        region: &RegionId,
    ) -> u64 {
        let any_key = CounterRef {
            limit: limit.clone(),
            key: key.cloned().unwrap_or_else(|| KeyId::from("")),
            window,
        };
        let default = self.table.default_allowance(&any_key, region);
        if key.is_some() {
            return self.table.allowance(&any_key, region);
        }
        self.table
            .counters()
            .filter(|(c, _)| &c.limit == limit && c.window == window)
            .filter_map(|(_, rows)| rows.get(region).map(|row| row.allowance_units))
            .fold(default, u64::max)
    }
}

/// Time the counter's window still has, or all of it for a window yet to start; `None` for a
/// window already over.
fn time_left(window: Window, counter_window: WindowIndex, now: Timestamp) -> Option<Duration> {
    let current = window.index(now);
    if counter_window == current {
        Some(window.remaining(now))
    } else if counter_window > current {
        Some(window.len())
    } else {
        None
    }
}

/// `ceil(rate * time)` in units, of a rate in millionths of a unit per second.
pub(super) fn need_units(micro_units_per_sec: u64, time: Duration) -> u64 {
    let nanos = u128::from(duration_nanos(time));
    // At most 1.8e19 * 3.2e16 (a year of nanoseconds): far inside u128.
    let need = (u128::from(micro_units_per_sec) * nanos)
        .div_ceil(crate::sync::MICRO_UNITS_PER_UNIT * 1_000_000_000);
    u64::try_from(need).unwrap_or(u64::MAX)
}

/// The forgotten-before mark of `limit`, if it was taken with windows of `window`'s length.
fn forgotten_mark(
    marks: &BTreeMap<LimitId, (Window, WindowIndex)>,
    limit: &LimitId,
    window: Window,
) -> Option<WindowIndex> {
    marks
        .get(limit)
        .filter(|(w, _)| *w == window)
        .map(|(_, i)| *i)
}

/// The oldest window some region may still be in: the one `slack` ago on our clock, at most
/// [`MAX_SKEW_REACH_WINDOWS`] windows back.
fn first_live(window: Window, now: Timestamp, slack: Duration) -> WindowIndex {
    let reach = slack.min(window.len() * MAX_SKEW_REACH_WINDOWS as u32);
    window.index(now.saturating_sub(reach))
}

fn first_window_starting_at_or_after(window: Window, t: Timestamp) -> WindowIndex {
    let idx = window.index(t);
    if window.start(idx) < t {
        idx.next()
    } else {
        idx
    }
}
