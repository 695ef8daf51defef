//! Limits configuration (not yet written).

/// Every problem found while loading configuration files.
#[derive(Debug, Default, thiserror::Error)]
#[error("configuration errors")]
pub struct ConfigErrors(pub Vec<String>);
