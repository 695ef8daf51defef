//! Behaviour of the gateway a user relies on, driven through its public API with a virtual
//! clock, plus a property test of its two safety promises.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config() -> GatewayConfig {
    GatewayConfig {
        max_keys: 4,
        max_leases_per_key: 2,
        max_queued_messages: 64,
        initial_lease_units: 10,
        max_lease_units: 1_000,
        lease_target: ms(500),
        refill_threshold_percent: 25,
        early_refill_percent: 0,
        near_limit_divisor: 8,
        idle_release_after: Duration::from_secs(2),
        expiry_margin: ms(50),
        lease_request_timeout: Duration::from_secs(1),
        unavailable_backoff: ms(250),
        sweep_interval: ms(100),
        refill_in_place: false,
    }
}

fn gateway() -> (Gateway, KeyHandle) {
    let mut g = Gateway::new(config()).unwrap();
    let h = g
        .key(T0, &LimitId::from("api/key"), &KeyId::from("k=1"))
        .unwrap();
    (g, h)
}

fn grant(id: u64, units: u64, ttl: Duration, remaining_units: u64) -> LeaseGrant {
    LeaseGrant {
        lease: LeaseId(id),
        units,
        ttl,
        remaining_units,
    }
}

fn next_wanted(g: &mut Gateway, now: Timestamp) -> Option<LeaseWanted> {
    match g.poll_transmit(now)? {
        ToAgent::LeaseWanted(w) => Some(w),
        other => panic!("expected a lease request, got {other:?}"),
    }
}

fn all_messages(g: &mut Gateway, now: Timestamp) -> Vec<ToAgent> {
    std::iter::from_fn(|| g.poll_transmit(now)).collect()
}

/// One request of one unit on an empty key, as a driver serves it: wait, the agent grants a
/// lease of `units`, spend again.
fn stock(g: &mut Gateway, h: KeyHandle, now: Timestamp, id: u64, units: u64) {
    assert_eq!(g.try_spend(now, h, 1), Spend::Wait);
    let w = next_wanted(g, now).expect("an empty key asks for a lease");
    g.handle_lease_granted(
        now,
        w.ticket,
        grant(id, units, Duration::from_secs(10), 10_000),
    );
    assert!(matches!(g.try_spend(now, h, 1), Spend::Spent(r) if r.lease == LeaseId(id)));
}

#[test]
fn an_empty_key_waits_for_one_lease_then_spends_locally() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait, "still waiting");
    let w = next_wanted(&mut g, T0).unwrap();
    assert_eq!(w.units, 10, "the first lease has the initial size");
    assert_eq!(w.min_units, 1);
    assert_eq!(
        next_wanted(&mut g, T0),
        None,
        "one request per key at a time"
    );
    g.handle_lease_granted(T0, w.ticket, grant(1, 10, Duration::from_secs(10), 10_000));
    for _ in 0..10 {
        assert!(matches!(g.try_spend(T0, h, 1), Spend::Spent(r) if r.lease == LeaseId(1)));
    }
    assert_eq!(
        g.try_spend(T0, h, 1),
        Spend::Wait,
        "ten units, ten requests"
    );
}

#[test]
fn the_next_lease_is_asked_for_before_the_held_one_runs_dry() {
    let (mut g, h) = gateway();
    let now = T0;
    stock(&mut g, h, now, 1, 10);
    // 10 units held, one spent by stock(): 9 left. Refill below 25% of 10 = 2 units,
    // so the request goes out on the spend that leaves 1 unit: the 8th from here.
    for _ in 0..7 {
        assert!(matches!(g.try_spend(now, h, 1), Spend::Spent(_)));
        assert_eq!(g.poll_transmit(now), None);
    }
    assert!(matches!(g.try_spend(now, h, 1), Spend::Spent(_)));
    assert!(next_wanted(&mut g, now).is_some());
}

/// Keys a, b and c each hold a lease of 100 (one unit spent); b is spent to 40 held (past an
/// early mark of 50, above the refill mark of 25), c to 60. Returns the gateway and the
/// three handles.
fn three_keys_b_past_its_early_mark(early_refill_percent: u8) -> (Gateway, [KeyHandle; 3]) {
    let mut g = Gateway::new(GatewayConfig {
        max_keys: 8,
        early_refill_percent,
        ..config()
    })
    .unwrap();
    let limit = LimitId::from("api/key");
    let h = ["a", "b", "c"].map(|k| g.key(T0, &limit, &KeyId::from(k)).unwrap());
    for (i, &key) in h.iter().enumerate() {
        stock(&mut g, key, T0, i as u64 + 1, 100);
    }
    for _ in 0..59 {
        assert!(matches!(g.try_spend(T0, h[1], 1), Spend::Spent(_)));
    }
    for _ in 0..39 {
        assert!(matches!(g.try_spend(T0, h[2], 1), Spend::Spent(_)));
    }
    assert_eq!(g.poll_transmit(T0), None, "no key is below its refill mark");
    (g, h)
}

#[test]
fn a_key_past_its_early_mark_is_refilled_with_another_keys_request() {
    let (mut g, h) = three_keys_b_past_its_early_mark(50);
    // a drops below 25 held: its request goes, and b rides with it; c (60 held) does not.
    for _ in 0..76 {
        assert!(matches!(g.try_spend(T0, h[0], 1), Spend::Spent(_)));
    }
    let asked: Vec<String> = std::iter::from_fn(|| next_wanted(&mut g, T0))
        .map(|w| w.key.to_string())
        .collect();
    assert_eq!(asked, ["a", "b"]);
    assert_eq!(g.stats().early_refills, 1);
    // b's early request is in flight: spending past its refill mark asks nothing more.
    for _ in 0..30 {
        assert!(matches!(g.try_spend(T0, h[1], 1), Spend::Spent(_)));
    }
    assert_eq!(g.poll_transmit(T0), None);
}

#[test]
fn with_early_refills_off_only_the_key_below_its_refill_mark_asks() {
    let (mut g, h) = three_keys_b_past_its_early_mark(0);
    for _ in 0..76 {
        assert!(matches!(g.try_spend(T0, h[0], 1), Spend::Spent(_)));
    }
    let asked: Vec<String> = std::iter::from_fn(|| next_wanted(&mut g, T0))
        .map(|w| w.key.to_string())
        .collect();
    assert_eq!(asked, ["a"]);
    assert_eq!(g.stats().early_refills, 0);
}

#[test]
fn an_early_mark_under_the_refill_mark_is_refused() {
    let bad = GatewayConfig {
        early_refill_percent: 10,
        ..config()
    };
    let err = Gateway::new(bad).unwrap_err().to_string();
    assert!(err.contains("early_refill_percent"), "{err}");
}

#[test]
fn a_key_holds_at_most_max_leases_per_key() {
    let mut g = Gateway::new(GatewayConfig {
        max_leases_per_key: 1,
        ..config()
    })
    .unwrap();
    let h = g
        .key(T0, &LimitId::from("api/key"), &KeyId::from("k=1"))
        .unwrap();
    stock(&mut g, h, T0, 1, 10);
    // With room for one lease only, nothing is prefetched while it holds units, however few
    // (9 left after stock(); the refill threshold is 2).
    for _ in 0..8 {
        assert!(matches!(g.try_spend(T0, h, 1), Spend::Spent(_)));
        assert_eq!(g.poll_transmit(T0), None);
    }
    // The last unit empties the lease, which makes room: the agent hears that the lease
    // ended (so it stops counting it against the key), then the next one is asked for.
    assert!(matches!(g.try_spend(T0, h, 1), Spend::Spent(_)));
    assert_eq!(
        g.poll_transmit(T0),
        Some(ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 0
        }))
    );
    assert!(next_wanted(&mut g, T0).is_some());
}

#[test]
fn an_expired_lease_is_never_spent() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    // Sent at T0, answered 500 ms later with a 1 s TTL: the lease lives until T0 + 1 s on
    // the gateway's clock, minus the 50 ms margin, so until T0 + 950 ms.
    g.handle_lease_granted(T0 + ms(500), w.ticket, grant(1, 10, ms(1_000), 10_000));
    assert!(matches!(g.try_spend(T0 + ms(949), h, 1), Spend::Spent(_)));
    assert_eq!(g.try_spend(T0 + ms(950), h, 1), Spend::Wait);
    assert_eq!(g.stats().expired_units, 9, "ten granted, one spent");
}

#[test]
fn a_short_lease_keeps_most_of_its_life() {
    // A lease that ends with its window 40 ms after the request: the margin is a twentieth of
    // that, 2 ms, not the configured 50 ms (which would make it useless on arrival).
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_lease_granted(T0, w.ticket, grant(1, 10, ms(40), 100));
    assert!(matches!(g.try_spend(T0 + ms(37), h, 1), Spend::Spent(_)));
    assert_eq!(g.try_spend(T0 + ms(38), h, 1), Spend::Wait);
}

#[test]
fn a_long_lease_keeps_a_margin_for_clock_drift() {
    // 60 s: the fixed 50 ms would cover 833 ppm; the margin is 2,000 ppm of it, 120 ms.
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_lease_granted(T0, w.ticket, grant(1, 10, ms(60_000), 100));
    assert!(matches!(
        g.try_spend(T0 + ms(59_879), h, 1),
        Spend::Spent(_)
    ));
    assert_eq!(g.try_spend(T0 + ms(59_880), h, 1), Spend::Wait);
}

#[test]
fn the_expiry_margin_is_fixed_between_its_two_proportional_limits() {
    let c = config();
    // A twentieth of a short lease, the fixed 50 ms in the middle, 2,000 ppm of a long one.
    assert_eq!(expiry_margin(&c, ms(40)), ms(2));
    assert_eq!(expiry_margin(&c, ms(1_000)), ms(50));
    assert_eq!(expiry_margin(&c, ms(25_000)), ms(50));
    assert_eq!(expiry_margin(&c, ms(60_000)), ms(120));
    assert_eq!(expiry_margin(&c, Duration::ZERO), Duration::ZERO);
}

#[test]
fn a_lease_already_expired_on_arrival_is_given_back() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_lease_granted(T0 + ms(980), w.ticket, grant(7, 10, ms(1_000), 10_000));
    assert_eq!(
        all_messages(&mut g, T0 + ms(980)),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(7),
            units: 10
        })]
    );
}

#[test]
fn a_denied_key_is_denied_locally_until_retry_after() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_lease_denied(
        T0,
        w.ticket,
        LeaseDenial {
            retry_after: ms(2_000),
        },
    );
    assert_eq!(
        g.try_spend(T0 + ms(500), h, 1),
        Spend::Denied {
            retry_after: ms(1_500)
        }
    );
    assert_eq!(
        g.poll_transmit(T0 + ms(500)),
        None,
        "the agent is not asked"
    );
    assert_eq!(g.try_spend(T0 + ms(2_000), h, 1), Spend::Wait);
    let again = next_wanted(&mut g, T0 + ms(2_000)).unwrap();
    assert_eq!(
        again.units, 1,
        "after a denial the key is at its limit: ask for one unit"
    );
}

#[test]
fn the_next_request_tells_the_agent_what_was_denied_here_and_the_key_s_rate() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let first = next_wanted(&mut g, T0).unwrap();
    assert_eq!((first.denied_units, first.rate_units_per_sec), (0, None));
    g.handle_lease_denied(
        T0,
        first.ticket,
        LeaseDenial {
            retry_after: ms(1_000),
        },
    );
    // Requests of 3, 4 and 5 units denied here while the agent's denial holds: 12 units the
    // agent never saw.
    for (t, units) in [(100, 3), (200, 4), (300, 5)] {
        assert!(matches!(
            g.try_spend(T0 + ms(t), h, units),
            Spend::Denied { .. }
        ));
    }
    assert_eq!(g.try_spend(T0 + ms(1_000), h, 2), Spend::Wait);
    let again = next_wanted(&mut g, T0 + ms(1_000)).unwrap();
    assert_eq!(again.denied_units, 12);
    // 1 + 3 + 4 + 5 + 2 = 15 units asked for in the 1 s since the first request.
    assert_eq!(again.rate_units_per_sec, Some(15));
    g.handle_lease_granted(T0 + ms(1_000), again.ticket, grant(2, 2, ms(10_000), 100));
    // The waiting request spends the whole lease; the next one waits for another.
    assert!(matches!(g.try_spend(T0 + ms(1_000), h, 2), Spend::Spent(_)));
    assert_eq!(g.try_spend(T0 + ms(1_000), h, 1), Spend::Wait);
    let third = all_messages(&mut g, T0 + ms(1_000))
        .into_iter()
        .find_map(|m| match m {
            ToAgent::LeaseWanted(w) => Some(w),
            _ => None,
        })
        .unwrap();
    assert_eq!(third.denied_units, 0, "reported once");
}

#[test]
fn lease_size_grows_with_the_observed_rate_up_to_the_max() {
    let (mut g, h) = gateway();
    let mut now = T0;
    let mut sizes = Vec::new();
    let mut id = 0;
    // 2,000 requests/s (one every 500 µs) for 5 s; every lease is granted in full.
    for _ in 0..10_000 {
        now = now + Duration::from_micros(500);
        let _ = g.try_spend(now, h, 1);
        while let Some(msg) = g.poll_transmit(now) {
            if let ToAgent::LeaseWanted(w) = msg {
                sizes.push(w.units);
                id += 1;
                g.handle_lease_granted(
                    now,
                    w.ticket,
                    grant(id, w.units, Duration::from_secs(10), 1_000_000),
                );
            }
        }
    }
    assert_eq!(sizes[0], 10);
    // 2,000/s over a 500 ms target is 1,000 units: the max, reached and kept.
    assert_eq!(*sizes.last().unwrap(), 1_000);
    assert!(
        sizes.windows(2).all(|p| p[1] >= p[0]),
        "steady demand never shrinks: {sizes:?}"
    );
}

#[test]
fn lease_size_shrinks_to_one_near_the_limit() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    // Only 5 units remain for the key at the agent: 5 / 8 < 1, so the next lease is 1 unit.
    g.handle_lease_granted(T0, w.ticket, grant(1, 10, Duration::from_secs(10), 5));
    let mut now = T0;
    let mut asked = None;
    for _ in 0..10 {
        now = now + ms(1);
        let _ = g.try_spend(now, h, 1);
        if let Some(w) = next_wanted(&mut g, now) {
            asked = Some(w.units);
            break;
        }
    }
    assert_eq!(asked, Some(1));
}

#[test]
fn idle_keys_give_their_units_back_and_are_forgotten() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 10);
    assert_eq!(g.poll_timeout(), Some(T0 + ms(100)));
    g.handle_timeout(T0 + ms(1_900));
    assert_eq!(
        g.poll_transmit(T0 + ms(1_900)),
        None,
        "not idle for 2 s yet"
    );
    g.handle_timeout(T0 + ms(2_000));
    assert_eq!(
        all_messages(&mut g, T0 + ms(2_000)),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 9
        })]
    );
    assert_eq!(g.key_count(), 0);
    assert_eq!(g.try_spend(T0 + ms(2_000), h, 1), Spend::UnknownKey);
    assert_eq!(g.poll_timeout(), None, "nothing left to sweep");
}

#[test]
fn a_late_grant_is_released_not_kept() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_timeout(T0 + ms(1_000));
    // The request was abandoned after 1 s; the key asks again and the old answer arrives late.
    assert_eq!(g.try_spend(T0 + ms(1_000), h, 1), Spend::Wait);
    let w2 = next_wanted(&mut g, T0 + ms(1_000)).unwrap();
    assert_ne!(w.ticket, w2.ticket);
    g.handle_lease_granted(T0 + ms(1_100), w.ticket, grant(1, 10, ms(5_000), 100));
    assert_eq!(g.stats().late_grants, 1);
    assert_eq!(
        all_messages(&mut g, T0 + ms(1_100)),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 10
        })]
    );
    assert_eq!(
        g.try_spend(T0 + ms(1_100), h, 1),
        Spend::Wait,
        "still waiting for w2"
    );
}

#[test]
fn key_count_is_bounded_and_idle_keys_make_room() {
    let mut g = Gateway::new(config()).unwrap();
    let limit = LimitId::from("api/key");
    for i in 0..4 {
        g.key(T0, &limit, &KeyId::new(format!("k={i}"))).unwrap();
    }
    let err = g.key(T0, &limit, &KeyId::from("k=4")).unwrap_err();
    assert!(matches!(err, Error::TooManyKeys { max_keys: 4, .. }));
    g.handle_timeout(T0 + ms(2_000));
    assert_eq!(g.key_count(), 0);
    assert!(g.key(T0 + ms(2_000), &limit, &KeyId::from("k=4")).is_ok());
}

#[test]
fn the_same_key_has_one_handle() {
    let (mut g, h) = gateway();
    let again = g
        .key(T0, &LimitId::from("api/key"), &KeyId::from("k=1"))
        .unwrap();
    assert_eq!(h, again);
    assert_eq!(g.key_count(), 1);
}

#[test]
fn settle_below_the_reservation_returns_units_to_the_held_lease() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 1_000);
    // 999 held; reserve 100, use 40: 60 come back to the lease.
    let Spend::Spent(r) = g.try_spend(T0, h, 100) else {
        panic!("a 999-unit lease pays 100");
    };
    assert_eq!(g.held_units(T0, h), 899);
    g.settle(T0, r, 40);
    assert_eq!(g.held_units(T0, h), 959);
    // Reserve 100, use 150: the extra 50 come from the same lease.
    let Spend::Spent(r) = g.try_spend(T0, h, 100) else {
        panic!()
    };
    g.settle(T0, r, 150);
    assert_eq!(g.held_units(T0, h), 809);
    assert_eq!(g.poll_transmit(T0), None, "settled without the agent");
}

#[test]
fn settle_after_the_lease_is_gone_goes_to_the_agent() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 10);
    let Spend::Spent(r) = g.try_spend(T0, h, 5) else {
        panic!()
    };
    g.release_all(T0);
    assert_eq!(
        all_messages(&mut g, T0),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 4
        })]
    );
    g.settle(T0, r, 2);
    g.settle(T0, r, 9);
    assert_eq!(
        all_messages(&mut g, T0),
        vec![
            ToAgent::Settle(LeaseSettle {
                lease: LeaseId(1),
                delta: SettleDelta::Refund { units: 3 }
            }),
            ToAgent::Settle(LeaseSettle {
                lease: LeaseId(1),
                delta: SettleDelta::Overage { units: 4 }
            }),
        ]
    );
}

/// A chunk is a quarter of what its lease holds, at most `max_units` and at least the
/// request; it counts as spent, ends with its lease, and what is left of it comes back with
/// settle.
#[test]
fn a_chunk_takes_a_share_of_one_lease_and_settles_its_leftover_back() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 1_001);
    let chunk = g.carve(T0, h, 1, 100).expect("a lease pays");
    assert_eq!(chunk.receipt.units, 100, "capped at max_units");
    assert_eq!(chunk.expires_at, T0 + Duration::from_secs(10) - ms(50));
    assert_eq!(g.held_units(T0, h), 900);
    let small = g.carve(T0, h, 1, 1_000).expect("a lease pays");
    assert_eq!(small.receipt.units, 225, "a quarter of the 900 left");
    let costly = g.carve(T0, h, 600, 1_000).expect("a lease pays");
    assert_eq!(costly.receipt.units, 600, "never less than the request");
    assert_eq!(g.held_units(T0, h), 75);
    g.settle(T0, chunk.receipt, 40);
    assert_eq!(g.held_units(T0, h), 135, "60 unspent units are back");
    assert!(
        all_messages(&mut g, T0)
            .iter()
            .all(|m| !matches!(m, ToAgent::Settle(_)))
    );
}

/// Settled after its lease expired, a chunk's leftover is the agent's to refund (it counts the
/// lease spent): nothing returns to the gateway's leases.
#[test]
fn a_chunk_settled_after_its_lease_expired_goes_to_the_agent() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 101);
    let chunk = g.carve(T0, h, 1, 1_000).expect("a lease pays");
    assert_eq!(chunk.receipt.units, 25);
    let later = chunk.expires_at;
    g.settle(later, chunk.receipt, 5);
    assert_eq!(g.held_units(later, h), 0);
    let settles: Vec<_> = all_messages(&mut g, later)
        .into_iter()
        .filter(|m| matches!(m, ToAgent::Settle(_)))
        .collect();
    assert_eq!(
        settles,
        vec![ToAgent::Settle(LeaseSettle {
            lease: LeaseId(1),
            delta: SettleDelta::Refund { units: 20 },
        })]
    );
}

#[test]
fn a_chunk_is_refused_like_a_spend() {
    let (mut g, h) = gateway();
    assert_eq!(g.carve(T0, h, 1, 100), Err(Spend::Wait));
    let stale = KeyHandle {
        slot: h.slot,
        generation: h.generation + 1,
    };
    assert_eq!(g.carve(T0, stale, 1, 100), Err(Spend::UnknownKey));
}

#[test]
fn an_unreachable_agent_is_not_asked_again_until_the_backoff() {
    let (mut g, h) = gateway();
    assert_eq!(g.try_spend(T0, h, 1), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    g.handle_agent_unavailable(T0, w.ticket);
    assert_eq!(g.try_spend(T0 + ms(249), h, 1), Spend::Unavailable);
    assert_eq!(g.poll_transmit(T0 + ms(249)), None);
    assert_eq!(g.try_spend(T0 + ms(250), h, 1), Spend::Wait);
    assert!(next_wanted(&mut g, T0 + ms(250)).is_some());
}

#[test]
fn leftovers_too_small_for_the_waiting_request_are_released() {
    let (mut g, h) = gateway();
    stock(&mut g, h, T0, 1, 100);
    // 99 held. A 500-unit reservation cannot be paid from it: ask, and on the grant give the
    // 99 back rather than let them expire unused.
    assert_eq!(g.try_spend(T0, h, 500), Spend::Wait);
    let w = next_wanted(&mut g, T0).unwrap();
    assert!(w.units >= 500, "the lease covers the waiting request");
    assert_eq!(
        w.min_units, 500,
        "and the agent is told a smaller one is of no use"
    );
    g.handle_lease_granted(
        T0,
        w.ticket,
        grant(2, w.units, Duration::from_secs(10), 10_000),
    );
    assert_eq!(
        all_messages(&mut g, T0),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 99
        })]
    );
    assert!(matches!(g.try_spend(T0, h, 500), Spend::Spent(r) if r.lease == LeaseId(2)));
}

#[test]
fn invalid_configs_are_refused() {
    let mut c = config();
    c.max_keys = 0;
    assert!(Gateway::new(c).is_err());
    let mut c = config();
    c.near_limit_divisor = 0;
    assert!(Gateway::new(c).is_err());
}

// Property: whatever the interleaving of requests, grants, denials, settles, sweeps and clock
// steps, (1) no lease pays for more units than it was granted, (2) no unit is taken from a
// lease at or after its expiry, and (3) a released lease returns exactly what it did not pay.

#[derive(Clone, Debug)]
enum Op {
    Spend {
        cost: u64,
    },
    Advance {
        millis: u64,
    },
    Answer {
        kind: u8,
        units: u64,
        ttl_millis: u64,
    },
    Settle {
        pick: usize,
        actual: u64,
    },
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..40).prop_map(|cost| Op::Spend { cost }),
        2 => (0u64..700).prop_map(|millis| Op::Advance { millis }),
        3 => (0u8..6, 0u64..120, 0u64..3_000)
            .prop_map(|(kind, units, ttl_millis)| Op::Answer { kind, units, ttl_millis }),
        1 => (any::<usize>(), 0u64..80).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        1 => Just(Op::Sweep),
    ]
}

#[derive(Default)]
struct LeaseBook {
    granted: u64,
    /// Units taken from the lease at the gateway (spends, plus settle overage taken locally,
    /// minus settle refunds put back locally).
    paid: i128,
    released: Option<u64>,
    /// When the agent stops honouring it: sent time + TTL.
    dies_at: Timestamp,
    /// Refilled in place at least once. Its units the gateway dropped as expired (its clock
    /// margin ends a lease before the agent does) are not in its release: the agent counts
    /// them spent. Paying more than granted is still checked.
    refilled: bool,
}

struct Harness {
    g: Gateway,
    h: KeyHandle,
    now: Timestamp,
    /// Requests in flight: ticket, when sent, and the lease it asked to refill.
    asks: Vec<(LeaseTicket, Timestamp, Option<LeaseId>)>,
    books: BTreeMap<LeaseId, LeaseBook>,
    receipts: Vec<SpendReceipt>,
    next_id: u64,
}

impl Harness {
    /// Drains the gateway's messages; returns the settle delta sent for `lease`, if any
    /// (positive: overage charged by the agent; negative: refund).
    fn pump(&mut self, lease: Option<LeaseId>) -> Result<i128, TestCaseError> {
        let mut remote = 0;
        while let Some(msg) = self.g.poll_transmit(self.now) {
            match msg {
                ToAgent::LeaseWanted(w) => self.asks.push((w.ticket, self.now, w.refill)),
                ToAgent::Release(r) => {
                    let book = self.books.get_mut(&r.lease).expect("released lease known");
                    prop_assert!(book.released.is_none(), "released twice");
                    book.released = Some(r.units);
                }
                ToAgent::Settle(s) if Some(s.lease) == lease => {
                    remote += match s.delta {
                        SettleDelta::Overage { units } => i128::from(units),
                        SettleDelta::Refund { units } => -i128::from(units),
                    };
                }
                ToAgent::Settle(_) => prop_assert!(false, "settle for another lease"),
            }
        }
        Ok(remote)
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Spend { cost } => {
                if let Spend::Spent(r) = self.g.try_spend(self.now, self.h, cost) {
                    prop_assert_eq!(r.units, cost);
                    let book = self
                        .books
                        .get_mut(&r.lease)
                        .expect("spent lease was granted");
                    prop_assert!(self.now < book.dies_at, "spent an expired lease");
                    prop_assert!(book.released.is_none(), "spent a released lease");
                    book.paid += i128::from(cost);
                    self.receipts.push(r);
                }
            }
            Op::Advance { millis } => self.now = self.now + ms(millis),
            Op::Answer {
                kind,
                units,
                ttl_millis,
            } => self.answer(kind, units, ttl_millis),
            Op::Settle { pick, actual } if !self.receipts.is_empty() => {
                let r = self.receipts.swap_remove(pick % self.receipts.len());
                self.g.settle(self.now, r, actual);
                // What the agent was not told was settled locally, from the lease.
                let remote = self.pump(Some(r.lease))?;
                let local = i128::from(actual) - i128::from(r.units) - remote;
                let book = self.books.get_mut(&r.lease).expect("receipt's lease known");
                prop_assert!(
                    local == 0 || book.released.is_none(),
                    "settled locally into a released lease"
                );
                book.paid += local;
            }
            Op::Settle { .. } => {}
            Op::Sweep => self.g.handle_timeout(self.now),
        }
        self.pump(None)?;
        for book in self.books.values() {
            prop_assert!(
                book.paid <= i128::from(book.granted),
                "paid more than granted"
            );
            if let Some(released) = book.released {
                let accounted = i128::from(released) + book.paid;
                if book.refilled {
                    prop_assert!(accounted <= i128::from(book.granted));
                } else {
                    prop_assert_eq!(accounted, i128::from(book.granted));
                }
            }
        }
        Ok(())
    }

    fn answer(&mut self, kind: u8, units: u64, ttl_millis: u64) {
        if self.asks.is_empty() {
            return;
        }
        let (ticket, sent_at, refill) = self.asks.remove(0);
        match kind {
            0 => self.g.handle_lease_denied(
                self.now,
                ticket,
                LeaseDenial {
                    retry_after: ms(ttl_millis / 4),
                },
            ),
            1 => self.g.handle_agent_unavailable(self.now, ticket),
            _ => {
                let ttl = ms(ttl_millis);
                // The agent adds to the named lease while it honours it (as `top_up` does);
                // otherwise it grants a new one.
                let live = refill.filter(|id| {
                    self.books
                        .get(id)
                        .is_some_and(|b| b.released.is_none() && self.now < b.dies_at)
                });
                if let Some(lease) = live {
                    let book = self.books.get_mut(&lease).expect("live lease known");
                    book.granted += units;
                    book.refilled = true;
                    book.dies_at = book.dies_at.max(sent_at + ttl);
                    self.g.handle_lease_granted(
                        self.now,
                        ticket,
                        grant(lease.0, units, ttl, units * 3),
                    );
                    return;
                }
                self.next_id += 1;
                let lease = LeaseId(self.next_id);
                self.books.insert(
                    lease,
                    LeaseBook {
                        granted: units,
                        dies_at: sent_at + ttl,
                        ..LeaseBook::default()
                    },
                );
                self.g.handle_lease_granted(
                    self.now,
                    ticket,
                    grant(lease.0, units, ttl, units * 3),
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_pays_more_than_granted_nor_from_an_expired_lease(
        ops in proptest::collection::vec(op(), 1..200),
        refill_in_place in any::<bool>(),
    ) {
        let mut g = Gateway::new(GatewayConfig { refill_in_place, ..config() }).unwrap();
        let h = g.key(T0, &LimitId::from("api/key"), &KeyId::from("k=1")).unwrap();
        let mut harness = Harness {
            g,
            h,
            now: T0,
            asks: Vec::new(),
            books: BTreeMap::new(),
            receipts: Vec::new(),
            next_id: 0,
        };
        for op in ops {
            if !harness.g.contains(harness.h) {
                // The key went idle and was forgotten: look it up again, as a caller would.
                harness.h = harness
                    .g
                    .key(harness.now, &LimitId::from("api/key"), &KeyId::from("k=1"))
                    .unwrap();
            }
            harness.apply(op)?;
        }
    }
}

// ---- refills in place ------------------------------------------------------------------------

fn refilling_gateway() -> (Gateway, KeyHandle) {
    let mut g = Gateway::new(GatewayConfig {
        refill_in_place: true,
        ..config()
    })
    .unwrap();
    let h = g
        .key(T0, &LimitId::from("api/key"), &KeyId::from("k=1"))
        .unwrap();
    (g, h)
}

/// Spends until the gateway asks for more; returns the request.
fn spend_until_asked(g: &mut Gateway, h: KeyHandle, now: Timestamp) -> LeaseWanted {
    for _ in 0..100 {
        assert!(matches!(g.try_spend(now, h, 1), Spend::Spent(_)));
        if let Some(ToAgent::LeaseWanted(w)) = g.poll_transmit(now) {
            return w;
        }
    }
    panic!("no refill asked for");
}

#[test]
fn a_refill_names_the_lease_being_spent_and_its_grant_adds_to_it() {
    let (mut g, h) = refilling_gateway();
    stock(&mut g, h, T0, 1, 10);
    let w = spend_until_asked(&mut g, h, T0);
    assert_eq!(w.refill, Some(LeaseId(1)));
    let held_before = held_units(&slot_state(&g.slots, h).unwrap().leases);
    g.handle_lease_granted(T0, w.ticket, grant(1, 20, Duration::from_secs(10), 10_000));
    let leases = &slot_state(&g.slots, h).unwrap().leases;
    assert_eq!(leases.len(), 1, "one lease, refilled");
    assert_eq!(leases[0].units_left, held_before + 20);
    // Nothing is released: the lease goes on.
    assert!(all_messages(&mut g, T0).is_empty());
}

#[test]
fn a_lease_emptied_while_its_refill_is_in_flight_is_ended_only_if_the_refill_made_another() {
    for (granted_id, released) in [(1, vec![]), (2, vec![LeaseId(1)])] {
        let (mut g, h) = refilling_gateway();
        stock(&mut g, h, T0, 1, 10);
        let w = spend_until_asked(&mut g, h, T0);
        assert_eq!(w.refill, Some(LeaseId(1)));
        // The last unit: the lease empties while the refill is on its way. It is not
        // reported ended yet (the agent may be adding to it).
        while matches!(g.try_spend(T0, h, 1), Spend::Spent(_)) {}
        assert!(all_messages(&mut g, T0).is_empty());
        g.handle_lease_granted(
            T0,
            w.ticket,
            grant(granted_id, 20, Duration::from_secs(10), 10_000),
        );
        let ended: Vec<LeaseId> = all_messages(&mut g, T0)
            .into_iter()
            .filter_map(|m| match m {
                ToAgent::Release(r) if r.units == 0 => Some(r.lease),
                _ => None,
            })
            .collect();
        assert_eq!(ended, released, "grant named lease {granted_id}");
        let leases = &slot_state(&g.slots, h).unwrap().leases;
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].id, LeaseId(granted_id));
    }
}

#[test]
fn a_refill_denied_after_its_lease_emptied_ends_that_lease() {
    let (mut g, h) = refilling_gateway();
    stock(&mut g, h, T0, 1, 10);
    let w = spend_until_asked(&mut g, h, T0);
    while matches!(g.try_spend(T0, h, 1), Spend::Spent(_)) {}
    g.handle_lease_denied(
        T0,
        w.ticket,
        LeaseDenial {
            retry_after: ms(100),
        },
    );
    assert_eq!(
        all_messages(&mut g, T0),
        vec![ToAgent::Release(LeaseRelease {
            lease: LeaseId(1),
            units: 0
        })]
    );
}

/// A driver that caches a handle as one word gets the same key back, and a word naming a key
/// since forgotten is answered as unknown, never as another key.
#[test]
fn a_handle_survives_the_round_trip_through_its_bits() {
    let (mut g, h) = gateway();
    assert_eq!(KeyHandle::from_bits(h.to_bits()), h);
    let stale = KeyHandle {
        slot: h.slot,
        generation: h.generation.wrapping_add(1),
    };
    assert_eq!(KeyHandle::from_bits(stale.to_bits()), stale);
    assert_eq!(g.try_spend(T0, stale, 1), Spend::UnknownKey);
}

/// `can_spend` answers what `try_spend` would do, without doing it: a caller spending several
/// keys as one relies on it to spend none when one cannot pay.
#[test]
fn can_spend_says_whether_try_spend_would_spend() {
    let (mut g, h) = gateway();
    let wanted = |g: &mut Gateway, now: Timestamp| {
        all_messages(g, now)
            .into_iter()
            .find_map(|m| match m {
                ToAgent::LeaseWanted(w) => Some(w),
                _ => None,
            })
            .expect("a lease request")
    };
    let agrees = |g: &mut Gateway, now: Timestamp, units: u64| {
        let said = g.can_spend(now, h, units);
        let held = g.held_units(now, h);
        assert_eq!(g.held_units(now, h), held, "asking changes nothing");
        let did = matches!(g.try_spend(now, h, units), Spend::Spent(_));
        assert_eq!(said, did, "at {now:?} for {units} units");
        did
    };
    assert!(!agrees(&mut g, T0, 1), "no lease");
    let w = wanted(&mut g, T0);
    g.handle_lease_granted(T0, w.ticket, grant(1, 10, ms(1_000), 10_000));
    assert!(!agrees(&mut g, T0, 11), "more than the lease holds");
    assert!(agrees(&mut g, T0, 4));
    assert!(agrees(&mut g, T0, 6), "to the last unit");
    assert!(!agrees(&mut g, T0, 1), "spent");
    let w = wanted(&mut g, T0);
    g.handle_lease_granted(T0, w.ticket, grant(2, 10, ms(1_000), 10_000));
    assert!(!agrees(&mut g, T0 + ms(1_000), 1), "expired");
    let w = wanted(&mut g, T0 + ms(1_000));
    g.handle_lease_denied(
        T0 + ms(1_000),
        w.ticket,
        LeaseDenial {
            retry_after: ms(2_000),
        },
    );
    assert!(!agrees(&mut g, T0 + ms(1_500), 1), "denied locally");
}
