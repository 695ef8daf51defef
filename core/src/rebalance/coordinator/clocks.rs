//! Clock samples across leaders (D43 in docs/decisions.md).
//!
//! A region's clock sample is measured on the round trips of its SyncUps, so it describes the
//! clock of the leader that answered them (`SyncUp::clock_leader_term`), not the clock of a
//! later one: coordinator nodes' clocks differ too. This leader takes a sample as it is only
//! when it answered it; one measured with an earlier leader's answers is carried over by that
//! leader's clock against this one's, which the driver hands in when it knows it (a sample the
//! earlier leader took of this node, replicated), and is not taken otherwise. A sample not
//! taken leaves the region's clock unknown: its skew term counts whole allowances, its rows
//! are kept and its floor is not reclaimed until a sample of its own arrives.

use crate::ids::RegionId;
use crate::sync::ClockSample;
use crate::time::Timestamp;

use super::Coordinator;
use crate::rebalance::views::RegionView;

impl Coordinator {
    /// `sample`, measured with the answers of the leader of `leader_term`, on this leader's
    /// clock; `None` when that leader's clock is unknown here.
    pub(super) fn on_my_clock(
        &self,
        sample: Option<ClockSample>,
        leader_term: u64,
    ) -> Option<ClockSample> {
        let sample = sample?;
        if leader_term == self.leader_term {
            return Some(sample);
        }
        self.clock_hops
            .get(&leader_term)
            .map(|hop| sample.through(*hop))
    }

    /// The earlier leader of `earlier_term` had the clock `hop` measures (a sample of this
    /// node's clock taken on that leader's, aged to now): samples regions measured with its
    /// answers are carried over by it, the ones in `samples` (that leader's latest, as it
    /// replicated them) at once, for regions this leader has no sample of yet. A region not in
    /// the table is left out; so is a term not below this leader's.
    pub fn adopt_clocks(
        &mut self,
        earlier_term: u64,
        hop: ClockSample,
        samples: impl IntoIterator<Item = (RegionId, ClockSample)>,
    ) {
        if earlier_term >= self.leader_term {
            return;
        }
        self.clock_hops.insert(earlier_term, hop);
        let started_at = self.started_at;
        for (region, sample) in samples {
            if self.table.regions().binary_search(&region).is_err() {
                continue;
            }
            let view = self
                .regions
                .entry(region)
                .or_insert_with(|| RegionView::new(started_at));
            if view.clock.is_none() {
                // The hop is aged to about this leader's start.
                view.clock = Some(sample.through(hop));
                view.clock_taken_at = started_at;
            }
        }
    }

    /// Every region's latest clock sample on this leader's clock, for the driver to replicate
    /// (so that the next leader starts with them). A region whose restored boot has no sample
    /// of its own yet (it says `restored` until its first answer) is replicated with its boot
    /// before's: a leader lost before that answer leaves the next one only the frame to tell
    /// the restored boot how far the lost copy's clock may read (D74), and the next leader
    /// takes an adopted sample of a region first heard restored for its boot before's.
    pub fn clock_samples(&self) -> Vec<(RegionId, ClockSample)> {
        self.clock_samples_taken()
            .into_iter()
            .map(|(r, s, _)| (r, s))
            .collect()
    }

    /// [`Coordinator::clock_samples`] with when each was taken (our clock; an adopted one at
    /// this leader's start, aged to then): a driver that replicates them ages them by it.
    pub fn clock_samples_taken(&self) -> Vec<(RegionId, ClockSample, Timestamp)> {
        self.regions
            .iter()
            .filter_map(|(r, v)| {
                let (sample, taken_at) = match v.clock {
                    Some(sample) => (sample, v.clock_taken_at),
                    None if v.restored => v.earlier_boot_clock?,
                    None => return None,
                };
                Some((r.clone(), sample, taken_at))
            })
            .collect()
    }

    /// The regions this leader holds a clock sample of (measured or adopted).
    pub fn sampled_regions(&self) -> impl Iterator<Item = &RegionId> {
        self.regions
            .iter()
            .filter(|(_, v)| v.clock.is_some())
            .map(|(r, _)| r)
    }

    /// Whether this leader holds a sample of `region`'s clock (measured or adopted): a driver
    /// records a frame when one appears that its last frame lacked, rather than leaving it
    /// to the next interval, since a leader lost before then takes it along.
    pub fn has_clock_sample(&self, region: &RegionId) -> bool {
        self.regions.get(region).is_some_and(|v| v.clock.is_some())
    }

    pub fn leader_term(&self) -> u64 {
        self.leader_term
    }
}
