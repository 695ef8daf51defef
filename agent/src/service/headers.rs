//! Rate limit response headers for Envoy to add: `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-11: lists of structured-field items), the
//! `X-RateLimit-Limit/Remaining/Reset` trio of the most restrictive descriptor (as
//! envoyproxy/ratelimit picks it), and `Retry-After` on a refusal.
//!
//! Per the draft: a policy item is `"name";q=<quota>;w=<window seconds>` (`w` only for a
//! whole number of seconds), a service limit item `"name";r=<remaining>;t=<seconds>`; and a
//! Retry-After is never earlier than the end of the effective window `t` of a refused item,
//! so its jitter only ever adds.

use std::time::Duration;

use allot_core::budget::{Decision, Reason};

use crate::convert::rule_name;
use crate::limits::RuleInfo;
use crate::state::Checked;

/// One counted descriptor, as the headers see it.
struct Item<'a> {
    rule: &'a RuleInfo,
    refused: bool,
    remaining_units: u64,
    /// `t`: seconds within which no more than `remaining_units` can be used.
    effective_secs: u64,
}

/// The headers for one ShouldRateLimit answer; `retry_after_secs` turns the longest wait of
/// a refused descriptor into the Retry-After value (adding jitter).
pub fn rate_limit_headers(
    checked: &[Checked],
    retry_after_secs: impl FnOnce(Duration) -> u64,
) -> Vec<(&'static str, String)> {
    let items: Vec<Item<'_>> = checked.iter().filter_map(item).collect();
    let refused_without_item = checked
        .iter()
        .any(|c| matches!(c, Checked::Degraded { allowed: false, .. }));
    let mut headers = Vec::new();
    if !items.is_empty() {
        headers.push(("RateLimit-Policy", policy_list(&items)));
        headers.push(("RateLimit", limit_list(&items)));
        if let Some(worst) = most_restrictive(&items) {
            headers.push(("X-RateLimit-Limit", worst.rule.quota_units.to_string()));
            headers.push(("X-RateLimit-Remaining", worst.remaining_units.to_string()));
            headers.push(("X-RateLimit-Reset", worst.effective_secs.to_string()));
        }
    }
    let longest_wait = items
        .iter()
        .filter(|i| i.refused)
        .map(|i| i.effective_secs)
        .max();
    if let Some(wait) = longest_wait.or(refused_without_item.then_some(1)) {
        let secs = retry_after_secs(Duration::from_secs(wait));
        headers.push(("Retry-After", secs.to_string()));
    }
    headers
}

fn item(c: &Checked) -> Option<Item<'_>> {
    let Checked::Decided { rule, decision } = c else {
        return None;
    };
    if matches!(decision.reason, Reason::Unlimited | Reason::Disabled) {
        return None;
    }
    Some(Item {
        rule,
        refused: !decision.allowed,
        remaining_units: if decision.allowed && !decision.shadow_denied {
            decision.remaining_units
        } else {
            0
        },
        effective_secs: effective_secs(decision),
    })
}

/// Until the window resets; for a refusal, until the same request may pass.
fn effective_secs(d: &Decision) -> u64 {
    let wait = if d.allowed {
        d.reset_after
    } else {
        d.retry_after.unwrap_or(d.reset_after)
    };
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// A refused item first (the first one), else the one with the least left.
fn most_restrictive<'a, 'b>(items: &'b [Item<'a>]) -> Option<&'b Item<'a>> {
    items
        .iter()
        .find(|i| i.refused)
        .or_else(|| items.iter().min_by_key(|i| i.remaining_units))
}

fn policy_list(items: &[Item<'_>]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for i in items {
        let name = rule_name(i.rule);
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        let mut policy = format!("{};q={}", sf_string(name), i.rule.quota_units);
        if let Some(w) = i
            .rule
            .window
            .filter(|w| w.subsec_nanos() == 0 && w.as_secs() > 0)
        {
            policy.push_str(&format!(";w={}", w.as_secs()));
        }
        out.push(policy);
    }
    out.join(", ")
}

/// One service limit per policy; where a policy appears twice, the one with less left.
fn limit_list(items: &[Item<'_>]) -> String {
    let mut best: Vec<&Item<'_>> = Vec::new();
    for i in items {
        let name = rule_name(i.rule);
        match best.iter_mut().find(|b| rule_name(b.rule) == name) {
            Some(b) if i.remaining_units < b.remaining_units => *b = i,
            Some(_) => {}
            None => best.push(i),
        }
    }
    best.iter()
        .map(|i| {
            format!(
                "{};r={};t={}",
                sf_string(rule_name(i.rule)),
                i.remaining_units,
                i.effective_secs
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A structured-field String (RFC 9651): printable ASCII, with `"` and `\` escaped. Other
/// bytes cannot appear in one, so they are percent-encoded.
pub fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use allot_core::limit::LimitSpec;

    use super::*;
    use crate::limits;

    fn rule(id: &str, name: Option<&str>, units: u64, window: Duration) -> Arc<RuleInfo> {
        let mut spec = LimitSpec::simple(id, units, window);
        spec.name = name.map(str::to_owned);
        Arc::new(limits::rule_info(&spec, 0.8))
    }

    fn decided(rule: &Arc<RuleInfo>, allowed: bool, remaining: u64, secs: u64) -> Checked {
        Checked::Decided {
            rule: rule.clone(),
            decision: Decision {
                allowed,
                remaining_units: remaining,
                retry_after: (!allowed).then(|| Duration::from_secs(secs)),
                reset_after: Duration::from_secs(secs),
                limit_units: rule.quota_units,
                shadow_denied: false,
                reason: Reason::Allowance,
            },
        }
    }

    fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn an_allowed_request_advertises_its_policies_and_what_is_left() {
        let per_min = rule("api/key", Some("per-key"), 100, Duration::from_secs(60));
        let per_hour = rule("api/key/route", None, 1000, Duration::from_secs(3600));
        // 40 left of 100 for 25 s more; 900 left of 1000 for 1800 s more.
        let checked = [
            decided(&per_min, true, 40, 25),
            decided(&per_hour, true, 900, 1800),
            Checked::NoRule,
        ];
        let h = rate_limit_headers(&checked, |_| panic!("no Retry-After when allowed"));
        assert_eq!(
            header(&h, "RateLimit-Policy"),
            Some(r#""per-key";q=100;w=60, "api/key/route";q=1000;w=3600"#)
        );
        assert_eq!(
            header(&h, "RateLimit"),
            Some(r#""per-key";r=40;t=25, "api/key/route";r=900;t=1800"#)
        );
        // The most restrictive is the one with the least left: 40.
        assert_eq!(header(&h, "X-RateLimit-Limit"), Some("100"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("40"));
        assert_eq!(header(&h, "X-RateLimit-Reset"), Some("25"));
        assert_eq!(header(&h, "Retry-After"), None);
    }

    #[test]
    fn a_refusal_names_its_wait_and_retry_after_is_never_earlier() {
        let a = rule("api/a", None, 10, Duration::from_secs(60));
        let b = rule("api/b", None, 5, Duration::from_secs(1));
        let checked = [decided(&a, false, 0, 42), decided(&b, true, 3, 1)];
        let h = rate_limit_headers(&checked, |wait| {
            assert_eq!(wait, Duration::from_secs(42));
            45
        });
        assert_eq!(header(&h, "X-RateLimit-Limit"), Some("10"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(
            header(&h, "RateLimit"),
            Some(r#""api/a";r=0;t=42, "api/b";r=3;t=1"#)
        );
        assert_eq!(header(&h, "Retry-After"), Some("45"));
    }

    #[test]
    fn names_are_valid_structured_field_strings() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), r#""%C3%A9""#);
    }

    #[test]
    fn windows_below_a_second_have_no_w() {
        let fast = rule("api/fast", None, 10, Duration::from_millis(500));
        let h = rate_limit_headers(&[decided(&fast, true, 9, 1)], |_| 0);
        assert_eq!(header(&h, "RateLimit-Policy"), Some(r#""api/fast";q=10"#));
    }
}
