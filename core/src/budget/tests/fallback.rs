//! Gateways' fallback admissions against their rule's stated allowance (D69): within it
//! covered by the bound's `rlqs_fallback` term, past it charged nowhere (the window
//! unbounded), and never an allowance for a window an earlier start may have used.

use super::*;
use crate::budget::{FallbackCharge, MAX_FALLBACK_KEYS};

fn with_fallback(units: u64) -> LimitSpec {
    LimitSpec {
        rlqs_fallback_units: units,
        ..per_minute("api", 400)
    }
}

fn charge(within_units: u64, beyond_units: u64) -> FallbackCharge {
    FallbackCharge {
        within_units,
        beyond_units,
    }
}

fn uncharged_in(b: &RegionBudget, ms: u64) -> u64 {
    b.stats(&lim("api"))
        .and_then(|s| s.window(minute_window(ms)))
        .map_or(0, |w| w.uncharged_units)
}

#[test]
fn fallback_within_the_allowance_is_covered_and_the_rest_charged_nowhere() {
    let mut b = budget(vec![with_fallback(10)]);
    b.handle_timeout(at(500));
    // The window of 61 s began after the machine first ran: its allowance is whole.
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(61_000), 4),
        charge(4, 0)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(62_000), 9),
        charge(6, 3),
        "10 a key and window: 4 + 6, and 3 past it"
    );
    assert_eq!(
        uncharged_in(&b, 61_000),
        3,
        "the window is stated unbounded"
    );
    // Another key has its own allowance, and the next window a fresh one.
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("j")), at(62_000), 10),
        charge(10, 0)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(121_000), 10),
        charge(10, 0)
    );
    // A late report of the window before, now that a newer one is tallied: its tally is
    // gone, so nothing is taken on trust.
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(119_000), 1),
        charge(0, 1)
    );
    assert_eq!(uncharged_in(&b, 61_000), 4);
    let view = b
        .key_view(at(121_000), &lim("api"), &key("k"))
        .expect("view");
    assert_eq!(view.granted_units, 0, "charged to no counter");
}

/// A start does not know what an earlier one charged: the window it started in, and any
/// report before it first ran, get no allowance.
#[test]
fn a_window_that_began_before_the_machine_ran_has_no_allowance() {
    let mut b = budget(vec![with_fallback(10)]);
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(61_000), 2),
        charge(0, 2),
        "not yet run"
    );
    b.handle_timeout(at(61_500));
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(62_000), 2),
        charge(0, 2),
        "the window of its start"
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(120_000), 2),
        charge(2, 0),
        "the next window begins after it"
    );
    // A target that no longer maps to a key of the rule (a reload) has no allowance.
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), None, at(121_000), 2),
        charge(0, 2)
    );
    // An earlier instant of a later timeout does not move the start.
    b.handle_timeout(at(10_000));
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("j")), at(61_000), 1),
        charge(0, 1)
    );
}

#[test]
fn no_allowance_and_an_unknown_limit_cover_nothing() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.handle_timeout(at(0));
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(1_000), 3),
        charge(0, 3)
    );
    assert_eq!(uncharged_in(&b, 1_000), 3);
    assert_eq!(
        b.record_gateway_fallback(&lim("gone"), Some(&key("k")), at(1_000), 3),
        charge(0, 3)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(1_000), 0),
        charge(0, 0)
    );
}

/// The tally holds at most `MAX_FALLBACK_KEYS` keys: a new key past it has no allowance
/// while every tallied window is open, and gets one once they have ended.
#[test]
fn the_tally_is_bounded_and_forgets_windows_that_ended() {
    let mut b = budget(vec![with_fallback(1)]);
    b.handle_timeout(at(0));
    for i in 0..MAX_FALLBACK_KEYS {
        let k = key(&format!("k{i}"));
        assert_eq!(
            b.record_gateway_fallback(&lim("api"), Some(&k), at(1_000), 1),
            charge(1, 0)
        );
    }
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("new")), at(2_000), 1),
        charge(0, 1),
        "full, and every window still open"
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k0")), at(61_000), 1),
        charge(1, 0),
        "a tallied key keeps its place"
    );
    b.handle_timeout(at(61_000));
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("new")), at(61_000), 1),
        charge(1, 0),
        "the ended windows' tallies are forgotten"
    );
}

/// A reload that shrinks the allowance below what a window took of it: the units above the
/// new one were admitted and the new term does not cover them, so that window is stated
/// unbounded; a rule removed and configured again keeps what its window took.
#[test]
fn a_reload_that_shrinks_the_allowance_unbounds_the_window_that_used_more() {
    let mut b = budget(vec![with_fallback(10)]);
    b.handle_timeout(at(0));
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(61_000), 8),
        charge(8, 0)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("j")), at(61_000), 2),
        charge(2, 0)
    );
    b.set_limits(at(62_000), vec![with_fallback(3)]);
    assert_eq!(uncharged_in(&b, 61_000), 5, "k took 8 of what is now 3");
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(63_000), 1),
        charge(0, 1)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("j")), at(63_000), 2),
        charge(1, 1),
        "j keeps what is left of the new 3"
    );
    // Removed and configured again within the window: what it took is remembered, and the
    // allowance is whole again only in the next window.
    b.set_limits(at(64_000), vec![per_minute("other", 10)]);
    b.set_limits(at(65_000), vec![with_fallback(3)]);
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("j")), at(66_000), 1),
        charge(0, 1)
    );
    assert_eq!(
        b.record_gateway_fallback(&lim("api"), Some(&key("k")), at(121_000), 3),
        charge(3, 0)
    );
}
