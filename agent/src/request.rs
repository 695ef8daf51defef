//! What the agent's calls take and answer, beside the machine's own types: a call's target, and
//! the answers of a check, a lease and a slot request, and the admin key view. The services
//! and the state both use them; they depend on nothing of either.

use std::sync::Arc;
use std::time::Duration;

use allot_core::budget::inspect::KeyView;
use allot_core::budget::{Decision, LeaseGrant, LeaseReturn, Reason, SlotOutcome};
use allot_core::ids::{KeyId, LeaseId};
use allot_core::time::Timestamp;

use crate::limits::RuleInfo;

/// A request's target: a domain and the descriptor's entries, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub domain: String,
    pub entries: Vec<(String, String)>,
}

/// The answer to a check (an acquire, or one descriptor of a ShouldRateLimit).
#[derive(Clone, Debug)]
pub enum Checked {
    /// No rule matched: allowed, nothing counted.
    NoRule,
    /// The machine (or the negative cache) decided.
    Decided {
        rule: Arc<RuleInfo>,
        decision: Decision,
    },
    /// The agent could not decide (the rule tracks as many keys as it may): the rule's
    /// failure mode did.
    Degraded { rule: Arc<RuleInfo>, allowed: bool },
}

impl Checked {
    pub fn allowed(&self) -> bool {
        match self {
            Checked::NoRule => true,
            Checked::Decided { decision, .. } => decision.allowed,
            Checked::Degraded { allowed, .. } => *allowed,
        }
    }
}

/// What a lease call asks for, beside its target and idempotency key.
#[derive(Clone, Debug)]
pub struct LeaseAsk {
    pub units_wanted: u64,
    pub min_units: u64,
    pub ttl: Duration,
    /// Leases the caller is done with, ended before the grant.
    pub returns: Vec<LeaseReturn>,
    /// A live lease of the same target to add the grant to.
    pub top_up: Option<LeaseId>,
}

/// The answer to a lease request.
#[derive(Clone, Debug)]
pub enum Leased {
    NoRule,
    Granted {
        rule: Arc<RuleInfo>,
        grant: LeaseGrant,
    },
    Denied {
        rule: Arc<RuleInfo>,
        decision: Decision,
    },
    /// The rule counts nothing: spend freely.
    Unmetered {
        rule: Arc<RuleInfo>,
        units: u64,
        reason: Reason,
    },
    Degraded {
        rule: Arc<RuleInfo>,
        allowed: bool,
    },
}

/// The answer to a slot request.
#[derive(Clone, Debug)]
pub enum Slotted {
    NoRule,
    Decided {
        rule: Arc<RuleInfo>,
        outcome: SlotOutcome,
    },
    Degraded {
        rule: Arc<RuleInfo>,
        allowed: bool,
    },
}

/// One descriptor of a ShouldRateLimit request: its entries and hits (0: check only).
#[derive(Clone, Debug)]
pub struct RlsDescriptor {
    pub entries: Vec<(String, String)>,
    pub hits: u64,
}

/// What the admin key view shows.
#[derive(Clone, Debug)]
pub struct AdminKey {
    pub rule: Arc<RuleInfo>,
    pub key: KeyId,
    pub view: KeyView,
    pub negative_cache_until: Option<Timestamp>,
}
