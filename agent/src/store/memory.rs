//! An in-memory store, for tests: the same keyed layout as the sled store, kept in a map that
//! outlives the store value, so that "restarting" is opening another store on the same map.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use allot_core::budget::PersistRecord;

use super::{Store, keyed};
use crate::error::Result;

#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    map: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Another store over the same contents, as a restarted agent would open it.
    pub fn reopen(&self) -> MemoryStore {
        self.clone()
    }

    /// A store of its own holding what this one holds now: a backup taken now, to restore
    /// from later.
    pub fn copy(&self) -> MemoryStore {
        MemoryStore {
            map: Arc::new(Mutex::new(self.map().clone())),
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // A panic while holding the lock cannot leave the map half-written in a way that
        // matters more than the panic itself: keep going with what is there.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn write(&self, batch: &[PersistRecord]) -> Result<()> {
        keyed::apply(&mut *self.map(), batch)
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn checkpoint(&self) -> Result<()> {
        Ok(())
    }

    fn log_bytes(&self) -> u64 {
        0
    }

    fn load(&self) -> Result<Vec<PersistRecord>> {
        keyed::load(&*self.map())
    }
}
