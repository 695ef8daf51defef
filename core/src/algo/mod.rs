//! Limiting algorithms, each a small value type driven by `now`.

pub mod concurrency;
pub mod gcra;
