//! allot-agent: the regional daemon beside the gateways.
//!
//! It will be a thin tokio driver over `allot_core::budget::RegionBudget`: tonic services for
//! the lease API and Envoy's RLS v3 and RLQS, an admin HTTP surface (`/metrics`, `/healthz`,
//! `/readyz`), sled persistence behind a storage trait, and the sync stream to the coordinator.
//! Only this crate knows sled.
//!
//! Not yet written: see the agent issue.
