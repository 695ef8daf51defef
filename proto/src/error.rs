//! The crate's one error type: a wire message that does not convert to a core type.

/// What is wrong with a received message, and where (`entries[3].counter.limit`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{0}: required field missing")]
    Missing(String),
    #[error("{field}: {problem}")]
    OutOfRange { field: String, problem: String },
    /// Bytes that are not a protobuf message of the expected type.
    #[error("not a valid message: {0}")]
    Malformed(String),
    /// Transport security: a certificate, key or CA file, or a peer's certificate.
    #[error("TLS: {0}")]
    Tls(String),
}

impl WireError {
    pub(crate) fn out_of_range(field: impl Into<String>, problem: impl Into<String>) -> Self {
        WireError::OutOfRange {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The same error, one level further out: `counter.limit` within `entries[3]`.
    pub(crate) fn within(self, outer: impl std::fmt::Display) -> Self {
        match self {
            WireError::Missing(f) => WireError::Missing(format!("{outer}.{f}")),
            WireError::OutOfRange { field, problem } => WireError::OutOfRange {
                field: format!("{outer}.{field}"),
                problem,
            },
            WireError::Malformed(m) => WireError::Malformed(m),
            WireError::Tls(m) => WireError::Tls(m),
        }
    }
}
