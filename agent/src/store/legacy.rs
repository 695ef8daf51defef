//! Records as the first postcard format (`0x01`) laid them out, read into today's records.
//!
//! Postcard keeps no field names, so a field added to a record changes its layout: a store
//! written before `KeyRecord` kept its excess units (and `SettleOutcome` its clamped units)
//! decodes through these mirrors, whose variants are in the same order as then. Only `Key`
//! and the settle outcome an idempotency entry remembers differ; everything else is today's
//! type.

use allot_core::algo::concurrency::SlotId;
use allot_core::budget::persist::{
    AckRecord, AllowanceRecord, KeyRecord, LeaseRecord, MetaRecord, SlotRecord, StatsRecord,
    UnfingerprintedIdempotencyRecord,
};
use allot_core::budget::{
    Decision, LeaseOutcome, Outcome, PersistRecord, ReleaseOutcome, RenewOutcome, SettleOutcome,
    SlotOutcome,
};
use allot_core::ids::{KeyId, LeaseId, LimitId, RequestId};
use allot_core::time::{Timestamp, WindowIndex};
use serde::Deserialize;

#[derive(Deserialize)]
pub(crate) enum RecordV1 {
    Reset,
    Meta(MetaRecord),
    LimitRemoved { limit: LimitId },
    Key(KeyRecordV1),
    KeyEvicted { limit: LimitId, key: KeyId },
    Lease(LeaseRecord),
    LeaseEnded { lease: LeaseId },
    Slot(SlotRecord),
    SlotEnded { slot: SlotId },
    ReleaseAck(AckRecord),
    ReleaseForgotten { id: u64 },
    Idempotency(IdempotencyRecordV1),
    IdempotencyExpired { request: RequestId },
    Stats(StatsRecord),
    StatsForgotten { limit: LimitId, window: WindowIndex },
}

#[derive(Deserialize)]
pub(crate) struct IdempotencyRecordV1 {
    request: RequestId,
    expires_at: Timestamp,
    outcome: OutcomeV1,
}

#[derive(Deserialize)]
pub(crate) enum OutcomeV1 {
    Acquire(Decision),
    Lease(LeaseOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    Settle(SettleOutcomeV1),
    Slot(SlotOutcome),
}

/// A settle answer before settles were capped: nothing was clamped.
#[derive(Deserialize)]
pub(crate) struct SettleOutcomeV1 {
    refunded_units: u64,
    overage_units: u64,
}

impl From<OutcomeV1> for Outcome {
    fn from(o: OutcomeV1) -> Self {
        match o {
            OutcomeV1::Acquire(d) => Outcome::Acquire(d),
            OutcomeV1::Lease(l) => Outcome::Lease(l),
            OutcomeV1::Renew(r) => Outcome::Renew(r),
            OutcomeV1::Release(r) => Outcome::Release(r),
            OutcomeV1::Settle(s) => Outcome::Settle(SettleOutcome {
                refunded_units: s.refunded_units,
                overage_units: s.overage_units,
                clamped_units: 0,
            }),
            OutcomeV1::Slot(s) => Outcome::Slot(s),
        }
    }
}

/// A key before its excess units were kept: it comes back with none.
#[derive(Deserialize)]
pub(crate) struct KeyRecordV1 {
    limit: LimitId,
    key: KeyId,
    window: WindowIndex,
    granted_units: u64,
    refunded_units: u64,
    allowances: Vec<AllowanceRecord>,
    rate_tat: Option<Timestamp>,
    open_rate_tat: Option<Timestamp>,
}

impl From<RecordV1> for PersistRecord {
    fn from(r: RecordV1) -> Self {
        match r {
            RecordV1::Reset => PersistRecord::Reset,
            RecordV1::Meta(m) => PersistRecord::Meta(m),
            RecordV1::LimitRemoved { limit } => PersistRecord::LimitRemoved { limit },
            RecordV1::Key(k) => PersistRecord::Key(KeyRecord {
                limit: k.limit,
                key: k.key,
                window: k.window,
                granted_units: k.granted_units,
                refunded_units: k.refunded_units,
                allowances: k.allowances,
                rate_tat: k.rate_tat,
                open_rate_tat: k.open_rate_tat,
                excess_units: 0,
                fail_open_units: 0,
            }),
            RecordV1::KeyEvicted { limit, key } => PersistRecord::KeyEvicted { limit, key },
            RecordV1::Lease(l) => PersistRecord::Lease(l),
            RecordV1::LeaseEnded { lease } => PersistRecord::LeaseEnded { lease },
            RecordV1::Slot(s) => PersistRecord::Slot(s),
            RecordV1::SlotEnded { slot } => PersistRecord::SlotEnded { slot },
            RecordV1::ReleaseAck(a) => PersistRecord::ReleaseAck(a),
            RecordV1::ReleaseForgotten { id } => PersistRecord::ReleaseForgotten { id },
            RecordV1::Idempotency(i) => {
                PersistRecord::IdempotencyUnfingerprinted(UnfingerprintedIdempotencyRecord {
                    request: i.request,
                    expires_at: i.expires_at,
                    outcome: i.outcome.into(),
                })
            }
            RecordV1::IdempotencyExpired { request } => {
                PersistRecord::IdempotencyExpired { request }
            }
            RecordV1::Stats(s) => PersistRecord::Stats(s),
            RecordV1::StatsForgotten { limit, window } => {
                PersistRecord::StatsForgotten { limit, window }
            }
        }
    }
}
