//! Hash maps for the leader's per-counter state (D42). A lookup keyed by `CounterRef` in a
//! `BTreeMap` of 10k to 20k counters compares a dozen keys, two strings each, from as many
//! scattered nodes: about 40% of the leader's CPU per round (docs/benchmarks.md, "Leader cost
//! per sync round"). A hash map hashes the key once and compares one.
//!
//! Nothing here lets hash order reach an output: [`HashedMap`] is for maps that are only looked
//! up (or scanned where the order cannot matter), and [`OrderedMap`] iterates in key order.
//! The hasher is seeded by the caller (the leader from its start, no OS randomness): keys
//! come from requests, and a seed a client cannot know keeps it from choosing keys that
//! collide.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ops::RangeBounds;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The hasher of [`HashedMap`] and [`OrderedMap`]: foldhash's quality variant with a seed.
#[derive(Clone, Debug)]
pub struct SeededState(foldhash::quality::FixedState);

impl SeededState {
    pub fn new(seed: u64) -> Self {
        SeededState(foldhash::quality::FixedState::with_seed(seed))
    }
}

impl Default for SeededState {
    /// Seed 0: for maps made before a seed is known (a table decoded from a snapshot);
    /// the leader reseeds its own.
    fn default() -> Self {
        SeededState::new(0)
    }
}

impl BuildHasher for SeededState {
    type Hasher = <foldhash::quality::FixedState as BuildHasher>::Hasher;

    #[inline]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// A hash map never iterated where its order could reach an output.
pub type HashedMap<K, V> = HashMap<K, V, SeededState>;

/// An empty [`HashedMap`] hashing with `seed`.
pub fn hashed_map<K, V>(seed: u64) -> HashedMap<K, V> {
    HashMap::with_hasher(SeededState::new(seed))
}

/// A map looked up by hash and iterated in key order: the values in a hash map, the keys
/// also in a `BTreeSet` for the order. Inserting a new key or removing one costs a search
/// of the set too; a lookup does not.
#[derive(Clone)]
pub struct OrderedMap<K, V> {
    map: HashedMap<K, V>,
    order: BTreeSet<K>,
}

impl<K: Ord + Hash + Clone, V> Default for OrderedMap<K, V> {
    fn default() -> Self {
        OrderedMap::with_seed(0)
    }
}

impl<K: Ord + Hash + Clone, V> OrderedMap<K, V> {
    pub fn with_seed(seed: u64) -> Self {
        OrderedMap {
            map: hashed_map(seed),
            order: BTreeSet::new(),
        }
    }

    /// The same entries, hashed with `seed`.
    pub fn reseeded(self, seed: u64) -> Self {
        let mut map = HashMap::with_capacity_and_hasher(self.map.len(), SeededState::new(seed));
        map.extend(self.map);
        OrderedMap {
            map,
            order: self.order,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    /// The stored key equal to `key`, with its value.
    pub fn get_key_value(&self, key: &K) -> Option<(&K, &V)> {
        self.map.get_key_value(key)
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.map.insert(key.clone(), value);
        if old.is_none() {
            self.order.insert(key);
        }
        self.assert_in_step();
        old
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let old = self.map.remove(key);
        if old.is_some() {
            self.order.remove(key);
        }
        self.assert_in_step();
        old
    }

    /// The value of `key`, with `key` swapped for the stored copy (so that the caller shares
    /// it); if there is none, the one `make` returns, if it returns one. One hash lookup.
    pub fn get_sharing_key(
        &mut self,
        key: &mut K,
        make: impl FnOnce() -> Option<V>,
    ) -> Option<&mut V> {
        match self.map.entry(key.clone()) {
            Entry::Occupied(o) => {
                *key = o.key().clone();
                Some(o.into_mut())
            }
            Entry::Vacant(v) => {
                let value = make()?;
                self.order.insert(key.clone());
                Some(v.insert(value))
            }
        }
    }

    /// The value of `key`, made at its default if there is none.
    pub fn entry_or_default(&mut self, key: &K) -> &mut V
    where
        V: Default,
    {
        match self.map.entry(key.clone()) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                self.order.insert(key.clone());
                v.insert(V::default())
            }
        }
    }

    /// Keeps the entries `keep` accepts, visited in key order.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let map = &mut self.map;
        self.order.retain(|k| {
            let kept = map.get_mut(k).is_some_and(|v| keep(k, v));
            if !kept {
                map.remove(k);
            }
            kept
        });
        self.assert_in_step();
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.order.iter().map(|k| (k, self.value(k)))
    }

    /// The entries whose keys are in `range`, in key order.
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> impl Iterator<Item = (&K, &V)> {
        self.order.range(range).map(|k| (k, self.value(k)))
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.order.iter()
    }

    /// Every value, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    fn value(&self, key: &K) -> &V {
        match self.map.get(key) {
            Some(v) => v,
            // Every key of `order` is in `map` (asserted at each change).
            None => unreachable!("ordered map: a key without a value"),
        }
    }

    fn assert_in_step(&self) {
        debug_assert_eq!(self.map.len(), self.order.len(), "ordered map out of step");
    }
}

impl<K: Ord + Hash + Clone, V: PartialEq> PartialEq for OrderedMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<K: Ord + Hash + Clone, V: Eq> Eq for OrderedMap<K, V> {}

impl<K: Ord + Hash + Clone + fmt::Debug, V: fmt::Debug> fmt::Debug for OrderedMap<K, V> {
    /// In key order, as a `BTreeMap` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Hash + Clone + Serialize, V: Serialize> Serialize for OrderedMap<K, V> {
    /// In key order, as a `BTreeMap` serialises: the same bytes (snapshots written with one
    /// decode into the other).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K, V> Deserialize<'de> for OrderedMap<K, V>
where
    K: Ord + Hash + Clone + Deserialize<'de>,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ordered = BTreeMap::<K, V>::deserialize(deserializer)?;
        Ok(ordered.into_iter().collect())
    }
}

impl<K: Ord + Hash + Clone, V> FromIterator<(K, V)> for OrderedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = OrderedMap::default();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterates_in_key_order_whatever_the_seed_and_insertion_order() {
        for seed in [0, 1, u64::MAX] {
            let mut m = OrderedMap::with_seed(seed);
            for k in [5, 1, 9, 3, 7] {
                m.insert(k, k * 10);
            }
            m.remove(&9);
            m.retain(|k, _| *k != 3);
            let mut four = 4;
            if let Some(v) = m.get_sharing_key(&mut four, || Some(0)) {
                *v += 1;
            }
            assert!(m.get_sharing_key(&mut 6, || None).is_none());
            let m = m.reseeded(seed.wrapping_add(1));
            let all: Vec<(i32, i32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(all, vec![(1, 10), (4, 1), (5, 50), (7, 70)]);
            let tail: Vec<i32> = m.range(4..).map(|(k, _)| *k).collect();
            assert_eq!(tail, vec![4, 5, 7]);
            assert_eq!(m.len(), 4);
        }
    }

    #[test]
    fn prints_as_the_btree_map_of_its_entries() {
        let entries = [(3u32, 30u64), (1, 10), (2, 20)];
        let ordered: OrderedMap<u32, u64> = entries.into_iter().collect();
        let btree: BTreeMap<u32, u64> = entries.into_iter().collect();
        assert_eq!(format!("{ordered:?}"), format!("{btree:?}"));
    }
}
