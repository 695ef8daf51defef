//! Concurrency slots: a per-key cap on requests in flight, with a TTL so that the slots of
//! crashed holders come back (`crate::algo::concurrency`). Slots are not per window.

use std::collections::{BTreeMap, BTreeSet};

use super::RegionBudget;
use super::api::{RequestFingerprint, SlotOutcome};
use super::shared::{Dirty, IdBlocks, KeyRef};
use crate::algo::concurrency::{SlotDecision, SlotId};
use crate::error::{Error, Result};
use crate::ids::{KeyId, LimitId, RequestId};
use crate::time::Timestamp;

/// Where a held slot lives, and when it returns by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlotHome {
    pub limit: LimitId,
    pub key: KeyId,
    pub expires_at: Timestamp,
}

/// Every held slot of the region, with an expiry index.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlotTable {
    by_id: BTreeMap<SlotId, SlotHome>,
    expiry: BTreeSet<(Timestamp, SlotId)>,
    /// Next id to hand out; ids are never reused for the life of the region's state.
    pub next_id: u64,
    /// Made durable a block at a time.
    pub ids: IdBlocks,
}

impl SlotTable {
    pub fn iter(&self) -> impl Iterator<Item = (&SlotId, &SlotHome)> {
        self.by_id.iter()
    }

    pub fn get(&self, id: SlotId) -> Option<&SlotHome> {
        self.by_id.get(&id)
    }

    pub fn allocate(&mut self) -> SlotId {
        let id = SlotId(self.next_id.max(1));
        self.next_id = id.0 + 1;
        id
    }

    pub fn insert(&mut self, id: SlotId, home: SlotHome) {
        self.next_id = self.next_id.max(id.0.saturating_add(1));
        let expires_at = home.expires_at;
        if let Some(old) = self.by_id.insert(id, home) {
            self.expiry.remove(&(old.expires_at, id));
        }
        self.expiry.insert((expires_at, id));
    }

    pub fn remove(&mut self, id: SlotId) -> Option<SlotHome> {
        let home = self.by_id.remove(&id)?;
        self.expiry.remove(&(home.expires_at, id));
        Some(home)
    }

    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.expiry.first().map(|(at, _)| *at)
    }

    pub fn due(&self, now: Timestamp) -> Vec<SlotId> {
        self.expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect()
    }

    pub fn remove_limit(&mut self, limit: &LimitId) -> Vec<SlotId> {
        let ids: Vec<SlotId> = self
            .by_id
            .iter()
            .filter(|(_, h)| &h.limit == limit)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.remove(*id);
        }
        ids
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
        self.expiry.clear();
    }
}

impl RegionBudget {
    /// Take a concurrency slot of the key, if the limit caps concurrency and one is free.
    pub fn acquire_slot(
        &mut self,
        now: Timestamp,
        limit: &LimitId,
        key: &KeyId,
        request_id: Option<RequestId>,
    ) -> Result<SlotOutcome> {
        self.saw_time(now);
        let request = request_id.map(|id| {
            let fp = RequestFingerprint::of("acquire_slot").str(limit.as_str());
            (id, fp.str(key.as_str()).finish())
        });
        self.once(now, request, |b| b.acquire_slot_once(now, limit, key))
    }

    fn acquire_slot_once(
        &mut self,
        now: Timestamp,
        limit: &LimitId,
        key: &KeyId,
    ) -> Result<SlotOutcome> {
        let lim = self
            .limits
            .get_mut(limit)
            .ok_or_else(|| Error::UnknownLimit(limit.clone()))?;
        let Some(cap) = lim.params.concurrency.filter(|_| lim.params.spec.enabled) else {
            return Ok(SlotOutcome::Unmetered);
        };
        let shadow = lim.params.spec.shadow_mode;
        let id = self.slots.allocate();
        if self.slots.ids.reserve(id.0) {
            self.dirty.mark(Dirty::Meta);
        }
        let mut touched = Vec::new();
        let res = lim.with_key(
            now,
            key,
            self.cfg.max_keys_per_limit,
            &mut touched,
            |_, ks, stats| {
                let window_stats = stats.window_mut(ks.window);
                let hot = ks.hot_mut();
                let expired = hot.slots.expire(now);
                let outcome = match cap.try_acquire(&mut hot.slots, now, id) {
                    SlotDecision::Acquired { expires_at, .. } => SlotOutcome::Acquired {
                        slot: id,
                        expires_at,
                        shadow_denied: false,
                    },
                    SlotDecision::Full { .. } if shadow => {
                        if let Some(s) = window_stats {
                            s.shadow_denials += 1;
                        }
                        SlotOutcome::Acquired {
                            slot: id,
                            expires_at: now + cap.slot_ttl(),
                            shadow_denied: true,
                        }
                    }
                    SlotDecision::Full {
                        retry_after,
                        in_use,
                    } => {
                        if let Some(s) = window_stats {
                            s.denials += 1;
                        }
                        SlotOutcome::Denied {
                            retry_after,
                            in_use,
                            max_slots: cap.max_slots(),
                        }
                    }
                };
                (outcome, expired)
            },
        );
        self.mark_touched(limit, touched);
        let (outcome, expired) = res?;
        for old in expired {
            self.slots.remove(old);
            self.dirty.mark(Dirty::Slot(old));
        }
        if let SlotOutcome::Acquired {
            slot,
            expires_at,
            shadow_denied: false,
        } = outcome
        {
            let home = SlotHome {
                limit: limit.clone(),
                key: key.clone(),
                expires_at,
            };
            self.slots.insert(slot, home);
            self.dirty.mark(Dirty::Slot(slot));
        }
        self.key_changed(limit, key, false);
        Ok(outcome)
    }

    /// The limit of held slot `slot` (for who may release it).
    pub fn slot_limit(&self, slot: SlotId) -> Option<&LimitId> {
        self.slots.get(slot).map(|home| &home.limit)
    }

    /// Give a slot back. False if it was not held (already released, expired, or a shadow
    /// slot), so a repeated release is harmless.
    pub fn release_slot(&mut self, now: Timestamp, slot: SlotId) -> Result<bool> {
        self.saw_time(now);
        Ok(self.drop_slot(slot))
    }

    pub(crate) fn drop_slot(&mut self, slot: SlotId) -> bool {
        let Some(home) = self.slots.remove(slot) else {
            return false;
        };
        self.dirty.mark(Dirty::Slot(slot));
        let key = KeyRef {
            limit: home.limit,
            key: home.key,
        };
        if let Some(hot) = self
            .limits
            .get_mut(&key.limit)
            .and_then(|l| l.keys.get_mut(key.key.as_str()))
            .and_then(|ks| ks.hot.as_mut())
        {
            hot.slots.release(slot);
        }
        self.dirty.mark(Dirty::Key(key.limit, key.key));
        true
    }
}
