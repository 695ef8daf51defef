//! Admissions a gateway made on its own, beyond every lease it held (Envoy's RLQS fallback
//! behaviours, reported after the fact), charged against the rule's stated allowance
//! (`rlqs_fallback_units`, the bound's `rlqs_fallback` term; docs/bound.md, D69).
//!
//! The allowance is per key and window, for the whole region. What a report brings within it
//! is covered by the term; what passes it breaks the operator's statement, and is recorded as
//! charged nowhere, so the coordinator states that window unbounded (D51) instead of a bound
//! the reports already disprove.
//!
//! The tally is soft state: a start does not know what an earlier start charged. So a window
//! that began before this machine first ran has no allowance left, and everything beyond the
//! leases in it is charged nowhere; a report of a window older than one already tallied for
//! the key, the same.

use std::collections::HashMap;

use super::RegionBudget;
use crate::ids::{KeyId, LimitId};
use crate::time::{Timestamp, WindowIndex};

/// Keys with a tally at once; past it (after forgetting windows that have ended) a key's
/// fallback has no allowance, and is charged nowhere.
pub const MAX_FALLBACK_KEYS: usize = 100_000;

#[derive(Debug, Default)]
pub(super) struct FallbackTally {
    /// The first instant the machine ran at (its first timeout): windows that began before it
    /// may have had fallback charged by an earlier start.
    started_at: Option<Timestamp>,
    /// Per key, the newest window tallied and the units charged within its allowance.
    used: HashMap<(LimitId, KeyId), (WindowIndex, u64)>,
}

impl FallbackTally {
    pub(super) fn note_running(&mut self, now: Timestamp) {
        self.started_at.get_or_insert(now);
    }
}

/// What a report of fallback admissions came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallbackCharge {
    /// Within the rule's allowance: covered by the `rlqs_fallback` term.
    pub within_units: u64,
    /// Past it: charged nowhere, and the window is stated unbounded.
    pub beyond_units: u64,
}

impl RegionBudget {
    /// A gateway reported `units` of `key` admitted at `at` beyond every lease it held (its
    /// fallback behaviour). Charged against the rule's `rlqs_fallback_units` for the window
    /// of `at`; the rest is recorded as charged nowhere ([`RegionBudget::record_uncharged`]).
    /// `None` for a key the gateway's target no longer maps to under `limit` (a reload): no
    /// allowance. An unknown limit (removed by a reload) counts nowhere.
    pub fn record_gateway_fallback(
        &mut self,
        limit: &LimitId,
        key: Option<&KeyId>,
        at: Timestamp,
        units: u64,
    ) -> FallbackCharge {
        let Some(lim) = self.limits.get(limit) else {
            return FallbackCharge {
                within_units: 0,
                beyond_units: units,
            };
        };
        let allowance = lim.params.spec.rlqs_fallback_units;
        let window = lim.params.window_index(at);
        let window_start = lim.params.window_start(window);
        let started = self.fallback.started_at.is_some_and(|s| window_start >= s);
        let within = match key {
            Some(key) if started && allowance > 0 && units > 0 => {
                self.charge_fallback(limit, key, window, allowance, units)
            }
            _ => 0,
        };
        let beyond = units - within;
        self.record_uncharged(at, limit, beyond);
        FallbackCharge {
            within_units: within,
            beyond_units: beyond,
        }
    }

    /// Takes up to `units` from what is left of the key's allowance in `window`.
    fn charge_fallback(
        &mut self,
        limit: &LimitId,
        key: &KeyId,
        window: WindowIndex,
        allowance: u64,
        units: u64,
    ) -> u64 {
        let pair = (limit.clone(), key.clone());
        if !self.fallback.used.contains_key(&pair) && !self.make_fallback_room() {
            return 0;
        }
        let entry = self.fallback.used.entry(pair).or_insert((window, 0));
        if entry.0 > window {
            // A newer window of the key is tallied; this one's tally is gone.
            return 0;
        }
        if entry.0 < window {
            *entry = (window, 0);
        }
        let within = units.min(allowance.saturating_sub(entry.1));
        entry.1 += within;
        debug_assert!(entry.1 <= allowance, "a tally above its allowance");
        within
    }

    /// After a reload: a rule's allowance may have shrunk below what a window already took
    /// of it. Those units were admitted, and the bound stated from the new allowance does
    /// not cover them: the part above it is recorded as charged nowhere (the window is stated
    /// unbounded), and the tally stops at the new allowance. A removed rule's tallies stay
    /// (forgotten once their windows end, as any), so the rule configured again within the
    /// window does not find its allowance whole.
    pub(super) fn refit_fallback_tallies(&mut self) {
        let mut above: Vec<(LimitId, Timestamp, u64)> = Vec::new();
        for ((limit, _), (window, used)) in &mut self.fallback.used {
            let Some(lim) = self.limits.get(limit) else {
                continue;
            };
            let allowance = lim.params.spec.rlqs_fallback_units;
            if *used > allowance {
                above.push((
                    limit.clone(),
                    lim.params.window_start(*window),
                    *used - allowance,
                ));
                *used = allowance;
            }
        }
        for (limit, at, units) in above {
            self.record_uncharged(at, &limit, units);
        }
    }

    /// Room for one more key: forgets tallies of windows that have ended by the newest
    /// instant seen, and of rules no longer configured. False when every key's window is
    /// still open.
    fn make_fallback_room(&mut self) -> bool {
        if self.fallback.used.len() < MAX_FALLBACK_KEYS {
            return true;
        }
        let now = self.last_timeout;
        let limits = &self.limits;
        self.fallback.used.retain(|(limit, _), (window, _)| {
            limits
                .get(limit)
                .is_some_and(|l| l.params.window_end(*window) > now)
        });
        self.fallback.used.len() < MAX_FALLBACK_KEYS
    }
}
