//! Answer: the SyncDown to a region, from committed state only (grants, release requests,
//! counter entries).

use std::ops::Bound as RangeBound;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ids::{Epoch, RegionId};
use crate::sync::{AllowanceGrant, CounterEntry, CounterRef, ReleaseRequest, SyncDown};
use crate::time::Timestamp;

use super::{Coordinator, first_live};
use crate::rebalance::views::CounterView;

impl Coordinator {
    /// The answer to `region`'s SyncUp `reply_to_seq`, from committed state only. Order of
    /// precedence within `cfg.message_items`: unconfirmed grants below the region's default
    /// (reclaimed zeroes; repeated in every answer until confirmed, since a region that missed
    /// one would enforce its default), release requests, other grants, then other regions'
    /// entries (round-robin over counters across answers).
    ///
    /// A region removed since its SyncUp was taken is not answered (`RegionRemoved`, as its
    /// SyncUp would be now): an answer makes its view fresh, and a reclaim of its floor can
    /// no longer end (the table refuses the end for a removed region), so the answer would
    /// carry none of the zeroes the table holds for it and it would enforce its default
    /// under them (swarm seed 3219172, where the removal committed between the two).
    pub fn poll_sync_down(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        reply_to_seq: u64,
    ) -> Result<SyncDown> {
        if self.table.is_removed(region) {
            return Err(Error::RegionRemoved(region.clone()));
        }
        let view = self.region_view(region);
        let mut budget = self.cfg.message_items;
        let (grants, release_requests, below_default_left) =
            self.grants_and_releases(now, region, &mut budget);
        for g in &grants {
            let row = self.row_view_mut(&g.counter, region);
            row.resend = false;
            row.sent = Some((g.epoch, now));
        }
        let entries = self.entries_for(now, region, budget);
        Ok(SyncDown {
            reply_to_seq,
            leader_term: self.leader_term,
            received_at: view.last_received_at,
            sent_at: now,
            config_version: self.table.config_version(),
            entries,
            grants,
            release_requests,
            known_region: view.known_before_boot,
            config: None,
            below_default_left,
            earlier_boot_clock_reach: view
                .restored
                .then(|| view.earlier_boot_reach(now))
                .flatten(),
        })
    }

    /// The grants and release requests `region`'s rows call for, read from the rows that may
    /// have something to send (`attention`); rows with nothing left to send are dropped from it.
    /// Also whether rows below the default were left out for want of room.
    fn grants_and_releases(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        budget: &mut usize,
    ) -> (Vec<AllowanceGrant>, Vec<ReleaseRequest>, bool) {
        let mut below_default = Vec::new();
        let mut releases = Vec::new();
        let mut grants = Vec::new();
        let mut settled = Vec::new();
        let attention = self.attention.get(region).into_iter().flatten();
        for counter in attention {
            let Some(row) = self.table.row(counter, region) else {
                settled.push(counter.clone());
                continue;
            };
            // Rows start at the limit's epoch floor: one still at it is no news to the region.
            let floor = self.table.epoch_floor(&counter.limit);
            let view = self.rows.get(&(counter.clone(), region.clone()));
            let sent = view.and_then(|v| v.sent);
            if let Some(p) = &row.pending {
                releases.push(ReleaseRequest {
                    id: p.id,
                    counter: counter.clone(),
                    units: p.units,
                    epoch: p.epoch,
                });
                // The row as it was just before the request (a request changes only the
                // epoch), unless sent and since confirmed: after a restart from an old copy
                // of its state the region must release from the row, not from an allowance it
                // held earlier, and an answer lost on the way (a region cut off as it
                // restarted) must not leave the request to go alone. It leads the answer, so
                // it is never cut while its release goes (swarm seed 3013168).
                let before = Epoch(p.epoch.0.saturating_sub(1));
                let confirmed = view.is_some_and(|v| v.confirmed);
                if before > floor && (!confirmed || sent.is_none_or(|(e, _)| e < before)) {
                    below_default.push(AllowanceGrant {
                        counter: counter.clone(),
                        region: region.clone(),
                        allowance_units: row.allowance_units,
                        epoch: before,
                    });
                }
                continue;
            }
            let unsent = sent.is_none_or(|(e, _)| e < row.epoch);
            // A mismatch reported less than a sync interval after sending is most likely the
            // grant still in flight: resend only once it has had time to arrive.
            let overdue = sent
                .is_none_or(|(_, at)| now.saturating_duration_since(at) >= self.cfg.sync_interval);
            let resend = view.is_some_and(|v| v.resend);
            let lost = resend && overdue;
            let must_deliver = self.unconfirmed_below_default(counter, region, Some(row), || view);
            if row.epoch > floor && (unsent || lost || must_deliver) {
                let g = AllowanceGrant {
                    counter: counter.clone(),
                    region: region.clone(),
                    allowance_units: row.allowance_units,
                    epoch: row.epoch,
                };
                if must_deliver {
                    below_default.push(g)
                } else {
                    grants.push(g)
                }
            } else if !resend {
                settled.push(counter.clone());
            }
        }
        if let Some(attention) = self.attention.get_mut(region) {
            for c in &settled {
                attention.remove(c);
            }
        }
        let below_default_left = below_default.len() > *budget;
        below_default.truncate(*budget);
        *budget -= below_default.len();
        releases.truncate(*budget);
        *budget -= releases.len();
        grants.truncate(*budget);
        *budget -= grants.len();
        below_default.extend(grants);
        (below_default, releases, below_default_left)
    }

    /// Every region's entries, `region`'s own included (it recovers them by max after a start
    /// from an old copy of its state), for the counters it takes part in: every tracked
    /// counter of a live window (a mentioned counter is reported from then on, so every
    /// region's use of an escalated key becomes known). A counter goes whole or waits for the
    /// next answer: the region trusts its view of a counter once it got its entries. The
    /// counters the region's last SyncUp carried go first (it is using them), then the others
    /// round-robin across answers, so no counter starves when there are more than fit.
    fn entries_for(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        budget: usize,
    ) -> Vec<CounterEntry> {
        let slack = self.clock_slack(now);
        let first = self.carried.remove(region).unwrap_or_default();
        let mut out = Vec::new();
        for counter in &first {
            if !self.push_counter_entries(now, slack, counter, budget, &mut out) {
                break;
            }
        }
        // From just after the cursor to the end, then from the start to the cursor: read
        // lazily, so an answer costs what it carries, not how many counters are tracked.
        let cursor = self.entry_cursor.get(region).cloned();
        let (after, wrap) = match &cursor {
            Some(c) => (
                (RangeBound::Excluded(c), RangeBound::Unbounded),
                (RangeBound::Unbounded, RangeBound::Included(c)),
            ),
            None => (
                (RangeBound::Unbounded, RangeBound::Unbounded),
                (RangeBound::Unbounded, RangeBound::Unbounded),
            ),
        };
        let order =
            self.counters
                .range(after)
                .chain(self.counters.range(wrap).take(if cursor.is_some() {
                    usize::MAX
                } else {
                    0
                }));
        let mut last_fitted = None;
        for (counter, view) in order {
            if first.binary_search(counter).is_ok() {
                continue;
            }
            if !self.push_entries_of(now, slack, counter, Some(view), budget, &mut out) {
                break;
            }
            last_fitted = Some(counter);
        }
        if let Some(c) = last_fitted.cloned() {
            self.entry_cursor.insert(region.clone(), c);
        }
        out
    }

    /// Appends every entry held for `counter`, if tracked and of a live window. False when they
    /// do not fit in `budget` (nothing appended).
    fn push_counter_entries(
        &self,
        now: Timestamp,
        slack: Duration,
        counter: &CounterRef,
        budget: usize,
        out: &mut Vec<CounterEntry>,
    ) -> bool {
        self.push_entries_of(now, slack, counter, self.counters.get(counter), budget, out)
    }

    /// [`Coordinator::push_counter_entries`], given `view`, the view of `counter` if tracked.
    fn push_entries_of(
        &self,
        now: Timestamp,
        slack: Duration,
        counter: &CounterRef,
        view: Option<&CounterView>,
        budget: usize,
        out: &mut Vec<CounterEntry>,
    ) -> bool {
        let live = self
            .finite_window(&counter.limit)
            .is_some_and(|w| counter.window >= first_live(w, now, slack));
        let Some(view) = view.filter(|_| live) else {
            return true;
        };
        if out.len() + view.reporters.len() > budget {
            return false;
        }
        for r in view.reporting_regions() {
            let (granted_units, refunded_units) = view.entry(r);
            out.push(CounterEntry {
                counter: counter.clone(),
                region: r.clone(),
                granted_units,
                refunded_units,
            });
        }
        true
    }
}
