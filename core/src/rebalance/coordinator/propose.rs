//! Propose: the rebalancing round. What the leader wants committed now: completions of acked
//! releases, reclaims and their ends, each counter's plan, garbage collection.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::budget::config::STATS_WINDOWS_KEPT;
use crate::ids::{LimitId, RegionId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::rebalance::plan::{CounterPlanInput, PlanAction, RegionState, plan_counter};
use crate::rebalance::table::TableCommand;
use crate::rebalance::views::{CounterView, DemandView};
use crate::sync::CounterRef;
use crate::time::{Timestamp, Window, WindowIndex};

use super::{
    Coordinator, MAX_PROPOSALS_PER_POLL, ProposalKey, RELEASE_HANDOFF_SYNC_INTERVALS, first_live,
    forgotten_mark, need_units, proposal_key,
};

impl Coordinator {
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
        let acks = self
            .rows
            .iter()
            .filter_map(|(k, v)| v.ack.as_ref().map(|a| (k, a)));
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
        self.rows.retain(|(c, _), _| !ended(c));
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
