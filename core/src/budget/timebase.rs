//! One timebase for every region (docs/bound.md, skew; D22 in docs/decisions.md): the agent's
//! clock corrected by the offset it measures against the coordinator's at every sync, never
//! moving back, with a known bound on how far it may be from the coordinator's clock.
//!
//! The driver (the agent, the simulator's node) owns a [`Timebase`], reads every `now` it
//! passes to the budget through [`Timebase::read`], feeds it each answered round trip
//! ([`Timebase::on_sample`]), and hands the budget the edge band it must keep
//! ([`Timebase::band`]) and the guard it reports ([`Timebase::guard`]). Like the rest of the
//! core it reads no clock: the local time is passed in.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::sync::ClockGuard;
use crate::sync::ClockSample;
use crate::time::{Timestamp, duration_nanos};

/// The clock rate error assumed between two samples, in parts per million: the uncertainty
/// grows by this share of the time since the last sample. 1%, twenty times what NTP tolerates
/// of an oscillator, so it holds for any clock that is not broken; over a sync interval it
/// adds a few milliseconds at most, over a long partition it ends the guard (the region stops
/// admitting) before the error can pass the stated maximum.
pub const MAX_CLOCK_DRIFT_PPM: u64 = 10_000;

const PPM: u128 = 1_000_000;

/// A backward correction does not stop the clock: it runs at `1 / SLEW_DIVISOR` of local
/// speed until the corrected clock catches up. Stopped, nothing timed on it would pass (syncs,
/// view and lease expiries) for as long as the region was ahead, up to several windows, and
/// what it admitted meanwhile would go unreported; at half speed a region ahead by `H` syncs at
/// half its rate for `2 H`.
pub const SLEW_DIVISOR: u32 = 2;

/// What a restart needs to read on as the timebase did (persisted with the budget's state,
/// `PersistRecord::ClockCorrection`): the correction, and the slowed run after a backward one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockCorrection {
    pub correction_nanos: i64,
    /// The local time and the reading a slowed run started from, until the estimate catches up.
    pub slowed_from: Option<(Timestamp, Timestamp)>,
}

/// A region's corrected clock.
#[derive(Clone, Debug)]
pub struct Timebase {
    /// `U`: above it the region admits nothing new in strict mode.
    max_uncertainty: Duration,
    /// Added to the local clock: the sum of the offsets measured so far.
    correction_nanos: i64,
    /// The latest reading handed out: readings never go back.
    last_read: Timestamp,
    /// After a backward correction: the local time and reading it was taken at, from which
    /// the clock runs slow until `local + correction` catches up.
    slew_from: Option<(Timestamp, Timestamp)>,
    /// Readings from this one on are `local + correction` again (after the last change of the
    /// correction, and after the wait a backward change holds the clock for). A round trip
    /// sent before it measured a clock that changed or stood still: it is not taken.
    steady_from: Timestamp,
    /// The last sample taken: the local time its round trip left, and half its round trip
    /// (the estimate's error, NTP's bound).
    sample: Option<(Timestamp, u64)>,
    /// The guard reported once the uncertainty first came within `max_uncertainty`.
    guarded_since: Option<Timestamp>,
    /// Restarted from a store written on a corrected clock: until the first sample, strict
    /// admission waits (the raw clock may be windows away from what the store counted on).
    hold_until_sampled: bool,
    /// Samples that found the clock further off than its uncertainty allowed: the rate error
    /// was above [`MAX_CLOCK_DRIFT_PPM`], or the clock was stepped (docs/bound.md, skew).
    assumption_breaks: u64,
    /// The latest local time passed in: one earlier is a step back of the local clock.
    last_local: Timestamp,
}

impl Timebase {
    pub fn new(max_uncertainty: Duration) -> Self {
        Timebase {
            max_uncertainty,
            correction_nanos: 0,
            last_read: Timestamp::ZERO,
            slew_from: None,
            steady_from: Timestamp::ZERO,
            sample: None,
            guarded_since: None,
            hold_until_sampled: false,
            assumption_breaks: 0,
            last_local: Timestamp::ZERO,
        }
    }

    /// A timebase for an agent restarted from its store, at local time `local`: its counters
    /// and leases are on the corrected clock it had. It reads on the correction the store kept
    /// (`RegionBudget::clock_correction`; none in a store written before the first sample,
    /// or lost with it), so that the region does not go back into windows it has left nor
    /// forward past grants, and never before `floor`, the latest time the store was written
    /// at (`RegionBudget::time_floor`): a local clock stepped back while the agent was down
    /// is taken into the correction as a step back of a running one is. How far that is
    /// from the coordinator's clock is not known until the first sample: until then it
    /// admits nothing in strict mode.
    pub fn restarted(
        max_uncertainty: Duration,
        stored: Option<ClockCorrection>,
        floor: Timestamp,
        local: Timestamp,
    ) -> Self {
        let mut tb = Timebase {
            hold_until_sampled: true,
            last_local: local,
            ..Timebase::new(max_uncertainty)
        };
        if let Some(c) = stored {
            tb.correction_nanos = c.correction_nanos;
            tb.slew_from = c.slowed_from;
            // A round trip sent while the clock runs slow is not taken, as before the restart.
            tb.steady_from = c
                .slowed_from
                .map_or(Timestamp::ZERO, |(local, from)| tb.slow_until(local, from));
        }
        // As a step back: the estimate goes on from the floor. A slowed run gains half of it
        // (it runs at half speed from its start's local time, which moves back too); the
        // reading holds at the floor until one of them passes it.
        tb.shift_back(floor.saturating_duration_since(tb.peek(local)));
        tb.last_read = tb.last_read.max(floor);
        tb
    }

    /// The correction in force: what the driver hands the budget to persist.
    pub fn correction(&self) -> ClockCorrection {
        ClockCorrection {
            correction_nanos: self.correction_nanos,
            slowed_from: self.slew_from,
        }
    }

    /// The reading at which a run slowed from reading `from` at local time `local` meets the
    /// estimate again.
    fn slow_until(&self, local: Timestamp, from: Timestamp) -> Timestamp {
        let behind = from.saturating_duration_since(shift(local, self.correction_nanos));
        from + behind / SLEW_DIVISOR.saturating_sub(1).max(1)
    }

    /// `local + correction`: the corrected estimate of local time `local`, even one before
    /// the latest reading (for dating a past event, such as a restored start, on it).
    pub fn estimate(&self, local: Timestamp) -> Timestamp {
        shift(local, self.correction_nanos)
    }

    /// [`Timebase::read`] without moving anything: what a reading at `local` would be.
    pub fn peek(&self, local: Timestamp) -> Timestamp {
        let slewed = self
            .slew_from
            .map_or(Timestamp::ZERO, |(from_local, from)| {
                from + local.saturating_duration_since(from_local) / SLEW_DIVISOR
            });
        shift(local, self.correction_nanos)
            .max(slewed)
            .max(self.last_read)
    }

    /// The corrected time at local time `local`: `local + correction`, or, after a backward
    /// correction, the slowed clock until that catches up ([`SLEW_DIVISOR`]).
    pub fn read(&mut self, local: Timestamp) -> Timestamp {
        self.absorb_step_back(local);
        let t = self.peek(local);
        self.last_read = t;
        if shift(local, self.correction_nanos) >= t {
            self.slew_from = None;
        }
        t
    }

    /// The local time at which the corrected clock reads `corrected` (for timers: a deadline
    /// the budget asked for, on the local clock that wakes the driver).
    pub fn to_local(&self, corrected: Timestamp) -> Timestamp {
        let steady = shift(corrected, self.correction_nanos.saturating_neg());
        match self.slew_from {
            Some((from_local, from)) if corrected > from => {
                steady.min(from_local + corrected.saturating_duration_since(from) * SLEW_DIVISOR)
            }
            Some((from_local, _)) => steady.min(from_local),
            None => steady,
        }
    }

    /// An answered round trip, sent at corrected time `sent_at`, measured `sample` (the
    /// budget's NTP estimate, on the corrected clock): the correction moves by its offset.
    /// Returns false when it is not taken (sent before the clock was last steady, or not
    /// newer than the sample in force).
    pub fn on_sample(&mut self, local: Timestamp, sent_at: Timestamp, sample: ClockSample) -> bool {
        self.absorb_step_back(local);
        // At `steady_from` itself the clock may still have been standing.
        if sent_at <= self.steady_from {
            return false;
        }
        let sent_local = self.to_local(sent_at);
        if self.sample.is_some_and(|(at, _)| at >= sent_local) {
            return false;
        }
        self.check_assumption(local, &sample);
        let now = self.read(local);
        self.correction_nanos = self.correction_nanos.saturating_add(sample.offset_nanos);
        self.sample = Some((sent_local, sample.round_trip_nanos.div_ceil(2)));
        let estimate = shift(local, self.correction_nanos);
        if estimate < now {
            // Slow from `now` until the estimate catches up: the reading then.
            self.slew_from = Some((local, now));
            self.steady_from = self.slow_until(local, now);
        } else {
            self.slew_from = None;
            self.steady_from = estimate;
        }
        true
    }

    /// The local clock went back (a step: NTP, a VM resumed from a snapshot): the correction
    /// takes the step, so that the corrected clock reads on as if it had not happened, and the
    /// local times kept (the last sample's, a slowed run's start) move back with it. Without
    /// this the reading stood still for as long as the step, and samples were refused as
    /// older than the last one (their local send times were earlier) until the local clock
    /// caught up: a region stepped back 8.8 s stayed in a window the leader had closed and
    /// rebalanced (swarm, clock steps). A step forward cannot be told from time passing: the
    /// next sample finds it, as an assumption break. The caller reads the local clock under
    /// the same lock as it calls in, so that two readers' times never arrive out of order.
    fn absorb_step_back(&mut self, local: Timestamp) {
        let back = self.last_local.saturating_duration_since(local);
        self.last_local = local;
        self.shift_back(back);
    }

    /// The local clock reads `back` earlier than the corrected clock must go on from: the
    /// correction grows by it, and the local times kept move back with the clock.
    fn shift_back(&mut self, back: Duration) {
        if back.is_zero() {
            return;
        }
        let back_nanos = i64::try_from(duration_nanos(back)).unwrap_or(i64::MAX);
        self.correction_nanos = self.correction_nanos.saturating_add(back_nanos);
        if let Some((from_local, _)) = &mut self.slew_from {
            *from_local = from_local.saturating_sub(back);
        }
        if let Some((sent_local, _)) = &mut self.sample {
            *sent_local = sent_local.saturating_sub(back);
        }
    }

    /// The run-time check of the uncertainty's assumption: a sample's offset is the error the
    /// clock had, give or take half the sample's round trip, and that error must have been
    /// within the uncertainty. One further off broke the assumption (a rate error above
    /// [`MAX_CLOCK_DRIFT_PPM`], a step of the local clock): it is counted, and the guard starts
    /// again from the next band, so that the leader counts the region's skew term for the
    /// windows that start before the new guard covers them.
    fn check_assumption(&mut self, local: Timestamp, sample: &ClockSample) {
        let Some(e) = self.uncertainty(local) else {
            return;
        };
        let allowed = duration_nanos(e).saturating_add(sample.round_trip_nanos.div_ceil(2));
        if sample.offset_nanos.unsigned_abs() > allowed {
            self.assumption_breaks += 1;
            self.guarded_since = None;
        }
    }

    /// Samples that found the clock further off than its uncertainty allowed (the agent's
    /// `allot_clock_assumption_breaks_total`).
    pub fn assumption_breaks(&self) -> u64 {
        self.assumption_breaks
    }

    /// How far the reading at `local` may be from the coordinator's clock: half the last
    /// sample's round trip, plus how far a backward correction holds the clock ahead, plus
    /// [`MAX_CLOCK_DRIFT_PPM`] of the time since the sample. `None` before the first sample.
    pub fn uncertainty(&self, local: Timestamp) -> Option<Duration> {
        let (sent_local, half_rtt) = self.sample?;
        let estimate = shift(local, self.correction_nanos);
        let held = self.peek(local).as_unix_nanos() - estimate.as_unix_nanos();
        let since = u128::from(duration_nanos(local.saturating_duration_since(sent_local)));
        let drift = u64::try_from((since * u128::from(MAX_CLOCK_DRIFT_PPM)).div_ceil(PPM))
            .unwrap_or(u64::MAX);
        Some(Duration::from_nanos(
            half_rtt.saturating_add(held).saturating_add(drift),
        ))
    }

    /// The edge band the budget keeps at `local` (docs/budget.md, edge band): `None` while
    /// the region has never been within `max_uncertainty` (it admits as without a timebase,
    /// and the skew term counts it so; after a restart it admits nothing in strict mode
    /// then); the uncertainty once it has; `Duration::MAX` (admit
    /// nothing new in strict mode) when the uncertainty is above `max_uncertainty` again.
    pub fn band(&mut self, local: Timestamp) -> Option<Duration> {
        let now = self.read(local);
        let within = self
            .uncertainty(local)
            .filter(|e| *e <= self.max_uncertainty);
        match (self.guarded_since, within) {
            (None, None) => self.hold_until_sampled.then_some(Duration::MAX),
            (None, Some(e)) => {
                self.guarded_since = Some(now);
                Some(e)
            }
            (Some(_), Some(e)) => Some(e),
            (Some(_), None) => Some(Duration::MAX),
        }
    }

    /// What the region reports: the guard, once it holds.
    pub fn guard(&self) -> Option<ClockGuard> {
        self.guarded_since.map(|since| ClockGuard {
            since,
            max_uncertainty: self.max_uncertainty,
        })
    }

    pub fn max_uncertainty(&self) -> Duration {
        self.max_uncertainty
    }
}

/// `t + nanos`, clamped to the representable range.
fn shift(t: Timestamp, nanos: i64) -> Timestamp {
    let v = i128::from(t.as_unix_nanos()) + i128::from(nanos);
    Timestamp::from_unix_nanos(u64::try_from(v.max(0)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Timestamp {
        Timestamp::from_unix_millis(v)
    }

    fn sample(offset_ms: i64, rtt_ms: u64) -> ClockSample {
        ClockSample {
            offset_nanos: offset_ms * 1_000_000,
            round_trip_nanos: rtt_ms * 1_000_000,
        }
    }

    /// A clock whose rate is off by more than the assumed 1% shows at the next sample: further
    /// off than the uncertainty allowed. The break is counted and the guard starts again.
    #[test]
    fn a_sample_further_off_than_the_uncertainty_breaks_the_guard() {
        let mut tb = Timebase::new(Duration::from_millis(250));
        tb.read(ms(10_000));
        assert!(tb.on_sample(ms(10_020), ms(10_000), sample(0, 20)));
        tb.band(ms(10_020));
        let since = tb.guard().expect("guarded").since;
        // 10 s later the uncertainty is 10 ms + 1% of 10 s = 110 ms: 100 ms off is within it.
        assert!(tb.on_sample(ms(20_020), ms(20_000), sample(100, 20)));
        assert_eq!(tb.assumption_breaks(), 0);
        assert_eq!(tb.guard().map(|g| g.since), Some(since));
        // 2 s later, 200 ms off: 3% of the time, beyond 10 ms + 20 ms + 10 ms.
        assert!(tb.on_sample(ms(22_020), ms(22_000), sample(200, 20)));
        assert_eq!(tb.assumption_breaks(), 1);
        assert_eq!(tb.guard(), None, "until the next band");
        tb.band(ms(22_020));
        assert!(tb.guard().is_some_and(|g| g.since > since));
    }

    /// The local clock stepped back 8.8 s: the corrected clock reads on as if it had not,
    /// the next sample (sent after the step) is taken and finds the clock where it was, and
    /// the guard holds. Before, the reading stood still for 8.8 s and every sample sent in
    /// that time was refused as older than the last.
    #[test]
    fn a_step_back_of_the_local_clock_is_taken_into_the_correction() {
        let mut tb = Timebase::new(Duration::from_millis(250));
        tb.read(ms(10_000));
        assert!(tb.on_sample(ms(10_020), ms(10_000), sample(0, 20)));
        tb.band(ms(10_020));
        let since = tb.guard().expect("guarded").since;
        assert_eq!(tb.read(ms(10_500)), ms(10_500));
        // Stepped back to 1.7 s: it reads 10.5 s still, and runs on from there.
        assert_eq!(tb.read(ms(1_700)), ms(10_500));
        assert_eq!(tb.read(ms(1_800)), ms(10_600));
        // Half the round trip, and 1% of the 0.6 s since the sample was sent.
        assert_eq!(tb.band(ms(1_800)), Some(Duration::from_millis(16)));
        // A round trip sent at 10.6 s (corrected) and answered 20 ms later, on time.
        assert!(tb.on_sample(ms(1_820), ms(10_600), sample(0, 20)));
        assert_eq!(tb.assumption_breaks(), 0);
        assert_eq!(tb.guard().map(|g| g.since), Some(since));
        assert_eq!(tb.read(ms(2_000)), ms(10_800));
    }

    #[test]
    fn a_clock_behind_jumps_forward_and_is_guarded_at_once() {
        let mut tb = Timebase::new(Duration::from_millis(250));
        assert_eq!(tb.band(ms(10_000)), None, "no sample: no guard");
        assert_eq!(tb.read(ms(10_000)), ms(10_000));
        // The coordinator is 3 s ahead; the round trip took 40 ms.
        assert!(tb.on_sample(ms(10_040), ms(10_000), sample(3_000, 40)));
        assert_eq!(tb.read(ms(10_040)), ms(13_040));
        // 20 ms (half the round trip) plus 1% of the 40 ms since the sample left.
        assert_eq!(
            tb.uncertainty(ms(10_040)),
            Some(Duration::from_micros(20_400))
        );
        assert_eq!(tb.band(ms(10_040)), Some(Duration::from_micros(20_400)));
        assert_eq!(tb.guard().map(|g| g.since), Some(ms(13_040)));
        assert_eq!(tb.to_local(ms(13_500)), ms(10_500));
    }

    #[test]
    fn a_clock_ahead_runs_at_half_speed_until_the_estimate_catches_up_and_is_guarded_then() {
        let mut tb = Timebase::new(Duration::from_millis(250));
        tb.read(ms(10_000));
        assert!(tb.on_sample(ms(10_040), ms(10_000), sample(-2_000, 40)));
        // Slowed from the last reading, 2 s ahead of the estimate: half speed, never back.
        assert_eq!(tb.read(ms(10_100)), ms(10_070));
        assert_eq!(tb.band(ms(10_100)), None, "2 s off: not guarded yet");
        assert_eq!(tb.read(ms(12_040)), ms(11_040));
        // A deadline on the slowed clock wakes the driver when the slowed clock reaches it:
        // time still passes, so syncs and expiries do.
        assert_eq!(tb.to_local(ms(11_540)), ms(13_040));
        // The estimate catches up at local 14,040 (reading 12,040) and runs on from there.
        assert_eq!(tb.to_local(ms(12_540)), ms(14_540));
        assert_eq!(tb.read(ms(14_100)), ms(12_100));
        let e = tb.band(ms(14_100)).expect("guarded");
        assert!(e < Duration::from_millis(100), "{e:?}");
        // A round trip sent while the clock ran slow is not taken.
        assert!(!tb.on_sample(ms(14_100), ms(11_040), sample(5, 1)));
    }

    #[test]
    fn a_restarted_region_admits_nothing_strict_until_its_first_sample() {
        let mut tb =
            Timebase::restarted(Duration::from_millis(250), None, Timestamp::ZERO, ms(5_000));
        assert_eq!(tb.band(ms(5_000)), Some(Duration::MAX));
        assert!(tb.guard().is_none());
        assert!(tb.on_sample(ms(5_010), ms(5_000), sample(700, 10)));
        assert!(
            tb.band(ms(5_010))
                .is_some_and(|e| e < Duration::from_millis(10))
        );
        assert_eq!(tb.peek(ms(5_010)), ms(5_710));
    }

    #[test]
    fn a_guarded_region_whose_uncertainty_grows_past_the_maximum_admits_nothing_new() {
        let mut tb = Timebase::new(Duration::from_millis(250));
        tb.read(ms(100));
        assert!(tb.on_sample(ms(110), ms(100), sample(0, 10)));
        assert!(
            tb.band(ms(110))
                .is_some_and(|e| e < Duration::from_millis(10))
        );
        // 1% of 30 s is 300 ms: past the maximum.
        assert_eq!(tb.band(ms(30_000)), Some(Duration::MAX));
        assert!(
            tb.guard().is_some(),
            "the guard is kept: it admits nothing beyond it"
        );
        // A new sample brings it back.
        assert!(tb.on_sample(ms(30_010), ms(30_000), sample(1, 10)));
        assert!(
            tb.band(ms(30_010))
                .is_some_and(|e| e < Duration::from_millis(10))
        );
    }
}
