//! Descriptor matching, as envoyproxy/ratelimit's `GetLimit` does it.
//!
//! A domain is a tree of levels. At each level the request entry is looked up by key, then its
//! value is tried exactly, then against the level's wildcards in the order they were written,
//! then the key-only entry. The first hit is taken (no backtracking), and the rule applies
//! only if the node reached by the request's last entry has one. Lookups hash the borrowed key
//! and value, so matching allocates nothing until it builds the counter key; a second walk
//! builds the counter key and the metric value only for paths with `share_threshold`,
//! `value_to_metric` or `detailed_metric`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use crate::ids::KeyId;
use crate::limit::{LimitSpec, Quota};

use super::errors::Location;
use super::glob::Glob;
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
    /// e.g. `api_key=abc123/route=orders_post`, except that an entry matched by a
    /// `share_threshold` wildcard is written as the pattern (`files=files%2F*`), so that every
    /// value it matches spends from one counter.
    pub key: KeyId,
    /// The request's values as the rule's per-value metrics show them, written as counter
    /// keys are: `Some` when the rule has `detailed_metric` (every entry's value, or its
    /// pattern under `share_threshold`) or when a `value_to_metric` level of its path put a
    /// value the rule's id does not show (`route=api/http_method=GET/subject_id`).
    pub metric_value: Option<String>,
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
    /// Wildcards in the order written: the first that matches wins.
    wildcards: Vec<(Glob, TrieNode)>,
    key_only: Option<Box<TrieNode>>,
}

#[derive(Clone, Debug)]
pub(crate) struct TrieNode {
    /// Index of the rule in the config's rule list.
    pub rule: Option<usize>,
    pub children: Level,
    pub defined_at: Location,
    /// envoyproxy/ratelimit's `share_threshold` (on wildcards only): values it matches
    /// share one counter.
    pub share_threshold: bool,
    /// envoyproxy/ratelimit's `value_to_metric`: the request's value shows in the metrics.
    pub value_to_metric: bool,
}

/// Why a descriptor could not be added to a level.
pub(crate) enum Conflict {
    /// The same key and value is already there.
    Duplicate { first: Location },
    /// An earlier wildcard matches every value this one does, so this one can never match.
    Shadowed { pattern: String, at: Location },
}

/// How one request entry reached its node.
#[derive(Clone, Copy, Debug)]
enum Hit<'a> {
    Exact,
    Wildcard(&'a Glob),
    KeyOnly,
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
            share_threshold: false,
            value_to_metric: false,
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
            ValuePattern::Wildcard(glob) => {
                let earlier = slot.wildcards.iter().find(|(g, _)| g.covers(glob));
                if let Some((g, n)) = earlier {
                    let at = n.defined_at.clone();
                    return Err(if g == glob {
                        Conflict::Duplicate { first: at }
                    } else {
                        let pattern = g.to_string();
                        Conflict::Shadowed { pattern, at }
                    });
                }
                let index = slot.wildcards.len();
                slot.wildcards.push((glob.clone(), node));
                // In bounds: the element was pushed just above.
                Ok(&mut slot.wildcards[index].1)
            }
        }
    }

    /// The node one request entry reaches: exact value, then wildcards, then key-only.
    fn find(&self, key: &str, value: &str) -> Option<(&TrieNode, Hit<'_>)> {
        let slot = self.keys.get(key)?;
        if let Some(node) = slot.exact.get(value) {
            return Some((node, Hit::Exact));
        }
        let wildcard = slot.wildcards.iter().find(|(glob, _)| glob.matches(value));
        match wildcard {
            Some((glob, node)) => Some((node, Hit::Wildcard(glob))),
            None => slot.key_only.as_deref().map(|node| (node, Hit::KeyOnly)),
        }
    }
}

/// Walks one descriptor down a domain's tree, calling `visit` for each entry with the node it
/// reached; returns the node of the last entry, or `None` when an entry reaches nothing.
fn walk<'t, E: RequestEntry>(
    top: &'t Level,
    entries: &[E],
    mut visit: impl FnMut(&E, &'t TrieNode, Hit<'t>),
) -> Option<&'t TrieNode> {
    let mut level = top;
    let mut reached = None;
    for entry in entries {
        let (node, hit) = level.find(entry.key(), entry.value())?;
        visit(entry, node, hit);
        level = &node.children;
        reached = Some(node);
    }
    reached
}

/// What the first walk saw that needs the second.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PathFlags {
    /// An entry matched a `share_threshold` wildcard: the counter key shows its pattern.
    shared: bool,
    /// A `value_to_metric` level put a value the rule's id does not show.
    value_to_metric: bool,
}

/// Finds the rule index for one descriptor in a domain's top level.
pub(crate) fn find_rule<E: RequestEntry>(top: &Level, entries: &[E]) -> Option<(usize, PathFlags)> {
    let mut flags = PathFlags::default();
    let last = walk(top, entries, |entry, node, hit| match hit {
        Hit::Wildcard(_) if node.share_threshold => flags.shared = true,
        Hit::Wildcard(_) => flags.value_to_metric |= node.value_to_metric,
        Hit::KeyOnly => {
            flags.value_to_metric |= node.value_to_metric && !entry.value().is_empty();
        }
        Hit::Exact => {}
    })?;
    Some((last.rule?, flags))
}

/// The counter key and the metric value of a descriptor that [`find_rule`] matched to a rule
/// with `detailed_metric` set as given. The plain counter key needs no second walk.
pub(crate) fn describe<E: RequestEntry>(
    top: &Level,
    entries: &[E],
    flags: PathFlags,
    detailed_metric: bool,
) -> (KeyId, Option<String>) {
    if !flags.shared && !flags.value_to_metric && !detailed_metric {
        return (key_id(entries), None);
    }
    let len: usize = entries
        .iter()
        .map(|e| e.key().len() + e.value().len() + 2)
        .sum();
    let mut key = String::with_capacity(len);
    // A detailed metric is the counter key; only value_to_metric builds a string of its own.
    let mut metric =
        (!detailed_metric && flags.value_to_metric).then(|| String::with_capacity(len));
    walk(top, entries, |entry, node, hit| {
        // The value the counter key (and a detailed metric) shows: the pattern for a
        // shared wildcard, the request's value otherwise.
        let counted = match hit {
            Hit::Wildcard(glob) if node.share_threshold => glob.as_str(),
            _ => entry.value(),
        };
        push_entry(&mut key, entry.key(), counted);
        let Some(metric) = metric.as_mut() else {
            return;
        };
        // As envoyproxy/ratelimit builds its value_to_metric key: a configured value (exact,
        // or a wildcard's pattern) always shows; a key-only level shows the request's value
        // only with value_to_metric, and a wildcard its value instead of its pattern.
        let shown = match hit {
            Hit::Exact => entry.value(),
            Hit::Wildcard(glob) if node.share_threshold => glob.as_str(),
            Hit::Wildcard(_) if node.value_to_metric => entry.value(),
            Hit::Wildcard(glob) => glob.as_str(),
            Hit::KeyOnly if node.value_to_metric => entry.value(),
            Hit::KeyOnly => "",
        };
        push_entry(metric, entry.key(), shown);
    });
    if detailed_metric {
        metric = Some(key.clone());
    }
    (KeyId::new(key), metric)
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
    for entry in entries {
        push_entry(&mut key, entry.key(), entry.value());
    }
    KeyId::new(key)
}

/// Appends one `key=value` segment (`key` alone for an empty value) to a counter key. The
/// first segment is never empty: no rule has an empty key, so a matched entry has a key.
fn push_entry(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push('/');
    }
    push_escaped(out, key);
    if !value.is_empty() {
        out.push('=');
        push_escaped(out, value);
    }
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
