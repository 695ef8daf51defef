//! Rate limit response headers for Envoy to add: the agent's checked descriptors turned into
//! `allot_core::headers` items, built by the code the client's 429s share (`RateLimit-Policy`
//! and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-11, `X-RateLimit-*` of the most
//! restrictive descriptor, and `Retry-After` on a refusal).

use std::time::Duration;

use allot_core::budget::Reason;
use allot_core::headers::{self, HeaderItem};

use crate::convert::rule_name;
use crate::request::Checked;

/// The headers for one ShouldRateLimit answer; `over_limit` is the answer's overall code
/// (a quota-mode descriptor over its limit does not always refuse the request, and an
/// admitted request gets no Retry-After); `retry_after_secs` turns the longest wait of a
/// refused descriptor into the Retry-After value (adding jitter).
pub fn rate_limit_headers(
    checked: &[Checked],
    over_limit: bool,
    retry_after_secs: impl FnOnce(Duration) -> u64,
) -> Vec<(&'static str, String)> {
    let mut items: Vec<HeaderItem<'_>> = checked.iter().filter_map(item).collect();
    if !over_limit {
        for i in &mut items {
            i.refused = false;
        }
    }
    let refused_without_item = over_limit
        && checked
            .iter()
            .any(|c| matches!(c, Checked::Degraded { allowed: false, .. }));
    headers::rate_limit_headers(&items, refused_without_item, retry_after_secs)
}

fn item(c: &Checked) -> Option<HeaderItem<'_>> {
    let Checked::Decided { rule, decision } = c else {
        return None;
    };
    if matches!(decision.reason, Reason::Unlimited | Reason::Disabled) {
        return None;
    }
    Some(HeaderItem {
        name: rule_name(rule),
        quota_units: rule.quota_units,
        window: rule.window,
        refused: !decision.allowed,
        remaining_units: if decision.allowed && !decision.shadow_denied {
            decision.remaining_units
        } else {
            0
        },
        effective_secs: headers::effective_secs(
            decision.allowed,
            decision.retry_after,
            decision.reset_after,
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use allot_core::budget::Decision;
    use allot_core::limit::LimitSpec;

    use super::*;
    use crate::limits::{self, RuleInfo};

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
        let h = rate_limit_headers(&checked, false, |_| panic!("no Retry-After when allowed"));
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
        let h = rate_limit_headers(&checked, true, |wait| {
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

    /// A quota-mode descriptor over its limit, in a request the answer admits: it shows as
    /// spent, but nothing tells the caller to retry.
    #[test]
    fn an_admitted_request_gets_no_retry_after() {
        let a = rule("api/a", None, 10, Duration::from_secs(60));
        let checked = [decided(&a, false, 0, 42)];
        let h = rate_limit_headers(&checked, false, |_| panic!("no Retry-After when admitted"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&h, "Retry-After"), None);
    }

    #[test]
    fn windows_below_a_second_have_no_w() {
        let fast = rule("api/fast", None, 10, Duration::from_millis(500));
        let h = rate_limit_headers(&[decided(&fast, true, 9, 1)], false, |_| 0);
        assert_eq!(header(&h, "RateLimit-Policy"), Some(r#""api/fast";q=10"#));
    }
}
