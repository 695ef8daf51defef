//! Limiting algorithms, each a small value type driven by `now`.

pub mod concurrency;
mod decision;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_window;

pub use decision::Decision;
