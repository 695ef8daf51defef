//! Leases: adaptive size, release, settle, expiry, renewal, bounds, retries.

use std::time::Duration;

use super::*;
use crate::budget::config::MAX_LEASE_RETURNS;
use crate::budget::{LeaseOutcome, LeaseReturn, Reason, ReleaseOutcome, SettleOutcome};
use crate::error::Error;
use crate::ids::LeaseId;

#[test]
fn a_lease_shrinks_near_the_limit_down_to_one_then_is_refused() {
    // Default share 100.
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 70, 10))
            .expect("lease"),
    );
    assert_eq!((g.units, g.remaining_units), (70, 30));
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 70, 10))
            .expect("lease"),
    );
    assert_eq!((g.units, g.remaining_units), (30, 0), "min(70, 100 - 70)");
    match b.lease(at(0), lease_req("api", "k", 1, 10)).expect("lease") {
        LeaseOutcome::Denied(d) => {
            assert_eq!(d.reason, Reason::Allowance);
            assert_eq!(d.retry_after, Some(Duration::from_secs(60)));
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(net(&b, "api", "k"), 100, "leases are charged when granted");
}

#[test]
fn releasing_refunds_the_unused_part() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 70, 10))
            .expect("lease"),
    );
    let out = b.release(at(1_000), g.lease, 20, None).expect("release");
    assert_eq!(out, ReleaseOutcome { refunded_units: 20 });
    // granted 70, refunded 20: n = 50, so 50 more fit.
    let c = b.counter(&lim("api"), &key("k")).expect("counter");
    assert_eq!((c.granted_units, c.refunded_units), (70, 20));
    let g = granted(
        b.lease(at(1_000), lease_req("api", "k", 80, 10))
            .expect("lease"),
    );
    assert_eq!(g.units, 50);
    assert!(
        matches!(
            b.release(at(1_000), LeaseId(1), 0, None),
            Err(Error::UnknownLease(_))
        ),
        "a released lease is gone"
    );
}

#[test]
fn giving_back_more_than_was_leased_is_refused() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 10, 10))
            .expect("lease"),
    );
    assert!(matches!(
        b.release(at(0), g.lease, 11, None),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(b.lease_count(), 1, "the lease is still there");
}

fn give_back(lease: LeaseId, unused_units: u64) -> LeaseReturn {
    LeaseReturn {
        lease,
        unused_units,
    }
}

#[test]
fn returned_leases_end_like_releases_and_a_repeat_is_skipped() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let first = granted(
        b.lease(at(0), lease_req("api", "k", 70, 10))
            .expect("lease"),
    );
    let second = granted(
        b.lease(at(0), lease_req("api", "k", 30, 10))
            .expect("lease"),
    );
    let returns = [give_back(first.lease, 0), give_back(second.lease, 5)];
    let ended = b.release_returned(at(500), &returns).expect("returned");
    assert_eq!(
        ended.iter().map(|e| e.refunded_units).collect::<Vec<_>>(),
        vec![0, 5]
    );
    assert!(ended.iter().all(|e| e.limit == lim("api")));
    assert_eq!(b.lease_count(), 0, "both leases ended");
    // granted 100, refunded 5.
    let c = b.counter(&lim("api"), &key("k")).expect("counter");
    assert_eq!((c.granted_units, c.refunded_units), (100, 5));
    // A retried call hands the same leases back: nothing left to refund.
    assert!(
        b.release_returned(at(600), &returns)
            .expect("returned")
            .is_empty()
    );
    let c = b.counter(&lim("api"), &key("k")).expect("counter");
    assert_eq!(c.refunded_units, 5);
}

#[test]
fn an_invalid_return_changes_nothing() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let ok = granted(
        b.lease(at(0), lease_req("api", "k", 10, 10))
            .expect("lease"),
    );
    let bad = granted(
        b.lease(at(0), lease_req("api", "k", 10, 10))
            .expect("lease"),
    );
    let returns = [give_back(ok.lease, 3), give_back(bad.lease, 11)];
    assert!(matches!(
        b.release_returned(at(1), &returns),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(
        b.lease_count(),
        2,
        "the valid return was not applied either"
    );
    let too_many = vec![returns[0]; MAX_LEASE_RETURNS + 1];
    assert!(matches!(
        b.release_returned(at(1), &too_many),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(b.lease_count(), 2);
}

#[test]
fn settling_refunds_an_overestimate() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 10))
            .expect("lease"),
    );
    let out = b.settle(at(500), g.lease, 35, None).expect("settle");
    assert_eq!(
        out,
        SettleOutcome {
            refunded_units: 15,
            overage_units: 0,
            clamped_units: 0
        }
    );
    assert_eq!(net(&b, "api", "k"), 35);
}

#[test]
fn settling_above_the_reservation_charges_it_even_past_the_allowance() {
    // Default share 100: reserve all 100, then the request turns out to cost 130.
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 100, 10))
            .expect("lease"),
    );
    let out = b.settle(at(500), g.lease, 130, None).expect("settle");
    assert_eq!(
        out,
        SettleOutcome {
            refunded_units: 0,
            overage_units: 30,
            clamped_units: 0
        }
    );
    assert_eq!(net(&b, "api", "k"), 130);
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.settle_overage_units, 30, "recorded for the bound");
    assert!(!acquire(&mut b, at(600), "api", "k", 1).allowed);
}

#[test]
fn an_expired_lease_counts_as_spent() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(b.lease(at(0), lease_req("api", "k", 40, 5)).expect("lease"));
    assert_eq!(g.expires_at, at(5_000));
    assert_eq!(b.poll_timeout().map(|t| t <= at(5_000)), Some(true));
    b.handle_timeout(at(5_000));
    assert_eq!(b.lease_count(), 0);
    assert_eq!(net(&b, "api", "k"), 40, "no refund on expiry");
    assert!(matches!(
        b.release(at(5_001), g.lease, 40, None),
        Err(Error::UnknownLease(_))
    ));
}

#[test]
fn a_lease_used_after_its_expiry_is_refused_even_before_the_timer_runs() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(b.lease(at(0), lease_req("api", "k", 40, 5)).expect("lease"));
    assert!(matches!(
        b.settle(at(5_000), g.lease, 10, None),
        Err(Error::UnknownLease(_))
    ));
    assert_eq!(net(&b, "api", "k"), 40);
}

#[test]
fn leases_never_outlive_their_window_and_ttls_are_capped() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // 59 s into the window, 30 s wanted: cut at the window's end, 1 s later.
    let g = granted(
        b.lease(at(59_000), lease_req("api", "k", 1, 30))
            .expect("lease"),
    );
    assert_eq!(g.expires_at, at(60_000));
    assert_eq!(g.window, minute_window(0));
    // 1 hour wanted at 0 s: capped by lease_ttl_max (30 s).
    let g = granted(
        b.lease(at(0), lease_req("api", "j", 1, 3_600))
            .expect("lease"),
    );
    assert_eq!(g.expires_at, at(30_000));
}

#[test]
fn renewing_extends_a_live_lease_up_to_the_window_end() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let g = granted(b.lease(at(0), lease_req("api", "k", 5, 10)).expect("lease"));
    let r = b
        .renew(at(8_000), g.lease, Duration::from_secs(10), None)
        .expect("renew");
    assert_eq!(r.expires_at, at(18_000));
    let r = b.renew(at(55_000), g.lease, Duration::from_secs(10), None);
    assert!(
        matches!(r, Err(Error::UnknownLease(_))),
        "it expired at 18 s"
    );
    let g = granted(
        b.lease(at(50_000), lease_req("api", "k", 5, 5))
            .expect("lease"),
    );
    let r = b
        .renew(at(54_000), g.lease, Duration::from_secs(30), None)
        .expect("renew");
    assert_eq!(r.expires_at, at(60_000), "not past the window's end");
    let r = b
        .renew(at(54_500), g.lease, Duration::from_secs(1), None)
        .expect("renew");
    assert_eq!(r.expires_at, at(60_000), "a renewal never shortens a lease");
}

#[test]
fn a_key_holds_at_most_max_leases_per_key() {
    let mut c = cfg();
    c.max_leases_per_key = 2;
    let mut b = RegionBudget::new(c, vec![per_minute("api", 400)]).expect("valid");
    let first = granted(b.lease(at(0), lease_req("api", "k", 1, 10)).expect("lease"));
    granted(b.lease(at(0), lease_req("api", "k", 1, 10)).expect("lease"));
    match b.lease(at(0), lease_req("api", "k", 1, 10)).expect("lease") {
        LeaseOutcome::Denied(d) => assert_eq!(d.reason, Reason::TooManyLeases),
        other => panic!("expected a denial, got {other:?}"),
    }
    b.release(at(0), first.lease, 1, None).expect("release");
    granted(b.lease(at(0), lease_req("api", "k", 1, 10)).expect("lease"));
}

#[test]
fn a_top_up_refills_the_same_lease_even_at_the_lease_cap() {
    let mut c = cfg();
    c.max_leases_per_key = 1;
    let mut b = RegionBudget::new(c, vec![per_minute("api", 400)]).expect("valid");
    let first = granted(
        b.lease(at(0), lease_req("api", "k", 30, 10))
            .expect("lease"),
    );
    // One lease is the cap, yet the refill passes: it adds no lease.
    let again = granted(
        b.top_up(at(4_000), first.lease, lease_req("api", "k", 20, 10))
            .expect("top up"),
    );
    assert_eq!((again.lease, again.units), (first.lease, 20));
    assert_eq!(b.lease_count(), 1);
    assert_eq!(net(&b, "api", "k"), 50, "both grants are charged");
    // The expiry moved to 4 s + 10 s.
    assert_eq!(again.expires_at, at(14_000));
    // Giving back its unused units covers both grants: 50 held, 45 unused.
    let out = b
        .release(at(5_000), first.lease, 45, None)
        .expect("release");
    assert_eq!(out.refunded_units, 45);
    assert_eq!(net(&b, "api", "k"), 5);
}

#[test]
fn an_ended_lease_is_not_refilled_but_replaced() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let first = granted(b.lease(at(0), lease_req("api", "k", 5, 1)).expect("lease"));
    // Expired at 1 s: its units count as spent, and the refill is a new lease.
    let next = granted(
        b.top_up(at(2_000), first.lease, lease_req("api", "k", 5, 10))
            .expect("top up"),
    );
    assert_ne!(next.lease, first.lease);
    assert_eq!(net(&b, "api", "k"), 10);
    // A lease of the window before is replaced too: its units belong to that window.
    let late = granted(
        b.top_up(at(61_000), next.lease, lease_req("api", "k", 5, 10))
            .expect("top up"),
    );
    assert_ne!(late.lease, next.lease);
    assert_eq!(
        net(&b, "api", "k"),
        5,
        "the new window counts only the new lease"
    );
}

#[test]
fn a_top_up_names_a_lease_of_its_own_key_and_is_charged_once_per_request_id() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let other = granted(
        b.lease(at(0), lease_req("api", "k1", 5, 10))
            .expect("lease"),
    );
    assert!(matches!(
        b.top_up(at(0), other.lease, lease_req("api", "k2", 5, 10)),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(net(&b, "api", "k2"), 0);
    let mut req = lease_req("api", "k1", 7, 10);
    req.request_id = Some(RequestId(77));
    let once = granted(b.top_up(at(10), other.lease, req.clone()).expect("top up"));
    let twice = granted(b.top_up(at(20), other.lease, req).expect("retry"));
    assert_eq!(once, twice);
    assert_eq!(net(&b, "api", "k1"), 12);
}

#[test]
fn retried_lease_calls_charge_and_refund_exactly_once() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let mut req = lease_req("api", "k", 30, 10);
    req.request_id = Some(RequestId(1));
    let first = b.lease(at(0), req.clone()).expect("lease");
    let again = b.lease(at(5), req).expect("lease");
    assert_eq!(first, again, "same lease id and units");
    assert_eq!(net(&b, "api", "k"), 30);
    let g = granted(first);
    let r1 = b
        .release(at(10), g.lease, 10, Some(RequestId(2)))
        .expect("release");
    let r2 = b
        .release(at(11), g.lease, 10, Some(RequestId(2)))
        .expect("retried release");
    assert_eq!(r1, r2);
    assert_eq!(net(&b, "api", "k"), 20, "refunded once");
    // The same release without an id is simply a second call on a lease that is gone.
    assert!(matches!(
        b.release(at(12), g.lease, 10, None),
        Err(Error::UnknownLease(_))
    ));
}

#[test]
fn disabled_limits_hand_out_unmetered_leases() {
    let mut spec = per_minute("api", 400);
    spec.enabled = false;
    let mut b = budget(vec![spec]);
    assert_eq!(
        b.lease(at(0), lease_req("api", "k", 1_000, 10))
            .expect("lease"),
        LeaseOutcome::Unmetered {
            units: 1_000,
            reason: Reason::Disabled
        }
    );
    assert_eq!(b.lease_count(), 0);
}

#[test]
fn empty_leases_are_invalid() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(matches!(
        b.lease(at(0), lease_req("api", "k", 0, 10)),
        Err(Error::InvalidRequest(_))
    ));
    assert!(matches!(
        b.lease(at(0), lease_req("api", "k", 1, 0)),
        Err(Error::InvalidRequest(_))
    ));
}

#[test]
fn a_rate_capped_lease_is_cut_to_what_the_cap_allows_and_charges_it() {
    // 10/s, burst 5: at most 5 units at once.
    let mut spec = per_minute("api", 3_000);
    spec.rate_cap = per_second_cap(10, 5);
    let mut b = budget(vec![spec]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 10))
            .expect("lease"),
    );
    assert_eq!(g.units, 5);
    match b
        .lease(at(0), lease_req("api", "k", 50, 10))
        .expect("lease")
    {
        LeaseOutcome::Denied(d) => {
            assert_eq!(d.reason, Reason::RateCap);
            assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    // Giving 3 back refunds the cap too: 3 more pass at once.
    b.release(at(0), g.lease, 3, None).expect("release");
    assert_eq!(
        granted(
            b.lease(at(0), lease_req("api", "k", 50, 10))
                .expect("lease")
        )
        .units,
        3
    );
}

#[test]
fn shadow_mode_grants_the_whole_lease_it_would_have_refused() {
    let mut spec = per_minute("api", 400);
    spec.shadow_mode = true;
    let mut b = budget(vec![spec]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 100, 10))
            .expect("lease"),
    );
    assert!(!g.shadow_denied);
    // Default share 100 is used up: shadow mode hands out the 30 wanted and counts them.
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 30, 10))
            .expect("lease"),
    );
    assert!(g.shadow_denied);
    assert_eq!(g.units, 30);
    assert_eq!(net(&b, "api", "k"), 130);
}

fn denial(out: LeaseOutcome) -> Decision {
    match out {
        LeaseOutcome::Denied(d) => d,
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn lease_at_least(units: u64, min_units: u64) -> LeaseRequest {
    LeaseRequest {
        min_units,
        ..lease_req("api", "k", units, 10)
    }
}

#[test]
fn a_lease_smaller_than_its_minimum_is_refused_until_the_window_resets() {
    // Default share 100; 70 leased at 0 s leaves 30.
    let mut b = budget(vec![per_minute("api", 400)]);
    granted(
        b.lease(at(0), lease_req("api", "k", 70, 10))
            .expect("lease"),
    );
    // A request costing 40 waits for this lease: 30 would not serve it. At 15 s into the
    // minute the allowance frees up only when the window resets, 45 s later.
    let d = denial(b.lease(at(15_000), lease_at_least(50, 40)).expect("lease"));
    assert_eq!(d.reason, Reason::Allowance);
    assert_eq!(d.retry_after, Some(Duration::from_secs(45)));
    assert_eq!(d.remaining_units, 30);
    assert_eq!(net(&b, "api", "k"), 70, "a refusal charges nothing");
    // A minimum the remainder covers gets all of it.
    let g = granted(b.lease(at(15_000), lease_at_least(50, 30)).expect("lease"));
    assert_eq!((g.units, g.remaining_units), (30, 0));
}

#[test]
fn a_minimum_above_the_whole_quota_can_never_pass() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let d = denial(b.lease(at(0), lease_at_least(500, 401)).expect("lease"));
    assert_eq!(d.retry_after, None, "401 units never fit in a quota of 400");
}

#[test]
fn a_minimum_the_rate_cap_cuts_short_waits_exactly_for_the_cap() {
    // 10/s, burst 10: T = 100 ms. A full burst of 10 at 0 s moves TAT to 1 s; 5 more units
    // would move it to 1.5 s, which is within the 1 s horizon from 0.5 s on: retry after 500 ms.
    let mut spec = per_minute("api", 3_000);
    spec.rate_cap = per_second_cap(10, 10);
    let mut b = budget(vec![spec]);
    assert_eq!(
        granted(b.lease(at(0), lease_at_least(50, 1)).expect("lease")).units,
        10
    );
    let d = denial(b.lease(at(0), lease_at_least(5, 5)).expect("lease"));
    assert_eq!(d.reason, Reason::RateCap);
    assert_eq!(d.retry_after, Some(Duration::from_millis(500)));
    let g = granted(b.lease(at(500), lease_at_least(5, 5)).expect("lease"));
    assert_eq!(g.units, 5, "exactly when the cap said");
    // More than the burst never passes the cap at once.
    let d = denial(b.lease(at(10_000), lease_at_least(20, 11)).expect("lease"));
    assert_eq!((d.reason, d.retry_after), (Reason::RateCap, None));
}

#[test]
fn a_minimum_above_what_is_wanted_is_invalid() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(matches!(
        b.lease(at(0), lease_at_least(5, 6)),
        Err(Error::InvalidRequest(_))
    ));
}

#[test]
fn a_lease_is_cut_to_what_its_holder_spends_before_the_window_ends() {
    // Default share 200. 55 s into the minute, at 10 units/s the holder spends 50 before the
    // window (and the lease) ends: 100 wanted, 50 granted. A request of 60 waiting for a
    // lease still gets 60.
    let mut b = budget(vec![per_minute("api", 800)]);
    let paced = |units, min_units| LeaseRequest {
        rate_units_per_sec: Some(10),
        min_units,
        ..lease_req("api", "k", units, 10)
    };
    let g = granted(b.lease(at(55_000), paced(100, 1)).expect("lease"));
    assert_eq!(g.units, 50);
    let g = granted(b.lease(at(55_000), paced(100, 60)).expect("lease"));
    assert_eq!(g.units, 60, "never below the minimum");
    // Without a rate, what is wanted (up to the 90 left) stands.
    let g = granted(
        b.lease(at(55_000), lease_req("api", "k", 100, 10))
            .expect("lease"),
    );
    assert_eq!(g.units, 90);
}
