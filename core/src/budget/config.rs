//! The budget machine's configuration, and the fixed bounds on everything it holds.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::ids::RegionId;
use crate::sync::{MAX_ITEMS_PER_MESSAGE, MIN_ITEMS_PER_MESSAGE};

/// Windows after the current one for which a key keeps pre-issued grants; grants for windows
/// further ahead are dropped (the coordinator pre-issues only for the next window).
pub const MAX_FUTURE_WINDOWS: u64 = 2;

/// Lease and slot ids are made durable a block at a time: the meta record holds a bound
/// every id handed out stays below, moved this far ahead when a grant reaches it. A restart
/// resumes at the bound, skipping at most a block of ids; a grant writes the meta record only
/// once per block instead of every time.
pub const ID_BLOCK: u64 = 1024;

/// Leases one call may hand back ([`super::RegionBudget::release_returned`]): a gateway
/// returns the leases it spent since its last request for the key, a handful at most.
pub const MAX_LEASE_RETURNS: usize = 64;

/// SyncUps remembered until answered; an answer to an older one is still merged for counters,
/// but cannot refresh the view or acknowledge anything (its send time is forgotten).
pub const MAX_INFLIGHT_SYNCS: usize = 32;

/// Release acks waiting for the coordinator to confirm it received them. A release request
/// arriving while this many are pending is not applied (the coordinator resends it).
pub const MAX_PENDING_ACKS: usize = 4 * MAX_ITEMS_PER_MESSAGE;

/// Acknowledged release acks remembered, so that a replayed request id gets the same answer.
pub const RECENT_RELEASES_KEPT: usize = 4096;

/// Ended leases remembered, so that a reservation paid from one can still be settled
/// (`settle_reservation`); the oldest are forgotten first.
pub const ENDED_LEASES_KEPT: usize = 65_536;

/// Keys examined for an idle one to evict when a limit is full and a new key arrives.
pub const EVICTION_SCAN_KEYS: usize = 64;

/// Keys examined per limit by one `handle_timeout` sweep (roll, compact, evict idle ones).
pub const SWEEP_KEYS_PER_TIMEOUT: usize = 1024;

/// Reported keys examined by one `poll_transmit` (those with nothing to send are skipped).
pub const SYNC_SCAN_KEYS: usize = 4 * MAX_ITEMS_PER_MESSAGE;

/// Windows of statistics kept per limit (the current one and the ones just before).
pub const STATS_WINDOWS_KEPT: usize = 4;

/// Changed items tracked for `drain_dirty`. Past this the tracker gives up item by item and
/// the next drain returns a full snapshot behind a `Reset` record, so memory stays bounded
/// even when nobody drains.
pub const MAX_DIRTY_ITEMS: usize = 65_536;

/// The demand estimate never divides by less than `window / DEMAND_WARMUP_DIVISOR` (nor less
/// than one sync interval) of elapsed time, so that a few units at the very start of a long
/// window do not extrapolate into an escalation.
pub const DEMAND_WARMUP_DIVISOR: u32 = 10;

/// Configuration of one region's budget machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetConfig {
    /// This region.
    pub region: RegionId,
    /// The deployment's regions, for equal default shares when a limit configures no weights.
    pub regions: Vec<RegionId>,
    /// Time between two SyncUps.
    pub sync_interval: Duration,
    /// Contact with the coordinator older than this is expired: the partition policy applies.
    pub view_ttl: Duration,
    /// Longest lease (and renewal) granted, whatever the gateway asks for.
    pub lease_ttl_max: Duration,
    /// Keys tracked per limit; a new key beyond it evicts an idle key or is refused.
    pub max_keys_per_limit: usize,
    /// Outstanding leases per key; one more is denied until one ends.
    pub max_leases_per_key: usize,
    /// Idempotency entries kept; past it the oldest is forgotten early.
    pub idempotency_capacity: usize,
    /// How long a request id is remembered.
    pub idempotency_ttl: Duration,
    /// `false`: a single region owns every quota (allowance = `L`, no sync, no escalation).
    pub coordinated: bool,
    /// The widest edge band the driver ever sets (its timebase's maximum uncertainty; `None`:
    /// no timebase). A restored start also closes the windows that begin within it of the
    /// start: the lost copy's end band may have counted units against such a window too.
    pub max_edge_band: Option<Duration>,
    /// Most items of each kind (entries, demand, acks, bound figures) one SyncUp carries,
    /// from `MIN_ITEMS_PER_MESSAGE` to `MAX_ITEMS_PER_MESSAGE` (the default, what the wire
    /// takes); the rest waits for the next interval. Below the default only to exercise the
    /// cap with few keys (the simulator's `message_items`).
    pub message_items: usize,
}

impl BudgetConfig {
    /// A coordinated region with the defaults: 250 ms sync, 2 s view TTL, 30 s leases at most.
    pub fn new(region: RegionId, regions: Vec<RegionId>) -> Self {
        BudgetConfig {
            region,
            regions,
            sync_interval: Duration::from_millis(250),
            view_ttl: Duration::from_secs(2),
            lease_ttl_max: Duration::from_secs(30),
            max_keys_per_limit: 1_000_000,
            max_leases_per_key: 64,
            idempotency_capacity: 100_000,
            idempotency_ttl: Duration::from_secs(300),
            coordinated: true,
            max_edge_band: None,
            message_items: MAX_ITEMS_PER_MESSAGE,
        }
    }

    /// One region that owns every quota outright.
    pub fn single_region(region: RegionId) -> Self {
        BudgetConfig {
            coordinated: false,
            ..BudgetConfig::new(region.clone(), vec![region])
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        let positive = [
            ("sync_interval", self.sync_interval),
            ("view_ttl", self.view_ttl),
            ("lease_ttl_max", self.lease_ttl_max),
            ("idempotency_ttl", self.idempotency_ttl),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                problems.push(format!("budget: {name} must be positive"));
            }
        }
        let counts = [
            ("max_keys_per_limit", self.max_keys_per_limit),
            ("max_leases_per_key", self.max_leases_per_key),
            ("idempotency_capacity", self.idempotency_capacity),
        ];
        for (name, n) in counts {
            if n == 0 {
                problems.push(format!("budget: {name} must be at least 1"));
            }
        }
        if !(MIN_ITEMS_PER_MESSAGE..=MAX_ITEMS_PER_MESSAGE).contains(&self.message_items) {
            problems.push(format!(
                "budget: message_items must be from {MIN_ITEMS_PER_MESSAGE} to \
                 {MAX_ITEMS_PER_MESSAGE}, not {}",
                self.message_items
            ));
        }
        if self.coordinated && !self.regions.contains(&self.region) {
            problems.push(format!(
                "budget: region {} is not among the deployment's regions",
                self.region
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidSettings(problems))
        }
    }
}
