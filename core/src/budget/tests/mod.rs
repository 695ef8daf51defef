//! Unit tests of the budget machine, one file per concern, and its property tests.

mod acquire;
mod fallback;
mod keys;
mod lease;
mod partition;
mod persist;
mod proptests;
mod reload;
mod restore;
mod sliding;
mod sliding_eventual;
mod slots;
mod stats;
mod sync;
mod timebase;

use std::time::Duration;

use super::RegionBudget;
use super::{AcquireRequest, BudgetConfig, Decision, LeaseGrant, LeaseOutcome, LeaseRequest};
use crate::ids::{Epoch, KeyId, LimitId, RegionId, RequestId};
use crate::limit::LimitSpec;
use crate::sync::{AllowanceGrant, CounterRef, ReleaseRequest, SyncDown, SyncUp};
use crate::time::{Timestamp, WindowIndex};

/// A start aligned to the hour (so also to the minute and the second):
/// 1,699,999,200,000 ms = 472,222 h.
pub(super) const T0_MS: u64 = 1_699_999_200_000;

/// `ms` milliseconds after [`T0_MS`].
pub(super) fn at(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(T0_MS + ms)
}

pub(super) fn regions() -> Vec<RegionId> {
    ["eu", "us", "ap", "sa"]
        .into_iter()
        .map(RegionId::from)
        .collect()
}

/// Region `eu` of four, with the default settings.
pub(super) fn cfg() -> BudgetConfig {
    BudgetConfig::new(RegionId::from("eu"), regions())
}

/// `units` per minute: with four equal regions the default share is `units / 4`.
pub(super) fn per_minute(id: &str, units: u64) -> LimitSpec {
    LimitSpec::simple(id, units, Duration::from_secs(60))
}

/// [`per_minute`], whose settles may charge up to `ratio_percent` of a reservation above it.
pub(super) fn per_minute_settling(id: &str, units: u64, ratio_percent: u64) -> LimitSpec {
    LimitSpec {
        max_settle_overage_ppm: ratio_percent * 10_000,
        ..per_minute(id, units)
    }
}

/// A rate cap of `units` a second with `burst`.
pub(super) fn per_second_cap(units: u64, burst: u64) -> Option<crate::limit::RateCap> {
    Some(crate::limit::RateCap {
        units,
        per: Duration::from_secs(1),
        burst,
    })
}

pub(super) fn budget(limits: Vec<LimitSpec>) -> RegionBudget {
    RegionBudget::new(cfg(), limits).expect("valid config")
}

pub(super) fn lim(id: &str) -> LimitId {
    LimitId::new(id)
}

pub(super) fn key(k: &str) -> KeyId {
    KeyId::new(k)
}

/// The window of a 60 s limit at `at(ms)`.
pub(super) fn minute_window(ms: u64) -> WindowIndex {
    WindowIndex((T0_MS + ms) / 60_000)
}

pub(super) fn acquire(
    b: &mut RegionBudget,
    now: Timestamp,
    limit: &str,
    k: &str,
    cost: u64,
) -> Decision {
    acquire_with(b, now, limit, k, cost, None)
}

pub(super) fn acquire_with(
    b: &mut RegionBudget,
    now: Timestamp,
    limit: &str,
    k: &str,
    cost: u64,
    request_id: Option<RequestId>,
) -> Decision {
    b.acquire(
        now,
        AcquireRequest {
            limit: lim(limit),
            key: key(k),
            cost_units: cost,
            request_id,
        },
    )
    .expect("acquire")
}

pub(super) fn lease_req(limit: &str, k: &str, units: u64, ttl_secs: u64) -> LeaseRequest {
    LeaseRequest {
        limit: lim(limit),
        key: key(k),
        units_wanted: units,
        min_units: 1,
        denied_units: 0,
        rate_units_per_sec: None,
        ttl: Duration::from_secs(ttl_secs),
        request_id: None,
    }
}

pub(super) fn granted(out: LeaseOutcome) -> LeaseGrant {
    match out {
        LeaseOutcome::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

pub(super) fn net(b: &RegionBudget, limit: &str, k: &str) -> u64 {
    b.counter(&lim(limit), &key(k)).map_or(0, |c| c.net_units())
}

pub(super) fn allowance(b: &RegionBudget, now: Timestamp, limit: &str, k: &str) -> u64 {
    b.allowance_units(now, &lim(limit), &key(k))
        .expect("known limit")
}

pub(super) fn counter(limit: &str, k: &str, window: WindowIndex) -> CounterRef {
    CounterRef {
        limit: lim(limit),
        key: key(k),
        window,
    }
}

/// The coordinator's answer to `up`, received and sent at `now` on its clock.
pub(super) fn answer(up: &SyncUp, now: Timestamp) -> SyncDown {
    SyncDown {
        reply_to_seq: up.seq,
        leader_term: 1,
        received_at: now,
        sent_at: now,
        config_version: 0,
        entries: Vec::new(),
        grants: Vec::new(),
        release_requests: Vec::new(),
        known_region: false,
        below_default_left: false,
        earlier_boot_clock_reach: None,
        config: None,
    }
}

/// One round trip at `now`: the region sends its SyncUp and gets an empty answer.
pub(super) fn round_trip(b: &mut RegionBudget, now: Timestamp) -> SyncUp {
    let up = b.poll_transmit(now).expect("a sync is due");
    b.handle_sync_down(now, answer(&up, now));
    up
}

pub(super) fn grant(
    limit: &str,
    k: &str,
    window: WindowIndex,
    units: u64,
    epoch: u64,
) -> AllowanceGrant {
    AllowanceGrant {
        counter: counter(limit, k, window),
        region: RegionId::from("eu"),
        allowance_units: units,
        epoch: Epoch(epoch),
    }
}

pub(super) fn release_req(
    id: u64,
    limit: &str,
    k: &str,
    window: WindowIndex,
    units: u64,
    epoch: u64,
) -> ReleaseRequest {
    ReleaseRequest {
        id,
        counter: counter(limit, k, window),
        units,
        epoch: Epoch(epoch),
    }
}

/// A SyncUp at `now` answered at once with the one grant `g`.
pub(super) fn grant_at(b: &mut RegionBudget, now: Timestamp, g: AllowanceGrant) {
    let up = b.poll_transmit(now).expect("sync");
    let mut down = answer(&up, now);
    down.grants = vec![g];
    b.handle_sync_down(now, down);
}
