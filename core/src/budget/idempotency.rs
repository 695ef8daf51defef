//! The idempotency cache: a retried mutating call with the same request id gets the original
//! outcome and charges nothing again.
//!
//! Bounded by capacity and TTL. Every entry lives for the same TTL, so entries expire in the
//! order they were made: outcomes sit in a FIFO ring (which also gives every iteration its
//! order) and a small ordered index (24 bytes an entry) maps request ids to their place in
//! the ring. A call first `reserve`s its id, which is the one index search it pays: either
//! the id is known (a retry: the first outcome comes back) or a pending slot is taken, which
//! the call then `fill`s with its outcome, or `cancel`s if it failed (errors are not
//! remembered).
//!
//! Each entry keeps the fingerprint of its request (`RequestFingerprint`): an id that comes
//! back with other parameters is refused by the caller, never answered with an outcome that
//! was not for it. Entries read from stores written before fingerprints have none, and replay
//! on the call kind alone, as they did.
//!
//! When the cache is full the oldest entry is forgotten early (counted), which only weakens
//! protection for the oldest retries; refusing new requests instead would turn a full cache
//! into an outage.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::api::{Outcome, RequestFingerprint};
use crate::ids::RequestId;
use crate::time::Timestamp;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IdempotencyEntry {
    pub expires_at: Timestamp,
    pub outcome: Outcome,
    /// `None` only for an entry restored from a store written before fingerprints.
    pub fingerprint: Option<RequestFingerprint>,
}

#[derive(Clone, Debug)]
enum SlotState {
    /// Reserved by a call in progress; expires at the given time once filled.
    Pending(Timestamp),
    Live(IdempotencyEntry),
    /// Removed or replaced out of order.
    Dead,
}

#[derive(Clone, Debug)]
struct Slot {
    id: RequestId,
    state: SlotState,
}

/// What `reserve` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// The id is known: the first call's entry (the caller compares fingerprints).
    Replay(IdempotencyEntry),
    /// A new call: its slot, to `fill` or `cancel`.
    Ticket(Ticket),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    id: RequestId,
    seq: u64,
    fingerprint: RequestFingerprint,
}

#[derive(Clone, Debug)]
pub(crate) struct IdempotencyCache {
    /// Request id -> sequence number of its slot, for every live or pending slot.
    index: BTreeMap<RequestId, u64>,
    /// Slots in insertion order; `ring[0]` has sequence number `first_seq`.
    ring: VecDeque<Slot>,
    first_seq: u64,
    /// Live and pending slots.
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

    /// The remembered entry for `id`, expired or not.
    pub fn entry(&self, id: RequestId) -> Option<&IdempotencyEntry> {
        let pos = self.position(*self.index.get(&id)?)?;
        match &self.ring[pos].state {
            SlotState::Live(e) => Some(e),
            _ => None,
        }
    }

    /// A known id's entry, or a pending slot for a new call of request `fingerprint` (which
    /// may hold the cache one above its capacity until it is filled or cancelled).
    pub fn reserve(
        &mut self,
        now: Timestamp,
        id: RequestId,
        fingerprint: RequestFingerprint,
    ) -> Reserved {
        let seq = self.first_seq + self.ring.len() as u64;
        let replaced = match self.index.entry(id) {
            Entry::Vacant(v) => {
                v.insert(seq);
                None
            }
            Entry::Occupied(mut o) => {
                let old = *o.get();
                let first = position_of(self.first_seq, self.ring.len(), old);
                if let Some(SlotState::Live(e)) = first.map(|pos| &self.ring[pos].state)
                    && e.expires_at > now
                {
                    return Reserved::Replay(e.clone());
                }
                // Expired but not yet dropped: the id starts afresh.
                o.insert(seq);
                Some(old)
            }
        };
        // Popping dead slots off the front leaves the next slot's number unchanged.
        if let Some(old) = replaced {
            self.kill(old);
        }
        debug_assert_eq!(seq, self.first_seq + self.ring.len() as u64);
        self.ring.push_back(Slot {
            id,
            state: SlotState::Pending(now + self.ttl),
        });
        self.live += 1;
        debug_assert_eq!(self.index.len(), self.live);
        Reserved::Ticket(Ticket {
            id,
            seq,
            fingerprint,
        })
    }

    /// The call behind `ticket` succeeded: remember its outcome until the TTL. Ids forgotten
    /// early to make room are passed to `evicted`.
    pub fn fill(&mut self, ticket: Ticket, outcome: Outcome, mut evicted: impl FnMut(RequestId)) {
        if let Some(pos) = self.position(ticket.seq)
            && let SlotState::Pending(expires_at) = self.ring[pos].state
        {
            self.ring[pos].state = SlotState::Live(IdempotencyEntry {
                expires_at,
                outcome,
                fingerprint: Some(ticket.fingerprint),
            });
        }
        // The oldest slot goes first; the one just filled is the newest, so it stays.
        while self.live > self.capacity {
            match self.pop_front() {
                Some(old) => evicted(old),
                None => break,
            }
        }
        debug_assert!(self.live <= self.capacity);
    }

    /// The call behind `ticket` failed: forget the id.
    pub fn cancel(&mut self, ticket: Ticket) {
        if self.index.get(&ticket.id) == Some(&ticket.seq) {
            self.index.remove(&ticket.id);
        }
        self.kill(ticket.seq);
    }

    /// Put an entry read from persisted state, replacing any older one.
    pub fn restore(&mut self, id: RequestId, entry: IdempotencyEntry) {
        let seq = self.first_seq + self.ring.len() as u64;
        self.ring.push_back(Slot {
            id,
            state: SlotState::Live(entry),
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
            match &front.state {
                SlotState::Live(e) if e.expires_at > now => break,
                SlotState::Pending(at) if *at > now => break,
                _ => {}
            }
            if let Some(id) = self.pop_front() {
                gone.push(id);
            }
        }
        gone
    }

    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.ring.iter().find_map(|s| match &s.state {
            SlotState::Live(e) => Some(e.expires_at),
            SlotState::Pending(at) => Some(*at),
            SlotState::Dead => None,
        })
    }

    /// Live entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (RequestId, &IdempotencyEntry)> {
        self.ring.iter().filter_map(|s| match &s.state {
            SlotState::Live(e) => Some((s.id, e)),
            _ => None,
        })
    }

    pub fn clear(&mut self) {
        self.first_seq += self.ring.len() as u64;
        self.ring.clear();
        self.index.clear();
        self.live = 0;
    }

    /// The ring position of sequence number `seq`, if it is still in the ring.
    fn position(&self, seq: u64) -> Option<usize> {
        position_of(self.first_seq, self.ring.len(), seq)
    }

    /// Empty the slot `seq` (its index entry is gone or replaced).
    fn kill(&mut self, seq: u64) {
        if let Some(pos) = self.position(seq) {
            let was = std::mem::replace(&mut self.ring[pos].state, SlotState::Dead);
            if !matches!(was, SlotState::Dead) {
                self.live -= 1;
            }
        }
        self.drop_dead_front();
    }

    /// Remove the oldest slot; returns its id if it was live or pending.
    fn pop_front(&mut self) -> Option<RequestId> {
        let slot = self.ring.pop_front()?;
        self.first_seq += 1;
        let held = !matches!(slot.state, SlotState::Dead);
        if held {
            self.live -= 1;
            self.index.remove(&slot.id);
        }
        self.drop_dead_front();
        held.then_some(slot.id)
    }

    /// Keep the ring's front held, so the ring's length tracks the entries.
    fn drop_dead_front(&mut self) {
        while self
            .ring
            .front()
            .is_some_and(|s| matches!(s.state, SlotState::Dead))
        {
            self.ring.pop_front();
            self.first_seq += 1;
        }
    }
}

/// Where sequence number `seq` sits in a ring starting at `first_seq` of `len` slots.
fn position_of(first_seq: u64, len: usize, seq: u64) -> Option<usize> {
    let pos = usize::try_from(seq.checked_sub(first_seq)?).ok()?;
    (pos < len).then_some(pos)
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

    const FP: RequestFingerprint = RequestFingerprint(1);

    /// Reserve and fill, as a successful call does; returns the ids evicted.
    fn remember(c: &mut IdempotencyCache, now: Timestamp, id: u64, o: Outcome) -> Vec<RequestId> {
        let mut evicted = Vec::new();
        match c.reserve(now, RequestId(id.into()), FP) {
            Reserved::Ticket(t) => c.fill(t, o, |e| evicted.push(e)),
            Reserved::Replay(_) => panic!("id {id} is not new"),
        }
        evicted
    }

    fn get(c: &mut IdempotencyCache, now: Timestamp, id: u64) -> Option<Outcome> {
        match c.reserve(now, RequestId(id.into()), FP) {
            Reserved::Replay(e) => {
                assert_eq!(e.fingerprint, Some(FP), "the entry keeps its fingerprint");
                Some(e.outcome)
            }
            Reserved::Ticket(t) => {
                c.cancel(t);
                None
            }
        }
    }

    #[test]
    fn a_retry_gets_the_first_outcome_until_the_ttl() {
        let mut c = IdempotencyCache::new(10, Duration::from_secs(60));
        remember(&mut c, NOW, 1, outcome(5));
        assert_eq!(
            get(&mut c, NOW + Duration::from_secs(59), 1),
            Some(outcome(5))
        );
        let at = NOW + Duration::from_secs(60);
        assert_eq!(get(&mut c, at, 1), None, "expired: a new call");
        assert_eq!(c.next_expiry(), None);
        assert_eq!(c.iter().count(), 0);
    }

    #[test]
    fn a_failed_call_leaves_nothing_behind() {
        let mut c = IdempotencyCache::new(10, Duration::from_secs(60));
        assert_eq!(get(&mut c, NOW, 1), None);
        assert_eq!(c.index.len(), 0);
        assert_eq!(c.ring.len(), 0);
        remember(&mut c, NOW, 1, outcome(1));
        assert_eq!(get(&mut c, NOW, 1), Some(outcome(1)));
    }

    #[test]
    fn a_full_cache_forgets_the_oldest_first() {
        let mut c = IdempotencyCache::new(2, Duration::from_secs(60));
        remember(&mut c, NOW, 1, outcome(1));
        remember(&mut c, NOW + Duration::from_secs(1), 2, outcome(2));
        let evicted = remember(&mut c, NOW + Duration::from_secs(2), 3, outcome(3));
        assert_eq!(evicted, vec![RequestId(1)]);
        assert_eq!(get(&mut c, NOW, 2), Some(outcome(2)));
        assert_eq!(get(&mut c, NOW, 3), Some(outcome(3)));
        assert_eq!(get(&mut c, NOW, 1), None);
    }

    #[test]
    fn removals_out_of_order_keep_lookups_right() {
        let mut c = IdempotencyCache::new(10, Duration::from_secs(60));
        for i in 1..=4 {
            remember(&mut c, NOW + Duration::from_secs(i), i, outcome(i));
        }
        c.remove(RequestId(2));
        c.remove(RequestId(1));
        assert_eq!(get(&mut c, NOW, 3), Some(outcome(3)));
        assert_eq!(get(&mut c, NOW, 2), None);
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
            evicted += remember(&mut c, NOW, i, outcome(i)).len();
        }
        assert_eq!(evicted, 996);
        assert_eq!(c.index.len(), 4);
        assert_eq!(get(&mut c, NOW, 999), Some(outcome(999)));
        assert_eq!(get(&mut c, NOW, 995), None, "evicted");
        assert_eq!(c.iter().count(), 4);
    }
}
