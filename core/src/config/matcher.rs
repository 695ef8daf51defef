//! Descriptor matching, as envoyproxy/ratelimit's `GetLimit` does it.
//!
//! A domain is a tree of levels. At each level the request entry is looked up by key, then its
//! value is tried exactly, then against the level's wildcard prefixes in the order they were
//! written, then the key-only entry. The first hit is taken (no backtracking), and the rule
//! applies only if the node reached by the request's last entry has one. Lookups hash the
//! borrowed key and value, so matching allocates nothing until it builds the counter key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use crate::ids::KeyId;
use crate::limit::{LimitSpec, Quota};

use super::errors::Location;
use super::model::{Rule, RuleEntry, ValuePattern};

/// Hash maps with a fixed (unseeded) hasher: the core reads no OS randomness, and the maps are
/// only looked up (never iterated into output), so flooding them is not a concern either:
/// requests cannot add entries.
pub(crate) type FixedHashMap<K, V> = HashMap<K, V, BuildHasherDefault<DefaultHasher>>;

/// One entry of a request descriptor. Implemented for `(&str, &str)` and `(String, String)`;
/// the daemons implement it for their wire types so they need not copy entries to match.
pub trait RequestEntry {
    fn key(&self) -> &str;
    fn value(&self) -> &str;
}

impl RequestEntry for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

impl RequestEntry for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &str {
        &self.1
    }
}

impl<T: RequestEntry + ?Sized> RequestEntry for &T {
    fn key(&self) -> &str {
        (**self).key()
    }
    fn value(&self) -> &str {
        (**self).value()
    }
}

/// A request descriptor matched to a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched<'a> {
    pub rule: &'a Rule,
    /// The counter this request spends from: the request's entries with their actual values,
    /// e.g. `api_key=abc123/route=orders_post`.
    pub key: KeyId,
}

impl<'a> Matched<'a> {
    pub fn limit(&self) -> &'a LimitSpec {
        &self.rule.spec
    }
}

/// The descriptors of one level, by key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Level {
    keys: FixedHashMap<Box<str>, Slot>,
}

/// Everything one level holds for one key.
#[derive(Clone, Debug, Default)]
struct Slot {
    exact: FixedHashMap<Box<str>, TrieNode>,
    /// Prefixes (without the `*`) in the order written: the first that matches wins.
    wildcards: Vec<(Box<str>, TrieNode)>,
    key_only: Option<Box<TrieNode>>,
}

#[derive(Clone, Debug)]
pub(crate) struct TrieNode {
    /// Index of the rule in the config's rule list.
    pub rule: Option<usize>,
    pub children: Level,
    pub defined_at: Location,
}

/// Why a descriptor could not be added to a level.
pub(crate) enum Conflict {
    /// The same key and value is already there.
    Duplicate { first: Location },
    /// An earlier wildcard is a prefix of this one, so this one can never match.
    Shadowed { prefix: String, at: Location },
}

impl Level {
    /// Adds a descriptor written at `at`, returning its node for the caller to fill.
    pub(crate) fn insert(
        &mut self,
        entry: &RuleEntry,
        at: Location,
    ) -> Result<&mut TrieNode, Conflict> {
        let slot = self.keys.entry(entry.key.as_str().into()).or_default();
        let node = TrieNode {
            rule: None,
            children: Level::default(),
            defined_at: at,
        };
        match &entry.value {
            ValuePattern::Any => {
                if let Some(existing) = &slot.key_only {
                    let first = existing.defined_at.clone();
                    return Err(Conflict::Duplicate { first });
                }
                Ok(&mut **slot.key_only.insert(Box::new(node)))
            }
            ValuePattern::Exact(value) => {
                if let Some(existing) = slot.exact.get(value.as_str()) {
                    let first = existing.defined_at.clone();
                    return Err(Conflict::Duplicate { first });
                }
                Ok(slot.exact.entry(value.as_str().into()).or_insert(node))
            }
            ValuePattern::Prefix(prefix) => {
                let earlier = slot
                    .wildcards
                    .iter()
                    .find(|(p, _)| prefix.starts_with(&**p));
                if let Some((p, n)) = earlier {
                    let at = n.defined_at.clone();
                    return Err(if **p == **prefix {
                        Conflict::Duplicate { first: at }
                    } else {
                        let prefix = p.to_string();
                        Conflict::Shadowed { prefix, at }
                    });
                }
                let index = slot.wildcards.len();
                slot.wildcards.push((prefix.as_str().into(), node));
                // In bounds: the element was pushed just above.
                Ok(&mut slot.wildcards[index].1)
            }
        }
    }

    /// The node one request entry reaches: exact value, then wildcards, then key-only.
    fn find(&self, key: &str, value: &str) -> Option<&TrieNode> {
        let slot = self.keys.get(key)?;
        if let Some(node) = slot.exact.get(value) {
            return Some(node);
        }
        let wildcard = slot
            .wildcards
            .iter()
            .find(|(prefix, _)| value.starts_with(&**prefix));
        match wildcard {
            Some((_, node)) => Some(node),
            None => slot.key_only.as_deref(),
        }
    }
}

/// Finds the rule index for one descriptor in a domain's top level.
pub(crate) fn find_rule<E: RequestEntry>(top: &Level, entries: &[E]) -> Option<usize> {
    let (last, init) = entries.split_last()?;
    let mut level = top;
    for entry in init {
        level = &level.find(entry.key(), entry.value())?.children;
    }
    level.find(last.key(), last.value())?.rule
}

/// The counter key: `key=value` per entry joined by `/` (`key` alone for an empty value).
/// `%`, `/` and `=` inside keys and values are percent-encoded, so that two different
/// requests can never name the same counter (`a=x/b=y` is not `a="x/b=y"`).
pub(crate) fn key_id<E: RequestEntry>(entries: &[E]) -> KeyId {
    let len: usize = entries
        .iter()
        .map(|e| e.key().len() + e.value().len() + 2)
        .sum();
    let mut key = String::with_capacity(len);
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push('/');
        }
        push_escaped(&mut key, entry.key());
        if !entry.value().is_empty() {
            key.push('=');
            push_escaped(&mut key, entry.value());
        }
    }
    KeyId::new(key)
}

fn push_escaped(out: &mut String, text: &str) {
    if !text.contains(['%', '/', '=']) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// Drops the matches whose rule another match `replaces`, as envoyproxy/ratelimit does:
/// names are gathered from every match first, and an unlimited rule is never dropped (it
/// answers "unlimited" whatever replaces it).
pub(crate) fn apply_replaces(matches: &mut [Option<Matched<'_>>]) {
    let mut replaced: Vec<&str> = Vec::new();
    for m in matches.iter().flatten() {
        replaced.extend(m.rule.spec.replaces.iter().map(String::as_str));
    }
    if replaced.is_empty() {
        return;
    }
    for slot in matches.iter_mut() {
        let drop = slot.as_ref().is_some_and(|m| {
            let spec = &m.rule.spec;
            spec.quota != Quota::Unlimited
                && spec
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(&name))
        });
        if drop {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_use_actual_values_and_cannot_collide() {
        assert_eq!(
            key_id(&[("api_key", "abc123"), ("route", "orders_post")]).as_str(),
            "api_key=abc123/route=orders_post"
        );
        assert_eq!(key_id(&[("tenant", "")]).as_str(), "tenant");
        // Without escaping, both would read "a=x/b=y".
        let one = key_id(&[("a", "x/b=y")]);
        let two = key_id(&[("a", "x"), ("b", "y")]);
        assert_ne!(one, two);
        assert_eq!(one.as_str(), "a=x%2Fb%3Dy");
        assert_eq!(key_id(&[("p", "100%")]).as_str(), "p=100%25");
    }
}
