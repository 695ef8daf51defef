//! Operators' table changes. The `config_reload` fault: the coordinator's table takes a new
//! limits configuration (a `SetConfig` through the replicated log, so a later leader replays
//! it), then each region's agent at its own delay, as a rollout does. The `region_removal`
//! fault: a region leaves the quota's split and may come back.

use allot_core::time::Timestamp;

use super::{Engine, Event};
use crate::error::Result;
use crate::node::{NodeFactory, RegionNode};
use crate::scenario::Fault;

impl<F: NodeFactory> Engine<'_, F> {
    /// Reload number `reload` (from 0) at the coordinator (`region` None) or at one region.
    /// Without a leader the change is appended to the log, which the next leader replays.
    pub(super) fn config_reload(&mut self, reload: usize, region: Option<usize>) -> Result<()> {
        match region {
            Some(r) => {
                let local = self.regions[r].agent_clock.local(self.now);
                if let Some(node) = self.regions[r].node.as_mut() {
                    node.reload(local, reload);
                }
                self.after_region_input(r)
            }
            None => match self.factory.reload_command(reload) {
                Some(cmd) => self.operator_command(cmd),
                None => Ok(()),
            },
        }
    }

    /// The `region_removal` fault: the region leaves the quota's split or comes back.
    pub(super) fn region_removal(&mut self, region: usize, removed: bool) -> Result<()> {
        let id = &self.regions[region].id;
        match self.factory.region_command(id, removed, self.now) {
            Some(cmd) => self.operator_command(cmd),
            None => Ok(()),
        }
    }

    /// A table change an operator makes: committed through the leader's log. Without a
    /// leader it is appended to the log, which the next leader replays (the operator's call
    /// retried until a leader takes it).
    fn operator_command(
        &mut self,
        cmd: <F::Coordinator as crate::node::CoordinatorNode>::Command,
    ) -> Result<()> {
        if self.coordinator.node.is_none() {
            self.coordinator.log.push(cmd);
            return Ok(());
        }
        let term = self.coordinator.term;
        self.coordinator.proposed += 1;
        let at = self.now + self.scenario.coordinator.commit_latency;
        self.push(at, Event::Commit { term, cmd })
    }

    /// The configuration an agent of `region` reads if it starts now: the last reload whose
    /// turn for this region has come (`None`: the scenario's own). A reload whose turn came
    /// while the agent was down is read at its start, not applied to the running machine.
    pub(super) fn reload_in_force(&self, region: usize) -> Option<usize> {
        let start = self.scenario.start;
        let now = self.now;
        reloads(self.scenario.faults.iter())
            .filter(|(_, at, stagger)| start + *at + stagger[region] <= now)
            .map(|(n, _, _)| n)
            .last()
    }

    /// The events of every `config_reload`: the coordinator's, then each region's.
    pub(super) fn reload_events(
        &self,
    ) -> Vec<(
        Timestamp,
        Event<<F::Coordinator as crate::node::CoordinatorNode>::Command>,
    )> {
        let start = self.scenario.start;
        let mut out = Vec::new();
        for (reload, at, stagger) in reloads(self.scenario.faults.iter()) {
            out.push((
                start + at,
                Event::ConfigReload {
                    reload,
                    region: None,
                },
            ));
            for (r, delay) in stagger.iter().enumerate() {
                let region = Some(r);
                out.push((start + at + *delay, Event::ConfigReload { reload, region }));
            }
        }
        out
    }
}

/// The `config_reload` faults, numbered from 0 in order, with their time and stagger.
fn reloads<'a>(
    faults: impl Iterator<Item = &'a Fault>,
) -> impl Iterator<Item = (usize, std::time::Duration, &'a [std::time::Duration])> {
    faults
        .filter_map(|f| match f {
            Fault::ConfigReload { at, stagger, .. } => Some((*at, stagger.as_slice())),
            _ => None,
        })
        .enumerate()
        .map(|(n, (at, stagger))| (n, at, stagger))
}
