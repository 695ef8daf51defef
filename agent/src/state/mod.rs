//! The agent's shared state: one `RegionBudget` behind a mutex held only around the machine's
//! call (sub-microsecond; cheaper on two cores than a hop to an owner task), the limits in
//! force, the negative cache and the group commit. Every call follows the same path: match
//! the descriptor outside the lock, ask the machine under it, queue what it changed, release
//! the lock, wait until that is durable, then answer.

mod calls;
mod reload;
mod retry_after;
mod sync;
#[cfg(test)]
mod tests;

pub use retry_after::{RETRY_AFTER_JITTER_MAX_SECS, RETRY_AFTER_JITTER_PERCENT};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use allot_core::budget::{PersistRecord, RegionBudget, RestoreStart, Timebase};
use allot_core::ids::KeyId;
use allot_core::time::Timestamp;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;

use crate::cluster_config;
use crate::commit::{Committer, Ticket};
use crate::error::{Error, Result};
use crate::limits::{self, Limits, RuleInfo};
use crate::metrics;
use crate::negative::NegativeCache;
use crate::request::Target;
use crate::settings::Settings;
use crate::store::{Durability, Store};

pub struct Agent {
    settings: Settings,
    budget: Mutex<RegionBudget>,
    committer: Committer,
    limits: RwLock<Arc<Limits>>,
    negative: NegativeCache,
    timer: TimerWake,
    jitter: Mutex<ChaCha8Rng>,
    ready: AtomicBool,
    /// The last cluster configuration version that was refused (it did not load, or named
    /// other regions): not tried, nor logged, again at every answer.
    refused_cluster_version: AtomicU64,
    /// The corrected clock windows are read on (`max_clock_uncertainty`), if any.
    timebase: Option<Mutex<Timebase>>,
    /// Without a timebase: the latest reading of the local clock, in nanoseconds since the
    /// epoch, below which [`Agent::now`] never reads (the timebase holds its own).
    latest_local_nanos: AtomicU64,
    /// A restored start, on the local clock, until the first clock sample dates it on the
    /// corrected one (the store's correction may be missing or old).
    restored_at_local: Mutex<Option<Timestamp>>,
    /// The wall clock was last seen more than a second from the agent's own (logged once
    /// each time it gets there: `Agent::note_wall_clock`).
    wall_clock_apart: AtomicBool,
}

/// Wakes the timer task when a call makes the machine's next deadline earlier.
#[derive(Debug, Default)]
pub struct TimerWake {
    armed_nanos: AtomicU64,
    pub notify: Notify,
}

impl TimerWake {
    pub fn arm(&self, at: Timestamp) {
        let at = at.as_unix_nanos();
        if at < self.armed_nanos.load(Ordering::Relaxed) {
            self.armed_nanos.store(at, Ordering::Relaxed);
            self.notify.notify_one();
        }
    }

    /// The timer task set its next deadline.
    pub fn set(&self, at: Timestamp) {
        self.armed_nanos
            .store(at.as_unix_nanos(), Ordering::Relaxed);
    }
}

impl Agent {
    /// Loads the limits and restores the machine from `store`.
    pub fn open(mut settings: Settings, store: Arc<dyn Store>) -> Result<Agent> {
        settings.validate()?;
        let wall = settings.clock.now();
        let limits = initial_limits(&settings)?;
        let budget_config = settings.budget_config(&limits.regions())?;
        metrics::config_reload(true, limits.version);
        let records = store.load()?;
        tracing::info!(records = records.len(), "restoring state from the store");
        let restore = if settings.restored {
            Some(RestoreStart::Declared)
        } else {
            records.is_empty().then_some(RestoreStart::EmptyStore)
        };
        let restarted = !records.is_empty();
        let mut budget = RegionBudget::restore(budget_config, limits.specs(), records)?;
        budget.set_config_version(limits.version);
        budget.set_boot_clock(wall);
        let floor = budget.time_floor();
        let behind = floor.saturating_duration_since(wall);
        if behind > std::time::Duration::from_secs(1) {
            tracing::warn!(
                behind_ms = behind.as_millis() as u64,
                "the clock reads earlier than the latest time the store was written at (a step back while the agent was down): it reads on from the store's time"
            );
        }
        // With no coordinator there is no timebase to read and no sample to take.
        let coordinated = !settings.coordinators.is_empty();
        let uncertainty = settings.max_clock_uncertainty.filter(|_| coordinated);
        // The agent counts time from its start on a clock no step of the wall clock moves: a
        // step (an NTP step, a VM resumed from a snapshot) is not seen while it runs. What
        // its clock is off by, the timebase's samples correct, or without one the leader
        // measures and states (`skew`); a restart reads the wall clock again (D73). Stepped
        // forward, a running agent had read past what the leader knew of it until the next
        // sample (swarm seeds 3359309, 3361404); stepped back without a timebase, it stood
        // still and sent no SyncUp for as long as the step. Never before the store's time:
        // without a timebase the clock itself runs on from there (held, it sent no SyncUp
        // either); a timebase takes it into its correction (`Timebase::restarted`), the
        // floor being a corrected time.
        let start_floor = if uncertainty.is_some() {
            Timestamp::ZERO
        } else {
            floor
        };
        settings.clock = settings.clock.counted_from_now(start_floor);
        let mut timebase = uncertainty.map(|u| {
            if restarted {
                let local = settings.clock.now();
                Timebase::restarted(u, budget.clock_correction(), floor, local)
            } else {
                Timebase::new(u)
            }
        });
        let mut restored_at_local = None;
        if let Some(why) = restore {
            tracing::info!(
                ?why,
                "a start that may have lost state: earlier windows stay shut"
            );
            let local = settings.clock.now();
            budget.start_restored(timebase.as_mut().map_or(local, |tb| tb.read(local)), why);
            restored_at_local = timebase.is_some().then_some(local);
        }
        let seed = settings.jitter_seed.unwrap_or_else(|| {
            settings.clock.now().as_unix_nanos() ^ u64::from(std::process::id())
        });
        if restore.is_some() {
            // Not the jitter seed alone: a test's fixed one would salt two restores alike.
            let clock = settings.clock.now().as_unix_nanos();
            budget.salt_restored_boot(seed ^ clock.rotate_left(17) ^ u64::from(std::process::id()));
        }
        let blocking = settings.durability == Durability::Sync;
        Ok(Agent {
            committer: Committer::new(store, blocking),
            budget: Mutex::new(budget),
            limits: RwLock::new(Arc::new(limits)),
            negative: NegativeCache::default(),
            timer: TimerWake {
                armed_nanos: AtomicU64::new(u64::MAX),
                notify: Notify::new(),
            },
            jitter: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            ready: AtomicBool::new(false),
            refused_cluster_version: AtomicU64::new(0),
            timebase: timebase.map(Mutex::new),
            // Without a timebase the clock holds at the latest time the store was written
            // at, as it holds after a step back of a running agent's clock.
            latest_local_nanos: AtomicU64::new(floor.as_unix_nanos()),
            restored_at_local: Mutex::new(restored_at_local),
            wall_clock_apart: AtomicBool::new(false),
            settings,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The time on the agent's clock (the system clock, or a test's manual one), corrected
    /// to the coordinator's timebase when there is one. It never goes back. A key's counter
    /// already never moves to an earlier window, but the rest of the machine's time-keyed
    /// state (a window's statistics and time open, lease expiries, the sync timers, the
    /// windows answers are dated in) assumes time does not run backwards: a wall clock
    /// stepped back (an NTP step, a VM resumed from a snapshot) holds the reading until it
    /// has caught up, as the timebase's reading does.
    pub fn now(&self) -> Timestamp {
        match &self.timebase {
            Some(tb) => {
                // Read under the lock: the timebase takes a time earlier than the last as a
                // step of the clock (`Timebase::read`), not as two readers' race.
                let mut tb = tb.lock().unwrap_or_else(|p| p.into_inner());
                tb.read(self.settings.clock.now())
            }
            None => {
                let nanos = self.settings.clock.now().as_unix_nanos();
                let latest = self.latest_local_nanos.fetch_max(nanos, Ordering::Relaxed);
                Timestamp::from_unix_nanos(latest.max(nanos))
            }
        }
    }

    /// The rule a call's target matches, and the counter key it names; `None` when no rule
    /// matches (the caller counts the miss where it answers one).
    fn matched(&self, target: &Target) -> Option<(Arc<RuleInfo>, KeyId)> {
        let limits = self.limits();
        let m = limits
            .config
            .match_descriptor(&target.domain, &target.entries)?;
        let rule = limits.rule(&m.rule.spec.id)?.clone();
        Some((rule, m.key))
    }

    pub fn limits(&self) -> Arc<Limits> {
        // Readers only clone the Arc; a panic cannot leave it half-set.
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn timer(&self) -> &TimerWake {
        &self.timer
    }

    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    pub fn negative_cache(&self) -> &NegativeCache {
        &self.negative
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Runs `f` on the machine, queues what it changed, and waits until that is durable.
    pub(crate) async fn with_budget<T>(&self, f: impl FnOnce(&mut RegionBudget) -> T) -> Result<T> {
        let (out, ticket) = {
            let mut b = self.lock();
            self.clock_guard(&mut b, false);
            let out = f(&mut b);
            let ticket = self.queue_changes(&mut b);
            (out, ticket)
        };
        self.committer.wait(ticket).await?;
        Ok(out)
    }

    fn queue_changes(&self, b: &mut RegionBudget) -> Ticket {
        let records = b.drain_dirty();
        let evicted = records
            .iter()
            .filter(|r| matches!(r, PersistRecord::KeyEvicted { .. }))
            .count();
        if evicted > 0 {
            metrics::keys_evicted(evicted as u64);
        }
        let ticket = self.committer.append(records, || b.snapshot());
        if let Some(next) = b.poll_timeout() {
            self.timer.arm(next);
        }
        ticket
    }

    fn lock(&self) -> MutexGuard<'_, RegionBudget> {
        // The machine's calls do not unwind half-way through a change in normal operation;
        // a panic is a bug that already took its request down.
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The limits an agent starts with: with a coordinator, the cluster's configuration as last
/// taken (kept in the data directory), if there is one; otherwise its own files at version 1.
fn initial_limits(settings: &Settings) -> Result<Limits> {
    if settings.is_coordinated() {
        let kept = cluster_config::read(&settings.data_dir).map_err(|e| {
            Error::Config(format!(
                "{e}: remove it to start from the limits files (the cluster sends its version \
                 again)"
            ))
        })?;
        if let Some(files) = kept {
            let limits =
                limits::load_cluster(&files, settings.near_limit_ratio).map_err(|problems| {
                    Error::Config(format!(
                        "the kept cluster configuration ({}) does not load: {}",
                        cluster_config::path(&settings.data_dir).display(),
                        problems.join("\n")
                    ))
                })?;
            tracing::info!(
                version = limits.version,
                "starting with the coordinator cluster's limits as last taken; the limits \
                 files are not read"
            );
            return Ok(limits);
        }
    }
    limits::load(
        &settings.config_files,
        settings.merge_domains,
        1,
        settings.near_limit_ratio,
    )
    .map_err(|problems| Error::Config(problems.join("\n")))
}
