//! Timers: when the machine next needs `handle_timeout`, and what it does then (expire leases,
//! slots and idempotency entries, account time spent open, roll windows, evict idle keys).

use super::RegionBudget;
use super::config::{STATS_WINDOWS_KEPT, SWEEP_KEYS_PER_TIMEOUT};
use super::lease::Settlement;
use super::shared::Dirty;
use crate::ids::KeyId;
use crate::limit::PartitionPolicy;
use crate::time::{Timestamp, WindowIndex};

impl RegionBudget {
    /// The next instant `handle_timeout` has work: a sync due, a lease, slot or idempotency
    /// entry expiring, the view expiring, or a window ending (to roll and sweep keys).
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let mut next: Option<Timestamp> = None;
        let mut consider = |t: Option<Timestamp>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if self.cfg.coordinated {
            consider(Some(self.sync.next_sync_at().unwrap_or(Timestamp::ZERO)));
            consider(self.view.expires_at().filter(|t| *t > self.last_timeout));
        }
        // Possibly a released lease's old deadline: an early wake-up finds nothing to do and
        // cleans the index.
        consider(self.leases.next_expiry_hint());
        consider(self.slots.next_expiry());
        consider(self.idempotency.next_expiry());
        let window_end = self
            .limits
            .values()
            .filter(|l| l.params.quota.is_some() && !l.keys.is_empty())
            .map(|l| {
                l.params
                    .window_end(l.params.window_index(self.last_timeout))
            })
            .min();
        consider(window_end);
        next
    }

    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.saw_time(now);
        self.last_timeout = self.last_timeout.max(now);
        self.fallback.note_running(now);
        self.account_open_time(now);
        self.leases.next_expiry();
        for id in self.leases.due(now) {
            self.end_lease(now, id, Settlement::Expired);
        }
        for id in self.slots.due(now) {
            self.drop_slot(id);
        }
        for id in self.idempotency.expire(now) {
            self.dirty.mark(Dirty::Idempotency(id));
        }
        for lim in self.limits.values_mut() {
            // Evicted keys leave a tombstone; rolled ones a fresh record.
            for name in lim.sweep(now, SWEEP_KEYS_PER_TIMEOUT) {
                let key = KeyId::new(name.as_ref());
                self.dirty.mark(Dirty::Key(lim.id().clone(), key));
            }
        }
    }

    /// Add the time the view spent expired since the last call to the `time_open` of every
    /// limit with an open partition policy, split by window.
    pub(crate) fn account_open_time(&mut self, now: Timestamp) {
        if !self.cfg.coordinated {
            return;
        }
        let Some((from, to)) = self.view.take_expired_span(now) else {
            return;
        };
        for lim in self.limits.values_mut() {
            let (PartitionPolicy::Open { .. }, Some(_)) =
                (lim.params.spec.partition_policy, lim.params.quota)
            else {
                continue;
            };
            let last = lim.params.window_index(to);
            let first = lim.params.window_index(from);
            let kept_from = last.0.saturating_sub(STATS_WINDOWS_KEPT as u64 - 1);
            for w in first.0.max(kept_from)..=last.0 {
                let w = WindowIndex(w);
                let start = lim.params.window_start(w).max(from);
                let end = lim.params.window_end(w).min(to);
                if let Some(s) = lim.stats.window_mut(w) {
                    s.add_time_open(end.saturating_duration_since(start));
                }
            }
            for w in lim.stats.take_unsaved() {
                self.dirty.mark(Dirty::Stats(lim.id().clone(), w));
            }
        }
    }
}
