//! The gateway calls: check, ShouldRateLimit, lease, renew, release, settle, slots, and the
//! admin key view; each matches outside the lock and waits for its records (`with_budget`).

use std::sync::Arc;
use std::time::Duration;

use allot_core::algo::concurrency::SlotId;
use allot_core::budget::{
    AcquireRequest, Decision, FallbackCharge, LeaseOutcome, LeaseRequest, Reason, RegionBudget,
    ReleaseOutcome, RenewOutcome, SettleOutcome, SlotOutcome,
};
use allot_core::ids::{KeyId, LeaseId, LimitId, RequestId};
use allot_core::limit::FailureMode;
use allot_core::time::{Timestamp, WindowIndex};

use super::Agent;
use crate::error::Result;
use crate::limits::RuleInfo;
use crate::metrics;
use crate::request::{AdminKey, Checked, LeaseAsk, Leased, RlsDescriptor, Slotted, Target};

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

impl Agent {
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
                self.negative.remember(now, pair, &decision, rule.sliding);
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

    /// Admissions a gateway reported that no lease of `limit` could be charged with
    /// (`RegionBudget::record_uncharged`): the coordinator states their window unbounded.
    /// `at` names the window they were admitted in.
    pub fn record_uncharged(&self, limit: &LimitId, at: Timestamp, units: u64) {
        self.lock().record_uncharged(at, limit, units);
    }

    /// A gateway reported `units` of `target` admitted at `at` beyond every lease it held
    /// (Envoy's fallback behaviours): charged against the rule's `rlqs_fallback_units`
    /// (`RegionBudget::record_gateway_fallback`, D69). A target that no longer matches
    /// `limit` (a reload) has no allowance: all of it is charged nowhere.
    pub fn record_gateway_fallback(
        &self,
        limit: &LimitId,
        target: &Target,
        at: Timestamp,
        units: u64,
    ) -> FallbackCharge {
        let key = self
            .matched(target)
            .filter(|(rule, _)| &rule.id == limit)
            .map(|(_, key)| key);
        self.lock()
            .record_gateway_fallback(limit, key.as_ref(), at, units)
    }

    /// The limit of a live or recently ended lease; `None` for one unknown.
    pub fn lease_limit(&self, lease: LeaseId) -> Option<LimitId> {
        self.lock().lease_limit(lease).cloned()
    }

    /// The limit of a held slot; `None` for a slot not held.
    pub fn slot_limit(&self, slot: SlotId) -> Option<LimitId> {
        self.lock().slot_limit(slot).cloned()
    }

    /// The window of `limit` that `at` (agent time) falls in; `None` for an unknown limit.
    pub fn window_index(&self, limit: &LimitId, at: Timestamp) -> Option<WindowIndex> {
        self.lock().window_index_of(limit, at)
    }

    /// The operator's view of one key; `None` when no rule matches.
    pub fn key_state(&self, target: &Target) -> Result<Option<AdminKey>> {
        self.key_state_watching(target, false)
    }

    /// [`Agent::key_state`]; `watch`: the key remembers its next windows' final counts
    /// from now on (`RegionBudget::watch_key`).
    pub fn key_state_watching(&self, target: &Target, watch: bool) -> Result<Option<AdminKey>> {
        let Some((rule, matched_key)) = self.matched(target) else {
            return Ok(None);
        };
        let now = self.now();
        let view = {
            let mut budget = self.lock();
            if watch {
                budget.watch_key(&rule.id, &matched_key)?;
            }
            budget.key_view(now, &rule.id, &matched_key)?
        };
        let pair = (rule.id.clone(), matched_key);
        Ok(Some(AdminKey {
            negative_cache_until: self.negative.until(&pair),
            rule,
            key: pair.1,
            view,
        }))
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
                self.negative.remember(now, pair, &decision, rule.sliding);
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
}

/// Counts a decision in the rule's metrics and wraps it.
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
