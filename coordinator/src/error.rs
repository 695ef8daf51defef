//! The one error type of allot-coordinator. At the openraft boundary it becomes a
//! `StorageError` (store/), which stops the raft node: a node that cannot read or write its
//! own log must not vote or serve.

use std::path::PathBuf;

use allot_core::rebalance::RejectReason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening the data directory.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A stored record that does not decode: the data directory was damaged or written by an
    /// incompatible version.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// A record that does not encode (a value serde cannot represent).
    #[error("cannot encode {what}: {detail}")]
    Encode { what: &'static str, detail: String },
    /// The allowance table broke invariant 2 (allowances of a strict counter summing above
    /// its quota) after a committed entry: the node stops applying rather than grant from it.
    #[error("the allowance table broke its invariant: {reason}")]
    Invariant { reason: RejectReason },
    /// openraft failed to start or stop, or the raft server failed.
    #[error("raft: {0}")]
    Raft(String),
    /// Raft settings that cannot work.
    #[error("invalid raft settings: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(what: &'static str, detail: impl std::fmt::Display) -> Self {
        Error::Corrupt {
            what,
            detail: detail.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
