//! allot-sim: the deterministic chaos and partition simulator.
//!
//! It will drive the real core state machines (`allot_core::budget`, `allot_core::rebalance`)
//! over seeded traffic and faults on a virtual clock, check the invariants of the design after
//! every event, and report overshoot against the stated bound. Any failure replays from its seed.
//!
//! Not yet written: see the simulator issue.
