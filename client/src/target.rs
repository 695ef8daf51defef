//! What a request is counted against: a domain and ordered descriptor entries, as the agent's
//! lease API and Envoy's rate limit service name it.
//!
//! The gateway state machine knows keys as a (limit, key) pair of strings. The client uses the
//! domain as the limit and a length-prefixed encoding of the entries as the key, so the pair
//! maps back to the descriptor the agent needs without a table to keep bounded.

use allot_core::ids::{KeyId, LimitId};
use allot_proto::lease::v1 as pb;

/// A descriptor: the domain and its ordered entries (key, value).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub domain: String,
    pub entries: Vec<(String, String)>,
}

impl Target {
    pub fn new(domain: impl Into<String>) -> Self {
        Target {
            domain: domain.into(),
            entries: Vec::new(),
        }
    }

    /// Adds one descriptor entry (order matters, as in Envoy).
    pub fn entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.entries.push((key.into(), value.into()));
        self
    }

    /// The gateway's names for this target.
    pub(crate) fn ids(&self) -> (LimitId, KeyId) {
        let mut key = String::new();
        for (k, v) in &self.entries {
            push_field(&mut key, k);
            push_field(&mut key, v);
        }
        (LimitId::new(self.domain.as_str()), KeyId::new(key))
    }

    /// The target the gateway named `(limit, key)`; `None` for a key this crate did not encode.
    pub(crate) fn from_ids(limit: &LimitId, key: &KeyId) -> Option<Target> {
        let mut rest = key.as_str();
        let mut entries = Vec::new();
        while !rest.is_empty() {
            let (k, after) = take_field(rest)?;
            let (v, after) = take_field(after)?;
            entries.push((k.to_owned(), v.to_owned()));
            rest = after;
        }
        Some(Target {
            domain: limit.as_str().to_owned(),
            entries,
        })
    }

    pub(crate) fn to_proto(&self) -> pb::Target {
        pb::Target {
            domain: self.domain.clone(),
            entries: self
                .entries
                .iter()
                .map(|(key, value)| pb::Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

/// `<byte length>:<text>`: unambiguous whatever the text holds.
fn push_field(out: &mut String, text: &str) {
    out.push_str(&text.len().to_string());
    out.push(':');
    out.push_str(text);
}

fn take_field(s: &str) -> Option<(&str, &str)> {
    let (len, rest) = s.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let text = rest.get(..len)?;
    Some((text, &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_survives_the_round_trip_through_the_gateways_names() {
        let t = Target::new("api")
            .entry("user", "a:1:b")
            .entry("route", "")
            .entry("é", "3:x");
        let (limit, key) = t.ids();
        assert_eq!(Target::from_ids(&limit, &key), Some(t));
    }

    #[test]
    fn entries_that_concatenate_alike_are_different_keys() {
        let a = Target::new("d").entry("ab", "c").ids().1;
        let b = Target::new("d").entry("a", "bc").ids().1;
        assert_ne!(a, b);
    }
}
