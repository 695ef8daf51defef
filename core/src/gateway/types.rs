//! What goes into and out of a [`super::Gateway`]: its configuration, the answers it takes from
//! the agent, and the messages it asks its driver to send.
//!
//! These are the gateway's own small types. A driver (the `client` crate, the simulator) maps
//! them onto the agent's lease API; nothing here knows a wire format.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::ids::{KeyId, LeaseId, LimitId};
use crate::time::Timestamp;

/// Bounds and tuning of one gateway. Every collection the gateway holds is bounded by a field
/// of this struct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Most (limit, key) pairs tracked at once; a key beyond this is refused with
    /// [`Error::TooManyKeys`] until an idle key is dropped.
    pub max_keys: usize,
    /// Most leases held per key at once (the one being spent plus prefetched ones).
    pub max_leases_per_key: usize,
    /// Most messages (releases, settles) waiting for the driver to poll them; beyond this the
    /// newest are dropped and counted in [`GatewayStats`].
    pub max_queued_messages: usize,
    /// Size of the first lease asked for a key, before any rate has been observed.
    pub initial_lease_units: u64,
    /// Largest lease ever asked for, however fast a key is spent.
    pub max_lease_units: u64,
    /// A lease is sized to last this long at the key's observed rate.
    pub lease_target: Duration,
    /// Ask for the next lease once the units held fall below this percentage of the next
    /// lease's size, so the new lease arrives before the old one runs dry.
    pub refill_threshold_percent: u8,
    /// When a lease request goes to the agent anyway, every other key whose held units are
    /// below this percentage of its last grant is refilled in the same round, so a driver
    /// that batches a round's requests (`LeaseBatch`) refills many keys per exchange instead
    /// of one per key. 0 turns it off; otherwise at least `refill_threshold_percent`.
    pub early_refill_percent: u8,
    /// Near the limit a lease takes at most `1 / near_limit_divisor` of the units the agent
    /// said remain, so several gateways share the tail and the last units go one at a time.
    pub near_limit_divisor: u64,
    /// A key with no request for this long gives its unused units back to the agent.
    pub idle_release_after: Duration,
    /// A lease is treated as expired this long before its TTL runs out, so that a gateway whose
    /// clock runs slightly behind the agent's never spends a unit the agent counts as expired;
    /// at most a twentieth of the TTL, since the two clocks drift apart in proportion to the
    /// time measured (a short lease, such as one that ends with its window, keeps most of its
    /// life). Never less than [`super::GATEWAY_CLOCK_DRIFT_PPM`] of the TTL, which covers a
    /// long lease.
    pub expiry_margin: Duration,
    /// A lease request with no answer after this long is abandoned and may be asked again;
    /// a late grant for it is released at once.
    pub lease_request_timeout: Duration,
    /// After the agent could not be reached, requests for the key report
    /// [`super::Spend::Unavailable`] for this long before the gateway asks again.
    pub unavailable_backoff: Duration,
    /// How often [`super::Gateway::handle_timeout`] sweeps keys for expiry and idleness.
    pub sweep_interval: Duration,
    /// Ask the agent to add a refill to the live lease being spent (its `top_up`) rather than
    /// grant another lease: one lease per key to spend, release and settle, and none counted
    /// against the agent's `max_leases_per_key`. The agent grants a new lease instead when
    /// that one has ended or belongs to an earlier window.
    pub refill_in_place: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_keys: 10_000,
            max_leases_per_key: 2,
            max_queued_messages: 20_000,
            initial_lease_units: 10,
            max_lease_units: 1_000,
            lease_target: Duration::from_millis(500),
            refill_threshold_percent: 25,
            early_refill_percent: 50,
            near_limit_divisor: 8,
            idle_release_after: Duration::from_secs(2),
            expiry_margin: Duration::from_millis(50),
            lease_request_timeout: Duration::from_secs(1),
            unavailable_backoff: Duration::from_millis(250),
            sweep_interval: Duration::from_millis(100),
            refill_in_place: true,
        }
    }
}

impl GatewayConfig {
    /// Rejects configurations under which the gateway could not make progress.
    pub fn validate(&self) -> Result<()> {
        let problem = if self.max_keys == 0 {
            "max_keys must be at least 1"
        } else if self.max_leases_per_key == 0 {
            "max_leases_per_key must be at least 1"
        } else if self.initial_lease_units == 0 || self.max_lease_units == 0 {
            "lease sizes must be at least 1 unit"
        } else if self.near_limit_divisor == 0 {
            "near_limit_divisor must be at least 1"
        } else if self.refill_threshold_percent > 100 {
            "refill_threshold_percent must be at most 100"
        } else if self.early_refill_percent > 100 {
            "early_refill_percent must be at most 100"
        } else if self.early_refill_percent != 0
            && self.early_refill_percent < self.refill_threshold_percent
        {
            "early_refill_percent must be 0 (off) or at least refill_threshold_percent"
        } else if self.sweep_interval.is_zero() {
            "sweep_interval must be positive"
        } else if u32::try_from(self.max_keys).is_err() {
            "max_keys must fit in 32 bits"
        } else {
            return Ok(());
        };
        Err(Error::InvalidRequest(format!("gateway config: {problem}")))
    }
}

/// A key's place in the gateway. Cheap to copy; a handle outlives its key only as a stale
/// value that every call recognises (the generation no longer matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyHandle {
    pub(super) slot: u32,
    pub(super) generation: u32,
}

impl KeyHandle {
    /// The handle as one word, for a driver that caches it in an atomic (the `client` crate):
    /// slot in the low half, generation in the high half.
    pub fn to_bits(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.slot)
    }

    /// A handle from [`KeyHandle::to_bits`]. Any word is safe to pass: a handle that names no
    /// key (or a key since forgotten) is answered as unknown.
    pub fn from_bits(bits: u64) -> Self {
        KeyHandle {
            // The two halves of a u64 each fit in u32.
            slot: (bits & u64::from(u32::MAX)) as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

/// Names one lease request, so that its answer finds the key that asked, and an answer to a
/// request the gateway no longer waits for is recognised as late.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseTicket {
    pub handle: KeyHandle,
    pub(super) seq: u32,
}

/// The outcome of one request at the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// Admitted from a held lease, with no network hop.
    Spent(SpendReceipt),
    /// No held lease covers the cost: a lease is asked for (or already on its way). Hold the
    /// request until the agent answers, then spend again.
    Wait,
    /// The agent denied this key recently; the gateway denies without asking until then.
    Denied { retry_after: Duration },
    /// The agent could not be reached recently: apply the limit's failure mode.
    Unavailable,
    /// The handle's key was dropped (idle); look the key up again.
    UnknownKey,
}

/// Which lease paid for a request, for a later [`super::Gateway::settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpendReceipt {
    pub handle: KeyHandle,
    pub lease: LeaseId,
    pub units: u64,
}

/// Units taken at once from one held lease ([`super::Gateway::carve`]), to be spent without
/// the gateway until `expires_at`; settle it with its receipt at the units really spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The lease that paid and the chunk's whole size.
    pub receipt: SpendReceipt,
    /// The lease's expiry on the gateway's clock, already shortened by the expiry margin: no
    /// unit of the chunk may be spent from then on.
    pub expires_at: Timestamp,
}

/// The agent's answer to a lease request that granted units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    pub lease: LeaseId,
    pub units: u64,
    /// How long the lease lives. The gateway counts it from the moment it sent the request on
    /// its own clock (the agent's `expires_at` minus the agent's time of grant), so a slow
    /// answer only shortens the lease and the two clocks never need to agree.
    pub ttl: Duration,
    /// Units the agent can still grant for this key in this window after this grant.
    pub remaining_units: u64,
}

/// The agent's answer to a lease request that granted nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseDenial {
    /// When asking again may succeed; until then the key is denied locally.
    pub retry_after: Duration,
}

/// A message the gateway asks its driver to deliver to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToAgent {
    LeaseWanted(LeaseWanted),
    Release(LeaseRelease),
    Settle(LeaseSettle),
}

/// Ask for a lease of `units` for one key; answer with the ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseWanted {
    pub ticket: LeaseTicket,
    pub limit: LimitId,
    pub key: KeyId,
    pub units: u64,
    /// The cost of the request waiting for this lease (1 for a prefetch): a smaller grant
    /// cannot serve it, so the agent should grant at least this many units or deny.
    pub min_units: u64,
    /// Units of requests this gateway denied by itself for the key since its last request
    /// (while the agent's last denial held): demand the agent would not see otherwise.
    pub denied_units: u64,
    /// The key's request rate at this gateway, denied requests included (`None` before one
    /// could be measured): the agent grants no more than that rate spends before the lease
    /// must end with its window.
    pub rate_units_per_sec: Option<u64>,
    /// The live lease the grant should be added to ([`GatewayConfig::refill_in_place`]); the
    /// answer names it when the agent did, another lease when it could not.
    pub refill: Option<LeaseId>,
}

/// Give back the `units` of a lease that were never spent; the lease ends. Zero units: the
/// lease was spent to its last unit, and the agent may forget it now rather than at expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRelease {
    pub lease: LeaseId,
    pub units: u64,
}

/// A reservation settled differently from its estimate, after the lease that paid for it was
/// released or expired (while the lease is held the gateway settles locally).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSettle {
    pub lease: LeaseId,
    pub delta: SettleDelta,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleDelta {
    /// Fewer units were used than reserved: give these back.
    Refund { units: u64 },
    /// More units were used than reserved and the lease could not cover them: charge these.
    Overage { units: u64 },
}

/// Counters a driver may export; they never influence decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayStats {
    /// Messages dropped because the queue was full (releases and refunds only strand units;
    /// an overage dropped is an under-count, also summed in `overage_dropped_units`).
    pub dropped_messages: u64,
    pub overage_dropped_units: u64,
    /// Grants that arrived for a request the gateway no longer waited for (released at once).
    pub late_grants: u64,
    /// Units that expired unspent in a held lease (the agent counts them as spent).
    pub expired_units: u64,
    /// Lease requests sent early, riding with another key's (`early_refill_percent`).
    pub early_refills: u64,
}
