//! The crate's one error type.

use std::time::Duration;

/// Everything the harness can fail at. Messages name the thing that failed and, for a process
/// that would not start, the end of its log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read CPU time from {path}: {problem}")]
    ProcStat { path: String, problem: String },
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{what} not found: {hint}")]
    NotFound { what: &'static str, hint: String },
    #[error("{name} was not ready after {waited:?}: {detail}")]
    NotReady {
        name: String,
        waited: Duration,
        detail: String,
    },
    #[error("invalid setting: {0}")]
    Invalid(String),
    #[error("{0}")]
    Failed(String),
}

impl Error {
    /// An IO error with what was being done when it happened.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
