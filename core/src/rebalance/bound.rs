//! The over-admission bound: how many units above `L` one window of one limit can admit under
//! the stated assumptions, as a sum of named terms each showing its formula with the numbers.
//! The derivation of every term is in `docs/bound.md`.
//!
//! Inputs that are configuration come from the [`LimitSpec`]; inputs that are measurements come
//! in [`BoundInputs`] from whoever has them: the leader's views
//! ([`crate::rebalance::Coordinator::bound_inputs`]) and the regions' stats.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{LimitId, RegionId};
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota, RateCap, scale_ppm};
use crate::time::{WindowIndex, duration_nanos};

/// What a region measured for the limit and window (from its stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionBoundStats {
    /// Time the region spent admitting under the open partition policy.
    pub time_open: Duration,
    /// Units settled above their reservation.
    pub settle_overage_units: u64,
}

/// The live measurements the bound is computed from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundInputs {
    /// The deployment's regions.
    pub regions: Vec<RegionId>,
    pub view_ttl: Duration,
    /// Each region's allowance `a_j` (strict mode; per key, or the largest over keys).
    pub allowance_units: BTreeMap<RegionId, u64>,
    /// Strict mode: per region, the allowances of the windows its clock may put inside the
    /// judged one (the judged one excluded): those within [`skew_reach_windows`] of it, or
    /// every window the table holds for the region, and twice its default, while its clock is
    /// unknown. A region absent here counts at its allowance for the judged window.
    pub neighbour_allowance_units: BTreeMap<RegionId, Vec<u64>>,
    /// Strict mode: regions that kept the edge band of a corrected clock through the whole
    /// window (`SyncUp::clock_guard`): every unit they admitted inside the window on the
    /// coordinator's clock counts against their own counter of it, so they add no skew.
    #[serde(default)]
    pub clock_guarded: BTreeSet<RegionId>,
    /// Measured clock offsets and round trips (regions without a sample count as unknown).
    pub clock_offset_nanos: BTreeMap<RegionId, i64>,
    pub round_trip_nanos: BTreeMap<RegionId, u64>,
    /// Measured peak grant rates, for the tightness figure of the eventual term.
    pub peak_rate_units_per_sec: BTreeMap<RegionId, u64>,
    pub stats: BTreeMap<RegionId, RegionBoundStats>,
    /// Regions whose view has expired (silent at the coordinator for `view_ttl`), with the
    /// net use the others last saw from them.
    pub partitioned: BTreeMap<RegionId, u64>,
    /// Some when agents persist grants after answering, every this often.
    pub deferred_flush_interval: Option<Duration>,
    /// While regions report different configuration versions (a reload rolling out): what
    /// each region may enforce under the version it reports (its default there, or the
    /// largest grant it held under it). Empty while every region reports the table's version.
    #[serde(default)]
    pub reload_held_units: BTreeMap<RegionId, u64>,
    /// The quota the `reload` term is taken against when a region counts under an older
    /// version whose quota was smaller than the table's: the window started under that one.
    /// `None`: the table's quota.
    #[serde(default)]
    pub reload_quota_units: Option<u64>,
    /// While a reload rolls out: per region, the terms of each older version it may enforce
    /// in the window. A region still on such a version admits its fail-open units, settles
    /// and Envoy fallback by that version's statement, whatever the table's is now.
    #[serde(default)]
    pub reload_older_terms: BTreeMap<RegionId, Vec<OlderTerms>>,
    /// Sliding window (D54): the total of the window before's terms other than its own
    /// sliding ones (what it may have admitted beyond its allowances, which this window's
    /// estimate still weighs). `None` for a fixed-window limit; the caller states the window
    /// unbounded where the window before is.
    #[serde(default)]
    pub previous_window_units: Option<u64>,
}

/// What an older version states of a limit, for the terms a region still on it admits by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OlderTerms {
    /// The open partition policy's rate, if the policy was open.
    pub open_rate: Option<RateCap>,
    pub max_settle_overage_ppm: u64,
    pub rlqs_fallback_units: u64,
}

impl OlderTerms {
    pub fn of(spec: &LimitSpec) -> OlderTerms {
        OlderTerms {
            open_rate: match spec.partition_policy {
                PartitionPolicy::Open { rate } => Some(rate),
                _ => None,
            },
            max_settle_overage_ppm: spec.max_settle_overage_ppm,
            rlqs_fallback_units: spec.rlqs_fallback_units,
        }
    }
}

impl BoundInputs {
    pub fn new(regions: Vec<RegionId>, view_ttl: Duration) -> Self {
        BoundInputs {
            regions,
            view_ttl,
            allowance_units: BTreeMap::new(),
            neighbour_allowance_units: BTreeMap::new(),
            clock_guarded: BTreeSet::new(),
            clock_offset_nanos: BTreeMap::new(),
            round_trip_nanos: BTreeMap::new(),
            peak_rate_units_per_sec: BTreeMap::new(),
            stats: BTreeMap::new(),
            partitioned: BTreeMap::new(),
            deferred_flush_interval: None,
            reload_held_units: BTreeMap::new(),
            reload_quota_units: None,
            reload_older_terms: BTreeMap::new(),
            previous_window_units: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundTerm {
    pub name: String,
    pub units: u64,
    /// The formula with the numbers.
    pub detail: String,
    /// The same term with measured rates in place of configured caps, where that applies:
    /// how tight the guarantee is, never part of the total.
    pub measured_units: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    pub limit: LimitId,
    pub window: WindowIndex,
    pub terms: Vec<BoundTerm>,
    /// The sum of the terms; not a bound at all while `unbounded` is set.
    pub total_units: u64,
    /// Set, with the reason, when no bound can be stated for the window (no leader watched
    /// part of it): the window is unbounded, never bounded by 0 for lack of information.
    pub unbounded: Option<String>,
    /// With `unbounded`: only because this leader did not watch the window (it ended before
    /// the leader started, or it is a sliding window's and the window before did), so an
    /// earlier leader that watched it may have bounded it. Otherwise the leader knows of a
    /// cause no term covers (a version it does not know, units charged nowhere): no other
    /// statement of the window bounds it.
    #[serde(default)]
    pub unwatched: bool,
}

/// The bound for `limit` in `window`. An unlimited or disabled limit admits everything by
/// design and has no terms.
pub fn bound(limit: &LimitSpec, window: WindowIndex, inputs: &BoundInputs) -> Bound {
    let terms = match limit.quota {
        Quota::Units { units, .. } if limit.enabled => Ctx {
            spec: limit,
            quota_units: units,
            inputs,
        }
        .terms(),
        _ => Vec::new(),
    };
    let total_units = terms.iter().map(|t| t.units).fold(0, u64::saturating_add);
    Bound {
        limit: limit.id.clone(),
        window,
        terms,
        total_units,
        unbounded: None,
        unwatched: false,
    }
}

/// How many windows either side of the judged one a region's clock may put inside it, for a
/// clock `uncertainty` (`|offset| + rtt / 2`): at least 1, `ceil(uncertainty / window)`
/// beyond. `None` while the clock is unknown: any window may be.
pub fn skew_reach_windows(uncertainty: Option<Duration>, window_len: Duration) -> Option<u64> {
    let u = duration_nanos(uncertainty?);
    Some(u.div_ceil(duration_nanos(window_len).max(1)).max(1))
}

/// What a region can spend inside the judged window from its other windows, given their
/// allowances `held` (the judged one excluded): a true window of one window's length meets at
/// most two of the region's windows. Within one window of uncertainty it meets the judged one
/// and one neighbour (the larger of the two counts); beyond, possibly two others (the two
/// largest in reach count).
fn spendable_from_neighbours(held: &[u64], reach: Option<u64>) -> u64 {
    let mut sorted = held.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let windows = if reach == Some(1) { 1 } else { 2 };
    sorted
        .iter()
        .take(windows)
        .fold(0, |sum: u64, a| sum.saturating_add(*a))
}

/// Units a rate admits over `time`: `ceil(units * time / per)`.
fn units_over(rate_units: u64, per: Duration, time: Duration) -> u64 {
    let per_nanos = u128::from(duration_nanos(per).max(1));
    let n = (u128::from(rate_units) * u128::from(duration_nanos(time))).div_ceil(per_nanos);
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Units a GCRA cap admits in any interval of length `time`: the rate over it plus the burst.
fn capped_units(cap: &RateCap, time: Duration) -> u64 {
    units_over(cap.units, cap.per, time).saturating_add(cap.burst)
}

/// Sliding window: the window before's terms, counted again (docs/bound.md, sliding_window).
pub const PREVIOUS_WINDOW_TERM: &str = "previous_window";

/// Sliding window: a region's clock ahead reads the weight of the window before too light.
pub const SLIDING_CLOCK_TERM: &str = "sliding_clock";

impl Bound {
    /// The total without the sliding window's own terms: what this window admitted beyond
    /// its allowances, which the next window's `previous_window` term counts.
    pub fn excess_units(&self) -> u64 {
        self.terms
            .iter()
            .filter(|t| t.name != PREVIOUS_WINDOW_TERM && t.name != SLIDING_CLOCK_TERM)
            .map(|t| t.units)
            .fold(0, u64::saturating_add)
    }
}

fn term(name: &str, units: u64, detail: String) -> BoundTerm {
    BoundTerm {
        name: name.to_string(),
        units,
        detail,
        measured_units: None,
    }
}

struct Ctx<'a> {
    spec: &'a LimitSpec,
    quota_units: u64,
    inputs: &'a BoundInputs,
}

impl Ctx<'_> {
    fn terms(&self) -> Vec<BoundTerm> {
        let mut terms = vec![
            self.coordination(),
            self.eventual(),
            self.skew(),
            self.fail_open(),
            self.crash(),
        ];
        let floor = self.partition_floor();
        let others = terms
            .iter()
            .chain([&floor])
            .map(|t| t.units)
            .fold(0, u64::saturating_add);
        terms.push(self.settle_overage(others));
        terms.push(floor);
        terms.push(self.reload());
        terms.push(self.rlqs_fallback());
        if self.spec.is_sliding() {
            terms.push(self.previous_window());
            terms.push(self.sliding_clock());
        }
        terms
    }

    /// Sliding window: the estimate weighs the window before's units by up to 1 at this
    /// window's start, and the regions' weights count only what the window before admitted
    /// within its allowances (docs/bound.md, sliding_window). What it admitted beyond them, the
    /// window before's other terms, counts here once more.
    fn previous_window(&self) -> BoundTerm {
        let units = self.inputs.previous_window_units.unwrap_or(0);
        let detail = format!(
            "the window before's terms, weighed by (1 - f) <= 1 in this window's estimate: {units}"
        );
        term(PREVIOUS_WINDOW_TERM, units, detail)
    }

    /// Sliding window: a region reads the weight's fraction `f` on its own clock. One whose
    /// clock may be ahead by `u_j` reads a weight up to `u_j / W` lighter and may admit that
    /// much more of its allowance: `sum_j min(a_j, ceil(a_j * u_j / W))`. A region on a
    /// corrected clock reads `f` less its uncertainty (the edge band's `e`): 0 (D54).
    fn sliding_clock(&self) -> BoundTerm {
        let window_len = match self.spec.quota {
            Quota::Units { window, .. } => window.len(),
            Quota::Unlimited => Duration::ZERO,
        };
        let w = u128::from(duration_nanos(window_len).max(1));
        let mut total = 0u64;
        let mut detail = String::from("sum_j min(a_j, ceil(a_j * u_j / W)): ");
        for r in &self.inputs.regions {
            if self.inputs.clock_guarded.contains(r) {
                let _ = write!(detail, "{r}: weight read at f - e/W -> 0; ");
                continue;
            }
            let held = self.held_units(r);
            let units = match self.uncertainty(r) {
                Some(u) => {
                    let n = (u128::from(held) * u128::from(duration_nanos(u))).div_ceil(w);
                    u64::try_from(n).unwrap_or(u64::MAX).min(held)
                }
                None => held,
            };
            total = total.saturating_add(units);
            let _ = write!(
                detail,
                "{r}: a={held}, u={:?} -> {units}; ",
                self.uncertainty(r)
            );
        }
        term(SLIDING_CLOCK_TERM, total, detail)
    }

    /// `|offset_j| + rtt_j / 2`, `None` without a clock sample.
    fn uncertainty(&self, region: &RegionId) -> Option<Duration> {
        self.inputs.clock_offset_nanos.get(region).map(|o| {
            let rtt = self
                .inputs
                .round_trip_nanos
                .get(region)
                .copied()
                .unwrap_or(0);
            Duration::from_nanos(o.unsigned_abs().saturating_add(rtt / 2))
        })
    }

    /// While a reload rolls out, each region enforces its allowance under the version it
    /// reports: their sum may exceed `L` (a share that grows before another shrinks), by
    /// `sum_j held_j - L` (docs/bound.md, reload).
    fn reload(&self) -> BoundTerm {
        let held = &self.inputs.reload_held_units;
        if held.is_empty() {
            return term(
                "reload",
                0,
                "every region enforces the table's version".to_string(),
            );
        }
        let sum = held.values().fold(0u64, |s, u| s.saturating_add(*u));
        let mut detail = String::from("sum_j held_j under its version - L: ");
        for (r, u) in held {
            let _ = write!(detail, "{r} {u} + ");
        }
        let quota = self
            .inputs
            .reload_quota_units
            .map_or(self.quota_units, |q| q.min(self.quota_units));
        let excess = sum.saturating_sub(quota);
        let _ = write!(detail, "= {sum} - {quota} = {excess}");
        term("reload", excess, detail)
    }

    fn eventual_mode(&self) -> bool {
        self.spec.consistency == Consistency::Eventual
    }

    fn default_units(&self, region: &RegionId) -> u64 {
        self.spec
            .weights
            .default_allowance(region, &self.inputs.regions, self.quota_units)
    }

    /// What region j may hold in the window: its allowance in strict mode, `L` in eventual
    /// mode (its own use counts live against `L`).
    fn held_units(&self, region: &RegionId) -> u64 {
        if self.eventual_mode() {
            return self.quota_units;
        }
        self.inputs
            .allowance_units
            .get(region)
            .copied()
            .unwrap_or_else(|| self.default_units(region))
    }

    fn coordination(&self) -> BoundTerm {
        let detail = if self.eventual_mode() {
            "eventual mode: coordination overshoot is the eventual term".to_string()
        } else {
            "strict: sum of allowances <= L in the table, and a region's a_r <= its row".to_string()
        };
        term("coordination", 0, detail)
    }

    /// Per region: `min(L, cap * lag + burst)` with `lag = 2 * view_ttl + rtt_j`: what a region
    /// can admit that another region's view has not yet seen (docs/bound.md).
    fn eventual(&self) -> BoundTerm {
        if !self.eventual_mode() {
            return term("eventual", 0, "strict mode".to_string());
        }
        let ttl = self.inputs.view_ttl;
        let (mut total, mut measured) = (0u64, 0u64);
        let mut detail = String::from("sum_j: ");
        for r in &self.inputs.regions {
            let rtt = self
                .inputs
                .round_trip_nanos
                .get(r)
                .map_or(ttl, |n| Duration::from_nanos(*n));
            let lag = ttl * 2 + rtt;
            let cap_units = self.spec.rate_cap.map_or(self.quota_units, |c| {
                capped_units(&c, lag).min(self.quota_units)
            });
            let peak = self.inputs.peak_rate_units_per_sec.get(r).copied();
            let peak_units = peak.map_or(cap_units, |p| {
                units_over(p, Duration::from_secs(1), lag).min(cap_units)
            });
            total = total.saturating_add(cap_units);
            measured = measured.saturating_add(peak_units);
            let cap_text = self.spec.rate_cap.map_or("no cap: L".to_string(), |c| {
                format!("{}/{:?}*{:?}+{}", c.units, c.per, lag, c.burst)
            });
            let _ = write!(
                detail,
                "{r}: min({}, {cap_text}) = {cap_units}; ",
                self.quota_units
            );
        }
        BoundTerm {
            measured_units: Some(measured),
            ..term("eventual", total, detail)
        }
    }

    /// `sum_j min(a_j(adjacent), cap * min(u_j, window) + burst)` with
    /// `u_j = |offset_j| + rtt_j / 2`: a shifted region spends its neighbouring windows'
    /// allowances inside the judged one (docs/bound.md). Without a cap, all of those.
    fn skew(&self) -> BoundTerm {
        let mut total = 0u64;
        let mut detail = String::from("sum_j min(a_j(adjacent), cap*|offset_j| + burst): ");
        let window_len = match self.spec.quota {
            Quota::Units { window, .. } => window.len(),
            Quota::Unlimited => Duration::ZERO,
        };
        for r in &self.inputs.regions {
            if !self.eventual_mode() && self.inputs.clock_guarded.contains(r) {
                let _ = write!(detail, "{r}: edge band on a corrected clock -> 0; ");
                continue;
            }
            let uncertainty = self.inputs.clock_offset_nanos.get(r).map(|o| {
                let rtt = self.inputs.round_trip_nanos.get(r).copied().unwrap_or(0);
                Duration::from_nanos(o.unsigned_abs().saturating_add(rtt / 2))
            });
            let reach = skew_reach_windows(uncertainty, window_len);
            let held = self.neighbour_held_units(r, reach);
            let units = match (self.spec.rate_cap, uncertainty) {
                (Some(cap), Some(u)) => capped_units(&cap, u.min(window_len)).min(held),
                _ => held,
            };
            total = total.saturating_add(units);
            let _ = write!(
                detail,
                "{r}: a(adjacent)={held}, offset={uncertainty:?}, reach={reach:?} -> {units}; "
            );
        }
        term("skew", total, detail)
    }

    /// What region j may spend inside the judged window from its other windows: in eventual
    /// mode `L` for each window it may reach there; in strict mode their allowances.
    fn neighbour_held_units(&self, region: &RegionId, reach: Option<u64>) -> u64 {
        let held = if self.eventual_mode() {
            vec![self.quota_units; 2]
        } else {
            self.inputs
                .neighbour_allowance_units
                .get(region)
                .cloned()
                .unwrap_or_else(|| vec![self.held_units(region)])
        };
        spendable_from_neighbours(&held, reach)
    }

    /// `sum_j ceil(rate * T_j) + burst` over regions open for `T_j > 0`: exactly the budget
    /// each region holds its fail-open units of a window to (`budget::admit`). A region that
    /// may enforce an older version in the window counts at the largest rate of the open
    /// policies it may enforce, the table's included: a reload from open to closed leaves it
    /// open until the reload reaches it (swarm seed 3252896).
    fn fail_open(&self) -> BoundTerm {
        let own = match self.spec.partition_policy {
            PartitionPolicy::Open { rate } => Some(rate),
            _ => None,
        };
        if own.is_none() && self.inputs.reload_older_terms.is_empty() {
            return term("fail_open", 0, "partition policy is not open".to_string());
        }
        let mut total = 0u64;
        let mut detail = String::from("sum_j rate_j * time_open_j + burst_j: ");
        for (r, s) in &self.inputs.stats {
            if s.time_open.is_zero() {
                continue;
            }
            let older = self.older_terms(r).filter_map(|t| t.open_rate);
            let Some(units) = own
                .iter()
                .copied()
                .chain(older)
                .map(|rate| rate.max_units_over(s.time_open))
                .max()
            else {
                continue;
            };
            total = total.saturating_add(units);
            let _ = write!(detail, "{r}: {:?} -> {units}; ", s.time_open);
        }
        term("fail_open", total, detail)
    }

    fn crash(&self) -> BoundTerm {
        let Some(flush) = self.inputs.deferred_flush_interval else {
            return term(
                "crash",
                0,
                "grants persisted before they are answered".to_string(),
            );
        };
        let mut total = 0u64;
        let mut detail = format!("sum_j min(a_j, cap * {flush:?} + burst): ");
        for r in &self.inputs.regions {
            let held = self.held_units(r);
            let units = self
                .spec
                .rate_cap
                .map_or(held, |c| capped_units(&c, flush).min(held));
            total = total.saturating_add(units);
            let _ = write!(detail, "{r}: {units}; ");
        }
        term("crash", total, detail)
    }

    /// `floor(ratio * (L + others))`, `ratio` the limit's `max_settle_overage` and `others`
    /// every other term: a settle charges at most `ratio` times its reservation above it, and
    /// the reservations that settle above are units the regions admitted and kept, at most
    /// `L` plus the other terms (docs/bound.md). The settles the regions measured are
    /// reported beside it (`measured_units`): they can arrive late or never, the cap cannot.
    ///
    /// While a reload rolls out, `ratio` is the largest any region may enforce in the window.
    fn settle_overage(&self, others_units: u64) -> BoundTerm {
        let ratio_ppm = self
            .inputs
            .reload_older_terms
            .values()
            .flatten()
            .map(|t| t.max_settle_overage_ppm)
            .fold(self.spec.max_settle_overage_ppm, u64::max);
        let kept_units = self.quota_units.saturating_add(others_units);
        let units = scale_ppm(kept_units, ratio_ppm);
        let measured = self
            .inputs
            .stats
            .values()
            .map(|s| s.settle_overage_units)
            .fold(0, u64::saturating_add);
        let detail = format!(
            "max_settle_overage {ratio_ppm} ppm * (L {} + other terms {others_units}) = {units}; measured {measured}",
            self.quota_units
        );
        BoundTerm {
            measured_units: Some(measured),
            ..term("settle_overage", units, detail)
        }
    }

    /// `sum_j F`, `F` the limit's `rlqs_fallback_units`: what one region's Envoys may admit
    /// of the key in the window outside their assignments (their fallback behaviours), as the
    /// operator stated it. Every region may serve Envoys, so each counts. A region charges
    /// what Envoy reports beyond its leases against `F` and says so when reports pass it
    /// (`RegionBudget::record_gateway_fallback`; the window is then unbounded), so the
    /// statement is checked for every admission Envoy reports (docs/bound.md, D69).
    ///
    /// A region still on an older version counts at the largest `F` of the versions it may
    /// enforce in the window, the table's included: it charges Envoy's reports against its
    /// own version's statement.
    fn rlqs_fallback(&self) -> BoundTerm {
        let own = self.spec.rlqs_fallback_units;
        let mut units = 0u64;
        let mut older = String::new();
        for r in &self.inputs.regions {
            let f = self
                .older_terms(r)
                .map(|t| t.rlqs_fallback_units)
                .fold(own, u64::max);
            units = units.saturating_add(f);
            if f != own {
                let _ = write!(older, "; {r} on an older version: {f}");
            }
        }
        let regions = self.inputs.regions.len();
        let detail = if units == 0 {
            "rlqs_fallback_units 0: Envoy admits nothing outside its assignments".to_string()
        } else {
            format!("{regions} regions * rlqs_fallback_units {own}{older} = {units}")
        };
        term("rlqs_fallback", units, detail)
    }

    /// The terms of the older versions `region` may enforce in the window.
    fn older_terms(&self, region: &RegionId) -> impl Iterator<Item = &OlderTerms> {
        self.inputs
            .reload_older_terms
            .get(region)
            .into_iter()
            .flatten()
    }

    /// Eventual mode, floor or open policy: a partitioned region may admit up to its default
    /// while the others still count its last seen use: `sum_j (d_j - n_j_last_seen)+`. Under
    /// `open` it admits its default first and only then at the open rate (`budget::admit`),
    /// which `fail_open` counts beside this (swarm seed 3021624).
    fn partition_floor(&self) -> BoundTerm {
        if !self.eventual_mode() || self.spec.partition_policy == PartitionPolicy::Closed {
            return term(
                "partition_floor",
                0,
                "only eventual mode under the floor or open policy".to_string(),
            );
        }
        let mut total = 0u64;
        let mut detail = String::from("sum over partitioned j of (d_j - n_j_last_seen)+: ");
        for (r, last_seen) in &self.inputs.partitioned {
            let d = self.default_units(r);
            let units = d.saturating_sub(*last_seen);
            total = total.saturating_add(units);
            let _ = write!(detail, "{r}: ({d} - {last_seen})+ = {units}; ");
        }
        term("partition_floor", total, detail)
    }
}
