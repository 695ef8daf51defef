//! The fault kinds the swarm draws from, one function each.
//!
//! To add a kind: write `fn draw_<kind>(dice, frame) -> Option<FaultSpec>` choosing its
//! target, time and parameters, and add it to [`FAULT_KINDS`] with a weight and the pass it
//! is drawn in. Nothing else changes: the world prints every [`FaultSpec`] the same way, and
//! the shrinker removes it like any other.
//!
//! Passes keep old seeds' worlds: the faults of pass 0 are drawn among the world's first
//! draws, those of each later pass after everything else (`super::draw`), so a kind added in a
//! new pass leaves every earlier draw of a seed as it was. A new kind goes in a new pass.

use super::rng::Dice;
use super::world::{
    Consistency, FaultSpec, FaultTime, LimitDraw, Param, PartitionPolicy, RateDraw, ReloadLimit,
    Target,
};

/// What a fault is drawn against: the world's shape, already drawn.
pub struct Frame {
    pub duration_ms: u64,
    /// The shortest window of the world's limits.
    pub window_ms: u64,
    pub sync_interval_ms: u64,
    /// Gateways of each region.
    pub gateways: Vec<u32>,
    /// Each limit's window, in the order of the world's limits.
    pub limit_windows_ms: Vec<u64>,
    /// The world's limits as drawn (what a reload changes).
    pub limits: Vec<LimitDraw>,
}

/// One fault kind: its name in the scenario format, how often it is drawn, and how.
pub struct FaultKind {
    pub name: &'static str,
    pub weight: u32,
    pub draw: fn(&mut Dice, &Frame) -> Option<FaultSpec>,
    /// The pass it is drawn in (see the module's docs).
    pub pass: u32,
}

pub const FAULT_KINDS: &[FaultKind] = &[
    FaultKind {
        name: "partition",
        weight: 4,
        draw: draw_partition,
        pass: 0,
    },
    FaultKind {
        name: "coordinator_outage",
        weight: 2,
        draw: draw_coordinator_outage,
        pass: 0,
    },
    FaultKind {
        name: "agent_crash",
        weight: 2,
        draw: draw_agent_crash,
        pass: 0,
    },
    FaultKind {
        name: "gateway_crash",
        weight: 2,
        draw: draw_gateway_crash,
        pass: 0,
    },
    FaultKind {
        name: "link",
        weight: 3,
        draw: draw_link,
        pass: 0,
    },
    FaultKind {
        name: "agent_restore",
        weight: 2,
        draw: draw_agent_restore,
        pass: 1,
    },
    FaultKind {
        name: "config_reload",
        weight: 2,
        draw: draw_config_reload,
        pass: 1,
    },
    FaultKind {
        name: "region_removal",
        weight: 1,
        draw: draw_region_removal,
        pass: 2,
    },
    FaultKind {
        name: "clock_step",
        weight: 1,
        draw: draw_clock_step,
        pass: 3,
    },
];

/// The last pass of [`FAULT_KINDS`]. Passes 1 and 2 are drawn before the settings drawn
/// last (where they were when they were added); pass 3 after everything.
pub const LAST_PASS: u32 = 3;

/// Share of spans that start at the beginning of the run.
const EARLY_SPANS: f64 = 0.2;

/// Most faults a world draws in the first pass.
pub const MAX_DRAWN_FAULTS: u64 = 6;
/// Most faults a world draws in each later pass.
pub const MAX_LATER_FAULTS: u64 = 2;
/// Share of reloads that change each of a limit's terms (quota, mode, policy, rate cap,
/// weights), each on its own.
const RELOAD_CHANGE: f64 = 0.4;
/// A reloaded quota: from this fraction of the old one to its inverse (log-uniform).
const RELOAD_QUOTA_FACTOR: f64 = 0.3;

/// A span of the run: from a sync interval to several windows long, anywhere in it, or
/// (one time in five) starting within the first two sync intervals, before the first
/// exchanges with the coordinator have settled.
fn span(dice: &mut Dice, frame: &Frame) -> FaultTime {
    let shortest = frame.sync_interval_ms.min(frame.duration_ms / 2).max(1);
    let longest = (frame.window_ms * 3).clamp(shortest, frame.duration_ms);
    let len_ms = dice.log(shortest as f64, longest as f64).round() as u64;
    let len_ms = len_ms.clamp(1, frame.duration_ms);
    let latest_start_ms = frame.duration_ms - len_ms;
    let start_ms = if dice.chance(EARLY_SPANS) {
        dice.int(0, (2 * frame.sync_interval_ms).min(latest_start_ms))
    } else {
        dice.int(0, latest_start_ms)
    };
    FaultTime::Span {
        start_ms,
        end_ms: start_ms + len_ms.max(1),
    }
}

/// A moment in the run, leaving room for a restart before its end.
fn moment(dice: &mut Dice, frame: &Frame) -> u64 {
    dice.int(0, frame.duration_ms * 3 / 4)
}

/// A down time: from a sync interval to two windows.
fn down_time(dice: &mut Dice, frame: &Frame) -> u64 {
    let lo = frame.sync_interval_ms as f64;
    let hi = (frame.window_ms * 2).max(frame.sync_interval_ms) as f64;
    dice.log(lo, hi).round() as u64
}

fn region_or_all(dice: &mut Dice, frame: &Frame) -> Target {
    if dice.chance(0.3) {
        Target::AllRegions
    } else {
        Target::Region(dice.index(frame.gateways.len()))
    }
}

fn direction(dice: &mut Dice) -> Param {
    Param::Word(dice.weighted(&[(1, "up"), (1, "down"), (1, "both")]))
}

fn draw_partition(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    Some(FaultSpec {
        kind: "partition",
        target: region_or_all(dice, frame),
        time: span(dice, frame),
        params: vec![("direction", direction(dice))],
    })
}

fn draw_coordinator_outage(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    Some(FaultSpec {
        kind: "coordinator_outage",
        target: Target::Nothing,
        time: span(dice, frame),
        params: Vec::new(),
    })
}

fn draw_agent_crash(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    Some(FaultSpec {
        kind: "agent_crash",
        target: Target::Region(dice.index(frame.gateways.len())),
        time: FaultTime::At {
            at_ms: moment(dice, frame),
        },
        params: vec![("restart_after", Param::Ms(down_time(dice, frame)))],
    })
}

fn draw_gateway_crash(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let region = dice.index(frame.gateways.len());
    let gateway = dice.int(0, u64::from(frame.gateways[region]).saturating_sub(1)) as u32;
    let mut params = Vec::new();
    if dice.chance(0.8) {
        params.push(("restart_after", Param::Ms(down_time(dice, frame))));
    }
    Some(FaultSpec {
        kind: "gateway_crash",
        target: Target::Gateway { region, gateway },
        time: FaultTime::At {
            at_ms: moment(dice, frame),
        },
        params,
    })
}

fn draw_link(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let mut params = vec![("direction", direction(dice))];
    let prob = |dice: &mut Dice, max: f64| (dice.real(0.0, max) * 1000.0).round() / 1000.0;
    if dice.chance(0.7) {
        params.push(("loss", Param::Prob(prob(dice, 0.5))));
    }
    if dice.chance(0.5) {
        params.push(("duplicate", Param::Prob(prob(dice, 0.3))));
    }
    if dice.chance(0.5) {
        params.push(("reorder", Param::Prob(prob(dice, 0.5))));
        let window_ms = dice.int(1, frame.sync_interval_ms * 4);
        params.push(("reorder_window", Param::Ms(window_ms)));
    }
    if dice.chance(0.5) {
        params.push(("delay", Param::Ms(dice.log(1.0, 500.0).round() as u64)));
    }
    Some(FaultSpec {
        kind: "link",
        target: region_or_all(dice, frame),
        time: span(dice, frame),
        params,
    })
}

/// The agent stops and restarts at once from its store as it was a while before: from a
/// sync interval to two windows earlier, or the run's start (an empty store).
fn draw_agent_restore(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let region = dice.index(frame.gateways.len());
    let at_ms = moment(dice, frame).max(1);
    let from_ms = if dice.chance(0.2) {
        0
    } else {
        at_ms.saturating_sub(down_time(dice, frame)).min(at_ms - 1)
    };
    Some(FaultSpec {
        kind: "agent_restore",
        target: Target::Region(region),
        time: FaultTime::At { at_ms },
        params: vec![("from", Param::Ms(from_ms))],
    })
}

/// An operator removes a region while its agent keeps running (it spends what it holds), and
/// most times adds it back after a while.
fn draw_region_removal(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let mut params = Vec::new();
    if dice.chance(0.7) {
        params.push(("restore_after", Param::Ms(down_time(dice, frame))));
    }
    Some(FaultSpec {
        kind: "region_removal",
        target: Target::Region(dice.index(frame.gateways.len())),
        time: FaultTime::At {
            at_ms: moment(dice, frame),
        },
        params,
    })
}

/// An agent host's clock steps back or forward by a sync interval to three windows (an NTP
/// step, a VM resumed from a snapshot), anywhere in the run. A running agent does not see it;
/// its next start does (D73).
fn draw_clock_step(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let lo = frame.sync_interval_ms as f64;
    let hi = (frame.window_ms * 3).max(frame.sync_interval_ms) as f64;
    let size_ms = dice.log(lo, hi).round() as i64;
    let region = dice.index(frame.gateways.len());
    let at_ms = moment(dice, frame);
    // Drawn last, so that a step's size, region and time are those drawn before steps
    // forward were (D73).
    let by_ms = if dice.chance(0.5) { -size_ms } else { size_ms };
    Some(FaultSpec {
        kind: "clock_step",
        target: Target::Region(region),
        time: FaultTime::At { at_ms },
        params: vec![("by", Param::Raw(format!("{by_ms}ms")))],
    })
}

/// A new limits configuration: every limit keeps its id and window (the format's rule), and
/// each of its quota, mode, partition policy, rate cap and region weights changes or not;
/// each region takes it at once or up to two windows later (a staggered rollout).
fn draw_config_reload(dice: &mut Dice, frame: &Frame) -> Option<FaultSpec> {
    let at_ms = moment(dice, frame).max(1);
    let regions = frame.gateways.len();
    let mut stagger: Vec<(usize, u64)> = Vec::new();
    for r in 0..regions {
        if dice.chance(0.5) {
            stagger.push((r, down_time(dice, frame)));
        }
    }
    let limits = frame
        .limits
        .iter()
        .enumerate()
        .map(|(i, l)| reload_limit(dice, i, l, regions))
        .collect();
    Some(FaultSpec {
        kind: "config_reload",
        target: Target::Nothing,
        time: FaultTime::At { at_ms },
        params: vec![
            ("stagger", Param::Stagger(stagger)),
            ("limits", Param::Limits(limits)),
        ],
    })
}

fn reload_limit(dice: &mut Dice, i: usize, l: &LimitDraw, regions: usize) -> ReloadLimit {
    let mut r = ReloadLimit {
        limit: i,
        quota_units: l.quota_units,
        consistency: l.consistency,
        policy: l.policy,
        rate_cap: l.rate_cap,
        weights_ppm: None,
        rlqs_fallback_units: None,
        settle_overage_percent: None,
    };
    if dice.chance(RELOAD_CHANGE) {
        let factor = dice.log(RELOAD_QUOTA_FACTOR, 1.0 / RELOAD_QUOTA_FACTOR);
        r.quota_units = ((l.quota_units as f64 * factor).round() as u64).max(1);
    }
    if dice.chance(RELOAD_CHANGE) {
        r.consistency = match l.consistency {
            Consistency::Strict => Consistency::Eventual,
            Consistency::Eventual => Consistency::Strict,
        };
    }
    let quota = r.quota_units as f64;
    let part =
        |dice: &mut Dice, lo: f64, hi: f64| ((quota * dice.real(lo, hi)).ceil() as u64).max(1);
    if dice.chance(RELOAD_CHANGE) {
        r.policy = match dice.weighted(&[(1, 0), (1, 1), (1, 2)]) {
            0 => PartitionPolicy::Floor,
            1 => PartitionPolicy::Closed,
            _ => {
                let units = part(dice, 0.05, 0.5);
                PartitionPolicy::Open {
                    units,
                    burst_units: (units / 10).max(1),
                }
            }
        };
    }
    if dice.chance(RELOAD_CHANGE) {
        r.rate_cap = if dice.chance(0.5) {
            None
        } else {
            Some(RateDraw {
                units: part(dice, 0.5, 2.0),
                burst_units: part(dice, 0.01, 0.3),
            })
        };
    }
    if dice.chance(RELOAD_CHANGE) {
        r.weights_ppm = Some(weights(dice, regions));
    }
    r
}

/// Weights in thousandths for `regions` regions, adding up to 1 or a little less.
fn weights(dice: &mut Dice, regions: usize) -> Vec<(usize, u32)> {
    let raw: Vec<f64> = (0..regions).map(|_| dice.real(0.1, 1.0)).collect();
    let total = if dice.chance(0.8) {
        1.0
    } else {
        dice.real(0.7, 1.0)
    };
    let sum: f64 = raw.iter().sum();
    raw.iter()
        .enumerate()
        .map(|(r, w)| {
            (
                r,
                ((w / sum * total * 1_000.0).floor() as u32).max(1) * 1_000,
            )
        })
        .collect()
}
