//! The invariants, checked at every instant something happens (design brief numbering):
//!
//! 1. per region, key and window, net use <= allowance + recorded excess (settle overage):
//!    at every admission against the allowance read just before it, and for strict limits at
//!    all times;
//! 2. strict: every counter's table allowances sum to at most `L`; each region enforces at
//!    most its table allowance (explicit or default);
//! 3. each region's own entries, what it sends, and what the leader relays never decrease;
//!    nobody claims more than the region admitted;
//! 5. net use equals what the model booked from the first outcome of each call;
//! 6. (on restart, in `World::restart`) a restored region has at least what it had;
//!
//! and the sums over regions per counter and window: strict, at most `L` plus the recorded
//! settle overage; eventual, at most `L` plus the largest bound the leader reported in the
//! window. Clocks are equal here, so the skew term is left out of that bound: it covers a shift
//! of windows that does not happen, and leaving it in would only make the check weaker.

use std::collections::BTreeMap;

use allot_core::budget::CounterState;
use allot_core::ids::{KeyId, RegionId};
use allot_core::limit::{Consistency, LimitSpec};
use allot_core::rebalance::{RegionBoundStats, bound};
use allot_core::sync::{CounterEntry, CounterRef, SyncDown, SyncUp};
use allot_core::time::WindowIndex;
use proptest::prelude::*;

use super::model::CounterAt;
use super::setup::{KEYS, QUOTA_UNITS, REGIONS, window};
use super::world::{TestResult, World};

/// What the checks have seen so far.
#[derive(Default)]
pub struct Seen {
    /// Last own counter read per (region, limit, key).
    counters: BTreeMap<(usize, usize, usize), CounterState>,
    /// Own entries per counter as last read: the most any copy of them may say.
    own_entries: BTreeMap<CounterAt, (u64, u64)>,
    /// Last entry each region sent per counter.
    sent_up: BTreeMap<(usize, CounterRef), (u64, u64)>,
    /// Last entry of each region the current leader relayed per counter.
    relayed: BTreeMap<(RegionId, CounterRef), (u64, u64)>,
    /// Eventual limits: the largest bound (skew left out) reported per key and window.
    bound_units: BTreeMap<(usize, usize, WindowIndex), u64>,
}

impl Seen {
    /// A new leader's views start empty and fill from what regions send it from then on.
    pub fn new_leader(&mut self) {
        self.relayed.clear();
    }
}

fn key_id(k: usize) -> KeyId {
    KeyId::from(KEYS[k])
}

fn is_strict(spec: &LimitSpec) -> bool {
    spec.consistency == Consistency::Strict
}

impl World {
    pub(super) fn check(&mut self) -> TestResult {
        for r in 0..REGIONS.len() {
            self.observe_region(r)?;
            self.check_strict_allowances(r)?;
            // Every retry must find its first answer (the model expects it), and every grant,
            // release request and entry names a known limit with room for its key.
            let stats = self.agents[r].budget.region_stats();
            prop_assert_eq!(stats.idempotency_evicted_early, 0);
            prop_assert_eq!(stats.sync_items_skipped, 0);
        }
        self.check_table()?;
        self.record_bounds();
        self.check_sums()
    }

    /// Invariants 3 and 5 on region `r`'s own counters; remembers them for the sums.
    pub(super) fn observe_region(&mut self, r: usize) -> TestResult {
        let w = window().index(self.now);
        for ((l, k), c) in self.own_counters(r) {
            // A key without state (never used, or evicted when idle) has nothing in this window.
            let c = c.unwrap_or(CounterState {
                window: w,
                granted_units: 0,
                refunded_units: 0,
            });
            if let Some(prev) = self.seen.counters.get(&(r, l, k)) {
                let moved_on = c.window > prev.window;
                let grew = c.window == prev.window
                    && c.granted_units >= prev.granted_units
                    && c.refunded_units >= prev.refunded_units;
                prop_assert!(
                    moved_on || grew,
                    "invariant 3: region {} counter {}/{} went from {:?} to {:?}",
                    REGIONS[r],
                    self.limits[l].id,
                    KEYS[k],
                    prev,
                    c
                );
            }
            self.seen.counters.insert((r, l, k), c);
            let at = (r, l, k, c.window);
            prop_assert_eq!(
                c.net_units(),
                self.model.net_units(at),
                "invariant 5: region {} counter {}/{} in {:?}",
                REGIONS[r],
                self.limits[l].id,
                KEYS[k],
                c.window
            );
            self.seen
                .own_entries
                .insert(at, (c.granted_units, c.refunded_units));
        }
        Ok(())
    }

    /// Invariants 1 and 2 (region side) for the strict limits, at the current instant.
    fn check_strict_allowances(&self, r: usize) -> TestResult {
        let w = window().index(self.now);
        let region = World::region_id(r);
        for (l, spec) in self.limits.iter().enumerate().filter(|(_, s)| is_strict(s)) {
            for (k, key) in KEYS.iter().enumerate() {
                let a = self.agents[r]
                    .budget
                    .allowance_units(self.now, &spec.id, &KeyId::from(*key))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let n = self.net_now(r, l, k);
                let excess = self.model.overage_units((r, l, k, w));
                prop_assert!(
                    n <= a + excess,
                    "invariant 1: region {} uses {} of {}/{} with allowance {} and excess {}",
                    REGIONS[r],
                    n,
                    spec.id,
                    key,
                    a,
                    excess
                );
                let counter = CounterRef {
                    limit: spec.id.clone(),
                    key: KeyId::from(*key),
                    window: w,
                };
                let row = self.replica.allowance(&counter, &region);
                prop_assert!(
                    a <= row,
                    "invariant 2: region {} enforces {} on {:?}, above its table allowance {}",
                    REGIONS[r],
                    a,
                    counter,
                    row
                );
            }
        }
        Ok(())
    }

    /// Net use of region `r` on a key in the current window.
    fn net_now(&self, r: usize, l: usize, k: usize) -> u64 {
        let w = window().index(self.now);
        self.agents[r]
            .budget
            .counter(&self.limits[l].id, &key_id(k))
            .filter(|c| c.window == w)
            .map_or(0, |c| c.net_units())
    }

    /// An acquire or lease admitted nothing beyond the allowance read just before it.
    pub(super) fn check_admission(
        &self,
        r: usize,
        (l, k): (usize, usize),
        allowance_units: u64,
    ) -> TestResult {
        let w = window().index(self.now);
        let n = self.net_now(r, l, k);
        let excess = self.model.overage_units((r, l, k, w));
        prop_assert!(
            n <= allowance_units + excess,
            "invariant 1 at admission: region {} reached {} on {}/{} against allowance {} (excess {})",
            REGIONS[r],
            n,
            self.limits[l].id,
            KEYS[k],
            allowance_units,
            excess
        );
        Ok(())
    }

    /// Invariant 2 on the committed table, for the current and the next window.
    fn check_table(&self) -> TestResult {
        if let Err(e) = self.replica.check_invariants() {
            return Err(TestCaseError::fail(format!("invariant 2: {e}")));
        }
        let w = window().index(self.now);
        for spec in self.limits.iter().filter(|s| is_strict(s)) {
            for k in 0..KEYS.len() {
                for window in [w, w.next()] {
                    let counter = CounterRef {
                        limit: spec.id.clone(),
                        key: key_id(k),
                        window,
                    };
                    let sum = self.replica.allowance_sum(&counter);
                    prop_assert!(
                        sum <= u128::from(QUOTA_UNITS),
                        "invariant 2: allowances of {:?} sum to {}",
                        counter,
                        sum
                    );
                }
            }
        }
        Ok(())
    }

    /// Eventual limits: the bound the leader reports now, per key, with the regions' stats.
    fn record_bounds(&mut self) {
        let w = window().index(self.now);
        for (l, spec) in self
            .limits
            .iter()
            .enumerate()
            .filter(|(_, s)| !is_strict(s))
        {
            for k in 0..KEYS.len() {
                let mut inputs = self
                    .leader
                    .bound_inputs(self.now, &spec.id, w, Some(&key_id(k)));
                for (r, agent) in self.agents.iter().enumerate() {
                    let s = agent.budget.stats(&spec.id).and_then(|s| s.window(w));
                    let stats = RegionBoundStats {
                        time_open: s.map_or(Default::default(), |s| s.time_open),
                        settle_overage_units: s.map_or(0, |s| s.settle_overage_units),
                    };
                    inputs.stats.insert(World::region_id(r), stats);
                }
                let b = bound(spec, w, &inputs);
                let skew = b
                    .terms
                    .iter()
                    .find(|t| t.name == "skew")
                    .map_or(0, |t| t.units);
                let units = b.total_units - skew;
                let largest = self.seen.bound_units.entry((l, k, w)).or_default();
                *largest = (*largest).max(units);
            }
        }
    }

    /// Per counter and window, the sum over regions of net use against `L` and what may
    /// exceed it.
    fn check_sums(&self) -> TestResult {
        let recent = WindowIndex(window().index(self.now).0.saturating_sub(1));
        let mut sums: BTreeMap<(usize, usize, WindowIndex), u64> = BTreeMap::new();
        for (&(_, l, k, w), &(granted, refunded)) in &self.seen.own_entries {
            if w >= recent {
                *sums.entry((l, k, w)).or_default() += granted - refunded;
            }
        }
        for ((l, k, w), sum) in sums {
            let spec = &self.limits[l];
            let (allowed_over, what) = if is_strict(spec) {
                let overage = (0..REGIONS.len())
                    .map(|r| self.model.overage_units((r, l, k, w)))
                    .sum::<u64>();
                (overage, "settle overage")
            } else {
                let b = self.seen.bound_units.get(&(l, k, w)).copied().unwrap_or(0);
                (b, "largest reported bound")
            };
            prop_assert!(
                sum <= QUOTA_UNITS + allowed_over,
                "{} {}/{} in {:?}: regions use {} together, above L = {} + {} {}",
                if is_strict(spec) {
                    "strict"
                } else {
                    "eventual"
                },
                spec.id,
                KEYS[k],
                w,
                sum,
                QUOTA_UNITS,
                what,
                allowed_over
            );
        }
        Ok(())
    }

    /// Invariant 3 on what a region sends: per counter, never less than it sent before, and
    /// never more than it holds.
    pub(super) fn observe_up(&mut self, r: usize, up: &SyncUp) -> TestResult {
        for e in &up.entries {
            prop_assert_eq!(&e.region, &World::region_id(r));
            let key = (r, e.counter.clone());
            let values = (e.granted_units, e.refunded_units);
            if let Some(prev) = self.seen.sent_up.get(&key) {
                prop_assert!(
                    values.0 >= prev.0 && values.1 >= prev.1,
                    "invariant 3: region {} sent {:?} after {:?} for {:?}",
                    REGIONS[r],
                    values,
                    prev,
                    e.counter
                );
            }
            self.seen.sent_up.insert(key, values);
            self.check_not_above_truth(e)?;
        }
        Ok(())
    }

    /// Invariant 3 on what the leader relays: per region and counter, never less than it
    /// relayed before, and never more than that region holds.
    pub(super) fn observe_down(&mut self, down: &SyncDown) -> TestResult {
        for e in &down.entries {
            let key = (e.region.clone(), e.counter.clone());
            let values = (e.granted_units, e.refunded_units);
            if let Some(prev) = self.seen.relayed.get(&key) {
                prop_assert!(
                    values.0 >= prev.0 && values.1 >= prev.1,
                    "invariant 3: the leader relayed {:?} after {:?} for {} on {:?}",
                    values,
                    prev,
                    e.region,
                    e.counter
                );
            }
            self.seen.relayed.insert(key, values);
            self.check_not_above_truth(e)?;
        }
        Ok(())
    }

    fn check_not_above_truth(&self, e: &CounterEntry) -> TestResult {
        let r = REGIONS.iter().position(|n| *n == e.region.as_str());
        let l = self.limit_index(&e.counter.limit);
        let k = World::key_index(&e.counter.key);
        let (Some(r), Some(l), Some(k)) = (r, l, k) else {
            return Err(TestCaseError::fail(format!(
                "entry for an unknown counter: {e:?}"
            )));
        };
        let truth = self
            .seen
            .own_entries
            .get(&(r, l, k, e.counter.window))
            .copied()
            .unwrap_or((0, 0));
        prop_assert!(
            e.granted_units <= truth.0 && e.refunded_units <= truth.1,
            "entry {:?} claims more than the region holds ({:?})",
            e,
            truth
        );
        Ok(())
    }
}
