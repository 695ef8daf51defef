//! The handle a service holds: keys, decisions from held leases, reservations, shutdown.
//!
//! Keys are spread by hash over `shards` independent [`Gateway`]s, each behind its own mutex
//! (docs/decisions.md, D23). A decision first takes its units from the key's fast budget
//! ([`crate::chunk`], D44): a chunk of a held lease, taken by one compare-and-swap with no
//! lock, until it runs out or its lease expires. Only then does it lock the shard, settle the
//! old chunk and carve the next one ([`Gateway::carve`]). Neither path allocates or makes a
//! system call beyond the clock's read (quanta: the TSC). Reservations and several axes at
//! once decide under the lock, after settling the key's chunk. Everything that talks to the
//! agent runs in the driver task ([`crate::driver`]).

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use allot_core::gateway::{Gateway, GatewayStats, KeyHandle, LeaseRelease, Spend, SpendReceipt};
use allot_core::ids::{KeyId, LimitId};
use allot_core::limit::FailureMode;
use allot_core::time::Timestamp;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::chunk::{Chunks, FastChunk};
use crate::config::ClientConfig;
use crate::driver::SlotAnswer;
use crate::error::Result;
use crate::target::Target;

/// A request that found no lease waits for the agent's answer at most this many times the
/// gateway's `lease_request_timeout` before the failure mode decides. A bound in time, not in
/// wake-ups: near the limit, spenders of one key race for one-unit leases, and a spender that
/// loses a race is not facing an outage.
pub(crate) const SPEND_WAIT_TIMEOUTS: u32 = 2;

/// The answer to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Spent from a held lease.
    Allowed,
    /// The agent refused the key; the same request may pass after `retry_after`.
    Denied { retry_after: Duration },
    /// No lease could pay and the agent could not be asked: the key's failure mode decided
    /// (`allowed` for open, not for closed). Counted in [`ClientStats`].
    Unavailable { allowed: bool },
}

impl Decision {
    pub fn is_allowed(self) -> bool {
        matches!(
            self,
            Decision::Allowed | Decision::Unavailable { allowed: true }
        )
    }
}

/// A key resolved once ([`Client::key`]): spending by it needs no lookup and no allocation.
/// Share it between tasks by reference or in an `Arc`.
#[derive(Debug)]
pub struct Key {
    pub(crate) shard: usize,
    pub(crate) limit: LimitId,
    pub(crate) key: KeyId,
    /// The gateway's handle, as [`KeyHandle::to_bits`]; renewed when the gateway forgot the
    /// key (idle) and it is spent again.
    pub(crate) handle: AtomicU64,
    failure_mode: FailureMode,
    /// The counter's fast budget, shared with every other `Key` of it; `None` when the shard
    /// holds its most budgets or the budget is turned off (`max_chunk_units` 0).
    pub(crate) chunk: Option<Arc<FastChunk>>,
}

impl Key {
    /// The target's domain (the gateway's limit name).
    pub fn domain(&self) -> &str {
        self.limit.as_str()
    }

    /// The gateway's name for the key within its domain.
    pub fn name(&self) -> &str {
        self.key.as_str()
    }

    /// Whether both name one counter (resolved from the same target).
    pub(crate) fn same_key(&self, other: &Key) -> bool {
        self.limit == other.limit && self.key == other.key
    }

    pub(crate) fn failure_mode(&self) -> FailureMode {
        self.failure_mode
    }
}

/// Units reserved for a request whose cost is known only afterwards; give it to
/// [`Client::settle`]. Dropped unsettled, the reservation counts as used in full.
#[derive(Debug)]
#[must_use = "settle the reservation with the units actually used"]
pub struct Reservation {
    /// The shard and receipt of the lease that paid; `None` when the failure mode admitted.
    paid: Option<(usize, SpendReceipt)>,
    units: u64,
}

impl Reservation {
    pub(crate) fn paid(shard: usize, receipt: SpendReceipt) -> Self {
        Reservation {
            paid: Some((shard, receipt)),
            units: receipt.units,
        }
    }

    /// Admitted by the failure mode: nothing to settle.
    pub(crate) fn unpaid(units: u64) -> Self {
        Reservation { paid: None, units }
    }

    pub fn units(&self) -> u64 {
        self.units
    }

    /// Admitted by the key's failure mode while the agent was unreachable: nothing to settle.
    pub fn admitted_by_failure_mode(&self) -> bool {
        self.paid.is_none()
    }
}

/// Counters a service may export; they never influence decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Lease RPCs sent (`Lease` and `LeaseBatch` calls).
    pub lease_rpcs: u64,
    /// Lease requests (refills and new leases) those calls carried: more than `lease_rpcs`
    /// when keys running low together were refilled in one `LeaseBatch`.
    pub lease_requests: u64,
    /// Release RPCs sent (hand-backs that found no lease request to ride with).
    pub release_rpcs: u64,
    /// RPCs that failed (transport or status).
    pub rpc_errors: u64,
    /// Lease requests the agent refused as not this gateway's to make (`UNAUTHENTICATED`,
    /// `PERMISSION_DENIED`: its callers file, D59); the key reads as denied, not unavailable.
    pub refused_callers: u64,
    /// Connections lost or attempts failed, each followed by a backoff.
    pub reconnects: u64,
    /// Decisions taken by a failure mode while the agent was unreachable.
    pub failed_open: u64,
    pub failed_closed: u64,
    /// Hand-backs dropped, and slot releases left to their TTL, because
    /// `max_pending_returns` were waiting.
    pub dropped_returns: u64,
    /// Reservation differences settled after their lease ended: the lease API settles a live
    /// lease only, so these are not sent (refunds are lost, overages not charged).
    pub unsent_refund_units: u64,
    pub unsent_overage_units: u64,
    /// The gateways' own counters, summed over shards.
    pub gateway: GatewayStats,
}

/// Counters shared by the client and its driver.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub lease_rpcs: AtomicU64,
    pub lease_requests: AtomicU64,
    pub release_rpcs: AtomicU64,
    pub rpc_errors: AtomicU64,
    pub refused_callers: AtomicU64,
    pub reconnects: AtomicU64,
    pub failed_open: AtomicU64,
    pub failed_closed: AtomicU64,
    pub dropped_returns: AtomicU64,
    pub unsent_refund_units: AtomicU64,
    pub unsent_overage_units: AtomicU64,
}

/// One gateway and the waiters for its answers. Aligned so two shards never share a cache
/// line (a spender on one would slow a spender on the other).
#[repr(align(128))]
pub(crate) struct Shard {
    gateway: Mutex<Gateway>,
    /// The fast budgets of the shard's counters. Locked only with `gateway` held, after it.
    chunks: Mutex<Chunks>,
    /// Woken when the driver fed an answer (or an outage) to this shard.
    pub answered: Notify,
}

impl Shard {
    /// The gateway. A panic while it was held is a bug in the gateway (its only panics are
    /// its invariant assertions); the lock is taken over rather than the panic spread to every
    /// later spender of the shard's keys.
    pub fn lock(&self) -> MutexGuard<'_, Gateway> {
        self.gateway.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fast budgets; lock the gateway first.
    fn chunks(&self) -> MutexGuard<'_, Chunks> {
        // A map changed by single inserts and removals: whole after any panic.
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles every fast budget, then gives every unused unit back (shutdown).
    pub fn release_all(&self, now: Timestamp) -> MutexGuard<'_, Gateway> {
        let mut gateway = self.lock();
        self.chunks().settle_all(&mut gateway, now);
        gateway.release_all(now);
        gateway
    }
}

/// What the client and the driver share.
pub(crate) struct Shared {
    pub config: ClientConfig,
    pub shards: Box<[Shard]>,
    /// quanta's clock: the TSC where it is stable (a few nanoseconds, no system call), the
    /// OS monotonic clock otherwise; what governor reads by default.
    epoch: quanta::Instant,
    pub wake_driver: Notify,
    pub counters: Counters,
    /// Ended leases to hand back, with the next lease request or as Release calls.
    pub pending_returns: Mutex<VecDeque<LeaseRelease>>,
    pub connected: AtomicBool,
    /// The driver's connection, for the calls a spender makes itself (slots); `None` while
    /// the agent is unreachable.
    pub conn: Mutex<Option<crate::driver::Conn>>,
    /// Slots whose guards were dropped, for the driver to release (bounded like the returns).
    pub pending_slots: Mutex<VecDeque<u64>>,
}

impl Shared {
    /// The gateways' clock: monotonic, from the client's start.
    #[inline]
    pub fn now(&self) -> Timestamp {
        let elapsed = quanta::Instant::now().saturating_duration_since(self.epoch);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        Timestamp::from_unix_nanos(nanos)
    }

    pub fn pending_returns(&self) -> MutexGuard<'_, VecDeque<LeaseRelease>> {
        self.pending_returns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn conn(&self) -> MutexGuard<'_, Option<crate::driver::Conn>> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn pending_slots(&self) -> MutexGuard<'_, VecDeque<u64>> {
        self.pending_slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a slot's release; past the bound the slot is left to its TTL (counted).
    pub fn push_slot_release(&self, slot_id: u64) {
        let mut pending = self.pending_slots();
        if pending.len() >= self.config.max_pending_returns {
            self.counters
                .dropped_returns
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.push_back(slot_id);
    }

    /// Queues a hand-back; the oldest is dropped when full (its units then count as spent at
    /// the agent until the lease expires: stranded, never admitted twice).
    pub fn push_return(&self, release: LeaseRelease) {
        // Lease 0 is the agent's "spend freely" lease: nothing to give back.
        if release.lease.0 == 0 {
            return;
        }
        let mut pending = self.pending_returns();
        if pending.len() >= self.config.max_pending_returns {
            pending.pop_front();
            self.counters
                .dropped_returns
                .fetch_add(1, Ordering::Relaxed);
        }
        pending.push_back(release);
    }
}

enum Attempt {
    Spent(SpendReceipt),
    /// Paid from the key's fast budget (no receipt: the budget's chunk is settled whole).
    FromChunk,
    Decided(Decision),
    Wait,
}

/// The gateway library's handle. Create it inside a tokio runtime: it spawns its driver.
pub struct Client {
    pub(crate) shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl Client {
    /// Starts the client and its driver task; the driver connects to the agent in the
    /// background (until it does, keys without leases follow their failure mode).
    pub fn start(config: ClientConfig) -> Result<Client> {
        let (client, stopped) = Client::detached(config)?;
        let driver = tokio::spawn(crate::driver::run(client.shared.clone(), stopped));
        *client.driver.lock().unwrap_or_else(PoisonError::into_inner) = Some(driver);
        Ok(client)
    }

    /// The client without its driver task (tests feed the gateways by hand).
    pub(crate) fn detached(config: ClientConfig) -> Result<(Client, watch::Receiver<bool>)> {
        config.validate()?;
        crate::driver::check_address(&config)?;
        let shards = (0..config.shards)
            .map(|_| {
                Ok(Shard {
                    gateway: Mutex::new(Gateway::new(config.gateway.clone())?),
                    chunks: Mutex::new(Chunks::new(config.gateway.max_keys)),
                    answered: Notify::new(),
                })
            })
            .collect::<Result<Box<[Shard]>>>()?;
        let shared = Arc::new(Shared {
            config,
            shards,
            epoch: quanta::Instant::now(),
            wake_driver: Notify::new(),
            counters: Counters::default(),
            pending_returns: Mutex::new(VecDeque::new()),
            connected: AtomicBool::new(false),
            conn: Mutex::new(None),
            pending_slots: Mutex::new(VecDeque::new()),
        });
        let (stop, stopped) = watch::channel(false);
        let client = Client {
            shared,
            stop,
            driver: Mutex::new(None),
        };
        Ok((client, stopped))
    }

    /// Resolves a target once (this allocates; keep the [`Key`] for the hot path).
    pub fn key(&self, target: &Target) -> Result<Key> {
        let (limit, key) = target.ids();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&limit, &key).hash(&mut hasher);
        // shards is a power of two, so the mask keeps the index in range.
        let shard = (hasher.finish() as usize) & (self.shared.shards.len() - 1);
        let now = self.shared.now();
        let (handle, chunk) = {
            let shard = &self.shared.shards[shard];
            let mut gateway = shard.lock();
            let handle = gateway.key(now, &limit, &key)?;
            let chunk = (self.shared.config.max_chunk_units > 0)
                .then(|| shard.chunks().get_or_add(&mut gateway, now, &limit, &key))
                .flatten();
            (handle, chunk)
        };
        Ok(Key {
            chunk,
            shard,
            failure_mode: self.shared.config.failure_mode_of(&target.domain),
            limit,
            key,
            handle: AtomicU64::new(handle.to_bits()),
        })
    }

    /// Decides a request of `cost_units` (0 is read as 1) from the key's held lease, with no
    /// network hop. With no lease yet (a new key, or one spent faster than refilled) it waits
    /// for the driver's lease request to be answered.
    pub async fn spend(&self, key: &Key, cost_units: u64) -> Decision {
        if let Some(decision) = self.try_spend(key, cost_units) {
            return decision;
        }
        match self.reserve(key, cost_units).await {
            Ok(r) if r.admitted_by_failure_mode() => Decision::Unavailable { allowed: true },
            Ok(_) => Decision::Allowed,
            Err(decision) => decision,
        }
    }

    /// The synchronous fast path: `None` when no held lease can decide and the caller would
    /// have to wait for the agent ([`Client::spend`] waits).
    #[inline]
    pub fn try_spend(&self, key: &Key, cost_units: u64) -> Option<Decision> {
        let units = cost_units.max(1);
        let now = self.shared.now();
        if key.chunk.as_ref().is_some_and(|c| c.try_take(now, units)) {
            return Some(Decision::Allowed);
        }
        self.try_spend_locked(key, now, units)
    }

    /// The slow half of [`Client::try_spend`], once per chunk: kept out of line so the fast
    /// half stays a few instructions with no registers to save.
    #[cold]
    #[inline(never)]
    fn try_spend_locked(&self, key: &Key, now: Timestamp, units: u64) -> Option<Decision> {
        let max_chunk_units = self.shared.config.max_chunk_units;
        match self.attempt(key, now, units, max_chunk_units) {
            Attempt::Spent(_) | Attempt::FromChunk => Some(Decision::Allowed),
            Attempt::Decided(d) => Some(d),
            Attempt::Wait => {
                self.shared.wake_driver.notify_one();
                None
            }
        }
    }

    /// Reserves `units` (an estimate: input plus the most output) for a request whose cost is
    /// known only afterwards. `Err` is the refusal.
    pub async fn reserve(&self, key: &Key, units: u64) -> Result<Reservation, Decision> {
        let units = units.max(1);
        let shard = &self.shared.shards[key.shard];
        let wait = self.shared.config.gateway.lease_request_timeout;
        let deadline = tokio::time::Instant::now() + wait * SPEND_WAIT_TIMEOUTS;
        while tokio::time::Instant::now() < deadline {
            let answered = shard.answered.notified();
            tokio::pin!(answered);
            // Registered before the attempt, so an answer between the two is not missed.
            answered.as_mut().enable();
            match self.attempt(key, self.shared.now(), units, units) {
                Attempt::Spent(receipt) => {
                    return Ok(Reservation {
                        paid: Some((key.shard, receipt)),
                        units,
                    });
                }
                Attempt::Decided(Decision::Unavailable { allowed: true }) => {
                    return Ok(Reservation { paid: None, units });
                }
                Attempt::Decided(d) => return Err(d),
                Attempt::FromChunk => unreachable_from_chunk(),
                Attempt::Wait => {}
            }
            self.shared.wake_driver.notify_one();
            // A timeout is not an error: the next attempt sees what the gateway decided.
            let _ = tokio::time::timeout_at(deadline, answered).await;
        }
        match self.failure_mode(key) {
            Decision::Unavailable { allowed: true } => Ok(Reservation { paid: None, units }),
            d => Err(d),
        }
    }

    /// Settles a reservation at the units really used: the difference is refunded to (or
    /// taken from) the lease that paid, while it is held.
    pub fn settle(&self, reservation: Reservation, actual_units: u64) {
        let Some((shard, receipt)) = reservation.paid else {
            return;
        };
        self.shared.shards[shard]
            .lock()
            .settle(self.shared.now(), receipt, actual_units);
        // A settle after the lease ended is a message for the driver.
        self.shared.wake_driver.notify_one();
    }

    /// Takes a concurrency slot for `target` (one call to the agent: slots are counted across
    /// gateways). Dropping the guard gives the slot back; the rule's slot TTL covers a crash.
    /// While the agent is unreachable the domain's failure mode decides (counted).
    pub async fn acquire_slot(&self, target: &Target) -> Result<SlotGuard, Decision> {
        let failure_mode = self.shared.config.failure_mode_of(&target.domain);
        match crate::driver::acquire_slot(&self.shared, target).await {
            SlotAnswer::Acquired { slot_id } => Ok(SlotGuard {
                slot_id,
                shared: self.shared.clone(),
            }),
            SlotAnswer::Denied { retry_after } => Err(Decision::Denied { retry_after }),
            SlotAnswer::Unreachable => {
                self.shared.wake_driver.notify_one();
                match self.count_failure_mode(failure_mode) {
                    Decision::Unavailable { allowed: true } => Ok(SlotGuard {
                        slot_id: 0,
                        shared: self.shared.clone(),
                    }),
                    d => Err(d),
                }
            }
        }
    }

    /// The failure mode's decision for a request of `domain` that cannot be counted at all (its
    /// key cannot be resolved), counted like any other.
    #[cfg(feature = "tower")]
    pub(crate) fn failure_mode_decision(&self, domain: &str) -> Decision {
        self.count_failure_mode(self.shared.config.failure_mode_of(domain))
    }

    /// Units the key holds in live leases now, its fast budget's included.
    pub fn held_units(&self, key: &Key) -> u64 {
        let handle = KeyHandle::from_bits(key.handle.load(Ordering::Relaxed));
        let now = self.shared.now();
        let gateway = self.shared.shards[key.shard].lock();
        // Under the lock, so no chunk moves between the budget and the leases meanwhile.
        let in_chunk = key.chunk.as_ref().map_or(0, |c| c.units_at(now));
        gateway.held_units(now, handle) + in_chunk
    }

    /// Whether the driver holds a working connection to the agent.
    pub fn connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> ClientStats {
        let c = &self.shared.counters;
        let mut gateway = GatewayStats::default();
        for shard in self.shared.shards.iter() {
            let s = shard.lock().stats();
            gateway.dropped_messages += s.dropped_messages;
            gateway.overage_dropped_units += s.overage_dropped_units;
            gateway.late_grants += s.late_grants;
            gateway.expired_units += s.expired_units;
            gateway.early_refills += s.early_refills;
        }
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            lease_rpcs: get(&c.lease_rpcs),
            lease_requests: get(&c.lease_requests),
            release_rpcs: get(&c.release_rpcs),
            rpc_errors: get(&c.rpc_errors),
            refused_callers: get(&c.refused_callers),
            reconnects: get(&c.reconnects),
            failed_open: get(&c.failed_open),
            failed_closed: get(&c.failed_closed),
            dropped_returns: get(&c.dropped_returns),
            unsent_refund_units: get(&c.unsent_refund_units),
            unsent_overage_units: get(&c.unsent_overage_units),
            gateway,
        }
    }

    /// Stops the driver after giving every unused leased unit back to the agent (within
    /// `shutdown_timeout`). Dropping the client does the same, without waiting.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let driver = self
            .driver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(driver) = driver {
            let _ = driver.await;
        }
    }

    /// Decides under the shard's lock: settles the key's chunk, then takes a new one of up to
    /// `max_chunk_units` of which the request takes `units` (`max_chunk_units == units`: a
    /// plain spend, with the receipt). `now` was read before the lock.
    fn attempt(&self, key: &Key, now: Timestamp, units: u64, max_chunk_units: u64) -> Attempt {
        let mut gateway = self.shared.shards[key.shard].lock();
        let chunk = key.chunk.as_deref();
        if let Some(chunk) = chunk {
            // Another spender may have carved a chunk while this one waited for the lock.
            if max_chunk_units > units && chunk.try_take(now, units) {
                return Attempt::FromChunk;
            }
            chunk.settle(&mut gateway, now);
        }
        let max_units = if chunk.is_some() {
            max_chunk_units.max(units)
        } else {
            units
        };
        let mut handle = KeyHandle::from_bits(key.handle.load(Ordering::Relaxed));
        let mut carved = gateway.carve(now, handle, units, max_units);
        if carved == Err(Spend::UnknownKey) {
            // Forgotten while idle: add it again (rare, and the only allocation here).
            match gateway.key(now, &key.limit, &key.key) {
                Ok(h) => {
                    handle = h;
                    key.handle.store(h.to_bits(), Ordering::Relaxed);
                    carved = gateway.carve(now, handle, units, max_units);
                }
                Err(_) => carved = Err(Spend::Unavailable),
            }
        }
        match (carved, chunk) {
            (Ok(c), Some(chunk)) if c.receipt.units > units => {
                chunk.install(c, units);
                Attempt::FromChunk
            }
            (Ok(c), _) => Attempt::Spent(c.receipt),
            (Err(spend), _) => {
                drop(gateway);
                self.refused(key, spend)
            }
        }
    }

    fn refused(&self, key: &Key, spend: Spend) -> Attempt {
        match spend {
            Spend::Denied { retry_after } => Attempt::Decided(Decision::Denied { retry_after }),
            Spend::Unavailable | Spend::UnknownKey => Attempt::Decided(self.failure_mode(key)),
            Spend::Wait => Attempt::Wait,
            Spend::Spent(_) => unreachable_spent(),
        }
    }

    pub(crate) fn key_failure_mode(&self, key: &Key) -> Decision {
        self.failure_mode(key)
    }

    fn failure_mode(&self, key: &Key) -> Decision {
        self.count_failure_mode(key.failure_mode)
    }

    fn count_failure_mode(&self, mode: FailureMode) -> Decision {
        let c = &self.shared.counters;
        let allowed = mode == FailureMode::Open;
        let counter = if allowed {
            &c.failed_open
        } else {
            &c.failed_closed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Decision::Unavailable { allowed }
    }
}

#[cold]
fn unreachable_from_chunk() -> ! {
    panic!("a reservation takes no chunk: it carves exactly its units")
}

#[cold]
fn unreachable_spent() -> ! {
    panic!("Gateway::carve refuses with an outcome other than Spent")
}

/// A held concurrency slot; dropping it gives the slot back (through the driver, so drop
/// never blocks).
#[derive(Debug)]
#[must_use = "the slot is given back when the guard is dropped"]
pub struct SlotGuard {
    /// 0: nothing to give back (no concurrency cap, or admitted by the failure mode).
    slot_id: u64,
    shared: Arc<Shared>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.slot_id != 0 {
            self.shared.push_slot_release(self.slot_id);
            self.shared.wake_driver.notify_one();
        }
    }
}

/// What the layer's tests need of the driver: answering a key's lease requests by hand.
#[cfg(all(test, feature = "tower"))]
impl Client {
    pub(crate) fn answer_lease_requests(
        &self,
        key: &Key,
        mut answer: impl FnMut(&mut Gateway, Timestamp, allot_core::gateway::LeaseWanted),
    ) -> usize {
        let shard = &self.shared.shards[key.shard];
        let mut answered = 0;
        {
            let mut gateway = shard.lock();
            let now = self.shared.now();
            while let Some(message) = gateway.poll_transmit(now) {
                if let allot_core::gateway::ToAgent::LeaseWanted(w) = message {
                    answer(&mut gateway, now, w);
                    answered += 1;
                }
            }
        }
        shard.answered.notify_waiters();
        answered
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The driver sees the stop and gives units back on its own.
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use allot_core::gateway::{LeaseGrant, ToAgent};
    use allot_core::ids::LeaseId;

    use super::*;

    const GRANTED_UNITS: u64 = 10_000;
    const SPENDERS: usize = 4;

    /// Grants `units` to the key's pending lease request by hand, as the driver would.
    fn grant(client: &Client, key: &Key, units: u64) {
        grant_for(client, key, units, Duration::from_secs(60));
    }

    fn grant_for(client: &Client, key: &Key, units: u64, ttl: Duration) {
        let shard = &client.shared.shards[key.shard];
        let mut gateway = shard.lock();
        let now = client.shared.now();
        let Some(ToAgent::LeaseWanted(w)) = gateway.poll_transmit(now) else {
            panic!("the key asked for a lease");
        };
        gateway.handle_lease_granted(
            now,
            w.ticket,
            LeaseGrant {
                lease: LeaseId(7),
                units,
                ttl,
                remaining_units: 1_000_000,
            },
        );
    }

    /// The messages the key's shard has for the agent now.
    fn messages(client: &Client, key: &Key) -> Vec<ToAgent> {
        let mut gateway = client.shared.shards[key.shard].lock();
        let now = client.shared.now();
        std::iter::from_fn(|| gateway.poll_transmit(now)).collect()
    }

    /// Units given back to the agent by the messages.
    fn returned_units(messages: &[ToAgent]) -> u64 {
        messages
            .iter()
            .map(|m| match m {
                ToAgent::Release(r) => r.units,
                _ => 0,
            })
            .sum()
    }

    /// A thread spending `cost_units` at a time until a spend is not allowed; returns what it
    /// admitted.
    fn spend_until_refused(
        client: Arc<Client>,
        key: Arc<Key>,
        cost_units: u64,
    ) -> std::thread::JoinHandle<u64> {
        std::thread::spawn(move || {
            let mut admitted = 0u64;
            while client.try_spend(&key, cost_units) == Some(Decision::Allowed) {
                admitted += cost_units;
            }
            admitted
        })
    }

    fn joined_sum(spenders: Vec<std::thread::JoinHandle<u64>>) -> u64 {
        spenders
            .into_iter()
            .map(|s| s.join().expect("spender"))
            .sum()
    }

    /// Several threads, each with its own `Key` of one counter (so one shared fast budget),
    /// spend a lease to its last unit: never more than granted, and all of it.
    #[test]
    fn spenders_sharing_a_fast_budget_admit_exactly_what_was_granted() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.gateway.refill_threshold_percent = 0;
        config.max_chunk_units = 64;
        let (client, _stopped) = Client::detached(config).expect("client");
        let client = Arc::new(client);
        let target = Target::new("d").entry("k", "shared");
        let first = client.key(&target).expect("key");
        assert_eq!(client.try_spend(&first, 1), None, "no lease yet: wait");
        grant(&client, &first, GRANTED_UNITS);
        let spenders: Vec<_> = (0..SPENDERS)
            .map(|i| {
                let client = client.clone();
                let key = client.key(&target).expect("key");
                spend_until_refused(client, Arc::new(key), 1 + i as u64 % 3)
            })
            .collect();
        let admitted = joined_sum(spenders);
        let left = client.held_units(&first);
        assert!(admitted <= GRANTED_UNITS, "admitted {admitted}");
        // Costs of 2 and 3 may leave a unit or two none of them can take.
        assert_eq!(admitted + left, GRANTED_UNITS, "left {left}");
        assert!(left < 3, "left {left}");
    }

    /// Shutdown settles the fast budget before giving the leases back: a chunk's unspent units
    /// reach the agent with the lease's.
    #[test]
    fn shutdown_gives_back_what_a_fast_budget_did_not_spend() {
        let (client, _stopped) =
            Client::detached(ClientConfig::new("http://127.0.0.1:1")).expect("client");
        let key = client.key(&Target::new("d").entry("k", "v")).expect("key");
        assert_eq!(client.try_spend(&key, 1), None);
        grant(&client, &key, 1_000);
        for _ in 0..10 {
            assert_eq!(client.try_spend(&key, 1), Some(Decision::Allowed));
        }
        let in_chunk = key.chunk.as_ref().map(|c| c.units_at(client.shared.now()));
        assert_eq!(in_chunk, Some(240), "a chunk of 250, 10 spent");
        assert_eq!(client.held_units(&key), 990);
        let now = client.shared.now();
        drop(client.shared.shards[key.shard].release_all(now));
        assert_eq!(returned_units(&messages(&client, &key)), 990);
        assert_eq!(client.held_units(&key), 0);
    }

    /// Past its lease's expiry nothing more is spent from a chunk: the request waits for a new
    /// lease, and the chunk's leftover is the agent's to refund (it counts the lease spent).
    #[test]
    fn nothing_is_spent_from_a_chunk_after_its_lease_expired() {
        const TTL: Duration = Duration::from_millis(200);
        let (client, _stopped) =
            Client::detached(ClientConfig::new("http://127.0.0.1:1")).expect("client");
        let key = client.key(&Target::new("d").entry("k", "v")).expect("key");
        assert_eq!(client.try_spend(&key, 1), None);
        grant_for(&client, &key, 1_000, TTL);
        assert_eq!(client.try_spend(&key, 1), Some(Decision::Allowed));
        assert_eq!(client.held_units(&key), 999);
        messages(&client, &key);
        std::thread::sleep(TTL);
        assert_eq!(client.held_units(&key), 0);
        assert_eq!(client.try_spend(&key, 1), None, "expired: wait for a lease");
        let refunded: u64 = messages(&client, &key)
            .iter()
            .map(|m| match m {
                ToAgent::Settle(s) => match s.delta {
                    allot_core::gateway::SettleDelta::Refund { units } => units,
                    allot_core::gateway::SettleDelta::Overage { .. } => panic!("{s:?}"),
                },
                _ => 0,
            })
            .sum();
        assert_eq!(refunded, 249, "the chunk's 249 unspent units");
    }

    /// A key the idle sweep forgot keeps spending what its chunk holds (counted spent at the
    /// gateway when carved), then asks for a lease again; nothing is counted twice.
    #[test]
    fn a_key_forgotten_while_idle_spends_its_chunk_then_asks_again() {
        let (client, _stopped) =
            Client::detached(ClientConfig::new("http://127.0.0.1:1")).expect("client");
        let key = client.key(&Target::new("d").entry("k", "v")).expect("key");
        assert_eq!(client.try_spend(&key, 1), None);
        grant(&client, &key, 1_000);
        assert_eq!(client.try_spend(&key, 1), Some(Decision::Allowed));
        messages(&client, &key);
        let idle = client.shared.now() + Duration::from_secs(5);
        client.shared.shards[key.shard].lock().handle_timeout(idle);
        let handle = KeyHandle::from_bits(key.handle.load(Ordering::Relaxed));
        assert!(!client.shared.shards[key.shard].lock().contains(handle));
        assert_eq!(returned_units(&messages(&client, &key)), 750);
        let mut admitted = 1;
        while client.try_spend(&key, 1) == Some(Decision::Allowed) {
            admitted += 1;
        }
        assert_eq!(admitted, 250, "the chunk, and no more");
        assert!(
            messages(&client, &key)
                .iter()
                .all(|m| matches!(m, ToAgent::LeaseWanted(_)))
        );
    }

    /// Threads spending one key at once never admit more than the lease holds, and admit all
    /// of it: the fast budget's compare-and-swap and the shard's mutex make each spend whole.
    #[test]
    fn concurrent_spenders_on_one_key_admit_exactly_what_was_granted() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        // No refill, so the lease granted by hand is all there is.
        config.gateway.refill_threshold_percent = 0;
        let (client, _stopped) = Client::detached(config).expect("client");
        let client = Arc::new(client);
        let key = Arc::new(client.key(&Target::new("d").entry("k", "v")).expect("key"));
        assert_eq!(client.try_spend(&key, 1), None, "no lease yet: wait");
        grant(&client, &key, GRANTED_UNITS);
        let spenders: Vec<_> = (0..SPENDERS)
            .map(|_| {
                let (client, key) = (client.clone(), key.clone());
                spend_until_refused(client, key, 1)
            })
            .collect();
        let admitted = joined_sum(spenders);
        assert_eq!(admitted, GRANTED_UNITS);
        assert_eq!(client.held_units(&key), 0);
    }

    /// A reservation settled below its estimate gives the difference back to the lease; one
    /// settled above takes the overage from it.
    #[tokio::test]
    async fn settling_a_reservation_refunds_or_charges_the_held_lease() {
        let (client, _stopped) =
            Client::detached(ClientConfig::new("http://127.0.0.1:1")).expect("client");
        let key = client
            .key(&Target::new("llm").entry("api_key", "a"))
            .expect("key");
        assert_eq!(client.try_spend(&key, 1), None);
        grant(&client, &key, 1_000);
        let r = client.reserve(&key, 300).await.expect("reserved");
        assert_eq!(client.held_units(&key), 700);
        client.settle(r, 120);
        assert_eq!(client.held_units(&key), 880);
        let r = client.reserve(&key, 100).await.expect("reserved");
        client.settle(r, 150);
        assert_eq!(client.held_units(&key), 730);
    }

    #[test]
    fn a_refused_key_follows_its_domains_failure_mode_and_is_counted() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config
            .failure_modes
            .insert("strict".into(), FailureMode::Closed);
        let (client, _stopped) = Client::detached(config).expect("client");
        let open = client
            .key(&Target::new("lenient").entry("k", "v"))
            .expect("key");
        let closed = client
            .key(&Target::new("strict").entry("k", "v"))
            .expect("key");
        for key in [&open, &closed] {
            let shard = &client.shared.shards[key.shard];
            assert_eq!(client.try_spend(key, 1), None);
            let now = client.shared.now();
            let mut gateway = shard.lock();
            while let Some(m) = gateway.poll_transmit(now) {
                if let ToAgent::LeaseWanted(w) = m {
                    gateway.handle_agent_unavailable(now, w.ticket);
                }
            }
        }
        assert_eq!(
            client.try_spend(&open, 1),
            Some(Decision::Unavailable { allowed: true })
        );
        assert_eq!(
            client.try_spend(&closed, 1),
            Some(Decision::Unavailable { allowed: false })
        );
        let stats = client.stats();
        assert_eq!((stats.failed_open, stats.failed_closed), (1, 1));
    }
}
