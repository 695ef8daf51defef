//! The one error type of allot-core.

use crate::ids::{KeyId, LeaseId, LimitId};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every problem found in a set of configuration files, each naming file and place.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigErrors),
    /// Daemon or state-machine settings that cannot work (each problem named).
    #[error("invalid settings: {}", .0.join("; "))]
    InvalidSettings(Vec<String>),
    #[error("unknown limit {0}")]
    UnknownLimit(LimitId),
    #[error("unknown lease {0:?}")]
    UnknownLease(LeaseId),
    #[error("too many keys for limit {limit}: at most {max_keys} are tracked (key {key} refused)")]
    TooManyKeys {
        limit: LimitId,
        key: KeyId,
        max_keys: usize,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A SyncUp from a region the operator removed: refused, nothing of it taken.
    #[error(
        "region {0} was removed from the cluster: its syncs are refused until it is added back (allot cluster add-region {0})"
    )]
    RegionRemoved(crate::ids::RegionId),
    /// A request id (an idempotency key) came back with another request than the one it was
    /// first used for: another kind of call, or other parameters. Refused, never answered
    /// with the first request's outcome; nothing is charged.
    #[error(
        "idempotency key already used for {} request{}: a retry must repeat its request exactly, \
         and another request needs another key",
        article(.first),
        if .first == .this { " with other parameters".to_owned() } else { format!(", not {}", .this) }
    )]
    IdempotencyConflict {
        /// The kind of call the id was first used for.
        first: &'static str,
        /// The kind of call that reused it.
        this: &'static str,
    },
}

/// "a lease", "an acquire".
fn article(kind: &str) -> String {
    match kind.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {kind}"),
        _ => format!("a {kind}"),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
