//! The messages between a region's budget machine and the coordinator's rebalancer.
//!
//! One `SyncUp` goes from an agent to the coordinator every sync interval; the coordinator
//! answers each with one `SyncDown`. Both are plain data: the daemons convert them to and from
//! protobuf at the boundary, and the simulator passes them through lossy links as they are.
//!
//! Every field is safe to duplicate, reorder or replay:
//! - counter entries are absolute values of monotone G-counters, merged by max;
//! - grants carry an epoch and an absolute allowance, applied only if newer;
//! - release requests carry an id, and the ack names it, so a repeated request is answered
//!   with the same ack and never released twice;
//! - a region's measurements for the bound only grow within a window, and are merged by max.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, LimitsConfig, LoadOptions, SourceFile};
use crate::ids::{Epoch, KeyId, LimitId, RegionId};
use crate::time::{Timestamp, WindowIndex, duration_nanos};

/// Most entries (counter entries, demand reports, grants, ...) one message carries; the rest
/// waits for the next interval. Bounds memory and message size whatever the key count.
pub const MAX_ITEMS_PER_MESSAGE: usize = 4096;

/// Fewest items a region or leader may be configured to put in one message
/// (`BudgetConfig::message_items`, `CoordinatorConfig::message_items`): a limit's bound figures
/// (at most `STATS_WINDOWS_KEPT` windows) go in one message, and a key's closing and current
/// entries with room to spare.
pub const MIN_ITEMS_PER_MESSAGE: usize = 4;

/// Most files one limits configuration is made of.
pub const MAX_CONFIG_FILES: usize = 64;

/// Most bytes of text (names and contents) one limits configuration holds. Real ones are
/// kilobytes; the bound keeps a configuration one raft entry that a full append (64 entries,
/// 16 MiB) carries, and a SyncDown that carries it within its 16 MiB.
pub const MAX_CONFIG_BYTES: usize = 192 * 1024;

/// One (limit, key, window) counter, as every state machine names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CounterRef {
    pub limit: LimitId,
    pub key: KeyId,
    pub window: WindowIndex,
}

/// One region's two monotone entries for one counter: net use is `granted - refunded`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterEntry {
    pub counter: CounterRef,
    pub region: RegionId,
    pub granted_units: u64,
    pub refunded_units: u64,
}

/// Millionths of a unit in a unit: demand rates are carried in these.
pub const MICRO_UNITS_PER_UNIT: u128 = 1_000_000;

/// Demand for an escalated key: what the region was asked for, including denied requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandReport {
    pub counter: CounterRef,
    /// Requested units per second over the recent past (including denied requests), in
    /// millionths of a unit: a key of a day window asked for 1 unit a second is 1,000,000, and
    /// one asked for 100 a day is still 1,157, not 0.
    pub demand_micro_units_per_sec: u64,
    /// The region's allowance for this counter as it enforces it with contact (its grants,
    /// releases or default share; not the closed partition policy's stop while its view is
    /// expired, which ends with the next answer).
    pub allowance_units: u64,
}

/// The coordinator's answer to escalation: region `region` may grant up to `allowance_units`
/// for `counter`. Absolute, not a delta; applied only when `epoch` is newer than the last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowanceGrant {
    pub counter: CounterRef,
    pub region: RegionId,
    pub allowance_units: u64,
    pub epoch: Epoch,
}

/// Strict mode's shrink: the coordinator asks a region to give back up to `units`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// Unique per coordinator table; the ack repeats it.
    pub id: u64,
    pub counter: CounterRef,
    pub units: u64,
    pub epoch: Epoch,
}

/// The region lowered its own allowance (never below its net use) and persisted it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseAck {
    pub id: u64,
    pub counter: CounterRef,
    pub released_units: u64,
    pub allowance_after_units: u64,
}

/// NTP-style clock sample computed by the agent from the previous round trip:
/// `offset = ((t1 - t0) + (t2 - t3)) / 2`, positive when the coordinator's clock is ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSample {
    pub offset_nanos: i64,
    pub round_trip_nanos: u64,
}

impl ClockSample {
    /// NTP's estimate from one round trip: sent at `t0` and back at `t3` on the sampling
    /// clock, received at `t1` and answered at `t2` on the sampled one. `offset = ((t1 - t0) +
    /// (t2 - t3)) / 2` (positive when the sampled clock is ahead), `round trip = (t3 - t0) -
    /// (t2 - t1)`, never negative.
    pub fn from_round_trip(t0: Timestamp, t1: Timestamp, t2: Timestamp, t3: Timestamp) -> Self {
        let ns = |t: Timestamp| i128::from(t.as_unix_nanos());
        let (t0, t1, t2, t3) = (ns(t0), ns(t1), ns(t2), ns(t3));
        let offset = ((t1 - t0) + (t2 - t3)) / 2;
        let round_trip = (t3 - t0) - (t2 - t1);
        let saturated = if offset < 0 { i64::MIN } else { i64::MAX };
        ClockSample {
            offset_nanos: i64::try_from(offset).unwrap_or(saturated),
            round_trip_nanos: u64::try_from(round_trip.max(0)).unwrap_or(u64::MAX),
        }
    }

    /// Two clocks known to be one (the same node's clock under two of its terms).
    pub const SAME_CLOCK: ClockSample = ClockSample {
        offset_nanos: 0,
        round_trip_nanos: 0,
    };

    /// How far the sampled clock may be from the sampling one: `|offset| + round trip / 2`.
    pub fn uncertainty(&self) -> Duration {
        Duration::from_nanos(
            self.offset_nanos
                .unsigned_abs()
                .saturating_add(self.round_trip_nanos / 2),
        )
    }

    /// This sample of clock A taken on clock B (`A - B`, as a region measures its leader)
    /// carried over to clock C, given `hop`, a sample of C taken on A (`C - A`, as a leader
    /// measures another node): `C - B = (C - A) + (A - B)`. The errors add too; the round
    /// trips carry them (half of each).
    pub fn through(self, hop: ClockSample) -> ClockSample {
        ClockSample {
            offset_nanos: self.offset_nanos.saturating_add(hop.offset_nanos),
            round_trip_nanos: self.round_trip_nanos.saturating_add(hop.round_trip_nanos),
        }
    }

    /// This sample `age` after it was taken, by clocks whose rates may differ by
    /// `drift_ppm`: its error grows by that share of the age (a round trip grows by twice).
    pub fn aged(self, age: Duration, drift_ppm: u64) -> ClockSample {
        let drift = u128::from(duration_nanos(age)) * u128::from(drift_ppm) / 1_000_000;
        let grown = u64::try_from(drift.saturating_mul(2)).unwrap_or(u64::MAX);
        ClockSample {
            offset_nanos: self.offset_nanos,
            round_trip_nanos: self.round_trip_nanos.saturating_add(grown),
        }
    }
}

/// What a region tells the coordinator about its timebase in every SyncUp: since `since` (its
/// corrected clock, within `max_uncertainty` of the coordinator's then) it has kept the edge
/// band of its measured uncertainty, or admitted nothing where that uncertainty was above
/// `max_uncertainty`. The skew term counts it at 0 in windows starting after `since` plus
/// `max_uncertainty` plus one window (a lease granted before `since` ends within a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockGuard {
    pub since: Timestamp,
    pub max_uncertainty: Duration,
}

/// What a region measured for one limit in one window (on its own clock) that the bound needs
/// and the coordinator cannot see for itself (docs/bound.md). Every figure only grows within
/// a window (across restarts too: the summed ones are persisted), so the coordinator merges
/// them by max and a resent or duplicated report changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWindowStats {
    pub limit: LimitId,
    pub window: WindowIndex,
    pub figures: BoundFigures,
}

/// The bound's region-side measurements of one limit and window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundFigures {
    /// Time the open partition policy was in force (the `fail_open` term).
    pub time_open: Duration,
    /// Units admitted beyond the allowance by the open partition policy.
    pub fail_open_units: u64,
    /// Units settled above their reservation (the `settle_overage` term).
    pub settle_overage_units: u64,
    /// Most units granted (acquires and leases, all keys) in one second of the window: the
    /// measured rate that shows how tight the eventual term is.
    pub peak_grant_units_per_sec: u64,
    /// Units settles claimed above the limit's settle cap (`max_settle_overage`), clamped:
    /// used by a spender that did not stop where the `settle_overage` term assumes, and
    /// charged nowhere. Any at all makes the window unbounded.
    #[serde(default)]
    pub settle_clamped_units: u64,
    /// Units a gateway reported admitted that no lease could be charged with (Envoy's
    /// fallback admissions reported when the key had nothing left to lease, or after the
    /// lease had expired): used, charged nowhere. Any makes the window unbounded.
    #[serde(default)]
    pub uncharged_units: u64,
}

impl BoundFigures {
    /// Element-wise max: how reports of the same window merge.
    pub fn max(self, other: BoundFigures) -> BoundFigures {
        BoundFigures {
            time_open: self.time_open.max(other.time_open),
            fail_open_units: self.fail_open_units.max(other.fail_open_units),
            settle_overage_units: self.settle_overage_units.max(other.settle_overage_units),
            peak_grant_units_per_sec: self
                .peak_grant_units_per_sec
                .max(other.peak_grant_units_per_sec),
            settle_clamped_units: self.settle_clamped_units.max(other.settle_clamped_units),
            uncharged_units: self.uncharged_units.max(other.uncharged_units),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == BoundFigures::default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncUp {
    pub region: RegionId,
    /// This start of the region's agent: larger at every start (the agent-clock time of the
    /// start's first SyncUp), so the coordinator tells a restart, even one from an old copy
    /// of the agent's state whose `seq` went back, from a late message.
    pub boot: u64,
    /// This start may have lost what an earlier copy of the region's state admitted: the
    /// operator declared a restore (`allot agent --restored`), or the agent found its store
    /// empty. Sent until the first answer of the boot, which says whether the coordinator
    /// knew the region (`SyncDown::known_region`).
    #[serde(default)]
    pub restored: bool,
    /// Increases by one per message from this region's state; the reply names it.
    pub seq: u64,
    /// t0, on the agent's clock.
    pub sent_at: Timestamp,
    pub config_version: u64,
    /// Entries changed since the last acknowledged sync (resent until acknowledged).
    pub entries: Vec<CounterEntry>,
    pub demand: Vec<DemandReport>,
    pub release_acks: Vec<ReleaseAck>,
    pub clock: Option<ClockSample>,
    /// The `leader_term` of the answer `clock` was measured with: a sample describes that
    /// leader's clock, not a later one's (0: not known, and not taken).
    #[serde(default)]
    pub clock_leader_term: u64,
    /// Measurements for the bound that changed since the coordinator last confirmed them.
    pub stats: Vec<LimitWindowStats>,
    /// The region's view has expired (no answer within `view_ttl`, or none yet): it admits
    /// by its partition policy. The leader may hear a region whose answers are lost, so
    /// hearing it does not tell the leader this; the bound's `partition_floor` term needs it.
    pub view_expired: bool,
    /// The region keeps an edge band on a corrected clock (docs/bound.md, skew): `None`
    /// without a timebase, or before its uncertainty was first within its maximum.
    #[serde(default)]
    pub clock_guard: Option<ClockGuard>,
}

impl SyncUp {
    /// A SyncUp that carries nothing: no entries, demand, acks, statistics or clock sample,
    /// not restored, its view not expired. Fill in the rest with `..SyncUp::new(..)`.
    pub fn new(region: RegionId, boot: u64, seq: u64, sent_at: Timestamp, version: u64) -> Self {
        SyncUp {
            region,
            boot,
            restored: false,
            seq,
            sent_at,
            config_version: version,
            entries: Vec::new(),
            demand: Vec::new(),
            release_acks: Vec::new(),
            clock: None,
            clock_leader_term: 0,
            stats: Vec::new(),
            view_expired: false,
            clock_guard: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncDown {
    /// The `seq` of the `SyncUp` this answers; the agent ages everything in this message from
    /// that message's `sent_at` on its own clock, never from the coordinator's clock.
    pub reply_to_seq: u64,
    /// The leader that answers: larger for every new leader. A new leader starts with no
    /// counter entries, demand or statistics (soft state), so a region that sees a larger term
    /// resends everything the previous leader had confirmed.
    pub leader_term: u64,
    /// t1 and t2, on the coordinator's clock.
    pub received_at: Timestamp,
    pub sent_at: Timestamp,
    pub config_version: u64,
    /// Every region's entries (this region's own included, so that a region restarted from an
    /// older copy of its state recovers them by max) for counters this region takes part in.
    /// A counter is answered whole: all the entries the coordinator holds for it, or none.
    pub entries: Vec<CounterEntry>,
    pub grants: Vec<AllowanceGrant>,
    pub release_requests: Vec<ReleaseRequest>,
    /// The coordinator had heard of the region before the boot of the SyncUp answered (an
    /// earlier boot, rows of its table, or entries of its counters): a region that found its
    /// store empty lost it, rather than starting for the first time.
    #[serde(default)]
    pub known_region: bool,
    /// The limits configuration of `config_version`, sent to a region whose SyncUp named
    /// another version; the region loads it as it loads its own files. `None` otherwise, and
    /// from a coordinator that holds limits without their files.
    #[serde(default)]
    pub config: Option<ConfigFiles>,
    /// Rows below the region's default (the zeroes of a reclaim, rows cut by a reload) that
    /// did not fit in this answer: they lead the next ones. Until an answer says none are
    /// left, the region holds its strict keys as if closed, since it cannot tell which of its
    /// counters they are (swarm seed 3216229: a removed region back with more zeroes than one
    /// answer carries enforced its default under the ones still to come).
    #[serde(default)]
    pub below_default_left: bool,
    /// Sent to a region whose boot says `restored`: the latest its clock may read now, as the
    /// boot before this one ran it (the leader's last sample of that boot, its error and the
    /// clocks' drift since added). The older copy the region lost may have admitted in any
    /// window begun before then: a restored start closes them. Without a timebase nothing else
    /// tells the region how far that clock ran (a step back between the two boots leaves the
    /// new one behind it: swarm seed 3384823). `None` when the leader has no sample of it.
    #[serde(default)]
    pub earlier_boot_clock_reach: Option<Timestamp>,
}

/// A limits configuration as the files it was loaded from, so that every end loads the same
/// rules with the same loader (`LimitsConfig::load`), matching trees included.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFiles {
    pub version: u64,
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`, as the files were checked with.
    pub merge_domains: bool,
    pub files: Vec<ConfigFile>,
}

/// One limits file: the name its errors are reported under, and its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFile {
    pub name: String,
    pub text: String,
}

impl ConfigFiles {
    /// Bytes of text: names and contents.
    pub fn text_bytes(&self) -> usize {
        self.files.iter().map(|f| f.name.len() + f.text.len()).sum()
    }

    /// Why these files cannot be a configuration before anything loads them: too many, too
    /// large, or a file without a name.
    pub fn check_size(&self) -> Result<(), String> {
        if self.files.is_empty() {
            return Err("a configuration needs at least one file".to_owned());
        }
        if self.files.len() > MAX_CONFIG_FILES {
            return Err(format!(
                "{} files, above the most, {MAX_CONFIG_FILES}",
                self.files.len()
            ));
        }
        if self.text_bytes() > MAX_CONFIG_BYTES {
            return Err(format!(
                "{} bytes of limits text, above the most, {MAX_CONFIG_BYTES}",
                self.text_bytes()
            ));
        }
        if let Some(i) = self.files.iter().position(|f| f.name.is_empty()) {
            return Err(format!("file {i} has no name"));
        }
        Ok(())
    }

    /// Loads the files with the configuration loader, or gives every problem in them.
    pub fn load(&self) -> Result<LimitsConfig, ConfigErrors> {
        let sources: Vec<SourceFile<'_>> = self
            .files
            .iter()
            .map(|f| SourceFile::new(&f.name, &f.text))
            .collect();
        LimitsConfig::load(
            &sources,
            &LoadOptions {
                merge_domains: self.merge_domains,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(offset_ms: i64, rtt_ms: u64) -> ClockSample {
        ClockSample {
            offset_nanos: offset_ms * 1_000_000,
            round_trip_nanos: rtt_ms * 1_000_000,
        }
    }

    /// A region 2 s behind leader 1 (`L1 - B = 2 s`), leader 2 0.5 s behind leader 1
    /// (`L2 - L1 = -0.5 s`): the region is 1.5 s behind leader 2, and both errors count.
    #[test]
    fn a_sample_carried_over_adds_offsets_and_errors() {
        let carried = sample(2_000, 40).through(sample(-500, 10));
        assert_eq!(carried, sample(1_500, 50));
        assert_eq!(carried.uncertainty(), Duration::from_millis(1_525));
        assert_eq!(carried.through(ClockSample::SAME_CLOCK), carried);
    }

    /// 1% over 10 s: 100 ms more error each way, 200 ms more round trip.
    #[test]
    fn an_aged_sample_grows_its_error_by_the_drift() {
        let aged = sample(7, 20).aged(Duration::from_secs(10), 10_000);
        assert_eq!(aged, sample(7, 220));
        let extreme = sample(0, u64::MAX / 1_000_000).aged(Duration::MAX, u64::MAX);
        assert_eq!(extreme.round_trip_nanos, u64::MAX);
    }

    /// Sent at 1,000 ms, received at 1,120 and answered at 1,130 on a clock ahead by 100 ms,
    /// back at 1,050: 100 ms ahead, 40 ms on the wire.
    #[test]
    fn a_round_trip_gives_the_ntp_estimate() {
        let ms = Timestamp::from_unix_millis;
        let s = ClockSample::from_round_trip(ms(1_000), ms(1_120), ms(1_130), ms(1_050));
        assert_eq!(s, sample(100, 40));
    }
}
