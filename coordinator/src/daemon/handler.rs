//! Who answers an agent: the [`RaftSyncHandler`] hands a SyncUp to the leader's rebalancer
//! task when this node runs one, and otherwise answers with the leader's address (from the
//! raft membership: nodes serve raft and sync on the same gRPC address). [`supervise`]
//! starts the rebalancer when this node becomes leader and drops it when it stops leading.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_core::rebalance::CoordinatorConfig;
use allot_core::sync::SyncUp;
use allot_core::time::Timestamp;
use allot_proto::tls::Dialer;
use openraft::{Raft, ServerState};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::daemon::cluster;
use crate::daemon::leader::{Ended, JOB_QUEUE, Job, Leader, bridge_clock};
use crate::daemon::metrics as m;
use crate::network::LeaderAdmin;
use crate::state::ClusterCommand;
use crate::store::StateReader;
use crate::sync_service::{Answer, SyncHandler};
use crate::types::TypeConfig;

/// How often the supervisor looks again without a raft change (to restart a rebalancer that
/// ended while this node still leads).
const SUPERVISE_EVERY: Duration = Duration::from_millis(250);

/// Longest a new leader waits for its start entry to commit before building its rebalancer;
/// it tries again after.
const LEADER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// The queue of the running rebalancer task, with its term; empty when none runs.
#[derive(Default)]
pub struct LeaderSlot(Mutex<Option<(u64, mpsc::Sender<Job>)>>);

impl LeaderSlot {
    pub fn sender(&self) -> Option<mpsc::Sender<Job>> {
        self.lock().as_ref().map(|(_, tx)| tx.clone())
    }

    fn set(&self, term: u64, tx: mpsc::Sender<Job>) {
        *self.lock() = Some((term, tx));
    }

    /// Empties the slot if it still holds `term`'s queue (or any, with `None`).
    fn clear(&self, term: Option<u64>) {
        let mut slot = self.lock();
        if term.is_none() || slot.as_ref().map(|(t, _)| *t) == term {
            *slot = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, mpsc::Sender<Job>)>> {
        // The slot is one assignment: a panic elsewhere cannot leave it half-set.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sync stream's handler on a raft node.
pub struct RaftSyncHandler {
    raft: Raft<TypeConfig>,
    slot: Arc<LeaderSlot>,
    stopping: watch::Receiver<bool>,
}

impl RaftSyncHandler {
    pub fn new(
        raft: Raft<TypeConfig>,
        slot: Arc<LeaderSlot>,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        RaftSyncHandler {
            raft,
            slot,
            stopping,
        }
    }

    /// The answer of a node whose rebalancer cannot take the SyncUp: the leader's address
    /// (from a removed node that knows none, a member's, which knows it), or none if this
    /// node leads (its rebalancer is starting: the agent retries).
    fn not_leading(&self) -> Answer {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if cluster::leads(&m) {
            metrics::counter!(m::SYNC_UPS_DROPPED).increment(1);
            return Answer::Unanswered;
        }
        metrics::counter!(m::NOT_LEADER_ANSWERS).increment(1);
        Answer::NotLeader(cluster::redirect_target(&m))
    }
}

impl SyncHandler for RaftSyncHandler {
    async fn handle(&self, received_at: Timestamp, up: SyncUp) -> Answer {
        metrics::counter!(m::SYNC_UPS).increment(1);
        if *self.stopping.borrow() {
            return Answer::Refused("this coordinator node is stopping".to_owned());
        }
        let Some(jobs) = self.slot.sender() else {
            return self.not_leading();
        };
        let (reply, answer) = oneshot::channel();
        let job = Job::Sync {
            received_at,
            up,
            reply,
        };
        match jobs.try_send(job) {
            Ok(()) => answer.await.unwrap_or_else(|_| self.not_leading()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!(m::SYNC_UPS_DROPPED).increment(1);
                Answer::Unanswered
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.not_leading(),
        }
    }
}

/// Runs the rebalancer while this node leads: started for each term it is elected in,
/// dropped (and its queue with it) as soon as raft says it no longer leads, until `stop`.
/// `admins`: this node's admin address, which its probes name while it leads, and the other
/// nodes' as their answers name them.
pub async fn supervise(
    raft: Raft<TypeConfig>,
    state: StateReader,
    slot: Arc<LeaderSlot>,
    cfg: CoordinatorConfig,
    admins: Arc<LeaderAdmin>,
    dialer: Dialer,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    let mut running: Option<(u64, JoinHandle<()>)> = None;
    loop {
        let (id, state_now, leader, term) = {
            let m = metrics.borrow_and_update();
            (m.id, m.state, m.current_leader, m.current_term)
        };
        metrics::gauge!(m::TERM).set(term as f64);
        let leading = state_now == ServerState::Leader && leader == Some(id);
        let current = running
            .as_ref()
            .is_some_and(|(t, h)| *t == term && !h.is_finished());
        if !(leading && current)
            && let Some((t, h)) = running.take()
        {
            h.abort();
            slot.clear(Some(t));
        }
        if leading && !current {
            let task = lead(
                raft.clone(),
                state.clone(),
                slot.clone(),
                cfg.clone(),
                admins.clone(),
                dialer.clone(),
                term,
            );
            running = Some((term, tokio::spawn(task)));
        }
        metrics::gauge!(m::IS_LEADER).set(if leading { 1.0 } else { 0.0 });
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(SUPERVISE_EVERY) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    if let Some((_, h)) = running {
        h.abort();
    }
    slot.clear(None);
}

/// One rebalancer: it commits an entry of its own first (an empty round), so that, once that
/// answers, the applied state holds every entry committed before (also after a restart in
/// which this node leads again in its old term and appends no blank entry of its own: the
/// whole-cluster restart test caught a rebalancer built one committed grow short that way).
async fn lead(
    raft: Raft<TypeConfig>,
    state: StateReader,
    slot: Arc<LeaderSlot>,
    cfg: CoordinatorConfig,
    admins: Arc<LeaderAdmin>,
    dialer: Dialer,
    term: u64,
) {
    let start = tokio::time::timeout(
        LEADER_START_TIMEOUT,
        raft.client_write(ClusterCommand::Round(Vec::new())),
    );
    let start_index = match start.await {
        Ok(Ok(written)) => written.log_id.index,
        Ok(Err(e)) => return tracing::info!(term, error = %e, "not leading after all"),
        Err(_) => return tracing::warn!(term, "no quorum to start leading; retrying"),
    };
    let leader_term = rebalancer_term(term, start_index);
    tracing::info!(term, start_index, "leading: the rebalancer runs");
    let bridge = bridge_clock(&raft, &state, &dialer).await;
    let leader = Leader::new(raft, &state, cfg, leader_term, bridge)
        .naming(admins)
        .dialing(dialer);
    let (tx, rx) = mpsc::channel(JOB_QUEUE);
    slot.set(term, tx);
    let ended = leader.run(rx).await;
    slot.clear(Some(term));
    match ended {
        Ended::Diverged(why) => {
            metrics::counter!(m::REBUILDS).increment(1);
            tracing::error!(
                term,
                why,
                "the rebalancer's table left the replicated one: rebuilding it"
            );
        }
        Ended::Lost(why) => tracing::info!(term, why, "leadership lost: rebalancer dropped"),
        Ended::Closed => {}
    }
}

/// The rebalancer's `leader_term`: the raft term above, the index of its start entry below.
/// It grows with every rebalancer, also within one raft term (a node restarted with its own
/// committed vote leads again in the same term; a rebuilt rebalancer), so agents resend
/// everything to each new one. A start entry is committed after every earlier one, so its
/// index is above every earlier rebalancer's.
pub fn rebalancer_term(raft_term: u64, start_index: u64) -> u64 {
    (raft_term << 32) | (start_index & u64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebalancer_term_grows_with_the_raft_term_and_within_one() {
        assert!(rebalancer_term(3, 11) > rebalancer_term(3, 10));
        assert!(rebalancer_term(4, 1) > rebalancer_term(3, u64::from(u32::MAX)));
        assert_eq!(rebalancer_term(3, 11) >> 32, 3);
    }
}
