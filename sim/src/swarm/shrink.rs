//! Shrinking: the smallest world that still fails the same way.
//!
//! Greedy, one simplification at a time: shorten the run, remove a fault (a reload or a
//! restore among them), a traffic source, a region or a limit, set a clock right or halve its
//! offset, put a region's gateways on their agent's clock, take a region's gateways' Envoy
//! fallback away (the statement stays), roll a reload out everywhere at
//! once (no stagger), drop a rate cap, make a partition policy `floor`, put the view and lease timings back to their defaults, make a
//! source's rate constant without retries. A simplification is kept when the
//! world still shows the violation kind it is shrunk for; the passes repeat until none is
//! kept, or [`MAX_SHRINK_RUNS`] runs were spent. The seed stays the same throughout.

use super::run::run_world;
use super::world::{FaultSpec, Param, PartitionPolicy, RetryDraw, Shape, SourceDraw, World};
use crate::error::Result;
use crate::node::NodeFactory;
use crate::scenario::Scenario;

/// Most runs one shrink spends (each is one run of the world).
pub const MAX_SHRINK_RUNS: u64 = 600;

/// The result of a shrink.
#[derive(Clone, Debug, PartialEq)]
pub struct Shrunk {
    pub world: World,
    /// The kind it was shrunk for.
    pub kind: String,
    /// Runs spent.
    pub runs: u64,
    /// Simplifications kept.
    pub steps: u64,
}

/// Shrinks `world`, which fails with `kind`, to the smallest world found that still does.
/// Returns `None` when `world` itself does not show `kind`.
pub fn shrink<F, B>(world: &World, kind: &str, build: &B) -> Result<Option<Shrunk>>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F>,
{
    let fails = |w: &World| -> Result<bool> { Ok(run_world(w, build)?.kinds.contains_key(kind)) };
    if !fails(world)? {
        return Ok(None);
    }
    let mut s = Shrunk {
        world: world.clone(),
        kind: kind.to_string(),
        runs: 1,
        steps: 0,
    };
    loop {
        let mut kept = false;
        let mut step = 0;
        while let Some(candidate) = simplification(&s.world, step) {
            if candidate == s.world {
                step += 1;
                continue;
            }
            if s.runs >= MAX_SHRINK_RUNS {
                return Ok(Some(s));
            }
            s.runs += 1;
            if fails(&candidate)? {
                s.world = candidate;
                s.steps += 1;
                kept = true;
                // The same step again: the list shifted under it.
            } else {
                step += 1;
            }
        }
        if !kept {
            return Ok(Some(s));
        }
    }
}

/// The `step`-th simplification of `w`, or `None` past the last. A step that does not apply
/// returns `w` unchanged (skipped without a run).
fn simplification(w: &World, step: usize) -> Option<World> {
    let window_ms = w.longest_window_ms();
    let mut step = step;
    let mut take = |n: usize| -> Option<usize> {
        if step < n {
            Some(step)
        } else {
            step -= n;
            None
        }
    };
    if let Some(i) = take(2) {
        let windows = w.duration_ms / window_ms;
        let to = if i == 0 { windows / 2 } else { windows - 1 };
        return Some(if to >= 1 && to < windows {
            truncate(w, to * window_ms)
        } else {
            w.clone()
        });
    }
    if let Some(i) = take(w.faults.len()) {
        let mut c = w.clone();
        c.faults.remove(i);
        return Some(c);
    }
    if let Some(i) = take(w.sources.len()) {
        return Some(if w.sources.len() > 1 {
            let mut c = w.clone();
            c.sources.remove(i);
            c
        } else {
            w.clone()
        });
    }
    if let Some(i) = take(w.regions.len()) {
        return Some(without_region(w, i).unwrap_or_else(|| w.clone()));
    }
    if let Some(i) = take(w.limits.len()) {
        return Some(without_limit(w, i).unwrap_or_else(|| w.clone()));
    }
    if let Some(i) = take(w.regions.len()) {
        let mut c = w.clone();
        c.regions[i].offset_ms = 0;
        c.regions[i].drift_ppm = 0;
        return Some(c);
    }
    if let Some(i) = take(w.regions.len()) {
        let mut c = w.clone();
        c.regions[i].offset_ms /= 2;
        return Some(c);
    }
    if let Some(i) = take(w.regions.len()) {
        let mut c = w.clone();
        c.regions[i].gateway_offset_ms = 0;
        c.regions[i].gateway_drift_ppm = 0;
        return Some(c);
    }
    if let Some(i) = take(w.regions.len()) {
        let mut c = w.clone();
        c.regions[i].envoy_fallback_units = 0;
        return Some(c);
    }
    if let Some(i) = take(w.faults.len()) {
        let mut c = w.clone();
        for (_, p) in &mut c.faults[i].params {
            if let Param::Stagger(delays) = p {
                delays.clear();
            }
        }
        return Some(c);
    }
    if let Some(i) = take(w.limits.len()) {
        let mut c = w.clone();
        c.limits[i].rate_cap = None;
        return Some(c);
    }
    if let Some(i) = take(w.limits.len()) {
        let mut c = w.clone();
        c.limits[i].policy = PartitionPolicy::Floor;
        return Some(c);
    }
    if take(1).is_some() {
        let mut c = w.clone();
        c.view_ttl_ms = None;
        c.lease.target_ms = None;
        c.lease.idle_release_after_ms = None;
        c.lease.max_leases_per_key = None;
        c.lease.refill_in_place = None;
        return Some(c);
    }
    if let Some(i) = take(w.sources.len()) {
        let mut c = w.clone();
        c.sources[i].retry = RetryDraw::None;
        c.sources[i].shape = Shape::Constant {
            per_sec: mean_rate(&w.sources[i].shape),
        };
        return Some(c);
    }
    None
}

/// A constant rate standing in for `shape` (its base, or its first step).
fn mean_rate(shape: &Shape) -> f64 {
    match shape {
        Shape::Constant { per_sec } => *per_sec,
        Shape::Steps(steps) => steps.first().map_or(0.0, |s| s.1),
        Shape::Flash { base_per_sec, .. } | Shape::Diurnal { base_per_sec, .. } => *base_per_sec,
    }
}

/// `w` cut to a run of `duration_ms`: what started later goes, what lasted longer ends there.
pub fn truncate(w: &World, duration_ms: u64) -> World {
    let mut c = w.clone();
    c.duration_ms = duration_ms;
    c.faults = w
        .faults
        .iter()
        .filter_map(|f| f.truncated(duration_ms))
        .collect();
    for s in &mut c.sources {
        s.shape = truncated_shape(&s.shape, duration_ms);
    }
    c
}

fn truncated_shape(shape: &Shape, duration_ms: u64) -> Shape {
    match shape {
        Shape::Steps(steps) => Shape::Steps(
            steps
                .iter()
                .copied()
                .filter(|(at, _)| *at == 0 || *at < duration_ms)
                .collect(),
        ),
        Shape::Flash {
            base_per_sec,
            start_ms,
            ..
        } if *start_ms >= duration_ms => Shape::Constant {
            per_sec: *base_per_sec,
        },
        Shape::Flash {
            base_per_sec,
            factor,
            start_ms,
            end_ms,
        } => Shape::Flash {
            base_per_sec: *base_per_sec,
            factor: *factor,
            start_ms: *start_ms,
            end_ms: (*end_ms).min(duration_ms),
        },
        other => other.clone(),
    }
}

/// `w` without region `r`, its sources and the faults that name it; `None` if nothing would
/// be left to run.
fn without_region(w: &World, r: usize) -> Option<World> {
    if w.regions.len() < 2 {
        return None;
    }
    let mut c = w.clone();
    c.regions.remove(r);
    c.sources = w
        .sources
        .iter()
        .filter(|s| s.region != r)
        .map(|s| SourceDraw {
            region: if s.region > r { s.region - 1 } else { s.region },
            ..s.clone()
        })
        .collect();
    c.faults = w
        .faults
        .iter()
        .filter(|f| !f.names_region(r))
        .map(|f: &FaultSpec| f.without_region(r))
        .collect();
    (!c.sources.is_empty()).then_some(c)
}

/// `w` without limit `l` and its sources; `None` if nothing would be left to run.
fn without_limit(w: &World, l: usize) -> Option<World> {
    if w.limits.len() < 2 {
        return None;
    }
    let mut c = w.clone();
    c.limits.remove(l);
    c.sources = w
        .sources
        .iter()
        .filter(|s| s.limit != l)
        .map(|s| SourceDraw {
            limit: if s.limit > l { s.limit - 1 } else { s.limit },
            ..s.clone()
        })
        .collect();
    c.faults = w.faults.iter().map(|f| f.without_limit(l)).collect();
    (!c.sources.is_empty()).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario;
    use crate::swarm::draw;

    /// Every simplification of a drawn world is a scenario that loads: a reload keeps one
    /// entry per remaining limit and names only remaining regions, a restore keeps `from`
    /// before `at`.
    #[test]
    fn every_simplification_of_a_drawn_world_loads() {
        let mut reloads_simplified = 0;
        for seed in 0..150 {
            let w = draw::world(seed);
            let mut step = 0;
            while let Some(c) = simplification(&w, step) {
                let text = c.to_yaml();
                scenario::parse("shrunk.yaml", &text)
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}\n{text}"));
                if c != w && c.faults.iter().any(|f| f.kind == "config_reload") {
                    reloads_simplified += 1;
                }
                step += 1;
            }
        }
        assert!(reloads_simplified > 100, "{reloads_simplified}");
    }

    /// Zeroing a stagger and a gateway clock are steps of their own.
    #[test]
    fn staggers_and_gateway_clocks_are_simplified() {
        let w = (0..200)
            .map(draw::world)
            .find(|w| {
                w.regions.iter().any(|r| r.gateway_offset_ms != 0)
                    && w.faults.iter().any(|f| {
                        f.params
                            .iter()
                            .any(|(_, p)| matches!(p, Param::Stagger(d) if !d.is_empty()))
                    })
            })
            .expect("a drawn world with a gateway clock and a staggered reload");
        let candidates: Vec<World> = (0..).map_while(|step| simplification(&w, step)).collect();
        assert!(candidates.iter().any(|c| {
            c.regions
                .iter()
                .filter(|r| r.gateway_offset_ms != 0)
                .count()
                == w.regions
                    .iter()
                    .filter(|r| r.gateway_offset_ms != 0)
                    .count()
                    - 1
                && c.faults.len() == w.faults.len()
        }));
        let staggered = |w: &World| {
            w.faults
                .iter()
                .filter(|f| {
                    f.params
                        .iter()
                        .any(|(_, p)| matches!(p, Param::Stagger(d) if !d.is_empty()))
                })
                .count()
        };
        assert!(
            candidates
                .iter()
                .any(|c| staggered(c) == staggered(&w) - 1 && c.faults.len() == w.faults.len())
        );
    }
}
