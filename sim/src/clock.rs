//! Per-region clocks: the time a region's state machines and gateways see.
//!
//! A region's clock reads `true_time + (true_time - run_start) * drift + offset`: the offset is
//! what NTP left over, the drift how fast the oscillator runs, accumulated from the start of
//! the run (so a run's skew does not depend on its calendar date). The true clock is also the
//! coordinator's clock, the one the bound's skew term is judged against.
//!
//! All arithmetic is exact integers: the same true time always reads the same local time.

use allot_core::time::Timestamp;

/// Drift is at most 10% either way: beyond that a clock is broken, not skewed.
pub const MAX_DRIFT_PPM: i64 = 100_000;

const PPM: i128 = 1_000_000;

/// A region's clock error, as a scenario states it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockSpec {
    /// Positive: the region's clock is ahead of true time.
    pub offset_nanos: i64,
    /// Parts per million; positive: the region's clock runs fast.
    pub drift_ppm: i64,
}

/// One region's clock during one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionClock {
    start_nanos: i128,
    offset_nanos: i128,
    drift_ppm: i128,
}

impl RegionClock {
    pub fn new(run_start: Timestamp, spec: ClockSpec) -> Self {
        assert!(
            spec.drift_ppm.abs() <= MAX_DRIFT_PPM,
            "drift is validated when the scenario is read"
        );
        RegionClock {
            start_nanos: i128::from(run_start.as_unix_nanos()),
            offset_nanos: i128::from(spec.offset_nanos),
            drift_ppm: i128::from(spec.drift_ppm),
        }
    }

    /// What the region's clock reads at true time `t`. Never decreases as `t` grows.
    #[inline]
    pub fn local(&self, t: Timestamp) -> Timestamp {
        if self.drift_ppm == 0 {
            // The common case, on the request path: no 128-bit division.
            let shifted = i128::from(t.as_unix_nanos()) + self.offset_nanos;
            return to_timestamp(shifted);
        }
        let t = i128::from(t.as_unix_nanos());
        let drifted = (t - self.start_nanos) * self.drift_ppm;
        to_timestamp(t + drifted.div_euclid(PPM) + self.offset_nanos)
    }

    /// The earliest true time at which the region's clock reads `local` or later (when a
    /// region's timer for `local` fires); the start of the run if it already does then.
    pub fn true_time_of(&self, local: Timestamp) -> Timestamp {
        let start = Timestamp::from_unix_nanos(self.start_nanos as u64);
        if self.local(start) >= local {
            return start;
        }
        let target = i128::from(local.as_unix_nanos()) - self.offset_nanos - self.start_nanos;
        let estimate = self.start_nanos + (target * PPM).div_euclid(PPM + self.drift_ppm);
        let mut t = to_timestamp(estimate);
        // The estimate is off by at most a nanosecond or two from rounding: step to the exact
        // answer.
        while self.local(t) < local {
            t = Timestamp::from_unix_nanos(t.as_unix_nanos() + 1);
        }
        while t > start && self.local(Timestamp::from_unix_nanos(t.as_unix_nanos() - 1)) >= local {
            t = Timestamp::from_unix_nanos(t.as_unix_nanos() - 1);
        }
        t
    }
}

fn to_timestamp(nanos: i128) -> Timestamp {
    Timestamp::from_unix_nanos(nanos.clamp(0, i128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const START: Timestamp = Timestamp::from_unix_millis(1_767_225_600_000);

    fn secs(n: u64) -> Timestamp {
        START + std::time::Duration::from_secs(n)
    }

    #[test]
    fn offset_shifts_and_drift_accumulates_from_the_start() {
        let c = RegionClock::new(
            START,
            ClockSpec {
                offset_nanos: 30_000_000,
                drift_ppm: 100,
            },
        );
        // At the start only the 30 ms offset shows.
        assert_eq!(c.local(START), START + std::time::Duration::from_millis(30));
        // After 1,000 s a clock 100 ppm fast has gained 100 ms: 130 ms ahead in all.
        assert_eq!(
            c.local(secs(1_000)),
            secs(1_000) + std::time::Duration::from_millis(130)
        );
    }

    #[test]
    fn a_slow_clock_falls_behind() {
        let c = RegionClock::new(
            START,
            ClockSpec {
                offset_nanos: 0,
                drift_ppm: -50,
            },
        );
        // 50 ppm slow over 2,000 s: 100 ms behind.
        assert_eq!(
            c.local(secs(2_000)),
            secs(2_000) - std::time::Duration::from_millis(100)
        );
    }

    #[test]
    fn a_perfect_clock_reads_true_time() {
        let c = RegionClock::new(START, ClockSpec::default());
        assert_eq!(c.local(secs(77)), secs(77));
        assert_eq!(c.true_time_of(secs(77)), secs(77));
    }

    #[test]
    fn a_timer_already_due_at_the_start_fires_at_the_start() {
        let c = RegionClock::new(
            START,
            ClockSpec {
                offset_nanos: 5_000_000_000,
                drift_ppm: 0,
            },
        );
        assert_eq!(c.true_time_of(secs(1)), START);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn local_time_never_goes_back_and_timers_fire_exactly(
            offset_nanos in -10_000_000_000i64..10_000_000_000,
            drift_ppm in -MAX_DRIFT_PPM..=MAX_DRIFT_PPM,
            a in 0u64..86_400_000_000_000,
            b in 0u64..86_400_000_000_000,
        ) {
            let c = RegionClock::new(START, ClockSpec { offset_nanos, drift_ppm });
            let (a, b) = (START + std::time::Duration::from_nanos(a.min(b)),
                          START + std::time::Duration::from_nanos(a.max(b)));
            prop_assert!(c.local(a) <= c.local(b));
            // A timer set for local time L fires at the first true time whose reading is >= L.
            let wanted = c.local(b);
            let t = c.true_time_of(wanted);
            prop_assert!(c.local(t) >= wanted);
            prop_assert!(t == START || c.local(t - std::time::Duration::from_nanos(1)) < wanted);
        }
    }
}
