//! The replicated state machine: what every coordinator node holds once a raft entry commits.
//!
//! [`ClusterState`] is the allowance table plus what the table is computed from and what the
//! bound needs after a leader change: the limits as configured, the member regions with their
//! weights, and each region's last clock sample. [`ClusterState::apply`] is deterministic (the
//! same entries give the same state on every node) and refuses, with a [`Refusal`], any command
//! that would change nothing or break the table; a refused command changes nothing.
//!
//! One version number: the table's `config_version`, which agents see on the sync stream. A
//! limits put must name a version above it; a membership change takes the next one itself, so
//! agents reload the regions' shares the same way they reload limits.

use std::collections::BTreeMap;

use allot_core::ids::RegionId;
use allot_core::limit::{LimitSpec, RegionWeights, WEIGHT_SCALE_PPM};
use allot_core::rebalance::{
    AllowanceTable, AllowanceTableV1, AllowanceTableV2, ApplyOutcome, MAX_PROPOSALS_PER_POLL,
    RETIRED_BOOTS_KEPT, RecordedBoots, RegionBoots, RejectReason, TableCommand,
};
use allot_core::sync::{ClockSample, ConfigFiles};
use allot_core::time::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::NodeId;

/// Most regions a cluster holds: bounds the membership, the clock samples and the table's
/// per-counter sums. A join beyond it is refused.
pub const MAX_REGIONS: usize = 64;

/// Most table commands one round entry carries: one `poll_proposals` of the leader's
/// rebalancer, which returns at most this many.
pub const MAX_COMMANDS_PER_ROUND: usize = MAX_PROPOSALS_PER_POLL;

/// Most nodes whose clocks one frame carries (a cluster has 3 to 5; learners too).
pub const MAX_NODES: usize = 64;

/// Most limits one configuration holds (the table holds a spec per limit).
pub const MAX_LIMITS: usize = 16_384;

/// A command committed through raft: one log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterCommand {
    /// One rebalancing round of the leader: its table commands, applied in order as one entry
    /// (each has its own outcome, as the rebalancer expects in `handle_committed`). Config
    /// changes do not ride in a round: they are [`ClusterCommand::PutLimits`] and the
    /// membership commands.
    Round(Vec<TableCommand>),
    /// A new limits configuration. `version` must be above the current one. Every region a
    /// limit's weights name becomes a member (default weight) at the same version, as agents
    /// take the deployment's regions from the same limits.
    PutLimits {
        version: u64,
        limits: Vec<LimitSpec>,
    },
    /// A region joins, or a member's weight changes. `weight_ppm: None` is the default weight:
    /// an equal share of what the regions with a weight leave.
    AddRegion {
        region: RegionId,
        weight_ppm: Option<u32>,
    },
    /// A region leaves; its rows go with the configuration change (agents drop theirs too).
    RemoveRegion { region: RegionId },
    /// Region clock samples with no word of whose clock they were measured on. Not proposed
    /// since [`ClusterCommand::RecordClockFrame`]; kept so that entries written before decode.
    RecordClocks(Vec<RegionClock>),
    /// A new limits configuration as its files (`allot config put`, `--limits`): loaded here
    /// with the configuration loader (deterministic, so every node gets the same limits), put
    /// as [`ClusterCommand::PutLimits`] puts limits, and kept, so that the leader sends them
    /// to agents on another version. Entries written before it decode.
    PutConfig(ConfigFiles),
    /// The leader's latest clock samples of the regions, on its clock, with its samples of the
    /// other nodes' clocks: a new leader carries the regions' samples over to its own clock by
    /// the sample of itself, so that it states the skew term and reclaims from its first round
    /// (D43). Replaces the samples before it as a whole. Last of the variants: entries written
    /// before it decode.
    RecordClockFrame(ClockFrame),
    /// The regions' boots as the leader of `leader_term` heard them (D78): committed before it
    /// answers a SyncUp that changed them, so that the next leader takes a late message of a
    /// boot a restore superseded for an old one. Last of the variants: entries written before
    /// it decode.
    RecordBoots {
        leader_term: u64,
        boots: Vec<RegionBoots>,
    },
}

/// Whose clock the recorded samples are on: the leader that recorded them, and its samples of
/// the other nodes' clocks (`sample.offset_nanos` is the node's clock minus the leader's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSource {
    pub leader: NodeId,
    /// The rebalancer term the regions' samples were measured under (`SyncDown::leader_term`).
    pub leader_term: u64,
    pub nodes: Vec<NodeClock>,
}

/// One node's clock as the leader sampled it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeClock {
    pub node: NodeId,
    pub sample: ClockSample,
    /// The leader's time when the probe came back.
    pub taken_at: Timestamp,
}

/// What [`ClusterCommand::RecordClockFrame`] records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockFrame {
    pub source: ClockSource,
    pub regions: Vec<RegionClock>,
}

/// One region's clock sample as the leader took it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionClock {
    pub region: RegionId,
    pub sample: ClockSample,
    /// The leader's time when the sample arrived.
    pub heard_at: Timestamp,
}

/// A member region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMember {
    /// Its default share in ppm for limits that name no weights; `None` is the default weight.
    pub weight_ppm: Option<u32>,
}

/// What applying one command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcome {
    /// Per table command of the round, in order.
    Round(Vec<ApplyOutcome>),
    /// A limits or membership change is in the table at this version. `set_config` is the
    /// table command it applied (limits with the members' weights filled in, the member list):
    /// the leader hands it to its rebalancer's `handle_committed`, whose table then stays the
    /// same as the replicated one.
    Configured {
        version: u64,
        set_config: TableCommand,
    },
    ClocksRecorded,
    /// The whole command was refused; nothing changed.
    Refused(Refusal),
    /// A raft entry of its own (blank or membership): nothing of the cluster state changed.
    Raft,
    /// Last of the variants: outcomes encoded before it decode.
    BootsRecorded,
}

impl CommandOutcome {
    /// The version a configuration change took effect at, if this is one.
    pub fn configured_version(&self) -> Option<u64> {
        match self {
            CommandOutcome::Configured { version, .. } => Some(*version),
            _ => None,
        }
    }
}

/// Why a command was refused as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("limits version {proposed} is not above the current version {current}")]
    StaleVersion { proposed: u64, current: u64 },
    #[error("a round of {commands} commands is above the most, {MAX_COMMANDS_PER_ROUND}")]
    RoundTooLarge { commands: usize },
    #[error("a configuration change cannot ride in a round: put limits or change membership")]
    ConfigInRound,
    #[error("{limits} limits are above the most, {MAX_LIMITS}")]
    TooManyLimits { limits: usize },
    #[error("{regions} regions would be above the most, {MAX_REGIONS}")]
    TooManyRegions { regions: usize },
    #[error("region {0} is not a member")]
    UnknownRegion(RegionId),
    #[error("region weights would add up to {total_ppm} ppm, above 1 (1000000 ppm)")]
    WeightsAboveOne { total_ppm: u64 },
    #[error("the allowance table refused the configuration: {0}")]
    Table(RejectReason),
    /// The files are too many or too large, or do not load (every problem, file:line:column).
    #[error("the limits do not load:\n{0}")]
    BadConfig(String),
    /// Agents build their quota shares over the regions the limits name, and cannot change
    /// them without a restart.
    #[error(
        "the limits name the regions [{}], the limits in force [{}]: the deployment's regions \
         cannot change by a configuration put",
        names(proposed),
        names(in_force)
    )]
    RegionsChanged {
        in_force: Vec<RegionId>,
        proposed: Vec<RegionId>,
    },
    #[error("{nodes} node clocks are above the most, {MAX_NODES}")]
    TooManyNodes { nodes: usize },
    #[error("clock samples of rebalancer term {term} are older than those recorded ({recorded})")]
    OlderClocks { term: u64, recorded: u64 },
    #[error("boots of rebalancer term {term} are older than those recorded ({recorded})")]
    OlderBoots { term: u64, recorded: u64 },
    #[error(
        "region {0}'s boots are not a leader's: boot 0, or more than {RETIRED_BOOTS_KEPT} retired"
    )]
    BadBoots(RegionId),
}

fn names(regions: &[RegionId]) -> String {
    let names: Vec<&str> = regions.iter().map(|r| r.as_str()).collect();
    names.join(", ")
}

/// The replicated state. Serialisable as a whole: it is the raft snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    table: AllowanceTable,
    /// The limits as put, before member weights fill their shares in.
    limits: Vec<LimitSpec>,
    regions: BTreeMap<RegionId, RegionMember>,
    clocks: BTreeMap<RegionId, RegionClock>,
    /// The files `limits` were loaded from, when they were put as files (`PutConfig`); their
    /// version is the put's, which a membership change moves on from.
    config_files: Option<ConfigFiles>,
    /// Whose clock `clocks` are on (the last `RecordClockFrame`); `None` before the first.
    clock_source: Option<ClockSource>,
    /// The regions' boots, as the last `RecordBoots` of each said them.
    boots: BTreeMap<RegionId, RecordedBoots>,
}

/// The snapshot layouts of formats 5 and 4, which differ only in their table's: read, never
/// written. Format 5 is the layout before the regions' boots were kept; format 4 the one before
/// the table recorded the regions' versions.
#[derive(Deserialize)]
pub(crate) struct ClusterStateBeforeBoots<Table> {
    table: Table,
    limits: Vec<LimitSpec>,
    regions: BTreeMap<RegionId, RegionMember>,
    clocks: BTreeMap<RegionId, RegionClock>,
    config_files: Option<ConfigFiles>,
    clock_source: Option<ClockSource>,
}

pub(crate) type ClusterStateV5 = ClusterStateBeforeBoots<AllowanceTable>;
pub(crate) type ClusterStateV4 = ClusterStateBeforeBoots<AllowanceTableV2>;

impl<Table: Into<AllowanceTable>> From<ClusterStateBeforeBoots<Table>> for ClusterState {
    fn from(old: ClusterStateBeforeBoots<Table>) -> Self {
        ClusterState {
            table: old.table.into(),
            limits: old.limits,
            regions: old.regions,
            clocks: old.clocks,
            config_files: old.config_files,
            clock_source: old.clock_source,
            boots: BTreeMap::new(),
        }
    }
}

/// The snapshot layout before the clock samples named their clock (format 3): read, never
/// written.
#[derive(Deserialize)]
pub(crate) struct ClusterStateV3 {
    table: AllowanceTableV2,
    limits: Vec<LimitSpec>,
    regions: BTreeMap<RegionId, RegionMember>,
    clocks: BTreeMap<RegionId, RegionClock>,
    config_files: Option<ConfigFiles>,
}

impl From<ClusterStateV3> for ClusterState {
    fn from(v3: ClusterStateV3) -> Self {
        ClusterState {
            table: v3.table.into(),
            limits: v3.limits,
            regions: v3.regions,
            clocks: v3.clocks,
            config_files: v3.config_files,
            clock_source: None,
            boots: BTreeMap::new(),
        }
    }
}

/// The snapshot layout before the configuration's files were kept (format 1): read, never
/// written.
#[derive(Deserialize)]
pub(crate) struct ClusterStateV1 {
    table: AllowanceTableV1,
    limits: Vec<LimitSpec>,
    regions: BTreeMap<RegionId, RegionMember>,
    clocks: BTreeMap<RegionId, RegionClock>,
}

impl From<ClusterStateV1> for ClusterState {
    fn from(v1: ClusterStateV1) -> Self {
        ClusterState {
            table: v1.table.into(),
            limits: v1.limits,
            regions: v1.regions,
            clocks: v1.clocks,
            config_files: None,
            clock_source: None,
            boots: BTreeMap::new(),
        }
    }
}

/// The snapshot layout before the table kept removed regions (format 2): read, never written.
#[derive(Deserialize)]
pub(crate) struct ClusterStateV2 {
    table: AllowanceTableV1,
    limits: Vec<LimitSpec>,
    regions: BTreeMap<RegionId, RegionMember>,
    clocks: BTreeMap<RegionId, RegionClock>,
    config_files: Option<ConfigFiles>,
}

impl From<ClusterStateV2> for ClusterState {
    fn from(v2: ClusterStateV2) -> Self {
        ClusterState {
            table: v2.table.into(),
            limits: v2.limits,
            regions: v2.regions,
            clocks: v2.clocks,
            config_files: v2.config_files,
            clock_source: None,
            boots: BTreeMap::new(),
        }
    }
}

impl Default for ClusterState {
    fn default() -> Self {
        ClusterState {
            table: AllowanceTable::new(),
            limits: Vec::new(),
            regions: BTreeMap::new(),
            clocks: BTreeMap::new(),
            config_files: None,
            clock_source: None,
            boots: BTreeMap::new(),
        }
    }
}

impl ClusterState {
    pub fn table(&self) -> &AllowanceTable {
        &self.table
    }

    pub fn limits(&self) -> &[LimitSpec] {
        &self.limits
    }

    pub fn regions(&self) -> &BTreeMap<RegionId, RegionMember> {
        &self.regions
    }

    pub fn clocks(&self) -> &BTreeMap<RegionId, RegionClock> {
        &self.clocks
    }

    /// Whose clock [`ClusterState::clocks`] are on, once a leader recorded a frame.
    /// The regions' boots as the leaders last replicated them.
    pub fn boots(&self) -> &BTreeMap<RegionId, RecordedBoots> {
        &self.boots
    }

    pub fn clock_source(&self) -> Option<&ClockSource> {
        self.clock_source.as_ref()
    }

    /// The files of the limits in force, at the table's version (a membership change moves
    /// the version, not the files); `None` when the limits were put without their files.
    pub fn config_files(&self) -> Option<ConfigFiles> {
        let mut files = self.config_files.clone()?;
        files.version = self.table.config_version();
        Some(files)
    }

    /// Applies one committed command, then checks invariant 2 where it may have moved a sum:
    /// a round checks the counter of each row command it applies (any other command of it,
    /// and every other kind of entry, the whole table). An `Err` means the table broke it: the
    /// node must stop applying (every replica would break it the same way, and a grant from a
    /// broken table could overshoot). Debug builds check the whole table after every entry
    /// too, so a command that moves a sum it does not name is caught in tests.
    pub fn apply(&mut self, cmd: ClusterCommand) -> Result<CommandOutcome> {
        // Whether the command's own path already checked every sum it may have moved.
        let (outcome, checked) = match cmd {
            ClusterCommand::Round(cmds) => (self.apply_round(cmds)?, true),
            ClusterCommand::PutLimits { version, limits } => {
                (self.put_limits(version, limits), false)
            }
            ClusterCommand::AddRegion { region, weight_ppm } => {
                (self.add_region(region, weight_ppm), false)
            }
            ClusterCommand::RemoveRegion { region } => (self.remove_region(&region), false),
            ClusterCommand::RecordClocks(clocks) => (self.record_clocks(clocks), false),
            ClusterCommand::RecordClockFrame(frame) => (self.record_clock_frame(frame), false),
            ClusterCommand::PutConfig(files) => (self.put_config(files), false),
            ClusterCommand::RecordBoots { leader_term, boots } => {
                (self.record_boots(leader_term, boots), false)
            }
        };
        if !checked || cfg!(debug_assertions) {
            self.table
                .check_invariants()
                .map_err(|reason| Error::Invariant { reason })?;
        }
        Ok(outcome.unwrap_or_else(CommandOutcome::Refused))
    }

    /// A round's commands in order, each checked where it may have moved a sum. The outer
    /// `Err` is a broken invariant; the inner one a round refused whole (nothing applied).
    fn apply_round(
        &mut self,
        cmds: Vec<TableCommand>,
    ) -> Result<std::result::Result<CommandOutcome, Refusal>> {
        if cmds.len() > MAX_COMMANDS_PER_ROUND {
            return Ok(Err(Refusal::RoundTooLarge {
                commands: cmds.len(),
            }));
        }
        if cmds
            .iter()
            .any(|c| matches!(c, TableCommand::SetConfig { .. }))
        {
            return Ok(Err(Refusal::ConfigInRound));
        }
        let mut outcomes = Vec::with_capacity(cmds.len());
        for c in cmds {
            let outcome = self
                .table
                .apply_checked(c)
                .map_err(|reason| Error::Invariant { reason })?;
            outcomes.push(outcome);
        }
        Ok(Ok(CommandOutcome::Round(outcomes)))
    }

    fn put_limits(
        &mut self,
        version: u64,
        limits: Vec<LimitSpec>,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        let current = self.table.config_version();
        if version <= current {
            return Err(Refusal::StaleVersion {
                proposed: version,
                current,
            });
        }
        if limits.len() > MAX_LIMITS {
            return Err(Refusal::TooManyLimits {
                limits: limits.len(),
            });
        }
        self.config_files = None;
        let mut regions = self.regions.clone();
        for region in named_regions(&limits) {
            regions
                .entry(region)
                .or_insert(RegionMember { weight_ppm: None });
        }
        if regions.len() > MAX_REGIONS {
            return Err(Refusal::TooManyRegions {
                regions: regions.len(),
            });
        }
        self.configure(version, limits, regions)
    }

    /// Loads `files` and puts their limits, keeping the files; refused as a whole when
    /// [`ClusterState::check_config`] refuses them.
    fn put_config(&mut self, files: ConfigFiles) -> std::result::Result<CommandOutcome, Refusal> {
        let limits = self.check_config(&files)?;
        let outcome = self.put_limits(files.version, limits)?;
        self.config_files = Some(files);
        Ok(outcome)
    }

    /// What a configuration put is checked against (see [`ConfigInForce::check`]).
    /// The version in force when a put of `files` asks for exactly what is in force: the same
    /// files (names and texts, and the merge flag) at that version, or at no version given
    /// (`version_given` false). Such a put is a retry whose first answer was lost (a leader
    /// killed between the commit and its answer), or a repeat: it is answered with this
    /// version and commits nothing, where a second version of the same files would be a bump
    /// nobody asked for.
    pub fn version_in_force_for(&self, files: &ConfigFiles, version_given: bool) -> Option<u64> {
        let in_force = self.config_files.as_ref()?;
        let version = self.table.config_version();
        let same = in_force.merge_domains == files.merge_domains && in_force.files == files.files;
        (same && (!version_given || files.version == version)).then_some(version)
    }

    pub fn config_in_force(&self) -> ConfigInForce {
        ConfigInForce {
            version: self.table.config_version(),
            regions: (!self.limits.is_empty()).then(|| named_regions(&self.limits)),
        }
    }

    fn check_config(&self, files: &ConfigFiles) -> std::result::Result<Vec<LimitSpec>, Refusal> {
        self.config_in_force().check(files)
    }

    fn add_region(
        &mut self,
        region: RegionId,
        weight_ppm: Option<u32>,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        let mut regions = self.regions.clone();
        regions.insert(region, RegionMember { weight_ppm });
        if regions.len() > MAX_REGIONS {
            return Err(Refusal::TooManyRegions {
                regions: regions.len(),
            });
        }
        self.configure(self.next_version(), self.limits.clone(), regions)
    }

    fn remove_region(&mut self, region: &RegionId) -> std::result::Result<CommandOutcome, Refusal> {
        let mut regions = self.regions.clone();
        if regions.remove(region).is_none() {
            return Err(Refusal::UnknownRegion(region.clone()));
        }
        let outcome = self.configure(self.next_version(), self.limits.clone(), regions)?;
        self.clocks.remove(region);
        Ok(outcome)
    }

    fn next_version(&self) -> u64 {
        self.table.config_version().saturating_add(1)
    }

    /// Puts `limits` and `regions` into the table at `version`, or changes nothing.
    fn configure(
        &mut self,
        version: u64,
        limits: Vec<LimitSpec>,
        regions: BTreeMap<RegionId, RegionMember>,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        let effective = effective_limits(&limits, &regions)?;
        let cmd = TableCommand::SetConfig {
            version,
            limits: effective,
            regions: regions.keys().cloned().collect(),
        };
        if let ApplyOutcome::Rejected(reason) = self.table.apply(cmd.clone()) {
            return Err(Refusal::Table(reason));
        }
        self.limits = limits;
        self.regions = regions;
        Ok(CommandOutcome::Configured {
            version,
            set_config: cmd,
        })
    }

    fn record_clocks(
        &mut self,
        clocks: Vec<RegionClock>,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        if clocks.len() > MAX_REGIONS {
            return Err(Refusal::TooManyRegions {
                regions: clocks.len(),
            });
        }
        if let Some(c) = clocks
            .iter()
            .find(|c| !self.regions.contains_key(&c.region))
        {
            return Err(Refusal::UnknownRegion(c.region.clone()));
        }
        for clock in clocks {
            self.clocks.insert(clock.region.clone(), clock);
        }
        Ok(CommandOutcome::ClocksRecorded)
    }

    /// A frame replaces the samples before it, unless it is of an earlier rebalancer than
    /// theirs (a deposed leader's, committed late): samples never go back to an older clock.
    fn record_clock_frame(
        &mut self,
        frame: ClockFrame,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        if frame.source.nodes.len() > MAX_NODES {
            return Err(Refusal::TooManyNodes {
                nodes: frame.source.nodes.len(),
            });
        }
        if let Some(now) = &self.clock_source
            && frame.source.leader_term < now.leader_term
        {
            return Err(Refusal::OlderClocks {
                term: frame.source.leader_term,
                recorded: now.leader_term,
            });
        }
        let before = std::mem::take(&mut self.clocks);
        if let Err(refused) = self.record_clocks(frame.regions) {
            self.clocks = before;
            return Err(refused);
        }
        self.clock_source = Some(frame.source);
        for (region, recorded) in &mut self.boots {
            recorded.framed(self.clocks.contains_key(region));
        }
        Ok(CommandOutcome::ClocksRecorded)
    }

    /// Each region's boots replace the ones before, unless a later leader recorded those (a
    /// deposed leader's entry, committed late). A region's clock sample, if any, is of its
    /// newest boot only while that boot and whether it was restored are unchanged.
    fn record_boots(
        &mut self,
        leader_term: u64,
        boots: Vec<RegionBoots>,
    ) -> std::result::Result<CommandOutcome, Refusal> {
        if boots.len() > MAX_REGIONS {
            return Err(Refusal::TooManyRegions {
                regions: boots.len(),
            });
        }
        for b in &boots {
            if !self.regions.contains_key(&b.region) {
                return Err(Refusal::UnknownRegion(b.region.clone()));
            }
            let kept = self.boots.get(&b.region);
            if !RecordedBoots::may_replace(kept, leader_term) {
                return Err(Refusal::OlderBoots {
                    term: leader_term,
                    recorded: kept.map_or(0, |k| k.leader_term),
                });
            }
            if b.boot == 0 || b.retired.len() > RETIRED_BOOTS_KEPT {
                return Err(Refusal::BadBoots(b.region.clone()));
            }
        }
        for b in boots {
            let region = b.region.clone();
            let recorded = RecordedBoots::after(self.boots.get(&region), leader_term, b);
            self.boots.insert(region, recorded);
        }
        Ok(CommandOutcome::BootsRecorded)
    }
}

/// The version in force and the regions its limits name (`None` before any limits): all a
/// configuration put is checked against, small enough to read out of the state's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigInForce {
    pub version: u64,
    pub regions: Option<std::collections::BTreeSet<RegionId>>,
}

impl ConfigInForce {
    /// The limits `files` load to, if a put of them would be taken: refused when the version
    /// is not above the one in force, the files are too many or too large or do not load,
    /// or they name other regions than the limits in force. The admin call asks it before
    /// committing anything; applying the put asks it again.
    pub fn check(&self, files: &ConfigFiles) -> std::result::Result<Vec<LimitSpec>, Refusal> {
        if files.version <= self.version {
            return Err(Refusal::StaleVersion {
                proposed: files.version,
                current: self.version,
            });
        }
        files.check_size().map_err(Refusal::BadConfig)?;
        let config = files
            .load()
            .map_err(|errors| Refusal::BadConfig(errors.to_string()))?;
        let limits: Vec<LimitSpec> = config.rules().map(|r| r.spec.clone()).collect();
        if let Some(in_force) = &self.regions {
            let proposed = named_regions(&limits);
            if *in_force != proposed {
                return Err(Refusal::RegionsChanged {
                    in_force: in_force.iter().cloned().collect(),
                    proposed: proposed.into_iter().collect(),
                });
            }
        }
        Ok(limits)
    }
}

/// Every region some limit's weights name: the deployment's regions as an agent computes
/// them from the same limits (they join with the default weight, at the put's version).
fn named_regions(limits: &[LimitSpec]) -> std::collections::BTreeSet<RegionId> {
    limits
        .iter()
        .flat_map(|l| l.weights.iter().map(|(r, _)| r.clone()))
        .collect()
}

/// The limits the table enforces: a limit that names its own weights keeps them; one that
/// names none gives each member with a weight that weight, and the members without one equal
/// shares of the rest (rounded down, so the shares never add up to more than one). With no
/// member weights at all, a limit keeps the table's equal shares.
fn effective_limits(
    limits: &[LimitSpec],
    regions: &BTreeMap<RegionId, RegionMember>,
) -> std::result::Result<Vec<LimitSpec>, Refusal> {
    let weighted: u64 = regions
        .values()
        .filter_map(|m| m.weight_ppm)
        .map(u64::from)
        .sum();
    if weighted > WEIGHT_SCALE_PPM {
        return Err(Refusal::WeightsAboveOne {
            total_ppm: weighted,
        });
    }
    if weighted == 0 && regions.values().all(|m| m.weight_ppm.is_none()) {
        return Ok(limits.to_vec());
    }
    let unweighted = regions.values().filter(|m| m.weight_ppm.is_none()).count() as u64;
    let default_ppm = (WEIGHT_SCALE_PPM - weighted)
        .checked_div(unweighted)
        .unwrap_or(0);
    let shares: BTreeMap<RegionId, u32> = regions
        .iter()
        .map(|(r, m)| {
            // At most WEIGHT_SCALE_PPM, which fits a u32.
            let ppm = m.weight_ppm.unwrap_or(default_ppm as u32);
            (r.clone(), ppm)
        })
        .collect();
    let weights = RegionWeights::new(shares).map_err(|e| Refusal::WeightsAboveOne {
        total_ppm: e.total_ppm,
    })?;
    Ok(limits
        .iter()
        .map(|l| {
            let mut l = l.clone();
            if l.weights.is_empty() {
                l.weights = weights.clone();
            }
            l
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use allot_core::ids::{Epoch, KeyId, LimitId};
    use allot_core::sync::CounterRef;
    use allot_core::time::WindowIndex;

    use super::*;

    const QUOTA_UNITS: u64 = 900;

    fn region(name: &str) -> RegionId {
        RegionId::new(name)
    }

    fn counter() -> CounterRef {
        CounterRef {
            limit: LimitId::new("api"),
            key: KeyId::new("k"),
            window: WindowIndex(7),
        }
    }

    /// Two regions with equal shares (450 units each) of one strict limit of 900.
    fn two_regions() -> ClusterState {
        let mut state = ClusterState::default();
        for r in ["eu", "us"] {
            let cmd = ClusterCommand::AddRegion {
                region: region(r),
                weight_ppm: None,
            };
            assert!(matches!(
                state.apply(cmd),
                Ok(CommandOutcome::Configured { .. })
            ));
        }
        let put = ClusterCommand::PutLimits {
            version: 10,
            limits: vec![LimitSpec::simple(
                "api",
                QUOTA_UNITS,
                Duration::from_secs(60),
            )],
        };
        assert_eq!(
            state.apply(put).ok().and_then(|o| o.configured_version()),
            Some(10)
        );
        state
    }

    fn grow(r: &str, expected_epoch: u64, allowance_units: u64) -> TableCommand {
        TableCommand::Grow {
            counter: counter(),
            region: region(r),
            expected_epoch: Epoch(expected_epoch),
            allowance_units,
        }
    }

    #[test]
    fn a_limits_put_with_an_old_version_is_refused_and_changes_nothing() {
        let mut state = two_regions();
        let before = state.clone();
        for version in [3, 10] {
            let put = ClusterCommand::PutLimits {
                version,
                limits: vec![LimitSpec::simple("api", 5, Duration::from_secs(1))],
            };
            let outcome = state.apply(put).expect("invariant holds");
            assert_eq!(
                outcome,
                CommandOutcome::Refused(Refusal::StaleVersion {
                    proposed: version,
                    current: 10
                })
            );
            assert_eq!(state, before);
        }
        let put = ClusterCommand::PutLimits {
            version: 11,
            limits: vec![LimitSpec::simple("api", 5, Duration::from_secs(1))],
        };
        assert_eq!(
            state.apply(put).ok().and_then(|o| o.configured_version()),
            Some(11)
        );
        assert_eq!(state.table().config_version(), 11);
    }

    /// An agent takes the deployment's regions from its limits' weights; a put makes the
    /// same regions members at the put's own version, so both ends agree on version and shares.
    #[test]
    fn a_limits_put_makes_the_regions_its_weights_name_members_at_its_version() {
        let mut state = ClusterState::default();
        let mut spec = LimitSpec::simple("api", QUOTA_UNITS, Duration::from_secs(60));
        let ppm = [(region("eu"), 300_000), (region("us"), 300_000)].into();
        spec.weights = RegionWeights::new(ppm).expect("weights");
        let put = ClusterCommand::PutLimits {
            version: 1,
            limits: vec![spec],
        };
        assert_eq!(
            state.apply(put).ok().and_then(|o| o.configured_version()),
            Some(1)
        );
        assert_eq!(state.table().regions(), [region("eu"), region("us")]);
        assert_eq!(state.table().allowance(&counter(), &region("eu")), 270);
        assert!(state.regions().values().all(|m| m.weight_ppm.is_none()));
    }

    #[test]
    fn a_round_above_the_quota_is_refused_by_the_table_and_changes_nothing() {
        let mut state = two_regions();
        // eu holds 450 by default and us the other 450: nothing is free.
        let before = state.clone();
        let outcome = state
            .apply(ClusterCommand::Round(vec![grow("eu", 0, 451)]))
            .expect("invariant holds");
        let CommandOutcome::Round(outcomes) = outcome else {
            panic!("a round answers per command: {outcome:?}");
        };
        assert!(matches!(
            outcomes.as_slice(),
            [ApplyOutcome::Rejected(RejectReason::AboveQuota {
                sum_units: 901,
                quota_units: QUOTA_UNITS,
                ..
            })]
        ));
        assert_eq!(state, before);
    }

    #[test]
    fn a_round_applies_its_commands_in_order_and_refuses_only_the_one_above_the_quota() {
        let mut state = two_regions();
        let release = TableCommand::RequestRelease {
            counter: counter(),
            region: region("us"),
            expected_epoch: Epoch(0),
            units: 100,
        };
        // A release request frees nothing until acknowledged, so the grow still finds no room.
        let round = ClusterCommand::Round(vec![release, grow("eu", 0, 550)]);
        let outcome = state.apply(round).expect("invariant holds");
        let CommandOutcome::Round(outcomes) = outcome else {
            panic!("a round answers per command: {outcome:?}");
        };
        assert_eq!(outcomes[0], ApplyOutcome::Applied);
        assert!(matches!(
            outcomes[1],
            ApplyOutcome::Rejected(RejectReason::AboveQuota { .. })
        ));
        assert_eq!(state.table().allowance(&counter(), &region("eu")), 450);
        assert!(state.table().row(&counter(), &region("us")).is_some());
        assert!(state.table().allowance_sum(&counter()) <= u128::from(QUOTA_UNITS));
    }

    #[test]
    fn a_round_carrying_a_config_change_is_refused_whole() {
        let mut state = two_regions();
        let before = state.clone();
        let set = TableCommand::SetConfig {
            version: 99,
            limits: Vec::new(),
            regions: Vec::new(),
        };
        let outcome = state.apply(ClusterCommand::Round(vec![grow("eu", 0, 450), set]));
        assert_eq!(
            outcome.ok(),
            Some(CommandOutcome::Refused(Refusal::ConfigInRound))
        );
        assert_eq!(state, before);
    }

    #[test]
    fn membership_takes_the_next_version_and_weights_fill_unnamed_shares() {
        let mut state = two_regions();
        let join = ClusterCommand::AddRegion {
            region: region("sa"),
            weight_ppm: Some(400_000),
        };
        assert_eq!(
            state.apply(join).ok().and_then(|o| o.configured_version()),
            Some(11)
        );
        // sa takes 40%; eu and us share the other 60% equally.
        assert_eq!(state.table().allowance(&counter(), &region("sa")), 360);
        assert_eq!(state.table().allowance(&counter(), &region("eu")), 270);
        let too_heavy = ClusterCommand::AddRegion {
            region: region("af"),
            weight_ppm: Some(700_000),
        };
        let before = state.clone();
        assert_eq!(
            state.apply(too_heavy).ok(),
            Some(CommandOutcome::Refused(Refusal::WeightsAboveOne {
                total_ppm: 1_100_000
            }))
        );
        assert_eq!(state, before);
    }

    fn frame(term: u64, regions: &[&str]) -> ClusterCommand {
        let sample = ClockSample {
            offset_nanos: 1_000,
            round_trip_nanos: 2_000,
        };
        ClusterCommand::RecordClockFrame(ClockFrame {
            source: ClockSource {
                leader: 1,
                leader_term: term,
                nodes: vec![NodeClock {
                    node: 2,
                    sample,
                    taken_at: Timestamp::from_unix_nanos(term),
                }],
            },
            regions: regions
                .iter()
                .map(|r| RegionClock {
                    region: region(r),
                    sample,
                    heard_at: Timestamp::from_unix_nanos(term),
                })
                .collect(),
        })
    }

    fn boots(term: u64, r: &str, boot: u64, restored: bool) -> ClusterCommand {
        ClusterCommand::RecordBoots {
            leader_term: term,
            boots: vec![RegionBoots {
                region: region(r),
                boot,
                retired: vec![boot + 100],
                restored,
            }],
        }
    }

    /// A region's sample is of its newest boot only from a frame after that boot was recorded
    /// answered; a new boot, or a restored one answered, makes the sample one of a boot
    /// before. Boots of an earlier leader than the ones recorded, or of a stranger, or with no
    /// boot, change nothing.
    #[test]
    fn recorded_boots_say_whether_the_regions_sample_is_of_the_newest() {
        let mut state = two_regions();
        let of_boot = |s: &ClusterState| s.boots().get(&region("eu")).map(|r| r.sample_of_boot);
        let recorded = Some(CommandOutcome::BootsRecorded);
        assert_eq!(state.apply(frame(5, &["eu"])).ok().map(|_| ()), Some(()));
        assert_eq!(state.apply(boots(5, "eu", 7, false)).ok(), recorded);
        assert_eq!(
            of_boot(&state),
            Some(false),
            "the frame was before the boot"
        );
        state.apply(frame(5, &["eu"])).unwrap();
        assert_eq!(of_boot(&state), Some(true));
        // The same boot again, its retired ones changed: still its sample.
        state.apply(boots(5, "eu", 7, false)).unwrap();
        assert_eq!(of_boot(&state), Some(true));
        // Restored (no sample of its own until answered), then answered.
        state.apply(boots(6, "eu", 3, true)).unwrap();
        assert_eq!(of_boot(&state), Some(false));
        state.apply(frame(6, &["eu"])).unwrap();
        assert_eq!(
            of_boot(&state),
            Some(false),
            "a restored boot's frame holds its boot before's"
        );
        state.apply(boots(6, "eu", 3, false)).unwrap();
        assert_eq!(of_boot(&state), Some(false));
        state.apply(frame(6, &["eu"])).unwrap();
        assert_eq!(of_boot(&state), Some(true));
        let before = state.clone();
        assert_eq!(
            state.apply(boots(5, "eu", 9, false)).ok(),
            Some(CommandOutcome::Refused(Refusal::OlderBoots {
                term: 5,
                recorded: 6
            }))
        );
        assert_eq!(
            state.apply(boots(7, "mars", 9, false)).ok(),
            Some(CommandOutcome::Refused(Refusal::UnknownRegion(region(
                "mars"
            ))))
        );
        assert_eq!(
            state.apply(boots(7, "us", 0, false)).ok(),
            Some(CommandOutcome::Refused(Refusal::BadBoots(region("us"))))
        );
        assert_eq!(state, before);
    }

    /// A frame replaces the samples before it as a whole, with whose clock they are on; one
    /// of an earlier rebalancer (a deposed leader's, committed late) or naming a stranger
    /// changes nothing.
    #[test]
    fn a_clock_frame_replaces_the_samples_and_never_goes_back_to_an_older_clock() {
        let mut state = two_regions();
        let recorded = Some(CommandOutcome::ClocksRecorded);
        assert_eq!(state.apply(frame(5, &["eu", "us"])).ok(), recorded);
        assert_eq!(state.clocks().len(), 2);
        assert_eq!(state.apply(frame(6, &["eu"])).ok(), recorded);
        assert_eq!(state.clocks().keys().collect::<Vec<_>>(), [&region("eu")]);
        assert_eq!(state.clock_source().map(|s| s.leader_term), Some(6));
        let before = state.clone();
        assert_eq!(
            state.apply(frame(5, &["us"])).ok(),
            Some(CommandOutcome::Refused(Refusal::OlderClocks {
                term: 5,
                recorded: 6
            }))
        );
        assert_eq!(
            state.apply(frame(7, &["eu", "mars"])).ok(),
            Some(CommandOutcome::Refused(Refusal::UnknownRegion(region(
                "mars"
            ))))
        );
        assert_eq!(state, before);
    }

    #[test]
    fn clock_samples_are_kept_per_member_and_leave_with_it() {
        let mut state = two_regions();
        let clock = |r: &str| RegionClock {
            region: region(r),
            sample: ClockSample {
                offset_nanos: -5_000,
                round_trip_nanos: 40_000_000,
            },
            heard_at: Timestamp::from_unix_nanos(1_000),
        };
        let stranger = ClusterCommand::RecordClocks(vec![clock("eu"), clock("mars")]);
        assert_eq!(
            state.apply(stranger).ok(),
            Some(CommandOutcome::Refused(Refusal::UnknownRegion(region(
                "mars"
            ))))
        );
        assert!(state.clocks().is_empty());
        let known = ClusterCommand::RecordClocks(vec![clock("eu"), clock("us")]);
        assert_eq!(
            state.apply(known).ok(),
            Some(CommandOutcome::ClocksRecorded)
        );
        assert_eq!(state.clocks().len(), 2);
        let leave = ClusterCommand::RemoveRegion {
            region: region("us"),
        };
        assert!(matches!(
            state.apply(leave),
            Ok(CommandOutcome::Configured { .. })
        ));
        assert_eq!(state.clocks().keys().collect::<Vec<_>>(), [&region("eu")]);
        let again = ClusterCommand::RemoveRegion {
            region: region("us"),
        };
        assert_eq!(
            state.apply(again).ok(),
            Some(CommandOutcome::Refused(Refusal::UnknownRegion(region(
                "us"
            ))))
        );
    }

    /// The driver contract: the leader's rebalancer applies what each entry applied (a
    /// round's commands, a change's `set_config`) and its table stays the replicated one.
    #[test]
    fn the_leaders_rebalancer_follows_the_replicated_table_from_the_outcomes() {
        use allot_core::rebalance::{Coordinator, CoordinatorConfig};

        let now = Timestamp::from_unix_nanos(0);
        let mut state = ClusterState::default();
        let mut leader =
            Coordinator::new(CoordinatorConfig::default(), AllowanceTable::new(), now, 1);
        let release = TableCommand::RequestRelease {
            counter: counter(),
            region: region("us"),
            expected_epoch: Epoch(0),
            units: 50,
        };
        let commands = [
            ClusterCommand::AddRegion {
                region: region("eu"),
                weight_ppm: None,
            },
            ClusterCommand::AddRegion {
                region: region("us"),
                weight_ppm: Some(600_000),
            },
            ClusterCommand::PutLimits {
                version: 4,
                limits: vec![LimitSpec::simple(
                    "api",
                    QUOTA_UNITS,
                    Duration::from_secs(60),
                )],
            },
            ClusterCommand::Round(vec![release, grow("eu", 0, 10_000)]),
            ClusterCommand::AddRegion {
                region: region("ap"),
                weight_ppm: None,
            },
            ClusterCommand::RemoveRegion {
                region: region("eu"),
            },
        ];
        for cmd in commands {
            let round = match &cmd {
                ClusterCommand::Round(cmds) => cmds.clone(),
                _ => Vec::new(),
            };
            match state.apply(cmd).expect("invariant holds") {
                CommandOutcome::Configured { set_config, .. } => {
                    assert!(leader.handle_committed(now, &set_config).is_applied());
                }
                CommandOutcome::Round(outcomes) => {
                    for (c, outcome) in round.iter().zip(outcomes) {
                        assert_eq!(leader.handle_committed(now, c), outcome);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
            assert_eq!(leader.table(), state.table());
        }
    }

    fn files(version: u64, quota: u64, weights: &str) -> ConfigFiles {
        ConfigFiles {
            version,
            merge_domains: false,
            files: vec![allot_core::sync::ConfigFile {
                name: "limits.yaml".to_owned(),
                text: format!(
                    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, \
                     requests_per_unit: {quota}}}\n    allot: {{weights: {weights}}}\n"
                ),
            }],
        }
    }

    #[test]
    fn a_put_of_the_files_in_force_is_answered_with_their_version() {
        let mut state = ClusterState::default();
        assert_eq!(
            state.version_in_force_for(&files(1, 100, "{a: 0.5}"), false),
            None,
            "no files in force"
        );
        let put = ClusterCommand::PutConfig(files(2, 100, "{a: 0.5}"));
        assert_eq!(
            state.apply(put).expect("applies").configured_version(),
            Some(2)
        );
        // A retry of the put (no version: the node computed 3; or version 2 as given).
        assert_eq!(
            state.version_in_force_for(&files(3, 100, "{a: 0.5}"), false),
            Some(2)
        );
        assert_eq!(
            state.version_in_force_for(&files(2, 100, "{a: 0.5}"), true),
            Some(2)
        );
        // Another version asked for, other files, another merge flag: a put like any other.
        assert_eq!(
            state.version_in_force_for(&files(3, 100, "{a: 0.5}"), true),
            None
        );
        assert_eq!(
            state.version_in_force_for(&files(3, 90, "{a: 0.5}"), false),
            None
        );
        let mut merged = files(3, 100, "{a: 0.5}");
        merged.merge_domains = true;
        assert_eq!(state.version_in_force_for(&merged, false), None);
    }

    #[test]
    fn a_config_put_loads_its_files_and_keeps_them_at_the_tables_version() {
        let mut state = ClusterState::default();
        let put = ClusterCommand::PutConfig(files(1, 100, "{a: 0.5, b: 0.5}"));
        let outcome = state.apply(put).expect("applies");
        assert_eq!(outcome.configured_version(), Some(1));
        assert_eq!(state.limits().len(), 1);
        assert_eq!(state.limits()[0].id.as_str(), "d/k");
        assert_eq!(state.regions().len(), 2);
        assert_eq!(
            state.config_files(),
            Some(files(1, 100, "{a: 0.5, b: 0.5}"))
        );
        // Another quota, same regions: in force at 2.
        let put = ClusterCommand::PutConfig(files(2, 70, "{a: 0.6, b: 0.4}"));
        assert_eq!(
            state.apply(put).expect("applies").configured_version(),
            Some(2)
        );
        assert_eq!(state.config_files().map(|f| f.version), Some(2));
        // A membership change moves the version; the files stay, at the new version.
        let join = ClusterCommand::AddRegion {
            region: region("a"),
            weight_ppm: Some(500_000),
        };
        assert_eq!(
            state.apply(join).expect("applies").configured_version(),
            Some(3)
        );
        let in_force = state.config_files().expect("files kept");
        assert_eq!(in_force.version, 3);
        assert_eq!(in_force.files, files(2, 70, "{a: 0.6, b: 0.4}").files);
        // Limits put without files leave no files to send.
        let put = ClusterCommand::PutLimits {
            version: 4,
            limits: state.limits().to_vec(),
        };
        assert!(
            state
                .apply(put)
                .expect("applies")
                .configured_version()
                .is_some()
        );
        assert_eq!(state.config_files(), None);
    }

    #[test]
    fn a_bad_stale_or_region_changing_config_put_is_refused_and_changes_nothing() {
        let mut state = ClusterState::default();
        let put = ClusterCommand::PutConfig(files(5, 100, "{a: 0.5, b: 0.5}"));
        state.apply(put).expect("applies");
        let before = state.clone();
        let refused = |state: &mut ClusterState, put: ConfigFiles| match state
            .apply(ClusterCommand::PutConfig(put))
            .expect("no invariant broken")
        {
            CommandOutcome::Refused(r) => r,
            other => panic!("applied: {other:?}"),
        };
        assert_eq!(
            refused(&mut state, files(5, 90, "{a: 0.5, b: 0.5}")),
            Refusal::StaleVersion {
                proposed: 5,
                current: 5
            }
        );
        let mut bad = files(6, 90, "{a: 0.5, b: 0.5}");
        bad.files[0].text = bad.files[0].text.replace("unit: day", "unit: fortnight");
        let Refusal::BadConfig(why) = refused(&mut state, bad) else {
            panic!("not a bad configuration")
        };
        assert!(why.starts_with("limits.yaml:4:"), "{why}");
        assert!(why.contains("fortnight"), "{why}");
        assert!(matches!(
            refused(&mut state, files(6, 90, "{a: 0.5, c: 0.5}")),
            Refusal::RegionsChanged { .. }
        ));
        let mut empty = files(6, 90, "{a: 0.5, b: 0.5}");
        empty.files.clear();
        assert!(matches!(refused(&mut state, empty), Refusal::BadConfig(_)));
        assert_eq!(state, before);
    }
}
