//! allot-agent: the regional daemon beside the gateways.
//!
//! A thin tokio driver over `allot_core::budget::RegionBudget`. Only this crate knows sled.

pub mod error;
pub mod store;

pub use error::{Error, Result};
