//! The invariant checker: what the machines say about themselves, held against the
//! invariants of the design, at every sample of every run (`measure.sample_interval`), not
//! after every event: a breach that heals between two samples goes unseen. A restart is
//! checked as it happens; overshoot is judged per window after the run (`crate::report`),
//! except windows that are unbounded or that the run's end cut off (`crate::measure`).
//!
//! - 1: per counter, a region's net use never exceeds its allowance (plus policy terms);
//! - 2: strict mode: the table's allowances for a counter sum to at most the quota, and a
//!   region never enforces more than its table allowance (while both are on the same
//!   configuration version: during a reload's rollout the difference is the bound's reload
//!   term, judged with the overshoot);
//! - 3: counter entries never decrease;
//! - 4: overshoot never exceeds the reported bound (judged per window, see `measure`);
//! - 6: a restarted agent sees every current counter at least as large as before its crash.

use std::collections::BTreeMap;

use allot_core::sync::{CounterEntry, CounterRef};
use serde::Serialize;

use crate::node::{CoordinatorObservation, RegionObservation};

/// Most violations described in a run's report; beyond it they are only counted.
pub const MAX_VIOLATION_DETAILS: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant, e.g. `overshoot_above_bound`.
    pub kind: &'static str,
    /// Milliseconds from the start of the run.
    pub at_ms: u64,
    pub detail: String,
}

#[derive(Clone, Debug, Default)]
pub struct Checker {
    /// Last seen (granted, refunded) per (region, counter).
    last: BTreeMap<(usize, CounterRef), (u64, u64)>,
    /// Entries of a crashed region as they were at the crash.
    at_crash: BTreeMap<usize, Vec<CounterEntry>>,
    details: Vec<Violation>,
    count: u64,
}

impl Checker {
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn into_details(self) -> Vec<Violation> {
        self.details
    }

    pub fn record(&mut self, kind: &'static str, at_ms: u64, detail: String) {
        self.count += 1;
        if self.details.len() < MAX_VIOLATION_DETAILS {
            self.details.push(Violation {
                kind,
                at_ms,
                detail,
            });
        }
    }

    pub fn region(&mut self, at_ms: u64, region: usize, obs: &RegionObservation) {
        for e in &obs.entries {
            let now = (e.granted_units, e.refunded_units);
            let prev = self.last.insert((region, e.counter.clone()), now);
            if let Some(prev) = prev
                && (now.0 < prev.0 || now.1 < prev.1)
            {
                self.record(
                    "counter_decreased",
                    at_ms,
                    format!(
                        "region {} counter {:?}: (granted, refunded) went from {prev:?} to {now:?}",
                        e.region, e.counter
                    ),
                );
            }
        }
        for a in &obs.allowances {
            if a.net_units > a.limit_units {
                self.record(
                    "net_use_above_allowance",
                    at_ms,
                    format!(
                        "region #{region} counter {:?}: net use {} above allowance {}",
                        a.counter, a.net_units, a.limit_units
                    ),
                );
            }
        }
    }

    pub fn coordinator(&mut self, at_ms: u64, obs: &CoordinatorObservation) {
        for row in &obs.strict_rows {
            if row.allowance_sum_units > row.quota_units {
                self.record(
                    "table_above_quota",
                    at_ms,
                    format!(
                        "counter {:?}: allowances sum to {} above the quota {}",
                        row.counter, row.allowance_sum_units, row.quota_units
                    ),
                );
            }
        }
    }

    /// Invariant 2, second half: a strict region never enforces more than the coordinator's
    /// table gives it. `table` answers for a counter (its row or default), `is_current` says
    /// whether the counter's window is the one the region is in (an older window may have
    /// left the table already).
    pub fn region_against_table(
        &mut self,
        at_ms: u64,
        region: &str,
        obs: &RegionObservation,
        table: impl Fn(&CounterRef) -> Option<u64>,
        is_current: impl Fn(&CounterRef) -> bool,
    ) {
        for a in &obs.allowances {
            let Some(own) = a.strict_allowance_units else {
                continue;
            };
            if !is_current(&a.counter) {
                continue;
            }
            if let Some(row) = table(&a.counter)
                && own > row
            {
                self.record(
                    "region_allowance_above_table",
                    at_ms,
                    format!(
                        "region {region} counter {:?}: enforces {own}, the table gives it {row}",
                        a.counter
                    ),
                );
            }
        }
    }

    /// The region is about to crash; remember what it had.
    pub fn crashed(&mut self, region: usize, obs: &RegionObservation) {
        self.at_crash.insert(region, obs.entries.clone());
    }

    /// The region starts again from an older copy of its store (`agent_restore`): its entries
    /// may go back, which is the fault itself, so invariants 3 and 6 start again for it.
    pub fn forget_region(&mut self, region: usize) {
        self.last.retain(|(r, _), _| *r != region);
        self.at_crash.remove(&region);
    }

    /// The region restarted: every counter it had at the crash that `is_current` still must
    /// be there, at least as large.
    pub fn restarted(
        &mut self,
        at_ms: u64,
        region: usize,
        obs: &RegionObservation,
        is_current: impl Fn(&CounterRef) -> bool,
    ) {
        let Some(before) = self.at_crash.remove(&region) else {
            return;
        };
        for old in before.iter().filter(|e| is_current(&e.counter)) {
            let new = obs.entries.iter().find(|e| e.counter == old.counter);
            let kept = new.is_some_and(|n| {
                n.granted_units >= old.granted_units && n.refunded_units >= old.refunded_units
            });
            if !kept {
                self.record(
                    "lost_across_crash",
                    at_ms,
                    format!(
                        "region {} counter {:?}: had ({}, {}) before the crash, {:?} after",
                        old.region,
                        old.counter,
                        old.granted_units,
                        old.refunded_units,
                        new.map(|n| (n.granted_units, n.refunded_units))
                    ),
                );
            }
        }
        self.region(at_ms, region, obs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{AllowanceView, TableRow};
    use allot_core::ids::{KeyId, LimitId, RegionId};
    use allot_core::time::WindowIndex;

    fn counter() -> CounterRef {
        CounterRef {
            limit: LimitId::from("api/t"),
            key: KeyId::from("t=1"),
            window: WindowIndex(1),
        }
    }

    fn entry(granted: u64, refunded: u64) -> CounterEntry {
        CounterEntry {
            counter: counter(),
            region: RegionId::from("eu"),
            granted_units: granted,
            refunded_units: refunded,
        }
    }

    fn obs(entries: Vec<CounterEntry>) -> RegionObservation {
        RegionObservation {
            entries,
            allowances: Vec::new(),
            config_version: None,
        }
    }

    #[test]
    fn a_counter_that_goes_down_is_a_violation() {
        let mut c = Checker::default();
        c.region(0, 0, &obs(vec![entry(10, 2)]));
        c.region(100, 0, &obs(vec![entry(12, 2)]));
        assert_eq!(c.count(), 0);
        c.region(200, 0, &obs(vec![entry(12, 1)]));
        assert_eq!(c.count(), 1);
        assert_eq!(c.into_details()[0].kind, "counter_decreased");
    }

    #[test]
    fn net_use_above_allowance_is_a_violation() {
        let mut c = Checker::default();
        let mut o = obs(Vec::new());
        o.allowances.push(AllowanceView {
            counter: counter(),
            net_units: 101,
            limit_units: 100,
            strict_allowance_units: None,
        });
        c.region(0, 0, &o);
        assert_eq!(c.count(), 1);
    }

    #[test]
    fn a_strict_table_above_quota_is_a_violation() {
        let mut c = Checker::default();
        let row = |sum| TableRow {
            counter: counter(),
            allowance_sum_units: sum,
            quota_units: 1_000,
        };
        c.coordinator(
            0,
            &CoordinatorObservation {
                strict_rows: vec![row(1_000), row(1_001)],
                bounds: Vec::new(),
            },
        );
        assert_eq!(c.count(), 1);
    }

    #[test]
    fn a_region_enforcing_more_than_its_table_row_is_a_violation() {
        let mut c = Checker::default();
        let mut o = obs(Vec::new());
        o.allowances.push(AllowanceView {
            counter: counter(),
            net_units: 10,
            limit_units: 60,
            strict_allowance_units: Some(60),
        });
        c.region_against_table(0, "eu", &o, |_| Some(60), |_| true);
        assert_eq!(c.count(), 0, "equal to the row");
        c.region_against_table(0, "eu", &o, |_| Some(59), |_| false);
        assert_eq!(c.count(), 0, "an ended window may have left the table");
        c.region_against_table(0, "eu", &o, |_| Some(59), |_| true);
        assert_eq!(c.count(), 1);
        assert_eq!(c.into_details()[0].kind, "region_allowance_above_table");
    }

    #[test]
    fn a_restart_must_keep_current_counters() {
        let mut c = Checker::default();
        c.crashed(0, &obs(vec![entry(50, 5)]));
        c.restarted(10, 0, &obs(vec![entry(50, 5)]), |_| true);
        assert_eq!(c.count(), 0);
        c.crashed(0, &obs(vec![entry(50, 5)]));
        c.restarted(20, 0, &obs(vec![entry(40, 5)]), |_| true);
        assert_eq!(c.count(), 2, "lost across the crash, and decreased");
        c.crashed(0, &obs(vec![entry(50, 5)]));
        c.restarted(30, 0, &obs(Vec::new()), |_| false);
        assert_eq!(c.count(), 2, "a window that is over may be forgotten");
    }
}
