//! A counter's fast budget: units carved from one held lease ([`Gateway::carve`]) that any
//! spender of the counter takes by compare-and-swap, with no lock, until the lease's expiry
//! (docs/decisions.md, D44).
//!
//! Invariants:
//! - The budget never goes below zero (the compare-and-swap takes only what is there), and
//!   its units were counted as spent by the gateway when carved, so the budgets and the
//!   leases together never hold more than was granted.
//! - Only the holder of the shard's lock installs or empties a budget, and it always settles
//!   the previous chunk (at the units taken from it) before carving the next, so a key has at
//!   most one chunk outstanding and every lease-taking call under the lock finds it settled.
//! - Nothing is taken from a budget at or after `until_nanos`, the lease's expiry less the
//!   gateway's margin.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use allot_core::gateway::{Chunk, Gateway, SpendReceipt};
use allot_core::ids::{KeyId, LimitId};
use allot_core::time::Timestamp;

#[derive(Debug, Default)]
pub(crate) struct FastChunk {
    /// Units left to take; 0 while no chunk is installed.
    units: AtomicU64,
    /// The chunk's lease's expiry on the client's clock (nanoseconds from its start).
    until_nanos: AtomicU64,
    /// The receipt of the chunk installed last, not yet settled. Taken only under the shard's
    /// lock, so never contended.
    outstanding: Mutex<Option<SpendReceipt>>,
}

impl FastChunk {
    /// Takes `units` if the chunk is live at `now` and holds them: the lock-free path.
    #[inline]
    pub fn try_take(&self, now: Timestamp, units: u64) -> bool {
        if now.as_unix_nanos() >= self.until_nanos.load(Ordering::Acquire) {
            return false;
        }
        let mut left = self.units.load(Ordering::Relaxed);
        loop {
            if left < units {
                return false;
            }
            match self.units.compare_exchange_weak(
                left,
                left - units,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => left = actual,
            }
        }
    }

    /// Units left to spend at `now` (0 once the lease has expired).
    pub fn units_at(&self, now: Timestamp) -> u64 {
        if now.as_unix_nanos() >= self.until_nanos.load(Ordering::Acquire) {
            return 0;
        }
        self.units.load(Ordering::Relaxed)
    }

    /// Installs a chunk of which the request that carved it took `spent_units`. The caller
    /// holds the shard's lock and has settled the previous chunk ([`FastChunk::settle`]).
    pub fn install(&self, chunk: Chunk, spent_units: u64) {
        let mut outstanding = self.outstanding();
        assert!(
            outstanding.is_none(),
            "the previous chunk was settled first"
        );
        assert!(
            spent_units <= chunk.receipt.units,
            "a chunk pays its own request"
        );
        *outstanding = Some(chunk.receipt);
        // `until` before `units`: a spender that sees the new units sees a live expiry.
        self.until_nanos
            .store(chunk.expires_at.as_unix_nanos(), Ordering::Release);
        self.units
            .store(chunk.receipt.units - spent_units, Ordering::Release);
    }

    /// Empties the chunk and settles it at the units taken from it: the rest goes back to its
    /// lease while that is held and live, else to the agent. The caller holds the shard's lock
    /// (`gateway`).
    pub fn settle(&self, gateway: &mut Gateway, now: Timestamp) {
        let mut outstanding = self.outstanding();
        let Some(receipt) = outstanding.take() else {
            return;
        };
        // After the swap no spender can take from it: a compare-and-swap against the old
        // value fails and sees 0.
        let left_units = self.units.swap(0, Ordering::AcqRel);
        assert!(
            left_units <= receipt.units,
            "a chunk never holds more than was carved"
        );
        gateway.settle(now, receipt, receipt.units - left_units);
    }

    fn outstanding(&self) -> MutexGuard<'_, Option<SpendReceipt>> {
        // An Option written whole: no panic leaves it half-updated.
        self.outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shard's fast budgets, one per counter, shared by every [`crate::Key`] of the counter, so
/// shutdown can settle them all (those of dropped keys included).
#[derive(Debug)]
pub(crate) struct Chunks {
    by_counter: HashMap<(LimitId, KeyId), Arc<FastChunk>>,
    /// Most counters with a budget; the gateway's `max_keys`.
    max_counters: usize,
}

impl Chunks {
    pub fn new(max_counters: usize) -> Self {
        Chunks {
            by_counter: HashMap::new(),
            max_counters,
        }
    }

    /// The counter's budget; `None` when `max_counters` budgets are held by live keys (the key
    /// then decides under the lock). When full, budgets no key holds any more are settled and
    /// dropped first. The caller holds the shard's lock (`gateway`).
    pub fn get_or_add(
        &mut self,
        gateway: &mut Gateway,
        now: Timestamp,
        limit: &LimitId,
        key: &KeyId,
    ) -> Option<Arc<FastChunk>> {
        let counter = (limit.clone(), key.clone());
        if let Some(chunk) = self.by_counter.get(&counter) {
            return Some(chunk.clone());
        }
        if self.by_counter.len() >= self.max_counters {
            self.drop_unheld(gateway, now);
        }
        if self.by_counter.len() >= self.max_counters {
            return None;
        }
        let chunk = Arc::new(FastChunk::default());
        self.by_counter.insert(counter, chunk.clone());
        Some(chunk)
    }

    /// Settles every budget (shutdown: their units go back with the leases).
    pub fn settle_all(&self, gateway: &mut Gateway, now: Timestamp) {
        for chunk in self.by_counter.values() {
            chunk.settle(gateway, now);
        }
    }

    fn drop_unheld(&mut self, gateway: &mut Gateway, now: Timestamp) {
        // Only `get_or_add` clones a budget, under the same lock, so a count of 1 (this map's)
        // stays 1 while the lock is held.
        self.by_counter.retain(|_, chunk| {
            let held = Arc::strong_count(chunk) > 1;
            if !held {
                chunk.settle(gateway, now);
            }
            held
        });
    }
}
