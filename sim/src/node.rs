//! The seams where the real state machines plug in.
//!
//! The simulator drives an agent's budget machine through [`RegionNode`] and the coordinator
//! through [`CoordinatorNode`], exactly as the daemons drive them (quinn-style: `handle_*` in,
//! `poll_*` out, time passed in). A [`NodeFactory`] builds them for a run. The simulator has
//! no limiter of its own behind these traits: their implementations wrap
//! `allot_core::budget::RegionBudget` and `allot_core::rebalance::Coordinator`, so that what is
//! simulated is the product, not a model of it.
//!
//! The gateways are not behind a trait: the simulator runs `allot_core::gateway::Gateway`
//! itself, and hands the messages it emits to the region's node.

use allot_core::gateway::{LeaseDenial, LeaseGrant, LeaseRelease, LeaseSettle, LeaseWanted};
use allot_core::ids::{KeyId, LeaseId, LimitId, RegionId};
use allot_core::limit::FailureMode;
use allot_core::sync::{CounterEntry, CounterRef, SyncDown, SyncUp};
use allot_core::time::{Timestamp, WindowIndex};
use serde::Serialize;

use crate::scenario::Scenario;

/// Which allocation policy a run uses; every scenario runs under both in one invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Policy {
    /// The product: escalation, rebalancing, the bound.
    Rebalancing,
    /// The baseline: fixed shares `w_r * L` per region, no rebalancing.
    StaticSplit,
}

/// What a factory needs to build one region's agent.
#[derive(Clone, Copy, Debug)]
pub struct RegionSetup<'a> {
    pub scenario: &'a Scenario,
    pub region_index: usize,
    pub region: &'a RegionId,
    pub policy: Policy,
    /// Seed for any randomness of the machine (jitter), derived from the run's seed.
    pub seed: u64,
    /// The configuration the agent reads at its start: the scenario's `reload`-th
    /// `config_reload` (from 0) once that reload's turn for this region has come, `None` for
    /// the scenario's own limits.
    pub reload: Option<usize>,
    /// The operator declared this start a restore from an old copy of the store
    /// (`agent_restore`: `allot agent --restored`).
    pub restored: bool,
}

/// What a factory needs to build the coordinator (leader).
#[derive(Clone, Copy, Debug)]
pub struct CoordinatorSetup<'a> {
    pub scenario: &'a Scenario,
    pub policy: Policy,
    pub seed: u64,
    /// Larger for every new leader (the engine counts leader losses).
    pub leader_term: u64,
}

/// Builds the machines of one run. Shared by the threads that run seeds in parallel.
pub trait NodeFactory: Sync {
    type Region: RegionNode;
    type Coordinator: CoordinatorNode;

    /// A fresh agent, at its region's local time `now`.
    fn region(&self, setup: &RegionSetup<'_>, now: Timestamp) -> Self::Region;

    /// An agent restarted after a crash, from what it had persisted.
    fn restore_region(
        &self,
        setup: &RegionSetup<'_>,
        store: &<Self::Region as RegionNode>::Store,
        now: Timestamp,
    ) -> Self::Region;

    /// A coordinator leader with an empty replicated table. After a leader loss the
    /// simulator builds a new one and replays every committed command into it.
    fn coordinator(&self, setup: &CoordinatorSetup<'_>, now: Timestamp) -> Self::Coordinator;

    /// What a gateway does for `limit` when it cannot reach its agent (the limit's
    /// `failure_mode`).
    fn failure_mode(&self, limit: &LimitId) -> FailureMode;

    /// The table change that installs the configuration of the scenario's `reload`-th
    /// `config_reload` (from 0), committed through the log like any other; `None` where the
    /// machines have no such command.
    fn reload_command(
        &self,
        _reload: usize,
    ) -> Option<<Self::Coordinator as CoordinatorNode>::Command> {
        None
    }

    /// The table change that removes `region` from the quota's split (`removed`) or adds it
    /// back, as an operator's `allot cluster remove-region|add-region` commits it at `now`;
    /// `None` where the machines have no such command.
    fn region_command(
        &self,
        _region: &RegionId,
        _removed: bool,
        _now: Timestamp,
    ) -> Option<<Self::Coordinator as CoordinatorNode>::Command> {
        None
    }

    /// Whether the agents read windows on a corrected clock (`max_clock_uncertainty`): their
    /// readings then follow the true clock rather than their own.
    fn corrects_clocks(&self) -> bool {
        false
    }

    /// Most units a reservation of `reserved_units` under `limit` may use: the reservation
    /// plus the limit's settle cap (`max_settle_overage`). The bound's `settle_overage` term
    /// assumes the spender stops there (for an LLM call, `max_tokens`), so the simulated
    /// spenders do. A factory that states no cap lets them use what they drew.
    fn max_use_units(&self, limit: &LimitId, reserved_units: u64) -> u64 {
        let _ = (limit, reserved_units);
        u64::MAX
    }
}

/// The agent's answer to a gateway's lease request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    Granted(LeaseGrant),
    Denied(LeaseDenial),
}

/// One region's agent: its budget machine, as the agent daemon drives it. Every `now` is on
/// the region's own clock.
///
/// Over `RegionBudget` (`crate::machines`): `handle_lease_wanted` maps to `lease`,
/// `handle_release` to `release`, `handle_settle` to `settle_reservation`, `poll_transmit`/
/// `handle_sync_down`/`poll_timeout`/`handle_timeout` one to one, and `persist` to
/// `drain_dirty`.
pub trait RegionNode: Send {
    /// What survives a crash (the agent's sled tree). The simulator keeps it across restarts,
    /// and copies it for a restart from an earlier copy (`agent_restore`).
    type Store: Clone + Default + Send;

    fn handle_lease_wanted(&mut self, now: Timestamp, want: &LeaseWanted) -> LeaseAnswer;
    fn handle_release(&mut self, now: Timestamp, release: &LeaseRelease);
    fn handle_settle(&mut self, now: Timestamp, settle: &LeaseSettle);
    /// A gateway reports `units` of `key` it admitted on its own, beyond every lease (Envoy's
    /// fallback, `regions[].envoy_fallback_units`): `RegionBudget::record_gateway_fallback`.
    fn handle_gateway_fallback(
        &mut self,
        now: Timestamp,
        limit: &LimitId,
        key: &KeyId,
        units: u64,
    ) {
        let _ = (now, limit, key, units);
    }
    fn handle_sync_down(&mut self, now: Timestamp, msg: SyncDown);
    fn poll_transmit(&mut self, now: Timestamp) -> Option<SyncUp>;
    fn poll_timeout(&self) -> Option<Timestamp>;
    fn handle_timeout(&mut self, now: Timestamp);

    /// The earliest reading the agent's own clock starts from: its store's time for an agent
    /// without a timebase, which runs its clock on from there when the clock reads earlier
    /// (D73; a timebase takes that into its correction instead).
    fn clock_floor(&self) -> Timestamp {
        Timestamp::ZERO
    }

    /// The time the machine reads windows on at `local` on the region's own clock, for a
    /// spend from `lease`: `local` itself, or with a corrected clock (`max_clock_uncertainty`)
    /// its reading, within the window the lease was charged to (a correction may move the
    /// reading past it while the lease is spent). Admissions are judged per window index on
    /// this clock.
    fn window_clock(&self, local: Timestamp, lease: Option<LeaseId>) -> Timestamp {
        let _ = lease;
        local
    }

    /// Writes what the machine has made durable since the last call into `store`. The
    /// simulator calls it after every input, so anything written before an answer survives a
    /// crash after that answer; a machine that defers its flushes keeps records back until its
    /// flush timer and loses them in a crash, as the real one would.
    fn persist(&mut self, store: &mut Self::Store);

    /// [`RegionNode::persist`] for a region the run never restarts: nothing would read its
    /// store, so what it made durable is drained and dropped rather than kept.
    fn discard_durable(&mut self) {
        self.persist(&mut Self::Store::default());
    }

    /// The machine's counters and allowances, for the invariant checks (not a hot path).
    fn observe(&self, out: &mut RegionObservation);

    /// Take the configuration of the scenario's `reload`-th `config_reload` (from 0), as the
    /// agent does on a configuration reload.
    fn reload(&mut self, _now: Timestamp, _reload: usize) {}
}

/// The coordinator leader: rebalancer, allowance table and bound calculator. Its clock is the
/// simulation's true clock.
///
/// Over `Coordinator`: the methods map one to one, with `Command` its
/// `TableCommand` (committed through the simulated replicated log, not openraft). The engine
/// keeps the coordinator's driver contract: after `handle_sync_up` it polls proposals and
/// answers with `poll_sync_down` only once everything polled so far is committed (or lost
/// with its leader).
pub trait CoordinatorNode: Send {
    /// One change to the replicated table.
    type Command: Clone + Send;

    /// Whether the SyncUp is answered: `false` when the coordinator refuses it (a removed
    /// region's), which the daemon does by ending the stream with an error.
    fn handle_sync_up(&mut self, now: Timestamp, msg: SyncUp) -> bool;
    /// The answer to the `SyncUp` numbered `reply_to_seq` just handled from `region`; `None`
    /// when the coordinator refuses to answer it (a region removed since its SyncUp was
    /// taken), which the daemon does by ending the stream with an error.
    fn poll_sync_down(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        reply_to_seq: u64,
    ) -> Option<SyncDown>;
    /// Table changes to replicate; each comes back through `handle_committed` once committed
    /// (after the scenario's commit latency, if the leader is still up).
    fn poll_proposals(&mut self, now: Timestamp) -> Vec<Self::Command>;
    fn handle_committed(&mut self, now: Timestamp, cmd: &Self::Command);
    /// A new leader's start from the committed log, before any input: by default each entry as
    /// if it had just committed.
    fn restore(&mut self, now: Timestamp, log: &[Self::Command]) {
        for cmd in log {
            self.handle_committed(now, cmd);
        }
    }
    fn poll_timeout(&self) -> Option<Timestamp>;
    fn handle_timeout(&mut self, now: Timestamp);

    /// The table and the bound as the coordinator states them now.
    fn observe(&self, now: Timestamp, out: &mut CoordinatorObservation);

    /// The allowance the replicated table gives `region` for a strict counter (its row, or
    /// its default), or `None` where the table has no say (eventual or unknown limits). A
    /// region's own allowance must never exceed it (invariant 2).
    fn table_allowance(&self, counter: &CounterRef, region: &RegionId) -> Option<u64>;

    /// The table's configuration version, where it has one.
    fn config_version(&self) -> Option<u64> {
        None
    }
}

/// A region's state as the checker sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionObservation {
    /// The region's own monotone counter entries (invariants 3 and 6).
    pub entries: Vec<CounterEntry>,
    /// Per counter: net use against what the region may use (invariant 1).
    pub allowances: Vec<AllowanceView>,
    /// The configuration version the region enforces, where it has one: invariant 2 holds
    /// between a region and a table of the same version (a rollout is the bound's reload term).
    pub config_version: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowanceView {
    pub counter: CounterRef,
    /// `granted - refunded`, including outstanding leases.
    pub net_units: u64,
    /// The region's allowance `a_r` plus the policy terms it may add (e.g. open-policy
    /// admissions while partitioned).
    pub limit_units: u64,
    /// A strict, coordinated region's own `a_r` for the counter, held against the
    /// coordinator's table (`None` where the table has no say, or where a restored region
    /// awaiting its first answer is held at its own count and admits nothing more from it).
    pub strict_allowance_units: Option<u64>,
}

/// The coordinator's state as the checker sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorObservation {
    /// Strict-mode rows of the table (invariant 2: `sum <= quota`).
    pub strict_rows: Vec<TableRow>,
    /// The bound per limit and window (true clock) as stated now: the window in progress,
    /// and measured terms of recent windows that only arrive after they end.
    pub bounds: Vec<(LimitId, WindowIndex, Bound)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRow {
    pub counter: CounterRef,
    pub allowance_sum_units: u64,
    pub quota_units: u64,
}

/// The over-admission bound of one limit: named terms and their sum.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bound {
    pub terms: Vec<BoundTerm>,
    /// The sum of the terms: no bound at all while `unbounded` is set.
    pub total_units: u64,
    /// The coordinator could state no bound for the window (no leader watched part of it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unbounded: bool,
    /// With `unbounded`: only because the stating leader did not watch the window, which an
    /// earlier leader's statement may bound (`allot_core::rebalance::Bound::unwatched`).
    #[serde(skip)]
    pub unwatched: bool,
}

/// The term of the bound that windows judged on each region's own clock do not need.
pub const SKEW_TERM: &str = "skew";

impl Bound {
    /// Merges another statement of the bound for the same window: each term at the largest
    /// it was stated (each term bounds its own cause over the whole window, so the largest
    /// value of each holds, even when they peaked at different times), and their sum. The
    /// window is unbounded while no statement bounded it: a leader that started after the
    /// window ended states it unbounded (it did not see it) though its predecessor may have
    /// bounded it; whether some part of the window had no leader at all is for the
    /// measurement to tell (`Measure::leaderless`). And it is unbounded once any statement
    /// says so for a cause it knows of (`unwatched` false): a statement made earlier in the
    /// window, before that cause, does not bound what the cause let in. (A leader that made a
    /// reload and was lost before it stated its term left a bounded statement from just
    /// before; the next leader, which knew the region on the old version, said unbounded.)
    pub fn merge(&mut self, other: &Bound) {
        let known_cause = |b: &Bound| b.unbounded && !b.unwatched;
        let sticky = known_cause(self) || known_cause(other);
        self.unbounded = sticky || (self.unbounded && other.unbounded);
        self.unwatched = self.unbounded && !sticky;
        for t in &other.terms {
            match self.terms.iter_mut().find(|m| m.name == t.name) {
                Some(m) => {
                    m.units = m.units.max(t.units);
                    m.measured_units = m.measured_units.max(t.measured_units);
                }
                None => self.terms.push(t.clone()),
            }
        }
        self.total_units = self
            .terms
            .iter()
            .map(|t| t.units)
            .fold(0, u64::saturating_add);
    }

    /// The bound for windows counted per window index on each region's own clock, where the
    /// skew term does not apply.
    pub fn without_skew_units(&self) -> u64 {
        let skew: u64 = self
            .terms
            .iter()
            .filter(|t| t.name == SKEW_TERM)
            .map(|t| t.units)
            .sum();
        self.total_units.saturating_sub(skew)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BoundTerm {
    pub name: String,
    pub units: u64,
    /// The same term with measured rates in place of configured caps, where the coordinator
    /// states one: how tight the guarantee is (never part of the total).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_units: Option<u64>,
}
