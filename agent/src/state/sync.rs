//! The coordinator's side of the state: the machine's timers and SyncUps, answers, the
//! timebase's guard, and the link's status.

use std::sync::atomic::Ordering;

use allot_core::budget::RegionBudget;
use allot_core::sync::{SyncDown, SyncUp};
use allot_core::time::Timestamp;

use super::Agent;
use crate::clock::{self, Clock};
use crate::error::Result;
use crate::metrics;

impl Agent {
    /// Hands the machine the timebase's edge band and guard as of now, after taking the
    /// clock sample of a round trip just answered (`sampled`).
    pub(super) fn clock_guard(&self, b: &mut RegionBudget, sampled: bool) {
        let Some(tb) = &self.timebase else { return };
        let mut tb = tb.lock().unwrap_or_else(|p| p.into_inner());
        let local = self.settings.clock.now();
        let breaks = tb.assumption_breaks();
        if sampled
            && let Some((sent_at, sample)) = b.clock_round_trip()
            && tb.on_sample(local, sent_at, sample)
        {
            if tb.assumption_breaks() > breaks {
                metrics::clock_assumption_broken();
                tracing::warn!(
                    offset_ms = sample.offset_nanos / 1_000_000,
                    "a clock sample was further off than the timebase's uncertainty allowed (a rate error above 1%, or a clock step): the clock guard starts again"
                );
            }
            b.set_clock_correction(tb.correction());
            let started = self
                .restored_at_local
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(start) = started {
                b.restore_started_no_earlier_than(tb.estimate(start));
            }
        }
        let band = tb.band(local);
        b.set_clock_guard(band, tb.guard());
        // A step back of the clock moved the correction (`Timebase::read`): kept with the
        // durable state, once there is one, or a restart would read its windows on the
        // correction from before the step.
        if b.clock_correction().is_some() {
            b.set_clock_correction(tb.correction());
        }
    }

    /// Runs the machine's timers; returns its next deadline and the SyncUp it wants sent
    /// (already durable, as the machine's contract asks).
    pub async fn on_timer(&self) -> Result<(Option<Timestamp>, Option<SyncUp>)> {
        self.note_wall_clock();
        let now = self.now();
        let limits = self.limits();
        self.with_budget(|b| {
            b.handle_timeout(now);
            for rule in limits.rules() {
                rule.metrics.keys.set(b.key_count(&rule.id) as f64);
            }
            let up = b.poll_transmit(now);
            (b.poll_timeout(), up)
        })
        .await
    }

    /// How far, in seconds, the system's wall clock reads from the agent's own clock, which
    /// counts from its start (D73): a step since then (NTP, a resumed VM), or a start that
    /// read on from its store's time. Published (`allot_wall_clock_apart_seconds`) and logged
    /// once each time it passes a second: the agent's windows follow its own clock until it
    /// restarts. `None` on a test's manual clock.
    pub fn note_wall_clock(&self) -> Option<f64> {
        let Clock::SinceStart { .. } = self.settings.clock else {
            return None;
        };
        let own = i128::from(self.settings.clock.now().as_unix_nanos());
        let wall = i128::from(clock::now().as_unix_nanos());
        let apart_secs = (wall - own) as f64 / 1e9;
        metrics::wall_clock_apart(apart_secs);
        let far = apart_secs.abs() > 1.0;
        if far && !self.wall_clock_apart.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                apart_secs,
                "the wall clock reads apart from the agent's own, which counts from its start (a step of the wall clock since, or a start that read on from its store's time): windows follow the agent's clock until it restarts"
            );
        } else if !far {
            self.wall_clock_apart.store(false, Ordering::Relaxed);
        }
        Some(apart_secs)
    }

    /// A message from the coordinator: grants may have raised allowances, so the negative
    /// cache is forgotten.
    pub async fn on_sync_down(&self, mut down: SyncDown) -> Result<()> {
        if let Some(files) = down.config.take() {
            // Before the rest: the answer's grants are of the version it carries.
            self.take_cluster_config(files).await;
        }
        let now = self.now();
        self.with_budget(|b| {
            b.handle_sync_down(now, down);
            self.clock_guard(b, true);
        })
        .await?;
        self.negative.invalidate();
        Ok(())
    }

    /// The partition-policy state (`single_region`, `connected` or `expired`) and seconds
    /// since the coordinator last answered.
    pub fn sync_status(&self) -> (&'static str, f64) {
        let now = self.now();
        let b = self.lock();
        if !b.config().coordinated {
            return ("single_region", 0.0);
        }
        let lag = b.last_contact().map_or(f64::INFINITY, |t| {
            now.saturating_duration_since(t).as_secs_f64()
        });
        let state = if b.is_view_expired(now) {
            "expired"
        } else {
            "connected"
        };
        (state, lag)
    }
}
