//! The discrete-event engine: one run of one scenario, under one seed and one policy.
//!
//! Virtual time is the true clock in nanoseconds; each region's machines and gateways see
//! their own clock ([`crate::clock`]). Events (messages, timers, faults, retries, settles,
//! samples) wait in a queue ordered by (time, insertion); request arrivals do not: each source
//! keeps only its next arrival, in a small heap of its own, so a request costs no event and no
//! allocation. At equal times queued events run before arrivals.
//!
//! A gateway's trip to its agent is in-region (microseconds against milliseconds of
//! cross-region latency) and is served synchronously: a request that finds no lease waits for
//! the agent's answer within the same instant.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use allot_core::gateway::{Gateway, GatewayConfig, KeyHandle, Spend, SpendReceipt, ToAgent};
use allot_core::ids::RegionId;
use allot_core::limit::{FailureMode, WEIGHT_SCALE_PPM};
use allot_core::sync::{CounterRef, SyncDown, SyncUp};
use allot_core::time::{Timestamp, duration_nanos};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::allocation::{RegionDemand, fair_targets, mean_units, within_tolerance};
use crate::check::Checker;
use crate::clock::RegionClock;
use crate::error::{Result, SimError};
use crate::link::{Link, LinkFaults};
use crate::measure::{KeyMeta, LocalRange, Mark, Measure};
use crate::node::{
    CoordinatorNode, CoordinatorObservation, CoordinatorSetup, LeaseAnswer, NodeFactory, Policy,
    RegionNode, RegionObservation, RegionSetup,
};
use crate::queue::EventQueue;
use crate::scenario::{Direction, Fault, Scenario};
use crate::sizes::{sync_down_bytes, sync_up_bytes};
use crate::traffic::{ArrivalGen, Cost, CostModel, RetryPolicy};

/// Most events pending at once (messages in flight, retries, settles, timers).
pub const MAX_QUEUED_EVENTS: usize = 5_000_000;
/// Most retries one source keeps pending; beyond it its clients give up.
pub const MAX_PENDING_RETRIES_PER_SOURCE: u32 = 100_000;
/// Most commands in the simulated replicated log (replayed into a new leader).
pub const MAX_COMMITTED_COMMANDS: usize = 1_000_000;
/// Most coordinator answers held back at once, waiting for proposals to commit.
pub const MAX_WAITING_REPLIES: usize = 100_000;

/// RNG stream numbers, so that adding a source or a link never changes another's draws.
const LINK_STREAM: u64 = 1;
const SOURCE_STREAM_BASE: u64 = 1_000;

/// One run to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunSpec {
    pub seed: u64,
    pub policy: Policy,
}

/// Counts of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    /// Attempts, retries included.
    pub requests: u64,
    pub admitted: u64,
    pub denials: u64,
    pub retries: u64,
    /// Retries not made because the source already had too many pending.
    pub retries_dropped: u64,
    /// Requests that found no gateway up in their region.
    pub unserved: u64,
    /// Requests admitted by the limit's open failure mode while the agent was unreachable.
    pub fail_open_admits: u64,
    pub lease_requests: u64,
    /// Releases and settles a gateway sent while its agent was down.
    pub gateway_messages_lost: u64,
    /// Settles that never happened because their gateway crashed first.
    pub settles_lost: u64,
    /// Units reservations' drawn counts wanted above their settle cap, which the spenders
    /// did not use (they stop at the cap the bound assumes).
    pub settle_units_beyond_cap: u64,
    pub sync_up_messages: u64,
    pub sync_up_bytes: u64,
    pub sync_down_messages: u64,
    pub sync_down_bytes: u64,
    /// Sync messages lost to partitions, link loss or a down receiver.
    pub sync_messages_dropped: u64,
    pub events: u64,
}

/// Everything a run produced, for the report.
pub struct RunOutcome {
    pub spec: RunSpec,
    pub measure: Measure,
    pub checker: Checker,
    pub stats: RunStats,
    pub marks: Vec<Mark>,
}

enum Event<C> {
    RegionTimer {
        region: usize,
        at: Timestamp,
    },
    GatewayTimer {
        region: usize,
        gateway: usize,
        at: Timestamp,
    },
    CoordinatorTimer {
        at: Timestamp,
    },
    ToCoordinator {
        region: usize,
        msg: SyncUp,
    },
    ToRegion {
        region: usize,
        msg: SyncDown,
    },
    Commit {
        term: u64,
        cmd: C,
    },
    Retry {
        source: usize,
        retries: u32,
        cost: Cost,
    },
    Settle(PendingSettle),
    AgentCrash {
        region: usize,
    },
    AgentRestart {
        region: usize,
    },
    /// Copy the region's store for the `agent_restore` fault numbered `fault`.
    StoreCopy {
        region: usize,
        fault: usize,
    },
    AgentRestore {
        region: usize,
        fault: usize,
    },
    GatewayCrash {
        region: usize,
        gateway: usize,
    },
    GatewayRestart {
        region: usize,
        gateway: usize,
    },
    CoordinatorDown,
    CoordinatorUp,
    Sample,
}

struct PendingSettle {
    source: usize,
    gateway: usize,
    incarnation: u32,
    /// `None` when the request was admitted by the open failure mode, with no lease.
    receipt: Option<SpendReceipt>,
    admitted_at: (Timestamp, Timestamp),
    reserved_units: u64,
    actual_units: u64,
}

struct GatewayRt {
    gateway: Option<Gateway>,
    /// Bumped at every crash: settles for an earlier incarnation are lost.
    incarnation: u32,
    /// Per key index: the gateway's handle, once looked up.
    handles: Vec<Option<KeyHandle>>,
    /// The armed sweep, on the true clock and as the gateway asked for it (its own clock).
    timer: Option<Timestamp>,
    timer_local: Option<Timestamp>,
}

struct RegionRt<R: RegionNode> {
    id: RegionId,
    clock: RegionClock,
    node: Option<R>,
    store: R::Store,
    /// The run restarts this region's agent, so its store is kept (otherwise nothing reads
    /// it: what the agent makes durable is drained and dropped).
    keeps_store: bool,
    /// Copies of the store taken for `agent_restore` faults, by fault number.
    store_copies: Vec<(usize, R::Store)>,
    timer: Option<Timestamp>,
    up: Link,
    down: Link,
    gateways: Vec<GatewayRt>,
    next_gateway: usize,
}

struct CoordinatorRt<C: CoordinatorNode> {
    node: Option<C>,
    /// Bumped at every leader loss: commits proposed by an earlier leader are lost.
    term: u64,
    log: Vec<C::Command>,
    timer: Option<Timestamp>,
    /// Proposals of this term sent to the log, and how many of them have committed (in
    /// order: every proposal takes the same commit latency).
    proposed: u64,
    committed: u64,
    /// Answers held back until the proposals polled before them commit (the coordinator's
    /// driver contract), oldest first.
    waiting: VecDeque<WaitingReply>,
}

/// A SyncUp handled by the coordinator whose answer waits for proposals to commit.
struct WaitingReply {
    region: usize,
    seq: u64,
    /// The answer may go once this many proposals of the term have committed.
    after_committed: u64,
}

struct SourceRt {
    key: usize,
    region: usize,
    arrivals: ArrivalGen,
    cost: CostModel,
    retry: RetryPolicy,
    arrival_rng: ChaCha8Rng,
    client_rng: ChaCha8Rng,
    pending_retries: u32,
}

/// Link faults and partitions of one (region, direction), as true-time intervals.
#[derive(Clone, Debug, Default)]
struct LinkPlan {
    /// `(start, end, None)` is a partition.
    intervals: Vec<(Timestamp, Timestamp, Option<LinkFaults>)>,
}

impl LinkPlan {
    fn partitioned(&self, t: Timestamp) -> bool {
        self.intervals
            .iter()
            .any(|(s, e, f)| f.is_none() && *s <= t && t < *e)
    }

    fn faults(&self, t: Timestamp) -> LinkFaults {
        self.intervals
            .iter()
            .filter(|(s, e, _)| *s <= t && t < *e)
            .filter_map(|(_, _, f)| *f)
            .fold(LinkFaults::default(), LinkFaults::combine)
    }
}

/// What became of one attempt.
enum Served {
    Admitted {
        gateway: usize,
        receipt: Option<SpendReceipt>,
        local: Timestamp,
    },
    Denied {
        retry_after: Option<Duration>,
    },
}

struct Engine<'s, F: NodeFactory> {
    scenario: &'s Scenario,
    factory: &'s F,
    spec: RunSpec,
    now: Timestamp,
    queue: EventQueue<Event<<F::Coordinator as CoordinatorNode>::Command>>,
    /// (next arrival, source).
    arrivals: BinaryHeap<Reverse<(Timestamp, usize)>>,
    regions: Vec<RegionRt<F::Region>>,
    coordinator: CoordinatorRt<F::Coordinator>,
    sources: Vec<SourceRt>,
    failure_modes: Vec<FailureMode>,
    up_plans: Vec<LinkPlan>,
    down_plans: Vec<LinkPlan>,
    link_rng: ChaCha8Rng,
    measure: Measure,
    checker: Checker,
    stats: RunStats,
}

/// Runs `scenario` once.
pub fn run<F: NodeFactory>(scenario: &Scenario, factory: &F, spec: RunSpec) -> Result<RunOutcome> {
    let mut engine = Engine::new(scenario, factory, spec)?;
    engine.start()?;
    engine.run_to_end()?;
    Ok(engine.finish())
}

/// A seed for one purpose within a run (splitmix64 of the run's seed and the purpose), so that
/// machines and streams never share draws.
pub fn derive_seed(seed: u64, purpose: u64) -> u64 {
    let mut z = seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn stream(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

fn keys_of(scenario: &Scenario) -> (Vec<KeyMeta>, Vec<usize>) {
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

fn gateway_config(scenario: &Scenario, keys: usize) -> GatewayConfig {
    let defaults = GatewayConfig::default();
    GatewayConfig {
        max_keys: defaults.max_keys.max(keys),
        max_leases_per_key: scenario.lease.max_leases_per_key,
        initial_lease_units: scenario.lease.initial_units,
        max_lease_units: scenario.lease.max_units,
        lease_target: scenario.lease.target,
        idle_release_after: scenario.lease.idle_release_after,
        ..defaults
    }
}

fn link_plans(scenario: &Scenario, direction: Direction) -> Vec<LinkPlan> {
    let at = |d: Duration| scenario.start + d;
    (0..scenario.regions.len())
        .map(|r| {
            let intervals = scenario
                .faults
                .iter()
                .filter_map(|f| match f {
                    Fault::Partition {
                        regions,
                        direction: d,
                        start,
                        end,
                    } if regions.includes(r) && d.includes(direction) => {
                        Some((at(*start), at(*end), None))
                    }
                    Fault::Link {
                        regions,
                        direction: d,
                        start,
                        end,
                        faults,
                    } if regions.includes(r) && d.includes(direction) => {
                        Some((at(*start), at(*end), Some(*faults)))
                    }
                    _ => None,
                })
                .collect();
            LinkPlan { intervals }
        })
        .collect()
}

impl<'s, F: NodeFactory> Engine<'s, F> {
    fn new(scenario: &'s Scenario, factory: &'s F, spec: RunSpec) -> Result<Self> {
        let (keys, key_of_source) = keys_of(scenario);
        let clocks: Vec<RegionClock> = scenario
            .regions
            .iter()
            .map(|r| RegionClock::new(scenario.start, r.clock))
            .collect();
        let local: Vec<LocalRange> = clocks
            .iter()
            .map(|c| LocalRange {
                first: c.local(scenario.start),
                last: c.local(scenario.end() - Duration::from_nanos(1)),
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
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            regions.push(RegionRt {
                id: r.id.clone(),
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

    fn bound_error(&self, what: &'static str, bound: usize) -> SimError {
        SimError::Bound {
            scenario: self.scenario.name.clone(),
            seed: self.spec.seed,
            what,
            bound,
        }
    }

    fn push(
        &mut self,
        at: Timestamp,
        event: Event<<F::Coordinator as CoordinatorNode>::Command>,
    ) -> Result<()> {
        self.queue
            .push(at.max(self.now), event)
            .map_err(|_| self.bound_error("pending events", MAX_QUEUED_EVENTS))
    }

    fn region_setup(&self, region: usize) -> RegionSetup<'s> {
        RegionSetup {
            scenario: self.scenario,
            region_index: region,
            region: &self.scenario.regions[region].id,
            policy: self.spec.policy,
            seed: derive_seed(self.spec.seed, 100 + region as u64),
        }
    }

    fn coordinator_setup(&self) -> CoordinatorSetup<'s> {
        CoordinatorSetup {
            scenario: self.scenario,
            policy: self.spec.policy,
            seed: derive_seed(self.spec.seed, 99),
            leader_term: self.coordinator.term,
        }
    }

    fn start(&mut self) -> Result<()> {
        for r in 0..self.regions.len() {
            let local = self.regions[r].clock.local(self.now);
            let node = self.factory.region(&self.region_setup(r), local);
            self.regions[r].node = Some(node);
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

    fn schedule_faults(&mut self) -> Result<()> {
        let at = |d: Duration| self.scenario.start + d;
        let mut events = Vec::new();
        for (fault, f) in self.scenario.faults.iter().enumerate() {
            match *f {
                Fault::CoordinatorOutage { start, end } => {
                    events.push((at(start), Event::CoordinatorDown));
                    events.push((at(end), Event::CoordinatorUp));
                }
                Fault::AgentCrash {
                    region,
                    at: when,
                    restart_after,
                } => {
                    events.push((at(when), Event::AgentCrash { region }));
                    events.push((at(when + restart_after), Event::AgentRestart { region }));
                }
                Fault::AgentRestore {
                    region,
                    at: when,
                    from,
                } => {
                    events.push((at(from), Event::StoreCopy { region, fault }));
                    events.push((at(when), Event::AgentRestore { region, fault }));
                }
                Fault::GatewayCrash {
                    region,
                    gateway,
                    at: when,
                    restart_after,
                } => {
                    let gateway = gateway as usize;
                    events.push((at(when), Event::GatewayCrash { region, gateway }));
                    if let Some(after) = restart_after {
                        events.push((at(when + after), Event::GatewayRestart { region, gateway }));
                    }
                }
                Fault::Partition { .. } | Fault::Link { .. } => {}
            }
        }
        for (t, e) in events {
            self.push(t, e)?;
        }
        Ok(())
    }

    fn run_to_end(&mut self) -> Result<()> {
        let end = self.scenario.end();
        loop {
            let next_event = self.queue.peek_time();
            let next_arrival = self.arrivals.peek().map(|Reverse((t, _))| *t);
            let event_first = match (next_event, next_arrival) {
                (None, None) => return Ok(()),
                (Some(e), Some(a)) => e <= a,
                (e, _) => e.is_some(),
            };
            let t = if event_first {
                next_event
            } else {
                next_arrival
            };
            let Some(t) = t.filter(|t| *t < end) else {
                return Ok(());
            };
            debug_assert!(t >= self.now, "time never goes back");
            self.now = t;
            self.stats.events += 1;
            if event_first {
                let Some((_, event)) = self.queue.pop() else {
                    return Ok(());
                };
                self.dispatch(event)?;
            } else if let Some(Reverse((_, source))) = self.arrivals.pop() {
                self.arrival(source)?;
            }
        }
    }

    fn dispatch(
        &mut self,
        event: Event<<F::Coordinator as CoordinatorNode>::Command>,
    ) -> Result<()> {
        match event {
            Event::RegionTimer { region, at } => self.region_timer(region, at),
            Event::GatewayTimer {
                region,
                gateway,
                at,
            } => self.gateway_timer(region, gateway, at),
            Event::CoordinatorTimer { at } => self.coordinator_timer(at),
            Event::ToCoordinator { region, msg } => self.deliver_up(region, msg),
            Event::ToRegion { region, msg } => self.deliver_down(region, msg),
            Event::Commit { term, cmd } => self.commit(term, cmd),
            Event::Retry {
                source,
                retries,
                cost,
            } => {
                self.sources[source].pending_retries -= 1;
                self.stats.retries += 1;
                self.attempt(source, cost, retries, false)
            }
            Event::Settle(s) => self.settle(s),
            Event::AgentCrash { region } => {
                self.agent_crash(region);
                Ok(())
            }
            Event::AgentRestart { region } => self.agent_restart(region),
            Event::StoreCopy { region, fault } => {
                let r = &mut self.regions[region];
                r.store_copies.push((fault, r.store.clone()));
                Ok(())
            }
            Event::AgentRestore { region, fault } => self.agent_restore(region, fault),
            Event::GatewayCrash { region, gateway } => {
                let g = &mut self.regions[region].gateways[gateway];
                g.gateway = None;
                g.incarnation += 1;
                g.handles.iter_mut().for_each(|h| *h = None);
                g.timer = None;
                g.timer_local = None;
                Ok(())
            }
            Event::GatewayRestart { region, gateway } => {
                let rt = &mut self.regions[region].gateways[gateway];
                if rt.gateway.is_none() {
                    let config = gateway_config(self.scenario, self.measure.keys.len());
                    rt.gateway = Some(Gateway::new(config)?);
                }
                Ok(())
            }
            Event::CoordinatorDown => {
                if self.spec.policy == Policy::Rebalancing {
                    self.measure.leaderless(self.now);
                }
                let c = &mut self.coordinator;
                c.node = None;
                c.term += 1;
                c.timer = None;
                // Uncommitted proposals and the answers waiting for them die with the leader.
                c.proposed = 0;
                c.committed = 0;
                self.stats.sync_messages_dropped += c.waiting.len() as u64;
                c.waiting.clear();
                Ok(())
            }
            Event::CoordinatorUp => self.coordinator_up(),
            Event::Sample => self.sample(),
        }
    }

    // ----- requests: the hot path -----

    fn arrival(&mut self, s: usize) -> Result<()> {
        let start = self.scenario.start.as_unix_nanos();
        let src = &mut self.sources[s];
        let t = self.now.as_unix_nanos() - start;
        if let Some(next) = src.arrivals.next_after(t, &mut src.arrival_rng) {
            self.arrivals
                .push(Reverse((Timestamp::from_unix_nanos(start + next), s)));
        }
        let cost = src.cost.sample(&mut src.client_rng);
        let cost = self.held_to_settle_cap(s, cost);
        self.attempt(s, cost, 0, true)
    }

    /// A reservation's spender stops at the most its limit lets a settle charge (for an LLM
    /// call, `max_tokens`): the `settle_overage` term is stated on that assumption. What the
    /// drawn count wanted beyond it is counted, not used.
    fn held_to_settle_cap(&mut self, s: usize, mut cost: Cost) -> Cost {
        if let Some(settle) = cost.settle.as_mut() {
            let limit = &self.measure.keys[self.sources[s].key].limit;
            let max_use = self.factory.max_use_units(limit, cost.reserve_units);
            let beyond = settle.actual_units.saturating_sub(max_use);
            settle.actual_units -= beyond;
            self.stats.settle_units_beyond_cap += beyond;
        }
        cost
    }

    fn attempt(&mut self, s: usize, cost: Cost, retries: u32, fresh: bool) -> Result<()> {
        let (key, region) = (self.sources[s].key, self.sources[s].region);
        let units = cost.reserve_units;
        // Demand is what the client will really use: for a reservation, its actual count.
        let demand_units = cost.settle.map_or(units, |s| s.actual_units);
        self.measure
            .request(key, region, self.now, demand_units, fresh);
        self.stats.requests += 1;
        match self.serve(region, key, units)? {
            Served::Admitted {
                gateway,
                receipt,
                local,
            } => {
                self.stats.admitted += 1;
                self.measure.admitted(key, region, self.now, local, units);
                if let Some(settle) = cost.settle {
                    let incarnation = self.regions[region].gateways[gateway].incarnation;
                    let pending = PendingSettle {
                        source: s,
                        gateway,
                        incarnation,
                        receipt,
                        admitted_at: (self.now, local),
                        reserved_units: units,
                        actual_units: settle.actual_units,
                    };
                    self.push(self.now + settle.after, Event::Settle(pending))?;
                }
                Ok(())
            }
            Served::Denied { retry_after } => {
                self.stats.denials += 1;
                self.measure.denied(key, region, self.now, units);
                self.schedule_retry(s, cost, retries, retry_after)
            }
        }
    }

    fn schedule_retry(
        &mut self,
        s: usize,
        cost: Cost,
        retries: u32,
        retry_after: Option<Duration>,
    ) -> Result<()> {
        let src = &mut self.sources[s];
        let Some(delay) = src
            .retry
            .next_delay(retries, retry_after, &mut src.client_rng)
        else {
            return Ok(());
        };
        if src.pending_retries >= MAX_PENDING_RETRIES_PER_SOURCE {
            self.stats.retries_dropped += 1;
            return Ok(());
        }
        src.pending_retries += 1;
        let event = Event::Retry {
            source: s,
            retries: retries + 1,
            cost,
        };
        self.push(self.now + delay, event)
    }

    /// Picks the region's next gateway that is up (clients fail over between gateways).
    fn pick_gateway(&mut self, region: usize) -> Option<usize> {
        let r = &mut self.regions[region];
        let n = r.gateways.len();
        (0..n)
            .map(|i| (r.next_gateway + i) % n)
            .find(|&g| r.gateways[g].gateway.is_some())
            .inspect(|&g| r.next_gateway = (g + 1) % n)
    }

    fn serve(&mut self, region: usize, key: usize, units: u64) -> Result<Served> {
        let Some(g) = self.pick_gateway(region) else {
            self.stats.unserved += 1;
            return Ok(Served::Denied { retry_after: None });
        };
        let local = self.regions[region].clock.local(self.now);
        let mut outcome = self.spend(region, g, key, local, units);
        if outcome == Spend::Wait {
            self.pump_gateway(region, g, local)?;
            outcome = self.spend(region, g, key, local, units);
        }
        self.pump_gateway(region, g, local)?;
        self.arm_gateway_timer(region, g)?;
        Ok(match outcome {
            Spend::Spent(receipt) => Served::Admitted {
                gateway: g,
                receipt: Some(receipt),
                local,
            },
            Spend::Denied { retry_after } => Served::Denied {
                retry_after: Some(retry_after),
            },
            Spend::Unavailable if self.failure_modes[key] == FailureMode::Open => {
                self.stats.fail_open_admits += 1;
                Served::Admitted {
                    gateway: g,
                    receipt: None,
                    local,
                }
            }
            Spend::Unavailable | Spend::Wait | Spend::UnknownKey => {
                Served::Denied { retry_after: None }
            }
        })
    }

    /// One spend at gateway `g`, looking the key up (again) when needed.
    #[inline]
    fn spend(
        &mut self,
        region: usize,
        g: usize,
        key: usize,
        local: Timestamp,
        units: u64,
    ) -> Spend {
        let rt = &mut self.regions[region].gateways[g];
        let Some(gateway) = rt.gateway.as_mut() else {
            return Spend::Unavailable;
        };
        for _ in 0..2 {
            let handle = match rt.handles[key] {
                Some(h) => h,
                None => {
                    let meta = &self.measure.keys[key];
                    match gateway.key(local, &meta.limit, &meta.key) {
                        Ok(h) => *rt.handles[key].insert(h),
                        // Too many keys at this gateway: it cannot lease, as if unreachable.
                        Err(_) => return Spend::Unavailable,
                    }
                }
            };
            match gateway.try_spend(local, handle, units) {
                Spend::UnknownKey => rt.handles[key] = None,
                outcome => return outcome,
            }
        }
        Spend::UnknownKey
    }

    /// Delivers gateway `g`'s messages to its agent and the answers back.
    fn pump_gateway(&mut self, region: usize, g: usize, local: Timestamp) -> Result<()> {
        let r = &mut self.regions[region];
        let Some(gateway) = r.gateways[g].gateway.as_mut() else {
            return Ok(());
        };
        let mut touched = false;
        while let Some(msg) = gateway.poll_transmit(local) {
            touched |= r.node.is_some();
            match (msg, r.node.as_mut()) {
                (ToAgent::LeaseWanted(w), Some(node)) => {
                    self.stats.lease_requests += 1;
                    let answer = node.handle_lease_wanted(local, &w);
                    persist(node, &mut r.store, r.keeps_store);
                    match answer {
                        LeaseAnswer::Granted(grant) => {
                            gateway.handle_lease_granted(local, w.ticket, grant)
                        }
                        LeaseAnswer::Denied(denial) => {
                            gateway.handle_lease_denied(local, w.ticket, denial)
                        }
                    }
                }
                (ToAgent::LeaseWanted(w), None) => {
                    gateway.handle_agent_unavailable(local, w.ticket)
                }
                (ToAgent::Release(release), Some(node)) => {
                    node.handle_release(local, &release);
                    persist(node, &mut r.store, r.keeps_store);
                }
                (ToAgent::Settle(settle), Some(node)) => {
                    node.handle_settle(local, &settle);
                    persist(node, &mut r.store, r.keeps_store);
                }
                (ToAgent::Release(_) | ToAgent::Settle(_), None) => {
                    self.stats.gateway_messages_lost += 1;
                }
            }
        }
        if touched {
            self.after_region_input(region)?;
        }
        Ok(())
    }

    /// Arms the gateway's sweep timer when its deadline changed. Called after every request,
    /// so the common case (unchanged) is one comparison on the gateway's own clock.
    fn arm_gateway_timer(&mut self, region: usize, g: usize) -> Result<()> {
        let r = &mut self.regions[region];
        let rt = &mut r.gateways[g];
        let wanted_local = rt.gateway.as_ref().and_then(Gateway::poll_timeout);
        if wanted_local == rt.timer_local {
            return Ok(());
        }
        rt.timer_local = wanted_local;
        let wanted = wanted_local.map(|local| r.clock.true_time_of(local).max(self.now));
        rt.timer = wanted;
        match wanted {
            Some(at) => self.push(
                at,
                Event::GatewayTimer {
                    region,
                    gateway: g,
                    at,
                },
            ),
            None => Ok(()),
        }
    }

    fn gateway_timer(&mut self, region: usize, g: usize, at: Timestamp) -> Result<()> {
        let rt = &mut self.regions[region].gateways[g];
        if rt.timer != Some(at) {
            return Ok(());
        }
        rt.timer = None;
        rt.timer_local = None;
        let local = self.regions[region].clock.local(self.now);
        if let Some(gateway) = self.regions[region].gateways[g].gateway.as_mut() {
            gateway.handle_timeout(local);
        }
        self.pump_gateway(region, g, local)?;
        self.arm_gateway_timer(region, g)
    }

    fn settle(&mut self, s: PendingSettle) -> Result<()> {
        let (key, region) = (self.sources[s.source].key, self.sources[s.source].region);
        // The tokens were used whatever happens to the settle: measure what was consumed.
        self.measure.settled(
            key,
            region,
            s.admitted_at,
            s.reserved_units,
            s.actual_units,
            self.now,
        );
        let local = self.regions[region].clock.local(self.now);
        let rt = &mut self.regions[region].gateways[s.gateway];
        let incarnation = rt.incarnation;
        let Some(receipt) = s.receipt else {
            return Ok(());
        };
        let gateway = rt.gateway.as_mut().filter(|_| incarnation == s.incarnation);
        let Some(gateway) = gateway else {
            self.stats.settles_lost += 1;
            return Ok(());
        };
        gateway.settle(local, receipt, s.actual_units);
        self.pump_gateway(region, s.gateway, local)
    }

    // ----- regions and the coordinator -----

    /// After any input to a region's node: send what it wants to send, re-arm its timer.
    fn after_region_input(&mut self, region: usize) -> Result<()> {
        let local = self.regions[region].clock.local(self.now);
        let mut outgoing = Vec::new();
        let r = &mut self.regions[region];
        let Some(node) = r.node.as_mut() else {
            return Ok(());
        };
        while let Some(msg) = node.poll_transmit(local) {
            outgoing.push(msg);
        }
        if !outgoing.is_empty() {
            // What a SyncUp promises (its seq, the acks it carries) is durable before it leaves.
            persist(node, &mut r.store, r.keeps_store);
        }
        let wanted = node.poll_timeout().map(|l| r.clock.true_time_of(l));
        for msg in outgoing {
            self.send_up(region, msg)?;
        }
        let now = self.now;
        let r = &mut self.regions[region];
        let wanted = wanted.map(|t| t.max(now));
        if wanted == r.timer {
            return Ok(());
        }
        // A timer that moved or went away leaves its old event behind, skipped when it fires.
        r.timer = wanted;
        match wanted {
            Some(at) => self.push(at, Event::RegionTimer { region, at }),
            None => Ok(()),
        }
    }

    fn region_timer(&mut self, region: usize, at: Timestamp) -> Result<()> {
        let r = &mut self.regions[region];
        if r.timer != Some(at) {
            return Ok(());
        }
        r.timer = None;
        let local = r.clock.local(self.now);
        if let Some(node) = r.node.as_mut() {
            node.handle_timeout(local);
            persist(node, &mut r.store, r.keeps_store);
        }
        self.after_region_input(region)
    }

    fn send_up(&mut self, region: usize, msg: SyncUp) -> Result<()> {
        self.stats.sync_up_messages += 1;
        self.stats.sync_up_bytes += sync_up_bytes(&msg);
        let plan = &self.up_plans[region];
        if plan.partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let faults = plan.faults(self.now);
        let deliveries = self.regions[region]
            .up
            .transmit(self.now, &faults, &mut self.link_rng);
        if deliveries.first.is_none() {
            self.stats.sync_messages_dropped += 1;
        }
        if let Some(t) = deliveries.duplicate {
            let copy = msg.clone();
            self.push(t, Event::ToCoordinator { region, msg: copy })?;
        }
        if let Some(t) = deliveries.first {
            self.push(t, Event::ToCoordinator { region, msg })?;
        }
        Ok(())
    }

    fn send_down(&mut self, region: usize, msg: SyncDown) -> Result<()> {
        self.stats.sync_down_messages += 1;
        self.stats.sync_down_bytes += sync_down_bytes(&msg);
        let plan = &self.down_plans[region];
        if plan.partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let faults = plan.faults(self.now);
        let deliveries = self.regions[region]
            .down
            .transmit(self.now, &faults, &mut self.link_rng);
        if deliveries.first.is_none() {
            self.stats.sync_messages_dropped += 1;
        }
        if let Some(t) = deliveries.duplicate {
            let copy = msg.clone();
            self.push(t, Event::ToRegion { region, msg: copy })?;
        }
        if let Some(t) = deliveries.first {
            self.push(t, Event::ToRegion { region, msg })?;
        }
        Ok(())
    }

    fn deliver_up(&mut self, region: usize, msg: SyncUp) -> Result<()> {
        let Some(node) = self.coordinator.node.as_mut() else {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        };
        if self.up_plans[region].partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let seq = msg.seq;
        node.handle_sync_up(self.now, msg);
        // The driver contract: what the coordinator proposes now (and proposed before) is
        // committed before it answers, so the answer may wait for the commit latency.
        self.after_coordinator_input()?;
        let c = &mut self.coordinator;
        if c.waiting.len() >= MAX_WAITING_REPLIES {
            return Err(self.bound_error("answers waiting for commits", MAX_WAITING_REPLIES));
        }
        c.waiting.push_back(WaitingReply {
            region,
            seq,
            after_committed: c.proposed,
        });
        self.send_ready_replies()
    }

    /// Answers every held-back SyncUp whose proposals have all committed.
    fn send_ready_replies(&mut self) -> Result<()> {
        loop {
            let c = &mut self.coordinator;
            let ready = c
                .waiting
                .front()
                .is_some_and(|w| w.after_committed <= c.committed);
            let Some(node) = c.node.as_mut().filter(|_| ready) else {
                return Ok(());
            };
            let Some(w) = c.waiting.pop_front() else {
                return Ok(());
            };
            let reply = node.poll_sync_down(self.now, &self.regions[w.region].id, w.seq);
            self.send_down(w.region, reply)?;
        }
    }

    fn deliver_down(&mut self, region: usize, msg: SyncDown) -> Result<()> {
        if self.down_plans[region].partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let r = &mut self.regions[region];
        let Some(node) = r.node.as_mut() else {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        };
        node.handle_sync_down(r.clock.local(self.now), msg);
        persist(node, &mut r.store, r.keeps_store);
        self.after_region_input(region)
    }

    /// After any input to the coordinator: replicate its proposals, re-arm its timer.
    fn after_coordinator_input(&mut self) -> Result<()> {
        let Some(node) = self.coordinator.node.as_mut() else {
            return Ok(());
        };
        let proposals = node.poll_proposals(self.now);
        let wanted = node.poll_timeout().map(|t| t.max(self.now));
        let term = self.coordinator.term;
        let commit_at = self.now + self.scenario.coordinator.commit_latency;
        self.coordinator.proposed += proposals.len() as u64;
        for cmd in proposals {
            self.push(commit_at, Event::Commit { term, cmd })?;
        }
        if wanted == self.coordinator.timer {
            return Ok(());
        }
        self.coordinator.timer = wanted;
        match wanted {
            Some(at) => self.push(at, Event::CoordinatorTimer { at }),
            None => Ok(()),
        }
    }

    fn coordinator_timer(&mut self, at: Timestamp) -> Result<()> {
        if self.coordinator.timer != Some(at) {
            return Ok(());
        }
        self.coordinator.timer = None;
        if let Some(node) = self.coordinator.node.as_mut() {
            node.handle_timeout(self.now);
        }
        self.after_coordinator_input()
    }

    fn commit(
        &mut self,
        term: u64,
        cmd: <F::Coordinator as CoordinatorNode>::Command,
    ) -> Result<()> {
        if term != self.coordinator.term {
            // Proposed by a leader that was lost before it committed.
            return Ok(());
        }
        let Some(node) = self.coordinator.node.as_mut() else {
            return Ok(());
        };
        if self.coordinator.log.len() >= MAX_COMMITTED_COMMANDS {
            return Err(self.bound_error("committed commands", MAX_COMMITTED_COMMANDS));
        }
        node.handle_committed(self.now, &cmd);
        self.coordinator.log.push(cmd);
        self.coordinator.committed += 1;
        self.after_coordinator_input()?;
        self.send_ready_replies()
    }

    fn coordinator_up(&mut self) -> Result<()> {
        if self.coordinator.node.is_some() {
            return Ok(());
        }
        let mut node = self
            .factory
            .coordinator(&self.coordinator_setup(), self.now);
        for cmd in &self.coordinator.log {
            node.handle_committed(self.now, cmd);
        }
        self.coordinator.node = Some(node);
        self.after_coordinator_input()
    }

    fn agent_crash(&mut self, region: usize) {
        let r = &mut self.regions[region];
        let Some(node) = r.node.take() else {
            return;
        };
        let mut obs = RegionObservation::default();
        node.observe(&mut obs);
        self.checker.crashed(region, &obs);
        r.timer = None;
    }

    fn agent_restart(&mut self, region: usize) -> Result<()> {
        if self.regions[region].node.is_some() {
            return Ok(());
        }
        let local = self.regions[region].clock.local(self.now);
        let setup = self.region_setup(region);
        let node = self
            .factory
            .restore_region(&setup, &self.regions[region].store, local);
        let mut obs = RegionObservation::default();
        node.observe(&mut obs);
        let scenario = self.scenario;
        let is_current = |c: &CounterRef| {
            scenario
                .limit(&c.limit)
                .is_none_or(|l| c.window >= l.window.index(local))
        };
        self.checker
            .restarted(self.offset_ms(), region, &obs, is_current);
        self.regions[region].node = Some(node);
        self.after_region_input(region)
    }

    /// The agent stops and starts again from the store copied at the fault's `from`: what it
    /// wrote since is lost, so its counters may go back. That is the fault itself, not a
    /// violation: invariants 3 and 6 start again for the region from what it has now.
    fn agent_restore(&mut self, region: usize, fault: usize) -> Result<()> {
        let r = &mut self.regions[region];
        r.node = None;
        r.timer = None;
        if let Some(i) = r.store_copies.iter().position(|(f, _)| *f == fault) {
            r.store = r.store_copies.swap_remove(i).1;
        }
        self.checker.forget_region(region);
        self.agent_restart(region)
    }

    // ----- measurement -----

    fn offset_ms(&self) -> u64 {
        self.now
            .saturating_duration_since(self.scenario.start)
            .as_millis() as u64
    }

    fn sample(&mut self) -> Result<()> {
        let at_ms = self.offset_ms();
        let scenario = self.scenario;
        let coordinator = self.coordinator.node.as_ref();
        let judge = self.spec.policy == Policy::Rebalancing;
        let mut allowances = vec![vec![None; self.regions.len()]; self.measure.keys.len()];
        for (i, r) in self.regions.iter().enumerate() {
            let Some(node) = r.node.as_ref() else {
                continue;
            };
            let mut obs = RegionObservation::default();
            node.observe(&mut obs);
            if judge {
                let local = r.clock.local(self.now);
                record_allowances(scenario, &self.measure, local, &obs, i, &mut allowances);
            }
            self.checker.region(at_ms, i, &obs);
            let Some(coordinator) = coordinator else {
                continue;
            };
            let local = r.clock.local(self.now);
            let is_current = |c: &CounterRef| {
                scenario
                    .limit(&c.limit)
                    .is_some_and(|l| c.window == l.window.index(local))
            };
            let table = |c: &CounterRef| coordinator.table_allowance(c, &r.id);
            self.checker
                .region_against_table(at_ms, r.id.as_str(), &obs, table, is_current);
        }
        if let Some(node) = coordinator {
            let mut obs = CoordinatorObservation::default();
            node.observe(self.now, &mut obs);
            self.checker.coordinator(at_ms, &obs);
            for (limit, window, bound) in &obs.bounds {
                self.measure.bound_sample(limit, *window, bound, self.now);
            }
        } else if judge {
            self.measure.leaderless(self.now);
        }
        if judge {
            self.judge_allocation(&allowances);
        }
        self.push(
            self.now + self.scenario.measure.sample_interval,
            Event::Sample,
        )
    }

    /// Judges every strict counter's allocation against the fair split of the demand the
    /// sources ask for now (`crate::allocation`). `allowances[k][r]`: region r's allowance for
    /// key k in its current window, where it enforces a strict one.
    fn judge_allocation(&mut self, allowances: &[Vec<Option<u64>>]) {
        let t = duration_nanos(self.now.saturating_duration_since(self.scenario.start));
        let mut judged = false;
        let mut calm = true;
        for (k, held) in allowances.iter().enumerate() {
            if held.iter().all(Option::is_none) {
                continue;
            }
            let limit = &self.scenario.limits.limits[self.measure.keys[k].limit_index];
            let window_secs = limit.window.len().as_secs_f64();
            let mut demand_per_sec = vec![0.0; held.len()];
            for (src, spec) in self.sources.iter().zip(&self.scenario.traffic) {
                let live = duration_nanos(spec.start) <= t && t < duration_nanos(spec.end);
                if src.key == k && live {
                    demand_per_sec[src.region] += spec.rate.rate_at(t) * mean_units(&spec.cost);
                }
            }
            let regions: Vec<RegionDemand> = self
                .scenario
                .regions
                .iter()
                .zip(&demand_per_sec)
                .map(|(r, d)| RegionDemand {
                    weight_ppm: r.weight_ppm,
                    default_units: default_share(limit.quota_units, r.weight_ppm),
                    window_demand_units: (d * window_secs).ceil() as u64,
                })
                .collect();
            let targets = fair_targets(limit.quota_units, &regions);
            judged = true;
            calm &= within_tolerance(limit.quota_units, held, &targets);
        }
        if judged {
            self.measure.allocation_sample(self.now, calm);
        }
    }

    fn finish(self) -> RunOutcome {
        RunOutcome {
            spec: self.spec,
            marks: marks(self.scenario),
            measure: self.measure,
            checker: self.checker,
            stats: self.stats,
        }
    }
}

/// Region `region`'s strict allowances for the current window of each key it holds, from its
/// observation, into `out[key][region]`.
fn record_allowances(
    scenario: &Scenario,
    measure: &Measure,
    local: Timestamp,
    obs: &RegionObservation,
    region: usize,
    out: &mut [Vec<Option<u64>>],
) {
    for a in &obs.allowances {
        let Some(units) = a.strict_allowance_units else {
            continue;
        };
        let current = scenario
            .limit(&a.counter.limit)
            .is_some_and(|l| a.counter.window == l.window.index(local));
        let key = measure
            .keys
            .iter()
            .position(|k| k.limit == a.counter.limit && k.key == a.counter.key);
        if let (true, Some(k)) = (current, key) {
            out[k][region] = Some(units);
        }
    }
}

/// `floor(w_r * L)`, as the product computes a region's default share.
fn default_share(quota_units: u64, weight_ppm: u32) -> u64 {
    (u128::from(quota_units) * u128::from(weight_ppm) / u128::from(WEIGHT_SCALE_PPM)) as u64
}

/// Writes what the region's agent made durable to its store, or drops it where the run never
/// restarts the agent.
fn persist<R: RegionNode>(node: &mut R, store: &mut R::Store, keeps_store: bool) {
    if keeps_store {
        node.persist(store);
    } else {
        node.discard_durable();
    }
}

fn offset(scenario: &Scenario, t_nanos: u64) -> Timestamp {
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

#[cfg(test)]
mod tests;
