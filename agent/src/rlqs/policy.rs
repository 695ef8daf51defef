//! How a bucket's assignment is sized: pure arithmetic, no IO, unit-tested on its own.
//!
//! Envoy enforces a token bucket continuously: under one `TokenBucket` of `max_tokens` B
//! refilled at `f` tokens per second, it admits at most `B + f * d` requests in any span of
//! `d` seconds (the bucket starts full; an assignment identical to the one in force keeps the
//! bucket and its level). So a lease of `B + f * (ttl + slack)` units covers everything Envoy
//! can admit under an assignment from the report that asked for it to the assignment's end,
//! and the shapes below never promise more than the lease behind them.

use std::time::Duration;

use allot_core::time::Timestamp;

/// The reported rate times this (in percent) is the refill rate asked for: a busy bucket
/// keeps a margin above its current rate, so it never waits on the agent.
pub const HEADROOM_PERCENT: u64 = 150;
/// Burst tokens beyond one second of refill, so an idle bucket still passes a small burst.
pub const MIN_BURST_TOKENS: u64 = 4;
/// Fewest seconds an assignment lives (Envoy counts a TTL in whole seconds).
pub const MIN_TTL_SECS: u64 = 2;
/// Most seconds an assignment lives; the lease behind it lives `slack` longer, and both stay
/// under the agent's `lease_ttl_max` (30 s by default).
pub const MAX_TTL_SECS: u64 = 20;
/// Largest refill rate or burst asked for (Envoy's token bucket counts in `u32`).
pub const MAX_TOKENS: u64 = u32::MAX as u64;
/// The fill interval of a bucket that must not refill while its lease lives: Envoy's bucket
/// gains one token per hour, which `cover_units` counts like any other refill.
pub const NEVER_REFILL_SECS: u64 = 3_600;
/// Longest reporting interval the timing follows: a TTL of two intervals plus a slack of one
/// more second stays under the agent's default `lease_ttl_max` of 30 s.
pub const MAX_REPORT_INTERVAL_SECS: u64 = 9;

/// The reporting interval assumed until a stream has seen Envoy's: Envoy 1.40 reports about
/// every 5 s whatever its `reporting_interval` says. Assuming less would let a bucket's first
/// assignment lapse before the next report; an Envoy that reports more often is learnt from
/// its reports within a few seconds.
pub const ASSUMED_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// What the last report of a bucket said, and when reports come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Requests (allowed and denied) per second in the last report, rounded up.
    pub rate_per_sec: u64,
    /// The longest gap seen between two reports of the stream: Envoy's reporting interval.
    pub report_interval: Duration,
}

/// The timing of one assignment and of the lease behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The assignment's TTL, whole seconds.
    pub ttl_secs: u64,
    /// How much longer than the assignment the lease lives: one report interval (the report
    /// that carries the assignment's last usage) plus a second of transit.
    pub slack_secs: u64,
}

impl Timing {
    /// Two report intervals (so a report renews the assignment before it ends, even with one
    /// report late), within the bounds.
    pub fn for_interval(report_interval: Duration) -> Timing {
        let interval_secs = secs_ceil(report_interval).clamp(1, MAX_REPORT_INTERVAL_SECS);
        Timing {
            ttl_secs: (2 * interval_secs).clamp(MIN_TTL_SECS, MAX_TTL_SECS),
            slack_secs: interval_secs + 1,
        }
    }

    /// The lease's TTL: the assignment's plus the slack.
    pub fn lease_ttl(self) -> Duration {
        Duration::from_secs(self.ttl_secs + self.slack_secs)
    }

    /// Seconds the lease must cover refill for.
    fn covered_secs(self) -> u64 {
        self.ttl_secs + self.slack_secs
    }
}

/// A token bucket as Envoy is sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub max_tokens: u64,
    pub tokens_per_fill: u64,
    /// Whole seconds: Envoy reads the fill interval's seconds only.
    pub fill_interval_secs: u64,
}

impl Shape {
    /// The most Envoy admits under this shape in `secs` seconds, from a full bucket.
    pub fn most_admitted(self, secs: u64) -> u64 {
        let fills = secs / self.fill_interval_secs.max(1);
        self.max_tokens
            .saturating_add(self.tokens_per_fill.saturating_mul(fills))
    }

    /// The most Envoy admits from a full bucket while a message is on its way to it (well
    /// under a second): its burst, and one fill at most, whatever the fill timer's phase.
    pub fn in_flight_units(self) -> u64 {
        self.max_tokens.saturating_add(self.tokens_per_fill)
    }
}

/// The units to ask for: the shape the demand wants, over the lease's span.
pub fn units_wanted(demand: Demand, timing: Timing) -> u64 {
    wanted_shape(demand).most_admitted(timing.covered_secs())
}

fn wanted_shape(demand: Demand) -> Shape {
    let fill = demand
        .rate_per_sec
        .saturating_mul(HEADROOM_PERCENT)
        .div_ceil(100)
        .clamp(1, MAX_TOKENS);
    Shape {
        max_tokens: fill.saturating_add(MIN_BURST_TOKENS).min(MAX_TOKENS),
        tokens_per_fill: fill,
        fill_interval_secs: 1,
    }
}

/// The shape for a lease of `granted_units` (at least 1): the wanted shape when the lease is
/// whole; near the quota a trickle (the refill cut in proportion, the burst what is left),
/// and at the last units a bucket that never refills within the lease. Never admits more than
/// `granted_units` over the lease's span.
pub fn shape(demand: Demand, timing: Timing, granted_units: u64) -> Shape {
    let wanted = wanted_shape(demand);
    let covered = timing.covered_secs();
    if wanted.most_admitted(covered) <= granted_units {
        return wanted;
    }
    let fill = granted_units / (covered + 1);
    if fill == 0 {
        // The last units: a bucket that holds them and all but never refills.
        return Shape {
            max_tokens: granted_units.clamp(1, MAX_TOKENS),
            tokens_per_fill: 1,
            fill_interval_secs: NEVER_REFILL_SECS,
        };
    }
    Shape {
        max_tokens: (granted_units - fill * covered).clamp(1, MAX_TOKENS),
        tokens_per_fill: fill.min(MAX_TOKENS),
        fill_interval_secs: 1,
    }
}

/// The most Envoy can have admitted under `shape` from `from` (when it was first sent: Envoy
/// starts the bucket full, then, while later assignments repeat the same shape, keeps it and
/// its level) until `until`. Envoy refills continuously, so whole tokens only count.
pub fn cover_units(shape: Shape, from: Timestamp, until: Timestamp) -> u64 {
    let secs = secs_ceil(until.saturating_duration_since(from));
    let refill = u128::from(shape.tokens_per_fill) * u128::from(secs)
        / u128::from(shape.fill_interval_secs.max(1));
    shape
        .max_tokens
        .saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
}

/// Whether a shape in force still suits the demand: it refills at least at the reported
/// rate (a busy bucket never waits) and at most at twice the rate asked for (it does not hold
/// far more than it uses). Keeping it keeps Envoy's bucket and its level.
pub fn serves(shape: Shape, demand: Demand) -> bool {
    let interval = shape.fill_interval_secs.max(1);
    let wanted = wanted_shape(demand).tokens_per_fill;
    shape.tokens_per_fill >= demand.rate_per_sec.saturating_mul(interval)
        && shape.tokens_per_fill <= wanted.saturating_mul(2).saturating_mul(interval)
}

/// The longest TTL, at most `timing.ttl_secs`, for which `units` cover what `shape` admits
/// from `from` to the TTL's end plus the slack, beside `pre_used` units already charged.
pub fn ttl_secs(
    shape: Shape,
    from: Timestamp,
    now: Timestamp,
    timing: Timing,
    units: u64,
    pre_used: u64,
) -> u64 {
    (0..=timing.ttl_secs)
        .rev()
        .find(|&t| {
            let until = now.saturating_add(Duration::from_secs(t + timing.slack_secs));
            pre_used.saturating_add(cover_units(shape, from, until)) <= units
        })
        .unwrap_or(0)
}

/// The rate at which `remaining_units` last until the window ends in `window_left`: what a
/// bucket's first assignment is sized for at least. A bucket's first report carries only the
/// request that opened it, and the next comes a whole reporting interval later; sized from
/// that one request, a busy bucket would be refused for most of its first interval. Paced on
/// the region's holding instead, it is served at any rate the key can sustain to the window's
/// end, and the lease's unused units go back once the next report tells the real rate.
pub fn paced_rate_per_sec(remaining_units: u64, window_left: Duration) -> u64 {
    remaining_units.div_ceil(secs_ceil(window_left).max(1))
}

/// Requests per second in a report of `requests` over `elapsed` (Envoy counts whole seconds;
/// a bucket's first report says 0 and is taken as one second).
pub fn rate_per_sec(requests: u64, elapsed: Duration) -> u64 {
    let secs = elapsed.as_secs().max(1);
    requests.div_ceil(secs)
}

fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(rate_per_sec: u64) -> Demand {
        Demand {
            rate_per_sec,
            report_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_whole_lease_gets_the_wanted_shape_with_headroom() {
        let timing = Timing::for_interval(Duration::from_secs(1));
        assert_eq!(
            timing,
            Timing {
                ttl_secs: 2,
                slack_secs: 2
            }
        );
        let want = units_wanted(demand(100), timing);
        let s = shape(demand(100), timing, want);
        assert_eq!(s.tokens_per_fill, 150, "1.5 times the reported rate");
        assert_eq!(s.max_tokens, 154);
        assert_eq!(want, 154 + 150 * 4);
        assert_eq!(s.most_admitted(4), want);
    }

    #[test]
    fn a_short_lease_shrinks_to_a_trickle_then_to_a_bucket_that_never_refills() {
        let timing = Timing::for_interval(Duration::from_secs(1));
        for granted in 1..=1_000 {
            let s = shape(demand(100), timing, granted);
            assert!(
                s.most_admitted(timing.covered_secs()) <= granted,
                "{granted}: {s:?}"
            );
            assert!(s.max_tokens >= 1);
        }
        let trickle = shape(demand(100), timing, 50);
        assert_eq!(trickle.tokens_per_fill, 10);
        assert_eq!(trickle.max_tokens, 10);
        let last = shape(demand(100), timing, 3);
        assert_eq!(last.max_tokens, 3);
        assert_eq!(last.fill_interval_secs, NEVER_REFILL_SECS);
    }

    #[test]
    fn timing_follows_the_reporting_interval_within_bounds() {
        let t = Timing::for_interval(Duration::from_millis(4_500));
        assert_eq!(t.ttl_secs, 10);
        assert_eq!(t.slack_secs, 6);
        assert_eq!(t.lease_ttl(), Duration::from_secs(16));
        let slow = Timing::for_interval(Duration::from_secs(60));
        assert_eq!(slow.ttl_secs, 18);
        assert!(slow.lease_ttl() <= Duration::from_secs(30));
    }

    #[test]
    fn cover_counts_the_full_bucket_and_whole_refilled_tokens() {
        let t0 = Timestamp::from_unix_millis(1_000_000);
        let s = Shape {
            max_tokens: 4,
            tokens_per_fill: 3,
            fill_interval_secs: 2,
        };
        let at = |secs| t0.saturating_add(Duration::from_secs(secs));
        assert_eq!(cover_units(s, t0, t0), 4);
        assert_eq!(cover_units(s, t0, at(1)), 5, "1.5 tokens: one whole");
        assert_eq!(cover_units(s, t0, at(4)), 10);
        let timing = Timing {
            ttl_secs: 5,
            slack_secs: 2,
        };
        // 20 units, 2 used before: 4 + 1.5 * d <= 18 for d <= 9, so t + 2 <= 9.
        assert_eq!(ttl_secs(s, t0, t0, timing, 20, 2), 5);
        assert_eq!(ttl_secs(s, t0, at(3), timing, 20, 2), 4);
        assert_eq!(ttl_secs(s, t0, at(8), timing, 20, 2), 0);
    }

    #[test]
    fn a_shape_in_force_is_kept_while_it_serves_the_rate() {
        let s = shape(
            demand(10),
            Timing::for_interval(Duration::from_secs(1)),
            1_000,
        );
        assert_eq!(s.tokens_per_fill, 15);
        assert!(serves(s, demand(10)));
        assert!(serves(s, demand(15)));
        assert!(!serves(s, demand(16)), "too slow for the rate: replaced");
        assert!(serves(s, demand(5)));
        assert!(!serves(s, demand(4)), "far above the rate: replaced");
    }

    #[test]
    fn a_first_assignment_is_paced_on_what_is_left_until_the_window_ends() {
        assert_eq!(
            paced_rate_per_sec(3_600_000, Duration::from_secs(3_600)),
            1_000
        );
        // Rounded up, and a window ending within a second counts as one second.
        assert_eq!(paced_rate_per_sec(10, Duration::from_secs(3)), 4);
        assert_eq!(paced_rate_per_sec(10, Duration::from_millis(200)), 10);
        assert_eq!(paced_rate_per_sec(10, Duration::ZERO), 10);
        assert_eq!(paced_rate_per_sec(0, Duration::from_secs(60)), 0);
        // 1,000,000 a day, a whole day left: 12 a second, 18 with headroom, over the 16 s
        // span of a first lease at the assumed interval.
        let timing = Timing::for_interval(ASSUMED_REPORT_INTERVAL);
        assert_eq!((timing.ttl_secs, timing.slack_secs), (10, 6));
        let rate = paced_rate_per_sec(1_000_000, Duration::from_secs(86_400));
        assert_eq!(rate, 12);
        assert_eq!(units_wanted(demand(rate), timing), 22 + 18 * 16);
    }

    #[test]
    fn rate_counts_a_first_report_as_one_second() {
        assert_eq!(rate_per_sec(7, Duration::ZERO), 7);
        assert_eq!(rate_per_sec(7, Duration::from_secs(2)), 4);
    }
}
