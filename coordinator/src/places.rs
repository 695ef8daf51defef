//! Places per peer: how many calls or streams one named peer (a region's or a node's
//! certificate) holds at once, so that the holder of one key cannot take the others' share
//! of a node-wide cap.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::lock;

/// Places held per peer, up to `max_per_peer` each. Peers holding none leave no entry, so the
/// map holds at most as many peers as hold places.
#[derive(Debug)]
pub struct Places<K: Hash + Eq + Clone> {
    open: Mutex<HashMap<K, usize>>,
    max_per_peer: usize,
}

/// One peer's place, given back when dropped.
#[derive(Debug)]
pub struct Place<K: Hash + Eq + Clone> {
    places: Arc<Places<K>>,
    peer: K,
}

impl<K: Hash + Eq + Clone> Places<K> {
    pub fn new(max_per_peer: usize) -> Places<K> {
        Places {
            open: Mutex::new(HashMap::new()),
            max_per_peer,
        }
    }

    /// A place for one more call of `peer`, or `None` when it holds `max_per_peer`.
    pub fn take(self: &Arc<Self>, peer: &K) -> Option<Place<K>> {
        let mut open = lock(&self.open);
        let n = open.entry(peer.clone()).or_default();
        if *n >= self.max_per_peer {
            return None;
        }
        *n += 1;
        Some(Place {
            places: self.clone(),
            peer: peer.clone(),
        })
    }

    /// Places `peer` holds now.
    pub fn open(&self, peer: &K) -> usize {
        lock(&self.open).get(peer).copied().unwrap_or(0)
    }
}

impl<K: Hash + Eq + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        let mut open = lock(&self.places.open);
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_places_and_gets_them_back() {
        let places = Arc::new(Places::new(3));
        let mut held: Vec<Place<&str>> = (0..3)
            .map(|_| places.take(&"a").expect("a place"))
            .collect();
        assert!(places.take(&"a").is_none(), "one more of a's");
        assert!(places.take(&"b").is_some(), "b has its own places");
        drop(held.pop());
        assert_eq!(places.open(&"a"), 2);
        assert!(places.take(&"a").is_some(), "a place came back");
        held.clear();
        assert_eq!(places.open(&"a"), 0);
        assert!(
            lock(&places.open).is_empty(),
            "no entry left for peers holding none"
        );
    }
}
