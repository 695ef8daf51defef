//! The coordinator's side of allot: the replicated allowance table, the rebalancer that runs on
//! the raft leader, and the over-admission bound.
//!
//! Deterministic like the rest of the core: no IO, no clock (time comes in as `now`), no
//! HashMap order in any output. See `docs/rebalance.md` for the protocol and `docs/bound.md`
//! for the derivation of the bound.
//!
//! - [`table`]: [`AllowanceTable`], mutated only by [`TableCommand`]s (the raft state machine);
//!   it refuses any command that would let the allowances of a counter sum above `L`.
//! - [`coordinator`]: [`Coordinator`], the leader's soft state: regions' views, demand, acks;
//!   proposes commands and answers SyncUps from committed state only.
//! - [`plan`] and [`waterfill`]: the pure per-counter decision (weighted max-min fair shares).
//! - [`bound`]: [`bound()`], the bound as named terms.

pub mod bound;
pub mod coordinator;
pub mod plan;
pub mod reload;
pub mod table;
pub mod waterfill;

mod hashed;
mod views;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

pub use bound::{Bound, BoundInputs, BoundTerm, OlderTerms, RegionBoundStats, bound};
pub use coordinator::{
    CLOCK_FRAME_INTERVAL, Coordinator, CoordinatorConfig, MAX_PROPOSALS_PER_POLL,
    RELEASE_HANDOFF_SYNC_INTERVALS, RecordedBoots, RegionBoots,
};
pub use table::{
    AllowanceRow, AllowanceTable, AllowanceTableV1, AllowanceTableV2, ApplyOutcome, MAX_TABLE_ROWS,
    PendingRelease, Reclaim, RejectReason, Removal, TableCommand,
};
pub use views::RETIRED_BOOTS_KEPT;
