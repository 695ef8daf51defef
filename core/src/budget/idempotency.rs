//! The idempotency cache: a retried mutating call with the same request id gets the original
//! outcome and charges nothing again.
//!
//! Bounded by capacity and TTL. Every entry lives for the same TTL, so entries expire in the
//! order they were made and a FIFO queue is all the expiry index needed. When the cache is
//! full the oldest entry is forgotten early (counted), which only weakens protection for the
//! oldest retries; refusing new requests instead would turn a full cache into an outage.

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
pub(crate) struct IdempotencyCache {
    entries: BTreeMap<RequestId, IdempotencyEntry>,
    /// Insertion order, oldest first; may hold ids already removed (skipped when popped).
    order: VecDeque<(Timestamp, RequestId)>,
    capacity: usize,
    ttl: Duration,
}

impl IdempotencyCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        IdempotencyCache {
            entries: BTreeMap::new(),
            order: VecDeque::new(),
            capacity,
            ttl,
        }
    }

    /// The remembered outcome, unless it has expired.
    pub fn get(&self, id: RequestId, now: Timestamp) -> Option<&Outcome> {
        self.entries
            .get(&id)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.outcome)
    }

    pub fn entry(&self, id: RequestId) -> Option<&IdempotencyEntry> {
        self.entries.get(&id)
    }

    /// Remember `outcome` until `now + ttl`. Returns the ids forgotten early to make room.
    pub fn insert(&mut self, now: Timestamp, id: RequestId, outcome: Outcome) -> Vec<RequestId> {
        let mut evicted = Vec::new();
        while self.entries.len() >= self.capacity {
            match self.pop_oldest() {
                Some(old) => evicted.push(old),
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
        debug_assert!(self.entries.len() <= self.capacity);
        evicted
    }

    /// Put back an entry read from persisted state.
    pub fn restore(&mut self, id: RequestId, entry: IdempotencyEntry) {
        self.order.push_back((entry.expires_at, id));
        self.entries.insert(id, entry);
        self.trim_order();
    }

    pub fn remove(&mut self, id: RequestId) {
        self.entries.remove(&id);
        self.trim_order();
    }

    /// Drop entries expired at `now`; returns their ids.
    pub fn expire(&mut self, now: Timestamp) -> Vec<RequestId> {
        let mut gone = Vec::new();
        while let Some(&(at, id)) = self.order.front() {
            if at > now {
                break;
            }
            self.order.pop_front();
            if self.entries.get(&id).is_some_and(|e| e.expires_at == at) {
                self.entries.remove(&id);
                gone.push(id);
            }
        }
        gone
    }

    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.order.front().map(|(at, _)| *at)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&RequestId, &IdempotencyEntry)> {
        self.entries.iter()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }

    fn pop_oldest(&mut self) -> Option<RequestId> {
        while let Some((at, id)) = self.order.pop_front() {
            if self.entries.get(&id).is_some_and(|e| e.expires_at == at) {
                self.entries.remove(&id);
                return Some(id);
            }
        }
        None
    }

    /// Keep the order queue from growing past twice the live entries with stale ids.
    fn trim_order(&mut self) {
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(at, id)| entries.get(id).is_some_and(|e| e.expires_at == *at));
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
        c.insert(NOW, RequestId(1), outcome(5));
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
        c.insert(NOW, RequestId(1), outcome(1));
        c.insert(NOW + Duration::from_secs(1), RequestId(2), outcome(2));
        let evicted = c.insert(NOW + Duration::from_secs(2), RequestId(3), outcome(3));
        assert_eq!(evicted, vec![RequestId(1)]);
        assert!(c.get(RequestId(2), NOW).is_some());
        assert!(c.get(RequestId(3), NOW).is_some());
    }
}
