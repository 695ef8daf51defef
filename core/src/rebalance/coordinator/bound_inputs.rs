//! Bound inputs: what the leader measured and the regions reported, for the bound of a limit
//! and window (docs/bound.md).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ids::{KeyId, LimitId, RegionId};
use crate::limit::PartitionPolicy;
use crate::rebalance::bound::{Bound, BoundInputs, RegionBoundStats, bound, skew_reach_windows};
use crate::rebalance::reload::Held;
use crate::rebalance::views::RegionView;
use crate::sync::CounterRef;
use crate::time::{Timestamp, Window, WindowIndex};

use super::{Coordinator, MAX_SKEW_REACH_WINDOWS};

impl Coordinator {
    /// The bound of `limit` for `window` (every key: see [`Coordinator::bound_inputs`]), from
    /// the leader's views and what the regions reported. `None` for an unknown limit. A window
    /// that ended before this leader started is stated unbounded: this leader did not watch
    /// it (an earlier one may have, and bounded it; docs/bound.md), and only the terms the
    /// regions still report are known to it.
    ///
    /// A sliding-window limit's window also counts the window before's terms
    /// (`previous_window`), and is unbounded where that one is (docs/bound.md, sliding_window).
    pub fn bound(&self, now: Timestamp, limit: &LimitId, window: WindowIndex) -> Option<Bound> {
        if !self.table.limit(limit)?.is_sliding() {
            return self.window_bound(now, limit, window, None);
        }
        let before = window.0.checked_sub(1).map(WindowIndex);
        let previous = before.and_then(|w| self.window_bound(now, limit, w, None));
        let excess = previous.as_ref().map(Bound::excess_units);
        let mut b = self.window_bound(now, limit, window, excess)?;
        if b.unbounded.is_none() {
            (b.unbounded, b.unwatched) = match previous {
                Some(p) => (
                    p.unbounded
                        .map(|why| format!("the window before is unbounded: {why}")),
                    p.unwatched,
                ),
                None => (Some("the window before is not known".to_string()), true),
            };
        }
        Some(b)
    }

    /// The bound of one window, with the window before's excess for a sliding window's
    /// `previous_window` term.
    fn window_bound(
        &self,
        now: Timestamp,
        limit: &LimitId,
        window: WindowIndex,
        previous_excess_units: Option<u64>,
    ) -> Option<Bound> {
        let spec = self.table.limit(limit)?;
        let mut inputs = self.bound_inputs(now, limit, window, None);
        inputs.previous_window_units = previous_excess_units;
        let unknown = self.reload_inputs(now, limit, window, &mut inputs);
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
            b.unwatched = true;
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
    ///
    /// A region this leader cannot hear now (removed, or silent) may have switched to any
    /// version after the one it was last heard on: a reload reaches it from its own files, not
    /// from us. It counts at the largest it may hold under any of them (swarm seed 3362506:
    /// removed after releasing down to 390 of its 948 on version 1, it took a reload to
    /// version 2 and enforced that version's default of 1,010 while the other region held its
    /// version-1 grant of 920, 1,925 admitted against 1,868 with no term stated).
    fn reload_inputs(
        &self,
        now: Timestamp,
        limit: &LimitId,
        window: WindowIndex,
        inputs: &mut BoundInputs,
    ) -> Option<String> {
        if let Some(why) = self.unheard_on_unknown_version() {
            return Some(why);
        }
        let under_previous: Vec<Option<u64>> = self
            .table
            .regions()
            .iter()
            .map(|r| self.admitted_under_previous(limit, window, r))
            .collect();
        // Every member, removed ones too: planning skips a removed region (it never syncs
        // again), but it may still enforce the version it was last heard on (swarm seed
        // 3222577: removed while eventual, it admitted its eventual default in a window a
        // reload to strict had bounded at 0).
        if self.members_on_table_version(true) && under_previous.iter().all(Option::is_none) {
            return None;
        }
        let current = self.table.config_version();
        inputs.reload_quota_units = self
            .finite_window(limit)
            .and_then(|w| self.kept_configs.quota_units_at(limit, w, w.start(window)));
        for (r, previous) in self.table.regions().iter().zip(under_previous) {
            let version = self.version_of(r).unwrap_or(current);
            let unheard = self.table.is_removed(r) || self.is_silent(r, now);
            let switched_unheard: Vec<u64> = if unheard && version != current {
                self.kept_configs
                    .versions_after(version)
                    .chain(std::iter::once(current))
                    .collect()
            } else {
                Vec::new()
            };
            let mut units = 0u64;
            for v in std::iter::once(version)
                .chain(previous)
                .chain(switched_unheard)
            {
                let held = if v == current {
                    Held::Units(self.largest_allowance(limit, window, None, r))
                } else {
                    if let Some(terms) = self.kept_configs.older_terms(v, limit) {
                        inputs
                            .reload_older_terms
                            .entry(r.clone())
                            .or_default()
                            .push(terms);
                    }
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

    /// Why no bound can be stated while a member this leader has not heard may enforce a
    /// version it does not know. Its version is the one an earlier leader recorded
    /// (`TableCommand::RecordVersion`); with none recorded and the table past its first
    /// version, it may be on any earlier one. A recorded version other than the table's is
    /// one a reload replaced before this leader started, whose holdings are not kept here
    /// (the kept configurations are leader soft state): it may admit up to its default there.
    /// A removed region is never heard again (its syncs are refused), so this lasts until it
    /// is added back. Swarm seed 3001161: a region 64 s ahead, removed during an outage, on
    /// the version a reload replaced, admitted 6,349 in a window the new leader bounded at 0
    /// above the new quota (`a_region_removed_before_the_leader_heard_it_leaves_the_window_unbounded`,
    /// `a_region_cut_off_through_a_reload_and_a_leader_change_leaves_the_window_unbounded`).
    fn unheard_on_unknown_version(&self) -> Option<String> {
        let current = self.table.config_version();
        self.table.regions().iter().find_map(|r| {
            let heard = self
                .regions
                .get(r)
                .is_some_and(|v| v.config_version.is_some());
            if heard {
                return None;
            }
            match self.table.recorded_version(r) {
                Some(v) if v == current => None,
                Some(v) if self.kept_configs.knows(v) => None,
                Some(v) => Some(format!(
                    "{r} is not heard by this leader and was last recorded on version {v}, \
                     unknown here"
                )),
                None if current > 1 => Some(format!(
                    "{r} is not heard by this leader and no version of it is recorded: it may \
                     enforce one replaced before this leader started"
                )),
                None => None,
            }
        })
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

    /// Why the window is unbounded when a region clamped settles in it (units a spender used
    /// beyond the settle cap that the `settle_overage` term rests on), or its gateways
    /// reported admissions no lease could be charged with: used, charged nowhere.
    fn clamped_settles(&self, limit: &LimitId, window: WindowIndex) -> Option<String> {
        let by_region = self.region_stats.get(&(limit.clone(), window))?;
        by_region.iter().find_map(|(region, f)| {
            if f.settle_clamped_units > 0 {
                return Some(format!(
                    "{region} clamped {} settled units above the settle cap (used, not charged)",
                    f.settle_clamped_units
                ));
            }
            (f.uncharged_units > 0).then(|| {
                format!(
                    "{region}'s gateways reported {} admitted units no lease could be charged \
                     with (used, not charged)",
                    f.uncharged_units
                )
            })
        })
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
    ///
    /// The region counts its time open on its own clock: the window runs on ours from its
    /// start less that clock's uncertainty to its end plus it ([`Coordinator::region_span`]).
    /// A region behind is still in the window after it ended here, and fails open in it when
    /// its leader is gone (swarm seed 3328633). At most the window's length.
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
        let (start, end) = self.region_span(w, window, &view);
        let to = now.min(end);
        let unknown_until = view.first_heard_at.map_or(to, |h| h.min(to));
        let unknown = unknown_until.saturating_duration_since(start);
        if view.first_heard_at.is_none() || !self.is_silent(region, now) {
            return unknown.min(w.len());
        }
        let delay = view.clock.map_or(self.cfg.view_ttl, |c| {
            Duration::from_nanos(c.round_trip_nanos)
        });
        let from = (view.last_heard - delay).max(start);
        (unknown + to.saturating_duration_since(from)).min(w.len())
    }

    /// When `window` may run on a region's clock, on ours: widened by its measured
    /// uncertainty and the drift margin. Without a clock sample, the window as we read it
    /// (docs/bound.md, fail_open).
    fn region_span(
        &self,
        w: Window,
        window: WindowIndex,
        view: &RegionView,
    ) -> (Timestamp, Timestamp) {
        let slack = view
            .clock_uncertainty()
            .map_or(Duration::ZERO, |u| u.saturating_add(self.cfg.drift_margin));
        (
            w.start(window).saturating_sub(slack),
            w.end(window).saturating_add(slack),
        )
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
