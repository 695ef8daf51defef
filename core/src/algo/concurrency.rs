//! Concurrency slots with a TTL: at most `max_slots` holders per key at once, and a slot whose
//! holder never gives it back (crashed, partitioned, buggy) returns by itself after `slot_ttl`.
//!
//! As with GCRA, the parameters ([`Concurrency`]) are shared by every key of a limit and the
//! per-key state ([`SlotSet`]) is a small value driven by `now`. Slot ids are chosen by the
//! caller, so a slot can be named in a persisted record and released after a restart.
//!
//! Why a TTL rather than a plain counter: a counter incremented on start and decremented on
//! finish leaks a slot for every holder that dies in between, and a leaked slot is never seen
//! again. With a TTL the worst case is a slot held `slot_ttl` too long.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limit::ConcurrencyCap;
use crate::time::Timestamp;

/// A slot handed to one holder; unique per region for the life of its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SlotId(pub u64);

/// One held slot and the moment it returns by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSlot {
    pub id: SlotId,
    pub expires_at: Timestamp,
}

/// The fixed parameters of one concurrency cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    max_slots: u32,
    slot_ttl: Duration,
}

/// Per-key state: the slots held now. Never longer than `max_slots`; empty costs no heap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotSet {
    held: Vec<HeldSlot>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotDecision {
    Acquired {
        expires_at: Timestamp,
        /// Slots held after this one was taken.
        in_use: u32,
    },
    Full {
        /// When the earliest held slot returns by itself; `None` when the cap is zero, so no
        /// slot ever frees up.
        retry_after: Option<Duration>,
        in_use: u32,
    },
}

impl Concurrency {
    pub fn new(cap: ConcurrencyCap) -> Self {
        Concurrency {
            max_slots: cap.max_slots,
            slot_ttl: cap.slot_ttl,
        }
    }

    pub fn max_slots(&self) -> u32 {
        self.max_slots
    }

    pub fn slot_ttl(&self) -> Duration {
        self.slot_ttl
    }

    /// Take slot `id` at `now` if one is free. Expired holders are dropped first, which is how
    /// a crashed holder's slot comes back. Taking an id that is already held refreshes it.
    pub fn try_acquire(&self, set: &mut SlotSet, now: Timestamp, id: SlotId) -> SlotDecision {
        set.expire(now);
        let expires_at = now + self.slot_ttl;
        if let Some(held) = set.held.iter_mut().find(|h| h.id == id) {
            held.expires_at = held.expires_at.max(expires_at);
            return SlotDecision::Acquired {
                expires_at: held.expires_at,
                in_use: set.in_use(),
            };
        }
        if set.in_use() >= self.max_slots {
            let retry_after = set
                .next_expiry()
                .map(|at| at.saturating_duration_since(now));
            return SlotDecision::Full {
                retry_after,
                in_use: set.in_use(),
            };
        }
        set.held.push(HeldSlot { id, expires_at });
        debug_assert!(set.in_use() <= self.max_slots);
        SlotDecision::Acquired {
            expires_at,
            in_use: set.in_use(),
        }
    }

    /// Push a held slot's expiry to `now + slot_ttl`; `None` if it is no longer held.
    pub fn renew(&self, set: &mut SlotSet, now: Timestamp, id: SlotId) -> Option<Timestamp> {
        set.expire(now);
        let held = set.held.iter_mut().find(|h| h.id == id)?;
        held.expires_at = held.expires_at.max(now + self.slot_ttl);
        Some(held.expires_at)
    }
}

impl SlotSet {
    /// Give slot `id` back; false if it was not held (already released or expired), so a
    /// repeated release is harmless.
    pub fn release(&mut self, id: SlotId) -> bool {
        match self.held.iter().position(|h| h.id == id) {
            Some(i) => {
                self.held.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Drop every slot whose holder's time ran out (`expires_at <= now`); returns their ids.
    pub fn expire(&mut self, now: Timestamp) -> Vec<SlotId> {
        let mut gone = Vec::new();
        self.held.retain(|h| {
            let live = h.expires_at > now;
            if !live {
                gone.push(h.id);
            }
            live
        });
        gone
    }

    pub fn in_use(&self) -> u32 {
        // The set never holds more than `max_slots: u32` entries.
        u32::try_from(self.held.len()).unwrap_or(u32::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.held.iter().map(|h| h.expires_at).min()
    }

    pub fn iter(&self) -> impl Iterator<Item = &HeldSlot> {
        self.held.iter()
    }

    /// Put back a slot read from persisted state (no cap check: it was granted under one).
    pub fn restore(&mut self, slot: HeldSlot) {
        if !self.held.iter().any(|h| h.id == slot.id) {
            self.held.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_unix_millis(1_700_000_000_000);

    fn cap(max_slots: u32, ttl_secs: u64) -> Concurrency {
        Concurrency::new(ConcurrencyCap {
            max_slots,
            slot_ttl: Duration::from_secs(ttl_secs),
        })
    }

    #[test]
    fn at_most_max_slots_are_held_and_a_release_frees_one() {
        let c = cap(2, 30);
        let mut s = SlotSet::default();
        assert!(matches!(
            c.try_acquire(&mut s, NOW, SlotId(1)),
            SlotDecision::Acquired { in_use: 1, .. }
        ));
        assert!(matches!(
            c.try_acquire(&mut s, NOW, SlotId(2)),
            SlotDecision::Acquired { in_use: 2, .. }
        ));
        // Both slots taken at NOW return at NOW + 30 s, so a third caller waits 30 s.
        assert_eq!(
            c.try_acquire(&mut s, NOW, SlotId(3)),
            SlotDecision::Full {
                retry_after: Some(Duration::from_secs(30)),
                in_use: 2
            }
        );
        assert!(s.release(SlotId(1)));
        assert!(!s.release(SlotId(1)), "a second release frees nothing");
        assert!(matches!(
            c.try_acquire(&mut s, NOW, SlotId(3)),
            SlotDecision::Acquired { in_use: 2, .. }
        ));
    }

    #[test]
    fn a_crashed_holders_slot_comes_back_after_its_ttl() {
        let c = cap(1, 10);
        let mut s = SlotSet::default();
        assert!(matches!(
            c.try_acquire(&mut s, NOW, SlotId(1)),
            SlotDecision::Acquired { .. }
        ));
        // Holder 1 never releases. One nanosecond before its TTL the slot is still taken...
        let almost = NOW + Duration::from_secs(10) - Duration::from_nanos(1);
        assert_eq!(
            c.try_acquire(&mut s, almost, SlotId(2)),
            SlotDecision::Full {
                retry_after: Some(Duration::from_nanos(1)),
                in_use: 1
            }
        );
        // ...and at exactly NOW + 10 s it is free again.
        let at_ttl = NOW + Duration::from_secs(10);
        assert_eq!(
            c.try_acquire(&mut s, at_ttl, SlotId(2)),
            SlotDecision::Acquired {
                expires_at: at_ttl + Duration::from_secs(10),
                in_use: 1
            }
        );
        assert!(
            !s.release(SlotId(1)),
            "the expired holder no longer owns a slot"
        );
    }

    #[test]
    fn renewing_keeps_a_slot_past_its_first_ttl() {
        let c = cap(1, 10);
        let mut s = SlotSet::default();
        c.try_acquire(&mut s, NOW, SlotId(1));
        let t = NOW + Duration::from_secs(8);
        assert_eq!(
            c.renew(&mut s, t, SlotId(1)),
            Some(NOW + Duration::from_secs(18))
        );
        let later = NOW + Duration::from_secs(12);
        assert!(matches!(
            c.try_acquire(&mut s, later, SlotId(2)),
            SlotDecision::Full { .. }
        ));
        assert_eq!(s.expire(NOW + Duration::from_secs(18)), vec![SlotId(1)]);
        assert_eq!(c.renew(&mut s, later, SlotId(1)), None);
    }

    #[test]
    fn a_zero_cap_never_admits_and_says_so() {
        let c = cap(0, 10);
        let mut s = SlotSet::default();
        assert_eq!(
            c.try_acquire(&mut s, NOW, SlotId(1)),
            SlotDecision::Full {
                retry_after: None,
                in_use: 0
            }
        );
    }

    #[test]
    fn acquiring_a_held_id_again_takes_no_second_slot() {
        let c = cap(2, 10);
        let mut s = SlotSet::default();
        c.try_acquire(&mut s, NOW, SlotId(7));
        assert!(matches!(
            c.try_acquire(&mut s, NOW + Duration::from_secs(1), SlotId(7)),
            SlotDecision::Acquired { in_use: 1, .. }
        ));
    }
}
