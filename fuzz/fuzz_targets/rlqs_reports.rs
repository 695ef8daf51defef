//! Envoy's RLQS usage reports as a stream brings them: each message decoded as the gRPC
//! server decodes it and served by the agent's own stream task (`rlqs::stream::serve`), which
//! maps buckets to rules, sizes assignments, takes leases and answers. One fresh agent per
//! input (in-memory store, manual clock, the embedded default limits: domain `default`, keys
//! `remote_address` and `generic_key`); every answer is read, and the stream ends with the
//! input (or earlier, with the error status the agent sends).
//!
//! Input: up to `MAX_MESSAGES` messages, each `step: u8 | len: u16 LE | body`; `step` moves
//! the agent's clock by that many 100 ms before the message.

#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use allot_agent::rlqs::stream::{Shared, serve};
use allot_proto::envoy::rlqs::RateLimitQuotaUsageReports;
use common::STEP;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokio::sync::mpsc;

/// Most messages one input sends.
const MAX_MESSAGES: usize = 16;

fuzz_target!(|data: &[u8]| {
    let (runtime, agent, cell) = common::agent();
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    for (step, body) in common::frames(data, MAX_MESSAGES) {
        // An undecodable message never reaches the service: tonic ends the stream.
        let Ok(message) = RateLimitQuotaUsageReports::decode(body) else {
            break;
        };
        let _ = reports_tx.send((u64::from(step), message));
    }
    drop(reports_tx);
    // The clock moves as each message is taken, before the stream task sees it.
    let reports = tokio_stream::wrappers::UnboundedReceiverStream::new(reports_rx);
    let reports = tokio_stream::StreamExt::map(reports, move |(step, message)| {
        cell.fetch_add(STEP.as_nanos() as u64 * step, Ordering::Relaxed);
        Ok(message)
    });
    let shared = Shared {
        agent,
        agent_buckets: Arc::new(AtomicUsize::new(0)),
        learned_interval_ms: Arc::new(AtomicU64::new(0)),
        caller: None,
    };
    let (out_tx, mut out_rx) = mpsc::channel(4);
    runtime.block_on(async move {
        let answers = async move { while out_rx.recv().await.is_some() {} };
        tokio::join!(serve(shared, Box::pin(reports), out_tx), answers);
    });
});
