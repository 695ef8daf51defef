//! A one-way link between a region and the coordinator: latency, and the faults a scenario
//! puts on it (loss, duplication, reordering, extra delay).
//!
//! A link decides, when a message is sent, when its copies arrive (none, one or two). Partitions
//! are not a link property: the engine drops messages sent or arriving while a partition holds,
//! so a message in flight when the cut starts is lost too.

use std::time::Duration;

use allot_core::time::Timestamp;
use rand::RngExt;
use rand_chacha::ChaCha8Rng;

/// Faults on a link. Several active faults combine: probabilities as independent events,
/// delays add up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a delivered message arrives twice.
    pub duplicate: f64,
    /// Probability that a message is held back by up to `reorder_window`, so later messages
    /// overtake it.
    pub reorder: f64,
    pub reorder_window: Duration,
    /// Added to every message's latency.
    pub extra_delay: Duration,
}

impl LinkFaults {
    pub fn is_none(&self) -> bool {
        *self == LinkFaults::default()
    }

    /// Both faults at once.
    pub fn combine(self, other: LinkFaults) -> LinkFaults {
        let either = |a: f64, b: f64| 1.0 - (1.0 - a) * (1.0 - b);
        LinkFaults {
            loss: either(self.loss, other.loss),
            duplicate: either(self.duplicate, other.duplicate),
            reorder: either(self.reorder, other.reorder),
            reorder_window: self.reorder_window.max(other.reorder_window),
            extra_delay: self.extra_delay + other.extra_delay,
        }
    }
}

/// When the copies of one message arrive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deliveries {
    pub first: Option<Timestamp>,
    pub duplicate: Option<Timestamp>,
}

impl Deliveries {
    pub fn iter(self) -> impl Iterator<Item = Timestamp> {
        self.first.into_iter().chain(self.duplicate)
    }
}

/// One direction between a region and the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub latency: Duration,
}

impl Link {
    /// Decides the fate of a message sent at `now` under `faults`.
    pub fn transmit(
        &self,
        now: Timestamp,
        faults: &LinkFaults,
        rng: &mut ChaCha8Rng,
    ) -> Deliveries {
        let base = now + self.latency + faults.extra_delay;
        if faults.is_none() {
            return Deliveries {
                first: Some(base),
                duplicate: None,
            };
        }
        if chance(rng, faults.loss) {
            return Deliveries::default();
        }
        let first = base + held_back(rng, faults);
        let duplicate = chance(rng, faults.duplicate).then(|| base + held_back(rng, faults));
        Deliveries {
            first: Some(first),
            duplicate,
        }
    }
}

fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    p > 0.0 && rng.random::<f64>() < p
}

fn held_back(rng: &mut ChaCha8Rng, faults: &LinkFaults) -> Duration {
    if !chance(rng, faults.reorder) || faults.reorder_window.is_zero() {
        return Duration::ZERO;
    }
    let window_nanos = u64::try_from(faults.reorder_window.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(1..=window_nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const T: Timestamp = Timestamp::from_unix_millis(1_000);
    const N: u32 = 100_000;

    fn link() -> Link {
        Link {
            latency: Duration::from_millis(40),
        }
    }

    /// Within 5 standard deviations of `n * p` (a false alarm about once in 3.5 million).
    fn assert_binomial(count: u32, n: u32, p: f64) {
        let mean = f64::from(n) * p;
        let sd = (mean * (1.0 - p)).sqrt();
        let dev = (f64::from(count) - mean).abs();
        assert!(
            dev <= 5.0 * sd,
            "{count} of {n}, expected {mean} +- {}",
            5.0 * sd
        );
    }

    #[test]
    fn a_clean_link_delivers_once_after_its_latency() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let d = link().transmit(T, &LinkFaults::default(), &mut rng);
        assert_eq!(d.first, Some(T + Duration::from_millis(40)));
        assert_eq!(d.duplicate, None);
    }

    #[test]
    fn loss_rate_matches_over_many_messages() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let faults = LinkFaults {
            loss: 0.1,
            ..LinkFaults::default()
        };
        let lost = (0..N)
            .filter(|_| link().transmit(T, &faults, &mut rng).first.is_none())
            .count() as u32;
        assert_binomial(lost, N, 0.1);
    }

    #[test]
    fn duplicates_arrive_twice_at_the_stated_rate() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let faults = LinkFaults {
            duplicate: 0.05,
            ..LinkFaults::default()
        };
        let twice = (0..N)
            .filter(|_| link().transmit(T, &faults, &mut rng).duplicate.is_some())
            .count() as u32;
        assert_binomial(twice, N, 0.05);
    }

    #[test]
    fn reordered_messages_are_overtaken_by_later_ones() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let faults = LinkFaults {
            reorder: 0.2,
            reorder_window: Duration::from_millis(50),
            ..LinkFaults::default()
        };
        // One message every 10 ms; count messages that arrive after their successor.
        let arrivals: Vec<Timestamp> = (0..N)
            .map(|i| {
                let sent = T + Duration::from_millis(10 * u64::from(i));
                link().transmit(sent, &faults, &mut rng).first.unwrap()
            })
            .collect();
        let overtaken = arrivals.windows(2).filter(|w| w[0] > w[1]).count() as u32;
        // Message i arrives at 10i + 40 + h_i ms, h_i = 0 (p = 0.8) or uniform on (0, 50]
        // (p = 0.2). It is overtaken when h_i > 10 + h_(i+1):
        // - next not held (0.8): P(h_i > 10) = 0.2 * 0.8 = 0.16;
        // - next held (0.2): 0.2 * P(U1 > 10 + U2) = 0.2 * (40^2 / 2) / 50^2 = 0.2 * 0.32.
        // P = 0.8 * 0.16 + 0.2 * 0.064 = 0.1408.
        assert_binomial(overtaken, N - 1, 0.1408);
        assert!(arrivals.iter().all(|&a| a >= T + Duration::from_millis(40)));
    }

    #[test]
    fn extra_delay_adds_to_latency() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let faults = LinkFaults {
            extra_delay: Duration::from_millis(25),
            ..LinkFaults::default()
        };
        let d = link().transmit(T, &faults, &mut rng);
        assert_eq!(d.first, Some(T + Duration::from_millis(65)));
    }

    #[test]
    fn combined_faults_are_independent_events() {
        let a = LinkFaults {
            loss: 0.5,
            extra_delay: Duration::from_millis(1),
            ..LinkFaults::default()
        };
        let c = a.combine(a);
        assert_eq!(c.loss, 0.75);
        assert_eq!(c.extra_delay, Duration::from_millis(2));
    }
}
