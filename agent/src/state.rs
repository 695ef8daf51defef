//! The agent's shared state: one `RegionBudget` behind a mutex held only around the machine's
//! call (sub-microsecond; cheaper on two cores than a hop to an owner task), the limits in
//! force, the negative cache and the group commit. Every call follows the same path: match
//! the descriptor outside the lock, ask the machine under it, queue what it changed, release
//! the lock, wait until that is durable, then answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use allot_core::algo::concurrency::SlotId;
use allot_core::budget::inspect::KeyView;
use allot_core::budget::{
    AcquireRequest, Decision, LeaseGrant, LeaseOutcome, LeaseRequest, LeaseReturn, PersistRecord,
    Reason, RegionBudget, ReleaseOutcome, RenewOutcome, RestoreStart, SettleOutcome, SlotOutcome,
    Timebase,
};
use allot_core::ids::{KeyId, LeaseId, LimitId, RequestId};
use allot_core::limit::FailureMode;
use allot_core::sync::{ConfigFiles, SyncDown, SyncUp};
use allot_core::time::Timestamp;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;

use crate::cluster_config;
use crate::commit::{Committer, Ticket};
use crate::error::{Error, Result};
use crate::limits::{self, Limits, RuleInfo, Source};
use crate::metrics;
use crate::negative::NegativeCache;
use crate::settings::Settings;
use crate::store::{Durability, Store};

/// Retry-After is stretched by up to this share of itself (at least one second), so that
/// clients refused together do not come back together.
pub const RETRY_AFTER_JITTER_PERCENT: u64 = 10;

/// The most jitter Retry-After ever gets, in seconds: a minute spreads a refused crowd well
/// enough, and a long window (a day) then still promises its reset to within a minute,
/// instead of up to 2.4 hours after it.
pub const RETRY_AFTER_JITTER_MAX_SECS: u64 = 60;

/// A request's target: a domain and the descriptor's entries, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub domain: String,
    pub entries: Vec<(String, String)>,
}

/// The answer to a check (an acquire, or one descriptor of a ShouldRateLimit).
#[derive(Clone, Debug)]
pub enum Checked {
    /// No rule matched: allowed, nothing counted.
    NoRule,
    /// The machine (or the negative cache) decided.
    Decided {
        rule: Arc<RuleInfo>,
        decision: Decision,
    },
    /// The agent could not decide (the rule tracks as many keys as it may): the rule's
    /// failure mode did.
    Degraded { rule: Arc<RuleInfo>, allowed: bool },
}

impl Checked {
    pub fn allowed(&self) -> bool {
        match self {
            Checked::NoRule => true,
            Checked::Decided { decision, .. } => decision.allowed,
            Checked::Degraded { allowed, .. } => *allowed,
        }
    }
}

/// How a gateway ended a lease, for its metrics.
#[derive(Clone, Copy, Debug)]
enum Returned {
    Release,
    Settle,
}

impl Returned {
    fn as_str(self) -> &'static str {
        match self {
            Returned::Release => "release",
            Returned::Settle => "settle",
        }
    }
}

/// What a lease call asks for, beside its target and idempotency key.
#[derive(Clone, Debug)]
pub struct LeaseAsk {
    pub units_wanted: u64,
    pub min_units: u64,
    pub ttl: Duration,
    /// Leases the caller is done with, ended before the grant.
    pub returns: Vec<LeaseReturn>,
    /// A live lease of the same target to add the grant to.
    pub top_up: Option<LeaseId>,
}

/// The answer to a lease request.
#[derive(Clone, Debug)]
pub enum Leased {
    NoRule,
    Granted {
        rule: Arc<RuleInfo>,
        grant: LeaseGrant,
    },
    Denied {
        rule: Arc<RuleInfo>,
        decision: Decision,
    },
    /// The rule counts nothing: spend freely.
    Unmetered {
        rule: Arc<RuleInfo>,
        units: u64,
        reason: Reason,
    },
    Degraded {
        rule: Arc<RuleInfo>,
        allowed: bool,
    },
}

/// The answer to a slot request.
#[derive(Clone, Debug)]
pub enum Slotted {
    NoRule,
    Decided {
        rule: Arc<RuleInfo>,
        outcome: SlotOutcome,
    },
    Degraded {
        rule: Arc<RuleInfo>,
        allowed: bool,
    },
}

/// One descriptor of a ShouldRateLimit request: its entries and hits (0: check only).
#[derive(Clone, Debug)]
pub struct RlsDescriptor {
    pub entries: Vec<(String, String)>,
    pub hits: u64,
}

/// What the admin key view shows.
#[derive(Clone, Debug)]
pub struct AdminKey {
    pub rule: Arc<RuleInfo>,
    pub key: KeyId,
    pub view: KeyView,
    pub negative_cache_until: Option<Timestamp>,
}

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
    /// A restored start, on the local clock, until the first clock sample dates it on the
    /// corrected one (the store's correction may be missing or old).
    restored_at_local: Mutex<Option<Timestamp>>,
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
    pub fn open(settings: Settings, store: Arc<dyn Store>) -> Result<Agent> {
        settings.validate()?;
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
        budget.set_boot_clock(settings.clock.now());
        // With no coordinator there is no timebase to read and no sample to take.
        let coordinated = !settings.coordinators.is_empty();
        let mut timebase = settings
            .max_clock_uncertainty
            .filter(|_| coordinated)
            .map(|u| {
                if restarted {
                    Timebase::restarted(u, budget.clock_correction())
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
            restored_at_local: Mutex::new(restored_at_local),
            settings,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The time on the agent's clock (the system clock, or a test's manual one), corrected
    /// to the coordinator's timebase when there is one.
    pub fn now(&self) -> Timestamp {
        let local = self.settings.clock.now();
        match &self.timebase {
            Some(tb) => tb.lock().unwrap_or_else(|p| p.into_inner()).read(local),
            None => local,
        }
    }

    /// Hands the machine the timebase's edge band and guard as of now, after taking the
    /// clock sample of a round trip just answered (`sampled`).
    fn clock_guard(&self, b: &mut RegionBudget, sampled: bool) {
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

    /// Checks and charges one request of `cost_units`.
    pub async fn acquire(
        &self,
        target: &Target,
        cost_units: u64,
        request_id: Option<RequestId>,
    ) -> Result<Checked> {
        let Some((rule, matched_key)) = self.matched(target) else {
            metrics::no_rule();
            return Ok(Checked::NoRule);
        };
        let now = self.now();
        let pair = (rule.id.clone(), matched_key);
        if request_id.is_none()
            && let Some(decision) = self.cached_refusal(now, &pair)
        {
            return Ok(record(rule, decision));
        }
        let req = AcquireRequest {
            limit: pair.0.clone(),
            key: pair.1.clone(),
            cost_units,
            request_id,
        };
        let res = self.with_budget(|b| b.acquire(now, req)).await?;
        self.checked(now, rule, pair, res)
    }

    /// Every descriptor of one ShouldRateLimit request, under one lock and one commit.
    pub async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[RlsDescriptor],
    ) -> Result<Vec<Checked>> {
        let limits = self.limits();
        let entries: Vec<&[(String, String)]> =
            descriptors.iter().map(|d| d.entries.as_slice()).collect();
        let matches = limits.config.match_request(domain, &entries);
        let now = self.now();
        let mut answers: Vec<Option<Checked>> = vec![None; descriptors.len()];
        let mut metric_values: Vec<Option<String>> = vec![None; descriptors.len()];
        let mut asks = Vec::new();
        for (i, (m, d)) in matches.into_iter().zip(descriptors).enumerate() {
            let Some(m) = m else {
                metrics::no_rule();
                answers[i] = Some(Checked::NoRule);
                continue;
            };
            let Some(rule) = limits.rule(&m.rule.spec.id).cloned() else {
                answers[i] = Some(Checked::NoRule);
                continue;
            };
            metric_values[i] = m.metric_value;
            let pair = (rule.id.clone(), m.key);
            if d.hits > 0
                && let Some(decision) = self.cached_refusal(now, &pair)
            {
                answers[i] = Some(record(rule, decision));
                continue;
            }
            asks.push((i, rule, pair, d.hits));
        }
        if asks.is_empty() {
            return Ok(with_values_counted(answers, metric_values));
        }
        let results = self
            .with_budget(|b| {
                asks.iter()
                    .map(|(_, rule, (limit, key), hits)| {
                        if *hits == 0 {
                            peek(b, now, limit, key, rule.quota_units)
                        } else {
                            b.acquire(
                                now,
                                AcquireRequest {
                                    limit: limit.clone(),
                                    key: key.clone(),
                                    cost_units: *hits,
                                    request_id: None,
                                },
                            )
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
        for ((i, rule, pair, _), res) in asks.into_iter().zip(results) {
            // Without request ids the machine refuses nothing else a descriptor could carry.
            answers[i] = Some(
                self.checked(now, rule, pair, res)
                    .unwrap_or(Checked::NoRule),
            );
        }
        Ok(with_values_counted(answers, metric_values))
    }

    /// A lease of up to `units_wanted` (at least `min_units`, or nothing).
    pub async fn lease(
        &self,
        target: &Target,
        ask: LeaseAsk,
        request_id: Option<RequestId>,
    ) -> Result<Leased> {
        let Some((rule, matched_key)) = self.matched(target) else {
            metrics::no_rule();
            return Ok(Leased::NoRule);
        };
        let now = self.now();
        let (limit, key) = (rule.id.clone(), matched_key);
        let pair = (limit.clone(), key.clone());
        // Returned leases must end whatever the answer, so only a call without any may be
        // refused from the cache.
        if request_id.is_none()
            && ask.returns.is_empty()
            && let Some(decision) = self.cached_refusal(now, &pair)
        {
            count(&rule, &decision);
            return Ok(Leased::Denied { rule, decision });
        }
        let req = LeaseRequest {
            limit,
            key,
            units_wanted: ask.units_wanted,
            min_units: ask.min_units,
            denied_units: 0,
            rate_units_per_sec: None,
            ttl: ask.ttl,
            request_id,
        };
        let (ended, res) = self
            .with_budget(|b| {
                let ended = b.release_returned(now, &ask.returns)?;
                let granted = match ask.top_up {
                    Some(lease) => b.top_up(now, lease, req),
                    None => b.lease(now, req),
                };
                Ok::<_, allot_core::Error>((ended, granted))
            })
            .await??;
        for e in &ended {
            self.refunded(Returned::Release, Some(&e.limit), e.refunded_units);
        }
        let outcome = match res {
            Ok(o) => o,
            Err(e) => {
                return Ok(match self.failed(rule, e)? {
                    Checked::Degraded { rule, allowed } => Leased::Degraded { rule, allowed },
                    _ => Leased::NoRule,
                });
            }
        };
        Ok(match outcome {
            LeaseOutcome::Granted(grant) => {
                rule.metrics.lease_grants.increment(1);
                rule.metrics.lease_granted_units.increment(grant.units);
                Leased::Granted { rule, grant }
            }
            LeaseOutcome::Denied(decision) => {
                self.negative.remember(now, pair, &decision);
                count(&rule, &decision);
                Leased::Denied { rule, decision }
            }
            LeaseOutcome::Unmetered { units, reason } => {
                rule.metrics.unmetered.increment(1);
                Leased::Unmetered {
                    rule,
                    units,
                    reason,
                }
            }
        })
    }

    pub async fn renew(
        &self,
        lease: LeaseId,
        ttl: Duration,
        request_id: Option<RequestId>,
    ) -> Result<RenewOutcome> {
        let now = self.now();
        Ok(self
            .with_budget(|b| b.renew(now, lease, ttl, request_id))
            .await??)
    }

    pub async fn release(
        &self,
        lease: LeaseId,
        unused_units: u64,
        request_id: Option<RequestId>,
    ) -> Result<ReleaseOutcome> {
        let now = self.now();
        let (limit, out) = self
            .with_budget(|b| {
                let limit = b.lease_limit(lease).cloned();
                b.release(now, lease, unused_units, request_id)
                    .map(|out| (limit, out))
            })
            .await??;
        self.refunded(Returned::Release, limit.as_ref(), out.refunded_units);
        Ok(out)
    }

    pub async fn settle(
        &self,
        lease: LeaseId,
        actual_units: u64,
        request_id: Option<RequestId>,
    ) -> Result<SettleOutcome> {
        let now = self.now();
        let (limit, out) = self
            .with_budget(|b| {
                let limit = b.lease_limit(lease).cloned();
                b.settle(now, lease, actual_units, request_id)
                    .map(|out| (limit, out))
            })
            .await??;
        self.refunded(Returned::Settle, limit.as_ref(), out.refunded_units);
        if out.clamped_units > 0 {
            let limits = self.limits();
            if let Some(rule) = limit.as_ref().and_then(|l| limits.rule(l)) {
                rule.metrics
                    .settle_clamped_units
                    .increment(out.clamped_units);
            }
        }
        Ok(out)
    }

    pub async fn acquire_slot(
        &self,
        target: &Target,
        request_id: Option<RequestId>,
    ) -> Result<Slotted> {
        let Some((rule, matched_key)) = self.matched(target) else {
            metrics::no_rule();
            return Ok(Slotted::NoRule);
        };
        let now = self.now();
        let key = matched_key;
        let limit = rule.id.clone();
        let res = self
            .with_budget(|b| b.acquire_slot(now, &limit, &key, request_id))
            .await?;
        match res {
            Ok(outcome) => {
                match &outcome {
                    SlotOutcome::Acquired {
                        shadow_denied: true,
                        ..
                    } => rule.metrics.shadow_would_deny.increment(1),
                    SlotOutcome::Acquired { .. } => rule.metrics.allowed.increment(1),
                    SlotOutcome::Denied { .. } => rule.metrics.denied.increment(1),
                    SlotOutcome::Unmetered => rule.metrics.unmetered.increment(1),
                }
                Ok(Slotted::Decided { rule, outcome })
            }
            Err(e) => match self.failed(rule, e)? {
                Checked::Degraded { rule, allowed } => Ok(Slotted::Degraded { rule, allowed }),
                _ => Ok(Slotted::NoRule),
            },
        }
    }

    pub async fn release_slot(&self, slot: SlotId) -> Result<bool> {
        let now = self.now();
        Ok(self.with_budget(|b| b.release_slot(now, slot)).await??)
    }

    /// The operator's view of one key; `None` when no rule matches.
    pub fn key_state(&self, target: &Target) -> Result<Option<AdminKey>> {
        let Some((rule, matched_key)) = self.matched(target) else {
            return Ok(None);
        };
        let now = self.now();
        let view = self.lock().key_view(now, &rule.id, &matched_key)?;
        let pair = (rule.id.clone(), matched_key);
        Ok(Some(AdminKey {
            negative_cache_until: self.negative.until(&pair),
            rule,
            key: pair.1,
            view,
        }))
    }

    /// Reads the limits files again. A configuration that does not load changes nothing: its
    /// every problem is logged and counted.
    pub async fn reload(&self, why: &str) -> bool {
        let current = self.limits();
        if current.source == Source::Cluster {
            // The cluster numbers its versions; a local load would take a number that means
            // other limits there (D25).
            tracing::error!(
                why,
                version = current.version,
                "limits configuration not reloaded: the limits in force are the coordinator \
                 cluster's; change them with `allot config put`"
            );
            metrics::config_reload(false, current.version);
            return false;
        }
        let version = current.version + 1;
        let s = &self.settings;
        let loaded = limits::load(
            &s.config_files,
            s.merge_domains,
            version,
            s.near_limit_ratio,
        );
        let new = match loaded {
            Ok(l) => Arc::new(l),
            Err(problems) => {
                for p in &problems {
                    tracing::error!(problem = %p, "limits configuration not reloaded");
                }
                tracing::error!(
                    errors = problems.len(),
                    why,
                    version = current.version,
                    "keeping the limits configuration in force"
                );
                metrics::config_reload(false, current.version);
                return false;
            }
        };
        if s.is_coordinated() && new.regions() != current.regions() {
            // The machine's default shares were computed over the regions named at start; the
            // coordinator's over its own list. Changing them is a restart of every region.
            tracing::error!(
                why,
                version = current.version,
                "limits configuration not reloaded: it names other regions than the one in \
                 force; the deployment's regions change only with a restart"
            );
            metrics::config_reload(false, current.version);
            return false;
        }
        let rules = new.config.rules().len();
        let res = self.put_in_force(new, version).await;
        tracing::info!(why, version, rules, "limits configuration reloaded");
        if let Err(e) = res {
            tracing::error!(error = %e, "the reloaded state is not yet persisted");
        }
        true
    }

    /// Takes the coordinator cluster's configuration, as a reload takes files (rules that
    /// still exist keep their counters; grants of changed limits go), when it is newer than
    /// the cluster's version in force, or when the agent still runs its own files at another
    /// version: the cluster's wins (D25). Kept in the data directory for the next start.
    pub async fn take_cluster_config(&self, files: ConfigFiles) -> bool {
        let current = self.limits();
        let newer = match current.source {
            Source::Cluster => files.version > current.version,
            Source::Files => files.version != current.version,
        };
        if !newer || self.refused_cluster_version.load(Ordering::Relaxed) == files.version {
            return false;
        }
        let new = match limits::load_cluster(&files, self.settings.near_limit_ratio) {
            Ok(l) => Arc::new(l),
            Err(problems) => {
                for p in &problems {
                    tracing::error!(problem = %p, version = files.version, "the cluster's limits do not load here");
                }
                return self.refuse_cluster_config(files.version, current.version);
            }
        };
        if new.regions() != current.regions() {
            tracing::error!(
                version = files.version,
                "the cluster's limits name other regions than the ones in force; the \
                 deployment's regions change only with a restart"
            );
            return self.refuse_cluster_config(files.version, current.version);
        }
        let version = files.version;
        let rules = new.config.rules().len();
        let res = self.put_in_force(new, version).await;
        tracing::info!(
            version,
            rules,
            "limits configuration taken from the coordinator cluster"
        );
        if let Err(e) = res {
            tracing::error!(error = %e, "the new configuration's state is not yet persisted");
        }
        let dir = self.settings.data_dir.clone();
        let kept = tokio::task::spawn_blocking(move || cluster_config::persist(&dir, &files)).await;
        match kept {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the cluster's limits are not kept for the next start")
            }
            Err(e) => {
                tracing::error!(error = %e, "the cluster's limits are not kept for the next start")
            }
        }
        true
    }

    /// Puts `new` in force as `version`, from files or from the cluster: the machine's limits
    /// (rules that still exist keep their counters), the rules requests read, and the negative
    /// cache, whose denials were the old rules'.
    async fn put_in_force(&self, new: Arc<Limits>, version: u64) -> Result<()> {
        let now = self.now();
        let res = self
            .with_budget(|b| {
                b.set_limits(now, new.specs());
                b.set_config_version(version);
                *self.limits.write().unwrap_or_else(|p| p.into_inner()) = new;
            })
            .await;
        self.negative.invalidate();
        metrics::config_reload(true, version);
        res
    }

    fn refuse_cluster_config(&self, version: u64, in_force: u64) -> bool {
        self.refused_cluster_version
            .store(version, Ordering::Relaxed);
        metrics::config_reload(false, in_force);
        false
    }

    /// Runs the machine's timers; returns its next deadline and the SyncUp it wants sent
    /// (already durable, as the machine's contract asks).
    pub async fn on_timer(&self) -> Result<(Option<Timestamp>, Option<SyncUp>)> {
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

    /// The Retry-After for a refusal: whole seconds, rounded up, plus a jitter of up to a
    /// tenth of that (at least 1 s, at most [`RETRY_AFTER_JITTER_MAX_SECS`]).
    pub fn retry_after_secs(&self, retry_after: Duration) -> u64 {
        let base = ceil_secs(retry_after).max(1);
        let spread = (base * RETRY_AFTER_JITTER_PERCENT)
            .div_ceil(100)
            .clamp(1, RETRY_AFTER_JITTER_MAX_SECS);
        let jitter = self
            .jitter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_range(0..=spread);
        base + jitter
    }

    fn cached_refusal(&self, now: Timestamp, pair: &(LimitId, KeyId)) -> Option<Decision> {
        let d = self.negative.check(now, pair)?;
        metrics::negative_cache_hit();
        Some(d)
    }

    fn checked(
        &self,
        now: Timestamp,
        rule: Arc<RuleInfo>,
        pair: (LimitId, KeyId),
        res: allot_core::Result<Decision>,
    ) -> Result<Checked> {
        match res {
            Ok(decision) => {
                self.negative.remember(now, pair, &decision);
                Ok(record(rule, decision))
            }
            // Not an answer: a refused request id (reused for another request) must reach the
            // caller as an error, never as "no rule" (which admits).
            Err(e) => self.failed(rule, e),
        }
    }

    /// A call the machine refused: too many keys is decided by the rule's failure mode; a rule
    /// that a reload removed meanwhile matches nothing; anything else is an error.
    fn failed(&self, rule: Arc<RuleInfo>, e: allot_core::Error) -> Result<Checked> {
        match e {
            allot_core::Error::TooManyKeys { .. } => {
                rule.metrics.keys_refused.increment(1);
                let allowed = rule.failure_mode == FailureMode::Open;
                if allowed {
                    rule.metrics.degraded_open.increment(1);
                } else {
                    rule.metrics.degraded_closed.increment(1);
                }
                Ok(Checked::Degraded { rule, allowed })
            }
            allot_core::Error::UnknownLimit(_) => Ok(Checked::NoRule),
            other => Err(other.into()),
        }
    }

    /// Counts a lease its gateway ended, under its rule, and lets refunded units be seen.
    fn refunded(&self, kind: Returned, limit: Option<&LimitId>, units: u64) {
        let limits = self.limits();
        match limit.and_then(|l| limits.rule(l)) {
            Some(rule) => {
                let m = &rule.metrics;
                match kind {
                    Returned::Release => m.lease_releases.increment(1),
                    Returned::Settle => m.lease_settles.increment(1),
                }
                m.lease_returned_units.increment(units);
            }
            None => metrics::lease_returned_without_rule(kind.as_str(), units),
        }
        if units > 0 {
            self.negative.invalidate();
        }
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

/// Counts a decision in the rule's metrics and wraps it.
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

fn record(rule: Arc<RuleInfo>, decision: Decision) -> Checked {
    count(&rule, &decision);
    Checked::Decided { rule, decision }
}

/// The answers of a ShouldRateLimit, each descriptor with a metric value (its rule has
/// `detailed_metric` or `value_to_metric`) counted under it.
fn with_values_counted(
    answers: Vec<Option<Checked>>,
    metric_values: Vec<Option<String>>,
) -> Vec<Checked> {
    let answers: Vec<Checked> = answers
        .into_iter()
        .map(|a| a.unwrap_or(Checked::NoRule))
        .collect();
    for (checked, value) in answers.iter().zip(metric_values) {
        if let (Some(value), Some((rule, result))) = (value, result_label(checked)) {
            rule.values.count(&value, result);
        }
    }
    answers
}

/// The rule of a check and the `result` it is counted under, as in `allot_decisions_total`;
/// `None` when no rule matched.
fn result_label(checked: &Checked) -> Option<(&Arc<RuleInfo>, &'static str)> {
    match checked {
        Checked::NoRule => None,
        Checked::Decided { rule, decision } => {
            let result = match decision.reason {
                Reason::Unlimited => "unlimited",
                Reason::Disabled => "disabled",
                _ if decision.shadow_denied => "shadow_denied",
                _ if decision.allowed => "allowed",
                _ => "denied",
            };
            Some((rule, result))
        }
        Checked::Degraded {
            rule,
            allowed: true,
        } => Some((rule, "degraded_open")),
        Checked::Degraded { rule, .. } => Some((rule, "degraded_closed")),
    }
}

fn count(rule: &RuleInfo, decision: &Decision) {
    let m = &rule.metrics;
    match decision.reason {
        Reason::Unlimited | Reason::Disabled => m.unmetered.increment(1),
        _ if decision.shadow_denied => {
            m.shadow_denied.increment(1);
            m.shadow_would_deny.increment(1);
        }
        _ if decision.allowed => {
            m.allowed.increment(1);
            if decision.remaining_units <= rule.near_limit_remaining_units {
                m.near_limit.increment(1);
            }
        }
        _ => {
            m.denied.increment(1);
            m.over_limit.increment(1);
        }
    }
}

/// Hits 0 (check only, as envoyproxy/ratelimit reads a per-descriptor `hits_addend` of 0):
/// answered from the key's state, nothing charged.
fn peek(
    b: &RegionBudget,
    now: Timestamp,
    limit: &LimitId,
    key: &KeyId,
    quota_units: u64,
) -> allot_core::Result<Decision> {
    let view = b.key_view(now, limit, key)?;
    let unmetered = matches!(view.reason, Reason::Unlimited | Reason::Disabled);
    Ok(Decision {
        allowed: true,
        remaining_units: view.remaining_units,
        retry_after: None,
        reset_after: if unmetered {
            Duration::ZERO
        } else {
            view.window_end.saturating_duration_since(now)
        },
        limit_units: quota_units,
        shadow_denied: false,
        reason: view.reason,
    })
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use allot_core::ids::RegionId;

    use super::*;
    use crate::clock::Clock;
    use crate::store::MemoryStore;

    fn agent(seed: u64) -> Agent {
        let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
        s.jitter_seed = Some(seed);
        Agent::open(s, Arc::new(MemoryStore::new())).expect("agent")
    }

    #[test]
    fn retry_after_is_rounded_up_then_stretched_by_at_most_a_tenth() {
        let a = agent(7);
        // 41.2 s rounds up to 42; a tenth of 42 rounds up to 5: 42 ..= 47.
        let draws: Vec<u64> = (0..200)
            .map(|_| a.retry_after_secs(Duration::from_millis(41_200)))
            .collect();
        assert!(draws.iter().all(|s| (42..=47).contains(s)), "{draws:?}");
        assert!(
            draws.iter().any(|s| *s != draws[0]),
            "jitter spreads clients out"
        );
        // Under a second still waits a second, and may wait one more.
        let short = a.retry_after_secs(Duration::from_millis(10));
        assert!((1..=2).contains(&short));
    }

    /// A day window refused at any time of day says to come back after the next UTC
    /// midnight, and at most [`RETRY_AFTER_JITTER_MAX_SECS`] later: the clock is the test's,
    /// so every time of day is tried whenever the test runs (00:40 UTC once gave 88,628 s).
    #[tokio::test]
    async fn a_day_windows_retry_after_is_the_next_midnight_at_any_time_of_day() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("day.yaml");
        std::fs::write(
            &file,
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 3\n",
        )
        .expect("limits file");
        let day_start_secs = 1_767_225_600; // 2026-01-01T00:00:00Z
        for second_of_day in [1, 59, 2_400, 7_199, 43_200, 86_340, 86_399] {
            let (clock, _) = Clock::manual(Timestamp::from_unix_nanos(
                (day_start_secs + second_of_day) * 1_000_000_000,
            ));
            let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
            s.config_files = vec![file.clone()];
            s.jitter_seed = Some(second_of_day);
            s.clock = clock;
            let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
            let ask = [RlsDescriptor {
                entries: vec![("k".into(), "v".into())],
                hits: 4,
            }];
            let checked = a.should_rate_limit("d", &ask).await.expect("check");
            assert!(!checked[0].allowed(), "4 hits against 3 a day are refused");
            let until_midnight = 86_400 - second_of_day;
            for _ in 0..50 {
                let headers = crate::service::headers::rate_limit_headers(&checked, true, |w| {
                    a.retry_after_secs(w)
                });
                let retry_after: u64 = headers
                    .iter()
                    .find(|(name, _)| *name == "Retry-After")
                    .and_then(|(_, v)| v.parse().ok())
                    .expect("a refusal carries Retry-After");
                assert!(
                    (until_midnight..=until_midnight + RETRY_AFTER_JITTER_MAX_SECS)
                        .contains(&retry_after),
                    "at second {second_of_day} of the day: Retry-After {retry_after}, \
                     midnight in {until_midnight}"
                );
            }
        }
    }

    /// A coordinated agent's default shares were computed over the regions named at start:
    /// a reload naming others would split quotas differently from the coordinator's table.
    #[tokio::test]
    async fn a_coordinated_reload_that_renames_the_regions_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("limits.yaml");
        let limits = |weights: &str| {
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: 10}}\n    allot: {{weights: {weights}}}\n"
            )
        };
        std::fs::write(&file, limits("{r: 0.5, s: 0.5}")).expect("limits file");
        let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
        s.config_files = vec![file.clone()];
        s.coordinators = vec!["127.0.0.1:7000".into()];
        let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
        std::fs::write(&file, limits("{r: 0.6, s: 0.4}")).expect("limits file");
        assert!(a.reload("test").await, "same regions, other weights");
        assert_eq!(a.limits().version, 2);
        std::fs::write(&file, limits("{r: 0.5, t: 0.5}")).expect("limits file");
        assert!(!a.reload("test").await, "other regions");
        assert_eq!(a.limits().version, 2);
    }

    /// The cluster's configuration replaces the agent's files (its version, not a load
    /// count), is kept for the next start, and stops local reloads; an older version, or one
    /// naming other regions, changes nothing.
    #[tokio::test]
    async fn the_clusters_configuration_wins_is_kept_and_stops_local_reloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("limits.yaml");
        let limits = |quota: u64, weights: &str| {
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {quota}}}\n    allot: {{weights: {weights}}}\n"
            )
        };
        let cluster = |version: u64, text: String| ConfigFiles {
            version,
            merge_domains: false,
            files: vec![allot_core::sync::ConfigFile {
                name: "cluster.yaml".into(),
                text,
            }],
        };
        std::fs::write(&file, limits(10, "{r: 0.5, s: 0.5}")).expect("limits file");
        let mut s = Settings::new(RegionId::from("r"), dir.path().to_path_buf());
        s.config_files = vec![file.clone()];
        s.coordinators = vec!["127.0.0.1:7000".into()];
        let a = Agent::open(s.clone(), Arc::new(MemoryStore::new())).expect("agent");
        assert_eq!(a.limits().source, Source::Files);
        assert!(
            a.take_cluster_config(cluster(3, limits(40, "{r: 0.5, s: 0.5}")))
                .await
        );
        let l = a.limits();
        assert_eq!((l.version, l.source), (3, Source::Cluster));
        let rule = l.rules().next().expect("a rule");
        assert_eq!(rule.quota_units, 40);
        assert_eq!(a.lock().config_version(), 3);
        // Older or the same: nothing. Other regions: refused.
        assert!(
            !a.take_cluster_config(cluster(2, limits(5, "{r: 0.5, s: 0.5}")))
                .await
        );
        assert!(
            !a.take_cluster_config(cluster(3, limits(5, "{r: 0.5, s: 0.5}")))
                .await
        );
        assert!(
            !a.take_cluster_config(cluster(4, limits(5, "{r: 0.5, t: 0.5}")))
                .await
        );
        assert_eq!(a.limits().version, 3);
        // The local files no longer reload.
        assert!(!a.reload("test").await);
        assert_eq!(a.limits().version, 3);
        drop(a);
        // A restart starts from the kept cluster configuration, not the files.
        let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
        let l = a.limits();
        assert_eq!((l.version, l.source), (3, Source::Cluster));
        assert_eq!(l.rules().next().map(|r| r.quota_units), Some(40));
    }

    #[test]
    fn the_same_seed_gives_the_same_jitter() {
        let (a, b) = (agent(3), agent(3));
        let wait = Duration::from_secs(100);
        let da: Vec<u64> = (0..20).map(|_| a.retry_after_secs(wait)).collect();
        let db: Vec<u64> = (0..20).map(|_| b.retry_after_secs(wait)).collect();
        assert_eq!(da, db);
    }

    #[tokio::test]
    async fn an_answer_is_given_only_once_its_records_are_in_the_store() {
        let store = MemoryStore::new();
        let a = Agent::open(
            Settings::new(RegionId::from("r"), PathBuf::from("unused")),
            Arc::new(store.clone()),
        )
        .expect("agent");
        let target = Target {
            domain: "default".into(),
            entries: vec![("generic_key".into(), "k".into())],
        };
        let checked = a.acquire(&target, 5, None).await.expect("acquire");
        assert!(checked.allowed());
        // The embedded default allows 6000 per minute for generic_key: 5 are on record.
        let granted: u64 = store
            .load()
            .expect("load")
            .iter()
            .filter_map(|r| match r {
                PersistRecord::Key(k) if k.key.as_str() == "generic_key=k" => Some(k.granted_units),
                _ => None,
            })
            .sum();
        assert_eq!(granted, 5);
    }
}
