//! Identifiers shared by every state machine and message.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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
                // The leader's maps share one copy of each id (docs/benchmarks.md, "Leader
                // cost per sync round"): the same copy is equal without reading it.
                if Arc::ptr_eq(&self.0, &other.0) {
                    return Ordering::Equal;
                }
                self.0.cmp(&other.0)
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
        /// the comparison (with its shortcut for a shared copy) must be exactly that order,
        /// prefixes and multi-byte characters included.
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
