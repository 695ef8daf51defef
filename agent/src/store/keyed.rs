//! Records as key-value operations: which store key each record names, how a batch is applied
//! to any ordered key-value map, and how the map is read back as records.
//!
//! Store keys start with one byte naming the kind, so that a kind (or one limit's keys) is a
//! prefix: `a` ack, `b` the boot number, `c` allocation parameters (then the limit), `i` idempotency entry, `k` key
//! (then the limit id, length-prefixed, then the key), `l` lease, `m` meta, `o` the clock
//! correction, `r` the windows a restore closed, `s` slot, `t` bound figures (then the limit,
//! then the window), `v` the configuration version. Ids are big-endian so the map orders them.
//! Values are the records themselves ([`super::codec`]).

use allot_core::budget::PersistRecord;
use allot_core::budget::persist::{LeaseRecord, SlotRecord};
use allot_core::ids::{KeyId, LimitId};
use allot_core::time::WindowIndex;

use super::codec;
use crate::error::{Error, Result};

const ACK: u8 = b'a';
const ALLOCATION: u8 = b'c';
const IDEMPOTENCY: u8 = b'i';
const KEY: u8 = b'k';
const LEASE: u8 = b'l';
const META: &[u8] = b"m";
/// The timebase's correction (`PersistRecord::ClockCorrection`).
const CLOCK_CORRECTION: &[u8] = b"o";
/// The configuration version the state was written under (`PersistRecord::ConfigVersion`).
const CONFIG_VERSION: &[u8] = b"v";
/// The boot number of the start that wrote the state (`PersistRecord::Boot`).
const BOOT: &[u8] = b"b";
/// The latest time a batch was written at (`PersistRecord::TimeSeen`).
const TIME_SEEN: &[u8] = b"n";
const RESTORED: &[u8] = b"r";
const SLOT: u8 = b's';
const STATS: u8 = b't';

/// An ordered key-value map, read.
pub(crate) trait Scan {
    /// Every entry whose key starts with `prefix` (all of them for an empty prefix), in key
    /// order.
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// An ordered key-value map a batch of records can be applied to.
pub(crate) trait Kv: Scan {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<()>;
    fn delete(&mut self, key: &[u8]) -> Result<()>;
}

/// Applies `batch` to `kv` in order.
pub(crate) fn apply(kv: &mut dyn Kv, batch: &[PersistRecord]) -> Result<()> {
    for record in batch {
        apply_one(kv, record)?;
    }
    Ok(())
}

fn apply_one(kv: &mut dyn Kv, record: &PersistRecord) -> Result<()> {
    match record {
        PersistRecord::Reset => {
            for (key, _) in kv.scan(&[])? {
                if key != META {
                    kv.delete(&key)?;
                }
            }
            Ok(())
        }
        PersistRecord::LimitRemoved { limit } => remove_limit(kv, limit),
        _ => match item_key(record) {
            Some(key) if is_tombstone(record) => kv.delete(&key),
            Some(key) => kv.put(key, codec::encode_record(record)?),
            None => Err(Error::Corrupt(format!("{record:?} names no store key"))),
        },
    }
}

/// A record that deletes its key rather than writing it.
fn is_tombstone(record: &PersistRecord) -> bool {
    matches!(
        record,
        PersistRecord::KeyEvicted { .. }
            | PersistRecord::LeaseEnded { .. }
            | PersistRecord::SlotEnded { .. }
            | PersistRecord::ReleaseForgotten { .. }
            | PersistRecord::IdempotencyExpired { .. }
            | PersistRecord::StatsForgotten { .. }
    )
}

/// The one store key a record overwrites or deletes; `None` for a record that acts on many
/// (`Reset`, `LimitRemoved`). Records naming the same key replace one another, and records
/// naming different keys commute, which is what lets a store keep only the last of each.
pub(crate) fn item_key(record: &PersistRecord) -> Option<Vec<u8>> {
    Some(match record {
        PersistRecord::Reset | PersistRecord::LimitRemoved { .. } => return None,
        PersistRecord::Meta(_) => META.to_vec(),
        PersistRecord::Key(r) | PersistRecord::KeyCarried { key: r, .. } => {
            key_key(&r.limit, &r.key)
        }
        PersistRecord::KeyEvicted { limit, key } => key_key(limit, key),
        PersistRecord::Lease(r) => id_key(LEASE, r.lease.0),
        PersistRecord::LeaseEnded { lease } => id_key(LEASE, lease.0),
        PersistRecord::Slot(r) => id_key(SLOT, r.slot.0),
        PersistRecord::SlotEnded { slot } => id_key(SLOT, slot.0),
        PersistRecord::ReleaseAck(a) => id_key(ACK, a.ack.id),
        PersistRecord::ReleaseForgotten { id } => id_key(ACK, *id),
        PersistRecord::Idempotency(i) => idempotency_key(i.request.0),
        PersistRecord::IdempotencyUnfingerprinted(i) => idempotency_key(i.request.0),
        PersistRecord::IdempotencyExpired { request } => idempotency_key(request.0),
        PersistRecord::Stats(s) | PersistRecord::StatsUncharged { stats: s, .. } => {
            stats_key(&s.limit, s.window)
        }
        PersistRecord::StatsForgotten { limit, window } => stats_key(limit, *window),
        PersistRecord::Allocation(a) => kind_limit_prefix(ALLOCATION, &a.limit),
        PersistRecord::RestoredBefore { .. } | PersistRecord::RestoreAwaiting { .. } => {
            RESTORED.to_vec()
        }
        PersistRecord::ClockCorrection(_) => CLOCK_CORRECTION.to_vec(),
        PersistRecord::ConfigVersion { .. } => CONFIG_VERSION.to_vec(),
        PersistRecord::Boot { .. } => BOOT.to_vec(),
        PersistRecord::TimeSeen { .. } => TIME_SEEN.to_vec(),
    })
}

/// A removed limit takes its keys, leases, slots, bound figures and allocation with it.
fn remove_limit(kv: &mut dyn Kv, limit: &LimitId) -> Result<()> {
    kv.delete(&kind_limit_prefix(ALLOCATION, limit))?;
    for prefix in [limit_prefix(limit), stats_prefix(limit)] {
        for (key, _) in kv.scan(&prefix)? {
            kv.delete(&key)?;
        }
    }
    for prefix in [LEASE, SLOT] {
        for (key, value) in kv.scan(&[prefix])? {
            let of_limit = match codec::decode_record(&value)? {
                PersistRecord::Lease(LeaseRecord { limit: l, .. })
                | PersistRecord::Slot(SlotRecord { limit: l, .. }) => l == *limit,
                _ => false,
            };
            if of_limit {
                kv.delete(&key)?;
            }
        }
    }
    Ok(())
}

/// Every record in `kv`, in an order `RegionBudget::restore` accepts: kinds grouped, and
/// idempotency entries by expiry (the order its cache expects them in).
pub(crate) fn load(kv: &dyn Scan) -> Result<Vec<PersistRecord>> {
    let mut records = kv
        .scan(&[])?
        .into_iter()
        .map(|(_, value)| codec::decode_record(&value))
        .collect::<Result<Vec<_>>>()?;
    records.sort_by_key(|r| match r {
        PersistRecord::Idempotency(i) => (true, i.expires_at, i.request),
        PersistRecord::IdempotencyUnfingerprinted(i) => (true, i.expires_at, i.request),
        _ => (false, Default::default(), allot_core::ids::RequestId(0)),
    });
    Ok(records)
}

fn limit_prefix(limit: &LimitId) -> Vec<u8> {
    kind_limit_prefix(KEY, limit)
}

fn stats_prefix(limit: &LimitId) -> Vec<u8> {
    kind_limit_prefix(STATS, limit)
}

fn stats_key(limit: &LimitId, window: WindowIndex) -> Vec<u8> {
    let mut out = stats_prefix(limit);
    out.extend_from_slice(&window.0.to_be_bytes());
    out
}

fn kind_limit_prefix(kind: u8, limit: &LimitId) -> Vec<u8> {
    let name = limit.as_str().as_bytes();
    let mut out = Vec::with_capacity(5 + name.len());
    out.push(kind);
    // Length-prefixed, so that no limit's prefix is another limit's prefix.
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name);
    out
}

fn key_key(limit: &LimitId, key: &KeyId) -> Vec<u8> {
    let mut out = limit_prefix(limit);
    out.extend_from_slice(key.as_str().as_bytes());
    out
}

fn id_key(kind: u8, id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    out
}

fn idempotency_key(id: u128) -> Vec<u8> {
    let mut out = Vec::with_capacity(17);
    out.push(IDEMPOTENCY);
    out.extend_from_slice(&id.to_be_bytes());
    out
}

/// The plain ordered map: the in-memory store, and the overlay a sled batch is built in.
impl Kv for std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<()> {
        self.insert(key, value);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.remove(key);
        Ok(())
    }
}

impl Scan for std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_limit_prefix_never_covers_another_limits_keys() {
        // Without the length prefix, limit "a/x" would be a prefix of limit "a/xy"'s keys.
        let short = limit_prefix(&LimitId::new("a/x"));
        let long_key = key_key(&LimitId::new("a/xy"), &KeyId::new("x=1"));
        assert!(!long_key.starts_with(&short));
    }
}
