//! Allocation convergence: whether every region's allowance for a strict counter is where the
//! true demand says it should be, judged at each sample against the weighted max-min fair
//! water-fill of the quota over what each region's clients ask for in a window.
//!
//! This measures "convergence to a moved demand" directly, on the allocation, beside the
//! false-denial measure (`crate::measure::convergence_after`), which also counts quota that a
//! converged allocation still leaves unused at the end of a window (demand noise, leases).

use allot_core::rebalance::waterfill::{Claim, water_fill};

use crate::traffic::{CostModel, TokenDist};

/// A region's allowance is close enough to its fair target when it is at most this share of
/// the quota below it. Within a window a region's demand fluctuates by about 3% of the quota
/// in the shipped scenarios (one standard deviation of a Poisson count of a few hundred
/// units), so no forecast can promise to come closer than that.
pub const ALLOCATION_TOLERANCE_PERCENT: u64 = 5;

/// Units one request of `cost` uses on average: its actual size for a reservation.
pub fn mean_units(cost: &CostModel) -> f64 {
    match cost {
        CostModel::Constant { units } => *units as f64,
        CostModel::Llm(llm) => match llm.actual {
            TokenDist::Constant { units } => units as f64,
            TokenDist::Uniform {
                min_units,
                max_units,
            } => (min_units + max_units) as f64 / 2.0,
            // The mean of the uncapped log-normal, capped: close enough for long tails cut
            // far out.
            TokenDist::LogNormal {
                median_units,
                sigma,
                max_units,
            } => (median_units * (sigma * sigma / 2.0).exp()).min(max_units as f64),
        },
    }
}

/// One region's part in a counter's fair split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegionDemand {
    pub weight_ppm: u32,
    /// `floor(w_r * L)`.
    pub default_units: u64,
    /// What its clients ask for over one window, in units.
    pub window_demand_units: u64,
}

/// The fair allocation of `quota_units` over the regions' demands: weighted max-min fair,
/// each capped at its demand, and each sure of its default share up to its demand (the
/// rebalancer's floor rule, `docs/rebalance.md`).
pub fn fair_targets(quota_units: u64, regions: &[RegionDemand]) -> Vec<u64> {
    let claims: Vec<Claim> = regions
        .iter()
        .map(|r| Claim {
            weight_ppm: r.weight_ppm,
            floor_units: r.default_units.min(r.window_demand_units),
            cap_units: r.window_demand_units,
        })
        .collect();
    water_fill(quota_units, &claims)
}

/// Every region whose allowance is known holds at least its target less the tolerance.
/// (Above the target is no shortfall: the sum of allowances is at most the quota, so a region
/// above its target only holds what the others' targets leave over.)
pub fn within_tolerance(quota_units: u64, allowances: &[Option<u64>], targets: &[u64]) -> bool {
    let tolerance = quota_units * ALLOCATION_TOLERANCE_PERCENT / 100;
    allowances
        .iter()
        .zip(targets)
        .all(|(a, t)| a.is_none_or(|a| a.saturating_add(tolerance) >= *t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(weight_ppm: u32, default_units: u64, window_demand_units: u64) -> RegionDemand {
        RegionDemand {
            weight_ppm,
            default_units,
            window_demand_units,
        }
    }

    #[test]
    fn demand_above_the_quota_is_split_by_weight_after_the_small_region_is_served() {
        // The partition scenario's tenant: L = 500 a second, weights 0.4 / 0.4 / 0.2
        // (defaults 200 / 200 / 100), demands 300 / 250 / 50 a second. ap-south's 50 is below
        // its floor: served whole. The other 450 go by weight, 225 each (both want more).
        let targets = fair_targets(
            500,
            &[
                region(400_000, 200, 300),
                region(400_000, 200, 250),
                region(200_000, 100, 50),
            ],
        );
        assert_eq!(targets, vec![225, 225, 50]);
        // Tolerance 5% of 500 = 25: eu-west at 200 is just within, at 199 it is not; an
        // unknown allowance (agent down) is not judged.
        assert!(within_tolerance(
            500,
            &[Some(220), Some(200), Some(60)],
            &targets
        ));
        assert!(!within_tolerance(
            500,
            &[Some(230), Some(199), Some(60)],
            &targets
        ));
        assert!(within_tolerance(
            500,
            &[Some(225), None, Some(50)],
            &targets
        ));
    }

    #[test]
    fn a_flash_crowd_gets_what_the_quiet_region_does_not_use() {
        // flash-crowd: L = 1000, equal weights (defaults 500), us-east asks 100 a second,
        // eu-west 2000: us-east is served whole, eu-west gets the other 900.
        let targets = fair_targets(
            1000,
            &[region(500_000, 500, 100), region(500_000, 500, 2000)],
        );
        assert_eq!(targets, vec![100, 900]);
    }
}
