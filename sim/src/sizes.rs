//! Estimated wire size of sync messages, as the protobuf encoding would make them: each
//! field's payload plus about one byte of tag and one of length per field. An estimate for
//! comparing runs and sizing links, not a promise about the real encoding.

use allot_core::sync::{CounterEntry, CounterRef, SyncDown, SyncUp};

/// Tag and length bytes per field or nested message.
const FIELD_OVERHEAD_BYTES: u64 = 2;
/// A varint-encoded 64-bit number, typically.
const NUMBER_BYTES: u64 = 5;

fn text(s: &str) -> u64 {
    s.len() as u64 + FIELD_OVERHEAD_BYTES
}

fn number() -> u64 {
    NUMBER_BYTES + 1
}

fn counter(c: &CounterRef) -> u64 {
    text(c.limit.as_str()) + text(c.key.as_str()) + number() + FIELD_OVERHEAD_BYTES
}

fn entry(e: &CounterEntry) -> u64 {
    counter(&e.counter) + text(e.region.as_str()) + 2 * number() + FIELD_OVERHEAD_BYTES
}

pub fn sync_up_bytes(m: &SyncUp) -> u64 {
    // A false flag is not on the wire; a true one is a tag and a byte.
    let view_expired = if m.view_expired { 2 } else { 0 };
    let header = text(m.region.as_str()) + 3 * number() + view_expired;
    let entries: u64 = m.entries.iter().map(entry).sum();
    let demand: u64 = m
        .demand
        .iter()
        .map(|d| counter(&d.counter) + 2 * number() + FIELD_OVERHEAD_BYTES)
        .sum();
    let acks: u64 = m
        .release_acks
        .iter()
        .map(|a| counter(&a.counter) + 3 * number() + FIELD_OVERHEAD_BYTES)
        .sum();
    let clock = m.clock.map_or(0, |_| 2 * number() + FIELD_OVERHEAD_BYTES);
    let stats: u64 = m
        .stats
        .iter()
        .map(|st| text(st.limit.as_str()) + 5 * number() + FIELD_OVERHEAD_BYTES)
        .sum();
    header + entries + demand + acks + clock + stats
}

pub fn sync_down_bytes(m: &SyncDown) -> u64 {
    let header = 4 * number();
    let entries: u64 = m.entries.iter().map(entry).sum();
    let grants: u64 = m
        .grants
        .iter()
        .map(|g| {
            counter(&g.counter) + text(g.region.as_str()) + 2 * number() + FIELD_OVERHEAD_BYTES
        })
        .sum();
    let releases: u64 = m
        .release_requests
        .iter()
        .map(|r| counter(&r.counter) + 3 * number() + FIELD_OVERHEAD_BYTES)
        .sum();
    header + entries + grants + releases
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::ids::{KeyId, LimitId, RegionId};
    use allot_core::time::{Timestamp, WindowIndex};

    fn up(entries: usize) -> SyncUp {
        let e = CounterEntry {
            counter: CounterRef {
                limit: LimitId::from("api/tenant"),
                key: KeyId::from("tenant=42"),
                window: WindowIndex(7),
            },
            region: RegionId::from("eu"),
            granted_units: 10,
            refunded_units: 0,
        };
        SyncUp {
            entries: vec![e; entries],
            ..SyncUp::new(RegionId::from("eu"), 1, 1, Timestamp::ZERO, 1)
        }
    }

    #[test]
    fn size_grows_by_one_entry_per_entry() {
        // One entry: limit 10+2, key 9+2, window 6, framing 2 = 31 for the counter; region
        // 2+2, two numbers 12, framing 2: 49 bytes.
        assert_eq!(sync_up_bytes(&up(1)) - sync_up_bytes(&up(0)), 49);
        assert_eq!(sync_up_bytes(&up(3)) - sync_up_bytes(&up(0)), 3 * 49);
    }
}
