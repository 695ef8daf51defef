//! Sampling: the periodic measurement and checks, and the judgement of allocations against the fair
//! split.

use allot_core::limit::WEIGHT_SCALE_PPM;
use allot_core::sync::CounterRef;
use allot_core::time::{Timestamp, duration_nanos};

use crate::allocation::{RegionDemand, fair_targets, mean_units, within_tolerance};
use crate::error::Result;
use crate::measure::Measure;
use crate::node::{
    CoordinatorNode, CoordinatorObservation, NodeFactory, Policy, RegionNode, RegionObservation,
};
use crate::scenario::Scenario;

use super::{Engine, Event};

/// Region `region`'s strict allowances for the current window of each key it holds, from its
/// observation, into `out[key][region]`.
pub(super) fn record_allowances(
    scenario: &Scenario,
    measure: &Measure,
    local: Timestamp,
    obs: &RegionObservation,
    region: usize,
    out: &mut [Vec<Option<u64>>],
) {
    for a in &obs.allowances {
        let Some(units) = a.strict_allowance_units else {
            continue;
        };
        let current = scenario
            .limit(&a.counter.limit)
            .is_some_and(|l| a.counter.window == l.window.index(local));
        let key = measure
            .keys
            .iter()
            .position(|k| k.limit == a.counter.limit && k.key == a.counter.key);
        if let (true, Some(k)) = (current, key) {
            out[k][region] = Some(units);
        }
    }
}

/// `floor(w_r * L)`, as the product computes a region's default share.
pub(super) fn default_share(quota_units: u64, weight_ppm: u32) -> u64 {
    (u128::from(quota_units) * u128::from(weight_ppm) / u128::from(WEIGHT_SCALE_PPM)) as u64
}

impl<'s, F: NodeFactory> Engine<'s, F> {
    pub(super) fn offset_ms(&self) -> u64 {
        self.now
            .saturating_duration_since(self.scenario.start)
            .as_millis() as u64
    }

    /// What each region's window clock reads now: the clock its agent reads windows on (its
    /// raw clock while the agent is down), on which its admissions are judged.
    pub(super) fn region_window_clocks(&self) -> Vec<Timestamp> {
        self.regions
            .iter()
            .map(|r| {
                let local = r.agent_clock.local(self.now);
                r.node
                    .as_ref()
                    .map_or(local, |n| n.window_clock(local, None))
            })
            .collect()
    }

    pub(super) fn sample(&mut self) -> Result<()> {
        let at_ms = self.offset_ms();
        let scenario = self.scenario;
        let coordinator = self.coordinator.node.as_ref();
        let judge = self.spec.policy == Policy::Rebalancing;
        let mut allowances = vec![vec![None; self.regions.len()]; self.measure.keys.len()];
        for (i, r) in self.regions.iter().enumerate() {
            let Some(node) = r.node.as_ref() else {
                continue;
            };
            let mut obs = RegionObservation::default();
            node.observe(&mut obs);
            // Windows are judged on the clock the region reads them on (corrected, with a
            // timebase), not its raw clock, which may sit in a neighbouring window.
            let local = node.window_clock(r.agent_clock.local(self.now), None);
            if judge {
                record_allowances(scenario, &self.measure, local, &obs, i, &mut allowances);
            }
            self.checker.region(at_ms, i, &obs);
            let Some(coordinator) = coordinator else {
                continue;
            };
            let is_current = |c: &CounterRef| {
                scenario
                    .limit(&c.limit)
                    .is_some_and(|l| c.window == l.window.index(local))
            };
            let same_version = obs.config_version.zip(coordinator.config_version());
            let same_version = same_version.is_none_or(|(region, table)| region == table);
            let table = |c: &CounterRef| {
                same_version
                    .then(|| coordinator.table_allowance(c, &r.id))
                    .flatten()
            };
            self.checker
                .region_against_table(at_ms, r.id.as_str(), &obs, table, is_current);
        }
        if let Some(node) = coordinator {
            let mut obs = CoordinatorObservation::default();
            node.observe(self.now, &mut obs);
            self.checker.coordinator(at_ms, &obs);
            let clocks = self.region_window_clocks();
            for (limit, window, bound) in &obs.bounds {
                self.measure
                    .bound_sample(limit, *window, bound, self.now, &clocks);
            }
        } else if judge {
            let clocks = self.region_window_clocks();
            self.measure.leaderless(self.now, &clocks);
        }
        if judge {
            self.judge_allocation(&allowances);
        }
        self.push(
            self.now + self.scenario.measure.sample_interval,
            Event::Sample,
        )
    }

    /// Judges every strict counter's allocation against the fair split of the demand the
    /// sources ask for now (`crate::allocation`). `allowances[k][r]`: region r's allowance for
    /// key k in its current window, where it enforces a strict one.
    pub(super) fn judge_allocation(&mut self, allowances: &[Vec<Option<u64>>]) {
        let t = duration_nanos(self.now.saturating_duration_since(self.scenario.start));
        let mut judged = false;
        let mut calm = true;
        for (k, held) in allowances.iter().enumerate() {
            if held.iter().all(Option::is_none) {
                continue;
            }
            let limit = &self.scenario.limits.limits[self.measure.keys[k].limit_index];
            let window_secs = limit.window.len().as_secs_f64();
            let mut demand_per_sec = vec![0.0; held.len()];
            for (src, spec) in self.sources.iter().zip(&self.scenario.traffic) {
                let live = duration_nanos(spec.start) <= t && t < duration_nanos(spec.end);
                if src.key == k && live {
                    demand_per_sec[src.region] += spec.rate.rate_at(t) * mean_units(&spec.cost);
                }
            }
            let regions: Vec<RegionDemand> = self
                .scenario
                .regions
                .iter()
                .zip(&demand_per_sec)
                .map(|(r, d)| RegionDemand {
                    weight_ppm: r.weight_ppm,
                    default_units: default_share(limit.quota_units, r.weight_ppm),
                    window_demand_units: (d * window_secs).ceil() as u64,
                })
                .collect();
            let targets = fair_targets(limit.quota_units, &regions);
            judged = true;
            calm &= within_tolerance(limit.quota_units, held, &targets);
        }
        if judged {
            self.measure.allocation_sample(self.now, calm);
        }
    }
}
