//! The background tasks around the machine: timers (`poll_timeout` / `handle_timeout`, and
//! the SyncUps they produce, sent through the [`SyncLink`] seam), store flushes and checkpoints, and
//! configuration reloads on SIGHUP and on file change. Each stops when `stop` turns true.

use std::sync::Arc;

use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::callers::LiveCallers;
use crate::commit::Ticket;
use crate::error::{Error, Result};
use crate::limits;
use crate::metrics;
use crate::settings::{MAX_LOG_BYTES, MAX_TIMER_SLEEP};
use crate::state::Agent;
use crate::store::{Durability, Store};
use crate::sync_link::SyncLink;

pub async fn timers<L: SyncLink>(agent: Arc<Agent>, mut link: L, mut stop: watch::Receiver<bool>) {
    loop {
        let next = match agent.on_timer().await {
            Ok((next, up)) => {
                if let Some(up) = up
                    && let Err(e) = link.send(up).await
                {
                    tracing::warn!(error = %e, "SyncUp not sent");
                }
                next
            }
            Err(e) => {
                tracing::error!(error = %e, "timer work not persisted");
                None
            }
        };
        let (state, lag) = agent.sync_status();
        metrics::sync_state(state, lag);
        let now = agent.now();
        let sleep = next.map_or(MAX_TIMER_SLEEP, |t| {
            t.saturating_duration_since(now).min(MAX_TIMER_SLEEP)
        });
        agent.timer().set(now + sleep);
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = agent.timer().notify.notified() => {}
            down = link.recv() => {
                if let Some(down) = down
                    && let Err(e) = agent.on_sync_down(down).await
                {
                    tracing::error!(error = %e, "SyncDown not persisted");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Every `flush_interval`, if anything was written since: flush the store's log to the device
/// (in `buffered` mode, what bounds a machine crash's loss). Every `checkpoint_interval`, or
/// sooner once the log passes [`MAX_LOG_BYTES`]: checkpoint (apply the log to the tree, drop it).
pub async fn flushes(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    let settings = agent.settings();
    let mut tick = tokio::time::interval(settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let checkpoint_interval = settings.checkpoint_interval;
    let buffered = settings.durability == Durability::Buffered;
    let mut synced: Option<Ticket> = None;
    let mut checkpointed: Option<Ticket> = None;
    let mut checkpointed_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        // Read first: whatever the flush or checkpoint then covers includes this much.
        let durable = agent.committer().durable();
        // In `sync` mode every write was flushed before its answer already.
        if buffered && synced != Some(durable) {
            match sync(&agent).await {
                Ok(()) => synced = Some(durable),
                Err(e) => store_failed("store log flush", &e),
            }
        }
        let due = checkpointed_at.elapsed() >= checkpoint_interval
            || agent.committer().store().log_bytes() >= MAX_LOG_BYTES;
        if due && checkpointed != Some(durable) {
            match checkpoint(&agent).await {
                Ok(()) => {
                    checkpointed = Some(durable);
                    checkpointed_at = tokio::time::Instant::now();
                }
                Err(e) => store_failed("store checkpoint", &e),
            }
        }
    }
}

fn store_failed(what: &str, e: &Error) {
    metrics::store_error();
    tracing::error!(error = %e, "{what} failed");
}

/// One device flush of the store's log.
async fn sync(agent: &Agent) -> Result<()> {
    off_workers(agent, "flush", |s| s.sync()).await
}

/// One checkpoint.
pub async fn checkpoint(agent: &Agent) -> Result<()> {
    off_workers(agent, "checkpoint", |s| s.checkpoint()).await
}

/// Runs a store operation that waits for the device on a blocking thread, not a worker.
async fn off_workers(agent: &Agent, what: &str, op: fn(&dyn Store) -> Result<()>) -> Result<()> {
    let store = agent.committer().store().clone();
    tokio::task::spawn_blocking(move || op(&*store))
        .await
        .map_err(|e| Error::NotPersisted(format!("{what} task: {e}")))?
}

/// Reloads the limits and the callers file on SIGHUP, and when a file's size or modification
/// time changes.
pub async fn config_reloads(
    agent: Arc<Agent>,
    callers: Arc<LiveCallers>,
    mut hangup: Signal,
    mut stop: watch::Receiver<bool>,
) {
    let files = agent.settings().config_files.clone();
    let mut seen = limits::stamps(&files);
    let mut tick = tokio::time::interval(agent.settings().config_poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                seen = limits::stamps(&files);
                agent.reload("SIGHUP").await;
                callers.reload("SIGHUP");
            }
            _ = tick.tick() => {
                if callers.changed() {
                    callers.reload("file changed");
                }
                if files.is_empty() {
                    continue;
                }
                let now = limits::stamps(&files);
                if now != seen {
                    seen = now;
                    agent.reload("file changed").await;
                }
            }
            _ = stop.changed() => return,
        }
    }
}
