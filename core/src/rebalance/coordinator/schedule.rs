//! Schedule: which counters a round plans. A counter's plan reads its own views (use, demand,
//! confirmations), its rows and free quota, facts shared by every counter (which regions are
//! silent, whether versions agree, which limits have a reclaim ending) and the time left in
//! its window. A round plans only the counters whose inputs changed since their last plan
//! (marked where the change comes in) and those whose plan time alone may have moved by now
//! (a due-time index), so its cost follows what changed, not how many counters are tracked.
//! Planning a counter more often than this changes nothing: a plan with unchanged inputs
//! proposes what the last one did, which is already in flight or committed.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::ids::{LimitId, RegionId};
use crate::rebalance::hashed::{HashedMap, hashed_map};
use crate::sync::CounterRef;
use crate::time::Timestamp;

/// Share of the quota, in millionths, by which a counter's regions' reported use or the needs
/// its plan forecasts (demand times time left) may move before it is planned again. Use that
/// follows the forecast leaves `n_r + need_r` unchanged, so the targets move only by what the
/// forecast missed; planned again within 1% of the quota, the allocation stays within 1% of
/// the one a plan every round would make (the simulator's utilization and convergence figures
/// did not get worse: docs/benchmarks.md, "The simulator before and after the round
/// schedule").
pub const REPLAN_DRIFT_PPM: u64 = 10_000;

/// Longest a counter with demand goes unplanned when nothing marks it: a backstop for
/// liveness only (every input change marks its counter), cheap at one plan per counter per
/// this long.
pub const MAX_REPLAN_INTERVAL: Duration = Duration::from_secs(30);

/// What every counter's plan reads from outside the counter. When it changes (a region falls
/// silent or is heard again, versions come to agree, a reclaim's end is awaited or done),
/// every counter is planned again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SharedInputs {
    pub silent: BTreeSet<RegionId>,
    pub versions_agree: bool,
    /// Limits with a reclaim whose region is back: not planned until its end commits.
    pub reclaim_ending: BTreeSet<LimitId>,
}

#[derive(Debug)]
pub(super) struct Schedule {
    /// Counters whose inputs changed since they were last planned.
    dirty: BTreeSet<CounterRef>,
    /// Every tracked counter is to be planned (a change every plan reads).
    all: bool,
    /// When each planned counter is due again though nothing marked it.
    due: BTreeSet<(Timestamp, CounterRef)>,
    /// Each counter's entry of `due`, by hash: only looked up (D42).
    due_at: HashedMap<CounterRef, Timestamp>,
    /// The shared inputs of the last round.
    shared: Option<SharedInputs>,
}

impl Schedule {
    /// An empty schedule whose index hashes with `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Schedule {
            dirty: BTreeSet::new(),
            all: false,
            due: BTreeSet::new(),
            due_at: hashed_map(seed),
            shared: None,
        }
    }

    pub fn mark(&mut self, counter: &CounterRef) {
        if !self.all && !self.dirty.contains(counter) {
            self.dirty.insert(counter.clone());
        }
    }

    pub fn mark_all(&mut self) {
        self.all = true;
        self.dirty.clear();
    }

    /// Records this round's shared inputs; a change from the last round's marks every counter.
    pub fn observe_shared(&mut self, shared: SharedInputs) {
        if self.shared.as_ref() != Some(&shared) {
            self.mark_all();
            self.shared = Some(shared);
        }
    }

    /// With every counter marked, marks each of `tracked` (once, not at every round).
    pub fn expand_all<'a>(&mut self, tracked: impl Iterator<Item = &'a CounterRef>) {
        if std::mem::take(&mut self.all) {
            self.dirty.extend(tracked.cloned());
        }
    }

    /// The next counter to plan at `now`: a marked one, else one due. Taken one at a time, so
    /// a round that fills up leaves the rest marked at no cost.
    pub fn pop_ready(&mut self, now: Timestamp) -> Option<CounterRef> {
        if let Some(c) = self.dirty.pop_first() {
            return Some(c);
        }
        if self.due.first().is_some_and(|(at, _)| *at <= now) {
            let (_, c) = self.due.pop_first()?;
            self.due_at.remove(&c);
            return Some(c);
        }
        None
    }

    /// Plans `counter` again at `at` unless marked before.
    pub fn set_due(&mut self, counter: &CounterRef, at: Timestamp) {
        if let Some(old) = self.due_at.insert(counter.clone(), at) {
            self.due.remove(&(old, counter.clone()));
        }
        self.due.insert((at, counter.clone()));
    }

    /// Forgets counters no longer tracked.
    pub fn retain(&mut self, keep: impl Fn(&CounterRef) -> bool) {
        self.dirty.retain(&keep);
        self.due_at.retain(|c, _| keep(c));
        self.due.retain(|(_, c)| keep(c));
    }

    #[cfg(test)]
    pub fn is_idle_at(&self, now: Timestamp) -> bool {
        !self.all && self.dirty.is_empty() && self.due.first().is_none_or(|(at, _)| *at > now)
    }
}

/// How long until time alone moves a counter's forecast needs by `threshold_units`: the
/// needs fall by `demand * elapsed` (`rate_micro_units_per_sec` summed over live regions).
/// `None` when nothing is demanded (time then moves nothing).
pub(super) fn drift_time(rate_micro_units_per_sec: u64, threshold_units: u64) -> Option<Duration> {
    if rate_micro_units_per_sec == 0 {
        return None;
    }
    let micros = u128::from(threshold_units) * crate::sync::MICRO_UNITS_PER_UNIT;
    let nanos = micros * 1_000_000_000 / u128::from(rate_micro_units_per_sec);
    Some(Duration::from_nanos(
        u64::try_from(nanos).unwrap_or(u64::MAX),
    ))
}

/// The use or forecast movement, in units, that replans a counter of a `quota_units` limit.
pub(super) fn replan_threshold_units(quota_units: u64, hysteresis_units: u64) -> u64 {
    let share = u128::from(quota_units) * u128::from(REPLAN_DRIFT_PPM) / 1_000_000;
    u64::try_from(share)
        .unwrap_or(u64::MAX)
        .max(hysteresis_units)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drift_time_is_the_threshold_over_the_rate() {
        // 10 units/s moving 100 units: 10 s.
        assert_eq!(drift_time(10_000_000, 100), Some(Duration::from_secs(10)));
        assert_eq!(drift_time(0, 100), None);
    }

    #[test]
    fn the_threshold_is_a_share_of_the_quota_at_least_the_hysteresis() {
        assert_eq!(replan_threshold_units(1_000_000, 1), 10_000);
        assert_eq!(replan_threshold_units(50, 3), 3);
        assert_eq!(replan_threshold_units(50, 0), 1);
    }
}
