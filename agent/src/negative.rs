//! The negative cache: keys known to be over their limit until a known time, answered before
//! the budget lock is taken.
//!
//! Only a refusal that nothing but time can lift is cached: the allowance is used up
//! (`remaining_units == 0`) and the refusal names the window's reset. Anything that can give
//! units back sooner (a release or settle refunding units, a configuration reload, a message
//! from the coordinator) bumps a generation that invalidates every entry at once. Calls with
//! an idempotency key never read the cache: their retry must get the first answer back, which
//! only the machine remembers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use allot_core::budget::{Decision, Reason};
use allot_core::ids::{KeyId, LimitId};
use allot_core::time::Timestamp;

use crate::settings::NEGATIVE_CACHE_CAPACITY;

#[derive(Debug, Default)]
pub struct NegativeCache {
    map: Mutex<HashMap<(LimitId, KeyId), Entry>>,
    /// Entries, so an empty cache costs a load and no lock.
    len: AtomicUsize,
    generation: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    until: Timestamp,
    /// When the window resets: `until` too, except under a sliding window, where the window
    /// before's weight fades and a refusal lifts at its retry-after (D54).
    reset_at: Timestamp,
    generation: u64,
    reason: Reason,
    limit_units: u64,
}

impl NegativeCache {
    /// The refusal to answer, if the key is known to be over its limit at `now`.
    pub fn check(&self, now: Timestamp, key: &(LimitId, KeyId)) -> Option<Decision> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let e = *self.map().get(key)?;
        if e.generation != self.generation.load(Ordering::Acquire) || now >= e.until {
            return None;
        }
        let wait = e.until.saturating_duration_since(now);
        Some(Decision {
            allowed: false,
            remaining_units: 0,
            retry_after: Some(wait),
            reset_after: e.reset_at.saturating_duration_since(now),
            limit_units: e.limit_units,
            shadow_denied: false,
            reason: e.reason,
        })
    }

    /// Remembers a refusal that only time can lift: the window's end, or under a sliding
    /// window (`fading`) the moment the window before's weight has faded enough, its
    /// retry-after.
    pub fn remember(&self, now: Timestamp, key: (LimitId, KeyId), d: &Decision, fading: bool) {
        let lifted_by_time_only = matches!(
            d.reason,
            Reason::Allowance | Reason::GlobalView | Reason::PartitionClosed
        );
        let Some(retry_after) = d.retry_after else {
            return;
        };
        if d.allowed || d.remaining_units > 0 || !lifted_by_time_only {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        let lifts_after = if fading {
            retry_after.min(d.reset_after)
        } else {
            d.reset_after
        };
        let entry = Entry {
            until: now + lifts_after,
            reset_at: now + d.reset_after,
            generation,
            reason: d.reason,
            limit_units: d.limit_units,
        };
        let mut map = self.map();
        if map.len() >= NEGATIVE_CACHE_CAPACITY && !map.contains_key(&key) {
            map.retain(|_, e| e.generation == generation && e.until > now);
            if map.len() >= NEGATIVE_CACHE_CAPACITY {
                return;
            }
        }
        map.insert(key, entry);
        self.len.store(map.len(), Ordering::Relaxed);
    }

    /// Forgets every entry (units may have come back).
    pub fn invalidate(&self) {
        if self.len.load(Ordering::Relaxed) > 0 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// When the key's cached refusal ends, if it has one.
    pub fn until(&self, key: &(LimitId, KeyId)) -> Option<Timestamp> {
        let e = *self.map().get(key)?;
        (e.generation == self.generation.load(Ordering::Acquire)).then_some(e.until)
    }

    fn map(&self) -> MutexGuard<'_, HashMap<(LimitId, KeyId), Entry>> {
        // Entries are plain values; a panic cannot leave the map inconsistent.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key() -> (LimitId, KeyId) {
        (LimitId::new("d/k"), KeyId::new("k=1"))
    }

    fn refusal(remaining: u64, reason: Reason) -> Decision {
        Decision {
            allowed: false,
            remaining_units: remaining,
            retry_after: Some(Duration::from_secs(20)),
            reset_after: Duration::from_secs(20),
            limit_units: 10,
            shadow_denied: false,
            reason,
        }
    }

    const T: Timestamp = Timestamp::from_unix_millis(1_000_000);

    #[test]
    fn a_used_up_key_is_refused_until_its_window_ends() {
        let c = NegativeCache::default();
        c.remember(T, key(), &refusal(0, Reason::Allowance), false);
        // 5 s later, 15 s of the 20 s are left.
        let d = c.check(T + Duration::from_secs(5), &key()).expect("cached");
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_secs(15)));
        assert!(c.check(T + Duration::from_secs(20), &key()).is_none());
    }

    #[test]
    fn a_sliding_window_refusal_is_cached_only_until_the_weight_lets_it_pass() {
        let c = NegativeCache::default();
        let d = Decision {
            retry_after: Some(Duration::from_secs(3)),
            ..refusal(0, Reason::Allowance)
        };
        c.remember(T, key(), &d, true);
        let cached = c.check(T + Duration::from_secs(1), &key()).expect("cached");
        assert_eq!(cached.retry_after, Some(Duration::from_secs(2)));
        assert_eq!(cached.reset_after, Duration::from_secs(19));
        assert!(c.check(T + Duration::from_secs(3), &key()).is_none());
    }

    #[test]
    fn refusals_that_something_else_can_lift_are_not_cached() {
        let c = NegativeCache::default();
        // Units are left (the request was just too big), or the rate cap refused.
        c.remember(T, key(), &refusal(3, Reason::Allowance), false);
        c.remember(T, key(), &refusal(0, Reason::RateCap), false);
        c.remember(T, key(), &refusal(0, Reason::TooManyLeases), false);
        assert!(c.check(T, &key()).is_none());
    }

    #[test]
    fn a_refund_forgets_everything() {
        let c = NegativeCache::default();
        c.remember(T, key(), &refusal(0, Reason::Allowance), false);
        c.invalidate();
        assert!(c.check(T, &key()).is_none());
        // Entries remembered after the refund count again.
        c.remember(T, key(), &refusal(0, Reason::Allowance), false);
        assert!(c.check(T, &key()).is_some());
    }
}
