//! The leader's rebalancer: one task owning `allot_core::rebalance::Coordinator`, fed by a
//! bounded queue of jobs (SyncUps, configuration writes, status reads), so every change to
//! the rebalancer is serialized and a slow commit holds only the jobs queued behind it.
//!
//! Per SyncUp, the driver contract of `core/src/rebalance/coordinator.rs`: `handle_sync_up`,
//! `poll_proposals`, the proposals committed through raft as ONE `ClusterCommand::Round`,
//! `handle_committed` for each with the outcome the entry gave it, then `poll_sync_down` for
//! the region. An answer is built only from committed state; when a commit fails (leadership
//! lost) the task ends and its rebalancer is dropped, with no answer sent from it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use allot_core::error::Error as CoreError;
use allot_core::ids::{LimitId, RegionId};
use allot_core::limit::Quota;
use allot_core::rebalance::{
    AllowanceTable, ApplyOutcome, Bound, Coordinator, CoordinatorConfig, TableCommand,
};
use allot_core::sync::{CounterRef, SyncUp};
use allot_core::time::Timestamp;
use openraft::Raft;
use openraft::raft::ClientWriteResponse;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::daemon::metrics as m;
use crate::state::{ClusterCommand, CommandOutcome};
use crate::store::StateReader;
use crate::sync_service::{Answer, system_now};
use crate::types::TypeConfig;

/// Jobs waiting for the leader's rebalancer. A SyncUp that finds the queue full is left
/// unanswered (counted); the agent's next SyncUp carries everything again. With at most
/// `MAX_REGIONS` (64) agents syncing every interval, this is four intervals of every agent.
pub const JOB_QUEUE: usize = 256;

/// Longest a commit may take before this leader gives its rebalancer up (a leader cut off
/// from its quorum keeps its role until it hears a newer term; agents meanwhile go to the
/// other nodes after their own answer timeout).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most limits whose bound one status answer carries.
pub const MAX_STATUS_LIMITS: usize = 1_000;

/// What the leader's task is asked to do.
pub enum Job {
    Sync {
        received_at: Timestamp,
        up: SyncUp,
        reply: oneshot::Sender<Answer>,
    },
    /// A configuration change (limits, membership); answered with its outcome.
    Write {
        cmd: ClusterCommand,
        reply: oneshot::Sender<CommandOutcome>,
    },
    Status {
        reply: oneshot::Sender<LeaderStatus>,
    },
    /// An operator's table command (a region removed or added back), committed as a round of
    /// its own; answered with what the table made of it.
    Table {
        cmd: TableCommand,
        reply: oneshot::Sender<ApplyOutcome>,
    },
}

/// Why the task ended.
#[derive(Debug)]
pub enum Ended {
    /// A commit failed: this node no longer leads (or raft stopped).
    Lost(String),
    /// The replicated outcome of an entry differs from the rebalancer's: rebuild it.
    Diverged(String),
    /// Every sender is gone (the node is stopping).
    Closed,
}

/// The leader's view of one region, from its SyncUps.
#[derive(Clone, Debug, Serialize)]
pub struct RegionHeard {
    pub region: RegionId,
    /// When its last SyncUp arrived, on this node's clock (ms since the Unix epoch).
    pub last_heard_unix_ms: u64,
    /// Its clock's offset from the leader's, as the region measured it, in nanoseconds.
    pub clock_offset_nanos: Option<i64>,
    pub round_trip_ms: Option<u64>,
    /// The region's view had expired when it sent its last SyncUp (its partition policy).
    pub view_expired: bool,
    pub config_version: u64,
}

/// Most escalated counters one status answer lists.
pub const MAX_STATUS_COUNTERS: usize = 100;

/// One escalated counter: per region its row and, on the leader, its use as last reported.
#[derive(Clone, Debug, Serialize)]
pub struct CounterStatus {
    pub counter: CounterRef,
    pub regions: BTreeMap<RegionId, RowStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RowStatus {
    pub allowance_units: u64,
    /// A release asked of the region and not yet acknowledged.
    pub pending_release_units: Option<u64>,
    pub used_units: Option<u64>,
}

/// The first [`MAX_STATUS_COUNTERS`] escalated counters of `table`, with the use `used` knows.
pub fn counters_status(
    table: &AllowanceTable,
    used: impl Fn(&CounterRef, &RegionId) -> Option<u64>,
) -> Vec<CounterStatus> {
    table
        .counters()
        .take(MAX_STATUS_COUNTERS)
        .map(|(counter, rows)| CounterStatus {
            counter: counter.clone(),
            regions: rows
                .iter()
                .map(|(region, row)| {
                    let status = RowStatus {
                        allowance_units: row.allowance_units,
                        pending_release_units: row.pending.as_ref().map(|p| p.units),
                        used_units: used(counter, region),
                    };
                    (region.clone(), status)
                })
                .collect(),
        })
        .collect()
}

/// One limit's live bound for its current window.
#[derive(Clone, Debug, Serialize)]
pub struct LimitBound {
    pub limit: LimitId,
    pub bound: Bound,
}

/// What only the leader knows, for `/v1/status`.
#[derive(Clone, Debug, Serialize)]
pub struct LeaderStatus {
    pub regions: Vec<RegionHeard>,
    /// Escalated counters (with a row in the table), with each region's use as last reported.
    pub counters: Vec<CounterStatus>,
    pub limits: Vec<LimitBound>,
    /// Limits left out past `MAX_STATUS_LIMITS`.
    pub limits_left_out: usize,
}

/// The leader's rebalancer and the raft handle it commits through.
pub struct Leader {
    raft: Raft<TypeConfig>,
    state: StateReader,
    coordinator: Coordinator,
    heard: BTreeMap<RegionId, RegionHeard>,
}

impl Leader {
    /// A rebalancer over the applied table, answering under `leader_term`. The caller has
    /// committed a start entry of its own, so the state holds every entry committed before.
    pub fn new(
        raft: Raft<TypeConfig>,
        state: &StateReader,
        cfg: CoordinatorConfig,
        leader_term: u64,
    ) -> Leader {
        let table = state.read(|a| a.state.table().clone());
        Leader {
            raft,
            state: state.clone(),
            coordinator: Coordinator::new(cfg, table, system_now(), leader_term),
            heard: BTreeMap::new(),
        }
    }

    /// Serves jobs and ticks until a commit fails or every sender is gone. The tick runs
    /// `poll_proposals` without a SyncUp (reclaims, garbage collection, pre-issue).
    pub async fn run(mut self, mut jobs: mpsc::Receiver<Job>) -> Ended {
        let mut tick = tokio::time::interval(self.coordinator.config().sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let served = tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => self.serve(job).await,
                    None => return Ended::Closed,
                },
                _ = tick.tick() => self.commit_proposals().await,
            };
            if let Err(ended) = served {
                return ended;
            }
        }
    }

    async fn serve(&mut self, job: Job) -> Result<(), Ended> {
        match job {
            Job::Sync {
                received_at,
                up,
                reply,
            } => {
                let answer = self.sync_round(received_at, up).await?;
                let _ = reply.send(answer);
            }
            Job::Write { cmd, reply } => {
                let outcome = self.write(cmd).await?;
                let _ = reply.send(outcome);
            }
            Job::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Job::Table { cmd, reply } => {
                let outcome = self.table_command(cmd).await?;
                let _ = reply.send(outcome);
            }
        }
        Ok(())
    }

    /// One SyncUp through the driver contract.
    async fn sync_round(&mut self, received_at: Timestamp, up: SyncUp) -> Result<Answer, Ended> {
        let heard = heard_from(received_at, &up);
        let (region, seq) = (up.region.clone(), up.seq);
        if let Err(e) = self.coordinator.handle_sync_up(received_at, up) {
            let counter = match e {
                CoreError::RegionRemoved(_) => m::REMOVED_REGION_SYNC_UPS,
                _ => m::REFUSED_SYNC_UPS,
            };
            metrics::counter!(counter).increment(1);
            return Ok(Answer::Refused(e.to_string()));
        }
        let other_version = heard.config_version != self.coordinator.table().config_version();
        if other_version {
            // Nothing is planned until every region runs the table's version (D19).
            metrics::counter!(m::OTHER_VERSION_SYNC_UPS).increment(1);
        }
        self.heard.insert(region.clone(), heard);
        self.commit_proposals().await?;
        if self.coordinator.has_uncommitted_proposals() {
            // Cannot happen while every poll is committed before the next: kept as the
            // contract's guard, never an answer past an uncommitted proposal.
            return Ok(Answer::Unanswered);
        }
        let mut down = self.coordinator.poll_sync_down(system_now(), &region, seq);
        if other_version {
            // The region takes the files of the version in force from this answer (D25); the
            // applied state holds the rebalancer's version, as every change goes through it.
            down.config = self
                .state
                .read(|a| a.state.config_files())
                .filter(|files| files.version == down.config_version);
            if down.config.is_some() {
                metrics::counter!(m::CONFIG_SENT).increment(1);
            }
        }
        Ok(Answer::Down(down))
    }

    /// Commits the rounds already proposed (the contract: nothing polled stays uncommitted),
    /// then `cmd` as a round of its own, and hands it to the rebalancer with its outcome.
    async fn table_command(&mut self, cmd: TableCommand) -> Result<ApplyOutcome, Ended> {
        self.commit_proposals().await?;
        let cmds = vec![cmd];
        let written = self.commit(ClusterCommand::Round(cmds.clone())).await?;
        let CommandOutcome::Round(outcomes) = written.data else {
            return Err(Ended::Diverged(format!(
                "a round answered {:?}",
                written.data
            )));
        };
        let outcome = outcomes.first().cloned();
        self.apply_round(&cmds, outcomes)?;
        outcome.ok_or_else(|| Ended::Diverged("a round of one answered nothing".to_owned()))
    }

    /// Polls the rebalancer and commits what it proposes as one round entry, then hands it
    /// every command with the outcome the entry gave it.
    async fn commit_proposals(&mut self) -> Result<(), Ended> {
        let cmds = self.coordinator.poll_proposals(system_now());
        if cmds.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let written = self.commit(ClusterCommand::Round(cmds.clone())).await?;
        metrics::histogram!(m::COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::counter!(m::ROUNDS).increment(1);
        metrics::counter!(m::ROUND_COMMANDS).increment(cmds.len() as u64);
        let CommandOutcome::Round(outcomes) = written.data else {
            return Err(Ended::Diverged(format!(
                "a round answered {:?}",
                written.data
            )));
        };
        self.apply_round(&cmds, outcomes)
    }

    fn apply_round(
        &mut self,
        cmds: &[TableCommand],
        outcomes: Vec<allot_core::rebalance::ApplyOutcome>,
    ) -> Result<(), Ended> {
        if outcomes.len() != cmds.len() {
            return Err(Ended::Diverged(format!(
                "{} outcomes for {} commands",
                outcomes.len(),
                cmds.len()
            )));
        }
        let now = system_now();
        for (cmd, replicated) in cmds.iter().zip(outcomes) {
            let mine = self.coordinator.handle_committed(now, cmd);
            if mine != replicated {
                return Err(Ended::Diverged(format!(
                    "{cmd:?}: replicated {replicated:?}, rebalancer {mine:?}"
                )));
            }
            if !mine.is_applied() {
                metrics::counter!(m::REJECTED_COMMANDS).increment(1);
            }
        }
        Ok(())
    }

    /// Commits one entry. A failure or a commit slower than [`COMMIT_TIMEOUT`] ends the
    /// task: the entry may still commit later, so the rebalancer cannot know its table.
    async fn commit(&self, cmd: ClusterCommand) -> Result<ClientWriteResponse<TypeConfig>, Ended> {
        match tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(cmd)).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(e)) => Err(Ended::Lost(e.to_string())),
            Err(_) => Err(Ended::Lost(format!("no commit in {COMMIT_TIMEOUT:?}"))),
        }
    }

    /// A configuration change, committed; its `SetConfig` goes to the rebalancer's table.
    async fn write(&mut self, cmd: ClusterCommand) -> Result<CommandOutcome, Ended> {
        let written = self.commit(cmd).await?;
        if let CommandOutcome::Configured { set_config, .. } = &written.data {
            let mine = self.coordinator.handle_committed(system_now(), set_config);
            if !mine.is_applied() {
                return Err(Ended::Diverged(format!("configuration refused: {mine:?}")));
            }
        }
        Ok(written.data)
    }

    fn status(&self) -> LeaderStatus {
        let now = system_now();
        let table = self.coordinator.table();
        let mut limits = Vec::new();
        let mut left_out = 0;
        for spec in table.limits() {
            let Quota::Units { window, .. } = spec.quota else {
                continue;
            };
            if limits.len() >= MAX_STATUS_LIMITS {
                left_out += 1;
                continue;
            }
            if let Some(bound) = self.coordinator.bound(now, &spec.id, window.index(now)) {
                limits.push(LimitBound {
                    limit: spec.id.clone(),
                    bound,
                });
            }
        }
        let c = &self.coordinator;
        LeaderStatus {
            regions: self.heard.values().cloned().collect(),
            counters: counters_status(table, |counter, region| c.used_units(counter, region)),
            limits,
            limits_left_out: left_out,
        }
    }
}

fn heard_from(received_at: Timestamp, up: &SyncUp) -> RegionHeard {
    RegionHeard {
        region: up.region.clone(),
        last_heard_unix_ms: received_at.as_unix_millis(),
        clock_offset_nanos: up.clock.map(|c| c.offset_nanos),
        round_trip_ms: up.clock.map(|c| c.round_trip_nanos / 1_000_000),
        view_expired: up.view_expired,
        config_version: up.config_version,
    }
}

/// How long a status read waits for the leader's task (behind the jobs queued before it).
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
