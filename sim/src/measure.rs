//! Measurement: what was asked for, admitted and denied, per key, window and region, judged
//! on the true clock and on each region's own clock; and the time series behind plots and
//! convergence.
//!
//! Tallies are dense arrays indexed by (key, window, region), sized when the run starts, so a
//! request costs a few additions and divisions and never allocates.

use std::time::Duration;

use allot_core::ids::{KeyId, LimitId};
use allot_core::time::{Timestamp, WindowIndex, duration_nanos};
use serde::Serialize;

use crate::node::Bound;
use crate::scenario::{LimitInfo, Scenario};

/// Most (key, window) cells a run may track; a scenario beyond it must use fewer keys, longer
/// windows or a shorter run.
pub const MAX_WINDOW_CELLS: usize = 20_000_000;

/// Sync intervals, beyond the one a region waits to send a report and the one the coordinator
/// waits to state it, allowed on lossy links for a report that was lost and is resent: part of
/// how long the run's end waits for the statements of what happened before it (`report_lag`).
pub const LATE_REPORT_RESENDS: u32 = 2;

/// One (limit, key) pair some source sends to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyMeta {
    pub limit_index: usize,
    pub limit: LimitId,
    pub key: KeyId,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WindowCell {
    admitted_units: u64,
    /// Units of fresh requests (retries excluded): what the clients wanted.
    demand_units: u64,
    requests: u64,
    denials: u64,
    denied_units: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketCell {
    pub admitted_units: u64,
    pub demand_units: u64,
    /// Units of every attempt, retries included.
    pub attempted_units: u64,
    pub denied_units: u64,
}

/// Per key: one row of cells per window, one cell per region, plus the all-region total.
#[derive(Clone, Debug)]
struct WindowTable {
    window_nanos: u64,
    first_index: u64,
    windows: usize,
    cells: Vec<WindowCell>,
    admitted_total: Vec<u64>,
}

impl WindowTable {
    fn new(window_nanos: u64, first_nanos: u64, last_nanos: u64, regions: usize) -> Self {
        let first_index = first_nanos / window_nanos;
        let windows = (last_nanos / window_nanos - first_index + 1) as usize;
        WindowTable {
            window_nanos,
            first_index,
            windows,
            cells: vec![WindowCell::default(); windows * regions],
            admitted_total: vec![0; windows],
        }
    }

    /// Row of the window holding `t`, clamped into the table (a local clock read just past
    /// the run's end lands in the last row).
    #[inline]
    fn row(&self, t: u64) -> usize {
        let index = (t / self.window_nanos).saturating_sub(self.first_index) as usize;
        index.min(self.windows - 1)
    }
}

/// All tallies of one run.
#[derive(Clone, Debug)]
pub struct Measure {
    start_nanos: u64,
    end_nanos: u64,
    regions: usize,
    pub keys: Vec<KeyMeta>,
    limits: Vec<LimitInfo>,
    true_windows: Vec<WindowTable>,
    /// Admissions by window index on the admitting region's own clock.
    local_windows: Vec<WindowTable>,
    /// Per limit and window: the bound stated for the window, each term at the largest
    /// it was reported. Rows start at `bounds_first_index`, the earliest window any region's
    /// clock reads during the run: a region behind the true clock admits in windows that
    /// ended, on the true clock, before the run started, and those indexes are judged too.
    bounds: Vec<Vec<Option<Bound>>>,
    /// Per limit: the window index of row 0 of `bounds` and `leaderless`.
    bounds_first_index: Vec<u64>,
    /// Per limit and true window: a sample found no leader, and no leader stated the window's
    /// bound as the window in progress since (a new leader's statements cover, conservatively,
    /// what it did not see of the window it starts in).
    leaderless: Vec<Vec<bool>>,
    /// Per key and true window: the latest true time a settle raised the window's use.
    overage_settled_at: Vec<Vec<u64>>,
    /// Per key of a sliding-window limit, per true window: the largest estimate
    /// `P * (W - e) / W + C` at any admission (rounded up), `P` the window before's units and
    /// `C` this window's so far (D54). The estimate only grows at admissions (between them
    /// the window before's weight falls), so this is its largest over the window.
    sliding_estimate: Vec<Option<Vec<u64>>>,
    /// Per key and window index on the regions' clocks (rows of `local_windows`): the latest
    /// true time an admission or a settle raised its use. A region behind admits in an index
    /// after its true window ended, so the true window's end does not say when the
    /// statements covering the index arrive.
    local_raised_at: Vec<Vec<u64>>,
    /// Per key and window index on the regions' clocks: the earliest and latest true time of
    /// an admission counted in it. A region whose clock is ahead admits in an index before its
    /// true window starts, so a reload between the two puts the index's units under two
    /// quotas: it is judged against the larger, as a window a rollout overlaps is.
    local_admitted_span: Vec<Vec<(u64, u64)>>,
    /// Windows ending after this, or raised by a settle after it, are not judged: the
    /// statements that would cover them may not have arrived before the run ended.
    judge_until_nanos: u64,
    bucket_nanos: u64,
    buckets: usize,
    /// (key, bucket, region).
    bucket_cells: Vec<BucketCell>,
    /// Per bucket: every strict counter's allocation within tolerance of the fair split of
    /// the true demand at the bucket's sample (`crate::allocation`); `None` where no strict
    /// allowance was seen (the static split, eventual limits).
    allocation_calm: Vec<Option<bool>>,
    threshold_percent: u64,
}

/// Range of local clock readings a region shows during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRange {
    pub first: Timestamp,
    pub last: Timestamp,
}

impl Measure {
    /// `None` when the run would need more than [`MAX_WINDOW_CELLS`] cells.
    pub fn new(scenario: &Scenario, keys: Vec<KeyMeta>, local: &[LocalRange]) -> Option<Self> {
        let regions = scenario.regions.len();
        let start = scenario.start.as_unix_nanos();
        let end = scenario.end().as_unix_nanos();
        let local_first = local.iter().map(|r| r.first.as_unix_nanos()).min()?;
        let local_last = local.iter().map(|r| r.last.as_unix_nanos()).max()?;
        let mut cells = 0usize;
        let mut true_windows = Vec::with_capacity(keys.len());
        let mut local_windows = Vec::with_capacity(keys.len());
        for k in &keys {
            let w = duration_nanos(scenario.limits.limits[k.limit_index].window.len());
            // The run covers [start, end): its last instant is end - 1.
            let t = WindowTable::new(w, start, end - 1, regions);
            let l = WindowTable::new(w, local_first, local_last, regions);
            cells = cells
                .saturating_add(t.cells.len())
                .saturating_add(l.cells.len());
            if cells > MAX_WINDOW_CELLS {
                return None;
            }
            true_windows.push(t);
            local_windows.push(l);
        }
        let bound_tables: Vec<WindowTable> = scenario
            .limits
            .limits
            .iter()
            .map(|l| {
                let first = local_first.min(start);
                WindowTable::new(duration_nanos(l.window.len()), first, end - 1, 0)
            })
            .collect();
        let bounds: Vec<Vec<Option<Bound>>> =
            bound_tables.iter().map(|t| vec![None; t.windows]).collect();
        let bounds_first_index = bound_tables.iter().map(|t| t.first_index).collect();
        let leaderless = bounds.iter().map(|b| vec![false; b.len()]).collect();
        let overage_settled_at = true_windows.iter().map(|t| vec![0; t.windows]).collect();
        let sliding_estimate = keys
            .iter()
            .zip(&true_windows)
            .map(|(k, t)| {
                scenario.limits.limits[k.limit_index]
                    .sliding
                    .then(|| vec![0; t.windows])
            })
            .collect();
        let local_raised_at = local_windows.iter().map(|t| vec![0; t.windows]).collect();
        let local_admitted_span = local_windows
            .iter()
            .map(|t| vec![(u64::MAX, 0); t.windows])
            .collect();
        let judge_until_nanos = end.saturating_sub(duration_nanos(report_lag(scenario)));
        let bucket_nanos = duration_nanos(scenario.measure.sample_interval);
        let buckets = (end - start).div_ceil(bucket_nanos) as usize;
        Some(Measure {
            leaderless,
            overage_settled_at,
            sliding_estimate,
            local_raised_at,
            local_admitted_span,
            judge_until_nanos,
            start_nanos: start,
            end_nanos: end,
            regions,
            bucket_cells: vec![BucketCell::default(); keys.len() * buckets * regions],
            allocation_calm: vec![None; buckets],
            keys,
            limits: scenario.limits.limits.clone(),
            true_windows,
            local_windows,
            bounds,
            bounds_first_index,
            bucket_nanos,
            buckets,
            threshold_percent: u64::from(scenario.measure.false_denial_threshold_percent),
        })
    }

    #[inline]
    fn bucket(&mut self, key: usize, region: usize, t: u64) -> &mut BucketCell {
        let b = (((t - self.start_nanos) / self.bucket_nanos) as usize).min(self.buckets - 1);
        &mut self.bucket_cells[(key * self.buckets + b) * self.regions + region]
    }

    #[inline]
    fn cell(&mut self, key: usize, region: usize, t: u64) -> &mut WindowCell {
        let table = &mut self.true_windows[key];
        let row = table.row(t);
        &mut table.cells[row * self.regions + region]
    }

    /// An attempt of `units` (what the client will use) arrives at a gateway; `fresh` unless
    /// it is a client's retry.
    #[inline]
    pub fn request(&mut self, key: usize, region: usize, t: Timestamp, units: u64, fresh: bool) {
        let t = t.as_unix_nanos();
        let cell = self.cell(key, region, t);
        cell.requests += 1;
        if fresh {
            cell.demand_units += units;
        }
        let b = self.bucket(key, region, t);
        b.attempted_units += units;
        if fresh {
            b.demand_units += units;
        }
    }

    /// `units` admitted at true time `t`, region-local time `local`.
    #[inline]
    pub fn admitted(
        &mut self,
        key: usize,
        region: usize,
        t: Timestamp,
        local: Timestamp,
        units: u64,
    ) {
        self.count_admitted(key, region, t, local, units);
        if let Some(estimates) = self.sliding_estimate[key].as_mut() {
            let table = &self.true_windows[key];
            let t = t.as_unix_nanos();
            let row = table.row(t);
            let estimate = sliding_estimate_units(table, row, t);
            estimates[row] = estimates[row].max(estimate);
        }
    }

    /// [`Measure::admitted`] without the sliding estimate: a settle's units are counted in
    /// the window of their reservation, but weighed only by the estimates taken after it
    /// (taken at the reservation's instant with the window's later units, it would count
    /// those at a weight they never had).
    fn count_admitted(
        &mut self,
        key: usize,
        region: usize,
        t: Timestamp,
        local: Timestamp,
        units: u64,
    ) {
        let t = t.as_unix_nanos();
        self.cell(key, region, t).admitted_units += units;
        let table = &mut self.true_windows[key];
        let row = table.row(t);
        table.admitted_total[row] += units;
        let local_table = &mut self.local_windows[key];
        let local_row = local_table.row(local.as_unix_nanos());
        local_table.cells[local_row * self.regions + region].admitted_units += units;
        local_table.admitted_total[local_row] += units;
        let raised = &mut self.local_raised_at[key][local_row];
        *raised = (*raised).max(t);
        let span = &mut self.local_admitted_span[key][local_row];
        *span = (span.0.min(t), span.1.max(t));
        self.bucket(key, region, t).admitted_units += units;
    }

    /// A reservation admitted at (`t`, `local`) settled at `actual_units`, at true time
    /// `now`: the window it was admitted in is charged what was really used.
    pub fn settled(
        &mut self,
        key: usize,
        region: usize,
        admitted_at: (Timestamp, Timestamp),
        reserved_units: u64,
        actual_units: u64,
        now: Timestamp,
    ) {
        let (t, local) = admitted_at;
        if actual_units >= reserved_units {
            self.count_admitted(key, region, t, local, actual_units - reserved_units);
            if actual_units > reserved_units {
                let row = self.true_windows[key].row(t.as_unix_nanos());
                let at = &mut self.overage_settled_at[key][row];
                *at = (*at).max(now.as_unix_nanos());
                let local_row = self.local_windows[key].row(local.as_unix_nanos());
                let raised = &mut self.local_raised_at[key][local_row];
                *raised = (*raised).max(now.as_unix_nanos());
            }
            return;
        }
        let less = reserved_units - actual_units;
        let t = t.as_unix_nanos();
        let cell = self.cell(key, region, t);
        cell.admitted_units -= less;
        let table = &mut self.true_windows[key];
        let row = table.row(t);
        table.admitted_total[row] -= less;
        let local_table = &mut self.local_windows[key];
        let local_row = local_table.row(local.as_unix_nanos());
        local_table.cells[local_row * self.regions + region].admitted_units -= less;
        local_table.admitted_total[local_row] -= less;
        self.bucket(key, region, t).admitted_units -= less;
    }

    /// A denial. Whether it was false is known once its window is over
    /// ([`Measure::false_denied_units`]).
    #[inline]
    pub fn denied(&mut self, key: usize, region: usize, t: Timestamp, units: u64) {
        let t = t.as_unix_nanos();
        let cell = self.cell(key, region, t);
        cell.denials += 1;
        cell.denied_units += units;
        self.bucket(key, region, t).denied_units += units;
    }

    /// Of a window's denied units, how many were false: the window (true clock) ended with
    /// more than the threshold of its quota unused, and up to that much more could have been
    /// admitted. Returns `(false units, denied units)` of the window; only complete windows
    /// are judged.
    fn false_share(&self, k: usize, row: usize) -> (u64, u64) {
        let table = &self.true_windows[k];
        let cells = &table.cells[row * self.regions..(row + 1) * self.regions];
        let denied: u64 = cells.iter().map(|c| c.denied_units).sum();
        let start = (table.first_index + row as u64) * table.window_nanos;
        let quota =
            self.limits[self.keys[k].limit_index].quota_units_in(start, start + table.window_nanos);
        let complete = start >= self.start_nanos && start + table.window_nanos <= self.end_nanos;
        if !complete {
            return (0, denied);
        }
        let threshold = quota * self.threshold_percent / 100;
        let unused = quota.saturating_sub(table.admitted_total[row]);
        (unused.saturating_sub(threshold).min(denied), denied)
    }

    /// False denied units of one key, bucket and region: its denied units, times the share of
    /// its window's denials that were false.
    pub fn false_denied_units(&self, key: usize, bucket: usize, region: usize) -> u64 {
        let denied = self.bucket_cell(key, bucket, region).denied_units;
        if denied == 0 {
            return 0;
        }
        let at = self.start_nanos + bucket as u64 * self.bucket_nanos;
        let table = &self.true_windows[key];
        let (false_units, window_denied) = self.false_share(key, table.row(at));
        scale(denied, false_units, window_denied)
    }

    /// A statement of the bound of `limit` for the window of index `window` (true clock),
    /// collected at true time `at`, when the regions' window clocks read `region_clocks`:
    /// merged term by term into what was stated before ([`Bound::merge`]). A statement by a
    /// leader of a window still in progress, on the true clock or on some region's, covers
    /// the time the window had no leader before it ([`Measure::leaderless`]).
    pub fn bound_sample(
        &mut self,
        limit: &LimitId,
        window: WindowIndex,
        bound: &Bound,
        at: Timestamp,
        region_clocks: &[Timestamp],
    ) {
        let Some(i) = self.limits.iter().position(|l| &l.id == limit) else {
            return;
        };
        let w = duration_nanos(self.limits[i].window.len());
        let Some(row) = window.0.checked_sub(self.bounds_first_index[i]) else {
            return;
        };
        let row = row as usize;
        if let Some(slot) = self.bounds[i].get_mut(row) {
            match slot {
                Some(stated) => stated.merge(bound),
                None => *slot = Some(bound.clone()),
            }
        }
        let in_progress = std::iter::once(&at)
            .chain(region_clocks)
            .any(|t| t.as_unix_nanos() / w == window.0);
        if in_progress
            && !bound.unbounded
            && let Some(flag) = self.leaderless[i].get_mut(row)
        {
            *flag = false;
        }
    }

    /// A sample at true time `t` found no coordinator leader, the regions' window clocks
    /// reading `region_clocks`: every limit's window in progress, on the true clock or on any
    /// region's, is unbounded unless a leader states it later while it is still in progress.
    /// A region behind admits in a window that ended on the true clock: a leader gone before
    /// the region's clock left it stated none of what the region admits after (swarm seed
    /// 3328633, regions 5.4 s behind failing open in it).
    pub fn leaderless(&mut self, t: Timestamp, region_clocks: &[Timestamp]) {
        for (i, limit) in self.limits.iter().enumerate() {
            let w = duration_nanos(limit.window.len());
            for reading in std::iter::once(&t).chain(region_clocks) {
                let index = reading.as_unix_nanos() / w;
                let Some(row) = index.checked_sub(self.bounds_first_index[i]) else {
                    continue;
                };
                if let Some(flag) = self.leaderless[i].get_mut(row as usize) {
                    *flag = true;
                }
            }
        }
    }

    /// The bound of a limit's window of index `index`, `None` when it is unbounded: nothing
    /// was stated for it, a statement said so, or part of it had no leader and no leader
    /// covered that time.
    fn window_bound(&self, limit_index: usize, index: u64) -> Option<&Bound> {
        let row = index.checked_sub(self.bounds_first_index[limit_index])? as usize;
        let stated = self.bounds[limit_index].get(row)?.as_ref()?;
        let leaderless = self.leaderless[limit_index]
            .get(row)
            .copied()
            .unwrap_or(true);
        (!stated.unbounded && !leaderless).then_some(stated)
    }

    /// Whether the run ended before the statements that could cover the key's window (true
    /// row `row`) had time to arrive: the window ends in the run's last `report_lag`, or a
    /// settle raised it then.
    fn cut_off(&self, k: usize, row: usize) -> bool {
        let table = &self.true_windows[k];
        let end = (table.first_index + row as u64 + 1) * table.window_nanos;
        end > self.judge_until_nanos || self.overage_settled_at[k][row] > self.judge_until_nanos
    }

    /// The allocation judged at a sample at true time `t`: within tolerance or not.
    pub fn allocation_sample(&mut self, t: Timestamp, calm: bool) {
        let b = ((t.as_unix_nanos().saturating_sub(self.start_nanos) / self.bucket_nanos) as usize)
            .min(self.buckets - 1);
        let slot = &mut self.allocation_calm[b];
        *slot = Some(slot.unwrap_or(true) && calm);
    }

    /// Whether any sample judged an allocation (a run with strict counters and a
    /// coordinator).
    pub fn has_allocation_samples(&self) -> bool {
        self.allocation_calm.iter().any(Option::is_some)
    }

    pub fn buckets(&self) -> usize {
        self.buckets
    }

    pub fn bucket_interval(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos)
    }

    pub fn bucket_cell(&self, key: usize, bucket: usize, region: usize) -> BucketCell {
        self.bucket_cells[(key * self.buckets + bucket) * self.regions + region]
    }

    /// Every window of every key, judged on the true clock.
    pub fn windows(&self) -> Vec<WindowReport> {
        (0..self.keys.len())
            .flat_map(|k| (0..self.true_windows[k].windows).map(move |row| (k, row)))
            .map(|(k, row)| self.window_report(k, row))
            .collect()
    }

    fn window_report(&self, k: usize, row: usize) -> WindowReport {
        let meta = &self.keys[k];
        let table = &self.true_windows[k];
        let cells = &table.cells[row * self.regions..(row + 1) * self.regions];
        let index = table.first_index + row as u64;
        let quota = self.limits[meta.limit_index]
            .quota_units_in(index * table.window_nanos, (index + 1) * table.window_nanos);
        let bound = self.window_bound(meta.limit_index, index).cloned();
        let admitted: u64 = cells.iter().map(|c| c.admitted_units).sum();
        let demand: u64 = cells.iter().map(|c| c.demand_units).sum();
        let local = &self.local_windows[k];
        let on_region_clocks = index
            .checked_sub(local.first_index)
            .and_then(|r| local.admitted_total.get(r as usize))
            .copied()
            .unwrap_or(0);
        let window_start = index * table.window_nanos;
        let complete =
            window_start >= self.start_nanos && window_start + table.window_nanos <= self.end_nanos;
        let wanted = demand.min(quota);
        let estimate = self.sliding_estimate[k].as_ref().map(|e| e[row]);
        WindowReport {
            limit: meta.limit.to_string(),
            key: meta.key.to_string(),
            index,
            start_ms: window_start.saturating_sub(self.start_nanos) / 1_000_000,
            complete,
            quota_units: quota,
            admitted_units: admitted,
            admitted_units_per_region: cells.iter().map(|c| c.admitted_units).collect(),
            admitted_units_on_region_clocks: on_region_clocks,
            quota_units_on_region_clocks: self.local_quota_units(k, index),
            demand_units: demand,
            overshoot_units: estimate.unwrap_or(admitted).saturating_sub(quota),
            estimate_units: estimate,
            bound_units: bound.as_ref().map(|b| b.total_units),
            unbounded: bound.is_none(),
            cut_off: self.cut_off(k, row),
            bound,
            utilization: (complete && wanted > 0).then(|| admitted as f64 / wanted as f64),
            requests: cells.iter().map(|c| c.requests).sum(),
            denials: cells.iter().map(|c| c.denials).sum(),
            false_denials: {
                let (false_units, denied_units) = self.false_share(k, row);
                let denials: u64 = cells.iter().map(|c| c.denials).sum();
                scale_up(denials, false_units, denied_units)
            },
        }
    }

    /// The quota a window index on the regions' clocks is judged against: the index's own, or
    /// the larger quota in force when its units were admitted (a region ahead admitted in it
    /// before a reload that cut the quota: docs/bound.md, reload).
    fn local_quota_units(&self, k: usize, index: u64) -> u64 {
        let limit = &self.limits[self.keys[k].limit_index];
        let window_nanos = self.local_windows[k].window_nanos;
        let quota = limit.quota_units_in(index * window_nanos, (index + 1) * window_nanos);
        let span = index
            .checked_sub(self.local_windows[k].first_index)
            .and_then(|row| self.local_admitted_span[k].get(row as usize));
        match span {
            Some(&(first, last)) if first <= last => {
                quota.max(limit.quota_units_in(first, last + 1))
            }
            _ => quota,
        }
    }

    /// Windows on each region's own clock where the sum over regions is above the quota plus
    /// the skew-free part of the bound: (limit, key, window index, admitted, allowed). An index
    /// whose true window is unbounded or cut off is not judged, nor one whose use was raised
    /// in the run's last `report_lag` (a region behind admitting in it after its true window
    /// ended): the statements covering that use may not have arrived.
    pub fn local_window_excess(&self) -> Vec<LocalExcess> {
        let mut out = Vec::new();
        for (k, table) in self.local_windows.iter().enumerate() {
            let meta = &self.keys[k];
            let first_true = self.true_windows[k].first_index;
            for row in 0..table.windows {
                let admitted = table.admitted_total[row];
                let index = table.first_index + row as u64;
                // Windows of a region's clock, judged against the quota of the same index.
                let quota = self.local_quota_units(k, index);
                // The same index on a region's clock uses the bound stated for that index.
                // An index that ended before the run on the true clock is judged against what
                // the coordinator stated for it during the run (it does state those windows),
                // and is unbounded, as any window, when nothing was.
                if let Some(r) = index.checked_sub(first_true).map(|r| r as usize)
                    && (r >= self.true_windows[k].windows || self.cut_off(k, r))
                {
                    // Cut off by the run's end.
                    continue;
                }
                if self.local_raised_at[k][row] > self.judge_until_nanos {
                    continue;
                }
                let bound = match self.window_bound(meta.limit_index, index) {
                    Some(b) => b.without_skew_units(),
                    None => continue,
                };
                if admitted > quota + bound {
                    out.push(LocalExcess {
                        limit: meta.limit.clone(),
                        key: meta.key.clone(),
                        window_index: index,
                        admitted_units: admitted,
                        allowed_units: quota + bound,
                    });
                }
            }
        }
        out
    }
}

impl Measure {
    /// Windows (per key) on a region's clock that ended before the run started on the true
    /// clock, were admitted in (a region behind the true clock), and have no bound: the
    /// coordinator states a window that ended before it started as unbounded. Not judged, as
    /// unbounded true windows are not; counted so that the report shows them.
    pub fn region_clock_windows_unbounded(&self) -> u64 {
        let mut count = 0;
        for (k, table) in self.local_windows.iter().enumerate() {
            let meta = &self.keys[k];
            let first_true = self.true_windows[k].first_index;
            for row in 0..table.windows {
                let index = table.first_index + row as u64;
                if index < first_true
                    && table.admitted_total[row] > 0
                    && self.window_bound(meta.limit_index, index).is_none()
                {
                    count += 1;
                }
            }
        }
        count
    }
}

/// `ceil(P * (W - e) / W) + C` after an admission at true time `t` in row `row`: the sliding
/// window's estimate over the trailing window, every region's units together. Nothing was
/// admitted before the run, so the first row's window before counts 0.
fn sliding_estimate_units(table: &WindowTable, row: usize, t: u64) -> u64 {
    let w = u128::from(table.window_nanos);
    let elapsed = u128::from(t % table.window_nanos);
    let previous = row
        .checked_sub(1)
        .map_or(0, |r| u128::from(table.admitted_total[r]));
    let faded = (previous * (w - elapsed)).div_ceil(w);
    u64::try_from(faded)
        .unwrap_or(u64::MAX)
        .saturating_add(table.admitted_total[row])
}

/// How long after an event its statement may take to reach the judged bound: the region's
/// next SyncUp (a sync interval), its delivery (the largest latency plus every link fault's
/// delay and reorder window), the coordinator's next statement of an ended window (a sync
/// interval), `LATE_REPORT_RESENDS` more syncs for a lost report where a link loses
/// messages, and the next sample.
pub fn report_lag(scenario: &Scenario) -> Duration {
    let latency = scenario
        .regions
        .iter()
        .map(|r| r.latency)
        .max()
        .unwrap_or_default();
    let links = scenario.faults.iter().filter_map(|f| match f {
        crate::scenario::Fault::Link { faults, .. } => Some(faults),
        _ => None,
    });
    let link_delays: Duration = links
        .clone()
        .map(|f| f.extra_delay + f.reorder_window)
        .sum();
    let resends = if links.clone().any(|f| f.loss > 0.0) {
        LATE_REPORT_RESENDS
    } else {
        0
    };
    scenario.sync_interval * (2 + resends)
        + latency
        + link_delays
        + scenario.measure.sample_interval
}

/// `value * part / whole`, rounded down (0 for an empty whole).
fn scale(value: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (u128::from(value) * u128::from(part) / u128::from(whole)) as u64
}

/// `value * part / whole`, rounded up: a share of denials that is not zero counts one at least.
fn scale_up(value: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (u128::from(value) * u128::from(part)).div_ceil(u128::from(whole)) as u64
}

/// One key's window, judged on the true clock.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowReport {
    pub limit: String,
    pub key: String,
    pub index: u64,
    /// Window start, in milliseconds from the start of the run.
    pub start_ms: u64,
    /// Wholly inside the run (only complete windows count for utilization).
    pub complete: bool,
    pub quota_units: u64,
    pub admitted_units: u64,
    pub admitted_units_per_region: Vec<u64>,
    /// Admitted in the window of the same index as each region's own clock counts it: the sum
    /// the strict invariant holds exactly, whatever the skew.
    pub admitted_units_on_region_clocks: u64,
    /// The quota those are judged against: `quota_units`, or the larger quota in force when
    /// a region whose clock is ahead admitted in this index before a reload cut it.
    pub quota_units_on_region_clocks: u64,
    pub demand_units: u64,
    /// `max(0, admitted - quota)`; for a sliding-window limit `max(0, estimate - quota)`.
    pub overshoot_units: u64,
    /// A sliding-window limit's largest estimate over the window (`P * (1 - f) + C`, every
    /// region's units, rounded up), which its bound is judged against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_units: Option<u64>,
    /// The bound stated for the window (each term at the largest the coordinator reported);
    /// `None` when the window is unbounded.
    pub bound_units: Option<u64>,
    /// No bound could be stated: nothing was, a statement said so, or part of the window had no
    /// coordinator leader and no leader stated it afterwards while it was in progress. Such a
    /// window is not judged, and is counted in the report.
    pub unbounded: bool,
    /// The run ended before the statements that could cover the window had time to arrive
    /// (it ends, or a settle raised it, within `Measure::report_lag` of the run's end): not
    /// judged, and counted in the report.
    pub cut_off: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<Bound>,
    /// `admitted / min(demand, quota)`.
    pub utilization: Option<f64>,
    pub requests: u64,
    pub denials: u64,
    pub false_denials: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalExcess {
    pub limit: LimitId,
    pub key: KeyId,
    pub window_index: u64,
    pub admitted_units: u64,
    pub allowed_units: u64,
}

/// A moment after which the system should settle again: a jump in demand or a heal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mark {
    pub at_ms: u64,
    pub what: String,
}

/// How long after `mark` false denials stayed above tolerance, in whole buckets: the first
/// bucket from which they stay within tolerance for `hold` (or until the next mark or the end)
/// is where convergence happened. `None` if that never happened before `horizon`.
pub fn convergence_after(
    m: &Measure,
    mark_at: Duration,
    horizon: Duration,
    hold: Duration,
    tolerance_percent: u64,
) -> Option<Duration> {
    let calm = |b: usize| {
        let mut attempted = 0;
        let mut false_denied = 0;
        for k in 0..m.keys.len() {
            for r in 0..m.regions {
                attempted += m.bucket_cell(k, b, r).attempted_units;
                false_denied += m.false_denied_units(k, b, r);
            }
        }
        false_denied * 100 <= attempted * tolerance_percent
    };
    first_calm_stretch(m, (mark_at, horizon), hold, calm)
}

/// How long after `mark` the allocation stayed off the fair split of the true demand
/// (`crate::allocation`), in whole buckets, as [`convergence_after`] does for false denials: a
/// bucket is calm when its sample found every strict counter's allowances within tolerance.
pub fn allocation_convergence_after(
    m: &Measure,
    mark_at: Duration,
    horizon: Duration,
    hold: Duration,
) -> Option<Duration> {
    let calm = |b: usize| m.allocation_calm[b] != Some(false);
    first_calm_stretch(m, (mark_at, horizon), hold, calm)
}

/// From the bucket of `span.0`: the start of the first run of calm buckets that lasts `hold`
/// or reaches the bucket of `span.1`, as an offset from `span.0`'s bucket.
fn first_calm_stretch(
    m: &Measure,
    span: (Duration, Duration),
    hold: Duration,
    calm: impl Fn(usize) -> bool,
) -> Option<Duration> {
    let (mark_at, horizon) = span;
    let interval = duration_nanos(m.bucket_interval());
    let first = (duration_nanos(mark_at) / interval) as usize;
    let last = ((duration_nanos(horizon).div_ceil(interval)) as usize).min(m.buckets());
    let hold_buckets = (duration_nanos(hold).div_ceil(interval) as usize).max(1);
    let mut run_start = None;
    for b in first..last {
        if !calm(b) {
            run_start = None;
            continue;
        }
        let start = *run_start.get_or_insert(b);
        if b + 1 - start >= hold_buckets || b + 1 == last {
            return Some(Duration::from_nanos((start - first) as u64 * interval));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_nodes::scenario;

    /// Quota 100 per second; two regions; 1 s windows; 10 s run; 100 ms buckets.
    const YAML: &str = r#"
name: measure-test
duration: 10s
regions:
  - id: a
    latency: 10ms
  - id: b
    latency: 10ms
limits: |
  domain: api
  descriptors:
    - key: t
      rate_limit: {unit: second, requests_per_unit: 100}
traffic:
  - region: a
    limit: api/t
    key: t=1
    rate: {constant_per_sec: 1}
"#;

    fn measure() -> (Scenario, Measure) {
        measure_of(YAML)
    }

    /// The measurement of `yaml`'s one key over the whole run.
    fn measure_of(yaml: &str) -> (Scenario, Measure) {
        let s = scenario(yaml);
        let keys = vec![KeyMeta {
            limit_index: 0,
            limit: LimitId::from("api/t"),
            key: KeyId::from("t=1"),
        }];
        let local = [LocalRange {
            first: s.start,
            last: s.end() - Duration::from_nanos(1),
        }; 2];
        let m = Measure::new(&s, keys, &local).unwrap();
        (s, m)
    }

    fn at(s: &Scenario, millis: u64) -> Timestamp {
        s.start + Duration::from_millis(millis)
    }

    /// A bound of 0 for `api/t`'s window holding `window_ms`, stated at `at_ms` (both into
    /// the run), with no region clock given.
    fn state_zero(m: &mut Measure, s: &Scenario, window_ms: u64, at_ms: u64) {
        let api = LimitId::from("api/t");
        m.bound_sample(
            &api,
            window_of(s, window_ms),
            &Bound::default(),
            at(s, at_ms),
            &[],
        );
    }

    /// The index of the one-second window holding `millis` into the run.
    fn window_of(s: &Scenario, millis: u64) -> WindowIndex {
        WindowIndex(at(s, millis).as_unix_nanos() / 1_000_000_000)
    }

    #[test]
    fn a_sliding_window_is_judged_by_its_largest_estimate() {
        let yaml = YAML.replace(
            "rate_limit: {unit: second, requests_per_unit: 100}",
            "rate_limit: {unit: second, requests_per_unit: 100}\n      allot: {algorithm: sliding_window}",
        );
        let (s, mut m) = measure_of(&yaml);
        assert!(s.limits.limits[0].sliding);
        // 100 at the end of window 0 (its window before, before the run, counts 0), then 40
        // at 250 ms into window 1 (estimate 100 * 0.75 + 40 = 115) and 30 more at 900 ms
        // (100 * 0.1 + 70 = 80): judged at 115, the largest, though 70 were admitted.
        m.admitted(0, 0, at(&s, 999), at(&s, 999), 100);
        m.admitted(0, 1, at(&s, 1_250), at(&s, 1_250), 40);
        m.admitted(0, 0, at(&s, 1_900), at(&s, 1_900), 30);
        let w = m.windows();
        assert_eq!((w[0].estimate_units, w[0].overshoot_units), (Some(100), 0));
        assert_eq!(w[1].admitted_units, 70);
        assert_eq!((w[1].estimate_units, w[1].overshoot_units), (Some(115), 15));
        // Rounded up: 33 in window 2 at a third of the way, 70 * 2/3 = 46.67 -> 47 + 33 = 80.
        m.admitted(0, 0, at(&s, 2_333), at(&s, 2_333), 33);
        let w = m.windows();
        assert_eq!(w[2].estimate_units, Some(47 + 33));
    }

    #[test]
    fn overshoot_and_utilization_per_window() {
        let (s, mut m) = measure();
        // Window 0: demand 150, 120 admitted (80 in a, 40 in b): overshoot 20,
        // utilization 120 / min(150, 100) = 1.2.
        m.request(0, 0, at(&s, 100), 100, true);
        m.request(0, 1, at(&s, 100), 50, true);
        m.admitted(0, 0, at(&s, 200), at(&s, 200), 80);
        m.admitted(0, 1, at(&s, 300), at(&s, 300), 40);
        // Window 3: demand 40, 30 admitted: utilization 0.75.
        m.request(0, 0, at(&s, 3_100), 40, true);
        m.admitted(0, 0, at(&s, 3_100), at(&s, 3_100), 30);
        let w = m.windows();
        assert_eq!(w.len(), 10);
        assert_eq!(w[0].admitted_units_per_region, vec![80, 40]);
        assert_eq!(w[0].overshoot_units, 20);
        assert_eq!(w[0].utilization, Some(1.2));
        assert_eq!(w[3].utilization, Some(0.75));
        assert_eq!(w[1].utilization, None, "no demand, nothing to judge");
    }

    #[test]
    fn a_denial_is_false_only_as_far_as_its_window_ended_with_quota_unused() {
        let (s, mut m) = measure();
        // Threshold 1% of 100 = 1 unit.
        // Window 0: 50 admitted, three denials of 10 units at 150 ms, 45 admitted later: it
        // ends with 5 unused, 4 above the threshold: 4 of the 30 denied units were false, so
        // one denial of the three counts as false.
        m.admitted(0, 0, at(&s, 100), at(&s, 100), 50);
        for _ in 0..3 {
            m.denied(0, 1, at(&s, 150), 10);
        }
        m.admitted(0, 0, at(&s, 900), at(&s, 900), 45);
        // Window 1: the whole quota admitted; its denials were all needed.
        m.admitted(0, 0, at(&s, 1_100), at(&s, 1_100), 100);
        m.denied(0, 1, at(&s, 1_200), 1);
        // Window 2: 20 admitted, 80 left unused: every denial was false.
        m.admitted(0, 0, at(&s, 2_100), at(&s, 2_100), 20);
        m.denied(0, 1, at(&s, 2_200), 5);
        m.denied(0, 1, at(&s, 2_300), 5);
        let w = m.windows();
        assert_eq!((w[0].denials, w[0].false_denials), (3, 1));
        assert_eq!((w[1].denials, w[1].false_denials), (1, 0));
        assert_eq!((w[2].denials, w[2].false_denials), (2, 2));
        // Per bucket (100 ms): the 30 units denied at 150 ms, 4 of them false.
        assert_eq!(m.false_denied_units(0, 1, 1), 4);
        assert_eq!(m.false_denied_units(0, 22, 1), 5);
    }

    #[test]
    fn settling_below_the_reservation_charges_the_admission_window() {
        let (s, mut m) = measure();
        m.admitted(0, 0, at(&s, 900), at(&s, 900), 60);
        // Settled in the next window, 60 reserved, 25 used: window 0 keeps 25.
        m.settled(0, 0, (at(&s, 900), at(&s, 900)), 60, 25, at(&s, 1_500));
        m.settled(0, 0, (at(&s, 900), at(&s, 900)), 10, 30, at(&s, 1_500));
        let w = m.windows();
        assert_eq!(w[0].admitted_units, 25 + 20);
        assert_eq!(w[1].admitted_units, 0);
    }

    #[test]
    fn windows_on_region_clocks_sum_what_each_region_counted_per_index() {
        let (s, mut m) = measure();
        // Region a's clock runs 600 ms ahead: at true 0.5 s it is in its window 1.
        // Region b admits 60 in true window 1 (its own window 1). On the true clock: 60 in
        // window 0, 60 in window 1, no overshoot. Per index on the regions' clocks, window 1
        // holds 120: above the quota of 100 (a bound of 0 stated: nothing may exceed it).
        m.admitted(0, 0, at(&s, 500), at(&s, 1_100), 60);
        m.admitted(0, 1, at(&s, 1_500), at(&s, 1_500), 60);
        state_zero(&mut m, &s, 1_200, 1_200);
        assert!(m.windows().iter().all(|w| w.overshoot_units == 0));
        assert_eq!(m.windows()[1].admitted_units_on_region_clocks, 120);
        assert_eq!(m.windows()[0].admitted_units_on_region_clocks, 0);
        let excess = m.local_window_excess();
        assert_eq!(excess.len(), 1);
        assert_eq!(excess[0].admitted_units, 120);
        assert_eq!(
            excess[0].window_index,
            s.start.as_unix_nanos() / 1_000_000_000 + 1
        );
        // A bound of 30 units without a skew term covers 20 of excess.
        let bound = one_term_bound("eventual", 30);
        m.bound_sample(
            &LimitId::from("api/t"),
            window_of(&s, 1_200),
            &bound,
            at(&s, 1_200),
            &[],
        );
        assert!(m.local_window_excess().is_empty());
    }

    #[test]
    fn windows_a_region_behind_reads_before_the_run_are_judged_when_stated() {
        let s = scenario(YAML);
        let keys = vec![KeyMeta {
            limit_index: 0,
            limit: LimitId::from("api/t"),
            key: KeyId::from("t=1"),
        }];
        // Region b's clock is 1.5 s behind: at the run's start it reads 1.5 s earlier.
        let behind = Duration::from_millis(1_500);
        let local = [
            LocalRange {
                first: s.start,
                last: s.end() - Duration::from_nanos(1),
            },
            LocalRange {
                first: s.start - behind,
                last: s.end() - behind - Duration::from_nanos(1),
            },
        ];
        let mut m = Measure::new(&s, keys, &local).unwrap();
        // At true 0.2 s, b reads -1.3 s: its window two before the run's first. It admits
        // 150 there, above the quota of 100.
        m.admitted(
            0,
            1,
            at(&s, 200),
            s.start - Duration::from_millis(1_300),
            150,
        );
        let index = s.start.as_unix_nanos() / 1_000_000_000 - 2;
        // Nothing stated for that index: unbounded, not judged, and counted.
        assert!(m.local_window_excess().is_empty());
        assert_eq!(m.region_clock_windows_unbounded(), 1);
        // Stated (a bound of 0): judged, and 50 over.
        m.bound_sample(
            &LimitId::from("api/t"),
            WindowIndex(index),
            &Bound::default(),
            at(&s, 300),
            &[],
        );
        assert_eq!(m.region_clock_windows_unbounded(), 0);
        let excess = m.local_window_excess();
        assert_eq!(excess.len(), 1);
        assert_eq!(
            (excess[0].window_index, excess[0].admitted_units),
            (index, 150)
        );
    }

    /// The run's end (10 s; a statement may take 2 * 250 ms + 10 ms + 100 ms to arrive, so
    /// judged until 9.39 s) cuts off an index on the regions' clocks whose use was raised
    /// after that, though its true window ended before: region b, 1 s behind, admits 150 in
    /// its window 8 at true 9.6 s. Raised at true 9.2 s, the same index is judged.
    #[test]
    fn the_end_cuts_off_an_index_a_region_behind_raised_in_the_run_s_last_report_lag() {
        let judged = |true_ms: u64| {
            let (s, mut m) = measure();
            m.admitted(0, 1, at(&s, true_ms), at(&s, true_ms - 1_000), 150);
            state_zero(&mut m, &s, 8_000, 8_500);
            assert!(!m.windows()[8].cut_off, "its true window ended in time");
            m.local_window_excess().len()
        };
        assert_eq!(judged(9_600), 0);
        assert_eq!(judged(9_200), 1);
        // A settle raising the index in the run's last report lag cuts it off too.
        let (s, mut m) = measure();
        m.admitted(0, 1, at(&s, 8_100), at(&s, 8_100), 100);
        m.settled(
            0,
            1,
            (at(&s, 8_100), at(&s, 8_100)),
            100,
            150,
            at(&s, 9_500),
        );
        state_zero(&mut m, &s, 8_000, 8_500);
        assert!(m.local_window_excess().is_empty());
    }

    /// A bound of one term, `name`, of `units`.
    fn one_term_bound(name: &str, units: u64) -> Bound {
        Bound {
            terms: vec![crate::node::BoundTerm {
                name: name.into(),
                units,
                measured_units: None,
            }],
            total_units: units,
            unbounded: false,
            unwatched: false,
        }
    }

    #[test]
    fn the_skew_term_covers_true_windows_but_not_windows_per_index() {
        let (s, mut m) = measure();
        m.admitted(0, 0, at(&s, 500), at(&s, 1_100), 60);
        m.admitted(0, 1, at(&s, 1_500), at(&s, 1_500), 60);
        let bound = one_term_bound(crate::node::SKEW_TERM, 30);
        m.bound_sample(
            &LimitId::from("api/t"),
            window_of(&s, 1_200),
            &bound,
            at(&s, 1_200),
            &[],
        );
        assert_eq!(m.local_window_excess().len(), 1);
    }

    #[test]
    fn each_term_of_a_window_s_bound_is_the_largest_stated_for_it() {
        let (s, mut m) = measure();
        let bound = |terms: &[(&str, u64)]| Bound {
            terms: terms
                .iter()
                .map(|(name, units)| crate::node::BoundTerm {
                    name: name.to_string(),
                    units: *units,
                    measured_units: None,
                })
                .collect(),
            total_units: terms.iter().map(|(_, u)| u).sum(),
            unbounded: false,
            unwatched: false,
        };
        // In window 2: a partition term of 40 while eu-west is cut, later none; the settle
        // overage grows from 5 to 12, the last figure arriving after the window ended. The
        // window's bound: 40 + 12 = 52 (no single statement said 52).
        let w = window_of(&s, 2_000);
        m.bound_sample(
            &LimitId::from("api/t"),
            w,
            &bound(&[("partition_floor", 40), ("settle_overage", 5)]),
            at(&s, 2_500),
            &[],
        );
        m.bound_sample(
            &LimitId::from("api/t"),
            w,
            &bound(&[("partition_floor", 0), ("settle_overage", 9)]),
            at(&s, 2_500),
            &[],
        );
        m.bound_sample(
            &LimitId::from("api/t"),
            w,
            &bound(&[("settle_overage", 12)]),
            at(&s, 2_500),
            &[],
        );
        // A window before the run is ignored, one after its end too.
        m.bound_sample(
            &LimitId::from("api/t"),
            window_of(&s, 0).0.checked_sub(1).map(WindowIndex).unwrap(),
            &bound(&[("x", 1)]),
            at(&s, 2_500),
            &[],
        );
        m.bound_sample(
            &LimitId::from("api/t"),
            window_of(&s, 60_000),
            &bound(&[("x", 1)]),
            at(&s, 2_500),
            &[],
        );
        let windows = m.windows();
        assert_eq!(windows[2].bound_units, Some(52));
        assert_eq!(windows[1].bound_units, None);
    }

    #[test]
    fn windows_without_a_bound_or_a_leader_are_unbounded_and_the_end_cuts_off() {
        let (s, mut m) = measure();
        let api = LimitId::from("api/t");
        let zero = Bound::default();
        for i in 0..10u64 {
            m.admitted(0, 0, at(&s, i * 1_000 + 100), at(&s, i * 1_000 + 100), 150);
        }
        // Window 0: stated while in progress. Window 1: stated, then a leader is lost in it and
        // none states it again. Window 2: the leader is lost, a new one states it while it is
        // still in progress. Window 3: stated only after it ended (a new leader's late terms),
        // after time without a leader. Window 4: only statements that say "unbounded" because
        // their leader did not watch it and one that bounds it (its earlier leader watched
        // it). Window 5: nothing stated. Window 6: bounded early, then a leader states it
        // unbounded for a cause it knows of (a region on a version it does not know): that
        // cause came after the early statement, which does not bound it.
        m.bound_sample(&api, window_of(&s, 0), &zero, at(&s, 500), &[]);
        m.bound_sample(&api, window_of(&s, 1_000), &zero, at(&s, 1_200), &[]);
        m.leaderless(at(&s, 1_500), &[]);
        m.leaderless(at(&s, 2_100), &[]);
        m.bound_sample(&api, window_of(&s, 2_000), &zero, at(&s, 2_500), &[]);
        m.leaderless(at(&s, 3_500), &[]);
        m.bound_sample(&api, window_of(&s, 3_000), &zero, at(&s, 4_100), &[]);
        let unwatched = Bound {
            unbounded: true,
            unwatched: true,
            ..Bound::default()
        };
        let known_cause = Bound {
            unbounded: true,
            ..Bound::default()
        };
        m.bound_sample(&api, window_of(&s, 4_000), &zero, at(&s, 4_500), &[]);
        m.bound_sample(&api, window_of(&s, 4_000), &unwatched, at(&s, 5_500), &[]);
        m.bound_sample(&api, window_of(&s, 6_000), &zero, at(&s, 6_010), &[]);
        m.bound_sample(&api, window_of(&s, 6_000), &known_cause, at(&s, 6_500), &[]);
        m.bound_sample(&api, window_of(&s, 6_000), &zero, at(&s, 6_600), &[]);
        for i in 7..10 {
            m.bound_sample(
                &api,
                window_of(&s, i * 1_000),
                &zero,
                at(&s, i * 1_000 + 10),
                &[],
            );
        }
        let w = m.windows();
        let flags: Vec<bool> = w.iter().map(|w| w.unbounded).collect();
        assert_eq!(
            flags,
            [
                false, true, false, true, false, true, true, false, false, false
            ]
        );
        assert_eq!(w[1].bound_units, None, "never a bound of 0 for lack of one");
        assert_eq!(w[0].bound_units, Some(0));
        // The run's end: 10 s; a statement may take 2 * 250 ms + 10 ms + 100 ms to arrive.
        let cut: Vec<bool> = w.iter().map(|w| w.cut_off).collect();
        assert_eq!(cut.iter().filter(|c| **c).count(), 1);
        assert!(w[9].cut_off);
        // A settle raising window 7 at 9.5 s cuts it off too.
        m.settled(0, 0, (at(&s, 7_100), at(&s, 7_100)), 10, 20, at(&s, 9_500));
        assert!(m.windows()[7].cut_off);
        m.settled(0, 0, (at(&s, 6_100), at(&s, 6_100)), 10, 20, at(&s, 8_000));
        assert!(!m.windows()[6].cut_off);
    }

    /// A region 600 ms behind is still in a window after it ended on the true clock: time
    /// without a leader then leaves that window unbounded, as for the true clock's window,
    /// unless a leader states it while some region is still in it.
    #[test]
    fn time_without_a_leader_unbounds_the_windows_regions_behind_are_still_in() {
        let (s, mut m) = measure();
        let api = LimitId::from("api/t");
        let zero = Bound::default();
        let behind = |millis: u64| at(&s, millis) - Duration::from_millis(600);
        for i in 0..10u64 {
            m.admitted(0, 0, at(&s, i * 1_000 + 100), at(&s, i * 1_000 + 100), 150);
        }
        // Window `w` (its start, in ms) stated at `t`; every window is stated at its middle,
        // in time order with the losses below.
        let state = |m: &mut Measure, w: u64, t: u64| {
            m.bound_sample(&api, window_of(&s, w), &zero, at(&s, t), &[behind(t)]);
        };
        let middles = |m: &mut Measure, windows: std::ops::Range<u64>| {
            windows.for_each(|i| state(m, i * 1_000, i * 1_000 + 500));
        };
        middles(&mut m, 0..3);
        // Lost at 3.2 s, while the region reads 2.6 s: window 2 is unbounded (window 3 is
        // stated at 3.5 s, while in progress).
        m.leaderless(at(&s, 3_200), &[behind(3_200)]);
        // Lost at 5.2 s; a leader states window 4, which the region is still in, at 5.4 s,
        // and window 5 at 5.5 s: both covered.
        middles(&mut m, 3..5);
        m.leaderless(at(&s, 5_200), &[behind(5_200)]);
        state(&mut m, 4_000, 5_400);
        middles(&mut m, 5..7);
        // Lost at 7.2 s; window 6, which the region is in until 7.6 s, is stated again only at
        // 7.7 s, after the region left it: not covered. Without the region's clock, windows 2
        // and 6 would have been judged against statements that miss what it admitted later.
        m.leaderless(at(&s, 7_200), &[behind(7_200)]);
        state(&mut m, 6_000, 7_700);
        middles(&mut m, 7..10);
        let flags: Vec<bool> = m.windows().iter().map(|w| w.unbounded).collect();
        assert_eq!(
            flags,
            [
                false, false, true, false, false, false, true, false, false, false
            ]
        );
    }

    #[test]
    fn convergence_is_the_first_calm_stretch_after_the_mark() {
        let (s, mut m) = measure();
        // From the mark at 2 s: buckets 2.0 s..2.3 s have denials above 1% of what was
        // attempted, all false (the windows end with 90 of 100 unused), then all is calm.
        // Converged after 300 ms.
        for b in 20..60u64 {
            let t = at(&s, b * 100);
            m.request(0, 0, t, 100, true);
            m.admitted(0, 0, t, t, 1);
            if b < 23 {
                m.denied(0, 0, t, 10);
            }
        }
        let after = convergence_after(
            &m,
            Duration::from_secs(2),
            Duration::from_secs(6),
            Duration::from_millis(500),
            1,
        );
        assert_eq!(after, Some(Duration::from_millis(300)));
        // Never calm for 5 buckets before a horizon of 2.6 s: 2.3..2.6 is only 3 buckets, but
        // the calm stretch reaches the horizon, which counts as converged.
        let short = convergence_after(
            &m,
            Duration::from_secs(2),
            Duration::from_millis(2_600),
            Duration::from_millis(500),
            1,
        );
        assert_eq!(short, Some(Duration::from_millis(300)));
        let never = convergence_after(
            &m,
            Duration::from_secs(2),
            Duration::from_millis(2_300),
            Duration::from_millis(500),
            1,
        );
        assert_eq!(never, None);
    }

    #[test]
    fn allocation_convergence_is_the_first_stretch_of_samples_within_tolerance() {
        let (s, mut m) = measure();
        assert!(!m.has_allocation_samples(), "nothing judged yet");
        // Samples every 100 ms from the mark at 2 s: off the fair split at 2.0, 2.1 and 2.2 s,
        // within it from 2.3 s on. Converged after 300 ms.
        for b in 20..60u64 {
            m.allocation_sample(at(&s, b * 100), b >= 23);
        }
        assert!(m.has_allocation_samples());
        let after = allocation_convergence_after(
            &m,
            Duration::from_secs(2),
            Duration::from_secs(6),
            Duration::from_millis(500),
        );
        assert_eq!(after, Some(Duration::from_millis(300)));
        // A bucket off the split in the middle of the hold restarts it: off again at 2.5 s,
        // so the first stretch of 5 calm buckets starts at 2.6 s.
        m.allocation_sample(at(&s, 2_500), false);
        let after = allocation_convergence_after(
            &m,
            Duration::from_secs(2),
            Duration::from_secs(6),
            Duration::from_millis(500),
        );
        assert_eq!(after, Some(Duration::from_millis(600)));
    }
}
