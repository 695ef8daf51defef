//! The building blocks the machine's parts share, kept below all of them so that none imports
//! another for them: the marks of what must be written ([`Dirty`], [`DirtySet`]), the id blocks
//! made durable ahead of use ([`IdBlocks`]), and the name of a key of a limit ([`KeyRef`]).

use std::mem;

use super::config::{ID_BLOCK, MAX_DIRTY_ITEMS};
use crate::algo::concurrency::SlotId;
use crate::ids::{KeyId, LeaseId, LimitId, RequestId};
use crate::time::WindowIndex;

/// A key of a limit, as the sync index names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KeyRef {
    pub limit: LimitId,
    pub key: KeyId,
}

/// Something changed since the last drain.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Dirty {
    Meta,
    Limit(LimitId),
    Key(LimitId, KeyId),
    Lease(LeaseId),
    Slot(SlotId),
    Ack(u64),
    Idempotency(RequestId),
    Stats(LimitId, WindowIndex),
    Allocation(LimitId),
    Restore,
    Clock,
    ConfigVersion,
    Boot,
}

/// The marks, appended per kind (a mark is a push; duplicates go at drain time) and bounded
/// by [`MAX_DIRTY_ITEMS`]: past it, marks are dropped and the next drain is a full snapshot.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirtySet {
    meta: bool,
    limits: Vec<LimitId>,
    keys: Vec<(LimitId, KeyId)>,
    leases: Vec<LeaseId>,
    slots: Vec<SlotId>,
    acks: Vec<u64>,
    idempotency: Vec<RequestId>,
    stats: Vec<(LimitId, WindowIndex)>,
    allocations: Vec<LimitId>,
    restore: bool,
    clock: bool,
    config_version: bool,
    boot: bool,
    /// Marks held, duplicates included.
    len: usize,
    overflowed: bool,
    overflows: u64,
}

impl DirtySet {
    pub fn mark(&mut self, item: Dirty) {
        if self.overflowed {
            return;
        }
        match item {
            Dirty::Meta => self.meta = true,
            Dirty::Limit(l) => self.limits.push(l),
            Dirty::Key(l, k) => self.keys.push((l, k)),
            Dirty::Lease(id) => self.leases.push(id),
            Dirty::Slot(id) => self.slots.push(id),
            Dirty::Ack(id) => self.acks.push(id),
            Dirty::Idempotency(id) => self.idempotency.push(id),
            Dirty::Stats(l, w) => self.stats.push((l, w)),
            Dirty::Allocation(l) => self.allocations.push(l),
            Dirty::Restore => self.restore = true,
            Dirty::Clock => self.clock = true,
            Dirty::ConfigVersion => self.config_version = true,
            Dirty::Boot => self.boot = true,
        }
        self.len += 1;
        if self.len > MAX_DIRTY_ITEMS {
            self.clear();
            self.overflowed = true;
            self.overflows += 1;
        }
    }

    /// Whether marks were dropped since the last drain (the next one must be a snapshot);
    /// if so, starts afresh.
    pub fn take_overflow(&mut self) -> bool {
        if !mem::take(&mut self.overflowed) {
            return false;
        }
        self.clear();
        true
    }

    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    pub fn clear(&mut self) {
        *self = DirtySet {
            overflows: self.overflows,
            ..DirtySet::default()
        };
    }

    /// Every distinct mark, in record order: a removal always precedes what was created
    /// after it (limits before keys), and each kind is sorted.
    pub fn take(&mut self) -> Vec<Dirty> {
        let mut taken = mem::take(self);
        self.overflows = taken.overflows;
        let mut out = Vec::with_capacity(taken.len + 1);
        if taken.meta {
            out.push(Dirty::Meta);
        }
        if taken.restore {
            out.push(Dirty::Restore);
        }
        if taken.clock {
            out.push(Dirty::Clock);
        }
        if taken.config_version {
            out.push(Dirty::ConfigVersion);
        }
        if taken.boot {
            out.push(Dirty::Boot);
        }
        fn sorted<T: Ord>(v: &mut Vec<T>) -> std::vec::Drain<'_, T> {
            v.sort_unstable();
            v.dedup();
            v.drain(..)
        }
        out.extend(sorted(&mut taken.limits).map(Dirty::Limit));
        out.extend(sorted(&mut taken.allocations).map(Dirty::Allocation));
        out.extend(sorted(&mut taken.keys).map(|(l, k)| Dirty::Key(l, k)));
        out.extend(sorted(&mut taken.leases).map(Dirty::Lease));
        out.extend(sorted(&mut taken.slots).map(Dirty::Slot));
        out.extend(sorted(&mut taken.acks).map(Dirty::Ack));
        out.extend(sorted(&mut taken.idempotency).map(Dirty::Idempotency));
        out.extend(sorted(&mut taken.stats).map(|(l, w)| Dirty::Stats(l, w)));
        out
    }
}

/// Lease or slot ids made durable a block at a time ([`ID_BLOCK`]): the meta record holds a
/// bound every id handed out stays below, so that most grants need not write it.
#[derive(Clone, Debug, Default)]
pub(crate) struct IdBlocks {
    /// Ids below it are covered by the last meta record written.
    reserved: u64,
}

impl IdBlocks {
    /// Whether handing out `id` needs the meta record written first (the id reached the
    /// durable bound, which then moves a block ahead).
    pub fn reserve(&mut self, id: u64) -> bool {
        if id < self.reserved {
            return false;
        }
        self.reserved = id.saturating_add(1).saturating_add(ID_BLOCK);
        true
    }

    /// What the meta record holds, for a table whose next id is `next_id`: no id handed out
    /// is at or above it.
    pub fn durable_next_id(&self, next_id: u64) -> u64 {
        next_id.max(self.reserved)
    }
}
