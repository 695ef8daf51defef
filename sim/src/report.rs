//! The report of an invocation: per seed, and summed up over all seeds.
//!
//! Every figure in it comes from the run's tallies, so the same seed always gives the same
//! bytes, except `sim_requests_per_wall_second`, which measures the machine running the
//! simulation (and is 0 when wall-clock timing is off, as in the determinism tests).

use std::time::Duration;

use serde::Serialize;

use crate::check::Violation;
use crate::engine::{RunOutcome, RunStats};
use crate::error::Result;
use crate::measure::{WindowReport, allocation_convergence_after, convergence_after};
use crate::node::Policy;
use crate::scenario::Scenario;

/// The report of one invocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub scenario: String,
    /// `A..B`: seeds A to B - 1.
    pub seeds: String,
    pub runs: u64,
    /// Over all seeds (in the JSON, at the top level).
    #[serde(flatten)]
    pub figures: Figures,
    pub per_seed: Vec<SeedReport>,
    /// Series of the first seed, for [`crate::plot::write_svg`].
    #[serde(skip)]
    pub plot: Option<PlotData>,
}

/// The figures a run is judged by: for one seed, or over all of them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// Invariant failures; 0 when all hold.
    pub violations: u64,
    pub overshoot_max: u64,
    /// Smallest `bound - overshoot` over the judged windows (negative: a violation).
    pub bound_min_slack: Option<i64>,
    /// Windows (per key) for which no bound could be stated: part of them had no coordinator
    /// leader that covered it, or nothing was stated. Not judged; a run that is unbounded
    /// everywhere judges nothing, so this is part of its result.
    pub windows_unbounded: u64,
    /// Windows (per key) the run's end cut off: the statements that could cover them had not
    /// had time to arrive (`measure::report_lag`). Not judged.
    pub windows_cut_off: u64,
    /// Windows (per key) on a region's clock that ended before the run began on the true
    /// clock, with admissions and no bound (`Measure::region_clock_windows_unbounded`). Not
    /// judged.
    pub region_clock_windows_unbounded: u64,
    /// The same per window index on the regions' own clocks, against the bound without its
    /// skew term: where strict mode must hold exactly (0 beyond the measured terms).
    pub overshoot_max_on_region_clocks: u64,
    pub bound_min_slack_on_region_clocks: Option<i64>,
    /// The stated bound as a share of the quota over the judged windows (lower median, and
    /// largest): how much the bound promises. A bound of `L` or more promises little.
    pub bound_to_quota_p50: Option<f64>,
    pub bound_to_quota_max: Option<f64>,
    pub utilization_p50: Option<f64>,
    pub utilization_min: Option<f64>,
    /// The same seeds under the static-split baseline.
    pub baseline_utilization_p50: Option<f64>,
    pub convergence_ms_max: Option<u64>,
    /// The same for the allocation (`crate::allocation`): `None` without marks or without
    /// strict counters.
    pub allocation_convergence_ms_max: Option<u64>,
    /// False denials over all requests.
    pub false_denial_rate: f64,
    pub sim_requests_per_wall_second: f64,
}

/// One seed: its run under the product's policy, and its baseline run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    /// The command that replays this seed alone.
    pub replay: String,
    #[serde(flatten)]
    pub figures: Figures,
    pub stats: RunStats,
    pub baseline_stats: RunStats,
    pub convergence: Vec<Convergence>,
    pub violation_details: Vec<Violation>,
    pub windows: Vec<WindowReport>,
}

/// Recovery after one mark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Convergence {
    pub at_ms: u64,
    pub what: String,
    /// `None`: false denials never settled before the next mark or the end.
    pub converged_after_ms: Option<u64>,
    /// Until every strict counter's allowances stayed within tolerance of the fair split of
    /// the true demand (`crate::allocation`); `None`: never before the next mark or the end,
    /// or no strict counter to judge.
    pub allocation_converged_after_ms: Option<u64>,
    /// Time to the next mark or the end of the run.
    pub horizon_ms: u64,
}

/// Admitted rate per region over time for one limit, with its quota and bound as rates.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotData {
    pub title: String,
    pub limit: String,
    pub bucket: Duration,
    pub regions: Vec<String>,
    /// Per region, per bucket: units per second.
    pub admitted_per_sec: Vec<Vec<f64>>,
    pub quota_per_sec: f64,
    /// Per bucket: `(quota + bound) / window`, where a bound was reported.
    pub bound_per_sec: Vec<Option<f64>>,
}

/// A finished run with its wall-clock time (zero when not measured).
pub struct TimedRun {
    pub outcome: RunOutcome,
    pub wall: Duration,
}

/// The replay command for one seed.
pub fn replay_command(scenario: &Scenario, seed: u64) -> String {
    format!(
        "allot sim --scenario {} --seeds {seed}..{}",
        scenario.file,
        seed + 1
    )
}

impl Report {
    /// Builds the report from every run, primary and baseline, in any order.
    pub fn build(scenario: &Scenario, seeds: std::ops::Range<u64>, runs: Vec<TimedRun>) -> Self {
        let (mut primary, mut baseline): (Vec<_>, Vec<_>) = runs
            .into_iter()
            .partition(|r| r.outcome.spec.policy == Policy::Rebalancing);
        primary.sort_by_key(|r| r.outcome.spec.seed);
        baseline.sort_by_key(|r| r.outcome.spec.seed);
        let plot = primary.first().map(|r| plot_data(scenario, &r.outcome));
        let mut per_seed = Vec::with_capacity(primary.len());
        let mut all_util = Vec::new();
        let mut all_bound_ratios = Vec::new();
        let mut all_base_util = Vec::new();
        let (mut requests, mut false_denials) = (0u64, 0u64);
        let (mut sim_requests, mut wall) = (0u64, Duration::ZERO);
        for run in primary {
            let base = baseline
                .iter()
                .position(|b| b.outcome.spec.seed == run.outcome.spec.seed)
                .map(|i| baseline.swap_remove(i));
            let seed = SeedReport::build(scenario, &run, base.as_ref());
            all_util.extend(utilizations(&seed.windows));
            all_bound_ratios.extend(bound_ratios(&seed.windows));
            if let Some(b) = &base {
                all_base_util.extend(utilizations(&b.outcome.measure.windows()));
                sim_requests += b.outcome.stats.requests;
                wall += b.wall;
            }
            requests += seed.stats.requests;
            false_denials += seed.windows.iter().map(|w| w.false_denials).sum::<u64>();
            sim_requests += seed.stats.requests;
            wall += run.wall;
            per_seed.push(seed);
        }
        let figures = Figures {
            violations: per_seed.iter().map(|s| s.figures.violations).sum(),
            overshoot_max: per_seed
                .iter()
                .map(|s| s.figures.overshoot_max)
                .max()
                .unwrap_or(0),
            bound_min_slack: per_seed
                .iter()
                .filter_map(|s| s.figures.bound_min_slack)
                .min(),
            windows_unbounded: per_seed.iter().map(|s| s.figures.windows_unbounded).sum(),
            windows_cut_off: per_seed.iter().map(|s| s.figures.windows_cut_off).sum(),
            region_clock_windows_unbounded: per_seed
                .iter()
                .map(|s| s.figures.region_clock_windows_unbounded)
                .sum(),
            overshoot_max_on_region_clocks: per_seed
                .iter()
                .map(|s| s.figures.overshoot_max_on_region_clocks)
                .max()
                .unwrap_or(0),
            bound_min_slack_on_region_clocks: per_seed
                .iter()
                .filter_map(|s| s.figures.bound_min_slack_on_region_clocks)
                .min(),
            bound_to_quota_max: all_bound_ratios.iter().copied().reduce(f64::max),
            bound_to_quota_p50: median(&mut all_bound_ratios),
            utilization_p50: median(&mut all_util),
            utilization_min: all_util.iter().copied().reduce(f64::min),
            baseline_utilization_p50: median(&mut all_base_util),
            convergence_ms_max: per_seed
                .iter()
                .filter_map(|s| s.figures.convergence_ms_max)
                .max(),
            allocation_convergence_ms_max: per_seed
                .iter()
                .filter_map(|s| s.figures.allocation_convergence_ms_max)
                .max(),
            false_denial_rate: ratio(false_denials, requests),
            sim_requests_per_wall_second: per_second(sim_requests, wall),
        };
        Report {
            scenario: scenario.name.clone(),
            seeds: format!("{}..{}", seeds.start, seeds.end),
            runs: per_seed.len() as u64,
            figures,
            per_seed,
            plot,
        }
    }

    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Seeds with at least one violation.
    pub fn failing_seeds(&self) -> impl Iterator<Item = &SeedReport> {
        self.per_seed.iter().filter(|s| s.figures.violations > 0)
    }
}

impl SeedReport {
    fn build(scenario: &Scenario, run: &TimedRun, baseline: Option<&TimedRun>) -> Self {
        let o = &run.outcome;
        let windows = o.measure.windows();
        let mut checker = o.checker.clone();
        for w in windows.iter().filter(|w| is_judged(w)) {
            let bound = w.bound_units.unwrap_or(0);
            if w.overshoot_units > bound {
                checker.record(
                    "overshoot_above_bound",
                    w.start_ms,
                    format!(
                        "{} {} window {}: admitted {}{} of quota {}, overshoot {} above bound {}",
                        w.limit,
                        w.key,
                        w.index,
                        w.admitted_units,
                        w.estimate_units
                            .map_or(String::new(), |e| format!(" (sliding estimate {e})")),
                        w.quota_units,
                        w.overshoot_units,
                        bound
                    ),
                );
            }
        }
        for e in o.measure.local_window_excess() {
            checker.record(
                "overshoot_above_bound_on_region_clocks",
                0,
                format!(
                    "{} {} window index {} on the regions' clocks: admitted {} above {} \
                     (quota plus the bound without its skew term)",
                    e.limit, e.key, e.window_index, e.admitted_units, e.allowed_units
                ),
            );
        }
        let mut util = utilizations(&windows);
        let convergence = convergence(scenario, o);
        let false_denials: u64 = windows.iter().map(|w| w.false_denials).sum();
        let figures = Figures {
            violations: checker.count(),
            overshoot_max: windows.iter().map(|w| w.overshoot_units).max().unwrap_or(0),
            bound_min_slack: windows
                .iter()
                .filter(|w| is_judged(w))
                .map(|w| w.bound_units.unwrap_or(0) as i64 - w.overshoot_units as i64)
                .min(),
            windows_unbounded: windows.iter().filter(|w| w.unbounded).count() as u64,
            windows_cut_off: windows.iter().filter(|w| w.cut_off).count() as u64,
            region_clock_windows_unbounded: o.measure.region_clock_windows_unbounded(),
            overshoot_max_on_region_clocks: windows
                .iter()
                .map(region_clock_overshoot)
                .max()
                .unwrap_or(0),
            bound_min_slack_on_region_clocks: windows
                .iter()
                .filter(|w| is_judged(w))
                .map(|w| {
                    let bound = w.bound.as_ref().map_or(0, |b| b.without_skew_units());
                    bound as i64 - region_clock_overshoot(w) as i64
                })
                .min(),
            bound_to_quota_max: bound_ratios(&windows).into_iter().reduce(f64::max),
            bound_to_quota_p50: median(&mut bound_ratios(&windows)),
            utilization_min: util.iter().copied().reduce(f64::min),
            utilization_p50: median(&mut util),
            baseline_utilization_p50: baseline
                .and_then(|b| median(&mut utilizations(&b.outcome.measure.windows()))),
            convergence_ms_max: convergence
                .iter()
                .map(|c| c.converged_after_ms.unwrap_or(c.horizon_ms))
                .max(),
            allocation_convergence_ms_max: o
                .measure
                .has_allocation_samples()
                .then(|| {
                    convergence
                        .iter()
                        .map(|c| c.allocation_converged_after_ms.unwrap_or(c.horizon_ms))
                        .max()
                })
                .flatten(),
            false_denial_rate: ratio(false_denials, o.stats.requests),
            sim_requests_per_wall_second: per_second(o.stats.requests, run.wall),
        };
        SeedReport {
            seed: o.spec.seed,
            replay: replay_command(scenario, o.spec.seed),
            figures,
            stats: o.stats.clone(),
            baseline_stats: baseline
                .map(|b| b.outcome.stats.clone())
                .unwrap_or_default(),
            convergence,
            violation_details: checker.into_details(),
            windows,
        }
    }
}

fn convergence(scenario: &Scenario, o: &RunOutcome) -> Vec<Convergence> {
    let end_ms = scenario.duration.as_millis() as u64;
    let m = &scenario.measure;
    o.marks
        .iter()
        .map(|mark| {
            let horizon_at = o
                .marks
                .iter()
                .map(|n| n.at_ms)
                .find(|&t| t > mark.at_ms)
                .unwrap_or(end_ms);
            let after = convergence_after(
                &o.measure,
                Duration::from_millis(mark.at_ms),
                Duration::from_millis(horizon_at),
                m.convergence_hold,
                u64::from(m.convergence_tolerance_percent),
            );
            let allocation = o
                .measure
                .has_allocation_samples()
                .then(|| {
                    allocation_convergence_after(
                        &o.measure,
                        Duration::from_millis(mark.at_ms),
                        Duration::from_millis(horizon_at),
                        m.convergence_hold,
                    )
                })
                .flatten();
            Convergence {
                at_ms: mark.at_ms,
                what: mark.what.clone(),
                converged_after_ms: after.map(|d| d.as_millis() as u64),
                allocation_converged_after_ms: allocation.map(|d| d.as_millis() as u64),
                horizon_ms: horizon_at - mark.at_ms,
            }
        })
        .collect()
}

/// A window with a bound, and whose statements had time to arrive before the run ended.
fn is_judged(w: &WindowReport) -> bool {
    !w.unbounded && !w.cut_off
}

/// Admitted above the quota per window index on the regions' own clocks.
fn region_clock_overshoot(w: &WindowReport) -> u64 {
    w.admitted_units_on_region_clocks
        .saturating_sub(w.quota_units_on_region_clocks)
}

fn utilizations(windows: &[WindowReport]) -> Vec<f64> {
    windows.iter().filter_map(|w| w.utilization).collect()
}

/// `bound / quota` of every judged window with a quota.
fn bound_ratios(windows: &[WindowReport]) -> Vec<f64> {
    windows
        .iter()
        .filter(|w| is_judged(w) && w.quota_units > 0)
        .filter_map(|w| w.bound_units.map(|b| b as f64 / w.quota_units as f64))
        .collect()
}

/// The lower median (nearest rank), or `None` for no values.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[(values.len() - 1) / 2])
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn per_second(count: u64, wall: Duration) -> f64 {
    if wall.is_zero() {
        0.0
    } else {
        (count as f64 / wall.as_secs_f64()).round()
    }
}

/// The first limit's admitted rate per region, summed over its keys.
fn plot_data(scenario: &Scenario, o: &RunOutcome) -> PlotData {
    let m = &o.measure;
    let limit_index = 0;
    let limit = &scenario.limits.limits[limit_index];
    let bucket = m.bucket_interval();
    let bucket_secs = bucket.as_secs_f64();
    let keys: Vec<usize> = (0..m.keys.len())
        .filter(|&k| m.keys[k].limit_index == limit_index)
        .collect();
    let admitted_per_sec = (0..scenario.regions.len())
        .map(|r| {
            (0..m.buckets())
                .map(|b| {
                    let units: u64 = keys
                        .iter()
                        .map(|&k| m.bucket_cell(k, b, r).admitted_units)
                        .sum();
                    units as f64 / bucket_secs
                })
                .collect()
        })
        .collect();
    let window_secs = limit.window.len().as_secs_f64();
    let windows = m.windows();
    let bound_per_sec = (0..m.buckets())
        .map(|b| {
            let t = scenario.start + bucket * (b as u32);
            let index = limit.window.index(t).0;
            windows
                .iter()
                .find(|w| w.limit == limit.id.as_str() && w.index == index)
                .and_then(|w| w.bound_units)
                .map(|bound| (limit.quota_units + bound) as f64 / window_secs)
        })
        .collect();
    PlotData {
        title: format!("{}: seed {}", scenario.name, o.spec.seed),
        limit: limit.id.to_string(),
        bucket,
        regions: scenario.regions.iter().map(|r| r.id.to_string()).collect(),
        admitted_per_sec,
        quota_per_sec: limit.quota_units as f64 / window_secs,
        bound_per_sec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_the_lower_middle_value() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [0.9, 1.0, 0.5]), Some(0.9));
    }
}
