//! Regions and the links between them and the coordinator: link plans, SyncUp and SyncDown through
//! links and partitions, region timers.

use std::time::Duration;

use allot_core::sync::{SyncDown, SyncUp};
use allot_core::time::Timestamp;

use crate::error::Result;
use crate::link::LinkFaults;
use crate::node::{CoordinatorNode, NodeFactory, RegionNode};
use crate::scenario::{Direction, Fault, Scenario};
use crate::sizes::{sync_down_bytes, sync_up_bytes};

use super::faults::persist;
use super::{Engine, Event, MAX_WAITING_REPLIES, WaitingReply};

/// Link faults and partitions of one (region, direction), as true-time intervals.
#[derive(Clone, Debug, Default)]
pub(super) struct LinkPlan {
    /// `(start, end, None)` is a partition.
    intervals: Vec<(Timestamp, Timestamp, Option<LinkFaults>)>,
}

impl LinkPlan {
    pub(super) fn partitioned(&self, t: Timestamp) -> bool {
        self.intervals
            .iter()
            .any(|(s, e, f)| f.is_none() && *s <= t && t < *e)
    }

    pub(super) fn faults(&self, t: Timestamp) -> LinkFaults {
        self.intervals
            .iter()
            .filter(|(s, e, _)| *s <= t && t < *e)
            .filter_map(|(_, _, f)| *f)
            .fold(LinkFaults::default(), LinkFaults::combine)
    }
}

pub(super) fn link_plans(scenario: &Scenario, direction: Direction) -> Vec<LinkPlan> {
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
    /// After any input to a region's node: send what it wants to send, re-arm its timer.
    pub(super) fn after_region_input(&mut self, region: usize) -> Result<()> {
        let local = self.regions[region].agent_clock.local(self.now);
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
        let wanted = node
            .poll_timeout()
            .map(|l| r.agent_clock.true_time_of(l, self.now));
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

    pub(super) fn region_timer(&mut self, region: usize, at: Timestamp) -> Result<()> {
        let r = &mut self.regions[region];
        if r.timer != Some(at) {
            return Ok(());
        }
        r.timer = None;
        let local = r.agent_clock.local(self.now);
        if let Some(node) = r.node.as_mut() {
            node.handle_timeout(local);
            persist(node, &mut r.store, r.keeps_store);
        }
        self.after_region_input(region)
    }

    pub(super) fn send_up(&mut self, region: usize, msg: SyncUp) -> Result<()> {
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

    pub(super) fn send_down(&mut self, region: usize, msg: SyncDown) -> Result<()> {
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

    pub(super) fn deliver_up(&mut self, region: usize, msg: SyncUp) -> Result<()> {
        let Some(node) = self.coordinator.node.as_mut() else {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        };
        if self.up_plans[region].partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let seq = msg.seq;
        if !node.handle_sync_up(self.now, msg) {
            // Refused: the stream ends with an error and the region hears nothing.
            self.stats.sync_ups_refused += 1;
            return Ok(());
        }
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

    pub(super) fn deliver_down(&mut self, region: usize, msg: SyncDown) -> Result<()> {
        if self.down_plans[region].partitioned(self.now) {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        }
        let r = &mut self.regions[region];
        let Some(node) = r.node.as_mut() else {
            self.stats.sync_messages_dropped += 1;
            return Ok(());
        };
        node.handle_sync_down(r.agent_clock.local(self.now), msg);
        persist(node, &mut r.store, r.keeps_store);
        self.after_region_input(region)
    }
}
