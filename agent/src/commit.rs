//! Group commit: persistence before answers (invariant 6) at the cost of one store write per
//! burst of concurrent calls, not one per call.
//!
//! Calls append the records they produced to one queue while they still hold the budget lock,
//! so the queue is in the machine's order, and get a ticket. Then each waits until its ticket
//! is durable. The first waiter to find no write in progress becomes the writer: it takes
//! everything queued (its own records and those of every call that arrived meanwhile), writes
//! it as one batch, publishes the new durable ticket and wakes the others. With one caller
//! this is one inline write and no hand-off to another task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use allot_core::budget::PersistRecord;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::metrics;
use crate::settings::MAX_PENDING_RECORDS;
use crate::store::{Store, WriteOwned};

/// A place in the write order: durable once the committer's durable ticket reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

pub struct Committer {
    store: Arc<dyn Store>,
    queue: Mutex<Queue>,
    /// One writer at a time, so batches reach the store in queue order.
    writer: tokio::sync::Mutex<()>,
    durable: AtomicU64,
    written: Notify,
    /// Store writes that block for a device flush leave the runtime's worker first.
    blocking_writes: bool,
    counters: metrics::StoreCounters,
}

#[derive(Default)]
struct Queue {
    records: Vec<PersistRecord>,
    last: u64,
    /// Records were dropped (the store kept failing): the next append must be a snapshot.
    needs_snapshot: bool,
}

impl Committer {
    pub fn new(store: Arc<dyn Store>, blocking_writes: bool) -> Self {
        Committer {
            store,
            queue: Mutex::new(Queue::default()),
            writer: tokio::sync::Mutex::new(()),
            durable: AtomicU64::new(0),
            written: Notify::new(),
            blocking_writes,
            counters: metrics::StoreCounters::default(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Queues `records` (call with the budget lock held). `snapshot` is asked for instead
    /// when earlier records had to be dropped. The ticket also covers everything queued
    /// before, so a call that changed nothing still waits for the state it read.
    pub fn append(
        &self,
        records: Vec<PersistRecord>,
        snapshot: impl FnOnce() -> Vec<PersistRecord>,
    ) -> Ticket {
        let mut q = self.queue();
        if q.needs_snapshot {
            q.needs_snapshot = false;
            q.records = snapshot();
            q.last += 1;
        } else if !records.is_empty() {
            q.records.extend(records);
            q.last += 1;
        }
        Ticket(q.last)
    }

    /// Returns once everything up to `ticket` is in the store, writing it if no one else is.
    pub async fn wait(&self, ticket: Ticket) -> Result<()> {
        loop {
            if self.is_durable(ticket) {
                return Ok(());
            }
            // The common case, no write in progress: write inline, no waiter registered.
            if let Ok(_writing) = self.writer.try_lock() {
                self.write_queued()?;
                continue;
            }
            let written = self.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            // The writer may have finished before this waiter was registered, and would not
            // wake it: look again before sleeping.
            if self.is_durable(ticket) {
                return Ok(());
            }
            match self.writer.try_lock() {
                Ok(_writing) => self.write_queued()?,
                Err(_) => written.await,
            }
        }
    }

    /// Writes everything queued now (the timer task and shutdown use it).
    pub async fn flush(&self) -> Result<()> {
        let ticket = Ticket(self.queue().last);
        self.wait(ticket).await
    }

    /// The last ticket known durable: unchanged means nothing was written since.
    pub fn durable(&self) -> Ticket {
        Ticket(self.durable.load(Ordering::Acquire))
    }

    fn is_durable(&self, ticket: Ticket) -> bool {
        self.durable.load(Ordering::Acquire) >= ticket.0
    }

    fn write_queued(&self) -> Result<()> {
        let (batch, upto) = {
            let mut q = self.queue();
            (std::mem::take(&mut q.records), q.last)
        };
        let result = if batch.is_empty() {
            Ok(())
        } else {
            self.counters.batch(batch.len());
            self.write(batch)
        };
        match result {
            Ok(()) => {
                self.durable.fetch_max(upto, Ordering::AcqRel);
                self.written.notify_waiters();
                Ok(())
            }
            Err((e, batch)) => {
                metrics::store_error();
                tracing::error!(error = %e, "store write failed; answers wait for it");
                self.requeue(batch);
                self.written.notify_waiters();
                Err(Error::NotPersisted(e.to_string()))
            }
        }
    }

    fn write(&self, batch: Vec<PersistRecord>) -> WriteOwned {
        let in_worker = self.blocking_writes
            && Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        if in_worker {
            tokio::task::block_in_place(|| self.store.write_owned(batch))
        } else {
            self.store.write_owned(batch)
        }
    }

    /// Puts a batch that failed back at the front, in order; past the bound, drops it all
    /// and asks the next append for a snapshot.
    fn requeue(&self, mut batch: Vec<PersistRecord>) {
        let mut q = self.queue();
        batch.append(&mut q.records);
        if batch.len() > MAX_PENDING_RECORDS {
            q.records.clear();
            q.needs_snapshot = true;
        } else {
            q.records = batch;
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // The queue is only pushed to and taken from; a panic cannot leave it inconsistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use allot_core::budget::persist::MetaRecord;

    use super::*;
    use crate::store::MemoryStore;

    fn meta(n: u64) -> PersistRecord {
        PersistRecord::Meta(MetaRecord {
            next_lease_id: n,
            next_slot_id: 0,
            next_seq: 0,
        })
    }

    #[tokio::test]
    async fn a_waiter_returns_only_once_its_records_are_stored() {
        let store = MemoryStore::new();
        let c = Committer::new(Arc::new(store.clone()), false);
        let ticket = c.append(vec![meta(1)], Vec::new);
        assert!(
            store.load().expect("load").is_empty(),
            "queued, not yet written"
        );
        c.wait(ticket).await.expect("written");
        assert_eq!(store.load().expect("load"), vec![meta(1)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_writes_and_keep_the_queue_order() {
        let store = MemoryStore::new();
        let c = Arc::new(Committer::new(Arc::new(store.clone()), true));
        let mut tasks = Vec::new();
        for n in 1..=50 {
            let ticket = c.append(vec![meta(n)], Vec::new);
            let c = c.clone();
            tasks.push(tokio::spawn(async move { c.wait(ticket).await }));
        }
        for t in tasks {
            t.await.expect("joined").expect("written");
        }
        // Meta records overwrite one another: the last queued is the one left.
        assert_eq!(store.load().expect("load"), vec![meta(50)]);
    }
}
