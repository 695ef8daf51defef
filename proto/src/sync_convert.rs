//! `allot.sync.v1` <-> `allot_core::sync`, in one place for both ends of the stream.
//!
//! Core to wire never fails. Wire to core checks everything a peer could get wrong: a required
//! message that is absent, an empty region or limit name, a list longer than the core's
//! per-message bound ([`MAX_ITEMS_PER_MESSAGE`]), a sub-second field of a second or more. The
//! error names the field (`entries[3].counter.limit`). The stream has no enums, so there is no
//! unknown value to refuse; a new field is one line each way here.

use std::time::Duration;

use allot_core::ids::{Epoch, KeyId, LimitId, RegionId};
use allot_core::sync::{
    AllowanceGrant, BoundFigures, ClockGuard, ClockSample, ConfigFile, ConfigFiles, CounterEntry,
    CounterRef, DemandReport, LimitWindowStats, MAX_ITEMS_PER_MESSAGE, ReleaseAck, ReleaseRequest,
    SyncDown, SyncUp,
};
use allot_core::time::{Timestamp, WindowIndex, duration_nanos};

use crate::error::WireError;
use crate::sync::v1 as pb;

/// Largest encoded sync message either end decodes: the per-message item bound times a
/// generous size per item (ids of a few hundred bytes), with room to spare.
pub const MAX_SYNC_MESSAGE_BYTES: usize = 16 << 20;

/// Metadata key of a status refusing a stream that names the leader (`host:port`), for a node
/// that refuses the stream outright rather than answering `NotLeader` on it.
pub const LEADER_METADATA_KEY: &str = "allot-leader";
/// Metadata key of the same status naming the leader's raft id (decimal), as `NotLeader`'s
/// `leader_node_id` does: an agent with an address of its own for that node goes there.
pub const LEADER_ID_METADATA_KEY: &str = "allot-leader-id";

const NANOS_PER_SEC: u32 = 1_000_000_000;

type Result<T> = std::result::Result<T, WireError>;

// ---- core -> wire -------------------------------------------------------------------------

pub fn sync_up_to_wire(up: SyncUp) -> pb::SyncUp {
    pb::SyncUp {
        region: up.region.as_str().to_owned(),
        boot: up.boot,
        seq: up.seq,
        sent_at_unix_nanos: up.sent_at.as_unix_nanos(),
        config_version: up.config_version,
        entries: up.entries.into_iter().map(entry_to_wire).collect(),
        demand: up.demand.into_iter().map(demand_to_wire).collect(),
        release_acks: up.release_acks.into_iter().map(ack_to_wire).collect(),
        clock: up.clock.map(|c| pb::ClockSample {
            offset_nanos: c.offset_nanos,
            round_trip_nanos: c.round_trip_nanos,
        }),
        clock_leader_term: up.clock_leader_term,
        stats: up.stats.into_iter().map(stats_to_wire).collect(),
        view_expired: up.view_expired,
        restored: up.restored,
        clock_guard: up.clock_guard.map(|g| pb::ClockGuard {
            since_unix_nanos: g.since.as_unix_nanos(),
            max_uncertainty_nanos: duration_nanos(g.max_uncertainty),
        }),
    }
}

pub fn sync_down_to_wire(down: SyncDown) -> pb::SyncDown {
    pb::SyncDown {
        reply_to_seq: down.reply_to_seq,
        leader_term: down.leader_term,
        received_at_unix_nanos: down.received_at.as_unix_nanos(),
        sent_at_unix_nanos: down.sent_at.as_unix_nanos(),
        config_version: down.config_version,
        entries: down.entries.into_iter().map(entry_to_wire).collect(),
        grants: down.grants.into_iter().map(grant_to_wire).collect(),
        release_requests: down
            .release_requests
            .into_iter()
            .map(release_to_wire)
            .collect(),
        known_region: down.known_region,
        config: down.config.map(config_to_wire),
        below_default_left: down.below_default_left,
        earlier_boot_clock_reach_unix_nanos: down
            .earlier_boot_clock_reach
            .map(Timestamp::as_unix_nanos),
    }
}

pub fn config_to_wire(c: ConfigFiles) -> pb::ConfigFiles {
    pb::ConfigFiles {
        version: c.version,
        merge_domains: c.merge_domains,
        files: c
            .files
            .into_iter()
            .map(|f| pb::ConfigFile {
                name: f.name,
                text: f.text,
            })
            .collect(),
    }
}

fn counter_to_wire(c: CounterRef) -> Option<pb::CounterRef> {
    Some(pb::CounterRef {
        limit: c.limit.as_str().to_owned(),
        key: c.key.as_str().to_owned(),
        window: c.window.0,
    })
}

fn entry_to_wire(e: CounterEntry) -> pb::CounterEntry {
    pb::CounterEntry {
        counter: counter_to_wire(e.counter),
        region: e.region.as_str().to_owned(),
        granted_units: e.granted_units,
        refunded_units: e.refunded_units,
    }
}

fn demand_to_wire(d: DemandReport) -> pb::DemandReport {
    pb::DemandReport {
        counter: counter_to_wire(d.counter),
        demand_micro_units_per_sec: d.demand_micro_units_per_sec,
        allowance_units: d.allowance_units,
    }
}

fn ack_to_wire(a: ReleaseAck) -> pb::ReleaseAck {
    pb::ReleaseAck {
        id: a.id,
        counter: counter_to_wire(a.counter),
        released_units: a.released_units,
        allowance_after_units: a.allowance_after_units,
    }
}

fn stats_to_wire(s: LimitWindowStats) -> pb::LimitWindowStats {
    let f = s.figures;
    pb::LimitWindowStats {
        limit: s.limit.as_str().to_owned(),
        window: s.window.0,
        figures: Some(pb::BoundFigures {
            time_open_secs: f.time_open.as_secs(),
            time_open_subsec_nanos: f.time_open.subsec_nanos(),
            fail_open_units: f.fail_open_units,
            settle_overage_units: f.settle_overage_units,
            peak_grant_units_per_sec: f.peak_grant_units_per_sec,
            settle_clamped_units: f.settle_clamped_units,
            uncharged_units: f.uncharged_units,
        }),
    }
}

fn grant_to_wire(g: AllowanceGrant) -> pb::AllowanceGrant {
    pb::AllowanceGrant {
        counter: counter_to_wire(g.counter),
        region: g.region.as_str().to_owned(),
        allowance_units: g.allowance_units,
        epoch: g.epoch.0,
    }
}

fn release_to_wire(r: ReleaseRequest) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        id: r.id,
        counter: counter_to_wire(r.counter),
        units: r.units,
        epoch: r.epoch.0,
    }
}

// ---- wire -> core -------------------------------------------------------------------------

pub fn sync_up_from_wire(up: pb::SyncUp) -> Result<SyncUp> {
    let from = region(up.region, "region")?;
    let mut ids = SharedIds::default();
    ids.regions.push(from.clone());
    let entries = list(up.entries, "entries", |e| {
        entry_from_wire_shared(e, &mut ids)
    })?;
    // A counter often sits at the same position of entries and demand (only a fast path).
    let mut at = 0;
    let demand = list(up.demand, "demand", |d| {
        let same_as = entries.get(at).map(|e| &e.counter);
        at += 1;
        demand_from_wire_shared(d, &mut ids, same_as)
    })?;
    Ok(SyncUp {
        region: from,
        boot: up.boot,
        seq: up.seq,
        sent_at: Timestamp::from_unix_nanos(up.sent_at_unix_nanos),
        config_version: up.config_version,
        entries,
        demand,
        release_acks: list(up.release_acks, "release_acks", ack_from_wire)?,
        clock: up.clock.map(|c| ClockSample {
            offset_nanos: c.offset_nanos,
            round_trip_nanos: c.round_trip_nanos,
        }),
        clock_leader_term: up.clock_leader_term,
        stats: list(up.stats, "stats", stats_from_wire)?,
        view_expired: up.view_expired,
        restored: up.restored,
        clock_guard: up.clock_guard.map(|g| ClockGuard {
            since: Timestamp::from_unix_nanos(g.since_unix_nanos),
            max_uncertainty: Duration::from_nanos(g.max_uncertainty_nanos),
        }),
    })
}

pub fn sync_down_from_wire(down: pb::SyncDown) -> Result<SyncDown> {
    Ok(SyncDown {
        reply_to_seq: down.reply_to_seq,
        leader_term: down.leader_term,
        received_at: Timestamp::from_unix_nanos(down.received_at_unix_nanos),
        sent_at: Timestamp::from_unix_nanos(down.sent_at_unix_nanos),
        config_version: down.config_version,
        entries: list(down.entries, "entries", entry_from_wire)?,
        grants: list(down.grants, "grants", grant_from_wire)?,
        release_requests: list(down.release_requests, "release_requests", release_from_wire)?,
        known_region: down.known_region,
        below_default_left: down.below_default_left,
        earlier_boot_clock_reach: down
            .earlier_boot_clock_reach_unix_nanos
            .map(Timestamp::from_unix_nanos),
        config: down
            .config
            .map(config_from_wire)
            .transpose()
            .map_err(|e| e.within("config"))?,
    })
}

/// Refuses version 0, no file, a file without a name, and more files or text than a
/// configuration may hold; the texts are loaded (and their YAML checked) by the receiver.
pub fn config_from_wire(c: pb::ConfigFiles) -> Result<ConfigFiles> {
    if c.version == 0 {
        return Err(WireError::out_of_range("version", "must be above 0"));
    }
    let files = ConfigFiles {
        version: c.version,
        merge_domains: c.merge_domains,
        files: c
            .files
            .into_iter()
            .map(|f| ConfigFile {
                name: f.name,
                text: f.text,
            })
            .collect(),
    };
    files
        .check_size()
        .map_err(|problem| WireError::out_of_range("files", problem))?;
    Ok(files)
}

/// Converts every item, refusing a list longer than the core ever sends in one message.
fn list<W, C>(
    items: Vec<W>,
    name: &str,
    mut convert: impl FnMut(W) -> Result<C>,
) -> Result<Vec<C>> {
    if items.len() > MAX_ITEMS_PER_MESSAGE {
        return Err(WireError::out_of_range(
            name,
            format!(
                "{} items, more than the {MAX_ITEMS_PER_MESSAGE} one message may carry",
                items.len()
            ),
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, w)| convert(w).map_err(|e| e.within(format_args!("{name}[{i}]"))))
        .collect()
}

fn non_empty(s: String, field: &str) -> Result<String> {
    if s.is_empty() {
        return Err(WireError::out_of_range(field, "must not be empty"));
    }
    Ok(s)
}

fn region(s: String, field: &str) -> Result<RegionId> {
    non_empty(s, field).map(RegionId::new)
}

fn limit(s: String, field: &str) -> Result<LimitId> {
    non_empty(s, field).map(LimitId::new)
}

fn counter_from_wire(c: Option<pb::CounterRef>) -> Result<CounterRef> {
    let c = c.ok_or_else(|| WireError::Missing("counter".to_owned()))?;
    Ok(CounterRef {
        limit: limit(c.limit, "counter.limit")?,
        // An empty key is a real key: a rule whose descriptor names no value.
        key: KeyId::new(c.key),
        window: WindowIndex(c.window),
    })
}

fn entry_from_wire(e: pb::CounterEntry) -> Result<CounterEntry> {
    Ok(CounterEntry {
        counter: counter_from_wire(e.counter)?,
        region: region(e.region, "region")?,
        granted_units: e.granted_units,
        refunded_units: e.refunded_units,
    })
}

/// Most distinct limits and regions [`SharedIds`] keeps per message; names beyond them are
/// decoded each on its own (as before), so a message naming many costs no more to decode.
const SHARED_IDS_KEPT: usize = 8;

/// The ids one SyncUp repeats, decoded to one shared string each: a SyncUp names the same
/// few limits and regions thousands of times, and each counter twice (its entry and its
/// demand); a string allocated per name was much of its decoding (docs/benchmarks.md,
/// "Leader cost per sync round"). What is decoded is the same either way.
#[derive(Default)]
struct SharedIds {
    limits: Vec<LimitId>,
    regions: Vec<RegionId>,
}

impl SharedIds {
    fn limit(&mut self, s: String, field: &str) -> Result<LimitId> {
        let s = non_empty(s, field)?;
        if let Some(l) = self.limits.iter().find(|l| l.as_str() == s) {
            return Ok(l.clone());
        }
        let l = LimitId::new(s);
        if self.limits.len() < SHARED_IDS_KEPT {
            self.limits.push(l.clone());
        }
        Ok(l)
    }

    fn region(&mut self, s: String, field: &str) -> Result<RegionId> {
        let s = non_empty(s, field)?;
        if let Some(r) = self.regions.iter().find(|r| r.as_str() == s) {
            return Ok(r.clone());
        }
        let r = RegionId::new(s);
        if self.regions.len() < SHARED_IDS_KEPT {
            self.regions.push(r.clone());
        }
        Ok(r)
    }

    /// A counter, sharing the key of `same_as` when it names the same one.
    fn counter(
        &mut self,
        c: Option<pb::CounterRef>,
        same_as: Option<&CounterRef>,
    ) -> Result<CounterRef> {
        let c = c.ok_or_else(|| WireError::Missing("counter".to_owned()))?;
        let key = match same_as {
            Some(same) if same.key.as_str() == c.key => same.key.clone(),
            // An empty key is a real key: a rule whose descriptor names no value.
            _ => KeyId::new(c.key),
        };
        Ok(CounterRef {
            limit: self.limit(c.limit, "counter.limit")?,
            key,
            window: WindowIndex(c.window),
        })
    }
}

fn entry_from_wire_shared(e: pb::CounterEntry, ids: &mut SharedIds) -> Result<CounterEntry> {
    Ok(CounterEntry {
        counter: ids.counter(e.counter, None)?,
        region: ids.region(e.region, "region")?,
        granted_units: e.granted_units,
        refunded_units: e.refunded_units,
    })
}

fn demand_from_wire_shared(
    d: pb::DemandReport,
    ids: &mut SharedIds,
    same_as: Option<&CounterRef>,
) -> Result<DemandReport> {
    Ok(DemandReport {
        counter: ids.counter(d.counter, same_as)?,
        demand_micro_units_per_sec: d.demand_micro_units_per_sec,
        allowance_units: d.allowance_units,
    })
}

fn ack_from_wire(a: pb::ReleaseAck) -> Result<ReleaseAck> {
    Ok(ReleaseAck {
        id: a.id,
        counter: counter_from_wire(a.counter)?,
        released_units: a.released_units,
        allowance_after_units: a.allowance_after_units,
    })
}

fn stats_from_wire(s: pb::LimitWindowStats) -> Result<LimitWindowStats> {
    let f = s
        .figures
        .ok_or_else(|| WireError::Missing("figures".to_owned()))?;
    if f.time_open_subsec_nanos >= NANOS_PER_SEC {
        return Err(WireError::out_of_range(
            "figures.time_open_subsec_nanos",
            format!("{} is not below one second", f.time_open_subsec_nanos),
        ));
    }
    Ok(LimitWindowStats {
        limit: limit(s.limit, "limit")?,
        window: WindowIndex(s.window),
        figures: BoundFigures {
            time_open: Duration::new(f.time_open_secs, f.time_open_subsec_nanos),
            fail_open_units: f.fail_open_units,
            settle_overage_units: f.settle_overage_units,
            peak_grant_units_per_sec: f.peak_grant_units_per_sec,
            settle_clamped_units: f.settle_clamped_units,
            uncharged_units: f.uncharged_units,
        },
    })
}

fn grant_from_wire(g: pb::AllowanceGrant) -> Result<AllowanceGrant> {
    Ok(AllowanceGrant {
        counter: counter_from_wire(g.counter)?,
        region: region(g.region, "region")?,
        allowance_units: g.allowance_units,
        epoch: Epoch(g.epoch),
    })
}

fn release_from_wire(r: pb::ReleaseRequest) -> Result<ReleaseRequest> {
    Ok(ReleaseRequest {
        id: r.id,
        counter: counter_from_wire(r.counter)?,
        units: r.units,
        epoch: Epoch(r.epoch),
    })
}

// ---- encoded bytes ------------------------------------------------------------------------

/// `up` as the stream carries it (its protobuf encoding): for measuring message sizes and
/// the cost of the wire where no stream runs.
pub fn encode_sync_up(up: SyncUp) -> Vec<u8> {
    prost::Message::encode_to_vec(&sync_up_to_wire(up))
}

/// A SyncUp from its protobuf encoding, checked as [`sync_up_from_wire`] checks it.
pub fn decode_sync_up(bytes: &[u8]) -> Result<SyncUp> {
    let wire = <pb::SyncUp as prost::Message>::decode(bytes)
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    sync_up_from_wire(wire)
}

/// `down` as the stream carries it (its protobuf encoding).
pub fn encode_sync_down(down: SyncDown) -> Vec<u8> {
    prost::Message::encode_to_vec(&sync_down_to_wire(down))
}

/// A SyncDown from its protobuf encoding, checked as [`sync_down_from_wire`] checks it.
pub fn decode_sync_down(bytes: &[u8]) -> Result<SyncDown> {
    let wire = <pb::SyncDown as prost::Message>::decode(bytes)
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    sync_down_from_wire(wire)
}

#[cfg(test)]
mod tests;
