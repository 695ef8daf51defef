//! The one error type of allot-client.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client's settings cannot work (the problem named).
    #[error("invalid client config: {0}")]
    Config(String),
    /// The gateway state machine refused (a bad gateway config, too many keys).
    #[error(transparent)]
    Core(#[from] allot_core::Error),
    /// A call's axes that cannot be decided as one (too many, a key twice).
    #[error("invalid axes: {0}")]
    Axes(String),
    /// The agent's address is not a URI the transport accepts.
    #[error("invalid agent address {address}: {reason}")]
    Address { address: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
