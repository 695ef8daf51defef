//! Gateway calls into a region, and what each must answer and charge.
//!
//! A call whose request id already has an outcome must get exactly that outcome back and
//! change nothing. Any other call is checked against the model: what a grant may be, which
//! lease calls must succeed (the lease is live) or fail (`UnknownLease`), and the units each
//! charges or refunds (invariant 5 then compares the model with the counters).

use std::time::Duration;

use allot_core::Error;
use allot_core::budget::{AcquireRequest, LeaseOutcome, LeaseRequest, Outcome};
use allot_core::ids::{KeyId, LeaseId, RequestId};
use proptest::prelude::*;

use super::model::{ModelLease, lease_expiry};
use super::setup::{KEYS, LEASE_TTL_MAX, QUOTA_UNITS, REGIONS, window};
use super::world::{TestResult, World};

#[derive(Clone, Debug)]
pub enum Call {
    Acquire {
        limit: usize,
        key: usize,
        cost_units: u64,
    },
    Lease {
        limit: usize,
        key: usize,
        units_wanted: u64,
        ttl: Duration,
    },
    Renew {
        lease: LeaseId,
        ttl: Duration,
    },
    Release {
        lease: LeaseId,
        unused_units: u64,
    },
    Settle {
        lease: LeaseId,
        actual_units: u64,
    },
}

/// A call made with a request id, kept so that it can be retried unchanged.
#[derive(Clone, Debug)]
pub struct Issued {
    pub region: usize,
    pub call: Call,
    pub request_id: RequestId,
}

impl World {
    pub(super) fn call(
        &mut self,
        r: usize,
        call: Call,
        request_id: Option<RequestId>,
    ) -> TestResult {
        let replay = request_id.and_then(|id| self.model.first_outcome(r, id).cloned());
        if let (Some(id), None) = (request_id, &replay) {
            self.issued.push(Issued {
                region: r,
                call: call.clone(),
                request_id: id,
            });
        }
        let before = self.own_counters(r);
        let allowance_before = self.allowance_before(r, &call)?;
        let result = self.invoke(r, &call, request_id);
        let replayed = if replay.is_some() { " (replay)" } else { "" };
        self.note(format!(
            "{} {call:?} id {request_id:?}{replayed} -> {result:?}",
            REGIONS[r]
        ));
        match replay {
            Some(first) => {
                prop_assert_eq!(
                    result.as_ref().ok(),
                    Some(&first),
                    "a retry must get the first answer"
                );
                prop_assert_eq!(self.own_counters(r), before, "a retry changed the counters");
            }
            None => {
                self.expect(r, &call, &result)?;
                if let (Some(id), Ok(out)) = (request_id, &result) {
                    self.model.remember(r, id, out.clone());
                }
                if let (Some((l, k, a)), true) = (allowance_before, admitted(&result)) {
                    self.check_admission(r, (l, k), a)?;
                }
            }
        }
        self.after_call(r)
    }

    /// For an acquire or a lease: the allowance in force just before the call.
    fn allowance_before(
        &self,
        r: usize,
        call: &Call,
    ) -> Result<Option<(usize, usize, u64)>, TestCaseError> {
        let (Call::Acquire { limit, key, .. } | Call::Lease { limit, key, .. }) = call else {
            return Ok(None);
        };
        let a = self.agents[r]
            .budget
            .allowance_units(self.now, &self.limits[*limit].id, &KeyId::from(KEYS[*key]))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        Ok(Some((*limit, *key, a)))
    }

    fn invoke(
        &mut self,
        r: usize,
        call: &Call,
        request_id: Option<RequestId>,
    ) -> Result<Outcome, Error> {
        let now = self.now;
        let budget = &mut self.agents[r].budget;
        match call.clone() {
            Call::Acquire {
                limit,
                key,
                cost_units,
            } => budget
                .acquire(
                    now,
                    AcquireRequest {
                        limit: self.limits[limit].id.clone(),
                        key: KeyId::from(KEYS[key]),
                        cost_units,
                        request_id,
                    },
                )
                .map(Outcome::Acquire),
            Call::Lease {
                limit,
                key,
                units_wanted,
                ttl,
            } => budget
                .lease(
                    now,
                    LeaseRequest {
                        limit: self.limits[limit].id.clone(),
                        key: KeyId::from(KEYS[key]),
                        units_wanted,
                        min_units: 1,
                        denied_units: 0,
                        rate_units_per_sec: None,
                        ttl,
                        request_id,
                    },
                )
                .map(Outcome::Lease),
            Call::Renew { lease, ttl } => budget
                .renew(now, lease, ttl, request_id)
                .map(Outcome::Renew),
            Call::Release {
                lease,
                unused_units,
            } => budget
                .release(now, lease, unused_units, request_id)
                .map(Outcome::Release),
            Call::Settle {
                lease,
                actual_units,
            } => budget
                .settle(now, lease, actual_units, request_id)
                .map(Outcome::Settle),
        }
    }

    /// Check a first answer against the model, and book what it charged.
    fn expect(&mut self, r: usize, call: &Call, result: &Result<Outcome, Error>) -> TestResult {
        let now = self.now;
        let w = window().index(now);
        match (call.clone(), result) {
            (
                Call::Acquire {
                    limit,
                    key,
                    cost_units,
                },
                Ok(Outcome::Acquire(d)),
            ) => {
                prop_assert_eq!(d.limit_units, QUOTA_UNITS);
                prop_assert!(!d.shadow_denied);
                if d.allowed {
                    self.model.charge((r, limit, key, w), cost_units);
                }
            }
            (
                Call::Lease {
                    limit,
                    key,
                    units_wanted,
                    ttl,
                },
                Ok(Outcome::Lease(out)),
            ) => self.expect_lease(r, (limit, key), units_wanted, ttl, out)?,
            (Call::Renew { lease, ttl }, result) => self.expect_renew(r, lease, ttl, result)?,
            (
                Call::Release {
                    lease,
                    unused_units,
                },
                result,
            ) => {
                let live = self.live_lease(r, lease);
                match (live, result) {
                    (Some(l), Ok(Outcome::Release(o))) => {
                        prop_assert_eq!(o.refunded_units, unused_units);
                        let refunded = self
                            .model
                            .refund((r, l.limit, l.key, l.window), unused_units);
                        prop_assert!(refunded, "model refunds more than it charged");
                        self.end_lease(r, lease);
                    }
                    (None, Err(Error::UnknownLease(id))) if *id == lease => {}
                    (live, other) => {
                        return Err(TestCaseError::fail(format!(
                            "release of {lease:?} (model: {live:?}) answered {other:?}"
                        )));
                    }
                }
            }
            (
                Call::Settle {
                    lease,
                    actual_units,
                },
                result,
            ) => self.expect_settle(r, lease, actual_units, result)?,
            (call, other) => {
                return Err(TestCaseError::fail(format!("{call:?} answered {other:?}")));
            }
        }
        Ok(())
    }

    fn expect_lease(
        &mut self,
        r: usize,
        (limit, key): (usize, usize),
        units_wanted: u64,
        ttl: Duration,
        out: &LeaseOutcome,
    ) -> TestResult {
        let now = self.now;
        let w = window().index(now);
        match out {
            LeaseOutcome::Granted(g) => {
                prop_assert!(
                    !self.model.leases[r].contains_key(&g.lease),
                    "lease id {:?} reused",
                    g.lease
                );
                prop_assert!(
                    g.units >= 1 && g.units <= units_wanted,
                    "granted {} of {}",
                    g.units,
                    units_wanted
                );
                prop_assert_eq!(g.window, w);
                let expires_at = lease_expiry(now, ttl, LEASE_TTL_MAX, window().end(w));
                prop_assert_eq!(g.expires_at, expires_at);
                self.model.charge((r, limit, key, w), g.units);
                self.model.leases[r].insert(
                    g.lease,
                    ModelLease {
                        limit,
                        key,
                        window: w,
                        units: g.units,
                        expires_at,
                        ended: false,
                    },
                );
            }
            LeaseOutcome::Denied(d) => prop_assert!(!d.allowed),
            LeaseOutcome::Unmetered { .. } => {
                return Err(TestCaseError::fail("every limit here is metered"));
            }
        }
        Ok(())
    }

    fn expect_renew(
        &mut self,
        r: usize,
        lease: LeaseId,
        ttl: Duration,
        result: &Result<Outcome, Error>,
    ) -> TestResult {
        let now = self.now;
        match (self.live_lease(r, lease), result) {
            (Some(l), Ok(Outcome::Renew(o))) => {
                // Renewals never shorten a lease, nor take it past its window.
                let wanted = lease_expiry(now, ttl, LEASE_TTL_MAX, window().end(l.window));
                let expires_at = wanted.max(l.expires_at);
                prop_assert_eq!(o.lease, lease);
                prop_assert_eq!(o.expires_at, expires_at);
                if let Some(m) = self.model.leases[r].get_mut(&lease) {
                    m.expires_at = expires_at;
                }
            }
            (None, Err(Error::UnknownLease(id))) if *id == lease => {}
            (live, other) => {
                return Err(TestCaseError::fail(format!(
                    "renew of {lease:?} (model: {live:?}) answered {other:?}"
                )));
            }
        }
        Ok(())
    }

    fn expect_settle(
        &mut self,
        r: usize,
        lease: LeaseId,
        actual_units: u64,
        result: &Result<Outcome, Error>,
    ) -> TestResult {
        match (self.live_lease(r, lease), result) {
            (Some(l), Ok(Outcome::Settle(o))) => {
                let refunded_units = l.units.saturating_sub(actual_units);
                let overage_units = actual_units.saturating_sub(l.units);
                prop_assert_eq!(
                    (o.refunded_units, o.overage_units),
                    (refunded_units, overage_units)
                );
                let at = (r, l.limit, l.key, l.window);
                if overage_units > 0 {
                    self.model.charge_overage(at, overage_units);
                } else {
                    prop_assert!(
                        self.model.refund(at, refunded_units),
                        "model refunds more than it charged"
                    );
                }
                self.end_lease(r, lease);
            }
            (None, Err(Error::UnknownLease(id))) if *id == lease => {}
            (live, other) => {
                return Err(TestCaseError::fail(format!(
                    "settle of {lease:?} (model: {live:?}) answered {other:?}"
                )));
            }
        }
        Ok(())
    }

    fn live_lease(&self, r: usize, lease: LeaseId) -> Option<ModelLease> {
        self.model.leases[r]
            .get(&lease)
            .filter(|l| l.is_live(self.now))
            .cloned()
    }

    fn end_lease(&mut self, r: usize, lease: LeaseId) {
        if let Some(l) = self.model.leases[r].get_mut(&lease) {
            l.ended = true;
        }
    }
}

/// The call charged units to its key (an allowed acquire, a granted lease).
fn admitted(result: &Result<Outcome, Error>) -> bool {
    match result {
        Ok(Outcome::Acquire(d)) => d.allowed,
        Ok(Outcome::Lease(LeaseOutcome::Granted(_))) => true,
        _ => false,
    }
}
