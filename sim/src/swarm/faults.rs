//! The fault kinds the swarm draws from, one function each.
//!
//! To add a kind: write `fn draw_<kind>(dice, frame) -> Option<FaultSpec>` choosing its
//! target, time and parameters, and add it to [`FAULT_KINDS`] with a weight. Nothing else
//! changes: the world prints every [`FaultSpec`] the same way, and the shrinker removes it
//! like any other.

use super::rng::Dice;
use super::world::{FaultSpec, FaultTime, Param, Target};

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
}

/// One fault kind: its name in the scenario format, how often it is drawn, and how.
pub struct FaultKind {
    pub name: &'static str,
    pub weight: u32,
    pub draw: fn(&mut Dice, &Frame) -> Option<FaultSpec>,
}

pub const FAULT_KINDS: &[FaultKind] = &[
    FaultKind {
        name: "partition",
        weight: 4,
        draw: draw_partition,
    },
    FaultKind {
        name: "coordinator_outage",
        weight: 2,
        draw: draw_coordinator_outage,
    },
    FaultKind {
        name: "agent_crash",
        weight: 2,
        draw: draw_agent_crash,
    },
    FaultKind {
        name: "gateway_crash",
        weight: 2,
        draw: draw_gateway_crash,
    },
    FaultKind {
        name: "link",
        weight: 3,
        draw: draw_link,
    },
];

/// Share of spans that start at the beginning of the run.
const EARLY_SPANS: f64 = 0.2;

/// Most faults a world draws.
pub const MAX_DRAWN_FAULTS: u64 = 6;

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
