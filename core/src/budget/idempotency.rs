//! The idempotency cache: a retried mutating call with the same request id gets the original
//! outcome and charges nothing again.
//!
//! Bounded by capacity and TTL. Every entry lives for the same TTL, so entries expire in the
//! order they were made: outcomes sit in a FIFO ring (which also gives every iteration its
//! order) and a small ordered index (24 bytes an entry) maps request ids to their place in
//! the ring, so lookups walk compact nodes rather than moving outcomes around.
//!
//! When the cache is full the oldest entry is forgotten early (counted), which only weakens
//! protection for the oldest retries; refusing new requests instead would turn a full cache
//! into an outage.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::api::Outcome;
use crate::ids::RequestId;
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IdempotencyEntry {
    pub expires_at: Timestamp,
    pub outcome: Outcome,
}

#[derive(Clone, Debug)]
struct Slot {
    id: RequestId,
    /// `None` once removed or replaced out of order.
    entry: Option<IdempotencyEntry>,
}

#[derive(Clone, Debug)]
pub(crate) struct IdempotencyCache {
    /// Request id -> sequence number of its slot, for every live slot.
    index: BTreeMap<RequestId, u64>,
    /// Slots in insertion order; `ring[0]` has sequence number `first_seq`.
    ring: VecDeque<Slot>,
    first_seq: u64,
    /// Slots holding an entry.
    live: usize,
    capacity: usize,
    ttl: Duration,
}

impl IdempotencyCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        IdempotencyCache {
            index: BTreeMap::new(),
            ring: VecDeque::new(),
            first_seq: 0,
            live: 0,
            capacity,
            ttl,
        }
    }

    /// The remembered outcome, unless it has expired.
    pub fn get(&self, id: RequestId, now: Timestamp) -> Option<&Outcome> {
        self.entry(id)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.outcome)
    }

    pub fn entry(&self, id: RequestId) -> Option<&IdempotencyEntry> {
        let pos = self.position(*self.index.get(&id)?)?;
        self.ring[pos].entry.as_ref()
    }

    /// Remember `outcome` until `now + ttl`; ids forgotten early to make room are passed to
    /// `evicted`.
    pub fn insert(
        &mut self,
        now: Timestamp,
        id: RequestId,
        outcome: Outcome,
        mut evicted: impl FnMut(RequestId),
    ) {
        while self.live >= self.capacity {
            match self.pop_front() {
                Some(old) => evicted(old),
                None => break,
            }
        }
        self.restore(
            id,
            IdempotencyEntry {
                expires_at: now + self.ttl,
                outcome,
            },
        );
        debug_assert!(self.live <= self.capacity);
    }

    /// Put an entry in (new, or read back from persisted state), replacing any older one.
    pub fn restore(&mut self, id: RequestId, entry: IdempotencyEntry) {
        let seq = self.first_seq + self.ring.len() as u64;
        self.ring.push_back(Slot {
            id,
            entry: Some(entry),
        });
        self.live += 1;
        if let Some(old) = self.index.insert(id, seq) {
            self.kill(old);
        }
        debug_assert_eq!(self.index.len(), self.live);
    }

    pub fn remove(&mut self, id: RequestId) {
        if let Some(seq) = self.index.remove(&id) {
            self.kill(seq);
        }
    }

    /// Drop entries expired at `now`; returns their ids.
    pub fn expire(&mut self, now: Timestamp) -> Vec<RequestId> {
        let mut gone = Vec::new();
        while let Some(front) = self.ring.front() {
            if front.entry.as_ref().is_some_and(|e| e.expires_at > now) {
                break;
            }
            if let Some(id) = self.pop_front() {
                gone.push(id);
            }
        }
        gone
    }

    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.ring
            .iter()
            .find_map(|s| s.entry.as_ref())
            .map(|e| e.expires_at)
    }

    /// Live entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (RequestId, &IdempotencyEntry)> {
        self.ring
            .iter()
            .filter_map(|s| s.entry.as_ref().map(|e| (s.id, e)))
    }

    pub fn clear(&mut self) {
        self.first_seq += self.ring.len() as u64;
        self.ring.clear();
        self.index.clear();
        self.live = 0;
    }

    /// The ring position of sequence number `seq`, if it is still in the ring.
    fn position(&self, seq: u64) -> Option<usize> {
        let pos = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        (pos < self.ring.len()).then_some(pos)
    }

    /// Empty the slot `seq` (its index entry is gone or replaced).
    fn kill(&mut self, seq: u64) {
        if let Some(pos) = self.position(seq)
            && self.ring[pos].entry.take().is_some()
        {
            self.live -= 1;
        }
        self.drop_dead_front();
    }

    /// Remove the oldest slot; returns its id if it was live.
    fn pop_front(&mut self) -> Option<RequestId> {
        let slot = self.ring.pop_front()?;
        self.first_seq += 1;
        let live = slot.entry.is_some();
        if live {
            self.live -= 1;
            self.index.remove(&slot.id);
        }
        self.drop_dead_front();
        live.then_some(slot.id)
    }

    /// Keep the ring's front live, so the ring's length tracks the live entries.
    fn drop_dead_front(&mut self) {
        while self.ring.front().is_some_and(|s| s.entry.is_none()) {
            self.ring.pop_front();
            self.first_seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::api::ReleaseOutcome;

    const NOW: Timestamp = Timestamp::from_unix_millis(1_700_000_000_000);

    fn outcome(units: u64) -> Outcome {
        Outcome::Release(ReleaseOutcome {
            refunded_units: units,
        })
    }

    #[test]
    fn an_entry_is_returned_until_its_ttl() {
        let mut c = IdempotencyCache::new(10, Duration::from_secs(60));
        c.insert(NOW, RequestId(1), outcome(5), |_| {});
        let before = NOW + Duration::from_secs(59);
        assert_eq!(c.get(RequestId(1), before), Some(&outcome(5)));
        let at = NOW + Duration::from_secs(60);
        assert_eq!(c.get(RequestId(1), at), None);
        assert_eq!(c.expire(at), vec![RequestId(1)]);
        assert_eq!(c.next_expiry(), None);
    }

    #[test]
    fn a_full_cache_forgets_the_oldest_first() {
        let mut c = IdempotencyCache::new(2, Duration::from_secs(60));
        c.insert(NOW, RequestId(1), outcome(1), |_| {});
        c.insert(
            NOW + Duration::from_secs(1),
            RequestId(2),
            outcome(2),
            |_| {},
        );
        let mut evicted = Vec::new();
        c.insert(
            NOW + Duration::from_secs(2),
            RequestId(3),
            outcome(3),
            |id| evicted.push(id),
        );
        assert_eq!(evicted, vec![RequestId(1)]);
        assert!(c.get(RequestId(2), NOW).is_some());
        assert!(c.get(RequestId(3), NOW).is_some());
    }

    #[test]
    fn removals_out_of_order_keep_lookups_right() {
        let mut c = IdempotencyCache::new(10, Duration::from_secs(60));
        for i in 1..=4 {
            let t = NOW + Duration::from_secs(i);
            c.insert(t, RequestId(i.into()), outcome(i), |_| {});
        }
        c.remove(RequestId(2));
        c.remove(RequestId(1));
        assert_eq!(c.get(RequestId(3), NOW), Some(&outcome(3)));
        assert_eq!(c.get(RequestId(2), NOW), None);
        assert_eq!(c.next_expiry(), Some(NOW + Duration::from_secs(63)));
        let ids: Vec<RequestId> = c.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, vec![RequestId(3), RequestId(4)]);
        // Expiring the rest in order leaves nothing behind.
        assert_eq!(
            c.expire(NOW + Duration::from_secs(64)),
            vec![RequestId(3), RequestId(4)]
        );
        assert_eq!(c.iter().count(), 0);
    }

    #[test]
    fn evicted_ids_are_forgotten_and_the_index_follows() {
        let mut c = IdempotencyCache::new(4, Duration::from_secs(60));
        let mut evicted = 0;
        for i in 0..1_000u64 {
            c.insert(NOW, RequestId(i.into()), outcome(i), |_| evicted += 1);
        }
        assert_eq!(evicted, 996);
        assert_eq!(c.index.len(), 4);
        assert_eq!(c.get(RequestId(999), NOW), Some(&outcome(999)));
        assert_eq!(c.get(RequestId(995), NOW), None, "evicted");
        assert_eq!(c.iter().count(), 4);
        // An evicted id inserted again is a new entry.
        c.insert(NOW, RequestId(10), outcome(1), |_| {});
        assert_eq!(c.get(RequestId(10), NOW), Some(&outcome(1)));
    }
}
