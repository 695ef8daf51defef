//! allot-bench: the benchmark harness for the daemons (gRPC load generator, Redis baseline).
//!
//! Micro-benchmarks of the core live in `core/benches` (criterion). This crate will hold the
//! end-to-end harness that measures the agent against a no-op tonic server and Redis.
//!
//! Not yet written: see the agent issue.
