//! GCRA (generic cell rate algorithm) with variable cost and exact retry-after.
//!
//! One state value per key: the theoretical arrival time (TAT). With emission interval
//! `T = per / units` and burst tolerance `tau = (burst - 1) * T`, a request of cost `c` at `now`
//! is admitted when `max(TAT, now) + c*T - (tau + T) <= now`, and then moves TAT there. A denial
//! writes nothing and knows exactly when the same request would pass.

use std::time::Duration;

use crate::algo::Decision;
use crate::limit::RateCap;
use crate::time::{Timestamp, duration_nanos};

/// The fixed parameters of one GCRA limit; the per-key state is a [`GcraState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    emission_interval_nanos: u64,
    /// `tau + T`: how far TAT may run ahead of now after an admitted request.
    horizon_nanos: u64,
}

/// Per-key state: 8 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcraState {
    tat: Timestamp,
}

/// GCRA answers with the decision every algorithm shares.
pub type GcraDecision = Decision;

impl GcraState {
    /// The state whose theoretical arrival time is `tat` (to restore persisted state).
    pub fn from_tat(tat: Timestamp) -> Self {
        GcraState { tat }
    }

    /// The theoretical arrival time, for persisting the state.
    pub fn tat(&self) -> Timestamp {
        self.tat
    }
}

impl Gcra {
    /// `cap.units` per `cap.per` with a burst of `cap.burst` (at least 1).
    /// The emission interval rounds up, so rounding never admits more than the cap.
    /// A rate of zero units is read as one unit per `per`: GCRA has no "never refills", so the
    /// config loader must reject a zero rate rather than pass it here.
    pub fn new(cap: RateCap) -> Self {
        let units = cap.units.max(1);
        let per_nanos = duration_nanos(cap.per).max(1);
        let emission_interval_nanos = per_nanos.div_ceil(units).max(1);
        let horizon_nanos = emission_interval_nanos.saturating_mul(cap.burst.max(1));
        Gcra {
            emission_interval_nanos,
            horizon_nanos,
        }
    }

    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_interval_nanos)
    }

    /// The burst tolerance `tau = (burst - 1) * T`.
    pub fn tolerance(&self) -> Duration {
        Duration::from_nanos(self.horizon_nanos - self.emission_interval_nanos)
    }

    /// Decide a request of `cost` units at `now`; charges the state only when allowed.
    /// Inlined across crates: it runs once per request and is a handful of instructions, so
    /// a call would cost as much as the decision.
    #[inline]
    pub fn check(&self, state: &mut GcraState, now: Timestamp, cost: u64) -> GcraDecision {
        let now_ns = now.as_unix_nanos();
        let tat_ns = state.tat.as_unix_nanos().max(now_ns);
        let increment_ns = cost.saturating_mul(self.emission_interval_nanos);
        let new_tat_ns = tat_ns.saturating_add(increment_ns);
        let allow_at_ns = new_tat_ns.saturating_sub(self.horizon_nanos);
        if allow_at_ns > now_ns {
            let retry_after = (increment_ns <= self.horizon_nanos)
                .then(|| Duration::from_nanos(allow_at_ns - now_ns));
            return GcraDecision::Denied {
                retry_after,
                reset_after: Duration::from_nanos(tat_ns - now_ns),
            };
        }
        state.tat = Timestamp::from_unix_nanos(new_tat_ns);
        let ahead_ns = new_tat_ns - now_ns;
        GcraDecision::Allowed {
            remaining: (self.horizon_nanos - ahead_ns) / self.emission_interval_nanos,
            reset_after: Duration::from_nanos(ahead_ns),
        }
    }

    /// Requests of cost one that would pass at `now`, without charging anything.
    pub fn remaining(&self, state: &GcraState, now: Timestamp) -> u64 {
        let ahead_ns = state
            .tat
            .as_unix_nanos()
            .saturating_sub(now.as_unix_nanos());
        self.horizon_nanos.saturating_sub(ahead_ns) / self.emission_interval_nanos
    }

    /// Give back `units` that were charged but not used (reserve-then-settle): TAT moves back
    /// by `units * T`, never below `now`, so a refund cannot create credit for the past.
    pub fn refund(&self, state: &mut GcraState, now: Timestamp, units: u64) {
        let back_ns = units.saturating_mul(self.emission_interval_nanos);
        let tat_ns = state
            .tat
            .as_unix_nanos()
            .saturating_sub(back_ns)
            .max(now.as_unix_nanos());
        state.tat = Timestamp::from_unix_nanos(tat_ns);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algo::decision::testing::check_retry_is_exact;

    fn per_minute(units: u64, burst: u64) -> Gcra {
        Gcra::new(RateCap {
            units,
            per: Duration::from_secs(60),
            burst,
        })
    }

    const NOW: Timestamp = Timestamp::from_unix_millis(1_700_000_000_000);

    #[test]
    fn worked_example_100_per_minute_burst_20() {
        let g = per_minute(100, 20);
        assert_eq!(g.emission_interval(), Duration::from_millis(600));
        assert_eq!(g.tolerance(), Duration::from_millis(11_400));
        let mut s = GcraState::default();
        for i in 0..20 {
            match g.check(&mut s, NOW, 1) {
                GcraDecision::Allowed { remaining, .. } => assert_eq!(remaining, 19 - i),
                d => panic!("request {} denied: {d:?}", i + 1),
            }
        }
        let d = g.check(&mut s, NOW, 1);
        assert_eq!(
            d,
            GcraDecision::Denied {
                retry_after: Some(Duration::from_millis(600)),
                reset_after: Duration::from_secs(12)
            }
        );
        // Exactly one emission interval later the 21st passes, with nothing left.
        let later = NOW + Duration::from_millis(600);
        assert_eq!(
            g.check(&mut s, later, 1),
            GcraDecision::Allowed {
                remaining: 0,
                reset_after: Duration::from_secs(12)
            }
        );
    }

    #[test]
    fn remaining_follows_the_tat_formula() {
        // remaining = floor((tau - (TAT - now)) / T) + 1
        let g = per_minute(100, 20);
        let mut s = GcraState::default();
        for _ in 0..5 {
            g.check(&mut s, NOW, 1);
        }
        let now = NOW + Duration::from_millis(1_000);
        let tat_ahead_ms = 5 * 600 - 1_000; // 2,000 ms
        let expected = (11_400 - tat_ahead_ms) / 600 + 1; // 15
        assert_eq!(g.remaining(&s, now), expected);
    }

    #[test]
    fn variable_cost_charges_cost_times_t() {
        let g = per_minute(100, 20);
        let mut s = GcraState::default();
        assert!(g.check(&mut s, NOW, 15).is_allowed());
        assert_eq!(g.remaining(&s, NOW), 5);
        let d = g.check(&mut s, NOW, 6);
        assert_eq!(
            d,
            GcraDecision::Denied {
                retry_after: Some(Duration::from_millis(600)),
                reset_after: Duration::from_secs(9)
            }
        );
        assert!(g.check(&mut s, NOW, 5).is_allowed());
    }

    #[test]
    fn a_cost_above_the_burst_can_never_pass() {
        let g = per_minute(100, 20);
        let mut s = GcraState::default();
        assert_eq!(
            g.check(&mut s, NOW, 21),
            GcraDecision::Denied {
                retry_after: None,
                reset_after: Duration::ZERO
            }
        );
        assert_eq!(s, GcraState::default(), "a denial writes nothing");
    }

    #[test]
    fn refunds_never_move_tat_before_now() {
        let g = per_minute(100, 20);
        let mut s = GcraState::default();
        g.check(&mut s, NOW, 10);
        g.refund(&mut s, NOW, 4);
        assert_eq!(g.remaining(&s, NOW), 14);
        g.refund(&mut s, NOW, 1_000);
        assert_eq!(g.remaining(&s, NOW), 20);
        assert!(g.check(&mut s, NOW, 20).is_allowed());
    }

    #[test]
    fn rates_that_do_not_divide_round_towards_fewer_admissions() {
        // 3 per second: T rounds up to 333,333,334 ns, so 3 intervals exceed a second.
        let g = Gcra::new(RateCap {
            units: 3,
            per: Duration::from_secs(1),
            burst: 1,
        });
        assert_eq!(g.emission_interval(), Duration::from_nanos(333_333_334));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// From a cold key, whatever the rate, burst and cost sequence, the units admitted at
        /// times within any `[a, b]` never exceed `burst + units * (b - a) / per`; a denial
        /// charges nothing and its retry-after is exact; an admission's `remaining` is exactly
        /// the largest cost that would pass next.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_elapsed(
            units in 1u64..=1_000,
            // Short periods too, where rounding the emission interval matters most.
            per_ns in prop_oneof![1u64..=1_000, 1_000u64..=3_600_000_000_000],
            burst in 1u64..=40,
            start_ms in 1_600_000_000_000u64..1_900_000_000_000,
            // (gap in thousandths of the emission interval, cost, nanoseconds off the grid)
            steps in prop::collection::vec((0u64..=3_000, 0u64..=45, 0u64..1_000), 1..80),
        ) {
            let cap = RateCap { units, per: Duration::from_nanos(per_ns), burst };
            let g = Gcra::new(cap);
            let t_ns = duration_nanos(g.emission_interval());
            let mut s = GcraState::default();
            let mut now = Timestamp::from_unix_millis(start_ms);
            let mut admitted: Vec<(Timestamp, u64)> = Vec::new();
            for (gap_permille, cost, jitter_ns) in steps {
                now = now + Duration::from_nanos(t_ns * gap_permille / 1_000 + jitter_ns % t_ns);
                let before = s;
                match g.check(&mut s, now, cost) {
                    Decision::Allowed { remaining, .. } => {
                        admitted.push((now, cost));
                        prop_assert!(g.check(&mut s.clone(), now, remaining).is_allowed());
                        prop_assert!(!g.check(&mut s.clone(), now, remaining + 1).is_allowed());
                    }
                    Decision::Denied { retry_after, .. } => {
                        prop_assert_eq!(s, before);
                        match retry_after {
                            Some(after) => check_retry_is_exact(now, after, |t| {
                                g.check(&mut s.clone(), t, cost).is_allowed()
                            })?,
                            None => prop_assert!(cost > burst),
                        }
                    }
                }
            }
            check_rate_bound(cap, &admitted)?;
        }
    }

    /// Every interval that starts at an admission: the first one is the cold key's.
    fn check_rate_bound(cap: RateCap, admitted: &[(Timestamp, u64)]) -> Result<(), TestCaseError> {
        let per_ns = u128::from(duration_nanos(cap.per));
        for (i, &(from, _)) in admitted.iter().enumerate() {
            let mut units_in_interval = 0u128;
            for &(to, cost) in &admitted[i..] {
                units_in_interval += u128::from(cost);
                let elapsed_ns = u128::from(to.as_unix_nanos() - from.as_unix_nanos());
                let bound = u128::from(cap.burst) + u128::from(cap.units) * elapsed_ns / per_ns;
                prop_assert!(
                    units_in_interval <= bound,
                    "{units_in_interval} units in [{from:?}, {to:?}], bound {bound}"
                );
            }
        }
        Ok(())
    }
}
