//! The region's view: its contact with the coordinator, and the clock sample of the last
//! round trip.
//!
//! Contact is the agent-clock send time of the latest SyncUp that got an answer. Anything in
//! an answer is aged from that send time, never from the coordinator's clock, so a slow or
//! delayed answer can only make the region more conservative.

use std::time::Duration;

use super::restore::Restore;
use super::timebase::{ClockCorrection, ClockGuard};
use crate::sync::ClockSample;
use crate::time::Timestamp;

#[derive(Clone, Debug)]
pub(crate) struct View {
    ttl: Duration,
    /// Send time (agent clock) of the latest answered SyncUp; `None` before the first answer.
    contact_at: Option<Timestamp>,
    clock: Option<ClockSample>,
    /// The `leader_term` of the answer `clock` was measured with (0 before the first).
    clock_term: u64,
    /// Send time (agent clock) of the round trip `clock` was measured on.
    clock_sent_at: Option<Timestamp>,
    /// The timebase's edge band and guard, as the driver last set them.
    edge_band: Option<Duration>,
    guard: Option<ClockGuard>,
    /// The timebase's correction, as the driver last set it (persisted).
    clock_correction: Option<ClockCorrection>,
    /// Time up to which expired periods have been handed out as "time open".
    open_accounted_until: Option<Timestamp>,
    /// A start that may have lost state: ends (or closes earlier windows) at the first answer.
    pub restore: Restore,
    /// The configuration version changed here and no answer at the new one has come yet.
    /// Grants apply only between equal versions, so a row the table holds for this region
    /// below its default under the new version (a window others were grown into while it was
    /// removed or silent) has not reached it: under the closed policy its strict keys hold
    /// as if the view had expired until that answer (swarm seed 954). Not persisted: a
    /// restart starts with no contact, which holds them the same way.
    pub version_unheard: bool,
    /// The version in force before a change that skipped one, until an answer at the
    /// version now in force: the table may have lowered this region's rows at the version
    /// it skipped, so under the closed policy its strict keys hold at their use within their
    /// grants (`RegionBudget::set_config_version`). Persisted as the version the stored
    /// grants were made under, so a restart before that answer skips again.
    pub version_skipped_from: Option<u64>,
    /// The last answer at this version left rows below the default for later answers
    /// (`SyncDown::below_default_left`): strict keys hold as if closed until one says none
    /// are left. Not persisted: a restart starts with no contact, which holds them the same
    /// way, and the leader resends every row to a restarted region.
    pub below_default_left: bool,
    /// When an answer found the view expired (it had lapsed since the answer before), until
    /// an answer to a SyncUp sent after that comes back: the lapse is reported in every
    /// SyncUp until then. A view whose TTL is near the sync interval lapses for about a round
    /// trip between answers, between two sends, where `is_expired` at the send never sees
    /// it, while the region admits by its partition policy (swarm seed 3031785).
    lapsed_at: Option<Timestamp>,
}

impl View {
    pub fn new(ttl: Duration) -> Self {
        View {
            ttl,
            contact_at: None,
            clock: None,
            clock_term: 0,
            clock_sent_at: None,
            edge_band: None,
            guard: None,
            clock_correction: None,
            open_accounted_until: None,
            restore: Restore::default(),
            version_unheard: false,
            version_skipped_from: None,
            below_default_left: false,
            lapsed_at: None,
        }
    }

    /// Expired: no contact yet, or the last contact is older than the TTL.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.contact_at
            .is_none_or(|c| now.saturating_duration_since(c) > self.ttl)
    }

    /// The oldest send time whose answer is still fresh at `now`: `now - ttl`.
    pub fn fresh_since(&self, now: Timestamp) -> Timestamp {
        // Saturating: never before the epoch.
        now - self.ttl
    }

    /// The first instant at which the view is expired (while it is fresh).
    pub fn expires_at(&self) -> Option<Timestamp> {
        self.contact_at
            .map(|c| c + self.ttl + Duration::from_nanos(1))
    }

    /// Expired now, or lapsed since the last SyncUp the coordinator answered: what a SyncUp
    /// reports as `view_expired`.
    pub fn expired_since_reported(&self, now: Timestamp) -> bool {
        self.is_expired(now) || self.lapsed_at.is_some()
    }

    pub fn contact_at(&self) -> Option<Timestamp> {
        self.contact_at
    }

    pub fn clock(&self) -> Option<ClockSample> {
        self.clock
    }

    pub fn clock_term(&self) -> u64 {
        self.clock_term
    }

    /// An answer of the leader of `leader_term` arrived: contact dates from the send time of
    /// the SyncUp it answers, and the clock sample describes that leader's clock.
    pub fn on_answer(&mut self, rt: RoundTrip, leader_term: u64) {
        let t0 = rt.sent_at;
        if self.lapsed_at.is_some_and(|at| t0 > at) {
            self.lapsed_at = None;
        }
        if self.contact_at.is_some() && self.is_expired(rt.returned_at) {
            self.lapsed_at = Some(rt.returned_at);
        }
        self.contact_at = Some(self.contact_at.map_or(t0, |c| c.max(t0)));
        self.clock = Some(rt.clock_sample());
        self.clock_term = leader_term;
        self.clock_sent_at = Some(t0);
    }

    pub fn clock_round_trip(&self) -> Option<(Timestamp, ClockSample)> {
        Some((self.clock_sent_at?, self.clock?))
    }

    pub fn set_clock_guard(&mut self, band: Option<Duration>, guard: Option<ClockGuard>) {
        self.edge_band = band;
        self.guard = guard;
    }

    /// Returns whether it changed.
    pub fn set_clock_correction(&mut self, c: ClockCorrection) -> bool {
        let changed = self.clock_correction != Some(c);
        self.clock_correction = Some(c);
        changed
    }

    pub fn clock_correction(&self) -> Option<ClockCorrection> {
        self.clock_correction
    }

    pub fn edge_band(&self) -> Option<Duration> {
        self.edge_band
    }

    pub fn guard(&self) -> Option<ClockGuard> {
        self.guard
    }

    /// The expired stretch of time between the last call and `now`, if any: the span during
    /// which an open partition policy was in force.
    pub fn take_expired_span(&mut self, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let span = self.expired_span(now);
        self.open_accounted_until = Some(self.open_accounted_until.unwrap_or(now).max(now));
        span
    }

    /// What [`Self::take_expired_span`] would hand out at `now`, without handing it out: the
    /// time open not yet in the statistics.
    pub fn expired_span(&self, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let from = self.open_accounted_until.unwrap_or(now);
        let expired_from = match self.contact_at {
            None => from,
            Some(c) => from.max(c + self.ttl),
        };
        (expired_from < now).then_some((expired_from, now))
    }
}

/// The four timestamps of one SyncUp/SyncDown round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RoundTrip {
    /// t0: the SyncUp left (agent clock).
    pub sent_at: Timestamp,
    /// t1: the coordinator received it (its clock).
    pub received_at: Timestamp,
    /// t2: the coordinator sent the answer (its clock).
    pub answered_at: Timestamp,
    /// t3: the answer arrived (agent clock).
    pub returned_at: Timestamp,
}

impl RoundTrip {
    /// NTP's estimate: `offset = ((t1 - t0) + (t2 - t3)) / 2` (positive when the coordinator's
    /// clock is ahead) and `round trip = (t3 - t0) - (t2 - t1)`, never negative.
    pub fn clock_sample(&self) -> ClockSample {
        ClockSample::from_round_trip(
            self.sent_at,
            self.received_at,
            self.answered_at,
            self.returned_at,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Timestamp {
        Timestamp::from_unix_millis(v)
    }

    fn rt(t0: u64, t1: u64, t2: u64, t3: u64) -> RoundTrip {
        RoundTrip {
            sent_at: ms(t0),
            received_at: ms(t1),
            answered_at: ms(t2),
            returned_at: ms(t3),
        }
    }

    /// TTL 100 ms, answers every 100 ms after a 30 ms round trip: between `send + 100 ms`
    /// and the next answer the view has lapsed, though at every send it is (just) fresh. The
    /// lapse is reported until an answer to a SyncUp sent after it comes back.
    #[test]
    fn a_lapse_between_sends_is_reported_until_a_later_sync_up_is_answered() {
        let mut v = View::new(Duration::from_millis(100));
        v.on_answer(rt(0, 0, 0, 30), 1);
        assert!(!v.expired_since_reported(ms(100)), "fresh at the next send");
        // The answer to the send at 100 comes at 130: the view lapsed from 100 to 130.
        v.on_answer(rt(100, 100, 100, 130), 1);
        assert!(!v.is_expired(ms(200)));
        assert!(
            v.expired_since_reported(ms(200)),
            "the lapse rides the next SyncUp"
        );
        // The answer to the send at 200 (after the lapse) clears it, but it lapsed again.
        v.on_answer(rt(200, 200, 200, 230), 1);
        assert!(v.expired_since_reported(ms(300)));
        // Answers that come in time report nothing.
        let mut v = View::new(Duration::from_millis(100));
        v.on_answer(rt(0, 0, 0, 30), 1);
        v.on_answer(rt(90, 90, 90, 95), 1);
        v.on_answer(rt(180, 180, 180, 185), 1);
        assert!(!v.expired_since_reported(ms(270)));
    }

    #[test]
    fn clock_sample_worked_example() {
        // Sent at 1000 (agent), received at 1120 and answered at 1130 (coordinator, which runs
        // 100 ms ahead), back at 1050 (agent). One-way delay 20 ms each way, 10 ms inside.
        // offset = ((1120 - 1000) + (1130 - 1050)) / 2 = (120 + 80) / 2 = 100 ms
        // round trip = (1050 - 1000) - (1130 - 1120) = 40 ms
        let s = rt(1000, 1120, 1130, 1050).clock_sample();
        assert_eq!(s.offset_nanos, 100_000_000);
        assert_eq!(s.round_trip_nanos, 40_000_000);
    }

    #[test]
    fn a_coordinator_clock_behind_gives_a_negative_offset() {
        // Coordinator 300 ms behind, instant links: t1 = t2 = t0 - 300.
        let s = rt(1000, 700, 700, 1000).clock_sample();
        assert_eq!(s.offset_nanos, -300_000_000);
        assert_eq!(s.round_trip_nanos, 0);
    }

    #[test]
    fn the_view_expires_strictly_after_its_ttl() {
        let mut v = View::new(Duration::from_secs(2));
        assert!(v.is_expired(ms(0)), "no contact yet");
        v.on_answer(rt(10_000, 10_010, 10_011, 10_030), 1);
        assert!(
            !v.is_expired(ms(12_000)),
            "exactly the TTL old is still fresh"
        );
        assert!(v.is_expired(ms(12_001)));
        assert_eq!(v.expires_at(), Some(ms(12_000) + Duration::from_nanos(1)));
    }

    #[test]
    fn a_late_answer_to_an_older_sync_never_moves_contact_back() {
        let mut v = View::new(Duration::from_secs(2));
        v.on_answer(rt(5_000, 5_000, 5_000, 5_100), 1);
        v.on_answer(rt(4_000, 4_000, 4_000, 5_200), 1);
        assert_eq!(v.contact_at(), Some(ms(5_000)));
    }

    #[test]
    fn answers_to_syncs_sent_a_ttl_ago_or_less_are_fresh() {
        let v = View::new(Duration::from_secs(2));
        assert_eq!(v.fresh_since(ms(10_000)), ms(8_000));
        assert_eq!(
            v.fresh_since(ms(1_000)),
            Timestamp::ZERO,
            "never before the epoch"
        );
    }

    #[test]
    fn expired_spans_are_handed_out_once() {
        let mut v = View::new(Duration::from_secs(2));
        v.on_answer(rt(1_000, 1_000, 1_000, 1_000), 1);
        assert_eq!(v.take_expired_span(ms(2_000)), None, "fresh");
        // Expired from 3,000 (contact + TTL); at 5,000 the span is 3,000..5,000.
        assert_eq!(v.take_expired_span(ms(5_000)), Some((ms(3_000), ms(5_000))));
        assert_eq!(v.take_expired_span(ms(6_000)), Some((ms(5_000), ms(6_000))));
    }
}
