//! The one error type of allot-sim.

use std::fmt;
use std::path::PathBuf;

/// A bad input in a scenario file, located precisely enough to fix it without searching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// 1-based line, as editors count.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Dotted path of the field, e.g. `regions[1].clock.offset`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file, self.line, self.column, self.field, self.message
        )
    }
}

impl std::error::Error for ScenarioError {}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Scenario(#[from] ScenarioError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad seed range {0:?}: expected A..B with A < B, or a single seed")]
    SeedRange(String),
    /// A run outgrew one of the simulator's bounds; the scenario must be made smaller.
    #[error("scenario {scenario}, seed {seed}: {what} exceeded its bound of {bound}")]
    Bound {
        scenario: String,
        seed: u64,
        what: &'static str,
        bound: usize,
    },
    #[error(transparent)]
    Core(#[from] allot_core::Error),
    #[error("plot: {0}")]
    Plot(String),
    #[error("report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("a simulation thread panicked")]
    ThreadPanicked,
}

pub type Result<T, E = SimError> = std::result::Result<T, E>;
