//! One `StreamRateLimitQuotas` stream: Envoy's usage reports in, bucket assignments out.
//!
//! A task per stream owns its buckets. Each report charges the usage to the bucket's leases
//! and answers with a fresh assignment (at most one per bucket per `MIN_REASSIGN_GAP`, so a
//! flood of reports costs counting only). A tick every second notices a configuration reload
//! that took a bucket's rule away (`abandon_action`) and the agent shutting down.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use allot_core::budget::LeaseReturn;
use allot_core::ids::LimitId;
use allot_core::time::Timestamp;
use allot_proto::envoy::rlqs::rate_limit_quota_response::BucketAction;
use allot_proto::envoy::rlqs::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use allot_proto::envoy::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use allot_proto::envoy::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use allot_proto::envoy::types::rate_limit_strategy::{BlanketRule, Strategy};
use allot_proto::envoy::types::{RateLimitStrategy, TokenBucket};
use allot_proto::envoy::wkt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::bucket::{self, Assigned, Bucket, BucketKey, Ending, Held, NewLease, Untold};
use super::policy::{self, Demand, Shape, Timing};
use super::{MAX_BUCKETS_PER_AGENT, MAX_BUCKETS_PER_STREAM, MAX_REPORTS_PER_MESSAGE, metrics};
use crate::callers::{self, Caller};
use crate::error::Error;
use crate::limits::RuleInfo;
use crate::request::{LeaseAsk, Leased, Target};
use crate::state::Agent;

/// At most one assignment per bucket per this long; reports between are only counted.
pub const MIN_REASSIGN_GAP: Duration = Duration::from_millis(500);
/// How often the stream looks for removed rules and for shutdown.
pub const TICK: Duration = Duration::from_secs(1);
/// Reports in a row with no request after which a bucket is abandoned: Envoy forgets it
/// and the unused units of its leases go back to the region instead of expiring with them.
pub const IDLE_REPORTS: u32 = 3;
/// Reporting intervals (at least `MAX_REPORT_INTERVAL_SECS` each) with no report of a bucket
/// after which it is dropped: Envoy reports every bucket it holds at every interval, so it no
/// longer holds this one.
pub const UNREPORTED_INTERVALS: u32 = 3;
/// Rules a stream says are too short-windowed for RLQS, at most (the metric counts them all).
const MAX_SHORT_WINDOW_RULES_TOLD: usize = 64;

/// Why a bucket is dropped (the `reason` of `allot_rlqs_buckets_dropped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WhyDropped {
    /// Its rule is gone or no longer matches it (a reload).
    Reload,
    /// [`IDLE_REPORTS`] reports with no request.
    Idle,
    /// No report for [`UNREPORTED_INTERVALS`] intervals.
    Unreported,
}

impl WhyDropped {
    fn name(self) -> &'static str {
        match self {
            WhyDropped::Reload => "reload",
            WhyDropped::Idle => "idle",
            WhyDropped::Unreported => "unreported",
        }
    }
}

/// What extending the shape in force came to.
enum Extended {
    /// The same shape, its lease topped up: this assignment.
    Sent(Action),
    /// The shape no longer serves, or its lease cannot back another second: replace it.
    Replace,
    /// The agent failed the call: nothing is sent (Envoy keeps what it has until its TTL).
    Failed,
}

type Out = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// Buckets counted against the agent-wide cap; given back when the stream ends.
pub struct Session {
    agent: Arc<Agent>,
    agent_buckets: Arc<AtomicUsize>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Envoy's reporting interval as this stream has seen it: the longest gap between two
    /// periodic reports of one bucket.
    report_interval: Option<Duration>,
    /// The interval last learnt by any stream of the agent, in milliseconds (0: none yet):
    /// what a new stream assumes, since an Envoy fleet shares its configuration and a
    /// reconnecting Envoy keeps its own.
    learned_interval_ms: Arc<AtomicU64>,
    config_version: u64,
    /// Rules already said to be too short-windowed for RLQS (`note_short_window`).
    short_windows_told: HashSet<LimitId>,
    /// Who opened the stream, when the agent has a callers file (D59).
    caller: Option<Arc<Caller>>,
}

/// What a stream is served with: the agent and what its streams share, and its caller.
pub struct Shared {
    pub agent: Arc<Agent>,
    pub agent_buckets: Arc<AtomicUsize>,
    pub learned_interval_ms: Arc<AtomicU64>,
    pub caller: Option<Arc<Caller>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Leases stay with their expiry (charged whole); what was reported beyond them, or
        // waits for a lease, is Envoy's fallback: charged to the rule's allowance for it.
        let now = self.agent.now();
        for b in self.buckets.values() {
            if let Some(limit) = b.counted_by() {
                for (at, units) in b.uncharged_if_forgotten(now) {
                    self.fallback(limit, &b.target, at, units);
                }
            }
        }
        self.agent_buckets
            .fetch_sub(self.buckets.len(), Ordering::Relaxed);
        metrics::buckets(self.agent_buckets.load(Ordering::Relaxed));
    }
}

/// Serves one stream (tonic's `Streaming`, or any stream of decoded reports) until Envoy ends
/// it, the answer channel closes, a bound is passed, or the agent shuts down. Leases still held stay with their expiry: Envoy keeps enforcing an
/// assignment until its TTL, so nothing is refunded for usage the agent will never hear of.
pub async fn serve<R>(shared: Shared, mut reports: R, out: Out)
where
    R: Stream<Item = Result<RateLimitQuotaUsageReports, Status>> + Unpin,
{
    let Shared {
        agent,
        agent_buckets,
        learned_interval_ms,
        caller,
    } = shared;
    let config_version = agent.limits().version;
    let mut session = Session {
        agent,
        agent_buckets,
        buckets: HashMap::new(),
        report_interval: None,
        learned_interval_ms,
        config_version,
        short_windows_told: HashSet::new(),
        caller,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let answer = tokio::select! {
            msg = reports.next() => match msg {
                Some(Ok(m)) => session.on_reports(m).await,
                None => return,
                Some(Err(status)) => {
                    tracing::debug!(%status, "RLQS stream ended by Envoy");
                    return;
                }
            },
            _ = tick.tick() => {
                if !session.agent.is_ready() {
                    Err(Status::unavailable("the agent is shutting down"))
                } else {
                    Ok(session.on_tick().await)
                }
            }
            () = out.closed() => return,
        };
        match answer {
            Ok(actions) if actions.is_empty() => {}
            Ok(bucket_action) => {
                metrics::responses();
                if out
                    .send(Ok(RateLimitQuotaResponse { bucket_action }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
        }
    }
}

impl Session {
    async fn on_reports(
        &mut self,
        m: RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, Status> {
        if m.bucket_quota_usages.len() > MAX_REPORTS_PER_MESSAGE {
            metrics::refused("too_many_reports");
            return Err(Status::resource_exhausted(format!(
                "at most {MAX_REPORTS_PER_MESSAGE} bucket usage reports per message, found {}",
                m.bucket_quota_usages.len()
            )));
        }
        let mut actions = self.on_reload().await;
        for usage in m.bucket_quota_usages {
            if let Some(a) = self.on_usage(&m.domain, usage).await? {
                actions.push(a);
            }
        }
        Ok(actions)
    }

    async fn on_tick(&mut self) -> Vec<BucketAction> {
        let mut actions = self.on_reload().await;
        // The interval learnt so far may be the 1 s assumed before a second report, where
        // Envoy reports every 5 s: silence counts only against the longest interval the
        // timing serves, so a bucket Envoy still holds is never dropped for it.
        let longest = Duration::from_secs(policy::MAX_REPORT_INTERVAL_SECS);
        let stale = self.report_interval().max(longest) * UNREPORTED_INTERVALS;
        let now = Instant::now();
        let gone: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, b)| now.duration_since(b.reported_at) > stale)
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            actions.extend(self.drop_bucket(&key, WhyDropped::Unreported).await);
        }
        actions
    }

    /// One bucket's report: counted, then (unless one was just sent) a new assignment.
    async fn on_usage(
        &mut self,
        domain: &str,
        usage: BucketQuotaUsage,
    ) -> Result<Option<BucketAction>, Status> {
        metrics::report();
        let (key, target) = match bucket::parse(domain, usage.bucket_id.as_ref()) {
            Ok(parsed) => parsed,
            Err(bucket::BadBucket(why)) => {
                // One bad bucket must not cost the others their assignments: Envoy applies
                // its no_assignment_behavior to it.
                metrics::refused("bad_bucket");
                tracing::debug!(%why, "RLQS bucket id refused");
                return Ok(None);
            }
        };
        if let Err(refusal) = callers::check(self.caller.as_ref(), &target.domain) {
            // Outside the caller's domains: denied, with nothing leased or counted.
            tracing::debug!(?refusal, "RLQS bucket outside its caller's domains");
            crate::metrics::refused_caller("out_of_scope");
            let timing = Timing::for_interval(self.report_interval());
            return Ok(Some(BucketAction {
                bucket_id: Some(bucket::bucket_id(&key)),
                bucket_action: Some(blanket(BlanketRule::DenyAll, timing)),
            }));
        }
        let now = Instant::now();
        let paced_rate = self.open_bucket(&key, target, now)?;
        self.heard(&key, now);
        let Some(b) = self.buckets.get_mut(&key) else {
            return Ok(None);
        };
        let elapsed = usage.time_elapsed.map_or(Duration::ZERO, |d| {
            Duration::from_secs(d.seconds.max(0) as u64)
        });
        let requests = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        b.rate_per_sec = policy::rate_per_sec(requests, elapsed);
        let now_at = self.agent.now();
        // When the usage began: since the bucket's last report here, or, for a bucket this
        // stream has not heard before (one it forgot, D81, or a new stream), Envoy's
        // `time_elapsed` (whole seconds, so a second earlier).
        let since = b.last_report_at.replace(now_at).or_else(|| {
            (!elapsed.is_zero()).then(|| now_at.saturating_sub(elapsed + Duration::from_secs(1)))
        });
        let allowed = usage.num_requests_allowed;
        let expired = b.drop_expired(now_at);
        match b.counted_by().cloned() {
            Some(limit) => {
                let target = b.target.clone();
                for (at, units) in expired.beyond {
                    self.fallback(&limit, &target, at, units);
                }
                if let Some(since) = since {
                    self.straddled(&limit, &target, since, now_at, allowed, expired.room_units);
                }
            }
            None => b.unruled_report = since.map(|since| (since, allowed)),
        }
        let Some(b) = self.buckets.get_mut(&key) else {
            return Ok(None);
        };
        b.charge(usage.num_requests_allowed, self.agent.now());
        b.note_requests(requests);
        if b.idle_reports >= IDLE_REPORTS && b.assigned != Assigned::Nothing {
            return Ok(self.drop_bucket(&key, WhyDropped::Idle).await);
        }
        if !b.may_reassign(now, MIN_REASSIGN_GAP) {
            return Ok(None);
        }
        b.assigned_at = Some(now);
        let demand = Demand {
            rate_per_sec: b.rate_per_sec.max(paced_rate),
            report_interval: self.report_interval(),
        };
        Ok(self.assign(&key, demand).await)
    }

    /// Opens the bucket if it is new (counted against the caps); the rate its first
    /// assignment is paced on while it has had none yet, else 0.
    fn open_bucket(
        &mut self,
        key: &BucketKey,
        target: Target,
        now: Instant,
    ) -> Result<u64, Status> {
        if let Some(b) = self.buckets.get(key) {
            return Ok(match b.assigned_at {
                None => self.paced_rate(&b.target),
                Some(_) => 0,
            });
        }
        self.admit_bucket()?;
        let paced = self.paced_rate(&target);
        self.buckets.insert(key.clone(), Bucket::new(target, now));
        Ok(paced)
    }

    /// A report of the bucket arrived at `now`.
    fn heard(&mut self, key: &BucketKey, now: Instant) {
        let Some(b) = self.buckets.get_mut(key) else {
            return;
        };
        let gap = now.duration_since(b.reported_at);
        // Envoy reports a new bucket at once, then with the others at every interval: the
        // gap after a bucket's first report is a part of one, so gaps count from its second.
        let periodic = b.reports >= 2;
        b.reports = b.reports.saturating_add(1);
        b.reported_at = now;
        if periodic {
            self.learn_interval(gap);
        }
    }

    /// The reporting interval assignments are timed for: the stream's own once it has seen
    /// one, else the one last learnt on the agent, else [`policy::ASSUMED_REPORT_INTERVAL`].
    fn report_interval(&self) -> Duration {
        self.report_interval.unwrap_or_else(|| {
            match self.learned_interval_ms.load(Ordering::Relaxed) {
                0 => policy::ASSUMED_REPORT_INTERVAL,
                ms => Duration::from_millis(ms),
            }
        })
    }

    /// A gap between two periodic reports of one bucket: the stream's interval is the
    /// longest seen, and new streams assume it.
    fn learn_interval(&mut self, gap: Duration) {
        if self.report_interval.is_some_and(|i| i >= gap) {
            return;
        }
        self.report_interval = Some(gap);
        let ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX).max(1);
        self.learned_interval_ms.store(ms, Ordering::Relaxed);
    }

    /// The rate a bucket's first assignment is sized for at least: what the region holds
    /// for its key, spread over the rest of the window (0 when no rule counts it).
    fn paced_rate(&self, target: &Target) -> u64 {
        match self.agent.key_state(target) {
            Ok(Some(k)) => policy::paced_rate_per_sec(
                k.view.remaining_units,
                k.view
                    .window_end
                    .saturating_duration_since(self.agent.now()),
            ),
            Ok(None) => 0,
            Err(e) => {
                tracing::debug!(error = %e, "no key state to pace a first RLQS assignment on");
                0
            }
        }
    }

    /// Counts a new bucket against both caps, or refuses the stream.
    fn admit_bucket(&mut self) -> Result<(), Status> {
        if self.buckets.len() >= MAX_BUCKETS_PER_STREAM {
            metrics::refused("too_many_buckets_stream");
            return Err(Status::resource_exhausted(format!(
                "a stream holds at most {MAX_BUCKETS_PER_STREAM} buckets"
            )));
        }
        let before = self.agent_buckets.fetch_add(1, Ordering::Relaxed);
        if before >= MAX_BUCKETS_PER_AGENT {
            self.agent_buckets.fetch_sub(1, Ordering::Relaxed);
            metrics::refused("too_many_buckets_agent");
            return Err(Status::resource_exhausted(format!(
                "the agent holds at most {MAX_BUCKETS_PER_AGENT} RLQS buckets"
            )));
        }
        metrics::buckets(before + 1);
        Ok(())
    }

    /// Ends the leases a newer assignment replaced, then either extends the shape in force
    /// (topping its lease up) or sizes a new one on a new lease, and answers the assignment.
    async fn assign(&mut self, key: &BucketKey, demand: Demand) -> Option<BucketAction> {
        let timing = Timing::for_interval(demand.report_interval);
        let (target, done) = {
            let b = self.buckets.get_mut(key)?;
            (b.target.clone(), b.take_superseded(self.agent.now()))
        };
        let limit = self.buckets.get(key).and_then(|b| b.counted_by().cloned());
        let mut returns = self.end_leases(done, Untold::Nothing, limit.as_ref(), &target);
        let action = match self
            .extend(key, &target, demand, timing, &mut returns)
            .await
        {
            Extended::Sent(action) => action,
            Extended::Failed => return None,
            Extended::Replace => self.replace(key, &target, demand, timing, returns).await?,
        };
        metrics::assignment(action_name(&action));
        tracing::debug!(?key, ?demand, ?action, "RLQS assignment");
        Some(BucketAction {
            bucket_id: Some(bucket::bucket_id(key)),
            bucket_action: Some(action),
        })
    }

    /// Keeps the shape in force while it serves the demand: tops its lease up to cover the
    /// next TTL and sends the same shape again (Envoy keeps its bucket and level).
    async fn extend(
        &mut self,
        key: &BucketKey,
        target: &Target,
        demand: Demand,
        timing: Timing,
        returns: &mut Vec<LeaseReturn>,
    ) -> Extended {
        let now = self.agent.now();
        let Some(cur) = self
            .buckets
            .get_mut(key)
            .and_then(|b| b.current_mut().copied())
        else {
            return Extended::Replace;
        };
        if !policy::serves(cur.shape, demand) {
            return Extended::Replace;
        }
        let until = now.saturating_add(timing.lease_ttl());
        let need = cur.pre_used_units.saturating_add(policy::cover_units(
            cur.shape,
            cur.shape_from,
            until,
        ));
        if need > cur.units {
            let ask = LeaseAsk {
                units_wanted: need - cur.units,
                min_units: 1,
                ttl: timing.lease_ttl(),
                returns: std::mem::take(returns),
                top_up: Some(cur.lease),
            };
            match self.agent.lease(target, ask, None).await {
                Ok(Leased::Granted { grant, .. }) => {
                    let Some(b) = self.buckets.get_mut(key) else {
                        return Extended::Failed;
                    };
                    if grant.lease == cur.lease {
                        if let Some(h) = b.current_mut() {
                            h.units += grant.units;
                            h.expires_at = grant.expires_at;
                        }
                    } else {
                        // A new window: the grant is a new lease; Envoy's bucket goes on,
                        // so the new lease covers it whole from now.
                        b.push(
                            NewLease {
                                lease: grant.lease,
                                units: grant.units,
                                expires_at: grant.expires_at,
                                shape: cur.shape,
                            },
                            now,
                        );
                    }
                }
                Ok(Leased::Denied { .. }) => {}
                // The rule is gone or counts nothing now: sized afresh.
                Ok(_) => return Extended::Replace,
                Err(e) => {
                    tracing::warn!(error = %e, "RLQS top-up for a bucket failed");
                    return Extended::Failed;
                }
            }
        } else {
            // Covered already: the lease only needs to live as long as the next TTL.
            self.release_all(std::mem::take(returns)).await;
            match self.agent.renew(cur.lease, timing.lease_ttl(), None).await {
                Ok(out) => {
                    if let Some(h) = self.buckets.get_mut(key).and_then(|b| b.current_mut()) {
                        h.expires_at = out.expires_at;
                    }
                }
                // Expired (or ended with its window): sized afresh.
                Err(_) => return Extended::Replace,
            }
        }
        let Some(cur) = self
            .buckets
            .get_mut(key)
            .and_then(|b| b.current_mut().copied())
        else {
            return Extended::Replace;
        };
        match self.ttl_for(&cur, now, timing) {
            0 => Extended::Replace,
            ttl_secs => Extended::Sent(token_bucket(cur.shape, ttl_secs)),
        }
    }

    /// The TTL a held lease can back: what its units cover, and never past its expiry (less
    /// a second for the assignment's way to Envoy).
    fn ttl_for(&self, h: &Held, now: Timestamp, timing: Timing) -> u64 {
        let left = h.expires_at.saturating_duration_since(now);
        let by_expiry = left.saturating_sub(Duration::from_secs(1)).as_secs();
        let by_units = policy::ttl_secs(
            h.shape,
            h.shape_from,
            now,
            timing,
            h.units,
            h.pre_used_units,
        );
        by_units.min(by_expiry)
    }

    /// A new shape on a new lease sized from the demand; near the quota a trickle, then
    /// deny-all.
    async fn replace(
        &mut self,
        key: &BucketKey,
        target: &Target,
        demand: Demand,
        timing: Timing,
        returns: Vec<LeaseReturn>,
    ) -> Option<Action> {
        let ask = LeaseAsk {
            units_wanted: policy::units_wanted(demand, timing),
            min_units: 1,
            ttl: timing.lease_ttl(),
            returns,
            top_up: None,
        };
        let leased = match self.agent.lease(target, ask, None).await {
            Ok(l) => l,
            Err(e) => {
                // Nothing sent: Envoy keeps the assignment in force until its TTL; the
                // replaced leases are ended at the next report.
                tracing::warn!(error = %e, "RLQS lease for a bucket failed");
                return None;
            }
        };
        let now = self.agent.now();
        let b = self.buckets.get_mut(key)?;
        let mut earlier_window = None;
        let deny = || blanket(BlanketRule::DenyAll, timing);
        let (assigned, action) = match leased {
            Leased::NoRule | Leased::Unmetered { .. } | Leased::Degraded { allowed: true, .. } => {
                // Allowed and not counted (the rule tracking as many keys as it may decides
                // by its failure mode, as RLS does).
                b.unbacked_units = 0;
                b.supersede_current(now);
                (Assigned::Uncounted, blanket(BlanketRule::AllowAll, timing))
            }
            Leased::Degraded { rule, .. } | Leased::Denied { rule, .. } => {
                b.supersede_current(now);
                (Assigned::Rule(rule.id.clone()), deny())
            }
            Leased::Granted { rule, grant } => {
                // Usage reported in an earlier window is not this lease's to count.
                let agent = &self.agent;
                if let Some((at, units)) =
                    b.take_unbacked_unless_in(grant.window, |at| agent.window_index(&rule.id, at))
                {
                    earlier_window = Some((rule.id.clone(), at, units));
                }
                let available = grant.units.saturating_sub(b.unbacked_units);
                let action = if available == 0 {
                    None
                } else {
                    let shape = policy::shape(demand, timing, available);
                    b.push(
                        NewLease {
                            lease: grant.lease,
                            units: grant.units,
                            expires_at: grant.expires_at,
                            shape,
                        },
                        now,
                    );
                    let held = b.current_mut().copied()?;
                    match self.ttl_for(&held, now, timing) {
                        0 => None,
                        ttl_secs => Some(token_bucket(shape, ttl_secs)),
                    }
                };
                if action.is_none() {
                    self.note_short_window(&rule, timing);
                }
                let b = self.buckets.get_mut(key)?;
                if action.is_none() && b.current_mut().is_none_or(|h| h.lease != grant.lease) {
                    // Everything granted went to usage already reported: keep it charged
                    // behind the deny, ended at the next report.
                    b.push(
                        NewLease {
                            lease: grant.lease,
                            units: grant.units,
                            expires_at: grant.expires_at,
                            shape: policy::shape(demand, timing, 1),
                        },
                        now,
                    );
                }
                if action.is_none() {
                    // Sent nothing it backs (a deny goes instead): it ends at the next report.
                    // Held a second, as a replaced assignment's lease is (D79), a rule of
                    // one-second windows had its whole window's units held and the next report
                    // denied for lack of them.
                    b.supersede_unsent(now);
                }
                (Assigned::Rule(rule.id.clone()), action.unwrap_or_else(deny))
            }
        };
        let mut unruled = None;
        if let Some(b) = self.buckets.get_mut(key) {
            b.assigned = assigned;
            unruled = b.unruled_report.take();
        }
        if let Some((limit, at, units)) = earlier_window {
            self.fallback(&limit, target, at, units);
        }
        // The report before any rule was known, now that one is: it had no lease to leave room.
        if let (Some((since, allowed)), Some(limit)) = (
            unruled,
            self.buckets.get(key).and_then(|b| b.counted_by().cloned()),
        ) {
            self.straddled(&limit, target, since, now, allowed, 0);
        }
        Some(action)
    }

    /// A lease was granted and backs no second of assignment. Near a window's end that is
    /// the rule working; for a rule whose windows are shorter than an assignment's lease
    /// span, it is every report: Envoy's quota streaming cannot serve such a rule (no lease
    /// outlives its window), and Envoy is denied. Counted, and said once per rule and stream.
    fn note_short_window(&mut self, rule: &RuleInfo, timing: Timing) {
        let Some(window) = rule.window else {
            return;
        };
        if window >= timing.lease_ttl() {
            return;
        }
        metrics::short_window();
        if self.short_windows_told.len() < MAX_SHORT_WINDOW_RULES_TOLD
            && self.short_windows_told.insert(rule.id.clone())
        {
            tracing::warn!(
                rule = %rule.id,
                window_secs = window.as_secs_f64(),
                lease_span_secs = timing.lease_ttl().as_secs(),
                "RLQS cannot serve this rule: its windows are shorter than an assignment's lease \
                 span, and no lease outlives its window, so Envoy is answered deny-all; serve it \
                 through the rate limit service (RLS) instead"
            );
        }
    }

    /// A report covering `since..now` that began in an earlier window than `now`'s: what it
    /// brings past the room the leases that ended with that window left may have been
    /// admitted there on Envoy's own, and is charged to that window's fallback too. The
    /// usage itself goes on to this window's leases (counted twice at worst): a report
    /// cannot say which side of the window's end each request fell. Before, on-its-own
    /// admissions at a window's end reported after it were counted only in the next window,
    /// and the window they fell in kept a finite bound it had broken (`ALLOW_ALL` with a
    /// stated fallback of 0: 2,093 units past the quota in one model world, none charged to
    /// a fallback, tests/rlqs_envoy_model.rs).
    fn straddled(
        &self,
        limit: &LimitId,
        target: &Target,
        since: Timestamp,
        now: Timestamp,
        allowed: u64,
        room_units: u64,
    ) {
        let earlier = self.agent.window_index(limit, since);
        if earlier.is_some() && earlier != self.agent.window_index(limit, now) {
            self.fallback(limit, target, since, allowed.saturating_sub(room_units));
        }
    }

    /// Reported admissions of `target` under `limit` that no lease holds, admitted in the
    /// window of `at`: Envoy's fallback. Charged to the rule's `rlqs_fallback_units` (the
    /// bound's `rlqs_fallback` term); past it, recorded as charged nowhere (that window is
    /// stated unbounded). Both counted (D69).
    fn fallback(&self, limit: &LimitId, target: &Target, at: Timestamp, units: u64) {
        if units == 0 {
            return;
        }
        let charge = self.agent.record_gateway_fallback(limit, target, at, units);
        metrics::fallback(charge.within_units);
        metrics::uncharged(charge.beyond_units);
    }

    /// Ends leases with nothing to charge beyond their use.
    async fn release_all(&self, returns: Vec<LeaseReturn>) {
        for r in returns {
            if let Err(e) = self.agent.release(r.lease, r.unused_units, None).await
                && !matches!(e, Error::Core(allot_core::Error::UnknownLease(_)))
            {
                tracing::warn!(error = %e, "RLQS release failed");
            }
        }
    }

    /// Returns the leases for the next lease call to release (one call per bucket and
    /// report): what they did not use goes back. A lease used beyond its units is returned
    /// spent whole, and the usage beyond it is Envoy's fallback ([`Session::fallback`]).
    /// `untold`: what Envoy may have admitted under them that no report told
    /// ([`Held::ending_with`]).
    fn end_leases(
        &self,
        done: Vec<Held>,
        untold: Untold,
        limit: Option<&LimitId>,
        target: &Target,
    ) -> Vec<LeaseReturn> {
        let mut returns = Vec::new();
        for h in done {
            match h.ending_with(untold) {
                Ending::Release {
                    lease,
                    unused_units,
                } => returns.push(LeaseReturn {
                    lease,
                    unused_units,
                }),
                Ending::Settle {
                    lease,
                    actual_units,
                } => {
                    let beyond = actual_units - h.units;
                    metrics::overage(beyond);
                    returns.push(LeaseReturn {
                        lease,
                        unused_units: 0,
                    });
                    match limit {
                        Some(limit) => self.fallback(limit, target, h.in_window(), beyond),
                        None => metrics::uncharged(beyond),
                    }
                }
            }
        }
        returns
    }

    /// After a configuration reload: buckets whose rule is gone (or no longer matches them)
    /// are abandoned, their leases ended at their reported use.
    async fn on_reload(&mut self) -> Vec<BucketAction> {
        let limits = self.agent.limits();
        if limits.version == self.config_version {
            return Vec::new();
        }
        self.config_version = limits.version;
        let gone: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, b)| match &b.assigned {
                Assigned::Rule(id) => limits
                    .config
                    .match_descriptor(&b.target.domain, &b.target.entries)
                    .is_none_or(|m| &m.rule.spec.id != id),
                _ => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut actions = Vec::new();
        for key in gone {
            actions.extend(self.drop_bucket(&key, WhyDropped::Reload).await);
        }
        actions
    }

    /// Forgets a bucket, and tells Envoy to (`abandon_action`) unless it went unreported; its
    /// leases end. After a reload they end at their reported use (the rule that counted them
    /// is gone). Otherwise the rule still counts, and Envoy may admit under the assignment
    /// until the abandon reaches it, unreported: what a full bucket admits meanwhile stays
    /// charged.
    ///
    /// An unreported bucket is not abandoned: Envoy forgets an abandoned bucket with the usage
    /// it has not reported yet, so an Envoy still holding it (one reporting more slowly than
    /// the agent waits) would lose that usage for good. Left alone, its next report opens the
    /// bucket again and the usage is charged like any (a model world with an Envoy reporting
    /// every 30 s under `ALLOW_ALL`: about 27,000 admissions on its own a window never
    /// reported, tests/rlqs_envoy_model.rs).
    async fn drop_bucket(&mut self, key: &BucketKey, why: WhyDropped) -> Option<BucketAction> {
        let mut b = self.buckets.remove(key)?;
        self.agent_buckets.fetch_sub(1, Ordering::Relaxed);
        // An unreported bucket's Envoy may have admitted under its assignments since its last
        // report, up to the whole lease: none of it goes back. Refunded at the reported use
        // less what a full bucket admits in flight, as an idle bucket's is, the rest was
        // granted again while Envoy spent it (a bucket reported every 30 s, its assignment
        // spent after the last report: 855 past a quota of 6,000, tests/rlqs_envoy_model.rs).
        let untold = match why {
            WhyDropped::Reload => Untold::Nothing,
            WhyDropped::Idle => Untold::InFlight,
            WhyDropped::Unreported => Untold::Unknown,
        };
        let limit = b.counted_by().cloned();
        if let Some(limit) = &limit {
            // Usage still waiting for a lease will have none now.
            let since = b.unbacked_since.unwrap_or_else(|| self.agent.now());
            self.fallback(limit, &b.target, since, b.unbacked_units);
        }
        let returns = self.end_leases(b.take_all(), untold, limit.as_ref(), &b.target);
        self.release_all(returns).await;
        metrics::dropped(why.name());
        metrics::buckets(self.agent_buckets.load(Ordering::Relaxed));
        if why == WhyDropped::Unreported {
            tracing::debug!(?key, "RLQS bucket unreported: forgotten, not abandoned");
            return None;
        }
        metrics::assignment("abandon");
        tracing::debug!(?key, ?why, "RLQS bucket abandoned");
        Some(BucketAction {
            bucket_id: Some(bucket::bucket_id(key)),
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        })
    }
}

fn ttl(secs: u64) -> Option<wkt::Duration> {
    Some(wkt::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    })
}

fn blanket(rule: BlanketRule, timing: Timing) -> Action {
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: ttl(timing.ttl_secs),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(Strategy::BlanketRule(rule as i32)),
        }),
    })
}

fn token_bucket(shape: Shape, ttl_secs: u64) -> Action {
    let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: ttl(ttl_secs),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(Strategy::TokenBucket(TokenBucket {
                max_tokens: to_u32(shape.max_tokens),
                tokens_per_fill: Some(wkt::UInt32Value {
                    value: to_u32(shape.tokens_per_fill),
                }),
                // Envoy reads the interval's whole seconds, but decides whether an
                // assignment changed its bucket by comparing the nanos only: carrying the
                // seconds again as nanos makes a changed interval a changed bucket.
                fill_interval: Some(wkt::Duration {
                    seconds: i64::try_from(shape.fill_interval_secs).unwrap_or(i64::MAX),
                    nanos: i32::try_from(shape.fill_interval_secs).unwrap_or(0),
                }),
            })),
        }),
    })
}

fn action_name(a: &Action) -> &'static str {
    match a {
        Action::AbandonAction(_) => "abandon",
        Action::QuotaAssignmentAction(q) => match q.rate_limit_strategy.and_then(|s| s.strategy) {
            Some(Strategy::TokenBucket(_)) => "token_bucket",
            Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => "deny_all",
            _ => "allow_all",
        },
    }
}
