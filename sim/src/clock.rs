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

/// An agent's clock: its region's clock with the steps its host's clock takes (`clock_step`:
/// an NTP step, a VM resumed from a snapshot). A step applies to the agent's host only; the
/// gateways' clock reads the region's clock without it ([`RegionClock`]). A step back makes
/// the reading go back: the agent holds what it reads (it never reads back), the clock itself
/// does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentClock {
    base: RegionClock,
    /// `(true time in nanoseconds, nanoseconds added from then on)`, in time order.
    steps: Vec<(u64, i64)>,
}

impl AgentClock {
    pub fn new(base: RegionClock, mut steps: Vec<(Timestamp, i64)>) -> Self {
        steps.sort_by_key(|(at, _)| *at);
        AgentClock {
            base,
            steps: steps
                .into_iter()
                .map(|(at, by)| (at.as_unix_nanos(), by))
                .collect(),
        }
    }

    /// The region's clock, without the agent host's steps (the gateways' clocks read it).
    pub fn base(&self) -> RegionClock {
        self.base
    }

    /// The sum of the steps taken by true time `t`.
    fn stepped_nanos(&self, t: u64) -> i128 {
        self.steps
            .iter()
            .take_while(|(at, _)| *at <= t)
            .map(|(_, by)| i128::from(*by))
            .sum()
    }

    /// What the agent's host clock reads at true time `t`.
    #[inline]
    pub fn local(&self, t: Timestamp) -> Timestamp {
        let base = self.base.local(t);
        if self.steps.is_empty() {
            return base;
        }
        let stepped = self.stepped_nanos(t.as_unix_nanos());
        to_timestamp(i128::from(base.as_unix_nanos()) + stepped)
    }

    /// The earliest true time, not before `not_before`, at which the clock reads `local` or
    /// later (when a timer for `local` fires). Between steps the clock runs as its region's
    /// does, so each stretch is searched in turn.
    pub fn true_time_of(&self, local: Timestamp, not_before: Timestamp) -> Timestamp {
        let mut from = not_before.as_unix_nanos();
        let first = from;
        let mut bounds = self
            .steps
            .iter()
            .map(|(at, _)| *at)
            .filter(move |at| *at > first);
        loop {
            let next = bounds.next();
            let shift = self.stepped_nanos(from);
            let wanted = to_timestamp(i128::from(local.as_unix_nanos()) - shift);
            let t = self
                .base
                .true_time_of(wanted)
                .max(Timestamp::from_unix_nanos(from));
            match next {
                Some(end) if t.as_unix_nanos() >= end => from = end,
                _ => return t,
            }
        }
    }

    /// The clock an agent that started at true time `t` reads while it runs, as the daemon
    /// counts time from its start (D73): its host's clock as it read at the start, or `floor`
    /// if that is later, run on without the steps taken since.
    pub fn started_at(&self, t: Timestamp, floor: Timestamp) -> AgentClock {
        let mut steps: Vec<(u64, i64)> = self
            .steps
            .iter()
            .copied()
            .filter(|(at, _)| *at <= t.as_unix_nanos())
            .collect();
        let behind = floor.saturating_duration_since(self.local(t));
        if !behind.is_zero() {
            let by = i64::try_from(behind.as_nanos()).unwrap_or(i64::MAX);
            steps.push((t.as_unix_nanos(), by));
        }
        AgentClock {
            base: self.base,
            steps,
        }
    }

    /// Bounds on what any agent clock of this host reads over the true times `[start, end)`,
    /// whenever it started ([`AgentClock::started_at`], floors aside: a floor is a reading
    /// the agent had, within these bounds): the region's clock moved by the least and the
    /// most any run of the steps adds up to.
    pub fn any_reading_range(&self, start: Timestamp, end: Timestamp) -> (Timestamp, Timestamp) {
        let last = Timestamp::from_unix_nanos(end.as_unix_nanos().saturating_sub(1));
        let (mut least, mut most, mut sum) = (0i128, 0i128, 0i128);
        for (_, by) in &self.steps {
            sum += i128::from(*by);
            least = least.min(sum);
            most = most.max(sum);
        }
        (
            to_timestamp(i128::from(self.base.local(start).as_unix_nanos()) + least),
            to_timestamp(i128::from(self.base.local(last).as_unix_nanos()) + most),
        )
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

        /// With steps either way, a timer for local time `L` set at true time `nb` fires at
        /// the first true time from `nb` on whose reading is `L` or later.
        #[test]
        fn a_stepped_clock_fires_timers_at_the_first_time_it_reads_them(
            drift_ppm in -MAX_DRIFT_PPM..=MAX_DRIFT_PPM,
            steps in proptest::collection::vec((0u64..100_000_000_000, -30_000_000_000i64..30_000_000_000), 0..4),
            nb in 0u64..100_000_000_000,
            ahead in 0u64..60_000_000_000,
        ) {
            let base = RegionClock::new(START, ClockSpec { offset_nanos: 0, drift_ppm });
            let steps = steps
                .into_iter()
                .map(|(at, by)| (START + std::time::Duration::from_nanos(at), by))
                .collect();
            let c = AgentClock::new(base, steps);
            let nb = START + std::time::Duration::from_nanos(nb);
            let wanted = c.local(nb) + std::time::Duration::from_nanos(ahead);
            let t = c.true_time_of(wanted, nb);
            prop_assert!(t >= nb);
            prop_assert!(c.local(t) >= wanted);
            prop_assert!(t == nb || c.local(t - std::time::Duration::from_nanos(1)) < wanted);
            // An agent started at any time reads within the bounds the measurement is sized by.
            let (lo, hi) = c.any_reading_range(START, nb + std::time::Duration::from_nanos(1));
            prop_assert!(lo <= c.local(nb) && c.local(nb) <= hi);
            let started = c.started_at(START + std::time::Duration::from_nanos(ahead), Timestamp::ZERO);
            prop_assert!(lo <= started.local(nb) && started.local(nb) <= hi);
        }
    }

    #[test]
    fn a_step_back_reads_back_and_a_timer_waits_for_the_reading() {
        let base = RegionClock::new(START, ClockSpec::default());
        let c = AgentClock::new(base, vec![(secs(10), -3_000_000_000)]);
        assert_eq!(c.local(secs(9)), secs(9));
        assert_eq!(c.local(secs(10)), secs(7));
        // Set at 9 s for 9.5 s: 9.5 s, before the step. Set at 10 s: read again at 12.5 s.
        let half = std::time::Duration::from_millis(500);
        assert_eq!(c.true_time_of(secs(9) + half, secs(9)), secs(9) + half);
        assert_eq!(c.true_time_of(secs(9) + half, secs(10)), secs(12) + half);
        // Any agent of this host, whenever it started, reads within the base clock moved by
        // the least and most the steps add up to.
        assert_eq!(
            c.any_reading_range(START, secs(20)),
            (
                START - std::time::Duration::from_secs(3),
                secs(20) - std::time::Duration::from_nanos(1)
            )
        );
        // Started before the step, an agent does not see it; after, it does.
        assert_eq!(
            c.started_at(secs(9), Timestamp::ZERO).local(secs(12)),
            secs(12)
        );
        assert_eq!(
            c.started_at(secs(11), Timestamp::ZERO).local(secs(12)),
            secs(9)
        );
        // From a floor ahead of its clock, it runs on from the floor.
        assert_eq!(c.started_at(secs(11), secs(10)).local(secs(12)), secs(11));
    }
}
