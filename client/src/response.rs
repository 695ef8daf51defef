//! The 429 a service answers when the client refuses, with the headers the agent's RLS answers
//! carry (built by the same code, `allot_core::headers`): `RateLimit-Policy` and `RateLimit`
//! (draft-11), `X-RateLimit-*`, and `Retry-After`, never earlier than the refusal's wait.

use std::time::Duration;

use allot_core::headers::{self, HeaderItem};

use crate::client::Decision;

/// The limit a 429 names. The client does not know the agent's rules, so the service names
/// the policy as its limits file does (its `name`, quota and window).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub quota_units: u64,
    pub window: Option<Duration>,
}

/// HTTP status of a refusal.
pub const TOO_MANY_REQUESTS: u16 = 429;

/// The headers of a 429 for `decision`, or `None` when it admitted. `jitter_secs` is added to
/// Retry-After (spread the retries of clients refused together; 0 for none).
pub fn too_many_requests(
    decision: Decision,
    policy: &Policy,
    jitter_secs: u64,
) -> Option<Vec<(&'static str, String)>> {
    let add_jitter = |wait: Duration| wait.as_secs().saturating_add(jitter_secs);
    match decision {
        Decision::Allowed | Decision::Unavailable { allowed: true } => None,
        Decision::Denied { retry_after } => {
            let item = HeaderItem {
                name: &policy.name,
                quota_units: policy.quota_units,
                window: policy.window,
                refused: true,
                remaining_units: 0,
                effective_secs: headers::effective_secs(false, Some(retry_after), retry_after),
            };
            Some(headers::rate_limit_headers(&[item], false, add_jitter))
        }
        // Refused by the failure mode: no figure to advertise, retry in a second.
        Decision::Unavailable { allowed: false } => {
            Some(headers::rate_limit_headers(&[], true, add_jitter))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_denial_names_its_policy_and_its_wait() {
        let policy = Policy {
            name: "per-key".into(),
            quota_units: 100,
            window: Some(Duration::from_secs(60)),
        };
        let denied = Decision::Denied {
            retry_after: Duration::from_millis(41_200),
        };
        let h = too_many_requests(denied, &policy, 3).expect("a refusal");
        assert_eq!(
            header(&h, "RateLimit-Policy"),
            Some(r#""per-key";q=100;w=60"#)
        );
        assert_eq!(header(&h, "RateLimit"), Some(r#""per-key";r=0;t=42"#));
        assert_eq!(header(&h, "X-RateLimit-Limit"), Some("100"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&h, "X-RateLimit-Reset"), Some("42"));
        // 41.2 s rounds up to 42, and the jitter only adds.
        assert_eq!(header(&h, "Retry-After"), Some("45"));
        assert_eq!(too_many_requests(Decision::Allowed, &policy, 0), None);
    }

    #[test]
    fn a_closed_failure_mode_says_retry_soon_and_nothing_else() {
        let policy = Policy {
            name: "p".into(),
            quota_units: 1,
            window: None,
        };
        let h = too_many_requests(Decision::Unavailable { allowed: false }, &policy, 0)
            .expect("a refusal");
        assert_eq!(h, vec![("Retry-After", "1".to_owned())]);
    }
}
