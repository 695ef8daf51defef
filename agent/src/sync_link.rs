//! The seam for the coordinator stream: the timer task hands every `SyncUp` the machine
//! produces to a [`SyncLink`] (after its records are durable) and feeds back what the link
//! receives. The stream itself comes with the coordinator; until then an agent runs single
//! region with [`NoCoordinator`], whose machine never produces a SyncUp.

use std::future::Future;

use allot_core::sync::{SyncDown, SyncUp};

use crate::error::Result;

pub trait SyncLink: Send + 'static {
    /// Sends one SyncUp. Called only once the records it depends on are durable.
    fn send(&mut self, up: SyncUp) -> impl Future<Output = Result<()>> + Send;

    /// The next SyncDown; pending until there is one.
    fn recv(&mut self) -> impl Future<Output = Option<SyncDown>> + Send;
}

/// Single-region mode: nothing to send to, nothing ever received.
#[derive(Debug, Default)]
pub struct NoCoordinator;

impl SyncLink for NoCoordinator {
    async fn send(&mut self, up: SyncUp) -> Result<()> {
        tracing::debug!(seq = up.seq, "no coordinator: SyncUp dropped");
        Ok(())
    }

    async fn recv(&mut self) -> Option<SyncDown> {
        std::future::pending().await
    }
}
