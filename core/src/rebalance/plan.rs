//! One rebalancing decision for one counter: targets by water-filling, then the grows and
//! release requests that move the table towards them. Pure: no table, no clock.
//!
//! Targets. `R = L - sum(n_r)` over regions that can be planned for, less what frozen regions
//! hold (`max(a_r, n_r)`). Region r's claim on `R` has weight `w_r`, cap `need_r` (demand rate
//! times time left in the window) and floor `min(need_r, (default_r - n_r)+)`; its target is
//! `n_r + share_r`. So a region is never targeted below its net use `n_r`, nor (while the
//! floors fit in `R`) below `min(default_r, n_r + need_r)`: it can always count on its default
//! share for demand it actually has.
//!
//! Moves. A region below its target by at least the hysteresis grows out of free quota
//! (`L - sum a_r`), the free quota water-filled over the deficits by weight. Only when the
//! deficits exceed free quota plus releases already pending are regions above their targets
//! asked to release, and only what is missing: quota nobody needs stays where it is.

use crate::ids::RegionId;
use crate::rebalance::waterfill::{Claim, water_fill};

/// One region's situation for one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionState {
    pub region: RegionId,
    pub weight_ppm: u32,
    /// `floor(w_r * L)`, the region's default whatever the table says.
    pub default_units: u64,
    /// Net use `n_r = granted - refunded` as last reported.
    pub used_units: u64,
    /// Forecast need for the rest of the window.
    pub need_units: u64,
    /// The table's `a_r` (explicit or default).
    pub allowance_units: u64,
    /// Units of a release still waiting for its ack.
    pub pending_release_units: Option<u64>,
    /// Silent, or otherwise not to be touched: neither grown nor asked to release.
    pub frozen: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterPlanInput {
    pub quota_units: u64,
    /// `L - sum a_r` as committed.
    pub free_units: u64,
    pub hysteresis_units: u64,
    /// Released units could still reach another region in time to be used. False late in
    /// the counter's window: a release only frees its units for others after a full handoff
    /// (request, ack, completion, grant), and units still in transit when the window ends are
    /// stranded, whereas left where they are they may still be used. Then only free quota
    /// moves.
    pub releases_useful: bool,
    pub regions: Vec<RegionState>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanAction {
    Grow {
        region: RegionId,
        allowance_units: u64,
    },
    Release {
        region: RegionId,
        units: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Target allocation per region, index for index with the input.
    pub targets: Vec<u64>,
    pub actions: Vec<PlanAction>,
}

pub fn plan_counter(input: &CounterPlanInput) -> Plan {
    let targets = targets(input);
    let step = input.hysteresis_units.max(1);
    let movable = |s: &RegionState| !s.frozen && s.pending_release_units.is_none();
    let deficits: Vec<u64> = input
        .regions
        .iter()
        .zip(&targets)
        .map(|(s, t)| {
            let d = t.saturating_sub(s.allowance_units);
            if movable(s) && d >= step { d } else { 0 }
        })
        .collect();
    let grow_claims: Vec<Claim> = input
        .regions
        .iter()
        .zip(&deficits)
        .map(|(s, d)| Claim {
            weight_ppm: s.weight_ppm,
            floor_units: 0,
            cap_units: *d,
        })
        .collect();
    let grows = water_fill(input.free_units, &grow_claims);
    let mut actions: Vec<PlanAction> = input
        .regions
        .iter()
        .zip(&grows)
        .filter(|(_, g)| **g > 0)
        .map(|(s, g)| PlanAction::Grow {
            region: s.region.clone(),
            allowance_units: s.allowance_units + g,
        })
        .collect();
    let unmet = deficits.iter().sum::<u64>() - grows.iter().sum::<u64>();
    let pending: u64 = input
        .regions
        .iter()
        .filter_map(|s| s.pending_release_units)
        .sum();
    let missing = unmet.saturating_sub(pending);
    if missing >= step && input.releases_useful {
        actions.extend(releases(input, &targets, missing, step));
    }
    Plan { targets, actions }
}

fn targets(input: &CounterPlanInput) -> Vec<u64> {
    let held: u64 = input
        .regions
        .iter()
        .map(|s| {
            if s.frozen {
                s.allowance_units.max(s.used_units)
            } else {
                s.used_units
            }
        })
        .fold(0u64, u64::saturating_add);
    let remaining = input.quota_units.saturating_sub(held);
    let claims: Vec<Claim> = input
        .regions
        .iter()
        .map(|s| {
            let cap = if s.frozen { 0 } else { s.need_units };
            Claim {
                weight_ppm: s.weight_ppm,
                floor_units: cap.min(s.default_units.saturating_sub(s.used_units)),
                cap_units: cap,
            }
        })
        .collect();
    let shares = water_fill(remaining, &claims);
    input
        .regions
        .iter()
        .zip(shares)
        .map(|(s, share)| {
            if s.frozen {
                s.allowance_units
            } else {
                s.used_units.saturating_add(share)
            }
        })
        .collect()
}

/// Ask regions above their targets for `missing` units in all, spread max-min fairly over
/// their surpluses so that no one region is drained while another keeps a large surplus.
fn releases(input: &CounterPlanInput, targets: &[u64], missing: u64, step: u64) -> Vec<PlanAction> {
    let claims: Vec<Claim> = input
        .regions
        .iter()
        .zip(targets)
        .map(|(s, t)| {
            let movable = !s.frozen && s.pending_release_units.is_none();
            Claim {
                weight_ppm: 1,
                floor_units: 0,
                cap_units: if movable {
                    s.allowance_units.saturating_sub(*t)
                } else {
                    0
                },
            }
        })
        .collect();
    let amounts = water_fill(missing, &claims);
    input
        .regions
        .iter()
        .zip(amounts)
        .filter(|(_, units)| *units >= step)
        .map(|(s, units)| PlanAction::Release {
            region: s.region.clone(),
            units,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(name: &str, used: u64, need: u64, allowance: u64) -> RegionState {
        RegionState {
            region: RegionId::from(name),
            weight_ppm: 500_000,
            default_units: 50,
            used_units: used,
            need_units: need,
            allowance_units: allowance,
            pending_release_units: None,
            frozen: false,
        }
    }

    fn input(regions: Vec<RegionState>) -> CounterPlanInput {
        let quota_units = 100;
        let held: u64 = regions.iter().map(|r| r.allowance_units).sum();
        CounterPlanInput {
            quota_units,
            free_units: quota_units - held,
            hysteresis_units: 1,
            releases_useful: true,
            regions,
        }
    }

    #[test]
    fn idle_quota_moves_to_demand_in_one_release_then_one_grow() {
        // L = 100, two regions of weight 1/2 at their defaults (50 each).
        // A: n = 40, needs 40 more; B: n = 0, needs nothing.
        // R = 100 - 40 = 60. Floors: A min(40, 50-40) = 10, B 0. A's cap 40 fits: A 40, B 0.
        // Targets: A 80, B 0. A's deficit 30 > free 0, so B (surplus 50) is asked for 30.
        let plan = plan_counter(&input(vec![region("a", 40, 40, 50), region("b", 0, 0, 50)]));
        assert_eq!(plan.targets, vec![80, 0]);
        assert_eq!(
            plan.actions,
            vec![PlanAction::Release {
                region: RegionId::from("b"),
                units: 30
            }]
        );
    }

    #[test]
    fn free_quota_is_granted_without_touching_anyone() {
        // After the release above commits: a_A = 50, a_B = 20, free 30. Same demand.
        let plan = plan_counter(&input(vec![region("a", 40, 40, 50), region("b", 0, 0, 20)]));
        assert_eq!(
            plan.actions,
            vec![PlanAction::Grow {
                region: RegionId::from("a"),
                allowance_units: 80
            }]
        );
    }

    #[test]
    fn competing_demand_is_split_fairly_and_floors_hold() {
        // L = 100. A: n 10, need 100; B: n 10, need 100. R = 80; floors 40 each (50-10 < 100);
        // level fills above: 40/40. Targets 50 and 50 = their defaults: nothing to do.
        let plan = plan_counter(&input(vec![
            region("a", 10, 100, 50),
            region("b", 10, 100, 50),
        ]));
        assert_eq!(plan.targets, vec![50, 50]);
        assert!(plan.actions.is_empty());
    }

    #[test]
    fn a_pending_release_blocks_grows_and_counts_as_coming_quota() {
        // B has 30 pending; A still short by 30 with no free quota: no grow for B, no second
        // release (the pending 30 covers A's deficit).
        let mut b = region("b", 0, 0, 50);
        b.pending_release_units = Some(30);
        let plan = plan_counter(&input(vec![region("a", 40, 40, 50), b]));
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    }

    #[test]
    fn frozen_regions_keep_what_they_hold() {
        // B is silent with a_B = 50, n_B = 10: it keeps 50; R for A = 100 - 50 - 40 = 10.
        let mut b = region("b", 10, 0, 50);
        b.frozen = true;
        let plan = plan_counter(&input(vec![region("a", 40, 100, 50), b]));
        assert_eq!(plan.targets, vec![50, 50]);
        assert!(plan.actions.is_empty());
    }

    #[test]
    fn when_releases_come_too_late_only_free_quota_moves() {
        // The worked example above with a_B = 40 (free 10) and no time left to move released
        // units: A's target is still 80 (deficit 30), it grows by the free 10 to 60, and B
        // keeps its 40, since units it released now would reach A only after the window.
        let mut i = input(vec![region("a", 40, 40, 50), region("b", 0, 0, 40)]);
        i.releases_useful = false;
        let plan = plan_counter(&i);
        assert_eq!(plan.targets, vec![80, 0]);
        assert_eq!(
            plan.actions,
            vec![PlanAction::Grow {
                region: RegionId::from("a"),
                allowance_units: 60
            }]
        );
    }

    #[test]
    fn hysteresis_ignores_small_moves() {
        // A short by 3 units, hysteresis 5: no action.
        let mut i = input(vec![region("a", 50, 3, 50), region("b", 0, 0, 45)]);
        i.hysteresis_units = 5;
        assert!(plan_counter(&i).actions.is_empty());
    }
}
