//! Driving the coordinator: its timers, replication of its proposals, answers held back until they
//! commit, a new leader.

use allot_core::time::Timestamp;

use crate::error::Result;
use crate::node::{CoordinatorNode, NodeFactory};

use super::{Engine, Event, MAX_COMMITTED_COMMANDS};

impl<'s, F: NodeFactory> Engine<'s, F> {
    /// Answers every held-back SyncUp whose proposals have all committed.
    pub(super) fn send_ready_replies(&mut self) -> Result<()> {
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
            // A region removed since its SyncUp was taken is not answered.
            if let Some(reply) = node.poll_sync_down(self.now, &self.regions[w.region].id, w.seq) {
                self.send_down(w.region, reply)?;
            }
        }
    }

    /// After any input to the coordinator: replicate its proposals, re-arm its timer.
    pub(super) fn after_coordinator_input(&mut self) -> Result<()> {
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

    pub(super) fn coordinator_timer(&mut self, at: Timestamp) -> Result<()> {
        if self.coordinator.timer != Some(at) {
            return Ok(());
        }
        self.coordinator.timer = None;
        if let Some(node) = self.coordinator.node.as_mut() {
            node.handle_timeout(self.now);
        }
        self.after_coordinator_input()
    }

    pub(super) fn commit(
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

    pub(super) fn coordinator_up(&mut self) -> Result<()> {
        if self.coordinator.node.is_some() {
            return Ok(());
        }
        let mut node = self
            .factory
            .coordinator(&self.coordinator_setup(), self.now);
        node.restore(self.now, &self.coordinator.log);
        self.coordinator.node = Some(node);
        self.after_coordinator_input()
    }
}
