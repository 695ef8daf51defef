//! The links between the regions and the coordinator. Each message may be lost, duplicated
//! and delayed (so reordered), and a region's links can be cut in either direction for a
//! while. Each message's fate is drawn from the run's seed and the message's identity (region,
//! direction, sequence number, how often it was sent), so a run replays from its inputs, and
//! removing an unrelated step while shrinking leaves the other messages' fates alone.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::sync::{SyncDown, SyncUp};
use allot_core::time::Timestamp;
use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::setup::REGIONS;

#[derive(Clone, Debug)]
pub enum Payload {
    /// From the region to the coordinator.
    Up(SyncUp),
    /// From the coordinator to the region.
    Down(SyncDown),
}

#[derive(Clone, Debug)]
pub struct Envelope {
    pub region: usize,
    pub payload: Payload,
}

/// How the links misbehave in one run.
#[derive(Clone, Copy, Debug)]
pub struct LinkFaults {
    pub loss_pct: u32,
    pub duplicate_pct: u32,
    pub min_delay_ms: u64,
    pub max_delay_ms: u64,
    /// Chance that a message is instead held for up to `long_delay_max_ms` (across windows).
    pub long_delay_pct: u32,
    pub long_delay_max_ms: u64,
}

impl LinkFaults {
    /// Every one-way delay lies in `[d, 2d]`, so every measured round trip (at least `2d`)
    /// is at least any one-way delay: the eventual term's stated assumption.
    pub fn bounded(loss_pct: u32, duplicate_pct: u32, delay_ms: u64) -> Self {
        LinkFaults {
            loss_pct,
            duplicate_pct,
            min_delay_ms: delay_ms,
            max_delay_ms: 2 * delay_ms,
            long_delay_pct: 0,
            long_delay_max_ms: 0,
        }
    }
}

/// A direction of a region's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Up,
    Down,
}

pub struct Network {
    faults: LinkFaults,
    seed: u64,
    /// Times each message identity was sent (a duplicated SyncUp is answered twice).
    sends: BTreeMap<(usize, Direction, u64), u64>,
    /// By delivery time, then send order.
    in_flight: BTreeMap<(Timestamp, u64), Envelope>,
    next_id: u64,
    /// Per region: up to when each direction is cut.
    cut_until: [[Timestamp; 2]; REGIONS.len()],
}

impl Network {
    pub fn new(faults: LinkFaults, seed: u64) -> Self {
        Network {
            faults,
            seed,
            sends: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            next_id: 0,
            cut_until: [[Timestamp::ZERO; 2]; REGIONS.len()],
        }
    }

    /// Drop everything sent or arriving on that direction of `region`'s link until `until`.
    pub fn cut(&mut self, region: usize, direction: Direction, until: Timestamp) {
        let slot = &mut self.cut_until[region][direction as usize];
        *slot = (*slot).max(until);
    }

    fn is_cut(&self, env: &Envelope, now: Timestamp) -> bool {
        now < self.cut_until[env.region][direction(env) as usize]
    }

    pub fn send(&mut self, now: Timestamp, env: Envelope) {
        let mut fate = self.fate(&env);
        if self.is_cut(&env, now) || chance(&mut fate, self.faults.loss_pct) {
            return;
        }
        let copies = if chance(&mut fate, self.faults.duplicate_pct) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = now + delay(&mut fate, &self.faults);
            self.in_flight.insert((at, self.next_id), env.clone());
            self.next_id += 1;
        }
    }

    /// The generator deciding this message's fate.
    fn fate(&mut self, env: &Envelope) -> TestRng {
        let seq = match &env.payload {
            Payload::Up(up) => up.seq,
            Payload::Down(down) => down.reply_to_seq,
        };
        let identity = (env.region, direction(env), seq);
        let nth = self.sends.entry(identity).or_default();
        *nth += 1;
        let words = [
            self.seed,
            env.region as u64,
            direction(env) as u64,
            seq ^ (*nth << 48),
        ];
        let mut bytes = [0u8; 32];
        for (chunk, word) in bytes.chunks_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
    }

    pub fn next_delivery(&self) -> Option<Timestamp> {
        self.in_flight.keys().next().map(|(at, _)| *at)
    }

    /// The next message due at `now`; one arriving on a cut link is dropped instead.
    pub fn pop_due(&mut self, now: Timestamp) -> Option<Envelope> {
        loop {
            let entry = self.in_flight.first_entry()?;
            if entry.key().0 > now {
                return None;
            }
            let env = entry.remove();
            if !self.is_cut(&env, now) {
                return Some(env);
            }
        }
    }
}

fn direction(env: &Envelope) -> Direction {
    match env.payload {
        Payload::Up(_) => Direction::Up,
        Payload::Down(_) => Direction::Down,
    }
}

fn chance(rng: &mut TestRng, pct: u32) -> bool {
    pct > 0 && rng.random_range(0..100) < pct
}

fn delay(rng: &mut TestRng, f: &LinkFaults) -> Duration {
    let ms = if chance(rng, f.long_delay_pct) {
        rng.random_range(f.max_delay_ms..=f.long_delay_max_ms.max(f.max_delay_ms))
    } else {
        rng.random_range(f.min_delay_ms..=f.max_delay_ms)
    };
    Duration::from_millis(ms)
}
