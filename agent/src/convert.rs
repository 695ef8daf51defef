//! Protobuf <-> agent and core types, in one place: request validation (bounds on every
//! field), idempotency keys to `RequestId`s, and decisions to wire answers. Service code
//! calls these and builds `tonic::Status`; nothing else touches the wire types.

use std::time::Duration;

use allot_core::budget::config::MAX_LEASE_RETURNS;
use allot_core::budget::{Decision, LeaseReturn, Reason};
use allot_core::ids::{LeaseId, RequestId};
use allot_proto::envoy::rls;
use allot_proto::lease::v1 as pb;

use crate::error::{Error, Result};
use crate::limits::RuleInfo;
use crate::request::{Checked, RlsDescriptor, Target};
use crate::settings::{
    MAX_DESCRIPTORS_PER_REQUEST, MAX_DOMAIN_BYTES, MAX_ENTRIES_PER_DESCRIPTOR, MAX_ENTRY_BYTES,
    MAX_IDEMPOTENCY_KEY_BYTES,
};

/// A lease asked for with `ttl_ms: 0` gets this TTL (still capped by the agent's maximum and
/// the end of the window).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidRequest(msg.into())
}

/// A domain and entries, checked against the bounds; entries are moved, not copied.
pub fn target(t: Option<pb::Target>) -> Result<Target> {
    let t = t.ok_or_else(|| invalid("target is required"))?;
    let entries = t.entries.into_iter().map(|e| (e.key, e.value)).collect();
    checked_target(t.domain, entries)
}

fn checked_target(domain: String, entries: Vec<(String, String)>) -> Result<Target> {
    check_domain(&domain)?;
    check_entries(&entries)?;
    Ok(Target { domain, entries })
}

fn check_domain(domain: &str) -> Result<()> {
    if domain.is_empty() {
        return Err(invalid("domain must not be empty"));
    }
    if domain.len() > MAX_DOMAIN_BYTES {
        return Err(invalid(format!(
            "domain is longer than {MAX_DOMAIN_BYTES} bytes"
        )));
    }
    Ok(())
}

fn check_entries(entries: &[(String, String)]) -> Result<()> {
    if entries.is_empty() {
        return Err(invalid("a descriptor needs at least one entry"));
    }
    if entries.len() > MAX_ENTRIES_PER_DESCRIPTOR {
        return Err(invalid(format!(
            "a descriptor has at most {MAX_ENTRIES_PER_DESCRIPTOR} entries, found {}",
            entries.len()
        )));
    }
    for (i, (key, value)) in entries.iter().enumerate() {
        if key.is_empty() {
            return Err(invalid(format!("entry {i} has an empty key")));
        }
        if key.len() > MAX_ENTRY_BYTES || value.len() > MAX_ENTRY_BYTES {
            return Err(invalid(format!(
                "entry {i} is longer than {MAX_ENTRY_BYTES} bytes"
            )));
        }
    }
    Ok(())
}

/// What an idempotency key is scoped to: the same key sent for another target, or another
/// lease, is another request (never a replay of someone else's outcome).
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Calls that name a target: acquire, lease, acquire_slot.
    Target(&'a Target),
    /// Calls that name a lease: renew, release, settle.
    Lease(u64),
}

/// An idempotency key as a request id: xxh3-128 of the key within its scope (fixed, unseeded,
/// so the same key and scope map to the same id in every agent and across restarts). Every
/// part is length-prefixed, so no two scopes read the same. Empty means none.
pub fn request_id(key: &str, scope: Scope<'_>) -> Result<Option<RequestId>> {
    if key.is_empty() {
        return Ok(None);
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(invalid(format!(
            "idempotency key is longer than {MAX_IDEMPOTENCY_KEY_BYTES} bytes"
        )));
    }
    let mut bytes = Vec::with_capacity(key.len() + 64);
    let mut part = |b: &[u8]| {
        // Parts are bounded by the target's checks (far below 4 GiB).
        bytes.extend_from_slice(&(b.len() as u32).to_le_bytes());
        bytes.extend_from_slice(b);
    };
    match scope {
        Scope::Target(t) => {
            part(b"target");
            part(t.domain.as_bytes());
            for (k, v) in &t.entries {
                part(k.as_bytes());
                part(v.as_bytes());
            }
        }
        Scope::Lease(id) => {
            part(b"lease");
            part(&id.to_le_bytes());
        }
    }
    part(key.as_bytes());
    Ok(Some(RequestId(xxhash_rust::xxh3::xxh3_128(&bytes))))
}

/// The leases handed back with a lease request, checked for number before any is touched.
pub fn lease_returns(returns: &[pb::LeaseReturn]) -> Result<Vec<LeaseReturn>> {
    if returns.len() > MAX_LEASE_RETURNS {
        return Err(invalid(format!(
            "at most {MAX_LEASE_RETURNS} leases can be returned in one call, found {}",
            returns.len()
        )));
    }
    Ok(returns
        .iter()
        .map(|r| LeaseReturn {
            lease: LeaseId(r.lease_id),
            unused_units: r.unused_units,
        })
        .collect())
}

/// `0` is read as 1.
pub fn cost(units: u64) -> u64 {
    units.max(1)
}

pub fn lease_ttl(ttl_ms: u64) -> Duration {
    if ttl_ms == 0 {
        DEFAULT_LEASE_TTL
    } else {
        Duration::from_millis(ttl_ms)
    }
}

/// Milliseconds, rounded up: a client that waits this long is never early.
pub fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub fn reason_name(r: Reason) -> &'static str {
    match r {
        Reason::Allowance => "allowance",
        Reason::GlobalView => "global_view",
        Reason::RateCap => "rate_cap",
        Reason::PartitionClosed => "partition_closed",
        Reason::PartitionOpen => "partition_open",
        Reason::Disabled => "disabled",
        Reason::Unlimited => "unlimited",
        Reason::TooManyLeases => "too_many_leases",
        Reason::Restoring => "restoring",
    }
}

/// What a rule is called in answers: its `name` if it has one, else its id.
pub fn rule_name(rule: &RuleInfo) -> &str {
    rule.name.as_deref().unwrap_or(rule.id.as_str())
}

pub fn decision(d: &Decision, rule: &RuleInfo) -> pb::Decision {
    pb::Decision {
        allowed: d.allowed,
        remaining_units: d.remaining_units,
        limit_units: d.limit_units,
        retry_after_ms: d.retry_after.map(ceil_ms),
        reset_after_ms: ceil_ms(d.reset_after),
        rule: rule.id.to_string(),
        shadow_denied: d.shadow_denied,
        reason: reason_name(d.reason).to_owned(),
    }
}

pub fn no_rule_decision() -> pb::Decision {
    pb::Decision {
        allowed: true,
        reason: "no_rule".to_owned(),
        ..pb::Decision::default()
    }
}

pub fn degraded_decision(rule: &RuleInfo, allowed: bool) -> pb::Decision {
    pb::Decision {
        allowed,
        limit_units: rule.quota_units,
        rule: rule.id.to_string(),
        reason: "degraded".to_owned(),
        ..pb::Decision::default()
    }
}

pub fn checked_decision(c: &Checked) -> pb::Decision {
    match c {
        Checked::NoRule => no_rule_decision(),
        Checked::Decided { rule, decision: d } => decision(d, rule),
        Checked::Degraded { rule, allowed } => degraded_decision(rule, *allowed),
    }
}

/// A ShouldRateLimit request, checked: its domain and, per descriptor, the entries and the
/// hits to charge (the descriptor's own `hits_addend` if set, 0 meaning check only; else the
/// request's, 0 read as 1).
pub fn rls_request(req: rls::RateLimitRequest) -> Result<(String, Vec<RlsDescriptor>)> {
    check_domain(&req.domain)?;
    if req.descriptors.is_empty() {
        return Err(invalid("rate limit descriptor list must not be empty"));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS_PER_REQUEST {
        return Err(invalid(format!(
            "at most {MAX_DESCRIPTORS_PER_REQUEST} descriptors per request, found {}",
            req.descriptors.len()
        )));
    }
    let request_hits = u64::from(req.hits_addend).max(1);
    let mut out = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.into_iter().enumerate() {
        if d.is_negative_hits {
            return Err(invalid(format!(
                "descriptor {i}: negative hits are not supported (refunds go through leases)"
            )));
        }
        let entries: Vec<(String, String)> =
            d.entries.into_iter().map(|e| (e.key, e.value)).collect();
        check_entries(&entries).map_err(|e| invalid(format!("descriptor {i}: {e}")))?;
        let hits = d.hits_addend.map_or(request_hits, |h| h.value);
        out.push(RlsDescriptor { entries, hits });
    }
    Ok((req.domain, out))
}

/// Envoy's unit for a window that is exactly one of them; `Unknown` otherwise.
pub fn envoy_unit(window: Option<Duration>) -> rls::rate_limit_response::rate_limit::Unit {
    use rls::rate_limit_response::rate_limit::Unit;
    const DAY: u64 = 86_400;
    let Some(w) = window.filter(|w| w.subsec_nanos() == 0) else {
        return Unit::Unknown;
    };
    match w.as_secs() {
        1 => Unit::Second,
        60 => Unit::Minute,
        3_600 => Unit::Hour,
        DAY => Unit::Day,
        s if s == 7 * DAY => Unit::Week,
        s if s == 30 * DAY => Unit::Month,
        s if s == 365 * DAY => Unit::Year,
        _ => Unit::Unknown,
    }
}

fn saturating_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn proto_duration(d: Duration) -> allot_proto::envoy::wkt::Duration {
    allot_proto::envoy::wkt::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

fn current_limit(rule: &RuleInfo) -> rls::rate_limit_response::RateLimit {
    rls::rate_limit_response::RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: saturating_u32(rule.quota_units),
        unit: envoy_unit(rule.window) as i32,
    }
}

/// One descriptor's status, as envoyproxy/ratelimit answers it: no rule -> OK with no limit;
/// unlimited (or disabled) -> OK with `u32::MAX` remaining; shadow mode -> OK with 0
/// remaining; over the limit -> 0 remaining; otherwise the decision with the rule's limit,
/// what is left and the time to reset.
pub fn descriptor_status(c: &Checked) -> rls::rate_limit_response::DescriptorStatus {
    use rls::rate_limit_response::{Code, DescriptorStatus};
    let code = |allowed: bool| {
        if allowed {
            Code::Ok as i32
        } else {
            Code::OverLimit as i32
        }
    };
    match c {
        Checked::NoRule => DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
        Checked::Decided { decision: d, .. }
            if matches!(d.reason, Reason::Unlimited | Reason::Disabled) =>
        {
            DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            }
        }
        Checked::Decided { rule, decision: d } => DescriptorStatus {
            code: code(d.allowed),
            current_limit: Some(current_limit(rule)),
            // envoyproxy/ratelimit reports nothing left on a refusal (and in shadow mode).
            limit_remaining: if d.shadow_denied || !d.allowed {
                0
            } else {
                saturating_u32(d.remaining_units)
            },
            duration_until_reset: Some(proto_duration(d.reset_after)),
            ..DescriptorStatus::default()
        },
        Checked::Degraded { rule, allowed } => DescriptorStatus {
            code: code(*allowed),
            current_limit: Some(current_limit(rule)),
            ..DescriptorStatus::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_map_to_fixed_ids_within_their_scope() {
        let t = Target {
            domain: "api".into(),
            entries: vec![("k".into(), "1".into())],
        };
        let a = request_id("order-17", Scope::Lease(9)).expect("ok");
        assert_eq!(a, request_id("order-17", Scope::Lease(9)).expect("ok"));
        assert_ne!(a, request_id("order-18", Scope::Lease(9)).expect("ok"));
        assert_ne!(a, request_id("order-17", Scope::Lease(10)).expect("ok"));
        assert_ne!(a, request_id("order-17", Scope::Target(&t)).expect("ok"));
        assert_eq!(request_id("", Scope::Lease(9)).expect("ok"), None);
        // Parts are length-prefixed: moving a byte from one part to the next is another id.
        let shifted = Target {
            domain: "api".into(),
            entries: vec![("k1".into(), "".into())],
        };
        assert_ne!(
            request_id("x", Scope::Target(&t)).expect("ok"),
            request_id("x", Scope::Target(&shifted)).expect("ok")
        );
        // The id is persisted: it must not change between builds or machines. This is
        // xxh3-128 (unseeded, as the xxhash spec defines it) of the length-prefixed parts.
        let mut bytes = Vec::new();
        for p in [&b"lease"[..], &9u64.to_le_bytes(), b"order-17"] {
            bytes.extend_from_slice(&(p.len() as u32).to_le_bytes());
            bytes.extend_from_slice(p);
        }
        assert_eq!(
            a.map(|r| r.0),
            Some(xxhash_rust::xxh3::xxh3_128_with_seed(&bytes, 0))
        );
        assert!(request_id(&"k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1), Scope::Lease(1)).is_err());
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(1_001)), 2);
        assert_eq!(ceil_ms(Duration::from_millis(7)), 7);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
    }

    #[test]
    fn malformed_targets_are_refused() {
        let ok = checked_target("d".into(), vec![("k".into(), "v".into())]);
        assert!(ok.is_ok());
        assert!(checked_target("".into(), vec![("k".into(), "v".into())]).is_err());
        assert!(checked_target("d".into(), vec![]).is_err());
        assert!(checked_target("d".into(), vec![("".into(), "v".into())]).is_err());
        let long = "v".repeat(MAX_ENTRY_BYTES + 1);
        assert!(checked_target("d".into(), vec![("k".into(), long)]).is_err());
        let many = vec![("k".to_owned(), "v".to_owned()); MAX_ENTRIES_PER_DESCRIPTOR + 1];
        assert!(checked_target("d".into(), many).is_err());
    }

    #[test]
    fn envoy_units_only_for_exact_windows() {
        use rls::rate_limit_response::rate_limit::Unit;
        assert_eq!(envoy_unit(Some(Duration::from_secs(60))), Unit::Minute);
        assert_eq!(
            envoy_unit(Some(Duration::from_secs(90 * 60))),
            Unit::Unknown
        );
        assert_eq!(envoy_unit(Some(Duration::from_millis(1500))), Unit::Unknown);
        assert_eq!(envoy_unit(None), Unit::Unknown);
    }
}
