//! Identifiers shared by every state machine and message.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! shared_str_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(Arc<str>);

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
