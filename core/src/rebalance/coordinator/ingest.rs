//! Ingest: what comes in. A region's SyncUp (entries merged by max, demand, acks, clock sample,
//! bound figures) and each committed command, applied to the leader's copy of the table.

use crate::budget::config::STATS_WINDOWS_KEPT;
use crate::error::{Error, Result};
use crate::ids::{LimitId, RegionId};
use crate::rebalance::table::{AllowanceRow, AllowanceTable, ApplyOutcome, TableCommand};
use crate::rebalance::views::{CounterView, DemandView, PreviousVersion, RegionView};
use crate::sync::{
    CounterEntry, CounterRef, LimitWindowStats, MAX_ITEMS_PER_MESSAGE, ReleaseAck, SyncUp,
};
use crate::time::{Timestamp, WindowIndex};

use super::{Coordinator, ProposalKey, forgotten_mark, proposal_key};

impl Coordinator {
    /// Record one SyncUp. Old or duplicated messages are harmless: entries merge by max,
    /// acks are matched by id, and demand is taken only from a newer message: a larger
    /// `(boot, seq)`. A later boot (a larger one, or any other that says `restored`:
    /// `RegionView::is_later_boot`) is a restart, perhaps from an old copy of the region's
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
        let mut msg = self.with_table_ids(msg);
        let started_at = self.started_at;
        let known = self.known_before(&msg);
        let sample = self.on_my_clock(msg.clock, msg.clock_leader_term);
        let recorded = self.table.recorded_version(&msg.region);
        let view = self
            .regions
            .entry(msg.region.clone())
            .or_insert_with(|| RegionView::new(started_at));
        let restarted = view.is_later_boot(msg.boot, msg.restored);
        let newer = view.is_newer(msg.boot, msg.restored, msg.seq);
        // A restored boot has no sample of its own before its first answer (its SyncUps say
        // `restored` until then): one this leader holds for a region it has not heard yet was
        // adopted from an earlier leader's frame, and is of a boot before.
        let adopted_of_earlier_boot = msg.restored && view.last_seq.is_none();
        // Even a late message proves the region answers: its view is aged from the message's
        // own send time, which is before now, so hearing it "now" is never optimistic.
        view.last_heard = view.last_heard.max(now);
        view.heard = true;
        view.first_heard_at.get_or_insert(now);
        if newer {
            if restarted {
                view.retire_boot();
            }
            view.last_reading = Some(if restarted {
                msg.sent_at
            } else {
                view.last_reading
                    .map_or(msg.sent_at, |r| r.max(msg.sent_at))
            });
            view.boot = msg.boot;
            view.last_seq = Some(msg.seq);
            view.last_received_at = now;
            // A restarted agent reads the wall clock again (D73): a region that ran on a
            // corrected clock restarts on its own, and any region's clock may have stepped
            // while it ran (unseen then) or while it was down. The sample of the clock it had
            // no longer describes it: until the next, its clock is unknown (swarm seed
            // 3377321: a region restarted 1.2 s behind the clock the leader had sampled, and
            // the leader collected the window it was still in).
            if restarted || adopted_of_earlier_boot {
                view.retire_clock(now);
            }
            if sample.is_some() {
                view.clock = sample;
                view.clock_taken_at = now;
            }
            view.restored = msg.restored;
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
            } else if let Some(old) = recorded
                && view.config_version.is_none()
                && old != msg.config_version
            {
                // An earlier leader heard it on `old`; it switched since, at a moment unknown
                // here but before now: every window its clock may have reached by now counts
                // under `old` too, its clock's reach taken as it is measured now (as for a
                // switch this leader hears as it happens).
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
        let mut trackable = TrackableMemo::default();
        // The table's row of each entry's counter for the region, as `merge_entry` found it
        // (the table does not change while a SyncUp is taken): `record_demand` reads the same
        // row for a counter's demand, mostly at the same position.
        let mut rows_seen = Vec::with_capacity(msg.entries.len().min(MAX_ITEMS_PER_MESSAGE));
        for e in msg.entries.iter_mut().take(MAX_ITEMS_PER_MESSAGE) {
            rows_seen.push(if e.region == msg.region {
                Some(self.merge_entry(now, &mut trackable, e))
            } else {
                None
            });
        }
        if newer {
            self.record_demand(now, &mut trackable, &rows_seen, &mut msg);
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

    /// `msg` naming its limits and regions by the table's own ids (the same strings): the
    /// leader's maps then hold one copy of each, which a comparison tells equal by address
    /// without reading it; with a copy per message every key comparison read two strings from
    /// scattered memory, the larger part of ingesting a SyncUp (docs/benchmarks.md, "Leader
    /// cost per sync round"). Ids the table lacks stay as they came.
    fn with_table_ids(&self, mut msg: SyncUp) -> SyncUp {
        let table = &self.table;
        let share_limit = |limit: &mut LimitId| {
            if let Some(id) = table.limit_id(limit) {
                *limit = id.clone();
            }
        };
        let share_region = |region: &mut RegionId| {
            if let Some(id) = table.region_id(region) {
                *region = id.clone();
            }
        };
        // A tracked counter is named by its view's own ids (its key the same way).
        let share_counter = |counter: &mut CounterRef| {
            share_limit(&mut counter.limit);
            if let Some((id, _)) = self.counters.get_key_value(counter) {
                *counter = id.clone();
            }
        };
        share_region(&mut msg.region);
        // The counters of entries and demand take their view's ids where they are looked up
        // (`tracked_view`), with the same search.
        for e in msg.entries.iter_mut().take(MAX_ITEMS_PER_MESSAGE) {
            share_limit(&mut e.counter.limit);
            share_region(&mut e.region);
        }
        for d in msg.demand.iter_mut().take(MAX_ITEMS_PER_MESSAGE) {
            share_limit(&mut d.counter.limit);
        }
        for a in msg.release_acks.iter_mut().take(MAX_ITEMS_PER_MESSAGE) {
            share_counter(&mut a.counter);
        }
        for st in msg.stats.iter_mut().take(MAX_ITEMS_PER_MESSAGE) {
            share_limit(&mut st.limit);
        }
        msg
    }

    /// Merges a region's entry of a tracked counter. The counter is planned again when the
    /// region's use becomes known, reaches its allowance, or has moved by the replan threshold
    /// since the last plan (use that follows the forecast moves the plan only by what the
    /// forecast missed: `schedule.rs`).
    /// Untracked counters are tracked first if they may be (`track`). Returns what the table's
    /// row of the entry's counter and region holds.
    fn merge_entry(
        &mut self,
        now: Timestamp,
        trackable: &mut TrackableMemo,
        e: &mut CounterEntry,
    ) -> Option<RowFacts> {
        let row = self.table.row(&e.counter, &e.region);
        let facts = row.map(RowFacts::of);
        let allowance = self.table.allowance_of(&e.counter, &e.region, row);
        let threshold = self.replan_threshold(&e.counter.limit);
        let Some(v) = self.tracked_view(now, trackable, &mut e.counter) else {
            return facts;
        };
        let first = !v.reporters.contains(&e.region);
        let before = v.used_units(&e.region);
        v.merge(e);
        let after = v.used_units(&e.region);
        v.drift_units = v.drift_units.saturating_add(after.abs_diff(before));
        let reached = before < allowance && after >= allowance;
        if first || reached || v.drift_units >= threshold {
            self.schedule.mark(&e.counter);
        }
        facts
    }

    /// For the first message of a boot: whether this leader knew the region before it (an
    /// earlier boot heard, a row of its table, or an entry of a counter it tracks), so that a
    /// region that found its store empty learns whether it lost it. `None` for other
    /// messages. Scans the table and the tracked counters once a boot.
    fn known_before(&self, msg: &SyncUp) -> Option<bool> {
        let view = self.regions.get(&msg.region);
        let first_of_boot = view.is_none_or(|v| {
            v.is_later_boot(msg.boot, msg.restored)
                || (v.last_seq.is_none() && v.is_newer(msg.boot, msg.restored, msg.seq))
        });
        if !first_of_boot {
            return None;
        }
        // A boot heard before this one, by this leader or (adopted) by an earlier one.
        let earlier_boot =
            view.is_some_and(|v| v.last_seq.is_some() || (v.boot != 0 && v.boot != msg.boot));
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
        for ((_, r), view) in self.rows.iter_mut() {
            if r == region {
                view.sent = None;
                view.confirmed = false;
                view.resend = false;
                view.ack_of_earlier_boot = view.ack.is_some();
            }
        }
        let rows: Vec<CounterRef> = self
            .table
            .counters()
            .filter(|(_, rows)| rows.contains_key(region))
            .map(|(c, _)| c.clone())
            .collect();
        for c in rows {
            self.attend(&c, region);
        }
        // Confirmations are gone: every plan reading them is planned again.
        self.schedule.mark_all();
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

    /// `rows_seen[i]`: the table's row for `msg.entries[i]`, if `merge_entry` read it.
    fn record_demand(
        &mut self,
        now: Timestamp,
        trackable: &mut TrackableMemo,
        rows_seen: &[Option<Option<RowFacts>>],
        msg: &mut SyncUp,
    ) {
        let SyncUp {
            region,
            entries,
            demand,
            config_version,
            ..
        } = msg;
        let region = &*region;
        // The allowance a region reports was set under its version: against the table's
        // rows it confirms (or shows lost) nothing unless the two agree, since a region
        // applies no grant of another version. A zero it ignored there must still lead the
        // answers once it switches (swarm seed 954).
        let same_version = *config_version == self.table.config_version();
        let demand = demand.iter_mut().take(MAX_ITEMS_PER_MESSAGE).enumerate();
        for (i, d) in demand {
            // The entry at the same position mostly names the same counter, by the copy of
            // its key that `merge_entry` took from the view: sharing it makes every lookup
            // below compare keys by address, not read the stored strings again.
            if let Some(e) = entries.get(i)
                && e.counter == d.counter
            {
                d.counter = e.counter.clone();
            }
            let Some(v) = self.tracked_view(now, trackable, &mut d.counter) else {
                continue;
            };
            let old = v.demand.insert(
                region.clone(),
                DemandView {
                    micro_units_per_sec: d.demand_micro_units_per_sec,
                    allowance_units: d.allowance_units,
                    carried: false,
                },
            );
            if old
                .is_none_or(|o| o.carried || o.micro_units_per_sec != d.demand_micro_units_per_sec)
            {
                self.schedule.mark(&d.counter);
            }
            if !same_version {
                continue;
            }
            // The entry at the same position read the same row, if it names the same counter
            // (only a fast path: else the row is looked up).
            let seen = rows_seen.get(i).copied().flatten().filter(|_| {
                entries
                    .get(i)
                    .is_some_and(|e| e.counter == d.counter && e.region == *region)
            });
            let row = match seen {
                Some(facts) => facts,
                None => self.table.row(&d.counter, region).map(RowFacts::of),
            };
            let lost_grant =
                row.is_some_and(|row| row.no_pending && row.allowance_units != d.allowance_units);
            let at_most_row = row.is_some_and(|row| d.allowance_units <= row.allowance_units);
            let below_default = row.is_some_and(|row| {
                row.allowance_units < self.table.configured_default(&d.counter, region)
            });
            if at_most_row || lost_grant {
                let view = self.row_view_mut(&d.counter, region);
                // Only a row below the default is frozen until confirmed (the plan reads it).
                let newly_confirmed = at_most_row && !view.confirmed && below_default;
                view.confirmed |= at_most_row;
                view.resend = lost_grant;
                if newly_confirmed {
                    self.schedule.mark(&d.counter);
                }
                if lost_grant {
                    self.attend(&d.counter, region);
                }
            } else if let Some(view) = self.rows.get_mut(&(d.counter.clone(), region.clone())) {
                view.resend = false;
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
            let view = self.row_view_mut(&ack.counter, region);
            view.ack = Some(ack.clone());
            view.ack_of_earlier_boot = false;
            self.acked.insert((ack.counter.clone(), region.clone()));
        }
    }

    /// Starts tracking `counter` if there is room and it is worth tracking; true if tracked.
    pub(super) fn track(&mut self, now: Timestamp, counter: &CounterRef) -> bool {
        if self.counters.contains_key(counter) {
            return true;
        }
        if !self.may_track(now, &counter.limit, counter.window)
            || self.counters.len() >= self.cfg.max_tracked_counters
        {
            return false;
        }
        self.counters
            .insert(counter.clone(), CounterView::default());
        true
    }

    /// A counter of `limit` and `window` is worth tracking at `now`: a finite window some
    /// region may still be in (or the next), not forgotten.
    fn may_track(&self, now: Timestamp, limit: &LimitId, window: WindowIndex) -> bool {
        let Some(length) = self.finite_window(limit) else {
            return false;
        };
        let (first, last) = self.live_windows(length, now);
        let forgotten =
            forgotten_mark(&self.forgotten_before, limit, length).is_some_and(|w| window < w);
        !forgotten && window >= first && window <= last.next()
    }

    /// As `track`, then the view of `counter`, with `counter` swapped for the view's own ids
    /// (so that every map shares one copy of them): one search of the views where `track`, the
    /// swap and the view took one each (docs/benchmarks.md, "Leader cost per sync round").
    fn tracked_view(
        &mut self,
        now: Timestamp,
        trackable: &mut TrackableMemo,
        counter: &mut CounterRef,
    ) -> Option<&mut CounterView> {
        let room = self.counters.len() < self.cfg.max_tracked_counters;
        let may_track = room && trackable.get(counter, |l, w| self.may_track(now, l, w));
        self.counters
            .get_sharing_key(counter, || may_track.then(CounterView::default))
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
            } => {
                let key = (counter.clone(), region.clone());
                self.acked.remove(&key);
                // An ack of an earlier boot completes the release but confirms nothing.
                self.rows
                    .get_mut(&key)
                    .and_then(|v| v.ack.take().filter(|_| !v.ack_of_earlier_boot))
            }
            _ => None,
        };
        let before = matches!(cmd, TableCommand::SetConfig { .. }).then(|| self.table.clone());
        let confirmed = self.confirmed_rows(cmd);
        let outcome = self.table.apply(cmd.clone());
        if outcome.is_applied() {
            self.unconfirm_lowered(confirmed);
        }
        if let (Some(ack), true) = (ack, outcome.is_applied()) {
            self.confirm_from_ack(&ack, cmd);
        }
        if let (Some(before), true) = (before, outcome.is_applied()) {
            self.kept_configs.remember(&before, now);
            self.forget_dropped_rows(&before);
        }
        if outcome.is_applied() {
            self.note_applied(cmd);
        } else if let Some(ProposalKey::Counter(c)) = proposal_key(cmd) {
            // Refused (a stale epoch, the quota taken meanwhile): planned again from the table.
            self.schedule.mark(&c);
        }
        outcome
    }

    /// What an applied command changes for the rounds and answers to come: a row command
    /// replans its counter and may have something to send; a command that may touch any row
    /// or every plan (reclaims, configuration, membership) replans every counter.
    fn note_applied(&mut self, cmd: &TableCommand) {
        match cmd {
            TableCommand::Grow {
                counter, region, ..
            }
            | TableCommand::RequestRelease {
                counter, region, ..
            }
            | TableCommand::CompleteRelease {
                counter, region, ..
            } => {
                // A grow or a release request applied is what the plan wanted: planning again
                // from the same inputs proposes nothing. A completion frees quota that the
                // plan's grows were waiting for.
                if matches!(cmd, TableCommand::CompleteRelease { .. }) {
                    self.schedule.mark(counter);
                }
                self.attend(counter, region);
                if self
                    .gc_checked
                    .get(&counter.limit)
                    .is_some_and(|w| counter.window < *w)
                {
                    self.gc_checked.remove(&counter.limit);
                }
            }
            // A record changes no plan: this leader reads the versions of the regions it
            // heard from their views.
            TableCommand::CollectGarbage { .. } | TableCommand::RecordVersion { .. } => {}
            TableCommand::SetConfig { .. }
            | TableCommand::Reclaim { .. }
            | TableCommand::EndReclaim { .. }
            | TableCommand::RemoveRegion { .. }
            | TableCommand::RestoreRegion { .. } => {
                self.schedule.mark_all();
                self.attend_all();
                self.gc_checked.clear();
                self.forget_due = true;
            }
        }
    }

    /// After a configuration change: what was sent, confirmed or acked for rows the table
    /// dropped belongs to the old parameters, and so does what was for a row it kept under a
    /// limit whose allocation changed (its epoch floor moved): regions dropped their grants
    /// of it too, so a confirmation of the old row says nothing of what they hold now.
    fn forget_dropped_rows(&mut self, before: &AllowanceTable) {
        let table = &self.table;
        let kept = |(c, r): &(CounterRef, RegionId)| {
            table.row(c, r).is_some() && table.epoch_floor(&c.limit) == before.epoch_floor(&c.limit)
        };
        self.rows.retain(|k, _| kept(k));
        self.acked.retain(kept);
    }

    /// The confirmed rows `cmd` may lower, with their allowances before it: a confirmation
    /// says the region enforces at most the row as it was, not as a command leaves it.
    fn confirmed_rows(&self, cmd: &TableCommand) -> Vec<((CounterRef, RegionId), u64)> {
        let confirmed_allowance = |key: &(CounterRef, RegionId)| {
            self.rows.get(key).filter(|v| v.confirmed)?;
            Some((key.clone(), self.table.allowance(&key.0, &key.1)))
        };
        match cmd {
            TableCommand::CompleteRelease {
                counter, region, ..
            } => confirmed_allowance(&(counter.clone(), region.clone()))
                .into_iter()
                .collect(),
            // A grow only raises its row and a request changes only its epoch: on the hot
            // path, nothing to look up.
            TableCommand::Grow { .. }
            | TableCommand::RequestRelease { .. }
            | TableCommand::CollectGarbage { .. }
            | TableCommand::RecordVersion { .. } => Vec::new(),
            // Rare, and they may touch any row.
            TableCommand::SetConfig { .. }
            | TableCommand::Reclaim { .. }
            | TableCommand::EndReclaim { .. }
            | TableCommand::RemoveRegion { .. }
            | TableCommand::RestoreRegion { .. } => {
                self.rows.keys().filter_map(confirmed_allowance).collect()
            }
        }
    }

    fn unconfirm_lowered(&mut self, confirmed: Vec<((CounterRef, RegionId), u64)>) {
        for (key, was_units) in confirmed {
            if self.table.allowance(&key.0, &key.1) < was_units
                && let Some(view) = self.rows.get_mut(&key)
            {
                view.confirmed = false;
            }
        }
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
            self.row_view_mut(counter, region).confirmed = true;
        }
    }
}

/// `Coordinator::may_track` of the last limit and window asked, within one SyncUp (one `now`,
/// one set of clock samples): a message's counters are mostly of one limit and window, and
/// whether they may be tracked is asked before each is looked up.
#[derive(Default)]
struct TrackableMemo(Option<(LimitId, WindowIndex, bool)>);

impl TrackableMemo {
    fn get(
        &mut self,
        counter: &CounterRef,
        may_track: impl FnOnce(&LimitId, WindowIndex) -> bool,
    ) -> bool {
        match &self.0 {
            Some((limit, window, may)) if *limit == counter.limit && *window == counter.window => {
                *may
            }
            _ => {
                let may = may_track(&counter.limit, counter.window);
                self.0 = Some((counter.limit.clone(), counter.window, may));
                may
            }
        }
    }
}

/// What `record_demand` reads of a table row: its allowance, and whether a release is pending.
#[derive(Clone, Copy)]
struct RowFacts {
    allowance_units: u64,
    no_pending: bool,
}

impl RowFacts {
    fn of(row: &AllowanceRow) -> Self {
        RowFacts {
            allowance_units: row.allowance_units,
            no_pending: row.pending.is_none(),
        }
    }
}
