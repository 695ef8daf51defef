//! The leader's clock frame, as the coordinator daemon replicates it (D47, D56 in
//! docs/decisions.md): every `clock_frame_interval` (5 s by default) the leader commits its
//! regions' latest clock samples through the log, and a new leader starts from the last frame
//! committed, carried over to its own clock by a probe of the earlier leader's (the hop).
//! Without it a new leader knows no region's clock until the region is heard again, and
//! reclaims a silent closed region's floor later than the daemon does.
//!
//! The simulated leaders share the true clock, so the hop's true offset is 0; what the daemon's
//! probe gets wrong is drawn: an offset anywhere within half the probe's round trip (the
//! replicated log's commit latency, one round trip to a majority), which the carried samples'
//! round trips then carry as uncertainty.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use allot_core::budget::timebase::MAX_CLOCK_DRIFT_PPM;
use allot_core::ids::RegionId;
use allot_core::rebalance::{Coordinator, RecordedBoots, RegionBoots, TableCommand};
use allot_core::sync::ClockSample;
use allot_core::time::Timestamp;

use crate::engine::derive_seed;

/// A region's clock sample on the recording leader's clock, and when it was taken.
pub type TakenSample = (RegionId, ClockSample, Timestamp);

/// What the simulated replicated log carries for the core coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replicated {
    /// A change to the allowance table.
    Table(TableCommand),
    /// A leader's clock samples of the regions, on its own clock, with when each was taken
    /// (`RecordClockFrame`, whose `heard_at` the daemon ages them by).
    ClockFrame {
        leader_term: u64,
        samples: Vec<TakenSample>,
    },
    /// A region's boots, committed before the answer to the SyncUp that changed them
    /// (`RecordBoots`, D78).
    Boots {
        leader_term: u64,
        boots: RegionBoots,
    },
}

/// A leader's side of the frames: the last one committed before it led (adopted before its
/// first live input) and when it records its next.
#[derive(Clone, Debug)]
pub struct ClockFrames {
    /// The last frame an earlier leader committed, replayed but not adopted yet.
    pending: Option<(u64, Vec<TakenSample>)>,
    /// The regions this leader's last frame held a sample of: a sample of another one is
    /// recorded at once, not at the next interval (a leader lost before then takes it along;
    /// a restored region's reach, D74, needs the sample of the boot before).
    framed: BTreeSet<RegionId>,
    /// With no frame in the log a leader records one at once (D56); otherwise at its first
    /// tick, its probes of the other nodes taking no time here.
    next_at: Timestamp,
    /// Draws the probe of each earlier leader's clock this leader took (`hop`).
    seed: u64,
    probe_round_trip: Duration,
    /// The regions' boots the log holds, and whether the leader adopted them yet.
    recorded_boots: BTreeMap<RegionId, RecordedBoots>,
    boots_adopted: bool,
    /// The boots this leader proposed last, per region: not proposed again before they commit.
    proposed_boots: BTreeMap<RegionId, RegionBoots>,
    /// Boots to commit before the next answer (`note_boots`), taken by `take_boots`.
    boots_due: Vec<Replicated>,
}

impl ClockFrames {
    pub fn new(seed: u64, probe_round_trip: Duration, now: Timestamp) -> ClockFrames {
        ClockFrames {
            pending: None,
            framed: BTreeSet::new(),
            next_at: now,
            seed,
            probe_round_trip,
            recorded_boots: BTreeMap::new(),
            boots_adopted: false,
            proposed_boots: BTreeMap::new(),
            boots_due: Vec::new(),
        }
    }

    /// The hop to the earlier leader of `term`: its true offset is 0 (one clock), measured
    /// with an error of at most half the probe's round trip, which the sample carries.
    pub fn hop(&self, term: u64) -> ClockSample {
        let round_trip_nanos = u64::try_from(self.probe_round_trip.as_nanos()).unwrap_or(u64::MAX);
        let half = round_trip_nanos / 2;
        let draw = derive_seed(self.seed, term) % (2 * half + 1);
        let offset_nanos = i64::try_from(draw).unwrap_or(0) - i64::try_from(half).unwrap_or(0);
        ClockSample {
            offset_nanos,
            round_trip_nanos: 2 * half,
        }
    }

    /// A frame of `leader_term` came through the log: an earlier leader's is kept to adopt
    /// (the last one wins, as the daemon's state keeps only the last).
    pub fn committed(&mut self, own_term: u64, leader_term: u64, samples: &[TakenSample]) {
        if leader_term < own_term {
            self.pending = Some((leader_term, samples.to_vec()));
        }
        // As the daemon's state applies a frame: a region's sample is of its newest boot when
        // the boot was answered by then.
        for (region, recorded) in &mut self.recorded_boots {
            recorded.framed(samples.iter().any(|(r, _, _)| r == region));
        }
    }

    /// A region's boots came through the log: as the daemon's state takes them, unless a later
    /// leader's are recorded already.
    pub fn boots_committed(&mut self, leader_term: u64, boots: &RegionBoots) {
        let kept = self.recorded_boots.get(&boots.region);
        if !RecordedBoots::may_replace(kept, leader_term) {
            return;
        }
        let recorded = RecordedBoots::after(kept, leader_term, boots.clone());
        self.recorded_boots.insert(boots.region.clone(), recorded);
    }

    /// Before the leader's first live input at `now`: it starts from the last frame, carried
    /// over by its probe of the recorder, each sample aged by the clocks' drift since it was
    /// taken (as the daemon ages them by `heard_at`).
    pub fn adopt(&mut self, now: Timestamp, coordinator: &mut Coordinator) {
        if let Some((term, samples)) = self.pending.take() {
            let aged = samples.into_iter().map(|(region, sample, taken_at)| {
                let age = now.saturating_duration_since(taken_at);
                (region, sample.aged(age, MAX_CLOCK_DRIFT_PPM))
            });
            coordinator.adopt_clocks(term, self.hop(term), aged);
        }
        if !std::mem::replace(&mut self.boots_adopted, true) {
            let boots = self.recorded_boots.values();
            coordinator.adopt_boots(boots.map(|r| (r.boots.clone(), r.sample_of_boot)));
        }
    }

    /// After a SyncUp of `region` was taken: its boots are to be committed before the answer
    /// when the SyncUp changed them from what the log holds (as the daemon's leader records
    /// them before it answers).
    pub fn note_boots(&mut self, coordinator: &Coordinator, region: &RegionId) {
        let Some(boots) = coordinator.region_boots(region) else {
            return;
        };
        let same = |b: Option<&RegionBoots>| b == Some(&boots);
        if same(self.recorded_boots.get(region).map(|r| &r.boots))
            || same(self.proposed_boots.get(region))
        {
            return;
        }
        self.proposed_boots.insert(region.clone(), boots.clone());
        self.boots_due.push(Replicated::Boots {
            leader_term: coordinator.leader_term(),
            boots,
        });
    }

    /// The boots `note_boots` found due, to propose now.
    pub fn take_boots(&mut self) -> Vec<Replicated> {
        std::mem::take(&mut self.boots_due)
    }

    /// The frame to record now, if one is due: every `clock_frame_interval` of the
    /// coordinator's configuration (as the daemon's leader), and as soon as the leader holds a
    /// sample of a region its last frame lacked.
    pub fn poll(&mut self, now: Timestamp, coordinator: &Coordinator) -> Option<Replicated> {
        let unframed = || {
            coordinator
                .sampled_regions()
                .any(|r| !self.framed.contains(r))
        };
        if now < self.next_at && !unframed() {
            return None;
        }
        let samples = coordinator.clock_samples_taken();
        self.next_at = now + coordinator.config().clock_frame_interval;
        // As the daemon's leader: the regions sampled count as framed, not a restored one the
        // frame carries its boot before's sample for, whose own first sample is framed at once.
        self.framed = coordinator.sampled_regions().cloned().collect();
        Some(Replicated::ClockFrame {
            leader_term: coordinator.leader_term(),
            samples,
        })
    }

    pub fn next_at(&self) -> Timestamp {
        self.next_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator(term: u64) -> Coordinator {
        let mut table = allot_core::rebalance::AllowanceTable::new();
        let outcome = table.apply(TableCommand::SetConfig {
            version: 1,
            limits: vec![allot_core::limit::LimitSpec::simple(
                "l",
                100,
                Duration::from_secs(10),
            )],
            regions: vec![RegionId::from("a")],
        });
        assert!(outcome.is_applied(), "{outcome:?}");
        let cfg = allot_core::rebalance::CoordinatorConfig::default();
        Coordinator::new(cfg, table, Timestamp::from_unix_nanos(0), term)
    }

    fn boots(boot: u64, restored: bool) -> RegionBoots {
        RegionBoots {
            region: RegionId::from("a"),
            boot,
            retired: vec![boot + 100],
            restored,
        }
    }

    /// As the daemon's state keeps them (`recorded_boots_say_whether_the_regions_sample_is_of_
    /// the_newest` in the coordinator crate): a frame's sample is of the newest boot only when
    /// the frame came after the boots and the boot was answered; a later leader's boots are not
    /// replaced by an earlier one's. A new leader adopts them at its first input: a message of
    /// a retired boot is old there.
    #[test]
    fn replicated_boots_are_kept_and_adopted_as_the_daemons_state_keeps_them() {
        let now = Timestamp::from_unix_nanos(0);
        let mut frames = ClockFrames::new(1, Duration::ZERO, now);
        let sample = (RegionId::from("a"), ClockSample::SAME_CLOCK, now);
        let of_boot = |f: &ClockFrames| f.recorded_boots[&RegionId::from("a")].sample_of_boot;
        frames.committed(3, 1, std::slice::from_ref(&sample));
        frames.boots_committed(1, &boots(7, false));
        assert!(!of_boot(&frames), "the frame was before the boot");
        frames.committed(3, 1, std::slice::from_ref(&sample));
        assert!(of_boot(&frames));
        frames.boots_committed(2, &boots(3, true));
        frames.committed(3, 2, std::slice::from_ref(&sample));
        assert!(
            !of_boot(&frames),
            "a restored boot's frame holds its boot before's"
        );
        frames.boots_committed(1, &boots(9, false));
        assert_eq!(frames.recorded_boots[&RegionId::from("a")].boots.boot, 3);

        let mut c = coordinator(3);
        frames.adopt(now, &mut c);
        let a = RegionId::from("a");
        assert_eq!(c.region_boots(&a), Some(boots(3, true)));
        let late = allot_core::sync::SyncUp::new(a.clone(), 103, 9, now, 1);
        c.handle_sync_up(now, late).unwrap();
        assert_eq!(
            c.region_boots(&a).map(|b| b.boot),
            Some(3),
            "boot 103 is retired"
        );
        frames.note_boots(&c, &a);
        assert!(
            frames.take_boots().is_empty(),
            "nothing changed: nothing to commit"
        );
    }

    #[test]
    fn a_hop_is_drawn_within_half_its_round_trip_and_differs_by_term() {
        let frames = ClockFrames::new(7, Duration::from_millis(10), Timestamp::from_unix_nanos(0));
        let hops: Vec<_> = (0..64).map(|t| frames.hop(t)).collect();
        for h in &hops {
            assert_eq!(h.round_trip_nanos, 10_000_000);
            assert!(h.offset_nanos.unsigned_abs() <= 5_000_000, "{h:?}");
        }
        assert!(hops.iter().any(|h| h.offset_nanos > 1_000_000));
        assert!(hops.iter().any(|h| h.offset_nanos < -1_000_000));
        let none = ClockFrames::new(7, Duration::ZERO, Timestamp::from_unix_nanos(0));
        assert_eq!(none.hop(3), ClockSample::SAME_CLOCK);
    }
}
