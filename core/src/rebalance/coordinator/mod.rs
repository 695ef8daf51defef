//! The leader's rebalancer, quinn style: SyncUps in, table commands and SyncDowns out.
//!
//! - [`Coordinator::handle_sync_up`] records a region's counter entries, demand, release acks,
//!   clock sample and the time it was heard.
//! - [`Coordinator::poll_proposals`] returns what should be committed through raft: release
//!   completions, reclaims, grows, release requests and garbage collection.
//! - The driver commits each and calls [`Coordinator::handle_committed`], which applies it to
//!   the leader's copy of the table.
//! - [`Coordinator::poll_sync_down`] answers a region from COMMITTED state only: a grant is
//!   never sent before the allowance it carries is in the table (grow: commit, then send).
//!
//! Driver contract: after `handle_sync_up`, call `poll_proposals` and commit (or abandon)
//! everything it and earlier polls returned before calling `poll_sync_down` for that region
//! ([`Coordinator::has_uncommitted_proposals`] is then false). A region returning from a
//! closed-policy reclaim then finds the reclaim ended in the table and gets the zeroes for every
//! counter whose rows used its floor in the same answer that makes its view fresh again.
//!
//! One file per phase: `ingest.rs` (SyncUps and committed commands in), `propose.rs` (the
//! rebalancing round), `answer.rs` (SyncDowns out), `bound_inputs.rs` (what the bound reads);
//! this file holds the state they share and the helpers they all use.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{LimitId, RegionId};
use crate::limit::Quota;
use crate::rebalance::hashed::{HashedMap, OrderedMap, hashed_map};
use crate::rebalance::reload::KeptConfigs;
use crate::rebalance::table::{AllowanceRow, AllowanceTable, TableCommand};
use crate::rebalance::views::{CounterView, RegionView, RowView};
use crate::sync::{
    BoundFigures, ClockSample, CounterRef, MAX_ITEMS_PER_MESSAGE, MIN_ITEMS_PER_MESSAGE,
};
use crate::time::{Timestamp, Window, WindowIndex, duration_nanos};

mod answer;
mod boots;
mod bound_inputs;
mod clocks;
mod ingest;
mod propose;
mod schedule;

pub use boots::{RecordedBoots, RegionBoots};
use schedule::Schedule;
pub use schedule::{MAX_REPLAN_INTERVAL, REPLAN_DRIFT_PPM};

/// Most windows either side of the judged one whose allowances the skew term reads for a
/// region with a clock sample; a clock further off reads as unknown (every window counts).
pub const MAX_SKEW_REACH_WINDOWS: u64 = 64;

/// Most commands one `poll_proposals` returns; the rest waits for the next round.
pub const MAX_PROPOSALS_PER_POLL: usize = 1024;

/// Sync intervals a release needs before its units can be used elsewhere: the request waits
/// for the releasing region's next SyncUp to be answered, its ack for the one after, and the
/// grant of the freed units for the receiving region's next SyncUp. With less of a window
/// left, the current window's counters are not asked to release (the units would end the
/// window in transit, used by nobody); counters of later windows always may be.
pub const RELEASE_HANDOFF_SYNC_INTERVALS: u32 = 3;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorConfig {
    /// How often agents sync. A grant is resent for a reported mismatch only once it has been
    /// out this long (until then it is probably still in flight).
    pub sync_interval: Duration,
    /// A region not heard for this long is frozen: neither grown nor asked to release, and
    /// its view (on its side) has expired.
    pub view_ttl: Duration,
    /// Extra silence, beyond `view_ttl` and the measured clock uncertainty, before a closed
    /// region's floor is reclaimed: covers the drift of clock rates over that time.
    pub drift_margin: Duration,
    /// Grows and releases smaller than this are not made: no churn for tiny changes.
    pub rebalance_hysteresis_units: u64,
    /// How long before a window starts its allocations are issued ("start the window where
    /// demand is").
    pub pre_issue_lead: Duration,
    /// Most counters the leader keeps views of; reports for more are dropped (their demand
    /// goes unmet, which is safe).
    pub max_tracked_counters: usize,
    /// A proposal neither committed nor abandoned after this long is forgotten, so the
    /// counter can be planned again.
    pub proposal_timeout: Duration,
    /// Most items (grants, release requests and entries together) one SyncDown carries, from
    /// `MIN_ITEMS_PER_MESSAGE` to `MAX_ITEMS_PER_MESSAGE` (the default, what the wire takes).
    /// Below the default only to exercise the cap with few keys (the simulator's
    /// `message_items`).
    #[serde(default = "max_items_per_message")]
    pub message_items: usize,
    /// How often the leader records its regions' clock samples (a clock frame, D47), besides
    /// at once when it first holds a sample of a region its last frame lacked. The daemon's
    /// leader and the simulator's both read it.
    #[serde(default = "clock_frame_interval")]
    pub clock_frame_interval: Duration,
}

fn max_items_per_message() -> usize {
    MAX_ITEMS_PER_MESSAGE
}

/// The default [`CoordinatorConfig::clock_frame_interval`].
pub const CLOCK_FRAME_INTERVAL: Duration = Duration::from_secs(5);

fn clock_frame_interval() -> Duration {
    CLOCK_FRAME_INTERVAL
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            sync_interval: Duration::from_millis(250),
            view_ttl: Duration::from_secs(2),
            drift_margin: Duration::from_millis(500),
            rebalance_hysteresis_units: 1,
            pre_issue_lead: Duration::from_secs(1),
            max_tracked_counters: 65_536,
            proposal_timeout: Duration::from_secs(5),
            message_items: MAX_ITEMS_PER_MESSAGE,
            clock_frame_interval: CLOCK_FRAME_INTERVAL,
        }
    }
}

/// What an in-flight proposal is about: at most one per key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ProposalKey {
    Counter(CounterRef),
    /// Starting and ending a reclaim are separate keys: a reclaim proposed while its region
    /// was silent can still commit after the region is heard again, so its end is proposed
    /// behind it without waiting for it.
    StartReclaim(LimitId, RegionId),
    EndReclaim(LimitId, RegionId),
    Gc(LimitId),
    Version(RegionId),
}

fn proposal_key(cmd: &TableCommand) -> Option<ProposalKey> {
    match cmd {
        TableCommand::Grow { counter, .. }
        | TableCommand::RequestRelease { counter, .. }
        | TableCommand::CompleteRelease { counter, .. } => {
            Some(ProposalKey::Counter(counter.clone()))
        }
        TableCommand::Reclaim { limit, region, .. } => {
            Some(ProposalKey::StartReclaim(limit.clone(), region.clone()))
        }
        TableCommand::EndReclaim { limit, region } => {
            Some(ProposalKey::EndReclaim(limit.clone(), region.clone()))
        }
        TableCommand::CollectGarbage { limit, .. } => Some(ProposalKey::Gc(limit.clone())),
        TableCommand::RecordVersion { region, .. } => Some(ProposalKey::Version(region.clone())),
        // Configuration and the operator's removals are not the rebalancer's proposals.
        TableCommand::SetConfig { .. }
        | TableCommand::RemoveRegion { .. }
        | TableCommand::RestoreRegion { .. } => None,
    }
}

pub struct Coordinator {
    cfg: CoordinatorConfig,
    table: AllowanceTable,
    started_at: Timestamp,
    /// This leader's term ([`SyncDown::leader_term`]): larger than every earlier leader's.
    leader_term: u64,
    regions: BTreeMap<RegionId, RegionView>,
    /// Per earlier leader term, that leader's clock against this one's (`clocks.rs`): a
    /// region's sample measured with its answers is carried over by it.
    clock_hops: BTreeMap<u64, ClockSample>,
    /// Looked up per counter of every SyncUp, plan and answer; iterated in counter order by
    /// the answer's round-robin and the pre-issue (D42).
    counters: OrderedMap<CounterRef, CounterView>,
    /// Per row of the table (counter, region): what was sent, confirmed and acked. Only
    /// looked up, or scanned where the order does not matter (D42).
    rows: HashedMap<(CounterRef, RegionId), RowView>,
    /// Per key, when its proposals were made and how many of them are still uncommitted: a
    /// round's plan for a counter goes out as one batch, and the counter is planned again
    /// only once the whole batch is in. Looked up per planned counter and committed command;
    /// scanned only for timeouts, whose effects do not depend on the order (D42).
    in_flight: HashedMap<ProposalKey, (Timestamp, usize)>,
    /// Per region, the last counter whose entries fitted in an answer: the next answer starts
    /// after it, so no counter starves when there are more entries than fit.
    entry_cursor: BTreeMap<RegionId, CounterRef>,
    /// Per region, the counters its newest SyncUp carried (sorted, at most
    /// twice what one SyncUp may carry): their entries lead the answer to it.
    carried: BTreeMap<RegionId, Vec<CounterRef>>,
    /// What regions measured for the bound, per limit and window (their clocks), merged by
    /// max; the last `STATS_WINDOWS_KEPT` windows of each limit.
    region_stats: BTreeMap<(LimitId, WindowIndex), BTreeMap<RegionId, BoundFigures>>,
    /// Configurations this leader replaced, for the bound while regions still enforce them.
    kept_configs: KeptConfigs,
    /// Per limit, the first window still live when views were last forgotten: never tracked
    /// again, though a wider clock sample later widens the live range (a counter forgotten
    /// and tracked anew from a late message would relay less than it relayed before).
    /// Kept with the window length it counts in: a reload that changes the length starts a
    /// new mark (indices of another length are not comparable).
    forgotten_before: BTreeMap<LimitId, (Window, WindowIndex)>,
    /// A configuration change may have dropped limits: views are forgotten at the next round
    /// even if no window mark moved.
    forget_due: bool,
    /// Which counters the next round plans (`schedule.rs`).
    schedule: Schedule,
    /// Rows whose `RowView` holds an ack: the completions a round proposes.
    acked: BTreeSet<(CounterRef, RegionId)>,
    /// Per region, the rows that may have something to send it (a grant not yet sent, lost or
    /// unconfirmed, a release request): an answer reads these, not the whole table, and drops
    /// those with nothing left to send.
    attention: BTreeMap<RegionId, BTreeSet<CounterRef>>,
    /// Per limit, the first live window at the last garbage check that found nothing to
    /// collect: the rows are scanned again only once it moves (or a row older than it is
    /// made).
    gc_checked: BTreeMap<LimitId, WindowIndex>,
}

impl Coordinator {
    /// A leader starting at `now` over the committed `table`. `leader_term` must be larger
    /// than every earlier leader's (the raft term it was elected in): regions resend their
    /// soft state when they see it grow.
    pub fn new(
        cfg: CoordinatorConfig,
        table: AllowanceTable,
        now: Timestamp,
        leader_term: u64,
    ) -> Self {
        assert!(
            (MIN_ITEMS_PER_MESSAGE..=MAX_ITEMS_PER_MESSAGE).contains(&cfg.message_items),
            "message_items {} outside {MIN_ITEMS_PER_MESSAGE}..={MAX_ITEMS_PER_MESSAGE}",
            cfg.message_items
        );
        let seed = hash_seed(now, leader_term);
        let mut c = Coordinator {
            cfg,
            table: table.reseeded(seed),
            started_at: now,
            leader_term,
            regions: BTreeMap::new(),
            clock_hops: BTreeMap::new(),
            counters: OrderedMap::with_seed(seed),
            rows: hashed_map(seed),
            in_flight: hashed_map(seed),
            entry_cursor: BTreeMap::new(),
            carried: BTreeMap::new(),
            region_stats: BTreeMap::new(),
            kept_configs: KeptConfigs::default(),
            forgotten_before: BTreeMap::new(),
            forget_due: false,
            schedule: Schedule::with_seed(seed),
            acked: BTreeSet::new(),
            attention: BTreeMap::new(),
            gc_checked: BTreeMap::new(),
        };
        c.attend_all();
        c
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    pub fn table(&self) -> &AllowanceTable {
        &self.table
    }

    /// True while a polled command has been neither committed nor forgotten (after
    /// `proposal_timeout`; a reclaim's start is never forgotten, see `poll_proposals`).
    pub fn has_uncommitted_proposals(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Net use of `region` on `counter` as last reported, if the counter is tracked.
    pub fn used_units(&self, counter: &CounterRef, region: &RegionId) -> Option<u64> {
        self.counters.get(counter).map(|v| v.used_units(region))
    }

    /// The demand `region` last reported for `counter`, in millionths of a unit per second
    /// (a forecast carried over from the window before counts too), if it reported any.
    pub fn demand_micro_units_per_sec(
        &self,
        counter: &CounterRef,
        region: &RegionId,
    ) -> Option<u64> {
        let view = self.counters.get(counter)?;
        view.demand.get(region).map(|d| d.micro_units_per_sec)
    }

    fn finite_window(&self, limit: &LimitId) -> Option<Window> {
        match self.table.limit(limit)?.quota {
            Quota::Units { window, .. } => Some(window),
            Quota::Unlimited => None,
        }
    }

    /// Every region this leader heard reports the table's configuration version: only then
    /// is a counter planned, since a region on another version neither takes the grants nor
    /// enforces the defaults the plan counts it at.
    fn versions_agree(&self) -> bool {
        // A removed region never syncs again, so it would hold planning up for good; it is
        // frozen (the plan counts it at what the table holds), and what it may still enforce
        // under an older version is in the bound's reload term, which counts every member.
        // A member this leader has not heard yet is on the version an earlier leader heard
        // it on, as far as is known: one cut off through a reload and a leader change holds
        // planning up as it did under the leader that made the reload.
        self.members_on_table_version(false)
    }

    /// Every member (removed ones too, with `removed`) is on the table's version as far as
    /// this leader knows (`version_of`; one with none known counts as on it).
    fn members_on_table_version(&self, removed: bool) -> bool {
        let current = self.table.config_version();
        self.table
            .regions()
            .iter()
            .filter(|r| removed || !self.table.is_removed(r))
            .all(|r| self.version_of(r).is_none_or(|c| c == current))
    }

    /// The configuration version `region` enforces as far as this leader knows: the one it
    /// last reported here, else the one an earlier leader recorded; `None` if neither.
    fn version_of(&self, region: &RegionId) -> Option<u64> {
        self.regions
            .get(region)
            .and_then(|v| v.config_version)
            .or_else(|| self.table.recorded_version(region))
    }

    /// The leader's view of a row, made if it has none.
    fn row_view_mut(&mut self, counter: &CounterRef, region: &RegionId) -> &mut RowView {
        self.rows
            .entry((counter.clone(), region.clone()))
            .or_default()
    }

    /// A row below the region's configured default that the region has not confirmed.
    /// `row` is the table's row of (`counter`, `region`), and `view` gives the leader's view
    /// of it if needed: the callers have both at hand (one search of each map, not two).
    fn unconfirmed_below_default<'a>(
        &'a self,
        counter: &CounterRef,
        region: &RegionId,
        row: Option<&AllowanceRow>,
        view: impl FnOnce() -> Option<&'a RowView>,
    ) -> bool {
        row.is_some_and(|row| {
            row.allowance_units < self.table.configured_default(counter, region)
                && !view().is_some_and(|v| v.confirmed)
        })
    }

    fn region_view(&self, region: &RegionId) -> RegionView {
        self.regions
            .get(region)
            .cloned()
            .unwrap_or_else(|| RegionView::new(self.started_at))
    }

    /// Silent long enough that its view (on its own clock) has expired.
    fn is_silent(&self, region: &RegionId, now: Timestamp) -> bool {
        let silent_for = self.regions.get(region).map_or_else(
            || now.saturating_duration_since(self.started_at),
            |v| v.silent_for(now),
        );
        silent_for >= self.cfg.view_ttl
    }

    /// Every row of the table may have something to send (at the start, and after a command
    /// that may touch any row).
    fn attend_all(&mut self) {
        self.attention.clear();
        for (counter, rows) in self.table.counters() {
            for region in rows.keys() {
                self.attention
                    .entry(region.clone())
                    .or_default()
                    .insert(counter.clone());
            }
        }
    }

    /// `region`'s row of `counter` may have something to send.
    fn attend(&mut self, counter: &CounterRef, region: &RegionId) {
        self.attention
            .entry(region.clone())
            .or_default()
            .insert(counter.clone());
    }

    /// Nothing is ready for a round at `now`: no counter marked or due.
    #[cfg(test)]
    pub(crate) fn round_is_idle(&self, now: Timestamp) -> bool {
        self.schedule.is_idle_at(now)
    }

    /// How many rows the next answer to `region` reads for grants and release requests.
    #[cfg(test)]
    pub(crate) fn rows_to_read(&self, region: &RegionId) -> usize {
        self.attention.get(region).map_or(0, BTreeSet::len)
    }

    /// The movement of use or forecast, in units, that plans a counter of `limit` again.
    fn replan_threshold(&self, limit: &LimitId) -> u64 {
        match self.table.limit(limit).map(|s| s.quota) {
            Some(Quota::Units { units, .. }) => {
                schedule::replan_threshold_units(units, self.cfg.rebalance_hysteresis_units)
            }
            _ => u64::MAX,
        }
    }

    /// How far from ours a member region's clock may read now: the largest clock uncertainty
    /// measured (`|offset| + rtt / 2`) plus the drift margin once every member has sent this
    /// leader a clock sample; the full reach ([`MAX_SKEW_REACH_WINDOWS`] windows of any limit,
    /// capped where it is used) while one has not. Windows are aligned on each region's own
    /// clock, so a window that ended on ours may still be a region's current one for this
    /// long: its rows, views and statistics are kept, and its reports taken. A new leader
    /// holds no samples (they are soft state): judging on the slack of the regions heard so
    /// far would collect the rows of a window that a region whose clock is behind is still
    /// in (leaving it enforcing a grant the table no longer holds), and forget its reports
    /// for good (the bound's figures of that window with them).
    ///
    /// A removed region counts as one without a sample: its syncs are refused, so a restart
    /// on another clock is not heard either (D73: a restart reads the wall clock again). Swarm
    /// seed 3377321: removed, restarted 1.2 s behind its sampled clock, it was still in a
    /// window the leader had collected.
    ///
    /// And the slack reaches back to each region's latest reading (its newest SyncUp's send
    /// time on its clock): a restart reads on from its store's time, at least that, but no
    /// later, whatever its clock did meanwhile, so a region down since may come back in that
    /// window (swarm seeds 3390332 and 3390728: down for 8 s and 10 s while its clock stepped
    /// back, it restarted in the window it went down in, which the leader had collected).
    fn clock_slack(&self, now: Timestamp) -> Duration {
        let mut widest = Duration::ZERO;
        let mut latest_reading_behind = Duration::ZERO;
        for r in self.table.regions() {
            if self.table.is_removed(r) {
                return Duration::MAX;
            }
            let Some(view) = self.regions.get(r) else {
                return Duration::MAX;
            };
            match view.clock_uncertainty() {
                Some(u) => widest = widest.max(u),
                None => return Duration::MAX,
            }
            if let Some(reading) = view.last_reading {
                latest_reading_behind =
                    latest_reading_behind.max(now.saturating_duration_since(reading));
            }
        }
        widest
            .saturating_add(self.cfg.drift_margin)
            .max(latest_reading_behind)
    }

    /// The first and last window of `limit` that some region may be in at `now` (our clock,
    /// widened by the regions' clock slack): a window before the first has ended on every
    /// region's clock, so only its measured terms (late settles, time open reported after a
    /// heal) can still grow. `None` for a limit without windows.
    pub fn live_window_range(
        &self,
        limit: &LimitId,
        now: Timestamp,
    ) -> Option<(WindowIndex, WindowIndex)> {
        let window = self.finite_window(limit)?;
        Some(self.live_windows(window, now))
    }

    /// The first and last window of `window` that some region may be in at `now` (our clock):
    /// its rows, views and statistics are kept, and its reports taken.
    fn live_windows(&self, window: Window, now: Timestamp) -> (WindowIndex, WindowIndex) {
        let slack = self.clock_slack(now);
        let last = window.index(now + slack.min(window.len() * MAX_SKEW_REACH_WINDOWS as u32));
        (first_live(window, now, slack), last)
    }
}

/// The seed of the leader's hash maps (D42): from its start and term, which a client cannot
/// know in advance, and no OS randomness (the simulator replays a run from its seed; no
/// output depends on hash order anyway).
fn hash_seed(started_at: Timestamp, leader_term: u64) -> u64 {
    started_at.as_unix_nanos() ^ leader_term.rotate_left(32)
}

/// `ceil(rate * time)` in units, of a rate in millionths of a unit per second.
pub(super) fn need_units(micro_units_per_sec: u64, time: Duration) -> u64 {
    let nanos = u128::from(duration_nanos(time));
    // At most 1.8e19 * 3.2e16 (a year of nanoseconds): far inside u128.
    let need = (u128::from(micro_units_per_sec) * nanos)
        .div_ceil(crate::sync::MICRO_UNITS_PER_UNIT * 1_000_000_000);
    u64::try_from(need).unwrap_or(u64::MAX)
}

/// The forgotten-before mark of `limit`, if it was taken with windows of `window`'s length.
fn forgotten_mark(
    marks: &BTreeMap<LimitId, (Window, WindowIndex)>,
    limit: &LimitId,
    window: Window,
) -> Option<WindowIndex> {
    marks
        .get(limit)
        .filter(|(w, _)| *w == window)
        .map(|(_, i)| *i)
}

/// The oldest window some region may still be in: the one `slack` ago on our clock, at most
/// [`MAX_SKEW_REACH_WINDOWS`] windows back.
fn first_live(window: Window, now: Timestamp, slack: Duration) -> WindowIndex {
    let reach = slack.min(window.len() * MAX_SKEW_REACH_WINDOWS as u32);
    window.index(now.saturating_sub(reach))
}
