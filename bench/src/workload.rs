//! What the load generator asks: which RPC, for which keys, and the names shared with the
//! limits file the agent is started with.

use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};

/// The domain every benchmark request names.
pub const BENCH_DOMAIN: &str = "bench";

/// The descriptor entry key; values are `k0`, `k1`, ... (one counter per value).
pub const BENCH_DESCRIPTOR_KEY: &str = "key";

/// Most distinct keys a run may spread its calls over (each is a string kept for the run).
pub const MAX_KEYS: u32 = 1_000_000;

/// One request, as each workload sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// `allot.lease.v1.LeaseService/Acquire`, cost 1: the per-request path.
    Acquire,
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, one descriptor.
    Rls,
    /// `allot.lease.v1.LeaseService/Lease` of a batch of units, spent locally by the caller.
    Lease,
    /// A GCRA Lua script in Redis through `EVALSHA`: the per-request path of a Redis limiter.
    Redis,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Acquire => "acquire",
            Workload::Rls => "rls",
            Workload::Lease => "lease",
            Workload::Redis => "redis",
        }
    }
}

/// The keys a run's calls are spread over, visited round-robin: caller `c` of `n` sends its
/// `i`-th call for key `(c + i * n) mod keys`, so with many keys every key gets its share and
/// no two callers start on the same one.
#[derive(Clone, Debug)]
pub struct KeySet {
    values: Arc<[String]>,
}

impl KeySet {
    /// `count` keys, `k0` .. `k{count-1}`. One key is the hot-key case.
    pub fn new(count: u32) -> Result<Self> {
        if count == 0 || count > MAX_KEYS {
            return Err(Error::Invalid(format!(
                "keys must be between 1 and {MAX_KEYS}, not {count}"
            )));
        }
        let values: Arc<[String]> = (0..count).map(|i| format!("k{i}")).collect();
        Ok(KeySet { values })
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The walk of one caller among `callers`.
    pub fn walk(&self, caller: u32, callers: u32) -> KeyWalk {
        KeyWalk {
            values: Arc::clone(&self.values),
            next: caller as usize % self.values.len(),
            stride: callers.max(1) as usize % self.values.len(),
        }
    }
}

/// One caller's sequence of keys.
#[derive(Clone, Debug)]
pub struct KeyWalk {
    values: Arc<[String]>,
    next: usize,
    stride: usize,
}

impl KeyWalk {
    /// The key for the next call.
    pub fn next_key(&mut self) -> &str {
        let at = self.next;
        self.next = (self.next + self.stride) % self.values.len();
        &self.values[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn one_key_is_the_hot_key_for_every_caller() {
        let keys = KeySet::new(1).unwrap();
        for caller in 0..4 {
            let mut walk = keys.walk(caller, 4);
            for _ in 0..3 {
                assert_eq!(walk.next_key(), "k0");
            }
        }
    }

    #[test]
    fn many_keys_are_shared_evenly_between_callers() {
        // 3 callers, 6 keys, 4 calls each: caller 0 sends k0 k3 k0 k3, caller 1 k1 k4 k1 k4,
        // caller 2 k2 k5 k2 k5: every key twice.
        let keys = KeySet::new(6).unwrap();
        let mut seen = BTreeMap::new();
        for caller in 0..3 {
            let mut walk = keys.walk(caller, 3);
            for _ in 0..4 {
                *seen.entry(walk.next_key().to_owned()).or_insert(0) += 1;
            }
        }
        let expected: BTreeMap<String, i32> = (0..6).map(|i| (format!("k{i}"), 2)).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn more_callers_than_keys_still_visit_every_key() {
        // 5 callers, 2 keys: stride 5 mod 2 = 1, so caller 0 alternates k0 k1.
        let keys = KeySet::new(2).unwrap();
        let mut walk = keys.walk(0, 5);
        let got: Vec<String> = (0..4).map(|_| walk.next_key().to_owned()).collect();
        assert_eq!(got, ["k0", "k1", "k0", "k1"]);
    }

    #[test]
    fn key_count_is_bounded() {
        assert!(KeySet::new(0).is_err());
        assert!(KeySet::new(MAX_KEYS + 1).is_err());
    }
}
