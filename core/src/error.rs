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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
