//! Adaptive lease size: big leases for fast keys (fewer trips to the agent), small ones near the
//! limit (fewer units stranded in one gateway while another is denied).
//!
//! The rate is observed per key between two lease requests (demand, including requests that
//! were denied), and smoothed so that one quiet or busy interval does not swing the size.

use std::time::Duration;

use super::types::GatewayConfig;
use crate::time::{Timestamp, duration_nanos};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Intervals shorter than this are not turned into a rate (a burst in one instant would read as
/// an infinite rate); their units carry over into the next interval.
const MIN_RATE_SAMPLE: Duration = Duration::from_millis(1);

/// Demand units per second of one key, smoothed over lease requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RateEstimate {
    units_since_sample: u64,
    sample_started_at: Timestamp,
    units_per_sec: Option<u64>,
}

impl RateEstimate {
    pub(super) fn new(now: Timestamp) -> Self {
        RateEstimate {
            units_since_sample: 0,
            sample_started_at: now,
            units_per_sec: None,
        }
    }

    /// Hot path: one request's units, admitted or not.
    #[inline]
    pub(super) fn record(&mut self, units: u64) {
        self.units_since_sample = self.units_since_sample.saturating_add(units);
    }

    /// Closes the interval ending at `now` and folds its rate in (weight one half, so a change
    /// of rate shows within a few leases).
    pub(super) fn sample(&mut self, now: Timestamp) {
        let elapsed = now.saturating_duration_since(self.sample_started_at);
        if elapsed < MIN_RATE_SAMPLE {
            return;
        }
        let rate = u128::from(self.units_since_sample) * NANOS_PER_SEC
            / u128::from(duration_nanos(elapsed));
        let rate = u64::try_from(rate).unwrap_or(u64::MAX);
        self.units_per_sec = Some(match self.units_per_sec {
            None => rate,
            Some(old) => old / 2 + rate / 2,
        });
        self.units_since_sample = 0;
        self.sample_started_at = now;
    }

    pub(super) fn units_per_sec(&self) -> Option<u64> {
        self.units_per_sec
    }
}

/// What the next lease's size depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SizeInputs {
    pub(super) rate_units_per_sec: Option<u64>,
    /// The agent's last word on how many units remain for the key (None before any answer).
    pub(super) remaining_hint_units: Option<u64>,
    /// The request waiting for this lease must fit in it.
    pub(super) cost_units: u64,
}

/// The number of units to ask for.
pub(super) fn lease_size(config: &GatewayConfig, inputs: SizeInputs) -> u64 {
    let by_rate = match inputs.rate_units_per_sec {
        None => config.initial_lease_units,
        Some(rate) => {
            let units =
                u128::from(rate) * u128::from(duration_nanos(config.lease_target)) / NANOS_PER_SEC;
            u64::try_from(units).unwrap_or(u64::MAX)
        }
    };
    let mut size = by_rate.clamp(1, config.max_lease_units);
    if let Some(remaining) = inputs.remaining_hint_units {
        size = size.min((remaining / config.near_limit_divisor).max(1));
    }
    size.max(inputs.cost_units)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GatewayConfig {
        GatewayConfig {
            initial_lease_units: 10,
            max_lease_units: 1_000,
            lease_target: Duration::from_millis(500),
            near_limit_divisor: 8,
            ..GatewayConfig::default()
        }
    }

    fn inputs(rate: Option<u64>, remaining: Option<u64>) -> SizeInputs {
        SizeInputs {
            rate_units_per_sec: rate,
            remaining_hint_units: remaining,
            cost_units: 1,
        }
    }

    #[test]
    fn a_new_key_asks_for_the_initial_size() {
        assert_eq!(lease_size(&config(), inputs(None, None)), 10);
    }

    #[test]
    fn size_grows_with_the_rate_up_to_the_max() {
        // 400 units/s over a 500 ms target: 200 units.
        assert_eq!(lease_size(&config(), inputs(Some(400), None)), 200);
        // 10,000 units/s would be 5,000 units: capped at 1,000.
        assert_eq!(lease_size(&config(), inputs(Some(10_000), None)), 1_000);
        // 1 unit/s would be half a unit: never below one.
        assert_eq!(lease_size(&config(), inputs(Some(1), None)), 1);
    }

    #[test]
    fn size_shrinks_to_one_near_the_limit() {
        // 200 by rate, but only 800 remain: at most 800 / 8 = 100.
        assert_eq!(lease_size(&config(), inputs(Some(400), Some(800))), 100);
        // 7 remain: 7 / 8 rounds to 0, and a lease is at least one unit.
        assert_eq!(lease_size(&config(), inputs(Some(400), Some(7))), 1);
        assert_eq!(lease_size(&config(), inputs(Some(400), Some(0))), 1);
    }

    #[test]
    fn the_waiting_request_always_fits() {
        let mut i = inputs(Some(400), Some(0));
        i.cost_units = 4_000;
        assert_eq!(lease_size(&config(), i), 4_000);
    }

    #[test]
    fn the_rate_is_demand_over_time_smoothed_by_halves() {
        let t0 = Timestamp::from_unix_millis(1_000);
        let mut r = RateEstimate::new(t0);
        r.record(100);
        r.sample(t0 + Duration::from_millis(500));
        // 100 units in 0.5 s.
        assert_eq!(r.units_per_sec(), Some(200));
        r.record(600);
        r.sample(t0 + Duration::from_millis(1_000));
        // 600 units in 0.5 s is 1,200/s; (200 + 1,200) / 2 = 700.
        assert_eq!(r.units_per_sec(), Some(700));
    }

    #[test]
    fn an_instantaneous_burst_is_not_an_infinite_rate() {
        let t0 = Timestamp::from_unix_millis(1_000);
        let mut r = RateEstimate::new(t0);
        r.record(50);
        r.sample(t0);
        assert_eq!(r.units_per_sec(), None, "no time has passed yet");
        r.sample(t0 + Duration::from_millis(100));
        // The 50 units carried over: 50 in 0.1 s.
        assert_eq!(r.units_per_sec(), Some(500));
    }
}
