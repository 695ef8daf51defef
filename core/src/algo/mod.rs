//! Limiting algorithms, each a small value type driven by `now`.

mod decision;
pub mod fixed_window;
pub mod gcra;

pub use decision::Decision;
