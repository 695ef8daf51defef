//! The one error type of allot-agent. Service code turns it into `tonic::Status`; nothing else
//! in the crate knows gRPC status codes.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The budget machine refused the call (unknown lease, invalid request, too many keys...).
    #[error(transparent)]
    Core(#[from] allot_core::Error),
    /// A request the agent will not look at: empty domain, too many descriptors, an entry
    /// too long, a negative hit count...
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Reading or writing a file of the data directory.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A stored record that does not decode: the data directory was damaged or written by an
    /// incompatible version.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The state an answer depends on could not be made durable, so the answer is withheld.
    #[error("state could not be persisted: {0}")]
    NotPersisted(String),
    /// Limits files that do not load (every problem, one per line).
    #[error("limits configuration:\n{0}")]
    Config(String),
    /// Settings that cannot work (flags, environment).
    #[error("invalid settings: {0}")]
    Settings(String),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
