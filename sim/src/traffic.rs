//! Traffic: request rates over time, arrival processes, request costs, and how clients retry
//! a denial.
//!
//! Arrivals are generated one at a time per source (the next arrival after the current one),
//! so the engine keeps one pending arrival per source instead of one event per request.
//! Poisson arrivals under a varying rate use thinning over segments where the rate is bounded;
//! piecewise-constant profiles (steps, flash crowds) are sampled exactly, with no rejected draws.

use std::f64::consts::TAU;
use std::time::Duration;

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1, LogNormal};

use crate::scenario::ArrivalProcess;

const NANOS_PER_SEC: f64 = 1e9;

/// A diurnal curve is thinned over this many slices per period; the rejection rate is the
/// curve's variation within one slice.
pub const DIURNAL_SEGMENTS: u64 = 96;

/// A rate in requests per second as a function of time since the start of the run.
#[derive(Clone, Debug, PartialEq)]
pub enum RateProfile {
    Constant {
        per_sec: f64,
    },
    /// Each step's rate holds from its `at` until the next step; zero before the first.
    Steps {
        steps: Vec<Step>,
    },
    /// `base + (peak - base) * (1 + cos(2 pi (t - peak_at) / period)) / 2`: the sun's day.
    Diurnal {
        base_per_sec: f64,
        peak_per_sec: f64,
        period: Duration,
        peak_at: Duration,
    },
    /// `base`, times `factor` during `[start, end)`.
    FlashCrowd {
        base_per_sec: f64,
        factor: f64,
        start: Duration,
        end: Option<Duration>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub at: Duration,
    pub per_sec: f64,
}

/// A stretch of time over which the rate stays below `max_per_sec`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Segment {
    max_per_sec: f64,
    /// Nanoseconds since the start of the run; `None`: forever.
    ends_at: Option<u64>,
    /// The rate is exactly `max_per_sec` throughout (no thinning needed).
    exact: bool,
}

impl RateProfile {
    /// Requests per second at `t` nanoseconds after the start of the run.
    pub fn rate_at(&self, t: u64) -> f64 {
        match self {
            RateProfile::Constant { per_sec } => *per_sec,
            RateProfile::Steps { steps } => steps
                .iter()
                .take_while(|s| nanos(s.at) <= t)
                .last()
                .map_or(0.0, |s| s.per_sec),
            RateProfile::Diurnal {
                base_per_sec,
                peak_per_sec,
                period,
                peak_at,
            } => {
                let phase = (t as f64 - nanos(*peak_at) as f64) / nanos(*period) as f64;
                base_per_sec + (peak_per_sec - base_per_sec) * (1.0 + (TAU * phase).cos()) / 2.0
            }
            RateProfile::FlashCrowd {
                base_per_sec,
                factor,
                start,
                end,
            } => {
                let in_crowd = t >= nanos(*start) && end.is_none_or(|e| t < nanos(e));
                if in_crowd {
                    base_per_sec * factor
                } else {
                    *base_per_sec
                }
            }
        }
    }

    /// Times at which demand jumps (convergence is measured from each).
    pub fn shifts(&self) -> Vec<Duration> {
        match self {
            RateProfile::Constant { .. } | RateProfile::Diurnal { .. } => Vec::new(),
            RateProfile::Steps { steps } => steps.iter().skip(1).map(|s| s.at).collect(),
            RateProfile::FlashCrowd { start, end, .. } => {
                std::iter::once(*start).chain(*end).collect()
            }
        }
    }

    fn segment(&self, t: u64) -> Segment {
        match self {
            RateProfile::Constant { per_sec } => Segment {
                max_per_sec: *per_sec,
                ends_at: None,
                exact: true,
            },
            RateProfile::Steps { steps } => Segment {
                max_per_sec: self.rate_at(t),
                ends_at: steps.iter().map(|s| nanos(s.at)).find(|&at| at > t),
                exact: true,
            },
            RateProfile::FlashCrowd { start, end, .. } => Segment {
                max_per_sec: self.rate_at(t),
                ends_at: [Some(nanos(*start)), end.map(nanos)]
                    .into_iter()
                    .flatten()
                    .find(|&at| at > t),
                exact: true,
            },
            RateProfile::Diurnal {
                period, peak_at, ..
            } => self.diurnal_segment(t, nanos(*period), nanos(*peak_at)),
        }
    }

    fn diurnal_segment(&self, t: u64, period: u64, peak_at: u64) -> Segment {
        let slice = (period / DIURNAL_SEGMENTS).max(1);
        let start = t - t % slice;
        let end = start + slice;
        // Between its peak and its trough the curve is monotone, so its maximum over a slice is
        // at an end of the slice, or at the peak if the slice holds one.
        let next_peak = start + (peak_at % period + period - start % period) % period;
        let mut max_per_sec = self.rate_at(start).max(self.rate_at(end));
        if next_peak < end {
            max_per_sec = max_per_sec.max(self.rate_at(next_peak));
        }
        Segment {
            max_per_sec,
            ends_at: Some(end),
            exact: false,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    allot_core::time::duration_nanos(d)
}

/// Generates one source's arrival times, in nanoseconds since the start of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrivalGen {
    profile: RateProfile,
    process: ArrivalProcess,
    start: u64,
    end: u64,
}

impl ArrivalGen {
    pub fn new(
        profile: RateProfile,
        process: ArrivalProcess,
        start: Duration,
        end: Duration,
    ) -> Self {
        ArrivalGen {
            profile,
            process,
            start: nanos(start),
            end: nanos(end),
        }
    }

    /// The first arrival at or after the source's start.
    pub fn first(&self, rng: &mut ChaCha8Rng) -> Option<u64> {
        self.next_from(self.start, rng)
    }

    /// The arrival after one at `prev`.
    pub fn next_after(&self, prev: u64, rng: &mut ChaCha8Rng) -> Option<u64> {
        self.next_from(prev, rng)
    }

    fn next_from(&self, mut t: u64, rng: &mut ChaCha8Rng) -> Option<u64> {
        while t < self.end {
            let seg = self.profile.segment(t);
            if seg.max_per_sec <= 0.0 {
                t = seg.ends_at?;
                continue;
            }
            let mean_gap = NANOS_PER_SEC / seg.max_per_sec;
            let gap = match self.process {
                ArrivalProcess::Poisson => {
                    let e: f64 = Exp1.sample(rng);
                    e * mean_gap
                }
                ArrivalProcess::Uniform => mean_gap,
            };
            let candidate = t.saturating_add(gap.round() as u64);
            if let Some(ends_at) = seg.ends_at
                && candidate >= ends_at
            {
                // Memoryless: restarting the draw at the boundary under the new rate is exact.
                t = ends_at;
                continue;
            }
            if seg.exact || rng.random::<f64>() * seg.max_per_sec < self.profile.rate_at(candidate)
            {
                return (candidate < self.end).then_some(candidate);
            }
            t = candidate;
        }
        None
    }
}

/// What one request costs.
#[derive(Clone, Debug, PartialEq)]
pub enum CostModel {
    Constant {
        units: u64,
    },
    /// LLM tokens: reserve an estimate up front, settle the actual count after the response.
    Llm(LlmCost),
}

#[derive(Clone, Debug, PartialEq)]
pub struct LlmCost {
    pub reserve_units: u64,
    pub actual: TokenDist,
    pub settle_after: LatencyDist,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TokenDist {
    Constant {
        units: u64,
    },
    Uniform {
        min_units: u64,
        max_units: u64,
    },
    /// Long-tailed: `median * exp(sigma * N(0, 1))`, capped at `max_units`.
    LogNormal {
        median_units: f64,
        sigma: f64,
        max_units: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum LatencyDist {
    Constant(Duration),
    Uniform { min: Duration, max: Duration },
}

/// One request's cost as drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    /// Charged when the request is admitted.
    pub reserve_units: u64,
    /// For reservations: what the request really used, settled after `settle_after`.
    pub settle: Option<Settlement>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    pub actual_units: u64,
    pub after: Duration,
}

impl CostModel {
    #[inline]
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> Cost {
        match self {
            CostModel::Constant { units } => Cost {
                reserve_units: *units,
                settle: None,
            },
            CostModel::Llm(llm) => Cost {
                reserve_units: llm.reserve_units,
                settle: Some(Settlement {
                    actual_units: llm.actual.sample(rng),
                    after: llm.settle_after.sample(rng),
                }),
            },
        }
    }
}

impl TokenDist {
    fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        match *self {
            TokenDist::Constant { units } => units,
            TokenDist::Uniform {
                min_units,
                max_units,
            } => rng.random_range(min_units..=max_units),
            TokenDist::LogNormal {
                median_units,
                sigma,
                max_units,
            } => {
                // Parameters are validated when the scenario is read.
                let d = LogNormal::new(median_units.ln(), sigma).unwrap_or_else(|_| {
                    unreachable!("median and sigma are checked positive and finite")
                });
                (d.sample(rng).round() as u64).clamp(1, max_units)
            }
        }
    }
}

impl LatencyDist {
    fn sample(&self, rng: &mut ChaCha8Rng) -> Duration {
        match *self {
            LatencyDist::Constant(d) => d,
            LatencyDist::Uniform { min, max } => {
                Duration::from_nanos(rng.random_range(nanos(min)..=nanos(max)))
            }
        }
    }
}

/// What a client does after a denial.
#[derive(Clone, Debug, PartialEq)]
pub enum RetryPolicy {
    /// Gives up at once.
    None,
    /// Retries after a fixed delay, ignoring Retry-After: the storm.
    Immediate { max_retries: u32, delay: Duration },
    /// Exponential backoff: `min(cap, base * 2^n)` before retry `n + 1`, with jitter.
    Backoff {
        base: Duration,
        cap: Duration,
        max_retries: u32,
        jitter: Jitter,
        /// Never retry before the server's Retry-After.
        respect_retry_after: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    None,
    /// Uniform on `[0, delay]`.
    Full,
    /// `delay / 2` plus uniform on `[0, delay / 2]`.
    Equal,
}

impl RetryPolicy {
    /// Delay before the next attempt after `retries_so_far` retries were denied, or `None` when
    /// the client gives up.
    pub fn next_delay(
        &self,
        retries_so_far: u32,
        retry_after: Option<Duration>,
        rng: &mut ChaCha8Rng,
    ) -> Option<Duration> {
        match *self {
            RetryPolicy::None => None,
            RetryPolicy::Immediate { max_retries, delay } => {
                (retries_so_far < max_retries).then_some(delay)
            }
            RetryPolicy::Backoff {
                base,
                cap,
                max_retries,
                jitter,
                respect_retry_after,
            } => {
                if retries_so_far >= max_retries {
                    return None;
                }
                let exp = base
                    .checked_mul(1u32.checked_shl(retries_so_far).unwrap_or(u32::MAX))
                    .unwrap_or(cap)
                    .min(cap);
                let delay = jitter.apply(exp, rng);
                let floor = retry_after
                    .filter(|_| respect_retry_after)
                    .unwrap_or_default();
                Some(delay.max(floor))
            }
        }
    }
}

impl Jitter {
    fn apply(self, delay: Duration, rng: &mut ChaCha8Rng) -> Duration {
        let d = nanos(delay);
        let nanos = match self {
            Jitter::None => d,
            Jitter::Full => rng.random_range(0..=d),
            Jitter::Equal => d / 2 + rng.random_range(0..=d - d / 2),
        };
        Duration::from_nanos(nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const SEC: u64 = 1_000_000_000;

    fn count(
        profile: RateProfile,
        process: ArrivalProcess,
        secs: u64,
        seed: u64,
    ) -> (u64, Vec<u64>) {
        let g = ArrivalGen::new(profile, process, Duration::ZERO, Duration::from_secs(secs));
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut per_sec = vec![0u64; secs as usize];
        let mut t = g.first(&mut rng);
        let mut n = 0;
        let mut last = 0;
        while let Some(at) = t {
            assert!(at >= last, "arrivals come in order");
            last = at;
            per_sec[(at / SEC) as usize] += 1;
            n += 1;
            t = g.next_after(at, &mut rng);
        }
        (n, per_sec)
    }

    /// Poisson count within 5 standard deviations of its mean.
    fn assert_poisson(count: u64, mean: f64) {
        let dev = (count as f64 - mean).abs();
        assert!(
            dev <= 5.0 * mean.sqrt(),
            "{count} arrivals, expected {mean}"
        );
    }

    #[test]
    fn poisson_arrivals_match_a_constant_rate() {
        let (n, _) = count(
            RateProfile::Constant { per_sec: 1_000.0 },
            ArrivalProcess::Poisson,
            200,
            1,
        );
        assert_poisson(n, 200_000.0);
    }

    #[test]
    fn uniform_arrivals_are_evenly_spaced() {
        let (n, per_sec) = count(
            RateProfile::Constant { per_sec: 40.0 },
            ArrivalProcess::Uniform,
            10,
            1,
        );
        // One every 25 ms from 25 ms on: 399 before 10 s (the 400th would be at 10 s, the end).
        assert_eq!(n, 399);
        assert!(per_sec[1..].iter().all(|&c| c == 40));
    }

    #[test]
    fn steps_change_the_rate_exactly_at_their_time() {
        let profile = RateProfile::Steps {
            steps: vec![
                Step {
                    at: Duration::from_secs(10),
                    per_sec: 100.0,
                },
                Step {
                    at: Duration::from_secs(60),
                    per_sec: 2_000.0,
                },
            ],
        };
        let (_, per_sec) = count(profile, ArrivalProcess::Poisson, 120, 2);
        assert_eq!(
            per_sec[..10].iter().sum::<u64>(),
            0,
            "silent before the first step"
        );
        assert_poisson(per_sec[10..60].iter().sum(), 100.0 * 50.0);
        assert_poisson(per_sec[60..].iter().sum(), 2_000.0 * 60.0);
    }

    #[test]
    fn a_flash_crowd_multiplies_the_rate_during_the_crowd() {
        let profile = RateProfile::FlashCrowd {
            base_per_sec: 50.0,
            factor: 100.0,
            start: Duration::from_secs(30),
            end: Some(Duration::from_secs(40)),
        };
        let (_, per_sec) = count(profile, ArrivalProcess::Poisson, 60, 3);
        assert_poisson(per_sec[..30].iter().sum(), 50.0 * 30.0);
        assert_poisson(per_sec[30..40].iter().sum(), 5_000.0 * 10.0);
        assert_poisson(per_sec[40..].iter().sum(), 50.0 * 20.0);
    }

    #[test]
    fn a_diurnal_curve_integrates_to_its_mean_and_peaks_at_peak_at() {
        let profile = RateProfile::Diurnal {
            base_per_sec: 100.0,
            peak_per_sec: 1_100.0,
            period: Duration::from_secs(240),
            peak_at: Duration::from_secs(60),
        };
        assert_eq!(profile.rate_at(60 * SEC), 1_100.0);
        assert!((profile.rate_at(180 * SEC) - 100.0).abs() < 1e-9);
        // Over whole periods the raised cosine averages (base + peak) / 2 = 600/s.
        let (n, per_sec) = count(profile, ArrivalProcess::Poisson, 480, 4);
        assert_poisson(n, 600.0 * 480.0);
        // Around the peak (55 s..65 s) the rate is at least 100 + 1000 * (1 + cos(2 pi * 5/240)) / 2.
        let low = 100.0 + 1_000.0 * (1.0 + (TAU * 5.0 / 240.0).cos()) / 2.0;
        assert!(
            per_sec[55..65].iter().sum::<u64>() as f64 > low * 10.0 - 5.0 * (low * 10.0).sqrt()
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_arrivals() {
        let p = || RateProfile::Constant { per_sec: 500.0 };
        assert_eq!(
            count(p(), ArrivalProcess::Poisson, 5, 9),
            count(p(), ArrivalProcess::Poisson, 5, 9)
        );
        assert_ne!(
            count(p(), ArrivalProcess::Poisson, 5, 9).1,
            count(p(), ArrivalProcess::Poisson, 5, 10).1
        );
    }

    #[test]
    fn shifts_name_the_jumps_in_demand() {
        let p = RateProfile::FlashCrowd {
            base_per_sec: 1.0,
            factor: 100.0,
            start: Duration::from_secs(5),
            end: Some(Duration::from_secs(9)),
        };
        assert_eq!(
            p.shifts(),
            vec![Duration::from_secs(5), Duration::from_secs(9)]
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_gives_up() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let p = RetryPolicy::Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(1_000),
            max_retries: 6,
            jitter: Jitter::None,
            respect_retry_after: false,
        };
        let delays: Vec<_> = (0..7).map(|n| p.next_delay(n, None, &mut rng)).collect();
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(
            delays,
            vec![
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1_000),
                ms(1_000),
                None
            ]
        );
    }

    #[test]
    fn full_jitter_spreads_retries_over_the_whole_delay() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let p = RetryPolicy::Backoff {
            base: Duration::from_millis(1_000),
            cap: Duration::from_secs(10),
            max_retries: 1,
            jitter: Jitter::Full,
            respect_retry_after: false,
        };
        let delays: Vec<Duration> = (0..10_000)
            .map(|_| p.next_delay(0, None, &mut rng).unwrap())
            .collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(1)));
        let below_half = delays
            .iter()
            .filter(|d| **d < Duration::from_millis(500))
            .count();
        // Uniform on [0, 1 s]: half below 500 ms, +- 5 sd of a binomial(10,000, 0.5) = 250.
        assert!((4_750..=5_250).contains(&below_half), "{below_half}");
    }

    #[test]
    fn retry_after_is_a_floor_only_when_respected() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut p = RetryPolicy::Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_secs(1),
            max_retries: 3,
            jitter: Jitter::None,
            respect_retry_after: true,
        };
        let ra = Some(Duration::from_millis(500));
        assert_eq!(
            p.next_delay(0, ra, &mut rng),
            Some(Duration::from_millis(500))
        );
        if let RetryPolicy::Backoff {
            respect_retry_after,
            ..
        } = &mut p
        {
            *respect_retry_after = false;
        }
        assert_eq!(
            p.next_delay(0, ra, &mut rng),
            Some(Duration::from_millis(10))
        );
        let storm = RetryPolicy::Immediate {
            max_retries: 2,
            delay: Duration::ZERO,
        };
        assert_eq!(storm.next_delay(1, ra, &mut rng), Some(Duration::ZERO));
        assert_eq!(storm.next_delay(2, ra, &mut rng), None);
    }

    #[test]
    fn llm_costs_reserve_then_settle_within_their_distribution() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let model = CostModel::Llm(LlmCost {
            reserve_units: 2_000,
            actual: TokenDist::LogNormal {
                median_units: 400.0,
                sigma: 0.8,
                max_units: 4_000,
            },
            settle_after: LatencyDist::Uniform {
                min: Duration::from_millis(500),
                max: Duration::from_secs(5),
            },
        });
        let costs: Vec<Cost> = (0..20_000).map(|_| model.sample(&mut rng)).collect();
        assert!(costs.iter().all(|c| c.reserve_units == 2_000));
        let settles: Vec<Settlement> = costs.iter().map(|c| c.settle.unwrap()).collect();
        assert!(
            settles
                .iter()
                .all(|s| (1..=4_000).contains(&s.actual_units))
        );
        assert!(settles.iter().all(|s| s.after >= Duration::from_millis(500)
            && s.after <= Duration::from_secs(5)));
        // Half of a lognormal lies below its median: binomial(20,000, 0.5), +- 5 sd = 354.
        let below = settles.iter().filter(|s| s.actual_units < 400).count();
        assert!((9_646..=10_354).contains(&below), "{below}");
        // P(actual > 2,000) = P(Z > ln(5) / 0.8 = 2.01) = 2.2%: some settle above the reserve.
        assert!(settles.iter().any(|s| s.actual_units > 2_000));
    }
}
