//! Propose: the rebalancing round. What the leader wants committed now: completions of acked
//! releases, reclaims and their ends, each counter's plan, garbage collection.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::budget::config::STATS_WINDOWS_KEPT;
use crate::ids::{KeyId, LimitId, RegionId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::rebalance::plan::{CounterPlanInput, PlanAction, RegionState, plan_counter};
use crate::rebalance::table::TableCommand;
use crate::rebalance::views::{CounterView, DemandView};
use crate::sync::CounterRef;
use crate::time::{Timestamp, Window, WindowIndex};

use super::schedule::{SharedInputs, drift_time, replan_threshold_units};
use super::{
    Coordinator, MAX_PROPOSALS_PER_POLL, MAX_REPLAN_INTERVAL, ProposalKey,
    RELEASE_HANDOFF_SYNC_INTERVALS, first_live, forgotten_mark, need_units, proposal_key,
};

impl Coordinator {
    /// What the rebalancer wants committed now.
    pub fn poll_proposals(&mut self, now: Timestamp) -> Vec<TableCommand> {
        let timeout = self.cfg.proposal_timeout;
        // A reclaim's start is not forgotten: it may still commit after its region is heard
        // again, and must then have an end proposed behind it (`propose_reclaims`). Taken in
        // hash order: forgetting a key and marking its counter do not depend on it.
        let expired: Vec<ProposalKey> = self
            .in_flight
            .iter()
            .filter(|(key, (at, _))| {
                !matches!(key, ProposalKey::StartReclaim(..))
                    && now.saturating_duration_since(*at) >= timeout
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in expired {
            self.in_flight.remove(&key);
            if let ProposalKey::Counter(c) = &key {
                self.schedule.mark(c);
            }
        }
        self.forget_ended(now);
        self.pre_issue(now);
        let mut out = Vec::new();
        // First: at most one per member, and never left out by the cap below.
        self.propose_version_records(&mut out);
        self.propose_completions(&mut out);
        self.propose_reclaims(now, &mut out);
        self.propose_rebalance(now, &mut out);
        self.propose_gc(now, &mut out);
        // A counter whose commands did not fit is planned again next round.
        for cmd in out.drain(MAX_PROPOSALS_PER_POLL.min(out.len())..) {
            if let Some(ProposalKey::Counter(c)) = proposal_key(&cmd) {
                self.schedule.mark(&c);
            }
        }
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

    /// Record the version each heard region enforces where the table's record differs, so a
    /// later leader knows it before it hears the region (docs/bound.md, reload).
    fn propose_version_records(&self, out: &mut Vec<TableCommand>) {
        let current = self.table.config_version();
        for (region, view) in &self.regions {
            let Some(version) = view.config_version else {
                continue;
            };
            let due = version <= current
                && self.table.recorded_version(region) != Some(version)
                && self.table.regions().binary_search(region).is_ok()
                && !self.is_in_flight(&ProposalKey::Version(region.clone()));
            if due {
                out.push(TableCommand::RecordVersion {
                    region: region.clone(),
                    version,
                });
            }
        }
    }

    fn propose_completions(&self, out: &mut Vec<TableCommand>) {
        let acks = self.acked.iter().filter_map(|k| {
            let ack = self.rows.get(k).and_then(|v| v.ack.as_ref())?;
            Some((k, ack))
        });
        for ((counter, region), ack) in acks {
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

    /// When `region`, silent since it was last heard, has certainly closed itself: `view_ttl`
    /// after its last contact on its own clock, plus the drift margin, plus how far its clock
    /// may be from ours. `None` without a clock sample: its clock may be any number of windows
    /// away, so nothing is reclaimed (a new leader takes the earlier leader's replicated
    /// samples, or the region's next SyncUp's, carried over to its own clock: `clocks.rs`).
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

    /// The region was last heard (or recorded, D64) on a version under which `limit` is strict
    /// with the closed policy, as on every version since (the table's, which the caller
    /// checked, and the kept ones): it closes itself when its view expires. A region silent since before a reload to the closed policy may still be
    /// admitting under the old version's policy (floor, open, eventual) for as long as the
    /// reload takes to reach it, which the leader cannot know: its floor is not reclaimed.
    fn closes_when_silent(&self, limit: &LimitId, region: &RegionId) -> bool {
        let current = self.table.config_version();
        match self.version_of(region) {
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

    /// What every counter's plan reads from outside it, as of `now`.
    fn shared_inputs(&self, now: Timestamp) -> SharedInputs {
        let regions = self.table.regions();
        SharedInputs {
            silent: regions
                .iter()
                .filter(|r| self.is_silent(r, now))
                .cloned()
                .collect(),
            versions_agree: self.versions_agree(),
            // A limit with a reclaim whose region is back: its floor must not be planned with
            // until the reclaim's end is committed.
            reclaim_ending: self
                .table
                .reclaims()
                .filter(|((_, r), _)| self.has_returned(r, now))
                .map(|((l, _), _)| l.clone())
                .collect(),
        }
    }

    /// Plans the counters the schedule has ready: marked since their last plan, or due.
    fn propose_rebalance(&mut self, now: Timestamp, out: &mut Vec<TableCommand>) {
        let shared = self.shared_inputs(now);
        self.schedule.observe_shared(shared.clone());
        if !shared.versions_agree {
            // Nothing is planned; the marks wait, and agreement marks every counter.
            return;
        }
        // A counter with a completion in this batch is planned next round, from its result.
        let taken: BTreeSet<ProposalKey> = out.iter().filter_map(proposal_key).collect();
        self.schedule.expand_all(self.counters.keys());
        // Marked but not plannable yet (a batch in flight, a reclaim ending): marked again
        // after this round, so what marked them is not lost.
        let mut wait = Vec::new();
        while out.len() < MAX_PROPOSALS_PER_POLL {
            let Some(counter) = self.schedule.pop_ready(now) else {
                break;
            };
            let key = ProposalKey::Counter(counter.clone());
            if shared.reclaim_ending.contains(&counter.limit)
                || taken.contains(&key)
                || self.is_in_flight(&key)
            {
                wait.push(counter);
                continue;
            }
            let (Some(view), Some(spec)) = (
                self.counters.get(&counter),
                self.table.limit(&counter.limit),
            ) else {
                continue;
            };
            if spec.consistency != Consistency::Strict || view.demand.is_empty() {
                continue;
            }
            let Some((input, rate)) = self.plan_input(now, spec, &counter, view, &shared.silent)
            else {
                continue;
            };
            let due = self.next_plan_at(now, spec, &counter, rate);
            self.push_actions(&counter, plan_counter(&input).actions, out);
            if let Some(v) = self.counters.get_mut(&counter) {
                v.drift_units = 0;
            }
            self.schedule.set_due(&counter, due);
        }
        for counter in wait {
            self.schedule.mark(&counter);
        }
    }

    /// When time alone may have moved `counter`'s plan though nothing marked it: its forecast
    /// needs moved by the replan threshold at the demand it has now (`rate` summed over live
    /// regions), or the current window reaches the point past which no release is asked;
    /// at the latest after [`MAX_REPLAN_INTERVAL`].
    fn next_plan_at(
        &self,
        now: Timestamp,
        spec: &LimitSpec,
        counter: &CounterRef,
        rate_micro_units_per_sec: u64,
    ) -> Timestamp {
        let mut at = now + MAX_REPLAN_INTERVAL;
        if let Quota::Units { units, window } = spec.quota {
            let threshold = replan_threshold_units(units, self.cfg.rebalance_hysteresis_units);
            if let Some(d) = drift_time(rate_micro_units_per_sec, threshold) {
                at = at.min(now + d);
            }
            let handoff = self.cfg.sync_interval * RELEASE_HANDOFF_SYNC_INTERVALS;
            let no_release_from = window.end(counter.window).saturating_sub(handoff);
            if no_release_from > now {
                at = at.min(no_release_from);
            }
        }
        at
    }

    fn plan_input(
        &self,
        now: Timestamp,
        spec: &LimitSpec,
        counter: &CounterRef,
        view: &CounterView,
        silent: &BTreeSet<RegionId>,
    ) -> Option<(CounterPlanInput, u64)> {
        let Quota::Units { units, window } = spec.quota else {
            return None;
        };
        let time_left = time_left(window, counter.window, now)?;
        let regions = self.table.regions();
        // The counter's rows, searched for once (not once per region and question).
        let rows = self.table.rows(counter);
        let mut rate_micro_units_per_sec = 0u64;
        let states = regions
            .iter()
            .map(|r| {
                let silent = silent.contains(r);
                let demand = if silent {
                    0
                } else {
                    view.demand.get(r).map_or(0, |d| d.micro_units_per_sec)
                };
                rate_micro_units_per_sec = rate_micro_units_per_sec.saturating_add(demand);
                let row = rows.and_then(|rows| rows.get(r));
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
                    allowance_units: self.table.allowance_of(counter, r, row),
                    pending_release_units: row
                        .and_then(|row| row.pending.as_ref().map(|p| p.units)),
                    frozen: silent
                        || reclaimed
                        || self.table.is_removed(r)
                        || self.unconfirmed_below_default(counter, r, row, || {
                            self.rows.get(&(counter.clone(), r.clone()))
                        }),
                }
            })
            .collect();
        let handoff = self.cfg.sync_interval * RELEASE_HANDOFF_SYNC_INTERVALS;
        let current = window.index(now) == counter.window;
        let input = CounterPlanInput {
            quota_units: units,
            free_units: self.table.free_units_of(counter, rows),
            hysteresis_units: self.cfg.rebalance_hysteresis_units,
            releases_useful: !current || window.remaining(now) >= handoff,
            regions: states,
        };
        Some((input, rate_micro_units_per_sec))
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

    /// Rows of windows that ended on every region's clock (ours less the clock slack, or the
    /// full reach while a member's clock is unknown, see `clock_slack`) are collected: late acks
    /// for them are then ignored, which only strands the released units. The rows are scanned
    /// only for limits whose first live window moved since a scan found nothing to collect.
    fn propose_gc(&mut self, now: Timestamp, out: &mut Vec<TableCommand>) {
        let slack = self.clock_slack(now);
        let mut scan: BTreeMap<LimitId, WindowIndex> = BTreeMap::new();
        for spec in self.table.limits() {
            let Some(window) = self.table.window_of(&spec.id) else {
                continue;
            };
            let before = first_live(window, now, slack);
            let checked = self.gc_checked.get(&spec.id) == Some(&before);
            if !checked && !self.is_in_flight(&ProposalKey::Gc(spec.id.clone())) {
                scan.insert(spec.id.clone(), before);
            }
        }
        if scan.is_empty() {
            return;
        }
        let mut oldest: BTreeMap<LimitId, WindowIndex> = BTreeMap::new();
        for (counter, _) in self.table.counters() {
            if scan.contains_key(&counter.limit) {
                let w = oldest
                    .entry(counter.limit.clone())
                    .or_insert(counter.window);
                *w = (*w).min(counter.window);
            }
        }
        for (limit, before) in scan {
            if oldest.get(&limit).is_some_and(|w| *w < before) {
                out.push(TableCommand::CollectGarbage {
                    limit,
                    before_window: before,
                });
            } else {
                self.gc_checked.insert(limit, before);
            }
        }
    }

    /// Drop soft state of windows that have ended.
    fn forget_ended(&mut self, now: Timestamp) {
        let slack = self.clock_slack(now);
        // Only when a mark moves (or limits may be gone) is anything forgotten: the views are
        // not scanned every round.
        let mut moved = std::mem::take(&mut self.forget_due);
        for spec in self.table.limits() {
            if let Quota::Units { window, .. } = spec.quota {
                let first = first_live(window, now, slack);
                let mark = self.forgotten_before.get(&spec.id).map(|mark| {
                    if mark.0 == window {
                        (window, mark.1.max(first))
                    } else {
                        (window, first)
                    }
                });
                let mark = mark.unwrap_or((window, first));
                if self.forgotten_before.get(&spec.id) != Some(&mark) {
                    self.forgotten_before.insert(spec.id.clone(), mark);
                    moved = true;
                }
            }
        }
        if !moved {
            return;
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
        self.rows.retain(|(c, _), _| !ended(c));
        self.acked.retain(|(c, _)| !ended(c));
        self.schedule.retain(|c| !ended(c));
        for counters in self.attention.values_mut() {
            counters.retain(|c| !ended(c));
        }
        self.region_stats.retain(|(limit, w), _| {
            forgotten
                .get(limit)
                .is_some_and(|(_, f)| w.0 >= f.0.saturating_sub(STATS_WINDOWS_KEPT as u64))
        });
        self.forgotten_before
            .retain(|limit, _| self.table.limit(limit).is_some());
    }

    /// Near the end of a window, carry the demand of its hot counters over to the next one so
    /// that the next window's allocations are planned (and granted) before it starts. Only the
    /// limits near the end of a window are looked at.
    fn pre_issue(&mut self, now: Timestamp) {
        let near_end: Vec<(LimitId, Window)> = self
            .table
            .limits()
            .filter_map(|spec| match spec.quota {
                Quota::Units { window, .. } if window.remaining(now) <= self.cfg.pre_issue_lead => {
                    Some((spec.id.clone(), window))
                }
                _ => None,
            })
            .collect();
        let mut carried: Vec<(CounterRef, BTreeMap<RegionId, DemandView>)> = Vec::new();
        for (limit, window) in near_end {
            let current = window.index(now);
            let from = CounterRef {
                limit: limit.clone(),
                key: KeyId::from(""),
                window: WindowIndex(0),
            };
            let of_limit = self
                .counters
                .range(from..)
                .take_while(|(c, _)| c.limit == limit);
            for (counter, view) in of_limit {
                let hot = view.demand.values().any(|d| d.micro_units_per_sec > 0);
                if counter.window == current && hot {
                    let next = CounterRef {
                        window: current.next(),
                        ..counter.clone()
                    };
                    carried.push((next, view.demand.clone()));
                }
            }
        }
        for (next, demand) in carried {
            if !self.track(now, &next) {
                continue;
            }
            if let Some(v) = self.counters.get_mut(&next) {
                // The latest demand of this window is the forecast for the next, until the
                // region reports on the next window itself.
                let mut changed = false;
                for (region, d) in demand {
                    let forecast = DemandView {
                        micro_units_per_sec: d.micro_units_per_sec,
                        allowance_units: 0,
                        carried: true,
                    };
                    let slot = v.demand.entry(region).or_insert_with(|| {
                        changed = true;
                        forecast
                    });
                    if slot.carried && *slot != forecast {
                        *slot = forecast;
                        changed = true;
                    }
                }
                if changed {
                    self.schedule.mark(&next);
                }
            }
        }
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

fn first_window_starting_at_or_after(window: Window, t: Timestamp) -> WindowIndex {
    let idx = window.index(t);
    if window.start(idx) < t {
        idx.next()
    } else {
        idx
    }
}
