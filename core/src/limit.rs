//! A limit as the state machines see it: the resolved form of one configuration rule.
//!
//! The config loader (`crate::config`) turns envoyproxy/ratelimit YAML plus allot's `allot:`
//! block into [`LimitSpec`]s; everything downstream (budget, rebalancer, bound, simulator)
//! reads only this type.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{LimitId, RegionId};
use crate::time::Window;

/// Region weights are stored in parts per million so that default allowances are exact integers.
pub const WEIGHT_SCALE_PPM: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "LimitSpecWire", into = "LimitSpecWire")]
pub struct LimitSpec {
    pub id: LimitId,
    pub quota: Quota,
    pub consistency: Consistency,
    /// Default allowance shares; empty means equal shares among the deployment's regions.
    pub weights: RegionWeights,
    pub partition_policy: PartitionPolicy,
    /// Local-tier GCRA cap on grants per key, enforced by each region. It also makes the
    /// eventual-mode and skew terms of the bound guarantees rather than measurements.
    pub rate_cap: Option<RateCap>,
    pub concurrency: Option<ConcurrencyCap>,
    /// What a gateway does when it cannot reach its agent.
    pub failure_mode: FailureMode,
    /// Kill switch: a disabled limit admits everything and counts nothing.
    pub enabled: bool,
    /// Would-deny decisions are counted and reported, but the answer is "allowed".
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit `name` and `replaces`: a matched rule drops the rules it replaces.
    pub name: Option<String>,
    pub replaces: Vec<String>,
    /// Most a settle may charge above its reservation, in parts per million of the
    /// reservation ([`WEIGHT_SCALE_PPM`] is a ratio of 1); more is clamped and counted. It
    /// makes the bound's settle-overage term a guarantee (docs/bound.md). A limit written
    /// before the field existed reads as 0 (JSON).
    pub max_settle_overage_ppm: u64,
    /// How a region counts against its allowance within a window (docs/decisions.md, D54).
    /// Stored inside the quota's encoding ([`LimitSpecWire`]), so that limits written before
    /// the field existed read as fixed windows.
    pub algorithm: Algorithm,
    /// Most units the Envoys of one region admit of one key in one window outside the
    /// assignments the agent sent them (their RLQS fallback behaviours), as the operator
    /// states it from Envoy's configuration: the bound's `rlqs_fallback` term per region
    /// (docs/bound.md, D69). Checked against what Envoy reports; 0, the default, states that
    /// Envoy admits nothing on its own (`DENY_ALL` for both behaviours). Stored inside the
    /// quota's encoding, as `algorithm` is.
    pub rlqs_fallback_units: u64,
}

/// The counting algorithm of a rule (`allot.algorithm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Algorithm {
    /// Units per aligned window; every unit of a window counts until it ends.
    #[default]
    FixedWindow,
    /// The estimate `P * (1 - f) + C <= L` over the trailing window, `P` the previous
    /// window's units, `C` the current one's, `f` the elapsed fraction of the current window
    /// (docs/algorithms.md). Strict limits only.
    SlidingWindow,
}

/// How a [`LimitSpec`] is serialised: its fields as they were before `algorithm` existed,
/// with the algorithm folded into the quota as a variant added last. Postcard keeps no field
/// names, so a new field would change the layout of every stored record that holds a limit
/// (the coordinator's snapshots and log entries); a new last variant leaves every record
/// written before it readable (as D18's records). JSON keeps `max_settle_overage_ppm`
/// optional, as it was.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LimitSpecWire {
    id: LimitId,
    quota: QuotaWire,
    consistency: Consistency,
    weights: RegionWeights,
    partition_policy: PartitionPolicy,
    rate_cap: Option<RateCap>,
    concurrency: Option<ConcurrencyCap>,
    failure_mode: FailureMode,
    enabled: bool,
    shadow_mode: bool,
    detailed_metric: bool,
    name: Option<String>,
    replaces: Vec<String>,
    #[serde(default)]
    max_settle_overage_ppm: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
enum QuotaWire {
    Unlimited,
    Units {
        units: u64,
        window: Window,
    },
    /// Added after the others: a sliding-window limit's quota.
    SlidingUnits {
        units: u64,
        window: Window,
    },
    /// Added after the others: a quota with an RLQS fallback allowance (D69), written only
    /// when that allowance is above 0, so that every other limit keeps its layout.
    WithFallback {
        units: u64,
        window: Window,
        algorithm: Algorithm,
        rlqs_fallback_units: u64,
    },
}

impl From<LimitSpec> for LimitSpecWire {
    fn from(s: LimitSpec) -> Self {
        let quota = match (s.quota, s.algorithm) {
            (Quota::Unlimited, _) => QuotaWire::Unlimited,
            (Quota::Units { units, window }, algorithm) if s.rlqs_fallback_units > 0 => {
                QuotaWire::WithFallback {
                    units,
                    window,
                    algorithm,
                    rlqs_fallback_units: s.rlqs_fallback_units,
                }
            }
            (Quota::Units { units, window }, Algorithm::FixedWindow) => {
                QuotaWire::Units { units, window }
            }
            (Quota::Units { units, window }, Algorithm::SlidingWindow) => {
                QuotaWire::SlidingUnits { units, window }
            }
        };
        LimitSpecWire {
            id: s.id,
            quota,
            consistency: s.consistency,
            weights: s.weights,
            partition_policy: s.partition_policy,
            rate_cap: s.rate_cap,
            concurrency: s.concurrency,
            failure_mode: s.failure_mode,
            enabled: s.enabled,
            shadow_mode: s.shadow_mode,
            detailed_metric: s.detailed_metric,
            name: s.name,
            replaces: s.replaces,
            max_settle_overage_ppm: s.max_settle_overage_ppm,
        }
    }
}

impl From<LimitSpecWire> for LimitSpec {
    fn from(w: LimitSpecWire) -> Self {
        let (quota, algorithm, rlqs_fallback_units) = match w.quota {
            QuotaWire::Unlimited => (Quota::Unlimited, Algorithm::FixedWindow, 0),
            QuotaWire::Units { units, window } => {
                (Quota::Units { units, window }, Algorithm::FixedWindow, 0)
            }
            QuotaWire::SlidingUnits { units, window } => {
                (Quota::Units { units, window }, Algorithm::SlidingWindow, 0)
            }
            QuotaWire::WithFallback {
                units,
                window,
                algorithm,
                rlqs_fallback_units,
            } => (
                Quota::Units { units, window },
                algorithm,
                rlqs_fallback_units,
            ),
        };
        LimitSpec {
            id: w.id,
            quota,
            consistency: w.consistency,
            weights: w.weights,
            partition_policy: w.partition_policy,
            rate_cap: w.rate_cap,
            concurrency: w.concurrency,
            failure_mode: w.failure_mode,
            enabled: w.enabled,
            shadow_mode: w.shadow_mode,
            detailed_metric: w.detailed_metric,
            name: w.name,
            replaces: w.replaces,
            max_settle_overage_ppm: w.max_settle_overage_ppm,
            algorithm,
            rlqs_fallback_units,
        }
    }
}

impl LimitSpec {
    /// A plain limit of `units` per `window`, strict, floor policy, no caps: handy in tests.
    pub fn simple(id: &str, units: u64, window: Duration) -> Self {
        LimitSpec {
            id: LimitId::new(id),
            quota: Quota::Units {
                units,
                window: Window::new(window),
            },
            consistency: Consistency::Strict,
            weights: RegionWeights::default(),
            partition_policy: PartitionPolicy::Floor,
            rate_cap: None,
            concurrency: None,
            failure_mode: FailureMode::Open,
            enabled: true,
            shadow_mode: false,
            detailed_metric: false,
            name: None,
            replaces: Vec::new(),
            max_settle_overage_ppm: 0,
            algorithm: Algorithm::FixedWindow,
            rlqs_fallback_units: 0,
        }
    }

    /// Counts by the sliding window estimate: a metered limit with that algorithm, in either
    /// consistency (D54, D83).
    pub fn is_sliding(&self) -> bool {
        self.algorithm == Algorithm::SlidingWindow && matches!(self.quota, Quota::Units { .. })
    }

    /// Most a settle may charge above a reservation of `reserved_units`:
    /// `floor(ratio * reserved)`.
    pub fn max_settle_overage_units(&self, reserved_units: u64) -> u64 {
        scale_ppm(reserved_units, self.max_settle_overage_ppm)
    }
}

/// `floor(units * ppm / 1,000,000)`, saturating.
pub fn scale_ppm(units: u64, ppm: u64) -> u64 {
    let scaled = u128::from(units) * u128::from(ppm) / u128::from(WEIGHT_SCALE_PPM);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Quota {
    /// `unlimited: true`: always allowed, never counted.
    Unlimited,
    /// `L` units per window `W`, worldwide.
    Units { units: u64, window: Window },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consistency {
    /// sum of allowances <= L at all times; 0 over-admission from coordination.
    #[default]
    Strict,
    /// Regions admit against their view of the global sum; bounded overshoot.
    Eventual,
}

/// What a region does for windows it holds no grant for (strict), or once its view of the
/// other regions has expired (eventual).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionPolicy {
    /// Keep the default share `w_r * L`.
    #[default]
    Floor,
    /// Deny. The coordinator may reuse the floor once the region has been silent for
    /// `view_ttl` plus a drift margin.
    Closed,
    /// Admit up to a rate cap; the bound grows by `cap * time open`.
    Open { rate: RateCap },
}

/// A GCRA rate: `units` per `per`, with a burst of `burst` units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateCap {
    pub units: u64,
    pub per: Duration,
    pub burst: u64,
}

impl RateCap {
    /// Most units the cap admits over `time`: `ceil(units * time / per) + burst`. A GCRA with
    /// this rate and burst never admits more in any interval of that length; the open
    /// partition policy also holds a window's fail-open units to it over the time open.
    pub fn max_units_over(&self, time: Duration) -> u64 {
        let per_nanos = self.per.as_nanos().max(1);
        let n = (u128::from(self.units) * time.as_nanos()).div_ceil(per_nanos);
        u64::try_from(n)
            .unwrap_or(u64::MAX)
            .saturating_add(self.burst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcurrencyCap {
    pub max_slots: u32,
    /// A slot not released within this time returns by itself (its holder crashed).
    pub slot_ttl: Duration,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureMode {
    #[default]
    Open,
    Closed,
}

/// Default allowance shares, in parts per million of `L`; their sum is at most 1,000,000.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionWeights(BTreeMap<RegionId, u32>);

impl RegionWeights {
    /// Fails when the weights add up to more than one.
    pub fn new(ppm: BTreeMap<RegionId, u32>) -> Result<Self, WeightsAboveOne> {
        let total: u64 = ppm.values().map(|w| u64::from(*w)).sum();
        if total > WEIGHT_SCALE_PPM {
            return Err(WeightsAboveOne { total_ppm: total });
        }
        Ok(RegionWeights(ppm))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&RegionId, u32)> {
        self.0.iter().map(|(r, w)| (r, *w))
    }

    /// The share of `region` in ppm, given the deployment's regions (used when no weights are
    /// configured: equal shares, rounded down so that the sum never exceeds one).
    pub fn share_ppm(&self, region: &RegionId, regions: &[RegionId]) -> u32 {
        if self.0.is_empty() {
            let n = regions.len().max(1) as u64;
            return if regions.is_empty() || regions.contains(region) {
                (WEIGHT_SCALE_PPM / n) as u32
            } else {
                0
            };
        }
        self.0.get(region).copied().unwrap_or(0)
    }

    /// Default allowance `floor(w_r * L)`; exact integer arithmetic.
    pub fn default_allowance(
        &self,
        region: &RegionId,
        regions: &[RegionId],
        quota_units: u64,
    ) -> u64 {
        let share = u128::from(self.share_ppm(region, regions));
        (u128::from(quota_units) * share / u128::from(WEIGHT_SCALE_PPM)) as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("region weights add up to {total_ppm} ppm, above 1 (1000000 ppm)")]
pub struct WeightsAboveOne {
    pub total_ppm: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_allowances_never_sum_above_the_quota() {
        let regions: Vec<RegionId> = ["a", "b", "c"].into_iter().map(RegionId::from).collect();
        let w = RegionWeights::default();
        let sum: u64 = regions
            .iter()
            .map(|r| w.default_allowance(r, &regions, 100))
            .sum();
        assert_eq!(sum, 99, "three equal shares of 100 round down to 33 each");
    }

    #[test]
    fn weights_above_one_are_rejected() {
        let mut m = BTreeMap::new();
        m.insert(RegionId::from("a"), 600_000);
        m.insert(RegionId::from("b"), 500_000);
        assert_eq!(RegionWeights::new(m).unwrap_err().total_ppm, 1_100_000);
    }
}
