//! One Envoy quota bucket: its id as an allot target, and the leases behind its assignments.
//!
//! Bucket ids. Envoy builds a bucket id (`bucket_id_builder`) as a map of strings. The
//! convention: an entry named `domain` names the limits file's domain (without one, the
//! filter's own `domain`, sent with every report, is used); every other entry is one
//! descriptor entry, key and value. A map has no order, so the descriptor's entries are taken
//! in byte order of their keys: a nested rule (`tenant` then `api_key`) matches when its keys
//! are written in that order in the limits file, or when each level is its own bucket.
//!
//! Leases. Each token bucket shape sent is backed by one lease of the bucket's key, topped up
//! as later assignments repeat the shape and extend its life (Envoy keeps its bucket then).
//! Reported usage is charged to the held leases oldest first. A lease is ended at the first
//! report [`SUPERSEDED_SETTLE`] or more after a newer assignment replaced it, so the usage
//! Envoy admitted under it while the new assignment was on its way has been reported and is
//! charged to it; whatever a lease did not use goes back to the region, and usage above it is
//! settled as overage.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use allot_core::ids::{LeaseId, LimitId};
use allot_core::time::{Timestamp, WindowIndex};
use allot_proto::envoy::rlqs::BucketId;

use super::policy::Shape;
use crate::request::Target;
use crate::settings::{MAX_DOMAIN_BYTES, MAX_ENTRIES_PER_DESCRIPTOR, MAX_ENTRY_BYTES};

/// The bucket id entry that names the domain.
pub const DOMAIN_ENTRY: &str = "domain";
/// Most leases one bucket holds: the one behind the assignment in force and those replaced
/// within the last [`SUPERSEDED_SETTLE`], at most one per `MIN_REASSIGN_GAP` (500 ms).
pub const MAX_LEASES_PER_BUCKET: usize = 3;

/// How long after a newer assignment was sent the lease it replaced is ended: the new
/// assignment's way to Envoy and the way back of the report that tells what Envoy admitted
/// under the old one until it arrived. The same second as the TTL's margin before a lease's
/// expiry (`Session::ttl_for`). Ended at the next report instead, a lease whose replacement
/// was still travelling gave back units Envoy went on spending: with reports every 500 ms and
/// answers 900 ms on their way, a key admitted 1 or 2 units past its quota
/// (tests/rlqs_envoy_model.rs).
pub const SUPERSEDED_SETTLE: Duration = Duration::from_secs(1);

/// A bucket id in canonical (sorted) form: the stream's key for the bucket.
pub type BucketKey = BTreeMap<String, String>;

/// Why a bucket id was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBucket(pub String);

/// The bucket id's canonical form and its target.
pub fn parse(report_domain: &str, id: Option<&BucketId>) -> Result<(BucketKey, Target), BadBucket> {
    let id = id.ok_or_else(|| BadBucket("a usage report without a bucket id".into()))?;
    if id.bucket.len() > MAX_ENTRIES_PER_DESCRIPTOR + 1 {
        return Err(BadBucket(format!(
            "a bucket id has at most {} entries, found {}",
            MAX_ENTRIES_PER_DESCRIPTOR + 1,
            id.bucket.len()
        )));
    }
    let key: BucketKey = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let domain = key
        .get(DOMAIN_ENTRY)
        .map_or(report_domain, String::as_str)
        .to_owned();
    if domain.is_empty() || domain.len() > MAX_DOMAIN_BYTES {
        return Err(BadBucket(format!(
            "the domain (a `{DOMAIN_ENTRY}` entry, or the filter's domain) must have 1 to \
             {MAX_DOMAIN_BYTES} bytes"
        )));
    }
    let entries: Vec<(String, String)> = key
        .iter()
        .filter(|(k, _)| k.as_str() != DOMAIN_ENTRY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if entries.is_empty() {
        return Err(BadBucket(
            "a bucket id needs at least one entry besides the domain".into(),
        ));
    }
    if let Some((k, _)) = entries
        .iter()
        .find(|(k, v)| k.is_empty() || k.len() > MAX_ENTRY_BYTES || v.len() > MAX_ENTRY_BYTES)
    {
        return Err(BadBucket(format!(
            "bucket entry {k:?}: keys must have 1 to {MAX_ENTRY_BYTES} bytes, values at most \
             {MAX_ENTRY_BYTES}"
        )));
    }
    Ok((key, Target { domain, entries }))
}

/// The bucket id Envoy sent, from its canonical form.
pub fn bucket_id(key: &BucketKey) -> BucketId {
    BucketId {
        bucket: key
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>(),
    }
}

/// A lease held behind an assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub lease: LeaseId,
    pub units: u64,
    /// Reported usage charged to it so far (may exceed `units`: Envoy's fallback).
    pub used_units: u64,
    /// Usage charged to it when it was granted (reported before its assignment existed).
    pub pre_used_units: u64,
    /// Replaced (`Some`): it ends at the first report at or after this instant,
    /// [`SUPERSEDED_SETTLE`] after the replacement was sent, or at once for a lease no
    /// assignment sent was backed by.
    pub ends_from: Option<Timestamp>,
    pub expires_at: Timestamp,
    /// The token bucket it backs, and when that shape was first sent.
    pub shape: Shape,
    pub shape_from: Timestamp,
}

/// A lease granted for a new assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewLease {
    pub lease: LeaseId,
    pub units: u64,
    pub expires_at: Timestamp,
    pub shape: Shape,
}

/// What [`Bucket::drop_expired`] forgot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Usage charged beyond the leases' units, by an instant of the window it belongs to.
    pub beyond: Vec<(Timestamp, u64)>,
    /// The units they left unused: what usage reported after them may still have been
    /// admitted under them.
    pub room_units: u64,
}

/// What Envoy may have admitted under a lease that no report has told when the lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untold {
    /// Nothing: its usage has all been reported (a replaced lease, D79; a reload, whose
    /// rule no longer counts).
    Nothing,
    /// What Envoy admits while the abandon travels, just after a report (an idle bucket).
    InFlight,
    /// Anything up to the whole lease: Envoy has not reported for several intervals.
    Unknown,
}

/// How a held lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Used no more than its units: the rest goes back.
    Release { lease: LeaseId, unused_units: u64 },
    /// Used more: settled at its actual use, the excess charged as overage.
    Settle { lease: LeaseId, actual_units: u64 },
}

impl Held {
    /// How it ends when dropped while Envoy may still admit under it: Envoy learns of the
    /// abandon a transit later, and until then a full token bucket admits its burst and at
    /// most one fill more, never reported. Those units stay charged (counted spent); only
    /// the rest goes back.
    pub fn ending_in_flight(&self) -> Ending {
        match self.ending() {
            Ending::Release {
                lease,
                unused_units,
            } => Ending::Release {
                lease,
                unused_units: unused_units.saturating_sub(self.shape.in_flight_units()),
            },
            settle => settle,
        }
    }

    /// An instant inside the lease's window: its last nanosecond alive (no lease outlives
    /// its window).
    pub fn in_window(&self) -> Timestamp {
        self.expires_at.saturating_sub(Duration::from_nanos(1))
    }

    /// How it ends, given what Envoy may have admitted under it untold: a lease whose usage
    /// is unknown gives nothing back.
    pub fn ending_with(&self, untold: Untold) -> Ending {
        match untold {
            Untold::Nothing => self.ending(),
            Untold::InFlight => self.ending_in_flight(),
            Untold::Unknown => match self.ending() {
                Ending::Release { lease, .. } => Ending::Release {
                    lease,
                    unused_units: 0,
                },
                settle => settle,
            },
        }
    }

    pub fn ending(&self) -> Ending {
        if self.used_units <= self.units {
            Ending::Release {
                lease: self.lease,
                unused_units: self.units - self.used_units,
            }
        } else {
            Ending::Settle {
                lease: self.lease,
                actual_units: self.used_units,
            }
        }
    }
}

/// What the agent last decided for a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assigned {
    /// Not yet decided.
    Nothing,
    /// No rule matches (or the rule counts nothing): allowed, not counted.
    Uncounted,
    /// Counted under this rule.
    Rule(LimitId),
}

/// One bucket of one stream.
#[derive(Debug)]
pub struct Bucket {
    pub target: Target,
    pub assigned: Assigned,
    /// Oldest first; the newest backs the assignment in force.
    pub leases: VecDeque<Held>,
    /// Usage reported while no lease was held (Envoy's `no_assignment_behavior`, or usage
    /// above every held lease once all had ended): charged to the next lease granted.
    pub unbacked_units: u64,
    /// When the usage in `unbacked_units` began to wait (the report's time): the window it
    /// was admitted in, as near as the reports tell.
    pub unbacked_since: Option<Timestamp>,
    pub rate_per_sec: u64,
    /// When its last report arrived (agent time): a report's usage was admitted since.
    pub last_report_at: Option<Timestamp>,
    /// A report received before any rule was known to count the bucket: when its interval
    /// began and what it allowed, to charge across a window's end once the rule is known.
    pub unruled_report: Option<(Timestamp, u64)>,
    /// When the agent last sized an assignment for it (a flood of reports is only counted).
    pub assigned_at: Option<tokio::time::Instant>,
    pub reported_at: tokio::time::Instant,
    /// Reports of it so far (saturating).
    pub reports: u32,
    /// Reports in a row with no request, allowed or denied: an idle bucket.
    pub idle_reports: u32,
}

impl Bucket {
    pub fn new(target: Target, now: tokio::time::Instant) -> Bucket {
        Bucket {
            target,
            assigned: Assigned::Nothing,
            leases: VecDeque::new(),
            unbacked_units: 0,
            unbacked_since: None,
            rate_per_sec: 0,
            last_report_at: None,
            unruled_report: None,
            assigned_at: None,
            reported_at: now,
            reports: 0,
            idle_reports: 0,
        }
    }

    /// Counts a report of `requests` (allowed and denied) toward the idle streak.
    pub fn note_requests(&mut self, requests: u64) {
        self.idle_reports = if requests == 0 {
            self.idle_reports.saturating_add(1)
        } else {
            0
        };
    }

    /// Charges `allowed` reported requests (reported at `now`) to the held leases, oldest
    /// first; what none has room for goes to the oldest (settled as overage), or waits for
    /// the next lease.
    pub fn charge(&mut self, allowed: u64, now: Timestamp) {
        if self.assigned == Assigned::Uncounted {
            return;
        }
        let mut left = allowed;
        for h in self.leases.iter_mut() {
            let room = h.units.saturating_sub(h.used_units);
            let take = room.min(left);
            h.used_units += take;
            left -= take;
        }
        if left == 0 {
            return;
        }
        match self.leases.front_mut() {
            Some(oldest) => oldest.used_units = oldest.used_units.saturating_add(left),
            None => {
                if self.unbacked_units == 0 {
                    self.unbacked_since = Some(now);
                }
                self.unbacked_units = self.unbacked_units.saturating_add(left);
            }
        }
    }

    /// Forgets leases past their expiry: the region counted them as spent whole, so usage
    /// reported from now on goes to newer leases (counted twice at worst, never missed).
    /// Returns the usage charged to them beyond their units, which no lease holds any more,
    /// by the window it belongs to (`Held::in_window`), and the units they left unused.
    pub fn drop_expired(&mut self, now: Timestamp) -> Expired {
        let mut expired = Expired::default();
        self.leases.retain(|h| {
            if h.expires_at > now {
                return true;
            }
            if h.used_units > h.units {
                expired.beyond.push((h.in_window(), h.used_units - h.units));
            } else {
                expired.room_units += h.units - h.used_units;
            }
            false
        });
        expired
    }

    /// The rule counting it, if it is counted.
    pub fn counted_by(&self) -> Option<&LimitId> {
        match &self.assigned {
            Assigned::Rule(id) => Some(id),
            Assigned::Nothing | Assigned::Uncounted => None,
        }
    }

    /// Usage reported that no lease will ever be charged with once the stream forgets the
    /// bucket as it is, by the window it belongs to: what waits for a lease, and what its
    /// leases hold beyond their units.
    pub fn uncharged_if_forgotten(&self, now: Timestamp) -> Vec<(Timestamp, u64)> {
        let mut out: Vec<(Timestamp, u64)> = self
            .leases
            .iter()
            .filter(|h| h.used_units > h.units)
            .map(|h| (h.in_window(), h.used_units - h.units))
            .collect();
        if self.unbacked_units > 0 {
            out.push((self.unbacked_since.unwrap_or(now), self.unbacked_units));
        }
        out
    }

    /// Takes out the usage waiting for a lease when it was reported in another window than
    /// `window` (the one of the lease about to take it, per `window_of`): charged to that
    /// lease it would count in a window it was not admitted in. Returns when it was reported
    /// and how much.
    pub fn take_unbacked_unless_in(
        &mut self,
        window: WindowIndex,
        window_of: impl Fn(Timestamp) -> Option<WindowIndex>,
    ) -> Option<(Timestamp, u64)> {
        let since = self.unbacked_since?;
        if self.unbacked_units == 0 || window_of(since) == Some(window) {
            return None;
        }
        self.unbacked_since = None;
        Some((since, std::mem::take(&mut self.unbacked_units)))
    }

    /// Takes out the leases a newer assignment replaced [`SUPERSEDED_SETTLE`] or more before
    /// `now`: their usage has been reported since.
    pub fn take_superseded(&mut self, now: Timestamp) -> Vec<Held> {
        let settled = |h: &Held| h.ends_from.is_some_and(|at| at <= now);
        let (done, kept): (Vec<Held>, Vec<Held>) = self.leases.drain(..).partition(settled);
        self.leases = kept.into();
        done
    }

    /// The lease behind the assignment in force, if any.
    pub fn current_mut(&mut self) -> Option<&mut Held> {
        self.leases.back_mut().filter(|h| h.ends_from.is_none())
    }

    /// The assignment in force is being replaced at `now`: its lease ends at the first report
    /// [`SUPERSEDED_SETTLE`] or more later.
    pub fn supersede_current(&mut self, now: Timestamp) {
        if let Some(h) = self.current_mut() {
            h.ends_from = Some(now.saturating_add(SUPERSEDED_SETTLE));
        }
    }

    /// The lease just pushed backs no assignment sent (a deny went instead): Envoy admits
    /// nothing under it, so it ends at the next report, with no margin to wait.
    pub fn supersede_unsent(&mut self, now: Timestamp) {
        if let Some(h) = self.current_mut() {
            h.ends_from = Some(now);
        }
    }

    /// Takes out every lease (the bucket is abandoned).
    pub fn take_all(&mut self) -> Vec<Held> {
        self.leases.drain(..).collect()
    }

    /// A new lease behind the assignment about to be sent at `now`, its shape first sent then
    /// (the one in force is replaced); unbacked usage is charged to it.
    pub fn push(&mut self, lease: NewLease, now: Timestamp) {
        self.supersede_current(now);
        let used_units = std::mem::take(&mut self.unbacked_units);
        self.unbacked_since = None;
        self.leases.push_back(Held {
            lease: lease.lease,
            units: lease.units,
            used_units,
            pre_used_units: used_units,
            ends_from: None,
            expires_at: lease.expires_at,
            shape: lease.shape,
            shape_from: now,
        });
    }

    /// Whether a new assignment may be sized now: at most one per `gap`.
    pub fn may_reassign(&self, now: tokio::time::Instant, gap: Duration) -> bool {
        self.assigned_at
            .is_none_or(|at| now.duration_since(at) >= gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(entries: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_domain_entry_names_the_domain_and_the_rest_are_entries_in_key_order() {
        let (_, t) = parse(
            "filter",
            Some(&id(&[
                ("domain", "gw"),
                ("tenant", "t1"),
                ("api_key", "k1"),
            ])),
        )
        .unwrap();
        assert_eq!(t.domain, "gw");
        assert_eq!(
            t.entries,
            vec![
                ("api_key".to_owned(), "k1".to_owned()),
                ("tenant".to_owned(), "t1".to_owned())
            ]
        );
        let (_, t) = parse("filter", Some(&id(&[("api_key", "k1")]))).unwrap();
        assert_eq!(t.domain, "filter", "without a domain entry: the filter's");
    }

    #[test]
    fn unknown_shapes_are_refused_with_a_reason() {
        assert!(parse("d", None).is_err());
        assert!(parse("d", Some(&id(&[("domain", "gw")]))).is_err());
        assert!(parse("", Some(&id(&[("k", "v")]))).is_err());
        assert!(parse("d", Some(&id(&[("", "v")]))).is_err());
        let long = "x".repeat(MAX_ENTRY_BYTES + 1);
        assert!(parse("d", Some(&id(&[("k", long.as_str())]))).is_err());
        let many: Vec<(String, String)> = (0..=MAX_ENTRIES_PER_DESCRIPTOR + 1)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(parse("d", Some(&id(&many))).is_err());
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    /// A replaced lease is not ended at a report sooner than `SUPERSEDED_SETTLE` after its
    /// replacement was sent: Envoy may still be admitting under it, the replacement on its
    /// way, and that usage is reported only by a later report. Ended at the first report
    /// after the margin, with what it did not use.
    #[test]
    fn a_replaced_lease_ends_only_once_its_replacement_has_had_time_to_arrive() {
        let mut b = bucket();
        b.push(lease(1, 10), at(0));
        b.charge(4, at(200));
        b.push(lease(2, 10), at(500));
        assert!(
            b.take_superseded(at(1_000)).is_empty(),
            "a report 500 ms later"
        );
        assert!(b.take_superseded(at(1_499)).is_empty(), "999 ms later");
        // Envoy admitted 3 more under lease 1 before the new assignment reached it.
        b.charge(3, at(1_499));
        let done = b.take_superseded(at(1_500));
        assert_eq!(
            done.iter().map(Held::ending).collect::<Vec<_>>(),
            vec![Ending::Release {
                lease: LeaseId(1),
                unused_units: 3
            }]
        );
        assert_eq!(b.current_mut().map(|h| h.lease), Some(LeaseId(2)));
    }

    /// A lease kept behind a deny, never sent to Envoy, ends at the next report; the one whose
    /// assignment the deny replaced waits out the margin.
    #[test]
    fn a_lease_behind_a_deny_ends_at_the_next_report() {
        let mut b = bucket();
        b.push(lease(1, 10), at(0));
        b.push(lease(2, 10), at(5_000));
        b.supersede_unsent(at(5_000));
        let done = b.take_superseded(at(5_500));
        assert_eq!(
            done.iter().map(|h| h.lease).collect::<Vec<_>>(),
            vec![LeaseId(2)]
        );
        let done = b.take_superseded(at(6_000));
        assert_eq!(
            done.iter().map(|h| h.lease).collect::<Vec<_>>(),
            vec![LeaseId(1)]
        );
    }

    fn bucket() -> Bucket {
        let mut b = Bucket::new(Target::default(), tokio::time::Instant::now());
        b.assigned = Assigned::Rule(LimitId::new("r"));
        b
    }

    fn lease(id: u64, units: u64) -> NewLease {
        NewLease {
            lease: LeaseId(id),
            units,
            expires_at: Timestamp::from_unix_millis(0),
            shape: Shape {
                max_tokens: units,
                tokens_per_fill: 1,
                fill_interval_secs: 1,
            },
        }
    }

    #[test]
    fn usage_is_charged_oldest_first_and_excess_is_never_dropped() {
        let mut b = bucket();
        b.charge(2, Timestamp::from_unix_millis(0));
        assert_eq!(b.unbacked_units, 2, "no lease yet: waits for one");
        b.push(lease(1, 10), at(0));
        assert_eq!(b.leases[0].used_units, 2);
        assert_eq!(b.leases[0].pre_used_units, 2);
        assert!(b.take_superseded(at(5_000)).is_empty());
        b.push(lease(2, 10), at(5_000));
        assert_eq!(
            b.leases[0].ends_from,
            Some(at(6_000)),
            "replaced by the newer lease"
        );
        b.charge(12, Timestamp::from_unix_millis(0));
        assert_eq!(b.leases[0].used_units, 10);
        assert_eq!(b.leases[1].used_units, 4);
        b.charge(20, Timestamp::from_unix_millis(0));
        assert_eq!(b.leases[1].used_units, 10);
        assert_eq!(
            b.leases[0].used_units, 24,
            "excess to the oldest, as overage"
        );
        let done = b.take_superseded(at(6_000));
        assert_eq!(done.len(), 1);
        assert_eq!(
            done[0].ending(),
            Ending::Settle {
                lease: LeaseId(1),
                actual_units: 24
            }
        );
        assert_eq!(b.current_mut().map(|h| h.lease), Some(LeaseId(2)));
        assert_eq!(
            b.leases[0].ending(),
            Ending::Release {
                lease: LeaseId(2),
                unused_units: 0
            }
        );
    }

    /// Usage waiting for a lease keeps the time it was reported: a lease of the same window
    /// takes it, one of a later window does not (it is that window's to count), and an
    /// expired lease's excess is told with an instant of its own window.
    #[test]
    fn waiting_usage_belongs_to_the_window_it_was_reported_in() {
        let minute = |ms: u64| WindowIndex(ms / 60_000);
        let window_of = |t: Timestamp| Some(minute(t.as_unix_millis()));
        let mut b = bucket();
        b.charge(3, Timestamp::from_unix_millis(59_000));
        b.charge(2, Timestamp::from_unix_millis(59_500));
        assert_eq!(b.unbacked_since, Some(Timestamp::from_unix_millis(59_000)));
        assert_eq!(b.take_unbacked_unless_in(minute(59_000), window_of), None);
        assert_eq!(
            b.take_unbacked_unless_in(minute(60_000), window_of),
            Some((Timestamp::from_unix_millis(59_000), 5))
        );
        assert_eq!((b.unbacked_units, b.unbacked_since), (0, None));
        assert_eq!(
            b.uncharged_if_forgotten(Timestamp::from_unix_millis(61_000)),
            vec![]
        );
        // A lease used past its units and expiring at the end of minute 1.
        b.push(lease(1, 10), at(100_000));
        b.leases[0].expires_at = Timestamp::from_unix_millis(120_000);
        b.charge(14, Timestamp::from_unix_millis(100_000));
        let end = Timestamp::from_unix_millis(120_000);
        let in_minute_1 = end.saturating_sub(Duration::from_nanos(1));
        assert_eq!(b.uncharged_if_forgotten(end), vec![(in_minute_1, 4)]);
        assert_eq!(
            b.drop_expired(end),
            Expired {
                beyond: vec![(in_minute_1, 4)],
                room_units: 0
            }
        );
        assert!(b.leases.is_empty());
        // One ending with units unused leaves them as room.
        b.push(lease(2, 10), at(120_000));
        b.leases[0].expires_at = Timestamp::from_unix_millis(180_000);
        b.charge(3, at(130_000));
        assert_eq!(
            b.drop_expired(Timestamp::from_unix_millis(180_000)),
            Expired {
                beyond: vec![],
                room_units: 7
            }
        );
    }

    #[test]
    fn uncounted_buckets_charge_nothing() {
        let mut b = bucket();
        b.assigned = Assigned::Uncounted;
        b.charge(5, Timestamp::from_unix_millis(0));
        assert_eq!(b.unbacked_units, 0);
    }

    #[test]
    fn a_bucket_is_idle_after_reports_in_a_row_with_no_request() {
        let mut b = bucket();
        b.note_requests(0);
        b.note_requests(0);
        assert_eq!(b.idle_reports, 2);
        b.note_requests(1);
        assert_eq!(
            b.idle_reports, 0,
            "any request, allowed or denied, ends the streak"
        );
        b.note_requests(0);
        assert_eq!(b.idle_reports, 1);
    }

    #[test]
    fn a_lease_dropped_while_envoy_may_still_admit_keeps_a_full_bucket_charged() {
        let mut b = bucket();
        b.push(lease(1, 100), at(0));
        b.charge(30, Timestamp::from_unix_millis(0));
        // Shape of `lease`: burst 100, one token per second; 70 unused, all of which a full
        // bucket could still admit before the abandon arrives.
        assert_eq!(
            b.leases[0].ending_in_flight(),
            Ending::Release {
                lease: LeaseId(1),
                unused_units: 0
            }
        );
        b.leases[0].shape.max_tokens = 10;
        assert_eq!(
            b.leases[0].ending_in_flight(),
            Ending::Release {
                lease: LeaseId(1),
                unused_units: 70 - 11
            },
            "burst 10 and one fill of 1 stay charged"
        );
        b.charge(100, Timestamp::from_unix_millis(0));
        assert_eq!(
            b.leases[0].ending_in_flight(),
            Ending::Settle {
                lease: LeaseId(1),
                actual_units: 130
            },
            "a lease used beyond its units is settled as before"
        );
    }

    /// A lease whose usage no report has told for several intervals gives nothing back: Envoy
    /// may have spent all of it since. One used past its units is still settled.
    #[test]
    fn a_lease_whose_usage_is_unknown_gives_nothing_back() {
        let mut b = bucket();
        b.push(lease(1, 100), at(0));
        b.charge(30, at(0));
        let h = b.leases[0];
        assert_eq!(
            h.ending_with(Untold::Nothing),
            Ending::Release {
                lease: LeaseId(1),
                unused_units: 70
            }
        );
        assert_eq!(
            h.ending_with(Untold::Unknown),
            Ending::Release {
                lease: LeaseId(1),
                unused_units: 0
            }
        );
        b.charge(100, at(0));
        assert_eq!(
            b.leases[0].ending_with(Untold::Unknown),
            Ending::Settle {
                lease: LeaseId(1),
                actual_units: 130
            }
        );
    }
}
