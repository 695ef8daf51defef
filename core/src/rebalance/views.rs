//! The leader's soft state about regions and counters: rebuilt from what agents resend, so it
//! is never replicated. Counter entries are G-counters (`crdts::VClock<RegionId>`, merged by
//! max), so duplicated, reordered or replayed SyncUps never double-count.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crdts::{CmRDT, Dot, VClock};

use crate::budget::timebase::MAX_CLOCK_DRIFT_PPM;
use crate::ids::{Epoch, RegionId};
use crate::sync::{ClockGuard, ClockSample, CounterEntry, ReleaseAck};
use crate::time::Timestamp;

/// What the leader knows about one region.
#[derive(Clone, Debug)]
pub(crate) struct RegionView {
    /// Coordinator clock. Starts at the leader's start, so a region is never taken for silent
    /// before a whole deadline has passed under this leader.
    pub last_heard: Timestamp,
    /// Heard at least once by this leader.
    pub heard: bool,
    /// When this leader first heard the region (its clock): what the region did before is
    /// unknown to it.
    pub first_heard_at: Option<Timestamp>,
    /// `boot` and `seq` of the newest SyncUp: a message is newer when it is of a later boot
    /// (`is_later_boot`) or of this one with a larger `seq`.
    pub boot: u64,
    pub last_seq: Option<u64>,
    /// Boots this leader heard and then took a later one for, the latest last (0: none; a
    /// boot is never 0): a message of one is old whatever its number says, since a restored
    /// boot may be numbered below the boot it superseded. An array, not a vector: the view is
    /// copied for every answer.
    pub retired_boots: [u64; RETIRED_BOOTS_KEPT],
    /// t1 of the newest SyncUp: echoed in the answer.
    pub last_received_at: Timestamp,
    /// t0 of the newest SyncUp, on the region's clock (the latest of its boot): a start never
    /// reads before the time its store was written at, which is at least this, so the region
    /// may come back in this window after any restart (`Coordinator::clock_slack`).
    pub last_reading: Option<Timestamp>,
    pub clock: Option<ClockSample>,
    /// When `clock` was taken (our clock): its error grows with the clocks' drift since.
    pub clock_taken_at: Timestamp,
    /// The last sample of the region's clock as its boots before the newest ran it, and when
    /// it was taken: how far an older copy of its state may have run (`earlier_boot_reach`).
    pub earlier_boot_clock: Option<(ClockSample, Timestamp)>,
    /// The newest SyncUp said `restored`.
    pub restored: bool,
    /// The newest SyncUp's clock guard (docs/bound.md, skew): none after a restart until the
    /// region has a timebase again.
    pub clock_guard: Option<ClockGuard>,
    /// The newest SyncUp said the region's view had expired: it admits by its partition
    /// policy though this leader hears it.
    pub view_expired: bool,
    /// The configuration version the newest SyncUp reported: the one the region enforces.
    pub config_version: Option<u64>,
    /// The version the region reported before `config_version`: until the switch the region
    /// admitted under the old one, in windows its clock may put up to its clock uncertainty
    /// later than ours.
    pub previous_version: Option<PreviousVersion>,
    /// This leader knew the region before its newest boot (`SyncDown::known_region`).
    pub known_before_boot: bool,
}

/// A region's switch of configuration version, as this leader heard it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreviousVersion {
    pub version: u64,
    /// When (our clock) this leader first heard the new version.
    pub switched_at: Timestamp,
    /// The region's clock uncertainty then (`None`: unknown). How far its clock may have run
    /// ahead of ours before the switch: a clock corrected back later (the timebase slows it)
    /// reads closer to ours afterwards, so the uncertainty at the time counts, not today's.
    pub uncertainty_at_switch: Option<Duration>,
}

impl RegionView {
    pub fn new(now: Timestamp) -> Self {
        RegionView {
            last_heard: now,
            heard: false,
            first_heard_at: None,
            boot: 0,
            last_seq: None,
            retired_boots: [0; RETIRED_BOOTS_KEPT],
            last_received_at: now,
            last_reading: None,
            clock: None,
            clock_taken_at: now,
            earlier_boot_clock: None,
            restored: false,
            clock_guard: None,
            view_expired: false,
            config_version: None,
            previous_version: None,
            known_before_boot: false,
        }
    }

    /// How far the region's clock may be from ours: `|offset| + rtt / 2` (the NTP estimate's
    /// own error), or `None` before the first sample.
    pub fn clock_uncertainty(&self) -> Option<Duration> {
        self.clock
            .map(|c| Duration::from_nanos(c.offset_nanos.unsigned_abs() + c.round_trip_nanos / 2))
    }

    /// Whether a SyncUp of `boot` (saying `restored` or not) is of a boot after the newest one
    /// heard. A larger number is, unless retired. So is any other number that says `restored`:
    /// a restored start numbers its boot on its clock, which may read behind the boot it
    /// supersedes (a wall clock stepped back, a copy older than that boot's), and the operator
    /// declared it the region's state from now on. Never for a region whose boot is unknown
    /// here (neither heard nor adopted from an earlier leader, `adopt_boots`).
    pub fn is_later_boot(&self, boot: u64, restored: bool) -> bool {
        self.boot != 0
            && boot != self.boot
            && !self.is_retired(boot)
            && (boot > self.boot || restored)
    }

    /// Whether `boot` is one the region superseded: its messages are old whatever they say.
    pub fn is_retired(&self, boot: u64) -> bool {
        boot != 0 && self.retired_boots.contains(&boot)
    }

    /// Whether a message of `boot` numbered `seq` is newer than every one taken: of a later
    /// boot, or of the newest with a larger number (the first heard of it, for a boot adopted
    /// from an earlier leader), or the region's first for a boot unknown here.
    pub fn is_newer(&self, boot: u64, restored: bool, seq: u64) -> bool {
        self.is_later_boot(boot, restored)
            || self.boot == 0
            || (boot == self.boot && self.last_seq.is_none_or(|s| seq > s))
    }

    /// The newest boot gives way to a later one.
    pub fn retire_boot(&mut self) {
        self.retired_boots.rotate_left(1);
        self.retired_boots[RETIRED_BOOTS_KEPT - 1] = self.boot;
    }

    /// The sample held is of a boot before the region's newest (it restarted, or a sample
    /// adopted from a frame turns out to be): its clock is unknown until the next, and the
    /// sample becomes the earlier boots' clock unless one kept from a boot before it reaches
    /// further now (a restored start that went down again before a sample of its own).
    pub fn retire_clock(&mut self, now: Timestamp) {
        let Some(last) = self.clock.take().map(|c| (c, self.clock_taken_at)) else {
            return;
        };
        let reach_now = |c: (ClockSample, Timestamp)| reach(c, now);
        if self
            .earlier_boot_clock
            .is_none_or(|kept| reach_now(kept) < reach_now(last))
        {
            self.earlier_boot_clock = Some(last);
        }
    }

    /// The latest the region's clock may read at `now` as its earlier boots ran it: our clock
    /// less the sample's offset, plus half its round trip and the drift since it was taken
    /// ([`MAX_CLOCK_DRIFT_PPM`]). `None` without a sample of those boots.
    pub fn earlier_boot_reach(&self, now: Timestamp) -> Option<Timestamp> {
        self.earlier_boot_clock.map(|c| reach(c, now))
    }

    pub fn silent_for(&self, now: Timestamp) -> Duration {
        now.saturating_duration_since(self.last_heard)
    }
}

/// Retired boots a region's view keeps (`RegionView::retired_boots`): a message of an older
/// one is long delivered.
pub const RETIRED_BOOTS_KEPT: usize = 8;

/// The latest a clock sampled at `taken_at` (`sample`: ours less it) may read at `now`.
fn reach((sample, taken_at): (ClockSample, Timestamp), now: Timestamp) -> Timestamp {
    let aged = sample.aged(now.saturating_duration_since(taken_at), MAX_CLOCK_DRIFT_PPM);
    let ahead = i128::from(aged.round_trip_nanos / 2) - i128::from(aged.offset_nanos);
    let at = i128::from(now.as_unix_nanos()).saturating_add(ahead);
    Timestamp::from_unix_nanos(u64::try_from(at.max(0)).unwrap_or(u64::MAX))
}

/// What the leader knows about one row of the table (a counter's allowance for one region)
/// beyond the row itself: soft state, rebuilt from what the region resends.
#[derive(Clone, Debug, Default)]
pub(crate) struct RowView {
    /// Epoch of the last grant sent, and when.
    pub sent: Option<(Epoch, Timestamp)>,
    /// The region reported an allowance other than the table's: the grant is to be resent.
    pub resend: bool,
    /// The region has shown (demand report or release ack) that it enforces at most the row.
    /// A row below the region's configured default that is not confirmed may be unknown to
    /// the region, which would then enforce its default: such a row is neither grown nor
    /// shrunk, and its grant leads every answer, until confirmed.
    pub confirmed: bool,
    /// The region's ack of the row's pending release, waiting to be committed.
    pub ack: Option<ReleaseAck>,
    /// The ack came from a boot before the region's current one: its completion still
    /// commits (the release happened), but it confirms nothing, since the region now runs on
    /// a state that may predate it (a restart from an old copy).
    pub ack_of_earlier_boot: bool,
}

/// A region's latest demand report for one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DemandView {
    /// Requested units per second, in millionths of a unit.
    pub micro_units_per_sec: u64,
    /// What the region said it enforces: a mismatch with the table means a lost grant.
    pub allowance_units: u64,
    /// A forecast carried over from the previous window (pre-issue), not a report of the
    /// region's: refreshed until the region reports on this window itself.
    pub carried: bool,
}

/// What the leader knows about one counter.
#[derive(Clone, Debug, Default)]
pub(crate) struct CounterView {
    pub granted: VClock<RegionId>,
    pub refunded: VClock<RegionId>,
    /// Regions that reported this counter, zero entries included: a `VClock` keeps no
    /// zeros, and eventual-mode regions must tell "reported zero" from "never reported".
    pub reporters: BTreeSet<RegionId>,
    pub demand: BTreeMap<RegionId, DemandView>,
    /// How far the regions' reported use moved since the counter was last planned, in units
    /// (summed over regions): past the replan threshold it is planned again.
    pub drift_units: u64,
}

impl CounterView {
    pub fn merge(&mut self, e: &CounterEntry) {
        self.granted
            .apply(Dot::new(e.region.clone(), e.granted_units));
        self.refunded
            .apply(Dot::new(e.region.clone(), e.refunded_units));
        self.reporters.insert(e.region.clone());
    }

    /// Net use `n_r`; a refund can never exceed what was granted, but a region that reports
    /// one entry ahead of the other must not make the difference wrap.
    pub fn used_units(&self, region: &RegionId) -> u64 {
        self.granted
            .get(region)
            .saturating_sub(self.refunded.get(region))
    }

    pub fn entry(&self, region: &RegionId) -> (u64, u64) {
        (self.granted.get(region), self.refunded.get(region))
    }

    /// Regions that reported an entry (zero or not), in order.
    pub fn reporting_regions(&self) -> impl Iterator<Item = &RegionId> {
        self.reporters.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{KeyId, LimitId};
    use crate::sync::CounterRef;
    use crate::time::WindowIndex;
    use crdts::CvRDT;

    fn entry(region: &str, granted: u64, refunded: u64) -> CounterEntry {
        CounterEntry {
            counter: CounterRef {
                limit: LimitId::from("l"),
                key: KeyId::from("k"),
                window: WindowIndex(0),
            },
            region: RegionId::from(region),
            granted_units: granted,
            refunded_units: refunded,
        }
    }

    #[test]
    fn replayed_and_reordered_entries_never_double_count_or_go_back() {
        let mut v = CounterView::default();
        v.merge(&entry("a", 10, 2));
        v.merge(&entry("a", 7, 1)); // older message arriving late
        v.merge(&entry("a", 10, 2)); // duplicate
        assert_eq!(v.used_units(&RegionId::from("a")), 8);
        v.merge(&entry("a", 15, 2));
        assert_eq!(v.used_units(&RegionId::from("a")), 13);
    }

    #[test]
    fn merging_two_leaders_views_takes_the_max_per_region() {
        let mut x = CounterView::default();
        x.merge(&entry("a", 10, 0));
        x.merge(&entry("b", 3, 0));
        let mut y = CounterView::default();
        y.merge(&entry("a", 4, 0));
        y.merge(&entry("b", 9, 0));
        x.granted.merge(y.granted.clone());
        assert_eq!(x.granted.get(&RegionId::from("a")), 10);
        assert_eq!(x.granted.get(&RegionId::from("b")), 9);
    }
}
