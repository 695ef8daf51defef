//! Support for the end-to-end tests: three real `RegionBudget`s and one real `Coordinator`
//! over a faulty network on one virtual clock, a model of what every gateway call must have
//! charged, and the invariants checked after every step.

pub mod calls;
pub mod checks;
pub mod model;
pub mod network;
pub mod setup;
pub mod trace;
pub mod world;
