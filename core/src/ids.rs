//! Identifiers shared by every state machine and message.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Byte order of two strings, the order `str` has, compared eight bytes at a time inline:
/// ids are compared in every map lookup of the table and the rebalancer (a `CounterRef` is a
/// limit and a key), and for short ids a call to `memcmp` per comparison was the larger part
/// of the leader's time (docs/benchmarks.md, "Leader cost per sync round").
#[inline]
fn cmp_bytes(mut a: &[u8], mut b: &[u8]) -> Ordering {
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if x != y {
            // Big-endian: the first differing byte decides, as in a byte-wise comparison.
            return u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y));
        }
        a = rest_a;
        b = rest_b;
    }
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

macro_rules! shared_str_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Eq, Serialize, Deserialize)]
        pub struct $name(Arc<str>);

        impl PartialEq for $name {
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
            }
        }

        impl std::hash::Hash for $name {
            /// The string's hash, as derived: equal ids (by address or bytes) hash alike.
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }

        impl Ord for $name {
            /// The strings' byte order, as `str` orders them.
            #[inline]
            fn cmp(&self, other: &Self) -> Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    return Ordering::Equal;
                }
                cmp_bytes(self.0.as_bytes(), other.0.as_bytes())
            }
        }

        impl PartialOrd for $name {
            #[inline]
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            pub fn new(s: impl Into<Arc<str>>) -> Self {
                $name(s.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name::new(s)
            }
        }
    };
}

shared_str_id!(
    /// A region: one failure domain with its own agent (e.g. `eu-west`).
    RegionId
);

shared_str_id!(
    /// A limit (one rule of the configuration), stable across regions and restarts:
    /// `domain` then the rule's descriptor path, e.g. `public_api/api_key/route=orders_post`.
    LimitId
);

shared_str_id!(
    /// One concrete counter of a limit: the request's descriptor entries that the rule matched,
    /// e.g. `api_key=abc123/route=orders_post`. Per window, each key has its own counters.
    KeyId
);

/// A client-chosen idempotency key: a retried call with the same id is applied once.
/// Daemons map textual idempotency keys onto this with a fixed (unseeded) 128-bit hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u128);

/// A lease handed to one gateway; unique per region for the life of its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// Allowance epoch: grants for the same (limit, key, window) apply in epoch order only.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Maps keyed by ids (the table's rows, the rebalancer's views) iterate in `str` order:
        /// the inline comparison must be exactly that order, prefixes and multi-byte
        /// characters included.
        #[test]
        fn ids_order_and_compare_as_their_strings(
            a in "[a-c\u{e9}\u{1F600}/=-]{0,20}",
            b in "[a-c\u{e9}\u{1F600}/=-]{0,20}",
            shared_prefix in "[a-z0-9-]{0,17}",
        ) {
            let (a, b) = (format!("{shared_prefix}{a}"), format!("{shared_prefix}{b}"));
            let (ka, kb) = (KeyId::new(a.as_str()), KeyId::new(b.as_str()));
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(kb.cmp(&ka), b.cmp(&a));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&ka.clone()), Ordering::Equal);
        }
    }
}
