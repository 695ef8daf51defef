//! Acquire: the default share, admission `n_r + cost <= a_r`, answers, shadow mode, the kill
//! switch, unlimited limits, the rate cap, idempotency.

use std::time::Duration;

use super::*;
use crate::budget::Reason;
use crate::error::Error;
use crate::limit::Quota;

#[test]
fn a_region_admits_up_to_its_default_share_and_no_further() {
    // L = 400 per minute over four regions: eu's default share is 400 / 4 = 100.
    let mut b = budget(vec![per_minute("api", 400)]);
    let now = at(15_000);
    let d = acquire(&mut b, now, "api", "k", 60);
    assert!(d.allowed);
    assert_eq!(d.remaining_units, 40);
    assert_eq!(d.limit_units, 400);
    assert_eq!(
        d.reset_after,
        Duration::from_secs(45),
        "window ends at 60 s"
    );
    assert_eq!(d.reason, Reason::Allowance);
    // 60 + 41 = 101 > 100: refused, and told to come back when the window resets.
    let d = acquire(&mut b, now, "api", "k", 41);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_secs(45)));
    assert_eq!(d.remaining_units, 40);
    // 60 + 40 = 100 fits exactly.
    assert!(acquire(&mut b, now, "api", "k", 40).allowed);
    assert_eq!(net(&b, "api", "k"), 100);
    assert_eq!(
        b.stats(&lim("api"))
            .and_then(|s| s.window(minute_window(15_000)))
            .map(|w| (w.denials, w.denied_units)),
        Some((1, 41))
    );
}

#[test]
fn keys_are_counted_separately_and_windows_restart_them() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(acquire(&mut b, at(1_000), "api", "a", 100).allowed);
    assert!(acquire(&mut b, at(1_000), "api", "b", 100).allowed);
    assert!(!acquire(&mut b, at(59_999), "api", "a", 1).allowed);
    // The next window starts at 60 s with a fresh counter.
    let d = acquire(&mut b, at(60_000), "api", "a", 1);
    assert!(d.allowed);
    assert_eq!(d.remaining_units, 99);
    assert_eq!(
        b.counter(&lim("api"), &key("a")).map(|c| c.window),
        Some(minute_window(60_000))
    );
}

#[test]
fn a_single_region_owns_the_whole_quota() {
    let mut b = RegionBudget::new(
        BudgetConfig::single_region(RegionId::from("eu")),
        vec![per_minute("api", 400)],
    )
    .expect("valid");
    assert!(acquire(&mut b, at(0), "api", "k", 400).allowed);
    assert!(!acquire(&mut b, at(0), "api", "k", 1).allowed);
    assert_eq!(b.poll_transmit(at(0)), None, "no coordinator to talk to");
}

#[test]
fn a_request_above_the_whole_quota_is_told_it_can_never_pass() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let d = acquire(&mut b, at(0), "api", "k", 401);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, None);
}

#[test]
fn shadow_mode_lets_everything_through_but_counts_true() {
    let mut spec = per_minute("api", 400);
    spec.shadow_mode = true;
    let mut b = budget(vec![spec]);
    // Default share 100: 150 would be refused, but shadow mode answers yes and counts it.
    let d = acquire(&mut b, at(0), "api", "k", 150);
    assert!(d.allowed);
    assert!(d.shadow_denied);
    assert_eq!(d.remaining_units, 0);
    assert_eq!(net(&b, "api", "k"), 150, "the gateway let it through");
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(
        (w.shadow_denials, w.shadow_excess_units, w.denials),
        (1, 50, 0)
    );
    // Within the allowance nothing is flagged.
    let mut spec = per_minute("api", 400);
    spec.shadow_mode = true;
    let mut b = budget(vec![spec]);
    assert!(!acquire(&mut b, at(0), "api", "k", 10).shadow_denied);
}

#[test]
fn a_disabled_limit_admits_everything_and_counts_nothing() {
    let mut spec = per_minute("api", 400);
    spec.enabled = false;
    let mut b = budget(vec![spec]);
    let d = acquire(&mut b, at(0), "api", "k", 10_000);
    assert!(d.allowed);
    assert_eq!(d.reason, Reason::Disabled);
    assert_eq!(b.counter(&lim("api"), &key("k")), None);
    assert_eq!(b.key_count(&lim("api")), 0);
}

#[test]
fn an_unlimited_limit_admits_everything_and_counts_nothing() {
    let mut spec = per_minute("api", 400);
    spec.quota = Quota::Unlimited;
    let mut b = budget(vec![spec]);
    let d = acquire(&mut b, at(0), "api", "k", u64::MAX);
    assert!(d.allowed);
    assert_eq!(d.reason, Reason::Unlimited);
    assert_eq!(b.key_count(&lim("api")), 0);
}

#[test]
fn the_rate_cap_is_checked_on_top_of_the_allowance() {
    // 10 per second, burst 5: T = 100 ms; five at once pass, the sixth waits one T.
    let mut spec = per_minute("api", 3_000);
    spec.rate_cap = per_second_cap(10, 5);
    let mut b = budget(vec![spec]);
    for _ in 0..5 {
        assert!(acquire(&mut b, at(0), "api", "k", 1).allowed);
    }
    let d = acquire(&mut b, at(0), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::RateCap);
    assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
    assert_eq!(net(&b, "api", "k"), 5, "a rate-cap refusal charges nothing");
    assert!(acquire(&mut b, at(100), "api", "k", 1).allowed);
}

#[test]
fn an_allowance_refusal_does_not_consume_the_rate_cap() {
    let mut spec = per_minute("api", 40);
    spec.rate_cap = per_second_cap(10, 5);
    let mut b = budget(vec![spec]);
    // Default share 10. 11 units are refused by the allowance before the cap is consulted...
    assert_eq!(
        acquire(&mut b, at(0), "api", "k", 11).reason,
        Reason::Allowance
    );
    // ...so the full burst of 5 is still there.
    assert!(acquire(&mut b, at(0), "api", "k", 5).allowed);
}

#[test]
fn a_retried_acquire_returns_the_first_answer_and_charges_once() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let id = Some(RequestId(7));
    let first = acquire_with(&mut b, at(0), "api", "k", 60, id);
    let again = acquire_with(&mut b, at(10), "api", "k", 60, id);
    assert_eq!(first, again);
    assert_eq!(net(&b, "api", "k"), 60);
    // A refusal is remembered too: the retry does not sneak in after a release elsewhere.
    let id2 = Some(RequestId(8));
    let refused = acquire_with(&mut b, at(20), "api", "k", 50, id2);
    assert!(!refused.allowed);
    assert_eq!(acquire_with(&mut b, at(30), "api", "k", 50, id2), refused);
}

#[test]
fn a_request_id_is_forgotten_after_its_ttl() {
    let mut config = cfg();
    config.idempotency_ttl = Duration::from_secs(5);
    let mut b = RegionBudget::new(config, vec![per_minute("api", 400)]).expect("valid");
    let id = Some(RequestId(7));
    acquire_with(&mut b, at(0), "api", "k", 10, id);
    acquire_with(&mut b, at(4_999), "api", "k", 10, id);
    assert_eq!(net(&b, "api", "k"), 10);
    b.handle_timeout(at(5_000));
    acquire_with(&mut b, at(5_000), "api", "k", 10, id);
    assert_eq!(net(&b, "api", "k"), 20, "after the TTL it is a new request");
}

#[test]
fn a_request_id_reused_for_another_call_is_an_error() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire_with(&mut b, at(0), "api", "k", 1, Some(RequestId(9)));
    let mut req = lease_req("api", "k", 5, 10);
    req.request_id = Some(RequestId(9));
    let err = b.lease(at(0), req).expect_err("refused");
    assert!(
        matches!(
            err,
            Error::IdempotencyConflict {
                first: "acquire",
                this: "lease"
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "idempotency key already used for an acquire request, not lease: a retry must repeat \
         its request exactly, and another request needs another key"
    );
}

/// Stripe's rule: a key sent again with other parameters is refused, never answered with the
/// first request's outcome. Before requests were fingerprinted, every call below that reuses
/// id 7 or 8 with another cost, key or lease size got the first call's answer back instead of
/// `IdempotencyConflict` (the acquire of 61 on "k", and of 30 on "other", were answered
/// `allowed` with 40 remaining, the first answer, and "other" was charged nothing).
#[test]
fn a_request_id_sent_again_with_other_parameters_is_refused() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let id = Some(RequestId(7));
    let first = acquire_with(&mut b, at(0), "api", "k", 60, id);
    for (k, cost) in [("k", 61), ("other", 30), ("other", 60)] {
        let req = AcquireRequest {
            limit: lim("api"),
            key: key(k),
            cost_units: cost,
            request_id: id,
        };
        let got = b.acquire(at(10), req);
        assert!(
            matches!(
                got,
                Err(Error::IdempotencyConflict {
                    first: "acquire",
                    this: "acquire"
                })
            ),
            "{k} {cost}: {got:?}"
        );
    }
    assert_eq!(net(&b, "api", "k"), 60);
    assert_eq!(
        net(&b, "api", "other"),
        0,
        "nothing charged to the other key"
    );
    // The same request again is still a retry.
    assert_eq!(acquire_with(&mut b, at(20), "api", "k", 60, id), first);

    let mut req = lease_req("api", "k", 5, 10);
    req.request_id = Some(RequestId(8));
    let grant = b.lease(at(30), req.clone()).expect("lease");
    assert_eq!(b.lease(at(31), req.clone()).expect("retry"), grant);
    for change in [
        |r: &mut LeaseRequest| r.units_wanted = 6,
        |r: &mut LeaseRequest| r.min_units = 5,
        |r: &mut LeaseRequest| r.ttl = Duration::from_secs(11),
        |r: &mut LeaseRequest| r.rate_units_per_sec = Some(1),
        |r: &mut LeaseRequest| r.key = key("other"),
    ] {
        let mut other = req.clone();
        change(&mut other);
        assert!(
            matches!(
                b.lease(at(32), other.clone()),
                Err(Error::IdempotencyConflict { .. })
            ),
            "{other:?}"
        );
    }
    // Demand reported with the retry is not part of the request.
    let mut more_denials = req.clone();
    more_denials.denied_units = 3;
    assert_eq!(b.lease(at(33), more_denials).expect("retry"), grant);
    assert_eq!(net(&b, "api", "k"), 65, "one lease of 5 charged");
}

#[test]
fn unknown_limits_are_errors() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let r = b.acquire(
        at(0),
        AcquireRequest {
            limit: lim("nope"),
            key: key("k"),
            cost_units: 1,
            request_id: None,
        },
    );
    assert!(matches!(r, Err(Error::UnknownLimit(l)) if l == lim("nope")));
}

#[test]
fn invalid_configs_are_rejected_with_every_problem_named() {
    let mut c = cfg();
    c.sync_interval = Duration::ZERO;
    c.max_keys_per_limit = 0;
    match RegionBudget::new(c, vec![]) {
        Err(Error::InvalidSettings(e)) => assert_eq!(e.len(), 2, "{e:?}"),
        other => panic!("expected config errors, got {other:?}"),
    }
}
