//! Prometheus metrics: names, help texts, and per-rule handles registered once per
//! configuration load, so the request path increments counters without building labels.
//!
//! Decisions are counted per rule and result; rule labels are the rule ids of the loaded
//! configuration, so their number is bounded by the configuration. Rules with
//! `detailed_metric` or `value_to_metric` also count RLS decisions per request value, at most
//! [`MAX_METRIC_VALUES_PER_RULE`] values per rule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::error::{Error, Result};

pub const DECISIONS: &str = "allot_decisions_total";
pub const VALUE_DECISIONS: &str = "allot_value_decisions_total";
pub const NEAR_LIMIT: &str = "allot_near_limit_total";
pub const OVER_LIMIT: &str = "allot_over_limit_total";
pub const SHADOW_WOULD_DENY: &str = "allot_shadow_would_deny_total";
pub const DEGRADED: &str = "allot_degraded_decisions_total";
pub const LEASE_GRANTS: &str = "allot_lease_grants_total";
pub const LEASE_GRANTED_UNITS: &str = "allot_lease_granted_units_total";
pub const LEASE_RETURNS: &str = "allot_lease_returns_total";
pub const LEASE_RETURNED_UNITS: &str = "allot_lease_returned_units_total";
pub const SETTLE_CLAMPED_UNITS: &str = "allot_settle_clamped_units_total";
pub const KEYS_REFUSED: &str = "allot_keys_refused_total";
pub const KEYS_EVICTED: &str = "allot_keys_evicted_total";
pub const KEYS: &str = "allot_keys";
pub const NEGATIVE_CACHE_HITS: &str = "allot_negative_cache_hits_total";
pub const CONFIG_RELOADS: &str = "allot_config_reloads_total";
pub const CONFIG_VERSION: &str = "allot_config_version";
pub const INVALID_REQUESTS: &str = "allot_invalid_requests_total";
pub const REFUSED_CALLERS: &str = "allot_refused_callers_total";
pub const SHED_CALLS: &str = "allot_shed_calls_total";
pub const SHED_OVER_SHARE: &str = "allot_shed_over_fair_share_total";
pub const CALLERS_RELOADS: &str = "allot_callers_reloads_total";
pub const STORE_BATCHES: &str = "allot_store_batches_total";
pub const STORE_RECORDS: &str = "allot_store_records_total";
pub const STORE_ERRORS: &str = "allot_store_errors_total";
pub const SYNC_LAG: &str = "allot_sync_lag_seconds";
pub const PARTITION_STATE: &str = "allot_partition_policy_state";
pub const SYNC_CONNECTED: &str = "allot_sync_connected";
pub const SYNC_COORDINATOR: &str = "allot_sync_coordinator";
pub const SYNC_LEADER: &str = "allot_sync_leader";
pub const SYNC_RECONNECTS: &str = "allot_sync_reconnects_total";
pub const SYNC_LAST_ANSWER_AGE: &str = "allot_sync_last_answer_age_seconds";
pub const SYNC_UPS_DROPPED: &str = "allot_sync_ups_dropped_total";
pub const SYNC_BAD_ANSWERS: &str = "allot_sync_bad_answers_total";
pub const CLOCK_ASSUMPTION_BREAKS: &str = "allot_clock_assumption_breaks_total";
pub const WALL_CLOCK_APART: &str = "allot_wall_clock_apart_seconds";

/// Installs the process-wide Prometheus recorder (once; later calls get the same handle).
pub fn install() -> Result<PrometheusHandle> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::Settings(format!("metrics recorder: {e}")))?;
    describe();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

fn describe() {
    describe_counter!(
        DECISIONS,
        "Decisions by rule and result (allowed, denied, shadow_denied, unlimited, disabled, no_rule, degraded_open, degraded_closed)."
    );
    describe_counter!(
        VALUE_DECISIONS,
        "RLS decisions of rules with detailed_metric or value_to_metric, by rule, request value and result; past the per-rule cap, values count under _other."
    );
    describe_counter!(
        NEAR_LIMIT,
        "Allowed decisions that left the key at or past the near-limit ratio of its quota."
    );
    describe_counter!(OVER_LIMIT, "Denied decisions (not counting shadow mode).");
    describe_counter!(
        SHADOW_WOULD_DENY,
        "Shadow mode: decisions the rule would have denied (answered allowed)."
    );
    describe_counter!(
        DEGRADED,
        "Decisions taken by the rule's failure mode because the agent could not decide (mode: open or closed)."
    );
    describe_counter!(LEASE_GRANTS, "Leases granted.");
    describe_counter!(LEASE_GRANTED_UNITS, "Units granted in leases.");
    describe_counter!(
        LEASE_RETURNS,
        "Leases ended by the gateway, by rule and kind (release or settle)."
    );
    describe_counter!(
        LEASE_RETURNED_UNITS,
        "Units refunded by releases and settles, by rule."
    );
    describe_counter!(
        SETTLE_CLAMPED_UNITS,
        "Units settles claimed above their rule's max_settle_overage, not charged: use the bound does not cover."
    );
    describe_counter!(
        KEYS_REFUSED,
        "New keys refused because the rule tracks max_keys_per_limit keys and none was idle."
    );
    describe_counter!(
        KEYS_EVICTED,
        "Idle keys evicted (to make room, or by the sweep)."
    );
    describe_gauge!(KEYS, "Keys tracked per rule.");
    describe_counter!(
        NEGATIVE_CACHE_HITS,
        "Denials answered from the negative cache, before the budget lock."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Limits configuration loads by result (ok or error)."
    );
    describe_gauge!(
        CONFIG_VERSION,
        "Version of the limits configuration in force (counts successful loads)."
    );
    describe_counter!(
        INVALID_REQUESTS,
        "Requests refused as malformed or oversized, by service."
    );
    describe_counter!(
        CALLERS_RELOADS,
        "Reads of the callers file after start (it changed, or SIGHUP), by result: ok, error (the callers before kept)."
    );
    describe_counter!(
        SHED_CALLS,
        "Gateway calls answered at once with RESOURCE_EXHAUSTED (gRPC) or 503 (HTTP) because --max-in-flight-calls were running, by server: grpc, http."
    );
    describe_counter!(
        SHED_OVER_SHARE,
        "Of the shed calls, those of a caller already running its fair share of --max-in-flight-calls while more than half were in use (service::shed), by server: grpc, http."
    );
    describe_counter!(
        REFUSED_CALLERS,
        "Gateway-facing calls refused by the callers file (D59), by kind: unauthenticated, out_of_scope, over_rate (past the caller's max_calls_per_sec)."
    );
    describe_counter!(
        STORE_BATCHES,
        "Batches written to the store (one per group commit)."
    );
    describe_counter!(STORE_RECORDS, "Records written to the store.");
    describe_counter!(STORE_ERRORS, "Store writes that failed (answers withheld).");
    describe_gauge!(
        SYNC_LAG,
        "Seconds since the coordinator last answered (0 in single-region mode)."
    );
    describe_gauge!(
        PARTITION_STATE,
        "1 for the partition-policy state in force: single_region, connected or expired."
    );
    describe_gauge!(
        SYNC_CONNECTED,
        "1 while the sync stream to the coordinator's leader is open and answering."
    );
    describe_gauge!(
        SYNC_COORDINATOR,
        "1 for the coordinator node the sync link talks to or tries next (label address)."
    );
    describe_gauge!(
        SYNC_LEADER,
        "1 for the coordinator node that last answered as leader (label address)."
    );
    describe_counter!(
        SYNC_RECONNECTS,
        "Sync link attempts or streams that ended (connection failed, refused, redirected, broken, silent) before the next try."
    );
    describe_gauge!(
        SYNC_LAST_ANSWER_AGE,
        "Seconds since the sync link last received an answer (+Inf before the first)."
    );
    describe_counter!(
        SYNC_UPS_DROPPED,
        "SyncUps dropped unsent for a newer one while the link could not keep up (safe: each carries everything unconfirmed)."
    );
    describe_counter!(
        SYNC_BAD_ANSWERS,
        "Answers from the coordinator that did not convert; each ends the stream."
    );
    describe_counter!(
        CLOCK_ASSUMPTION_BREAKS,
        "Clock samples further off than the timebase's uncertainty allowed (a rate error above 1%, or a step): the guard started again."
    );
    describe_gauge!(
        WALL_CLOCK_APART,
        "Seconds the wall clock reads ahead of the agent's own clock, which counts from its start (negative: behind): a step since the start; windows follow the agent's clock until a restart."
    );
}

/// Counter handles of one rule.
#[derive(Clone, Debug)]
pub struct RuleMetrics {
    pub allowed: Counter,
    pub denied: Counter,
    pub shadow_denied: Counter,
    pub unmetered: Counter,
    pub degraded_open: Counter,
    pub degraded_closed: Counter,
    pub near_limit: Counter,
    pub over_limit: Counter,
    pub shadow_would_deny: Counter,
    pub lease_grants: Counter,
    pub lease_granted_units: Counter,
    pub lease_releases: Counter,
    pub lease_settles: Counter,
    pub lease_returned_units: Counter,
    pub settle_clamped_units: Counter,
    pub keys_refused: Counter,
    pub keys: Gauge,
}

impl RuleMetrics {
    pub fn new(rule: &str, unmetered_result: &'static str) -> Self {
        let rule = rule.to_owned();
        let decisions =
            |result: &'static str| counter!(DECISIONS, "rule" => rule.clone(), "result" => result);
        RuleMetrics {
            allowed: decisions("allowed"),
            denied: decisions("denied"),
            shadow_denied: decisions("shadow_denied"),
            unmetered: decisions(unmetered_result),
            degraded_open: counter!(DEGRADED, "rule" => rule.clone(), "mode" => "open"),
            degraded_closed: counter!(DEGRADED, "rule" => rule.clone(), "mode" => "closed"),
            near_limit: counter!(NEAR_LIMIT, "rule" => rule.clone()),
            over_limit: counter!(OVER_LIMIT, "rule" => rule.clone()),
            shadow_would_deny: counter!(SHADOW_WOULD_DENY, "rule" => rule.clone()),
            lease_grants: counter!(LEASE_GRANTS, "rule" => rule.clone()),
            lease_granted_units: counter!(LEASE_GRANTED_UNITS, "rule" => rule.clone()),
            lease_releases: counter!(LEASE_RETURNS, "rule" => rule.clone(), "kind" => "release"),
            lease_settles: counter!(LEASE_RETURNS, "rule" => rule.clone(), "kind" => "settle"),
            lease_returned_units: counter!(LEASE_RETURNED_UNITS, "rule" => rule.clone()),
            settle_clamped_units: counter!(SETTLE_CLAMPED_UNITS, "rule" => rule.clone()),
            keys_refused: counter!(KEYS_REFUSED, "rule" => rule.clone()),
            keys: gauge!(KEYS, "rule" => rule),
        }
    }
}

/// Most distinct values one rule reports under [`VALUE_DECISIONS`]: each is a Prometheus series
/// per result, and request values are unbounded (a user id, a path). Later values are counted
/// under [`OTHER_VALUES`].
pub const MAX_METRIC_VALUES_PER_RULE: usize = 1_000;

/// The `value` label of decisions past [`MAX_METRIC_VALUES_PER_RULE`]. A real value always
/// starts with its key and `=` unless empty, so it reads as this only for a key named
/// `_other` with an empty value.
pub const OTHER_VALUES: &str = "_other";

/// One rule's per-value decision counters. The series live in the process-wide recorder and
/// outlive a configuration, so the values are kept per rule id for the process too
/// ([`ValueMetrics::for_rule`]): a reload does not open another thousand series.
#[derive(Debug)]
pub struct ValueMetrics {
    rule: String,
    /// Counter handles by value, then by result.
    values: Mutex<HashMap<Box<str>, ResultCounters>>,
}

/// One value's counters by result: a handful, so a list.
type ResultCounters = Vec<(&'static str, Counter)>;

impl ValueMetrics {
    /// The counters of rule `rule`, the same ones for every configuration that has it.
    pub fn for_rule(rule: &str) -> Arc<ValueMetrics> {
        static RULES: OnceLock<Mutex<HashMap<String, Arc<ValueMetrics>>>> = OnceLock::new();
        let rules = RULES.get_or_init(Mutex::default);
        // A panic while holding it cannot leave the map half-changed: entries are inserted whole.
        let mut rules = rules.lock().unwrap_or_else(|p| p.into_inner());
        rules
            .entry(rule.to_owned())
            .or_insert_with(|| {
                Arc::new(ValueMetrics {
                    rule: rule.to_owned(),
                    values: Mutex::default(),
                })
            })
            .clone()
    }

    /// Counts one decision (`result`, as in [`DECISIONS`]) of a request with metric value
    /// `value`, under [`OTHER_VALUES`] once the rule has [`MAX_METRIC_VALUES_PER_RULE`] values.
    pub fn count(&self, value: &str, result: &'static str) {
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        let label = if values.contains_key(value) || values.len() < MAX_METRIC_VALUES_PER_RULE {
            value
        } else {
            OTHER_VALUES
        };
        // `_other` itself is one more entry past the cap: MAX + 1 values at most.
        let results = values.entry(label.into()).or_default();
        let counter = match results.iter().find(|(r, _)| *r == result) {
            Some((_, c)) => c.clone(),
            None => {
                let c = counter!(VALUE_DECISIONS, "rule" => self.rule.clone(), "value" => label.to_owned(), "result" => result);
                results.push((result, c.clone()));
                c
            }
        };
        drop(values);
        counter.increment(1);
    }

    /// How many values have their own series (plus [`OTHER_VALUES`] once used).
    pub fn values_seen(&self) -> usize {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

pub fn no_rule() {
    counter!(DECISIONS, "rule" => "", "result" => "no_rule").increment(1);
}

/// A lease ended by the gateway (`kind`: release or settle), refunding `units`.
/// A lease ended by its gateway whose rule is gone (removed by a reload since).
pub fn lease_returned_without_rule(kind: &'static str, units: u64) {
    counter!(LEASE_RETURNS, "rule" => "", "kind" => kind).increment(1);
    counter!(LEASE_RETURNED_UNITS, "rule" => "").increment(units);
}

pub fn negative_cache_hit() {
    counter!(NEGATIVE_CACHE_HITS).increment(1);
}

pub fn config_reload(ok: bool, version: u64) {
    counter!(CONFIG_RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
    if ok {
        gauge!(CONFIG_VERSION).set(version as f64);
    }
}

pub fn callers_reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    counter!(CALLERS_RELOADS, "result" => result).increment(1);
}

pub fn shed_call(server: &'static str) {
    counter!(SHED_CALLS, "server" => server).increment(1);
}

pub fn shed_over_share(server: &'static str) {
    counter!(SHED_OVER_SHARE, "server" => server).increment(1);
}

pub fn refused_caller(kind: &'static str) {
    counter!(REFUSED_CALLERS, "kind" => kind).increment(1);
}

pub fn invalid_request(service: &'static str) {
    counter!(INVALID_REQUESTS, "service" => service).increment(1);
}

/// The store's write counters, looked up once: they are counted on every call's path.
pub struct StoreCounters {
    batches: Counter,
    records: Counter,
}

impl Default for StoreCounters {
    /// Call after [`install`] (before it, the handles count nowhere).
    fn default() -> Self {
        StoreCounters {
            batches: counter!(STORE_BATCHES),
            records: counter!(STORE_RECORDS),
        }
    }
}

impl StoreCounters {
    pub fn batch(&self, records: usize) {
        self.batches.increment(1);
        self.records.increment(records as u64);
    }
}

pub fn store_error() {
    counter!(STORE_ERRORS).increment(1);
}

pub fn keys_evicted(n: u64) {
    counter!(KEYS_EVICTED).increment(n);
}

/// The partition-policy state and the age of the coordinator's last answer.
pub fn sync_state(state: &'static str, lag_seconds: f64) {
    for s in ["single_region", "connected", "expired"] {
        gauge!(PARTITION_STATE, "state" => s).set(if s == state { 1.0 } else { 0.0 });
    }
    gauge!(SYNC_LAG).set(lag_seconds);
}

/// The link moved from node `old` to node `new` (`which`: [`SYNC_COORDINATOR`] or
/// [`SYNC_LEADER`]).
pub fn sync_link_node(which: &'static str, old: Option<&str>, new: &str) {
    if let Some(old) = old.filter(|o| *o != new) {
        gauge!(which, "address" => old.to_owned()).set(0.0);
    }
    gauge!(which, "address" => new.to_owned()).set(1.0);
}

pub fn sync_link_connected(connected: bool) {
    gauge!(SYNC_CONNECTED).set(if connected { 1.0 } else { 0.0 });
}

pub fn sync_link_age(seconds: f64) {
    gauge!(SYNC_LAST_ANSWER_AGE).set(seconds);
}

pub fn sync_reconnect() {
    counter!(SYNC_RECONNECTS).increment(1);
}

pub fn sync_up_dropped() {
    counter!(SYNC_UPS_DROPPED).increment(1);
}

pub fn sync_bad_answer() {
    counter!(SYNC_BAD_ANSWERS).increment(1);
}

pub fn wall_clock_apart(seconds: f64) {
    gauge!(WALL_CLOCK_APART).set(seconds);
}

pub fn clock_assumption_broken() {
    counter!(CLOCK_ASSUMPTION_BREAKS).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the cap, new values go to `_other`; values already seen keep their own series.
    #[test]
    fn value_series_are_capped_per_rule() {
        let m = ValueMetrics::for_rule("metrics-test/cap");
        for i in 0..MAX_METRIC_VALUES_PER_RULE + 50 {
            m.count(&format!("user={i}"), "allowed");
        }
        assert_eq!(m.values_seen(), MAX_METRIC_VALUES_PER_RULE + 1);
        let values = m.values.lock().expect("not poisoned");
        assert!(values.contains_key(OTHER_VALUES));
        assert!(values.contains_key("user=999"));
        assert!(!values.contains_key("user=1000"));
        drop(values);
        // A value seen before the cap still counts under itself.
        m.count("user=3", "denied");
        let values = m.values.lock().expect("not poisoned");
        let results: Vec<&str> = values["user=3"].iter().map(|(r, _)| *r).collect();
        assert_eq!(results, ["allowed", "denied"]);
    }

    /// A reload's rule of the same id counts into the same capped set.
    #[test]
    fn a_rule_id_keeps_its_values_across_configurations() {
        let before = ValueMetrics::for_rule("metrics-test/reload");
        before.count("k=v", "allowed");
        let after = ValueMetrics::for_rule("metrics-test/reload");
        assert!(Arc::ptr_eq(&before, &after));
        assert_eq!(after.values_seen(), 1);
    }
}
