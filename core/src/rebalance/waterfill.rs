//! Weighted max-min fair water-filling with floors and caps, in exact integer arithmetic.
//!
//! Each claimant `i` has a weight `w_i`, a floor `f_i` and a cap `c_i` (`f_i <= c_i`). For a
//! water level `λ` its share is `clamp(λ * w_i, f_i, c_i)`; the level rises until the shares use
//! up `total` or every claimant sits at its cap. The result is the weighted max-min fair
//! allocation subject to the floors: nobody gets more than its cap, nobody less than its floor,
//! and among claimants strictly between the two, shares are proportional to weights.
//!
//! When even the floors do not fit (`sum f_i > total`), the floors become the caps and the same
//! filling runs with no floors: the floors are then shared fairly instead of honoured in full.

use crate::limit::WEIGHT_SCALE_PPM;

/// One claimant of a water-filling round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Share of the water level, in ppm; zero is treated as 1 ppm so that quota nobody else
    /// wants still flows to a region without a configured weight.
    pub weight_ppm: u32,
    pub floor_units: u64,
    pub cap_units: u64,
}

/// Shares of `total_units` for `claims`, index for index. `sum(shares) <= total_units`, and
/// `sum(shares) == min(total_units, sum(caps))`.
pub fn water_fill(total_units: u64, claims: &[Claim]) -> Vec<u64> {
    let claims: Vec<Claim> = claims.iter().map(normalise).collect();
    let floors: u128 = claims.iter().map(|c| u128::from(c.floor_units)).sum();
    let shares = if floors > u128::from(total_units) {
        let floors_as_caps: Vec<Claim> = claims
            .iter()
            .map(|c| Claim {
                weight_ppm: c.weight_ppm,
                floor_units: 0,
                cap_units: c.floor_units,
            })
            .collect();
        fill(total_units, &floors_as_caps)
    } else {
        fill(total_units, &claims)
    };
    debug_assert!(shares.iter().map(|s| u128::from(*s)).sum::<u128>() <= u128::from(total_units));
    shares
}

fn normalise(c: &Claim) -> Claim {
    Claim {
        weight_ppm: c.weight_ppm.max(1),
        floor_units: c.floor_units.min(c.cap_units),
        cap_units: c.cap_units,
    }
}

/// The share of one claimant at water level `level` (units per whole weight, scaled by ppm).
fn share_at(c: &Claim, level: u128) -> u64 {
    let raw = level * u128::from(c.weight_ppm) / u128::from(WEIGHT_SCALE_PPM);
    let capped = raw.min(u128::from(c.cap_units)) as u64;
    capped.max(c.floor_units)
}

fn sum_at(claims: &[Claim], level: u128) -> u128 {
    claims.iter().map(|c| u128::from(share_at(c, level))).sum()
}

/// Requires `sum(floors) <= total`.
fn fill(total_units: u64, claims: &[Claim]) -> Vec<u64> {
    let total = u128::from(total_units);
    let caps: u128 = claims.iter().map(|c| u128::from(c.cap_units)).sum();
    if caps <= total {
        return claims.iter().map(|c| c.cap_units).collect();
    }
    // Largest level whose shares still fit. At `hi` every claimant with weight >= 1 ppm has
    // reached its cap, whose sum exceeds `total`, so the answer lies in [0, hi).
    let max_cap = claims.iter().map(|c| c.cap_units).max().unwrap_or(0);
    let (mut lo, mut hi) = (
        0u128,
        (u128::from(max_cap) + 1) * u128::from(WEIGHT_SCALE_PPM),
    );
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if sum_at(claims, mid) <= total {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut shares: Vec<u64> = claims.iter().map(|c| share_at(c, lo)).collect();
    // Rounding leaves fewer units than the claimants that would grow at the next level: hand
    // them out one each, heaviest weight first, so the whole total is used.
    let mut left = total - shares.iter().map(|s| u128::from(*s)).sum::<u128>();
    let mut growing: Vec<usize> = (0..claims.len())
        .filter(|&i| share_at(&claims[i], hi) > shares[i])
        .collect();
    growing.sort_by_key(|&i| (std::cmp::Reverse(claims[i].weight_ppm), i));
    for i in growing {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(weight_ppm: u32, floor_units: u64, cap_units: u64) -> Claim {
        Claim {
            weight_ppm,
            floor_units,
            cap_units,
        }
    }

    #[test]
    fn equal_weights_split_evenly_and_pass_on_what_a_small_need_leaves() {
        // 90 units, equal weights, needs 10, 50, 100. Level rises together: at 30 each the
        // first is capped at 10 (it only needs 10), so the other two share 80 -> 40 each.
        let shares = water_fill(90, &[claim(1, 0, 10), claim(1, 0, 50), claim(1, 0, 100)]);
        assert_eq!(shares, vec![10, 40, 40]);
    }

    #[test]
    fn weights_scale_the_shares() {
        // 120 units, weights 2:1 (500k vs 250k ppm), both need plenty: 80 and 40.
        let shares = water_fill(120, &[claim(500_000, 0, 1000), claim(250_000, 0, 1000)]);
        assert_eq!(shares, vec![80, 40]);
    }

    #[test]
    fn floors_are_kept_and_the_rest_is_filled_above_them() {
        // 100 units; A (floor 50, need 60) and B (floor 0, need 100), equal weights.
        // Fair level without floors would be 50/50; A's floor is 50 anyway, so it is 50/50.
        // With A's floor at 70 (need 80): A gets 70, B the remaining 30.
        assert_eq!(
            water_fill(100, &[claim(1, 50, 60), claim(1, 0, 100)]),
            vec![50, 50]
        );
        assert_eq!(
            water_fill(100, &[claim(1, 70, 80), claim(1, 0, 100)]),
            vec![70, 30]
        );
    }

    #[test]
    fn floors_that_do_not_fit_are_shared_fairly() {
        // Floors 50 and 50 but only 10 units: shared as a fair split of 10 -> 5 and 5.
        assert_eq!(
            water_fill(10, &[claim(1, 50, 60), claim(1, 50, 100)]),
            vec![5, 5]
        );
    }

    #[test]
    fn enough_for_every_need_gives_every_need() {
        assert_eq!(
            water_fill(1000, &[claim(1, 0, 10), claim(7, 3, 20)]),
            vec![10, 20]
        );
    }

    #[test]
    fn rounding_leftovers_go_to_the_heavier_claimant() {
        // 10 units, equal weights, three hungry claimants: 3 each plus one left over, which goes
        // to the first in order (all weights equal, so lowest index).
        assert_eq!(
            water_fill(10, &[claim(1, 0, 100), claim(1, 0, 100), claim(1, 0, 100)]),
            vec![4, 3, 3]
        );
    }

    fn claims_strategy() -> impl Strategy<Value = Vec<Claim>> {
        prop::collection::vec(
            (0u32..=1_000_000, 0u64..500, 0u64..500).prop_map(|(w, a, b)| Claim {
                weight_ppm: w,
                floor_units: a.min(b),
                cap_units: a.max(b),
            }),
            1..6,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn shares_respect_total_caps_and_floors(total in 0u64..2000, claims in claims_strategy()) {
            let shares = water_fill(total, &claims);
            let sum: u64 = shares.iter().sum();
            prop_assert!(sum <= total);
            let caps: u64 = claims.iter().map(|c| c.cap_units).sum();
            prop_assert_eq!(sum, total.min(caps), "work conserving");
            let floors: u64 = claims.iter().map(|c| c.floor_units).sum();
            for (c, s) in claims.iter().zip(&shares) {
                prop_assert!(*s <= c.cap_units, "no claimant above its need");
                if floors <= total {
                    prop_assert!(*s >= c.floor_units, "floors kept when they fit");
                }
            }
        }

        #[test]
        fn nobody_gains_while_a_lighter_claimant_is_below_its_fair_share(
            total in 0u64..2000, claims in claims_strategy()
        ) {
            let floors: u64 = claims.iter().map(|c| c.floor_units).sum();
            prop_assume!(floors <= total);
            let shares = water_fill(total, &claims);
            // If i is still below its cap, then any j holding more than its floor holds at most
            // i's share scaled by the weights (plus one unit of rounding on each side).
            for (i, ci) in claims.iter().enumerate() {
                if shares[i] >= ci.cap_units { continue; }
                for (j, cj) in claims.iter().enumerate() {
                    if shares[j] <= cj.floor_units { continue; }
                    let wi = u128::from(ci.weight_ppm.max(1));
                    let wj = u128::from(cj.weight_ppm.max(1));
                    let lhs = u128::from(shares[j].saturating_sub(1)) * wi;
                    let rhs = u128::from(shares[i] + 1) * wj;
                    prop_assert!(lhs <= rhs, "i={i} j={j} shares={shares:?} claims={claims:?}");
                }
            }
        }
    }
}
