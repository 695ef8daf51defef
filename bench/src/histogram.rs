//! Latency histogram (HdrHistogram): one per caller, merged at the end, so recording takes no
//! lock on the measured path.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency recorded exactly; slower calls are recorded as this (and a call is cut off
/// by the load generator's timeout well before it).
pub const MAX_RECORDED_LATENCY: Duration = Duration::from_secs(60);

/// Significant decimal digits kept: 3 means any value is within 0.1% of what was recorded.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

/// What a report shows of a histogram, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        let high_nanos = u64::try_from(MAX_RECORDED_LATENCY.as_nanos()).unwrap_or(u64::MAX);
        // Infallible: the bounds are constants with low = 1 < high and 3 significant digits.
        let inner = Histogram::new_with_bounds(1, high_nanos, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        LatencyHistogram { inner }
    }

    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.inner.saturating_record(nanos.max(1));
    }

    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Adds `other`'s samples. Both have the same bounds, so nothing is lost.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Same bounds on both sides: `add` fails only when `other` holds values this one
        // cannot, which `new` rules out.
        let added = self.inner.add(&other.inner);
        debug_assert!(added.is_ok(), "histograms share their bounds");
    }

    pub fn summary(&self) -> LatencySummary {
        let h = &self.inner;
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |nanos: u64| nanos as f64 / 1_000.0;
        LatencySummary {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1_000.0,
        }
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within_precision(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        // 1,000 calls of 1..=1000 µs: the p-quantile is the value with rank ceil(p * 1000),
        // so p50 = 500 µs, p99 = 990 µs, p999 = 999 µs, max 1000 µs, mean 500.5 µs.
        let mut h = LatencyHistogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!(within_precision(s.p50_us, 500.0), "{s:?}");
        assert!(within_precision(s.p99_us, 990.0), "{s:?}");
        assert!(within_precision(s.p999_us, 999.0), "{s:?}");
        assert!(within_precision(s.max_us, 1000.0), "{s:?}");
        assert!(within_precision(s.mean_us, 500.5), "{s:?}");
    }

    #[test]
    fn merged_histograms_count_every_caller() {
        // Caller A: 90 calls of 100 µs; caller B: 10 calls of 10 ms. Together: p50 is 100 µs,
        // p99 (rank 99 of 100) is one of B's 10 ms calls.
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        for _ in 0..90 {
            a.record(Duration::from_micros(100));
        }
        for _ in 0..10 {
            b.record(Duration::from_millis(10));
        }
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 100);
        assert!(within_precision(s.p50_us, 100.0), "{s:?}");
        assert!(within_precision(s.p99_us, 10_000.0), "{s:?}");
    }

    #[test]
    fn slower_than_the_bound_is_kept_at_the_bound() {
        let mut h = LatencyHistogram::new();
        h.record(MAX_RECORDED_LATENCY * 2);
        assert_eq!(h.len(), 1);
        let max_us = MAX_RECORDED_LATENCY.as_micros() as f64;
        assert!(within_precision(h.summary().max_us, max_us));
    }

    #[test]
    fn empty_histogram_summarises_to_zeros() {
        assert_eq!(LatencyHistogram::new().summary(), LatencySummary::default());
    }
}
