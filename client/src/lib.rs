//! allot-client: the gateway library for Rust services.
//!
//! It will hold lease-backed local spending (nanoseconds per decision), renew/release/settle,
//! adaptive lease sizes, idempotent request ids, concurrency slots, and a tower Layer.
//!
//! Not yet written: see the agent issue (the lease API it calls).
