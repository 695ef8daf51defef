//! The coordinator's allowance table, rebalancer and bound calculator (not yet written).
