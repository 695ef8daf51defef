//! Rate limit response headers, built the same way wherever allot answers: the agent's RLS
//! answers (for Envoy to add) and the client's 429s. `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-11: lists of structured-field items), the
//! `X-RateLimit-Limit/Remaining/Reset` trio of the most restrictive item (as
//! envoyproxy/ratelimit picks it), and `Retry-After` on a refusal.
//!
//! Per the draft: a policy item is `"name";q=<quota>;w=<window seconds>` (`w` only for a
//! whole number of seconds), a service limit item `"name";r=<remaining>;t=<seconds>`; and a
//! Retry-After is never earlier than the end of the effective window `t` of a refused item,
//! so its jitter only ever adds. Pure string building: the jitter comes in as a closure.

use std::time::Duration;

/// One counted limit, as the headers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderItem<'a> {
    /// The policy's name: the rule's `name`, else its id.
    pub name: &'a str,
    pub quota_units: u64,
    /// The window; advertised as `w` only when a whole number of seconds.
    pub window: Option<Duration>,
    pub refused: bool,
    /// What is left (0 for a refusal).
    pub remaining_units: u64,
    /// `t`: seconds within which no more than `remaining_units` can be used.
    pub effective_secs: u64,
}

/// The headers for one answer; `refused_without_item` is a refusal no item describes (a
/// failure mode's), which gets a Retry-After of one second. `retry_after_secs` turns the
/// longest wait of a refused item into the Retry-After value (adding jitter).
pub fn rate_limit_headers(
    items: &[HeaderItem<'_>],
    refused_without_item: bool,
    retry_after_secs: impl FnOnce(Duration) -> u64,
) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    if !items.is_empty() {
        headers.push(("RateLimit-Policy", policy_list(items)));
        headers.push(("RateLimit", limit_list(items)));
        if let Some(worst) = most_restrictive(items) {
            headers.push(("X-RateLimit-Limit", worst.quota_units.to_string()));
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

/// `t` in whole seconds, rounded up: until the window resets, or for a refusal until the same
/// request may pass (`retry_after`, else the reset).
pub fn effective_secs(allowed: bool, retry_after: Option<Duration>, reset_after: Duration) -> u64 {
    let wait = if allowed {
        reset_after
    } else {
        retry_after.unwrap_or(reset_after)
    };
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// A refused item first (the first one), else the one with the least left.
fn most_restrictive<'a, 'b>(items: &'b [HeaderItem<'a>]) -> Option<&'b HeaderItem<'a>> {
    items
        .iter()
        .find(|i| i.refused)
        .or_else(|| items.iter().min_by_key(|i| i.remaining_units))
}

fn policy_list(items: &[HeaderItem<'_>]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for i in items {
        if seen.contains(&i.name) {
            continue;
        }
        seen.push(i.name);
        let mut policy = format!("{};q={}", sf_string(i.name), i.quota_units);
        if let Some(w) = i
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
fn limit_list(items: &[HeaderItem<'_>]) -> String {
    let mut best: Vec<&HeaderItem<'_>> = Vec::new();
    for i in items {
        match best.iter_mut().find(|b| b.name == i.name) {
            Some(b) if i.remaining_units < b.remaining_units => *b = i,
            Some(_) => {}
            None => best.push(i),
        }
    }
    best.iter()
        .map(|i| {
            format!(
                "{};r={};t={}",
                sf_string(i.name),
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
    use super::*;

    #[test]
    fn names_are_valid_structured_field_strings() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), r#""%C3%A9""#);
    }

    #[test]
    fn a_partial_second_counts_as_a_whole_one() {
        let d = Duration::from_millis(1_500);
        assert_eq!(effective_secs(true, None, d), 2);
        assert_eq!(effective_secs(false, Some(Duration::from_secs(3)), d), 3);
        assert_eq!(effective_secs(false, None, d), 2);
    }
}
