//! The distributions a seed's world is drawn from.
//!
//! Every choice is made here or in [`super::faults`], in a fixed order from one stream of the
//! seed, so a seed always draws the same world. The sizes keep a world short: a few windows of
//! its longest window, and about [`MAX_REQUESTS_PER_WORLD`] requests at most, so that one seed
//! runs in a small fraction of a second in a release build.

use super::faults::{FAULT_KINDS, Frame, LAST_PASS, MAX_DRAWN_FAULTS, MAX_LATER_FAULTS};
use super::rng::Dice;
use super::world::{
    CapsDraw, Consistency, CostDraw, FaultTime, LeaseDraw, LimitDraw, Param, PartitionPolicy,
    RateDraw, RegionDraw, RetryDraw, Shape, SourceDraw, World,
};
use allot_core::sync::MIN_ITEMS_PER_MESSAGE;

/// Requests a world asks for at its drawn load, all sources together (flash crowds and
/// diurnal peaks may add a few times that for their length).
pub const MAX_REQUESTS_PER_WORLD: f64 = 60_000.0;
/// Regions of a world: from 2 to this.
pub const MAX_REGIONS: u64 = 5;
/// Limits (descriptor keys) of a world.
pub const MAX_LIMITS: u64 = 2;
/// Keys (counters) per limit that traffic uses.
pub const MAX_KEYS_PER_LIMIT: u64 = 3;
/// Keys a limit may gain in a world whose caps are lowered (`draw_caps`).
pub const MAX_EXTRA_KEYS: u64 = 6;
/// Window lengths: from one second to this.
pub const MAX_WINDOW_SECS: f64 = 60.0;
/// Windows of the longest window a run lasts: from 3 to this.
pub const MAX_WINDOWS_PER_RUN: u64 = 6;
/// Clock offsets reach this many windows of the shortest window, either sign.
pub const MAX_OFFSET_WINDOWS: f64 = 3.0;
/// Sync intervals, by weight.
const SYNC_INTERVALS_MS: [(u32, u64); 4] = [(1, 50), (2, 100), (3, 250), (1, 500)];
/// Most sync intervals a run lasts: a long run syncs less often, so that every seed stays
/// short to run (a 6-minute run at 50 ms would cost more than all else in it).
pub const MAX_SYNC_ROUNDS: u64 = 2_000;
/// Samples (bound readings, invariant checks) per window of the shortest window, at least.
pub const SAMPLES_PER_WINDOW: u64 = 10;
/// Largest drawn clock drift.
pub const MAX_DRAWN_DRIFT_PPM: f64 = 5_000.0;
/// Largest drawn drift of a gateway's clock against its agent's: the drift a gateway
/// tolerates (`GATEWAY_CLOCK_DRIFT_PPM`, docs/bound.md, gateway terms).
pub const MAX_GATEWAY_DRIFT_PPM: f64 = 2_000.0;

/// Draws seed `seed`'s world.
pub fn world(seed: u64) -> World {
    let mut dice = Dice::new(seed);
    let d = &mut dice;
    let limits: Vec<LimitDraw> = (0..d.int(1, MAX_LIMITS))
        .map(|i| limit_shape(d, i))
        .collect();
    let shortest_ms = limits
        .iter()
        .map(|l| l.window_secs * 1_000)
        .min()
        .unwrap_or(1_000);
    let longest_ms = limits
        .iter()
        .map(|l| l.window_secs * 1_000)
        .max()
        .unwrap_or(1_000);
    let duration_ms = longest_ms * d.int(3, MAX_WINDOWS_PER_RUN);
    let sync_interval_ms = d.weighted(&SYNC_INTERVALS_MS).max(
        SYNC_INTERVALS_MS
            .iter()
            .map(|(_, ms)| *ms)
            .find(|ms| duration_ms / ms <= MAX_SYNC_ROUNDS)
            .unwrap_or(500),
    );
    let regions = draw_regions(d, shortest_ms);
    let mut world = World {
        seed,
        duration_ms,
        sync_interval_ms,
        view_ttl_ms: None,
        commit_latency_ms: d.log(1.0, 50.0).round() as u64,
        // The bound is read and the invariants checked at samples: several a window.
        sample_interval_ms: (shortest_ms / SAMPLES_PER_WINDOW).clamp(100, 500),
        lease: draw_lease(d),
        regions,
        limits,
        sources: Vec::new(),
        faults: Vec::new(),
        caps: CapsDraw::default(),
        max_clock_uncertainty_ms: None,
    };
    draw_traffic(d, &mut world);
    draw_faults(d, &mut world, shortest_ms);
    // Drawn last: a draw added at the end leaves every earlier draw of a seed as it was.
    draw_timings(d, &mut world);
    draw_gateway_clocks(d, &mut world, shortest_ms);
    for pass in 1..LAST_PASS {
        draw_later_faults(d, &mut world, shortest_ms, pass);
    }
    // Half the worlds refill leases in place (the gateway's default), half take new ones.
    if d.chance(0.5) {
        world.lease.refill_in_place = Some(false);
    }
    draw_algorithms(d, &mut world);
    draw_envoy_fallback(d, &mut world);
    draw_caps(d, &mut world);
    draw_overage_statements(d, &mut world);
    // The last pass (clock steps) after all of it, so that every earlier draw stays as it was.
    draw_later_faults(d, &mut world, shortest_ms, LAST_PASS);
    world
}

/// Drawn after everything else: a third of the limits with reservations let a settle charge
/// above its reservation (`max_settle_overage`, 5% to 100%), and a reload changes that ratio,
/// or the fallback the operator states (`rlqs_fallback_units`, from what the Envoys admit to
/// twice it), about one time in three each: what a region still on the old version admits by.
fn draw_overage_statements(d: &mut Dice, w: &mut World) {
    for i in 0..w.limits.len() {
        let reserves = w
            .sources
            .iter()
            .any(|s| s.limit == i && matches!(s.cost, CostDraw::Llm { .. }));
        if reserves && d.chance(1.0 / 3.0) {
            w.limits[i].settle_overage_percent = d.int(5, 100);
        }
    }
    for f in w.faults.iter_mut() {
        for (_, p) in f.params.iter_mut() {
            let Param::Limits(limits) = p else { continue };
            for r in limits.iter_mut() {
                if d.chance(1.0 / 3.0) {
                    r.settle_overage_percent = Some(if d.chance(0.5) { 0 } else { d.int(5, 100) });
                }
                // The region's Envoys keep admitting what their own configuration says while
                // the agent is out, whatever version it runs: a reload states at least that. A
                // statement below it is the operator's error, found only by the Envoys' reports
                // (`sim/tests/envoy_fallback.rs`), never if the agent stays down to the run's end
                // (swarm seed 3383026).
                let stated = w.limits[r.limit].rlqs_fallback_units;
                if stated > 0 && d.chance(1.0 / 3.0) {
                    r.rlqs_fallback_units = Some(d.int(stated, 2 * stated));
                }
            }
        }
    }
}

/// Drawn after everything else: a quarter of the worlds lower the product's caps so that their
/// few keys reach them (the scenario's `caps:`), with up to [`MAX_EXTRA_KEYS`] more keys a
/// limit at lower rates: a SyncUp and a SyncDown of a few items ([`MIN_ITEMS_PER_MESSAGE`] to
/// twice it), a region tracking a key or a few per limit, a leader keeping views of a few
/// counters. Each cap is lowered in about half of those worlds.
fn draw_caps(d: &mut Dice, w: &mut World) {
    if !d.chance(0.25) {
        return;
    }
    let min = MIN_ITEMS_PER_MESSAGE as u64;
    if d.chance(0.6) {
        w.caps.message_items = Some(d.int(min, 2 * min));
    }
    if d.chance(0.4) {
        w.caps.max_keys_per_limit = Some(d.int(1, 4));
    }
    if d.chance(0.4) {
        w.caps.max_tracked_counters = Some(d.int(1, 8));
    }
    for limit in 0..w.limits.len() {
        let first = w
            .sources
            .iter()
            .filter(|s| s.limit == limit)
            .map(|s| s.key + 1)
            .max()
            .unwrap_or(0);
        let Some(cost) = w
            .sources
            .iter()
            .find(|s| s.limit == limit)
            .map(|s| s.cost.clone())
        else {
            continue;
        };
        let mean_cost = mean_cost(&cost);
        let l = &w.limits[limit];
        let at_quota_per_sec = l.quota_units as f64 / (l.window_secs as f64 * mean_cost);
        for key in first..first + d.int(0, MAX_EXTRA_KEYS) as u32 {
            let demand_per_sec = at_quota_per_sec * d.log(0.05, 1.0);
            draw_key_sources(d, w, limit, key, demand_per_sec, &cost);
        }
    }
}

/// Drawn after everything else: a quarter of the worlds give each region's gateways Envoy's
/// fallback (1 to 100 units a key and window each, or none in a region), and state it on every
/// limit as the operator would, `rlqs_fallback_units` the most one region's gateways admit
/// together (D69).
fn draw_envoy_fallback(d: &mut Dice, w: &mut World) {
    if !d.chance(0.25) {
        return;
    }
    for r in &mut w.regions {
        if d.chance(0.8) {
            r.envoy_fallback_units = d.log(1.0, 100.0).round() as u64;
        }
    }
    let stated = w
        .regions
        .iter()
        .map(|r| u64::from(r.gateways) * r.envoy_fallback_units)
        .max()
        .unwrap_or(0);
    for l in &mut w.limits {
        l.rlqs_fallback_units = stated;
    }
}

/// Drawn after everything else (so every earlier draw of a seed stays as it was): a quarter of
/// the limits count by the sliding window (D54), strict or eventual (D83), through every
/// reload.
fn draw_algorithms(d: &mut Dice, w: &mut World) {
    for l in &mut w.limits {
        l.sliding = d.chance(0.25);
    }
}

/// Half the worlds keep every gateway on its agent's clock; otherwise each region's gateways
/// are off their agent's clock as a region's agent is off the true one (offsets up to several
/// windows), with a drift of at most [`MAX_GATEWAY_DRIFT_PPM`].
fn draw_gateway_clocks(d: &mut Dice, w: &mut World, shortest_ms: u64) {
    if d.chance(0.5) {
        return;
    }
    for r in &mut w.regions {
        let (offset_ms, _) = draw_clock(d, shortest_ms);
        let drift_ppm = if d.chance(0.6) {
            0
        } else {
            let ppm = d.log(1.0, MAX_GATEWAY_DRIFT_PPM).round() as i64;
            if d.chance(0.5) { -ppm } else { ppm }
        };
        r.gateway_offset_ms = offset_ms;
        r.gateway_drift_ppm = drift_ppm;
    }
}

/// Half the worlds keep each default: the view lifetime (1 to 8 sync intervals otherwise),
/// the lease target, idle release and leases per key.
fn draw_timings(d: &mut Dice, w: &mut World) {
    if d.chance(0.5) {
        w.view_ttl_ms = Some(w.sync_interval_ms * d.int(1, 8));
    }
    if d.chance(0.5) {
        w.lease.target_ms = Some(d.log(50.0, 2_000.0).round() as u64);
    }
    if d.chance(0.5) {
        w.lease.idle_release_after_ms = Some(d.log(200.0, 5_000.0).round() as u64);
    }
    if d.chance(0.5) {
        w.lease.max_leases_per_key = Some(d.int(1, 4));
    }
}

fn limit_shape(d: &mut Dice, i: u64) -> LimitDraw {
    let window_secs = d.log(1.0, MAX_WINDOW_SECS).round().max(1.0) as u64;
    LimitDraw {
        key: format!("l{i}"),
        window_secs,
        // Set with the traffic, from the request budget.
        quota_units: 1,
        consistency: d.weighted(&[(1, Consistency::Strict), (1, Consistency::Eventual)]),
        policy: PartitionPolicy::Floor,
        rate_cap: None,
        failure_closed: d.chance(0.5),
        sliding: false,
        rlqs_fallback_units: 0,
        settle_overage_percent: 0,
    }
}

/// The quota-relative settings, once the quota is known.
fn limit_terms(d: &mut Dice, l: &mut LimitDraw) {
    let quota = l.quota_units as f64;
    let part = |d: &mut Dice, lo: f64, hi: f64| ((quota * d.real(lo, hi)).ceil() as u64).max(1);
    l.policy = match d.weighted(&[(4, 0), (3, 1), (3, 2)]) {
        0 => PartitionPolicy::Floor,
        1 => PartitionPolicy::Closed,
        _ => {
            let units = part(d, 0.05, 0.5);
            PartitionPolicy::Open {
                units,
                burst_units: (units / 10).max(1),
            }
        }
    };
    if d.chance(0.5) {
        l.rate_cap = Some(RateDraw {
            units: part(d, 0.5, 2.0),
            burst_units: part(d, 0.01, 0.3),
        });
    }
}

fn draw_regions(d: &mut Dice, shortest_ms: u64) -> Vec<RegionDraw> {
    let n = d.int(2, MAX_REGIONS) as usize;
    let calm_clocks = d.chance(0.25);
    let mut regions: Vec<RegionDraw> = (0..n)
        .map(|i| {
            let (offset_ms, drift_ppm) = if calm_clocks {
                (0, 0)
            } else {
                draw_clock(d, shortest_ms)
            };
            RegionDraw {
                id: format!("r{i}"),
                weight_ppm: None,
                latency_ms: d.log(1.0, 150.0).round() as u64,
                gateways: d.int(1, 3) as u32,
                offset_ms,
                drift_ppm,
                gateway_offset_ms: 0,
                gateway_drift_ppm: 0,
                envoy_fallback_units: 0,
            }
        })
        .collect();
    if d.chance(0.5) {
        draw_weights(d, &mut regions);
    }
    regions
}

/// Zero, within half a window, or up to several windows, either sign; drift or none.
fn draw_clock(d: &mut Dice, window_ms: u64) -> (i64, i64) {
    let w = window_ms as f64;
    let magnitude = match d.weighted(&[(4, 0), (3, 1), (3, 2)]) {
        0 => 0.0,
        1 => d.real(0.0, 0.5 * w),
        _ => d.real(0.5 * w, MAX_OFFSET_WINDOWS * w),
    };
    let sign = if d.chance(0.5) { -1 } else { 1 };
    let drift = if d.chance(0.6) {
        0
    } else {
        let ppm = d.log(1.0, MAX_DRAWN_DRIFT_PPM).round() as i64;
        if d.chance(0.5) { -ppm } else { ppm }
    };
    (sign * magnitude.round() as i64, drift)
}

/// Weights in thousandths, adding up to 1 or a little less (unassigned quota).
fn draw_weights(d: &mut Dice, regions: &mut [RegionDraw]) {
    let raw: Vec<f64> = regions.iter().map(|_| d.real(0.2, 1.0)).collect();
    let total = if d.chance(0.8) { 1.0 } else { d.real(0.7, 1.0) };
    let sum: f64 = raw.iter().sum();
    for (r, w) in regions.iter_mut().zip(raw) {
        let thousandths = ((w / sum * total * 1_000.0).floor() as u32).max(1);
        r.weight_ppm = Some(thousandths * 1_000);
    }
}

fn draw_lease(d: &mut Dice) -> LeaseDraw {
    let initial_units = d.int(1, 20);
    LeaseDraw {
        initial_units,
        max_units: d.log(20.0, 1_000.0).round().max(initial_units as f64) as u64,
        ttl_ms: d.log(500.0, 5_000.0).round() as u64,
        target_ms: None,
        idle_release_after_ms: None,
        max_leases_per_key: None,
        refill_in_place: None,
    }
}

fn draw_traffic(d: &mut Dice, w: &mut World) {
    let keys: Vec<u64> = w
        .limits
        .iter()
        .map(|_| d.int(1, MAX_KEYS_PER_LIMIT))
        .collect();
    let counters: u64 = keys.iter().sum();
    let duration_secs = w.duration_ms as f64 / 1_000.0;
    for (limit, &limit_keys) in keys.iter().enumerate() {
        let cost = draw_cost(d, w.limits[limit].window_secs);
        let mean_cost = mean_cost(&cost);
        let load = d.log(0.3, 4.0);
        let budget_per_sec = MAX_REQUESTS_PER_WORLD / (duration_secs * counters as f64 * load);
        let at_quota_per_sec = d.log(5.0, 1_000.0).min(budget_per_sec);
        let window_secs = w.limits[limit].window_secs as f64;
        w.limits[limit].quota_units = (at_quota_per_sec * window_secs * mean_cost).ceil() as u64;
        limit_terms(d, &mut w.limits[limit]);
        for key in 0..limit_keys {
            let demand_per_sec = load * at_quota_per_sec;
            draw_key_sources(d, w, limit, key as u32, demand_per_sec, &cost);
        }
    }
}

/// The units a request of `cost` is counted at when a quota is sized from a rate.
fn mean_cost(cost: &CostDraw) -> f64 {
    match cost {
        CostDraw::Units(u) => *u as f64,
        CostDraw::Llm { reserve_units, .. } => *reserve_units as f64,
    }
}

/// The sources of one key: a few of the regions (the others stay idle), sharing its demand.
fn draw_key_sources(
    d: &mut Dice,
    w: &mut World,
    limit: usize,
    key: u32,
    demand_per_sec: f64,
    cost: &CostDraw,
) {
    let n = w.regions.len();
    let busy = d.int(1, n as u64) as usize;
    let first = d.index(n);
    let shares: Vec<f64> = (0..busy).map(|_| d.real(0.1, 1.0)).collect();
    let total: f64 = shares.iter().sum();
    for (i, share) in shares.iter().enumerate() {
        let per_sec = demand_per_sec * share / total;
        let source = SourceDraw {
            region: (first + i) % n,
            limit,
            key,
            shape: draw_shape(d, per_sec, w.duration_ms),
            uniform_arrivals: d.chance(0.3),
            cost: cost.clone(),
            retry: draw_retry(d),
        };
        w.sources.push(source);
    }
}

fn draw_shape(d: &mut Dice, per_sec: f64, duration_ms: u64) -> Shape {
    match d.weighted(&[(3, 0), (3, 1), (2, 2), (2, 3)]) {
        0 => Shape::Constant { per_sec },
        1 => {
            let mut at: Vec<u64> = (0..d.int(1, 3))
                .map(|_| d.int(1, duration_ms - 1))
                .collect();
            at.push(0);
            at.sort_unstable();
            at.dedup();
            Shape::Steps(
                at.into_iter()
                    .map(|t| (t, per_sec * d.log(0.1, 3.0)))
                    .collect(),
            )
        }
        2 => {
            let start_ms = d.int(0, duration_ms * 3 / 4);
            let end_ms = d.int(start_ms + 1, duration_ms);
            Shape::Flash {
                base_per_sec: per_sec * 0.3,
                factor: d.log(2.0, 20.0),
                start_ms,
                end_ms,
            }
        }
        _ => Shape::Diurnal {
            base_per_sec: per_sec * 0.2,
            peak_per_sec: per_sec * 2.0,
            period_ms: duration_ms,
            peak_at_ms: d.int(0, duration_ms),
        },
    }
}

/// Mostly single units; some larger constant costs; some LLM reservations whose settles
/// come up to several windows later.
fn draw_cost(d: &mut Dice, window_secs: u64) -> CostDraw {
    match d.weighted(&[(6, 0), (2, 1), (2, 2)]) {
        0 => CostDraw::Units(1),
        1 => CostDraw::Units(d.int(2, 10)),
        _ => {
            let reserve_units = d.log(10.0, 2_000.0).round() as u64;
            let window_ms = window_secs * 1_000;
            let settle_min_ms = d.log(10.0, window_ms as f64).round() as u64;
            let windows = d.int(1, 6);
            let settle_max_ms = d.int(settle_min_ms, window_ms * windows);
            CostDraw::Llm {
                reserve_units,
                median_units: ((reserve_units as f64 * d.real(0.1, 1.0)).round() as u64).max(1),
                sigma: (d.real(0.2, 1.2) * 100.0).round() / 100.0,
                max_units: ((reserve_units as f64 * d.real(1.0, 4.0)).round() as u64).max(1),
                settle_min_ms,
                settle_max_ms,
            }
        }
    }
}

fn draw_retry(d: &mut Dice) -> RetryDraw {
    match d.weighted(&[(8, 0), (1, 1), (1, 2)]) {
        0 => RetryDraw::None,
        1 => RetryDraw::Immediate {
            max_retries: d.int(1, 3) as u32,
            delay_ms: d.int(0, 50),
        },
        _ => RetryDraw::Backoff {
            base_ms: d.int(10, 200),
            max_retries: d.int(1, 4) as u32,
        },
    }
}

fn frame(w: &World, window_ms: u64) -> Frame {
    Frame {
        duration_ms: w.duration_ms,
        window_ms,
        sync_interval_ms: w.sync_interval_ms,
        gateways: w.regions.iter().map(|r| r.gateways).collect(),
        limit_windows_ms: w.limits.iter().map(|l| l.window_secs * 1_000).collect(),
        limits: w.limits.clone(),
    }
}

/// `count` faults of the kinds of pass `pass`, by weight.
fn draw_pass(d: &mut Dice, w: &mut World, window_ms: u64, pass: u32, count: u64) {
    let frame = frame(w, window_ms);
    let kinds: Vec<(u32, usize)> = FAULT_KINDS
        .iter()
        .enumerate()
        .filter(|(_, k)| k.pass == pass)
        .map(|(i, k)| (k.weight, i))
        .collect();
    if kinds.is_empty() {
        return;
    }
    for _ in 0..count {
        let kind = &FAULT_KINDS[d.weighted(&kinds)];
        if let Some(f) = (kind.draw)(d, &frame) {
            w.faults.push(f);
        }
    }
}

/// A later pass: none (half the worlds) or up to [`MAX_LATER_FAULTS`] of its kinds. Reloads
/// are versioned by their order in time, so no two are drawn at the same moment.
fn draw_later_faults(d: &mut Dice, w: &mut World, window_ms: u64, pass: u32) {
    let count = if d.chance(0.5) {
        0
    } else {
        d.int(1, MAX_LATER_FAULTS)
    };
    draw_pass(d, w, window_ms, pass, count);
    let mut taken = std::collections::BTreeSet::new();
    for f in w.faults.iter_mut().filter(|f| f.kind == "config_reload") {
        if let FaultTime::At { at_ms } = &mut f.time {
            while !taken.insert(*at_ms) {
                *at_ms += 1;
            }
        }
    }
}

fn draw_faults(d: &mut Dice, w: &mut World, window_ms: u64) {
    let count = if d.chance(0.1) {
        0
    } else {
        d.int(1, MAX_DRAWN_FAULTS)
    };
    draw_pass(d, w, window_ms, 0, count);
    // Units a gateway admits failing open while its agent is down are counted by no agent,
    // so no bound can cover them (docs/sim.md): a world that crashes an agent fails closed.
    if w.faults.iter().any(|f| f.kind == "agent_crash") {
        w.limits.iter_mut().for_each(|l| l.failure_closed = true);
    }
}
