//! The gateway-facing requests and outcomes of the budget machine.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::algo::concurrency::SlotId;
use crate::ids::{KeyId, LeaseId, LimitId, RequestId};
use crate::time::{Timestamp, WindowIndex};

/// One request of a known cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    pub limit: LimitId,
    pub key: KeyId,
    pub cost_units: u64,
    pub request_id: Option<RequestId>,
}

/// Which check decided an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// The region's allowance: a grant, the default share, or `L` for a single region.
    Allowance,
    /// Eventual mode: the region's view of the global sum against `L`.
    GlobalView,
    /// The limit's per-key rate cap (GCRA).
    RateCap,
    /// Closed partition policy: contact with the coordinator expired, nothing more admitted.
    PartitionClosed,
    /// Open partition policy: admitted (or refused) by its rate cap beyond the allowance.
    PartitionOpen,
    /// The limit's kill switch is off: everything admitted, nothing counted.
    Disabled,
    /// The limit has no quota: everything admitted, nothing counted.
    Unlimited,
    /// The key already holds `max_leases_per_key` leases.
    TooManyLeases,
    /// A restored start (docs/budget.md, "Restores"): nothing admitted from the allowance
    /// until the coordinator's first answer, nor ever again in a window that began before the
    /// start.
    Restoring,
}

/// The answer to an acquire, and to a lease that could not be granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// What the gateway does (in shadow mode, also when the limit would have denied).
    pub allowed: bool,
    /// Units the region can still grant this key in this window (after this request).
    pub remaining_units: u64,
    /// On a denial: when the rate cap would pass the same request, or when the window resets
    /// for an allowance refusal; `None` when it never can pass (cost above the quota or burst).
    pub retry_after: Option<Duration>,
    /// Time until the window ends.
    pub reset_after: Duration,
    /// The global quota `L` (0 for an unlimited limit).
    pub limit_units: u64,
    /// Shadow mode: the limit would have denied this request.
    pub shadow_denied: bool,
    pub reason: Reason,
}

/// A lease of up to `units_wanted` units for `ttl` (capped by `lease_ttl_max` and the window).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    pub limit: LimitId,
    pub key: KeyId,
    pub units_wanted: u64,
    /// Fewer units than this are of no use to the caller (the request waiting for the lease
    /// costs this much): grant at least this many or nothing. 0 and 1 both mean "any".
    pub min_units: u64,
    /// Units the caller denied by itself for the key since its last request (a gateway's
    /// negative cache after a denial): counted as refused demand, as if they had come here.
    pub denied_units: u64,
    /// The caller's rate of use of the key, if it knows it: the lease is cut to what that
    /// rate spends before the window ends (a lease's units expire with its window, so more
    /// would be stranded), never below `min_units`.
    pub rate_units_per_sec: Option<u64>,
    pub ttl: Duration,
    pub request_id: Option<RequestId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseOutcome {
    Granted(LeaseGrant),
    /// Nothing granted; `allowed` is false.
    Denied(Decision),
    /// The limit counts nothing (disabled or unlimited): spend freely, no release needed.
    Unmetered {
        units: u64,
        reason: Reason,
    },
}

/// Units charged to the key at grant time; the unused part comes back on release or settle,
/// and is spent if the lease expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub lease: LeaseId,
    /// `min(units_wanted, available)`: shrinks near the limit, down to 1.
    pub units: u64,
    /// Never after the end of `window`: a lease's units belong to one window.
    pub expires_at: Timestamp,
    pub window: WindowIndex,
    /// Units the region can still grant this key in this window, after this lease.
    pub remaining_units: u64,
    /// Shadow mode: the limit would have denied this lease (it got `units_wanted`).
    pub shadow_denied: bool,
    pub reason: Reason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewOutcome {
    pub lease: LeaseId,
    pub expires_at: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseOutcome {
    pub refunded_units: u64,
}

/// A lease its holder is done with, handed back with its next lease request
/// ([`super::RegionBudget::release_returned`]): one call per lease spent instead of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseReturn {
    pub lease: LeaseId,
    pub unused_units: u64,
}

/// A lease [`super::RegionBudget::release_returned`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReturnedLease {
    pub limit: LimitId,
    pub refunded_units: u64,
}

/// How a reservation paid from a lease differs from what was reserved, settled after the
/// gateway stopped holding that lease ([`super::RegionBudget::settle_reservation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReservationDelta {
    /// Fewer units were used than reserved: give these back.
    Refund { units: u64 },
    /// More were used than reserved: charge these.
    Overage { units: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleOutcome {
    /// `reserved - actual` when the lease was not all used.
    pub refunded_units: u64,
    /// `actual - reserved` when it used more: charged even beyond the allowance, and recorded
    /// as settle overage for the bound; at most the limit's `max_settle_overage` times the
    /// reservation.
    pub overage_units: u64,
    /// Used beyond the reservation and above the cap: not charged, counted in the statistics
    /// (`settle_clamped_units`). A spender that stops at the cap never sees it above 0.
    #[serde(default)]
    pub clamped_units: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotOutcome {
    Acquired {
        slot: SlotId,
        expires_at: Timestamp,
        /// Shadow mode: every slot was taken; this one is not counted (releasing it is a no-op).
        shadow_denied: bool,
    },
    Denied {
        retry_after: Option<Duration>,
        in_use: u32,
        max_slots: u32,
    },
    /// The limit has no concurrency cap, or is disabled.
    Unmetered,
}

/// What identifies a mutating call's request beyond its request id: the call's kind and every
/// parameter that can change its outcome (target, amounts, TTL), hashed (xxh3-64 of the
/// length-prefixed parts: fixed and unseeded, since it is persisted). Remembered with the
/// outcome, so that an id sent again with other parameters is refused rather than answered
/// with an outcome that was not for it (`Error::IdempotencyConflict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestFingerprint(pub u64);

impl RequestFingerprint {
    /// Starts the fingerprint of a call of `kind` (one of [`Outcome::kind`]'s names).
    pub(crate) fn of(kind: &'static str) -> FingerprintParts {
        let mut parts = FingerprintParts(Vec::with_capacity(64));
        parts.push(kind.as_bytes());
        parts
    }
}

/// A fingerprint being built: each part is length-prefixed, so no two requests read the same.
pub(crate) struct FingerprintParts(Vec<u8>);

impl FingerprintParts {
    fn push(&mut self, bytes: &[u8]) {
        // Parts are names bounded by the callers' checks, or integers: far below 4 GiB.
        self.0
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    pub fn str(mut self, s: &str) -> Self {
        self.push(s.as_bytes());
        self
    }

    pub fn u64(mut self, n: u64) -> Self {
        self.push(&n.to_le_bytes());
        self
    }

    pub fn duration(self, d: Duration) -> Self {
        self.u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub fn finish(self) -> RequestFingerprint {
        RequestFingerprint(xxhash_rust::xxh3::xxh3_64(&self.0))
    }
}

impl AcquireRequest {
    pub(crate) fn fingerprint(&self) -> RequestFingerprint {
        RequestFingerprint::of("acquire")
            .str(self.limit.as_str())
            .str(self.key.as_str())
            .u64(self.cost_units)
            .finish()
    }
}

impl LeaseRequest {
    /// `denied_units` is left out: it reports demand and changes no outcome, and a caller
    /// retrying may have counted more denials since.
    pub(crate) fn fingerprint(&self, top_up: Option<LeaseId>) -> RequestFingerprint {
        RequestFingerprint::of("lease")
            .str(self.limit.as_str())
            .str(self.key.as_str())
            .u64(self.units_wanted)
            // 0 and 1 both mean "any".
            .u64(self.min_units.max(1))
            .u64(u64::from(self.rate_units_per_sec.is_some()))
            .u64(self.rate_units_per_sec.unwrap_or(0))
            .duration(self.ttl)
            .u64(top_up.map_or(0, |l| l.0))
            .finish()
    }
}

/// What a mutating call answered, remembered under its request id so that a retry gets the
/// same answer and charges nothing again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Acquire(Decision),
    Lease(LeaseOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    Settle(SettleOutcome),
    Slot(SlotOutcome),
}

impl Outcome {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Outcome::Acquire(_) => "acquire",
            Outcome::Lease(_) => "lease",
            Outcome::Renew(_) => "renew",
            Outcome::Release(_) => "release",
            Outcome::Settle(_) => "settle",
            Outcome::Slot(_) => "acquire_slot",
        }
    }
}

/// An outcome kind that the idempotency cache can hold and give back.
pub(crate) trait Remembered: Sized {
    const KIND: &'static str;
    fn to_outcome(&self) -> Outcome;
    fn from_outcome(o: &Outcome) -> Option<Self>;
}

macro_rules! remembered {
    ($t:ty, $variant:ident, $kind:literal) => {
        impl Remembered for $t {
            const KIND: &'static str = $kind;

            fn to_outcome(&self) -> Outcome {
                Outcome::$variant(self.clone())
            }

            fn from_outcome(o: &Outcome) -> Option<Self> {
                match o {
                    Outcome::$variant(v) => Some(v.clone()),
                    _ => None,
                }
            }
        }
    };
}

remembered!(Decision, Acquire, "acquire");
remembered!(LeaseOutcome, Lease, "lease");
remembered!(RenewOutcome, Renew, "renew");
remembered!(ReleaseOutcome, Release, "release");
remembered!(SettleOutcome, Settle, "settle");
remembered!(SlotOutcome, Slot, "acquire_slot");
