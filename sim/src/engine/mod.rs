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
//!
//! This file keeps the engine's state, the event loop and the dispatch of events; each
//! concern has its own file: [`setup`] (wiring a run from its scenario), [`gateways`] (traffic,
//! gateways, settles), [`messages`] (links and the sync messages), [`coordinator`] (driving the
//! coordinator), [`faults`] (crashes, restarts, restores, outages) and [`sampling`]
//! (measurement and judgement).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use allot_core::gateway::{Gateway, KeyHandle, SpendReceipt};
use allot_core::ids::{LeaseId, RegionId};
use allot_core::limit::FailureMode;
use allot_core::sync::{SyncDown, SyncUp};
use allot_core::time::{Timestamp, WindowIndex};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::check::Checker;
use crate::clock::AgentClock;
use crate::error::{Result, SimError};
use crate::link::Link;
use crate::measure::{Mark, Measure};
use crate::node::{CoordinatorNode, NodeFactory, Policy, RegionNode};
use crate::queue::EventQueue;
use crate::scenario::Scenario;
use crate::traffic::{ArrivalGen, Cost, CostModel, RetryPolicy};

mod coordinator;
mod faults;
mod gateways;
mod messages;
mod reload;
mod sampling;
mod setup;

use gateways::GatewayClock;
use messages::LinkPlan;
use setup::gateway_config;
pub use setup::{derive_seed, marks};

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
    /// Requests a gateway admitted on its own by Envoy's fallback
    /// (`regions[].envoy_fallback_units`) while it held no lease and its agent was down.
    pub envoy_fallback_admits: u64,
    /// Of those units, reported to the agent once it was back, and lost with a gateway that
    /// crashed before it could report them.
    pub envoy_fallback_units_reported: u64,
    pub envoy_fallback_units_lost: u64,
    pub lease_requests: u64,
    /// Lease requests the agent answered by adding to the gateway's live lease (`top_up`).
    pub lease_refills: u64,
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
    /// SyncUps the coordinator refused (a removed region's), answered with nothing.
    pub sync_ups_refused: u64,
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
    /// `config_reload` number `reload` at the coordinator (`None`) or at one region.
    ConfigReload {
        reload: usize,
        region: Option<usize>,
    },
    /// An operator removes the region (`removed`) or adds it back.
    RegionRemoval {
        region: usize,
        removed: bool,
    },
    /// The agent host's clock stepped: its timer is set again on the new reading.
    ClockStep {
        region: usize,
    },
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
    /// Envoy's fallback (`regions[].envoy_fallback_units`): units admitted on its own per key
    /// and window (on the agent's clock), and those its agent has not been told of yet.
    fallback_used: HashMap<(usize, WindowIndex), u64>,
    fallback_unreported: BTreeMap<usize, u64>,
}

struct RegionRt<R: RegionNode> {
    id: RegionId,
    /// The agent's host clock; the gateways read `gateway_clock`.
    clock: AgentClock,
    /// What the running agent reads (and, while it is down, what it read): the host clock
    /// without the steps taken since the agent's start, as the daemon counts time from its
    /// start (D73; `RegionRt::set_node`).
    agent_clock: AgentClock,
    gateway_clock: GatewayClock,
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
    /// Each lease's grant: the agent's reading then, the true time, and the agent's start it
    /// was granted under (`starts`). With corrected clocks its spends are judged in the window
    /// it was charged to, after a correction or a crash as before them. Without, a spend is
    /// judged on the granting agent's clock as it reads at the spend: the agent's own while
    /// it runs, and after a restart the grant's reading run on by the time since (a
    /// restarted agent reads the wall clock again, D73: a lost copy's lease spent after a
    /// restore on a clock stepped back was judged in a window 0.7 s earlier).
    lease_readings: BTreeMap<LeaseId, LeaseReading>,
    /// How many times the agent started (its first start included).
    starts: u64,
    /// While the agent is down: how far its window clock read ahead of its own clock when it
    /// went (its correction), in nanoseconds.
    down_correction_nanos: i64,
}

impl<R: RegionNode> RegionRt<R> {
    /// The clock the region's admissions at `local` (its agent's own clock) from `lease` are
    /// judged on: its agent's window clock; while the agent is down, its own clock with the
    /// correction the agent had when it went, the clock it would read and reads again when it
    /// is back. The raw clock was no window the agent counted in: fallback admissions of
    /// Envoys whose agent was down, on a clock 293 ms ahead, were judged in the window after
    /// the one their reports were charged to (swarm seed 3362120).
    fn window_clock(&self, local: Timestamp, lease: Option<LeaseId>) -> Timestamp {
        match &self.node {
            Some(n) => n.window_clock(local, lease),
            None => Timestamp::from_unix_nanos(
                local
                    .as_unix_nanos()
                    .saturating_add_signed(self.down_correction_nanos),
            ),
        }
    }

    /// The clock a spend at `local` (the agent's own clock), true time `now`, from `lease` is
    /// judged on (`lease_readings`).
    fn spend_clock(
        &self,
        lease: Option<LeaseId>,
        local: Timestamp,
        now: Timestamp,
        corrects_clocks: bool,
    ) -> Timestamp {
        match lease.and_then(|l| self.lease_readings.get(&l)) {
            Some(g) if corrects_clocks => g.reading,
            Some(g) if g.start != self.starts => {
                g.reading + now.saturating_duration_since(g.granted_at)
            }
            _ => self.window_clock(local, lease),
        }
    }

    /// The agent started (or restarted) at true time `now` runs as `node`.
    fn set_node(&mut self, node: R, now: Timestamp) {
        self.starts += 1;
        self.agent_clock = self.clock.started_at(now, node.clock_floor());
        self.node = Some(node);
    }

    /// The agent goes down at `local` on its own clock: what it read then is kept.
    fn take_node(&mut self, local: Timestamp) -> Option<R> {
        let node = self.node.take()?;
        let reading = node.window_clock(local, None).as_unix_nanos();
        let diff = i128::from(reading) - i128::from(local.as_unix_nanos());
        self.down_correction_nanos = i64::try_from(diff).unwrap_or(0);
        Some(node)
    }
}

/// A lease's grant as the judge reads its spends (`RegionRt::lease_readings`).
#[derive(Clone, Copy, Debug)]
struct LeaseReading {
    reading: Timestamp,
    granted_at: Timestamp,
    start: u64,
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

impl<'s, F: NodeFactory> Engine<'s, F> {
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
                // An Envoy that exits takes what it had not reported with it.
                self.stats.envoy_fallback_units_lost += g.fallback_unreported.values().sum::<u64>();
                g.fallback_unreported.clear();
                g.fallback_used.clear();
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
                    let clocks = self.region_window_clocks();
                    self.measure.leaderless(self.now, &clocks);
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
            Event::ConfigReload { reload, region } => self.config_reload(reload, region),
            Event::RegionRemoval { region, removed } => self.region_removal(region, removed),
            Event::ClockStep { region } => {
                // The timer was set on the old reading: a step forward makes it due earlier.
                self.regions[region].timer = None;
                self.after_region_input(region)
            }
            Event::Sample => self.sample(),
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

#[cfg(test)]
mod tests;
