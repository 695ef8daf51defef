//! Keys an operator watches: each remembers the final counts of its last few windows, so a
//! window's total is readable after it ended even when traffic rolled the key on at once (a
//! key with no boxed part forgets its window before when it rolls). Soft state, per limit
//! and bounded: lost in a restart, and the longest-unwatched key makes room for a new one.

use std::collections::{BTreeMap, VecDeque};

use super::inspect::PreviousWindow;
use super::key::ClosingEntry;

/// Keys watched per limit at most.
pub const MAX_WATCHED_KEYS_PER_LIMIT: usize = 16;

/// Closed windows remembered per watched key.
pub const CLOSED_WINDOWS_KEPT: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct WatchedKeys {
    keys: BTreeMap<Box<str>, Watch>,
    /// Bumped by every watch call: the key with the lowest `last_watch` is dropped first.
    seq: u64,
}

#[derive(Debug, Default)]
struct Watch {
    last_watch: u64,
    /// Oldest first.
    closed: VecDeque<PreviousWindow>,
}

impl WatchedKeys {
    /// Watch `key` from now on (again: it stays watched longer). Returns the key dropped to
    /// make room, if one was.
    pub fn watch(&mut self, key: &str) -> Option<Box<str>> {
        self.seq += 1;
        if let Some(w) = self.keys.get_mut(key) {
            w.last_watch = self.seq;
            return None;
        }
        let dropped = if self.keys.len() >= MAX_WATCHED_KEYS_PER_LIMIT {
            let oldest = self
                .keys
                .iter()
                .min_by_key(|(_, w)| w.last_watch)
                .map(|(k, _)| k.clone());
            oldest.inspect(|k| {
                self.keys.remove(k);
            })
        } else {
            None
        };
        let watch = Watch {
            last_watch: self.seq,
            closed: VecDeque::new(),
        };
        self.keys.insert(key.into(), watch);
        debug_assert!(self.keys.len() <= MAX_WATCHED_KEYS_PER_LIMIT);
        dropped
    }

    pub fn is_watched(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// The key's counter rolled past a window (if `closing` is some), ending at these counts.
    pub fn closed(&mut self, key: &str, closing: Option<ClosingEntry>) {
        // Most limits have no watched key: no lookup on their path.
        let Some(c) = closing.filter(|_| !self.keys.is_empty()) else {
            return;
        };
        let Some(w) = self.keys.get_mut(key) else {
            return;
        };
        debug_assert!(w.closed.back().is_none_or(|p| p.window < c.window));
        if w.closed.len() == CLOSED_WINDOWS_KEPT {
            w.closed.pop_front();
        }
        w.closed.push_back(PreviousWindow {
            window: c.window,
            net_units: c.net_units(),
        });
    }

    /// The windows the key closed since it was watched, oldest first.
    pub fn closed_windows(&self, key: &str) -> Vec<PreviousWindow> {
        self.keys
            .get(key)
            .map(|w| w.closed.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::WindowIndex;

    fn closing(window: u64, net_units: u64) -> Option<ClosingEntry> {
        Some(ClosingEntry {
            window: WindowIndex(window),
            granted_units: net_units + 2,
            refunded_units: 2,
        })
    }

    #[test]
    fn a_watched_key_keeps_its_last_windows_and_others_keep_none() {
        let mut w = WatchedKeys::default();
        w.closed("a", closing(1, 5));
        assert!(w.closed_windows("a").is_empty(), "not watched yet");
        w.watch("a");
        for i in 0..(CLOSED_WINDOWS_KEPT as u64 + 3) {
            w.closed("a", closing(10 + i, i));
            w.closed("b", closing(10 + i, i));
        }
        let kept = w.closed_windows("a");
        assert_eq!(kept.len(), CLOSED_WINDOWS_KEPT);
        assert_eq!(kept[0].window, WindowIndex(13), "the oldest went first");
        assert_eq!(kept.last().map(|c| c.net_units), Some(10));
        assert!(w.closed_windows("b").is_empty());
    }

    #[test]
    fn a_full_limit_drops_the_key_watched_longest_ago() {
        let mut w = WatchedKeys::default();
        for i in 0..MAX_WATCHED_KEYS_PER_LIMIT {
            assert_eq!(w.watch(&format!("k{i}")), None);
        }
        // Watching k0 again makes k1 the longest unwatched.
        assert_eq!(w.watch("k0"), None);
        assert_eq!(w.watch("new").as_deref(), Some("k1"));
        assert!(w.is_watched("k0") && w.is_watched("new") && !w.is_watched("k1"));
    }
}
