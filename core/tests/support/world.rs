//! Three real `RegionBudget`s and one real `Coordinator`, driven as the agent and coordinator
//! daemons drive them, on one virtual clock shared by everybody (no skew).
//!
//! Agent driver: after every call, write `drain_dirty()` to the store, then `poll_transmit`
//! (and write again) before sending; wake up at `poll_timeout`. A restart rebuilds the region
//! from its store alone.
//!
//! Coordinator driver: a SyncUp is handled, proposals are polled, everything polled so far is
//! committed in log order (applied to the raft state machine's table and to the leader), and
//! only then is the answer built. Proposals polled between SyncUps wait to be committed, in
//! order, until a `Commit` step or the next SyncUp. Losing leadership abandons what waits; the
//! new leader starts over the committed table.

use std::collections::VecDeque;
use std::time::Duration;

use allot_core::budget::{BudgetConfig, CounterState, PersistRecord, RegionBudget};
use allot_core::ids::{KeyId, RegionId, RequestId};
use allot_core::limit::LimitSpec;
use allot_core::rebalance::{AllowanceTable, Coordinator, TableCommand};
use allot_core::time::Timestamp;
use proptest::prelude::*;

use super::calls::{Call, Issued};
use super::checks::Seen;
use super::model::Model;
use super::network::{Direction, Envelope, LinkFaults, Network, Payload};
use super::setup::{KEYS, REGIONS, START, budget_config, coordinator_config, region_ids};
use super::trace;

pub type TestResult = Result<(), TestCaseError>;

/// One step of a run. Indices are taken modulo what exists (regions, limits, leases, calls).
#[derive(Clone, Debug)]
pub enum Step {
    /// A gateway call into a region, with a fresh request id or none.
    Gateway {
        region: usize,
        op: Op,
        with_id: bool,
    },
    /// Send an earlier call with a request id again, unchanged.
    Retry { pick: usize },
    /// Let time pass: messages arrive, timers fire, syncs go out.
    Advance { ms: u64 },
    /// Cut one or both directions of a region's link for a while.
    Cut {
        region: usize,
        up: bool,
        down: bool,
        ms: u64,
    },
    /// The agent crashes and comes back from its store.
    Restart { region: usize },
    /// The leader polls proposals between SyncUps; they wait to be committed.
    Propose,
    /// The oldest waiting proposal commits.
    Commit,
    /// Leadership is lost and a new leader takes over from the committed table. The old
    /// leader's waiting proposals are either lost with its term, or committed by the new
    /// leader before it starts (raft commits a previous term's entries with its first own).
    NewLeader { commit_waiting: bool },
}

/// A gateway call as a step draws it: lease calls pick a lease of the region, their units
/// are a share of what the lease holds.
#[derive(Clone, Debug)]
pub enum Op {
    Acquire {
        limit: usize,
        key: usize,
        cost_units: u64,
    },
    Lease {
        limit: usize,
        key: usize,
        units_wanted: u64,
        ttl_ms: u64,
    },
    Renew {
        pick: usize,
        ttl_ms: u64,
    },
    Release {
        pick: usize,
        unused_pct: u64,
    },
    /// Up to twice the reservation: settle overage.
    Settle {
        pick: usize,
        actual_pct: u64,
    },
}

pub struct Agent {
    pub(super) cfg: BudgetConfig,
    pub(super) budget: RegionBudget,
    /// Every record drained so far, in order (compacted to a snapshot on restart).
    pub(super) store: Vec<PersistRecord>,
}

pub struct World {
    pub(super) now: Timestamp,
    pub(super) limits: Vec<LimitSpec>,
    pub(super) agents: Vec<Agent>,
    pub(super) leader: Coordinator,
    /// The current leader's term: one more for every new leader.
    pub(super) leader_term: u64,
    /// The raft state machine: every committed command, applied in log order.
    pub(super) replica: AllowanceTable,
    /// Polled, not yet committed, in log order.
    pub(super) waiting: VecDeque<TableCommand>,
    pub(super) net: Network,
    pub(super) model: Model,
    /// Calls sent with a request id, for retries.
    pub(super) issued: Vec<Issued>,
    pub(super) next_request_id: u128,
    pub(super) seen: Seen,
    /// The latest events, printed with a failure.
    trace: VecDeque<String>,
}

/// Events kept for a failure's message.
const TRACE_EVENTS: usize = 120;

impl World {
    pub fn new(
        limits: Vec<LimitSpec>,
        faults: LinkFaults,
        seed: u64,
    ) -> Result<Self, TestCaseError> {
        let mut table = AllowanceTable::new();
        let applied = table.apply(TableCommand::SetConfig {
            version: 1,
            limits: limits.clone(),
            regions: region_ids(),
        });
        prop_assert!(applied.is_applied(), "{applied:?}");
        let agents = (0..REGIONS.len())
            .map(|r| {
                let cfg = budget_config(r);
                let mut budget = RegionBudget::new(cfg.clone(), limits.clone())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                budget.set_config_version(1);
                Ok(Agent {
                    cfg,
                    budget,
                    store: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, TestCaseError>>()?;
        let mut world = World {
            now: START,
            leader: Coordinator::new(coordinator_config(), table.clone(), START, 1),
            leader_term: 1,
            replica: table,
            limits,
            agents,
            waiting: VecDeque::new(),
            net: Network::new(faults, seed),
            model: Model::new(),
            issued: Vec::new(),
            next_request_id: 1,
            seen: Seen::default(),
            trace: VecDeque::new(),
        };
        for r in 0..REGIONS.len() {
            world.after_call(r)?;
        }
        world.check()?;
        Ok(world)
    }

    pub fn run(&mut self, step: Step) -> TestResult {
        self.note(format!("step {step:?}"));
        self.run_step(step).map_err(|e| match e {
            TestCaseError::Fail(reason) => {
                let events: Vec<&str> = self.trace.iter().map(String::as_str).collect();
                TestCaseError::fail(format!(
                    "{reason}\n-- latest events:\n{}",
                    events.join("\n")
                ))
            }
            reject => reject,
        })
    }

    /// Remember an event for a failure's message, stamped with the time since the start.
    pub(super) fn note(&mut self, event: String) {
        if self.trace.len() == TRACE_EVENTS {
            self.trace.pop_front();
        }
        let ms = self.now.saturating_duration_since(START).as_millis();
        self.trace.push_back(format!("{ms:>6} ms  {event}"));
    }

    fn run_step(&mut self, step: Step) -> TestResult {
        match step {
            Step::Retry { pick } => {
                if !self.issued.is_empty() {
                    let Issued {
                        region,
                        call,
                        request_id,
                    } = self.issued[pick % self.issued.len()].clone();
                    self.call(region, call, Some(request_id))?;
                }
            }
            Step::Advance { ms } => self.advance(Duration::from_millis(ms))?,
            Step::Cut {
                region,
                up,
                down,
                ms,
            } => {
                let until = self.now + Duration::from_millis(ms);
                let r = region % REGIONS.len();
                if up {
                    self.net.cut(r, Direction::Up, until);
                }
                if down {
                    self.net.cut(r, Direction::Down, until);
                }
            }
            Step::Restart { region } => self.restart(region % REGIONS.len())?,
            Step::Propose => {
                let polled = self.leader.poll_proposals(self.now);
                for cmd in &polled {
                    self.note(format!("proposed {}", trace::command(cmd)));
                }
                self.waiting.extend(polled);
            }
            Step::Commit => {
                if let Some(cmd) = self.waiting.pop_front() {
                    self.commit(cmd)?;
                }
            }
            Step::NewLeader { commit_waiting } => {
                for cmd in std::mem::take(&mut self.waiting) {
                    if commit_waiting {
                        let outcome = self.replica.apply(cmd.clone());
                        self.note(format!(
                            "committed late {} -> {outcome:?}",
                            trace::command(&cmd)
                        ));
                    }
                }
                self.leader_term += 1;
                self.leader = Coordinator::new(
                    coordinator_config(),
                    self.replica.clone(),
                    self.now,
                    self.leader_term,
                );
                self.seen.new_leader();
            }
            Step::Gateway {
                region,
                op,
                with_id,
            } => {
                let r = region % REGIONS.len();
                if let Some(call) = self.call_for(r, op) {
                    let id = with_id.then(|| self.fresh_request_id());
                    self.call(r, call, id)?;
                }
            }
        }
        self.check()
    }

    fn fresh_request_id(&mut self) -> RequestId {
        self.next_request_id += 1;
        RequestId(self.next_request_id)
    }

    pub(super) fn limit_index(&self, id: &allot_core::ids::LimitId) -> Option<usize> {
        self.limits.iter().position(|l| &l.id == id)
    }

    pub(super) fn key_index(key: &KeyId) -> Option<usize> {
        KEYS.iter().position(|k| *k == key.as_str())
    }

    pub(super) fn region_id(r: usize) -> RegionId {
        RegionId::from(REGIONS[r])
    }

    /// What the agent daemon does after every call into the machine: persist, then send the
    /// SyncUp that is due (persisting again first: its acks promise durable releases).
    pub(super) fn after_call(&mut self, r: usize) -> TestResult {
        self.persist(r);
        self.observe_region(r)?;
        let Some(up) = self.agents[r].budget.poll_transmit(self.now) else {
            return Ok(());
        };
        self.persist(r);
        self.observe_up(r, &up)?;
        self.note(format!("{} sends up {}", REGIONS[r], trace::up(&up)));
        self.net.send(
            self.now,
            Envelope {
                region: r,
                payload: Payload::Up(up),
            },
        );
        Ok(())
    }

    fn persist(&mut self, r: usize) {
        let agent = &mut self.agents[r];
        let records = agent.budget.drain_dirty();
        agent.store.extend(records);
    }

    /// Move the clock to `now + by`, delivering messages and firing timers on the way, with
    /// the invariants checked at every instant something happens.
    fn advance(&mut self, by: Duration) -> TestResult {
        let target = self.now + by;
        loop {
            let timers = self.agents.iter().filter_map(|a| a.budget.poll_timeout());
            let next = timers.chain(self.net.next_delivery()).min();
            match next {
                Some(at) if at <= target => {
                    if at > self.now {
                        self.now = at;
                        self.check()?;
                    }
                    self.run_due()?;
                }
                _ => break,
            }
        }
        self.now = target;
        Ok(())
    }

    fn run_due(&mut self) -> TestResult {
        for (r, name) in REGIONS.iter().enumerate() {
            if self.agents[r]
                .budget
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.agents[r].budget.handle_timeout(self.now);
                self.note(format!("{name} timeout"));
                self.after_call(r)?;
                let next = self.agents[r].budget.poll_timeout();
                prop_assert!(
                    next.is_none_or(|t| t > self.now),
                    "region {r} asks to be woken at {next:?}, not after now {:?}",
                    self.now
                );
                self.check()?;
            }
        }
        while let Some(env) = self.net.pop_due(self.now) {
            self.deliver(env)?;
            self.check()?;
        }
        Ok(())
    }

    fn deliver(&mut self, env: Envelope) -> TestResult {
        let r = env.region;
        match env.payload {
            Payload::Up(up) => {
                let seq = up.seq;
                self.note(format!("leader gets {}'s up {seq}", REGIONS[r]));
                self.leader
                    .handle_sync_up(self.now, up)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let polled = self.leader.poll_proposals(self.now);
                self.waiting.extend(polled);
                while let Some(cmd) = self.waiting.pop_front() {
                    self.commit(cmd)?;
                }
                prop_assert!(!self.leader.has_uncommitted_proposals());
                let down = self
                    .leader
                    .poll_sync_down(self.now, &Self::region_id(r), seq)
                    .expect("answered");
                self.observe_down(&down)?;
                self.note(format!(
                    "leader answers {} {}",
                    REGIONS[r],
                    trace::down(&down)
                ));
                self.net.send(
                    self.now,
                    Envelope {
                        region: r,
                        payload: Payload::Down(down),
                    },
                );
            }
            Payload::Down(down) => {
                self.note(format!("{} gets down {}", REGIONS[r], trace::down(&down)));
                self.agents[r].budget.handle_sync_down(self.now, down);
                self.after_call(r)?;
            }
        }
        Ok(())
    }

    /// Commit one command: the raft state machine and the leader apply it alike.
    fn commit(&mut self, cmd: TableCommand) -> TestResult {
        let by_leader = self.leader.handle_committed(self.now, &cmd);
        self.note(format!("commit {} -> {by_leader:?}", trace::command(&cmd)));
        let by_replica = self.replica.apply(cmd);
        prop_assert_eq!(&by_leader, &by_replica);
        prop_assert!(
            self.leader.table() == &self.replica,
            "the leader's table and the committed one differ"
        );
        Ok(())
    }

    /// Crash and restore from the store; nothing admitted may be lost (invariant 6).
    fn restart(&mut self, r: usize) -> TestResult {
        let before = self.own_counters(r);
        let leases_before = self.agents[r].budget.lease_count();
        let agent = &mut self.agents[r];
        let mut budget =
            RegionBudget::restore(agent.cfg.clone(), self.limits.clone(), agent.store.clone())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        budget.set_config_version(1);
        agent.store = budget.snapshot();
        agent.budget = budget;
        for (at, was) in before {
            let Some(was) = was else { continue };
            let now = self.agents[r]
                .budget
                .counter(&self.limits[at.0].id, &KeyId::from(KEYS[at.1]));
            let Some(now) = now else {
                return Err(TestCaseError::fail(format!(
                    "region {r} lost counter {at:?} ({was:?}) in a restart"
                )));
            };
            prop_assert_eq!(
                now.window,
                was.window,
                "restart moved the window of {:?}",
                at
            );
            prop_assert!(
                now.granted_units >= was.granted_units && now.net_units() >= was.net_units(),
                "invariant 6: region {} had {:?} on {:?}, restored {:?}",
                r,
                was,
                at,
                now
            );
        }
        prop_assert_eq!(self.agents[r].budget.lease_count(), leases_before);
        self.after_call(r)
    }

    /// Every (limit, key) of region `r` with its own counter, if it has one.
    pub(super) fn own_counters(&self, r: usize) -> Vec<((usize, usize), Option<CounterState>)> {
        let budget = &self.agents[r].budget;
        let mut out = Vec::new();
        for (l, spec) in self.limits.iter().enumerate() {
            for (k, key) in KEYS.iter().enumerate() {
                out.push(((l, k), budget.counter(&spec.id, &KeyId::from(*key))));
            }
        }
        out
    }

    /// The call an operation stands for in region `r`, if it can be made (a lease call needs
    /// a lease).
    fn call_for(&self, r: usize, op: Op) -> Option<Call> {
        let n_limits = self.limits.len();
        let ms = Duration::from_millis;
        Some(match op {
            Op::Acquire {
                limit,
                key,
                cost_units,
            } => Call::Acquire {
                limit: limit % n_limits,
                key: key % KEYS.len(),
                cost_units,
            },
            Op::Lease {
                limit,
                key,
                units_wanted,
                ttl_ms,
            } => Call::Lease {
                limit: limit % n_limits,
                key: key % KEYS.len(),
                units_wanted,
                ttl: ms(ttl_ms),
            },
            Op::Renew { pick, ttl_ms } => Call::Renew {
                lease: self.model.pick_lease(r, self.now, pick)?.0,
                ttl: ms(ttl_ms),
            },
            Op::Release { pick, unused_pct } => {
                let (lease, l) = self.model.pick_lease(r, self.now, pick)?;
                let unused_units = l.units * unused_pct.min(100) / 100;
                Call::Release {
                    lease,
                    unused_units,
                }
            }
            Op::Settle { pick, actual_pct } => {
                let (lease, l) = self.model.pick_lease(r, self.now, pick)?;
                let actual_units = l.units * actual_pct / 100;
                Call::Settle {
                    lease,
                    actual_units,
                }
            }
        })
    }
}
