//! Setting a run up: keys, gateways, links and machines wired from the scenario, and the first
//! events.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use allot_core::gateway::{Gateway, GatewayConfig};
use allot_core::time::{Timestamp, duration_nanos};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::check::Checker;
use crate::clock::{AgentClock, RegionClock};
use crate::error::{Result, SimError};
use crate::link::Link;
use crate::measure::{KeyMeta, LocalRange, Mark, Measure};
use crate::node::{CoordinatorSetup, NodeFactory, RegionSetup};
use crate::queue::EventQueue;
use crate::scenario::{Direction, Fault, Scenario};
use crate::traffic::ArrivalGen;

use super::gateways::GatewayClock;
use super::messages::link_plans;
use super::{
    CoordinatorRt, Engine, Event, GatewayRt, LINK_STREAM, MAX_QUEUED_EVENTS, RegionRt, RunSpec,
    RunStats, SOURCE_STREAM_BASE, SourceRt,
};

/// A seed for one purpose within a run (splitmix64 of the run's seed and the purpose), so that
/// machines and streams never share draws.
pub fn derive_seed(seed: u64, purpose: u64) -> u64 {
    let mut z = seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) fn stream(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

pub(super) fn keys_of(scenario: &Scenario) -> (Vec<KeyMeta>, Vec<usize>) {
    let mut keys: Vec<KeyMeta> = Vec::new();
    let mut of_source = Vec::with_capacity(scenario.traffic.len());
    for s in &scenario.traffic {
        let at = keys
            .iter()
            .position(|k| k.limit == s.limit && k.key == s.key);
        let index = at.unwrap_or_else(|| {
            let limit_index = scenario
                .limits
                .limits
                .iter()
                .position(|l| l.id == s.limit)
                .unwrap_or_else(|| unreachable!("sources are checked against the limits"));
            keys.push(KeyMeta {
                limit_index,
                limit: s.limit.clone(),
                key: s.key.clone(),
            });
            keys.len() - 1
        });
        of_source.push(index);
    }
    (keys, of_source)
}

pub(super) fn gateway_config(scenario: &Scenario, keys: usize) -> GatewayConfig {
    let defaults = GatewayConfig::default();
    GatewayConfig {
        max_keys: defaults.max_keys.max(keys),
        max_leases_per_key: scenario.lease.max_leases_per_key,
        initial_lease_units: scenario.lease.initial_units,
        max_lease_units: scenario.lease.max_units,
        lease_target: scenario.lease.target,
        idle_release_after: scenario.lease.idle_release_after,
        refill_in_place: scenario.lease.refill_in_place,
        ..defaults
    }
}

pub(super) fn offset(scenario: &Scenario, t_nanos: u64) -> Timestamp {
    Timestamp::from_unix_nanos(scenario.start.as_unix_nanos() + t_nanos)
}

/// Moments after which the system should settle: jumps in demand (a source starting or
/// changing rate) and heals.
pub fn marks(scenario: &Scenario) -> Vec<Mark> {
    let ms = |d: Duration| duration_nanos(d) / 1_000_000;
    let mut out = Vec::new();
    for (i, s) in scenario.traffic.iter().enumerate() {
        if !s.start.is_zero() {
            out.push(Mark {
                at_ms: ms(s.start),
                what: format!("traffic[{i}] starts"),
            });
        }
        for shift in s.rate.shifts() {
            out.push(Mark {
                at_ms: ms(shift),
                what: format!("traffic[{i}] changes rate"),
            });
        }
    }
    for (i, f) in scenario.faults.iter().enumerate() {
        if let Some(heal) = f.heals_at().filter(|h| *h < scenario.duration) {
            out.push(Mark {
                at_ms: ms(heal),
                what: format!("faults[{i}] heals"),
            });
        }
    }
    out.sort_by(|a, b| (a.at_ms, &a.what).cmp(&(b.at_ms, &b.what)));
    out
}

impl<'s, F: NodeFactory> Engine<'s, F> {
    pub(super) fn new(scenario: &'s Scenario, factory: &'s F, spec: RunSpec) -> Result<Self> {
        let (keys, key_of_source) = keys_of(scenario);
        let clocks: Vec<AgentClock> = scenario
            .regions
            .iter()
            .enumerate()
            .map(|(index, r)| {
                let steps = scenario
                    .faults
                    .iter()
                    .filter_map(|f| match *f {
                        Fault::ClockStep {
                            region,
                            at,
                            by_nanos,
                        } if region == index => Some((scenario.start + at, by_nanos)),
                        _ => None,
                    })
                    .collect();
                AgentClock::new(RegionClock::new(scenario.start, r.clock), steps)
            })
            .collect();
        // A corrected clock reads the true time, or its own clock until sampled; off it by
        // at most the clocks' drift over the run (`MAX_DRIFT_PPM`, a tenth).
        let corrected_last = (scenario.end() - Duration::from_nanos(1)) + scenario.duration / 10;
        let local: Vec<LocalRange> = clocks
            .iter()
            .map(|c| {
                let (first, last) = c.any_reading_range(scenario.start, scenario.end());
                LocalRange {
                    first,
                    last: if factory.corrects_clocks() {
                        last.max(corrected_last)
                    } else {
                        last
                    },
                }
            })
            .collect();
        let failure_modes = keys
            .iter()
            .map(|k| factory.failure_mode(&k.limit))
            .collect();
        let key_count = keys.len();
        let measure = Measure::new(scenario, keys, &local).ok_or_else(|| SimError::Bound {
            scenario: scenario.name.clone(),
            seed: spec.seed,
            what: "window cells (keys x windows x regions)",
            bound: crate::measure::MAX_WINDOW_CELLS,
        })?;
        let gateway_config = gateway_config(scenario, key_count);
        let mut regions = Vec::with_capacity(scenario.regions.len());
        for (index, (r, clock)) in scenario.regions.iter().zip(clocks).enumerate() {
            let keeps_store = scenario.faults.iter().any(|f| match *f {
                Fault::AgentCrash { region, .. } | Fault::AgentRestore { region, .. } => {
                    region == index
                }
                _ => false,
            });
            let gateways = (0..r.gateways)
                .map(|_| {
                    Ok(GatewayRt {
                        gateway: Some(Gateway::new(gateway_config.clone())?),
                        incarnation: 0,
                        handles: vec![None; key_count],
                        timer: None,
                        timer_local: None,
                        fallback_used: HashMap::new(),
                        fallback_unreported: BTreeMap::new(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            regions.push(RegionRt {
                id: r.id.clone(),
                gateway_clock: GatewayClock::new(scenario.start, clock.base(), r.gateway_clock),
                agent_clock: clock.clone(),
                clock,
                node: None,
                store: Default::default(),
                keeps_store,
                store_copies: Vec::new(),
                timer: None,
                up: Link { latency: r.latency },
                down: Link { latency: r.latency },
                gateways,
                next_gateway: 0,
                lease_readings: Default::default(),
                starts: 0,
                down_correction_nanos: 0,
            });
        }
        let sources = scenario
            .traffic
            .iter()
            .enumerate()
            .map(|(i, s)| SourceRt {
                key: key_of_source[i],
                region: s.region,
                arrivals: ArrivalGen::new(s.rate.clone(), s.arrivals, s.start, s.end),
                cost: s.cost.clone(),
                retry: s.retry.clone(),
                arrival_rng: stream(spec.seed, SOURCE_STREAM_BASE + 2 * i as u64),
                client_rng: stream(spec.seed, SOURCE_STREAM_BASE + 2 * i as u64 + 1),
                pending_retries: 0,
            })
            .collect();
        Ok(Engine {
            scenario,
            factory,
            spec,
            now: scenario.start,
            queue: EventQueue::new(MAX_QUEUED_EVENTS),
            arrivals: BinaryHeap::with_capacity(scenario.traffic.len()),
            regions,
            coordinator: CoordinatorRt {
                node: None,
                term: 0,
                log: Vec::new(),
                timer: None,
                proposed: 0,
                committed: 0,
                waiting: VecDeque::new(),
            },
            sources,
            failure_modes,
            up_plans: link_plans(scenario, Direction::Up),
            down_plans: link_plans(scenario, Direction::Down),
            link_rng: stream(spec.seed, LINK_STREAM),
            measure,
            checker: Checker::default(),
            stats: RunStats::default(),
        })
    }

    pub(super) fn region_setup(&self, region: usize) -> RegionSetup<'s> {
        RegionSetup {
            scenario: self.scenario,
            region_index: region,
            region: &self.scenario.regions[region].id,
            policy: self.spec.policy,
            seed: derive_seed(self.spec.seed, 100 + region as u64),
            reload: None,
            restored: false,
        }
    }

    pub(super) fn coordinator_setup(&self) -> CoordinatorSetup<'s> {
        CoordinatorSetup {
            scenario: self.scenario,
            policy: self.spec.policy,
            seed: derive_seed(self.spec.seed, 99),
            leader_term: self.coordinator.term,
        }
    }

    pub(super) fn start(&mut self) -> Result<()> {
        for r in 0..self.regions.len() {
            let local = self.regions[r].clock.local(self.now);
            let node = self.factory.region(&self.region_setup(r), local);
            let now = self.now;
            self.regions[r].set_node(node, now);
            self.after_region_input(r)?;
        }
        let node = self
            .factory
            .coordinator(&self.coordinator_setup(), self.now);
        self.coordinator.node = Some(node);
        self.after_coordinator_input()?;
        for s in 0..self.sources.len() {
            let src = &mut self.sources[s];
            if let Some(t) = src.arrivals.first(&mut src.arrival_rng) {
                self.arrivals.push(Reverse((offset(self.scenario, t), s)));
            }
        }
        self.schedule_faults()?;
        self.push(
            self.now + self.scenario.measure.sample_interval,
            Event::Sample,
        )
    }
}
