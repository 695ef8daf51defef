//! Faults: the schedule, agent crashes, restarts and restores from an old store, and what a region
//! persists.

use std::time::Duration;

use allot_core::sync::CounterRef;

use crate::error::Result;
use crate::node::{NodeFactory, RegionNode, RegionObservation, RegionSetup};
use crate::scenario::Fault;

use super::{Engine, Event};

/// Writes what the region's agent made durable to its store, or drops it where the run never
/// restarts the agent.
pub(super) fn persist<R: RegionNode>(node: &mut R, store: &mut R::Store, keeps_store: bool) {
    if keeps_store {
        node.persist(store);
    } else {
        node.discard_durable();
    }
}

impl<'s, F: NodeFactory> Engine<'s, F> {
    pub(super) fn schedule_faults(&mut self) -> Result<()> {
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
                Fault::RegionRemoval {
                    region,
                    at: when,
                    restore_after,
                } => {
                    let removed = true;
                    events.push((at(when), Event::RegionRemoval { region, removed }));
                    if let Some(after) = restore_after {
                        let removed = false;
                        events.push((at(when + after), Event::RegionRemoval { region, removed }));
                    }
                }
                Fault::ClockStep {
                    region, at: when, ..
                } => {
                    events.push((at(when), Event::ClockStep { region }));
                }
                Fault::Partition { .. } | Fault::Link { .. } | Fault::ConfigReload { .. } => {}
            }
        }
        events.extend(self.reload_events());
        for (t, e) in events {
            self.push(t, e)?;
        }
        Ok(())
    }

    pub(super) fn agent_crash(&mut self, region: usize) {
        let r = &mut self.regions[region];
        let local = r.agent_clock.local(self.now);
        let Some(node) = r.take_node(local) else {
            return;
        };
        let mut obs = RegionObservation::default();
        node.observe(&mut obs);
        self.checker.crashed(region, &obs);
        r.timer = None;
    }

    pub(super) fn agent_restart(&mut self, region: usize) -> Result<()> {
        self.start_agent(region, false)
    }

    /// Starts the region's agent from its store; `restored` as the operator declares a start
    /// from an old copy of it.
    fn start_agent(&mut self, region: usize, restored: bool) -> Result<()> {
        if self.regions[region].node.is_some() {
            return Ok(());
        }
        let local = self.regions[region].clock.local(self.now);
        let setup = RegionSetup {
            reload: self.reload_in_force(region),
            restored,
            ..self.region_setup(region)
        };
        let node = self
            .factory
            .restore_region(&setup, &self.regions[region].store, local);
        let mut obs = RegionObservation::default();
        node.observe(&mut obs);
        // The windows the restarted machine reads (its corrected clock, with a timebase).
        let local = node.window_clock(local, None);
        let scenario = self.scenario;
        let is_current = |c: &CounterRef| {
            scenario
                .limit(&c.limit)
                .is_none_or(|l| c.window >= l.window.index(local))
        };
        self.checker
            .restarted(self.offset_ms(), region, &obs, is_current);
        let now = self.now;
        self.regions[region].set_node(node, now);
        self.after_region_input(region)
    }

    /// The agent stops and starts again from the store copied at the fault's `from`: what it
    /// wrote since is lost, so its counters may go back. That is the fault itself, not a
    /// violation: invariants 3 and 6 start again for the region from what it has now. The
    /// operator who restored the copy declares it (`allot agent --restored`).
    pub(super) fn agent_restore(&mut self, region: usize, fault: usize) -> Result<()> {
        let r = &mut self.regions[region];
        r.take_node(r.agent_clock.local(self.now));
        r.timer = None;
        if let Some(i) = r.store_copies.iter().position(|(f, _)| *f == fault) {
            r.store = r.store_copies.swap_remove(i).1;
        }
        self.checker.forget_region(region);
        self.start_agent(region, true)
    }
}
