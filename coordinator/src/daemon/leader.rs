//! The leader's rebalancer: one task owning `allot_core::rebalance::Coordinator`, fed by a
//! bounded queue of jobs (SyncUps, configuration writes, status reads), so every change to
//! the rebalancer is serialized and a slow commit holds only the jobs queued behind it.
//!
//! Per SyncUp, the driver contract of `core/src/rebalance/coordinator.rs`: `handle_sync_up`,
//! `poll_proposals`, the proposals committed through raft as ONE `ClusterCommand::Round`,
//! `handle_committed` for each with the outcome the entry gave it, then `poll_sync_down` for
//! the region. An answer is built only from committed state; when a commit fails (leadership
//! lost) the task ends and its rebalancer is dropped, with no answer sent from it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::budget::timebase::MAX_CLOCK_DRIFT_PPM;
use allot_core::error::Error as CoreError;
use allot_core::ids::{LimitId, RegionId};
use allot_core::limit::Quota;
use allot_core::rebalance::{
    AllowanceTable, ApplyOutcome, Bound, Coordinator, CoordinatorConfig, TableCommand,
};
use allot_core::sync::{ClockSample, CounterRef, SyncUp};
use allot_core::time::Timestamp;
use openraft::Raft;
use openraft::raft::ClientWriteResponse;
use serde::Serialize;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use allot_proto::tls::Dialer;

use crate::daemon::metrics as m;
use crate::lock;
use crate::network::ProbeFrom;
use crate::network::clock::{ClockProber, Probed};
use crate::network::leader_admin::LeaderAdmin;
use crate::state::{
    ClockFrame, ClockSource, ClusterCommand, ClusterState, CommandOutcome, NodeClock, RegionClock,
};
use crate::store::StateReader;
use crate::sync_service::{Answer, ClusterClock};
use crate::types::{NodeId, TypeConfig};

/// Jobs waiting for the leader's rebalancer. A SyncUp that finds the queue full is left
/// unanswered (counted); the agent's next SyncUp carries everything again. With at most
/// `MAX_REGIONS` (64) agents syncing every interval, this is four intervals of every agent.
pub const JOB_QUEUE: usize = 256;

/// Longest a commit may take before this leader gives its rebalancer up (a leader cut off
/// from its quorum keeps its role until it hears a newer term; agents meanwhile go to the
/// other nodes after their own answer timeout).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the leader samples the other nodes' clocks (`network/clock.rs`).
pub const CLOCK_PROBE_INTERVAL: Duration = Duration::from_secs(1);

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
    #[serde(flatten)]
    pub heard: RowHeard,
}

/// What the leader last heard from a region about one counter (nothing on a follower).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct RowHeard {
    /// Net use as last reported.
    pub used_units: Option<u64>,
    /// Demand as last reported, in millionths of a unit per second: what the rebalancer
    /// moves allowance after (the dashboard draws it beside the allowance).
    pub demand_micro_units_per_sec: Option<u64>,
}

/// The first [`MAX_STATUS_COUNTERS`] escalated counters of `table`, with what `heard` knows.
pub fn counters_status(
    table: &AllowanceTable,
    heard: impl Fn(&CounterRef, &RegionId) -> RowHeard,
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
                        heard: heard(counter, region),
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
    /// The quota `L` and its window, beside the bound so that a reader needs nothing else
    /// to draw the window (the dashboard).
    pub quota_units: u64,
    pub window_ms: u64,
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
    /// The other nodes' clocks against cluster time, from the leader's latest probes.
    pub node_clocks: Vec<NodeClock>,
    /// Cluster time minus the leader's wall clock (D47): every time the leader reports is
    /// on cluster time.
    pub cluster_clock_offset_nanos: i64,
    /// The node through whose entry in the last clock frame this leader read cluster time,
    /// when it was not in the frame itself (D50).
    pub cluster_clock_via: Option<NodeId>,
}

/// The leader's rebalancer and the raft handle it commits through.
pub struct Leader {
    raft: Raft<TypeConfig>,
    state: StateReader,
    coordinator: Coordinator,
    heard: BTreeMap<RegionId, RegionHeard>,
    node_id: NodeId,
    /// This leader's reading of cluster time (D47): every `now` it hands the rebalancer.
    clock: ClusterClock,
    /// The node it read cluster time through, absent from the last frame itself (D50).
    clock_via: Option<NodeId>,
    /// The other nodes' clocks, as the probe task last sampled them.
    node_clocks: Arc<Mutex<BTreeMap<NodeId, NodeClock>>>,
    /// When the samples this leader started from were heard, on its clock: a region it has
    /// not heard is recorded again with its sample's own age, not as heard now.
    adopted_heard: BTreeMap<RegionId, Timestamp>,
    /// This node's admin HTTP address (named in its clock probes, if set), and the other
    /// nodes' as their answers name them.
    admins: Arc<LeaderAdmin>,
    /// How its probes dial the other nodes.
    dialer: Dialer,
    /// The regions whose samples this leader's last frame recorded; `None` before its first
    /// frame (which waits for the probes, `run`).
    framed: Option<BTreeSet<RegionId>>,
    /// A sync round just took a sample of a region the last frame lacked: a frame is recorded
    /// once the round is answered, not at the next interval, so that a leader lost before
    /// then does not take it along (a restored region's first answer needs its boot before's
    /// sample, D74).
    frame_due: bool,
}

/// A task that ends with the value holding it (the leader's, when its rebalancer is dropped).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Leader {
    /// A rebalancer over the applied table, answering under `leader_term`. The caller has
    /// committed a start entry of its own, so the state holds every entry committed before.
    /// `bridge`: this node's probe of a node in the last clock frame, when it is not in it
    /// itself (`bridge_clock`).
    pub fn new(
        raft: Raft<TypeConfig>,
        state: &StateReader,
        cfg: CoordinatorConfig,
        leader_term: u64,
        bridge: Option<Bridge>,
    ) -> Leader {
        let node_id = raft.metrics().borrow().id;
        let (coordinator, adopted_heard, clock) = state.read(|a| {
            let clock = cluster_clock(&a.state, node_id, bridge);
            let now = clock.now();
            let mut c = Coordinator::new(cfg, a.state.table().clone(), now, leader_term);
            let heard = adopt_recorded_clocks(&mut c, &a.state, node_id, bridge, now);
            c.adopt_boots((a.state.boots().values()).map(|r| (r.boots.clone(), r.sample_of_boot)));
            (c, heard, clock)
        });
        metrics::gauge!(m::CLUSTER_CLOCK_OFFSET).set(clock.offset_nanos() as f64 / 1e9);
        if clock.offset_nanos() != 0 {
            tracing::info!(
                offset_nanos = clock.offset_nanos(),
                bridged_via = bridge.map(|b| b.via),
                "leading on cluster time: this node's clock differs from the last leader's"
            );
        }
        Leader {
            raft,
            state: state.clone(),
            coordinator,
            heard: BTreeMap::new(),
            node_id,
            clock,
            clock_via: bridge.map(|b| b.via),
            node_clocks: Arc::new(Mutex::new(BTreeMap::new())),
            adopted_heard,
            admins: Arc::default(),
            dialer: Dialer::plaintext(),
            framed: None,
            frame_due: false,
        }
    }

    /// Names this node's admin HTTP address (`admins.own()`) in its clock probes, so that
    /// followers can say where the leader's status is read, and records the other nodes'
    /// addresses their answers name in `admins`.
    pub fn naming(mut self, admins: Arc<LeaderAdmin>) -> Leader {
        self.admins = admins;
        self
    }

    /// Probes the other nodes through `dialer` (TLS with this node's certificate).
    pub fn dialing(mut self, dialer: Dialer) -> Leader {
        self.dialer = dialer;
        self
    }

    /// Serves jobs and ticks until a commit fails or every sender is gone. The tick runs
    /// `poll_proposals` without a SyncUp (reclaims, garbage collection, pre-issue).
    pub async fn run(mut self, mut jobs: mpsc::Receiver<Job>) -> Ended {
        let mut tick = tokio::time::interval(self.coordinator.config().sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The clock frame (the regions' samples and this leader's samples of the other nodes,
        // which the next leader starts from, D43) every `clock_frame_interval`.
        let frame_interval = self.coordinator.config().clock_frame_interval;
        // The first frame waits for the probes: recorded before them, it would replace the
        // last leader's frame (which the next leader may need) with one that holds no other
        // node's clock. It is recorded once every member has answered, or after a whole
        // interval (a member down), or at once when there is no frame to replace: until the
        // first is recorded, cluster time lives only in this process, and a leader elected
        // after it would lead on its own clock.
        let framed = self.state.read(|a| a.state.clock_source().is_some());
        let first_frame = if framed {
            frame_interval
        } else {
            Duration::ZERO
        };
        let mut frame_tick =
            tokio::time::interval_at(tokio::time::Instant::now() + first_frame, frame_interval);
        frame_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let all_probed = Arc::new(Notify::new());
        let mut awaiting_probes = true;
        let _prober = self.spawn_prober(Arc::clone(&all_probed));
        loop {
            let served = tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => self.serve(job).await,
                    None => return Ended::Closed,
                },
                _ = tick.tick() => self.commit_proposals().await,
                _ = frame_tick.tick() => self.record_clock_frame().await,
                _ = all_probed.notified(), if awaiting_probes => {
                    awaiting_probes = false;
                    frame_tick.reset();
                    self.record_clock_frame().await
                }
            };
            if let Err(ended) = served {
                return ended;
            }
            if std::mem::take(&mut self.frame_due)
                && let Err(ended) = self.record_clock_frame().await
            {
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
                let received_at = self.clock.from_system(received_at);
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
        self.record_boots(&region).await?;
        self.frame_due |= self.coordinator.has_clock_sample(&region)
            && self.framed.as_ref().is_some_and(|f| !f.contains(&region));
        self.commit_proposals().await?;
        if self.coordinator.has_uncommitted_proposals() {
            // Cannot happen while every poll is committed before the next: kept as the
            // contract's guard, never an answer past an uncommitted proposal.
            return Ok(Answer::Unanswered);
        }
        let mut down = match self
            .coordinator
            .poll_sync_down(self.clock.now(), &region, seq)
        {
            Ok(down) => down,
            // Removed since its SyncUp was taken (a removal committed by an earlier leader's
            // entry, say): refused as its SyncUp would be now.
            Err(e) => {
                metrics::counter!(m::REMOVED_REGION_SYNC_UPS).increment(1);
                return Ok(Answer::Refused(e.to_string()));
            }
        };
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
        let cmds = self.coordinator.poll_proposals(self.clock.now());
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
        let now = self.clock.now();
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
            let mine = self
                .coordinator
                .handle_committed(self.clock.now(), set_config);
            if !mine.is_applied() {
                return Err(Ended::Diverged(format!("configuration refused: {mine:?}")));
            }
        }
        Ok(written.data)
    }

    /// Probes every other member's clock each [`CLOCK_PROBE_INTERVAL`], one at a time (a
    /// node that does not answer costs [`crate::network::clock::PROBE_TIMEOUT`]), off the
    /// rebalancer's task: a probe never holds a SyncUp up.
    /// Once every member has a sample, `all_probed` is notified (the first frame waits for it).
    fn spawn_prober(&self, all_probed: Arc<Notify>) -> AbortOnDrop {
        let raft = self.raft.clone();
        let me = self.node_id;
        let clocks = Arc::clone(&self.node_clocks);
        let clock = self.clock;
        let admins = Arc::clone(&self.admins);
        let from = admins.own().map(|admin_http| ProbeFrom {
            node: me,
            admin_http: admin_http.to_owned(),
        });
        let mut prober = ClockProber::new(
            raft.config().cluster_name.clone(),
            from,
            self.dialer.clone(),
        );
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(CLOCK_PROBE_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let members: Vec<(NodeId, String)> = {
                    let m = raft.metrics().borrow().membership_config.clone();
                    m.nodes()
                        .filter(|(id, _)| **id != me)
                        .map(|(id, n)| (*id, n.addr.clone()))
                        .collect()
                };
                lock(&clocks).retain(|id, _| members.iter().any(|(m, _)| m == id));
                let wanted = members.len();
                for (node, addr) in members {
                    probe_one(&mut prober, clock, &clocks, &admins, (node, &addr)).await;
                }
                if lock(&clocks).len() >= wanted {
                    all_probed.notify_one();
                }
            }
        }))
    }

    /// Commits the regions' samples on this leader's clock with its samples of the other
    /// nodes (`ClusterCommand::RecordClockFrame`). A refusal (a later leader recorded
    /// already) is counted; a failed commit ends the task as any other.
    async fn record_clock_frame(&mut self) -> Result<(), Ended> {
        let now = self.clock.now();
        // Each sample is recorded as heard when it was taken, or earlier: the next leader
        // ages it from then. A restored region's boot before's sample (replicated until the
        // restored boot is answered) was taken before the region was last heard.
        let regions = self
            .coordinator
            .clock_samples_taken()
            .into_iter()
            .map(|(region, sample, taken_at)| {
                let heard_at = match self.heard.get(&region) {
                    Some(h) => Timestamp::from_unix_millis(h.last_heard_unix_ms),
                    None => self.adopted_heard.get(&region).copied().unwrap_or(taken_at),
                };
                RegionClock {
                    region,
                    sample,
                    heard_at: heard_at.min(taken_at).min(now),
                }
            })
            .collect();
        self.framed = Some(self.coordinator.sampled_regions().cloned().collect());
        let frame = ClockFrame {
            source: ClockSource {
                leader: self.node_id,
                leader_term: self.coordinator.leader_term(),
                nodes: self.frame_nodes(now),
            },
            regions,
        };
        let written = self.commit(ClusterCommand::RecordClockFrame(frame)).await?;
        let result = match written.data {
            CommandOutcome::ClocksRecorded => "recorded",
            other => {
                tracing::warn!(outcome = ?other, "clock frame not recorded");
                "refused"
            }
        };
        metrics::counter!(m::CLOCK_FRAMES, "result" => result).increment(1);
        Ok(())
    }

    /// Commits `region`'s boots when the SyncUp just taken changed them from the ones
    /// replicated (a restart, a restored boot answered, a region first heard), before the
    /// answer: a leader lost after it leaves the next one a late message of a boot the
    /// answered one superseded to tell for old (D78). A refusal (a later leader recorded
    /// them already) is counted; a failed commit ends the task as any other.
    async fn record_boots(&mut self, region: &RegionId) -> Result<(), Ended> {
        let Some(boots) = self.coordinator.region_boots(region) else {
            return Ok(());
        };
        let replicated = self
            .state
            .read(|a| (a.state.boots().get(region)).is_some_and(|r| r.boots == boots));
        if replicated {
            return Ok(());
        }
        let cmd = ClusterCommand::RecordBoots {
            leader_term: self.coordinator.leader_term(),
            boots: vec![boots],
        };
        let result = match self.commit(cmd).await?.data {
            CommandOutcome::BootsRecorded => "recorded",
            other => {
                tracing::warn!(outcome = ?other, %region, "boots not recorded");
                "refused"
            }
        };
        metrics::counter!(m::BOOTS_RECORDED, "result" => result).increment(1);
        Ok(())
    }

    /// The other nodes' clocks as last probed, and this node's own wall clock against cluster
    /// time: a later term of this node reads its offset back from it (D47).
    fn frame_nodes(&self, now: Timestamp) -> Vec<NodeClock> {
        let mut nodes: Vec<NodeClock> = lock(&self.node_clocks).values().cloned().collect();
        nodes.push(NodeClock {
            node: self.node_id,
            sample: ClockSample {
                offset_nanos: self.clock.offset_nanos().saturating_neg(),
                round_trip_nanos: 0,
            },
            taken_at: now,
        });
        nodes
    }

    fn status(&self) -> LeaderStatus {
        let now = self.clock.now();
        let table = self.coordinator.table();
        let mut limits = Vec::new();
        let mut left_out = 0;
        for spec in table.limits() {
            let Quota::Units { units, window } = spec.quota else {
                continue;
            };
            if limits.len() >= MAX_STATUS_LIMITS {
                left_out += 1;
                continue;
            }
            if let Some(bound) = self.coordinator.bound(now, &spec.id, window.index(now)) {
                limits.push(LimitBound {
                    limit: spec.id.clone(),
                    quota_units: units,
                    window_ms: u64::try_from(window.len().as_millis()).unwrap_or(u64::MAX),
                    bound,
                });
            }
        }
        let c = &self.coordinator;
        LeaderStatus {
            regions: self.heard.values().cloned().collect(),
            counters: counters_status(table, |counter, region| RowHeard {
                used_units: c.used_units(counter, region),
                demand_micro_units_per_sec: c.demand_micro_units_per_sec(counter, region),
            }),
            limits,
            limits_left_out: left_out,
            node_clocks: lock(&self.node_clocks).values().cloned().collect(),
            cluster_clock_offset_nanos: self.clock.offset_nanos(),
            cluster_clock_via: self.clock_via,
        }
    }
}

async fn probe_one(
    prober: &mut ClockProber,
    clock: ClusterClock,
    clocks: &Mutex<BTreeMap<NodeId, NodeClock>>,
    admins: &LeaderAdmin,
    (node, addr): (NodeId, &str),
) {
    match prober.probe(node, addr, clock).await {
        Ok(Probed {
            sample,
            taken_at,
            admin_http,
        }) => {
            admins.record_node(node, admin_http);
            let label = node.to_string();
            metrics::gauge!(m::NODE_CLOCK_OFFSET, "node" => label.clone())
                .set(sample.offset_nanos as f64 / 1e9);
            metrics::gauge!(m::NODE_CLOCK_ROUND_TRIP, "node" => label)
                .set(sample.round_trip_nanos as f64 / 1e9);
            let clock = NodeClock {
                node,
                sample,
                taken_at,
            };
            lock(clocks).insert(node, clock);
        }
        Err(e) => {
            metrics::counter!(m::CLOCK_PROBE_FAILURES).increment(1);
            tracing::debug!(node, addr, error = %e, "clock probe failed");
        }
    }
}

/// This node's probe, on its own wall clock, of a node in the last clock frame, taken
/// because this node is not in it (D50).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bridge {
    pub via: NodeId,
    /// `via`'s wall clock minus this node's.
    pub sample: ClockSample,
}

/// This node's entry in the last clock frame: the recorder's sample of its wall clock against
/// cluster time. A node absent from it (one the recorder never probed in its term: down or
/// cut off since before that leader was elected; frames carry every other node's last probe,
/// however old) chains its own probe of a node in it with the recorder's sample of
/// that one: `me - cluster = (via - cluster) - (via - me)`, the errors added and aged from the
/// recorder's sample.
pub fn own_entry(source: &ClockSource, me: NodeId, bridge: Option<Bridge>) -> Option<NodeClock> {
    if let Some(n) = source.nodes.iter().find(|n| n.node == me) {
        return Some(n.clone());
    }
    let b = bridge?;
    let via = source.nodes.iter().find(|n| n.node == b.via)?;
    Some(NodeClock {
        node: me,
        sample: ClockSample {
            offset_nanos: via
                .sample
                .offset_nanos
                .saturating_sub(b.sample.offset_nanos),
            round_trip_nanos: via
                .sample
                .round_trip_nanos
                .saturating_add(b.sample.round_trip_nanos),
        },
        taken_at: via.taken_at,
    })
}

/// This node's cluster clock (D47), from the last recorded frame: its entry there
/// (`own_entry`, bridged through another node's if it has none), reversed. A frame this node
/// recorded holds its own offset; one recorded before offsets were (no entry of its recorder)
/// means 0. Without a frame, or an entry of this node in it or bridged to it, its own wall
/// clock: the regions then see cluster time step by the difference, as they did before D47.
pub fn cluster_clock(state: &ClusterState, me: NodeId, bridge: Option<Bridge>) -> ClusterClock {
    let offset = state
        .clock_source()
        .and_then(|source| own_entry(source, me, bridge))
        .map_or(0, |n| n.sample.offset_nanos.saturating_neg());
    ClusterClock::with_offset(offset)
}

/// The nodes a new leader absent from the last clock frame can bridge through (D50): the
/// frame's, itself excepted. Empty when it is in the frame, recorded it, or there is none.
pub fn bridge_candidates(state: &ClusterState, me: NodeId) -> Vec<NodeId> {
    let Some(source) = state.clock_source() else {
        return Vec::new();
    };
    if source.leader == me || source.nodes.iter().any(|n| n.node == me) {
        return Vec::new();
    }
    source
        .nodes
        .iter()
        .map(|n| n.node)
        .filter(|&n| n != me)
        .collect()
}

/// Rounds of bridge probes a new leader absent from the last frame makes before it leads on
/// its own clock; each round waits up to `PROBE_TIMEOUT`, then `BRIDGE_RETRY_PAUSE`.
pub const BRIDGE_ATTEMPTS: u32 = 4;
pub const BRIDGE_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// What a new leader absent from the last clock frame reads cluster time through (D50):
/// its probe of a node in the frame. `None` when it needs none, or no such node answers (it
/// then leads on its own clock, and says so).
pub async fn bridge_clock(
    raft: &Raft<TypeConfig>,
    state: &StateReader,
    dialer: &Dialer,
) -> Option<Bridge> {
    let (me, members) = {
        let metrics = raft.metrics();
        let m = metrics.borrow();
        let members: BTreeMap<NodeId, String> = m
            .membership_config
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        (m.id, members)
    };
    let candidates: Vec<(NodeId, String)> = state
        .read(|a| bridge_candidates(&a.state, me))
        .into_iter()
        .filter_map(|n| Some((n, members.get(&n)?.clone())))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    // The nodes in the frame are often restarting (the last leader, killed, comes back):
    // a few tries cost this leader a second or two of rebalancing, while giving up moves
    // every region's windows by the difference between the clocks.
    let mut bridge = None;
    for attempt in 1..=BRIDGE_ATTEMPTS {
        bridge = probe_bridge(&raft.config().cluster_name, candidates.clone(), dialer).await;
        if bridge.is_some() {
            break;
        }
        tracing::debug!(attempt, "no node in the last clock frame answered yet");
        if attempt < BRIDGE_ATTEMPTS {
            tokio::time::sleep(BRIDGE_RETRY_PAUSE).await;
        }
    }
    match bridge {
        Some(b) => tracing::info!(
            via = b.via,
            round_trip_nanos = b.sample.round_trip_nanos,
            "not in the last clock frame: cluster time read through another node's entry"
        ),
        None => tracing::warn!(
            "not in the last clock frame and no node in it answered a clock probe: leading \
             on this node's own clock, the regions' windows step by the difference"
        ),
    }
    bridge
}

/// Probes each candidate at once on this node's wall clock (each within `PROBE_TIMEOUT`):
/// the first answer is the bridge. The probes start together, so the first back has the
/// shortest round trip (within the answering nodes' handling), and a dead node in the frame
/// (often the last leader) costs no wait. None answering, none.
pub async fn probe_bridge(
    cluster: &str,
    candidates: Vec<(NodeId, String)>,
    dialer: &Dialer,
) -> Option<Bridge> {
    let mut probes = tokio::task::JoinSet::new();
    for (node, addr) in candidates {
        let mut prober = ClockProber::new(cluster.to_owned(), None, dialer.clone());
        probes.spawn(async move {
            let probed = prober.probe(node, &addr, ClusterClock::default()).await;
            (node, probed)
        });
    }
    while let Some(done) = probes.join_next().await {
        if let Ok((via, Ok(probed))) = done {
            let sample = probed.sample;
            return Some(Bridge { via, sample });
        }
    }
    None
}

/// A new leader starts from the samples the last leader recorded. On cluster time (D47) they
/// are on this leader's clock too, within the error of this node's entry (`own_entry`: the
/// recorder's sample of it, or a bridge; none when it recorded them itself), grown by the
/// drift allowed since it was taken; each sample grows the same way. Without an entry of this
/// node, none are taken. Returns when
/// each was heard, on cluster time (earlier by the hop's error: an older sample only grows
/// more).
pub fn adopt_recorded_clocks(
    coordinator: &mut Coordinator,
    state: &ClusterState,
    me: NodeId,
    bridge: Option<Bridge>,
    now: Timestamp,
) -> BTreeMap<RegionId, Timestamp> {
    let Some(source) = state.clock_source() else {
        return BTreeMap::new();
    };
    let aged = |sample: ClockSample, at: Timestamp| {
        sample.aged(now.saturating_duration_since(at), MAX_CLOCK_DRIFT_PPM)
    };
    let hop = match own_entry(source, me, bridge) {
        Some(n) => Some(aged(n.sample, n.taken_at)),
        None if source.leader == me => Some(ClockSample::SAME_CLOCK),
        None => None,
    };
    let Some(hop) = hop else {
        return BTreeMap::new();
    };
    // The recorder's cluster time and this node's are one by construction (`cluster_clock`):
    // what is left of the hop is its error.
    let hop = ClockSample {
        offset_nanos: 0,
        round_trip_nanos: hop.round_trip_nanos,
    };
    let samples = state
        .clocks()
        .values()
        .map(|c| (c.region.clone(), aged(c.sample, c.heard_at)));
    coordinator.adopt_clocks(source.leader_term, hop, samples);
    let on_my_clock = |t: Timestamp| {
        let nanos = i128::from(t.as_unix_nanos()) - i128::from(hop.round_trip_nanos / 2);
        Timestamp::from_unix_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX))
    };
    state
        .clocks()
        .values()
        .map(|c| (c.region.clone(), on_my_clock(c.heard_at)))
        .collect()
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

#[cfg(test)]
mod tests {
    use allot_core::limit::LimitSpec;
    use allot_core::rebalance::CoordinatorConfig;

    use super::*;
    use crate::state::RegionClock;

    fn sample(offset_ms: i64, rtt_ms: u64) -> ClockSample {
        ClockSample {
            offset_nanos: offset_ms * 1_000_000,
            round_trip_nanos: rtt_ms * 1_000_000,
        }
    }

    /// A cluster of regions eu and us whose leader, node 1 under rebalancer term 7, recorded
    /// eu 2 s behind it and node 2's clock 0.5 s behind its own, at `at`.
    fn recorded(at: Timestamp) -> ClusterState {
        let mut state = ClusterState::default();
        for r in ["eu", "us"] {
            let join = ClusterCommand::AddRegion {
                region: RegionId::from(r),
                weight_ppm: None,
            };
            state.apply(join).expect("joins");
        }
        let put = ClusterCommand::PutLimits {
            version: 5,
            limits: vec![LimitSpec::simple("l", 100, Duration::from_secs(1))],
        };
        state.apply(put).expect("puts");
        let frame = ClockFrame {
            source: ClockSource {
                leader: 1,
                leader_term: 7,
                nodes: vec![NodeClock {
                    node: 2,
                    sample: sample(-500, 4),
                    taken_at: at,
                }],
            },
            regions: vec![RegionClock {
                region: RegionId::from("eu"),
                sample: sample(2_000, 10),
                heard_at: at,
            }],
        };
        let outcome = state.apply(ClusterCommand::RecordClockFrame(frame));
        assert_eq!(outcome.ok(), Some(CommandOutcome::ClocksRecorded));
        state
    }

    fn adopted_on(
        node: NodeId,
        state: &ClusterState,
        now: Timestamp,
    ) -> Vec<(RegionId, ClockSample)> {
        let mut c = Coordinator::new(CoordinatorConfig::default(), state.table().clone(), now, 8);
        adopt_recorded_clocks(&mut c, state, node, None, now);
        c.clock_samples()
    }

    /// Node 2 is 0.5 s behind node 1: on cluster time it reads node 1's clock (D47), so eu's
    /// sample holds as recorded, with the hop's error (4 ms of probe) and 1% of the 10 s since
    /// each sample was taken (twice, in the round trip) on top.
    #[test]
    fn a_new_leader_carries_the_recorded_samples_over_on_cluster_time() {
        let at = Timestamp::from_unix_millis(1_000_000);
        let state = recorded(at);
        let later = at + Duration::from_secs(10);
        let eu = RegionId::from("eu");
        let on_2 = adopted_on(2, &state, later);
        let mut c = Coordinator::new(
            CoordinatorConfig::default(),
            state.table().clone(),
            later,
            8,
        );
        let heard = adopt_recorded_clocks(&mut c, &state, 2, None, later);
        // Heard at 1,000 s on cluster time, less the hop's error now (2 ms of probe, 100 ms
        // of drift over the 10 s since).
        assert_eq!(
            heard.get(&RegionId::from("eu")),
            Some(&Timestamp::from_unix_millis(999_898))
        );
        // 10 ms + 4 ms of round trips, and 2 x 100 ms of drift for each of the two samples.
        assert_eq!(on_2, vec![(eu.clone(), sample(2_000, 414))]);
        // The recording node reads its own samples, aged.
        assert_eq!(adopted_on(1, &state, later), vec![(eu, sample(2_000, 210))]);
        // A node the leader never sampled cannot tell whose clock they are on: none.
        assert!(adopted_on(3, &state, later).is_empty());
    }

    /// Node 2's clock is 0.5 s behind the recorder's cluster time: it leads 0.5 s ahead of its
    /// own clock. The recorder of a frame without its own entry (recorded before D47) led on
    /// its own clock; an unsampled node has only its own.
    #[test]
    fn a_new_leader_reads_cluster_time_from_the_recorders_sample_of_it() {
        let state = recorded(Timestamp::from_unix_millis(1_000_000));
        assert_eq!(cluster_clock(&state, 2, None).offset_nanos(), 500_000_000);
        assert_eq!(cluster_clock(&state, 1, None).offset_nanos(), 0);
        assert_eq!(cluster_clock(&state, 3, None).offset_nanos(), 0);
        assert_eq!(
            cluster_clock(&ClusterState::default(), 1, None),
            ClusterClock::default()
        );
    }

    /// Node 3 is absent from the frame (node 1 recorded it with node 2 0.5 s behind cluster
    /// time). Its own clock is 24 s ahead of cluster time: it finds node 2 24.5 s behind it,
    /// and through node 2's entry reads cluster time 24 s behind its clock, with both probes'
    /// errors. A bridge through a node the frame does not hold gives nothing.
    #[test]
    fn a_leader_absent_from_the_frame_reads_cluster_time_through_a_node_in_it() {
        let at = Timestamp::from_unix_millis(1_000_000);
        let state = recorded(at);
        assert_eq!(bridge_candidates(&state, 3), vec![2]);
        assert!(bridge_candidates(&state, 2).is_empty(), "in the frame");
        assert!(bridge_candidates(&state, 1).is_empty(), "its recorder");
        assert!(bridge_candidates(&ClusterState::default(), 3).is_empty());
        let bridge = Bridge {
            via: 2,
            sample: sample(-24_500, 6),
        };
        let source = state.clock_source().expect("a frame");
        let entry = own_entry(source, 3, Some(bridge)).expect("bridged");
        assert_eq!(entry.sample, sample(24_000, 10));
        assert_eq!(entry.taken_at, at, "aged from the recorder's sample");
        assert_eq!(
            cluster_clock(&state, 3, Some(bridge)).offset_nanos(),
            -24_000_000_000
        );
        // Node 2 is in the frame: a bridge changes nothing.
        assert_eq!(
            cluster_clock(&state, 2, Some(bridge)).offset_nanos(),
            500_000_000
        );
        let stray = Bridge { via: 4, ..bridge };
        assert_eq!(cluster_clock(&state, 3, Some(stray)).offset_nanos(), 0);
        // The regions' samples come over with the bridge's error, aged like the entry it
        // chains (10 ms of probes, 2 x 100 ms of drift over the 10 s), and eu's own.
        let later = at + Duration::from_secs(10);
        let mut c = Coordinator::new(
            CoordinatorConfig::default(),
            state.table().clone(),
            later,
            8,
        );
        adopt_recorded_clocks(&mut c, &state, 3, Some(bridge), later);
        let eu = RegionId::from("eu");
        assert_eq!(c.clock_samples(), vec![(eu, sample(2_000, 420))]);
    }

    /// A leader on an offset records it as its own entry (its wall clock against cluster
    /// time), and reads it back when it leads again; a later leader it sampled chains from
    /// the same cluster time.
    #[test]
    fn an_offset_survives_the_next_frame_of_the_node_that_led_on_it() {
        let at = Timestamp::from_unix_millis(1_000_000);
        let mut state = recorded(at);
        let clock = cluster_clock(&state, 2, None);
        // Node 2 leads under term 8 and records: its own entry, and node 3 1.2 s ahead of its
        // cluster time.
        let frame = ClockFrame {
            source: ClockSource {
                leader: 2,
                leader_term: 8,
                nodes: vec![
                    NodeClock {
                        node: 2,
                        sample: sample(-clock.offset_nanos() / 1_000_000, 0),
                        taken_at: at,
                    },
                    NodeClock {
                        node: 3,
                        sample: sample(1_200, 6),
                        taken_at: at,
                    },
                ],
            },
            regions: vec![],
        };
        let outcome = state.apply(ClusterCommand::RecordClockFrame(frame));
        assert_eq!(outcome.ok(), Some(CommandOutcome::ClocksRecorded));
        assert_eq!(cluster_clock(&state, 2, None), clock);
        assert_eq!(
            cluster_clock(&state, 3, None).offset_nanos(),
            -1_200_000_000
        );
    }
}
