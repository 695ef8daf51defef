//! The regional budget state machine (not yet written).
