//! The sliding window in eventual mode (D83): a region admitting by its view takes the window
//! before's weight off its room (`n_r + U <= L - (1 - f) * P^`), `P^` its own use of the window
//! before plus the others' as its view held them as that window ended; one admitting by its
//! default share scales the share as in strict mode.

use std::time::Duration;

use super::*;
use crate::budget::Reason;
use crate::limit::{Algorithm, Consistency};
use crate::sync::CounterEntry;
use crate::time::WindowIndex;

const MINUTE_MS: u64 = 60_000;

/// L = 400 a minute, eventual, sliding; four regions, so a default share of 100 each.
fn eventual_sliding() -> LimitSpec {
    LimitSpec {
        algorithm: Algorithm::SlidingWindow,
        consistency: Consistency::Eventual,
        ..per_minute("api", 400)
    }
}

/// Region `eu`, counting since the first window (a probe there): it has counted the whole of
/// the second and later ones (of the first it may have missed the start, as far as it knows).
fn region() -> RegionBudget {
    let mut b = budget(vec![eventual_sliding()]);
    acquire(&mut b, at(0), "api", "probe", 0);
    b
}

/// `ms` into the third window, the window before the judged one.
fn before(ms: u64) -> Timestamp {
    at(2 * MINUTE_MS + ms)
}

/// `ms` into the fourth window.
fn judged(ms: u64) -> Timestamp {
    at(3 * MINUTE_MS + ms)
}

/// A SyncUp at `now`, answered at once with the other regions' entries of `k` in the window
/// of `now`.
fn view_at(b: &mut RegionBudget, now: Timestamp, others: &[(&str, u64)]) {
    let up = b.poll_transmit(now).expect("a sync is due");
    let window = WindowIndex(minute_window(0).0 + (now.as_unix_millis() - T0_MS) / MINUTE_MS);
    let mut down = answer(&up, now);
    down.entries = others
        .iter()
        .map(|(region, units)| CounterEntry {
            counter: counter("api", "k", window),
            region: RegionId::from(*region),
            granted_units: *units,
            refunded_units: 0,
        })
        .collect();
    b.handle_sync_down(now, down);
}

/// The window before: at `view_ms` into it the view hears the others at us 50, ap 50, sa 0,
/// and `k` takes 150 by the view (the window before that, unused here, weighs at most
/// `(1 - f) * 300` by then): 150 of its own and 100 of the others', so `P^ = 250` if the view stays fresh.
fn used_250_before(view_ms: u64) -> RegionBudget {
    let mut b = region();
    view_at(
        &mut b,
        before(view_ms),
        &[("us", 50), ("ap", 50), ("sa", 0)],
    );
    let d = acquire(&mut b, before(view_ms), "api", "k", 150);
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.reason, Reason::GlobalView);
    b
}

#[test]
fn a_view_takes_the_window_before_off_its_room_rather_than_scaling_it() {
    let mut b = used_250_before(59_000);
    // The judged window, before any answer for it: the default share, scaled as in strict
    // mode: 100 * (1 - 250/400) = 37.5, so 37.
    let now = judged(0);
    assert!(acquire(&mut b, now, "api", "k", 37).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
    // The view hears us at 100 of this window: room 400 - 100 = 300, less the window
    // before's 250: 50 in all. Scaling the room instead (300 * 0.375 = 112) would let the
    // estimate reach 250 + 100 + 112 = 462.
    view_at(&mut b, now, &[("us", 100), ("ap", 0), ("sa", 0)]);
    assert!(acquire(&mut b, now, "api", "k", 13).allowed);
    let d = acquire(&mut b, now, "api", "k", 1);
    assert!(!d.allowed);
    // A 51st unit fits once ceil(250 * (60 - e)/60) <= 249, at e = 0.24 s.
    assert_eq!(d.retry_after, Some(Duration::from_millis(240)));
    // Half-way: 300 - 125 = 175, so 125 more (a fresh view: the last one is 2 s old).
    let now = judged(30_000);
    view_at(&mut b, now, &[("us", 100), ("ap", 0), ("sa", 0)]);
    assert!(acquire(&mut b, now, "api", "k", 125).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
}

#[test]
fn a_view_older_than_its_ttl_at_the_window_before_s_end_weighs_the_whole_quota() {
    // The last answer for `k` in the window before came 30 s before its end: whatever the
    // others admitted since is not in it, so P^ = L.
    let mut b = used_250_before(30_000);
    let now = judged(30_000);
    view_at(&mut b, now, &[("us", 0), ("ap", 0), ("sa", 0)]);
    // 400 - 400 * 0.5 = 200.
    assert_eq!(allowance(&b, now, "api", "k"), 400);
    assert!(acquire(&mut b, now, "api", "k", 200).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
}

#[test]
fn a_key_never_reported_in_the_window_before_counts_the_others_at_their_shares() {
    let mut b = region();
    // 10 units early in the window before, not reported: the others counted this region at
    // its default share of 100 there, so they held 300 and P^ = 300 + 10.
    assert!(acquire(&mut b, before(30_000), "api", "k", 10).allowed);
    let up = b.poll_transmit(before(30_000)).expect("a sync is due");
    assert!(up.entries.is_empty(), "well within its share: not reported");
    // 100 * (1 - 310/400) = 22.5, so 22.
    let now = judged(0);
    assert!(acquire(&mut b, now, "api", "k", 22).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
    // A key unused there: P^ = 300, 25.
    assert!(acquire(&mut b, now, "api", "fresh", 25).allowed);
    assert!(!acquire(&mut b, now, "api", "fresh", 1).allowed);
}

#[test]
fn in_the_window_after_a_start_an_unreported_key_weighs_the_whole_quota() {
    // Counting from the window before only (a start in it): whether this region reported a
    // key there is not known (the flag is not stored), so P^ = L: 100 * f, 25 at f = 0.25.
    let mut b = budget(vec![eventual_sliding()]);
    assert!(acquire(&mut b, before(30_000), "api", "k", 10).allowed);
    let now = judged(15_000);
    assert!(acquire(&mut b, now, "api", "k", 25).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
}

#[test]
fn a_reported_key_is_kept_through_a_sweep_with_nothing_used() {
    // Reported at zero use (the coordinator named it): the others counted this region at 0
    // there, not at its share. Swept away, the key would come back as unreported and credit
    // itself with the share; kept, it weighs P^ from its view.
    let mut b = region();
    view_at(
        &mut b,
        before(59_000),
        &[("us", 200), ("ap", 150), ("sa", 50)],
    );
    b.handle_timeout(judged(0));
    b.handle_timeout(judged(1));
    // P^ = 0 + 400: nothing at f = 0 by the default share scaled.
    assert!(!acquire(&mut b, judged(0), "api", "k", 1).allowed);
    // P^ = 400 - 100 = 300 (unreported) would have admitted 25 there.
    assert!(acquire(&mut b, judged(15_000), "api", "k", 25).allowed);
    assert!(!acquire(&mut b, judged(15_000), "api", "k", 1).allowed);
}

/// A coordinator that keeps every entry it is sent and answers each SyncUp at once with all
/// of them for the window of `now`: views as fresh as they can be.
#[derive(Default)]
struct Relay {
    entries: std::collections::BTreeMap<(String, u64), (u64, u64)>,
}

impl Relay {
    /// Every region sends a SyncUp at `now` (`first` before the others) and gets the answer.
    fn round(&mut self, regions: &mut [RegionBudget], first: usize, now: Timestamp) {
        let order = std::iter::once(first).chain((0..regions.len()).filter(|&i| i != first));
        for i in order {
            let Some(up) = regions[i].poll_transmit(now) else {
                continue;
            };
            for e in &up.entries {
                let slot = self
                    .entries
                    .entry((e.region.as_str().to_string(), e.counter.window.0))
                    .or_default();
                *slot = (slot.0.max(e.granted_units), slot.1.max(e.refunded_units));
            }
            let mut down = answer(&up, now);
            let window = regions[i]
                .window_index_of(&lim("api"), now)
                .expect("known limit");
            down.entries = self
                .entries
                .iter()
                .filter(|((_, w), _)| *w == window.0)
                .map(|((region, w), (g, r))| CounterEntry {
                    counter: counter("api", "k", WindowIndex(*w)),
                    region: RegionId::from(region.as_str()),
                    granted_units: *g,
                    refunded_units: *r,
                })
                .collect();
            regions[i].handle_sync_down(now, down);
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// With views as fresh as they can be (every admission followed at once by a round of
    /// every region with a coordinator that relays every entry), the sliding estimate over all
    /// regions never passes the quota: the eventual terms are zero here, and the weight is
    /// taken off each view's room exactly. With the room scaled instead, this fails.
    #[test]
    fn fresh_views_keep_the_estimate_over_every_region_within_the_quota(
        limit in 0u64..=200,
        window_ms in 200u64..=5_000,
        region_count in 2usize..=4,
        steps in proptest::collection::vec(
            (0usize..4, 1u64..=400, 0u64..=40),
            1..160,
        ),
    ) {
        let ids: Vec<RegionId> = ["eu", "us", "ap", "sa"][..region_count]
            .iter()
            .map(|r| RegionId::from(*r))
            .collect();
        let window = crate::time::Window::new(Duration::from_millis(window_ms));
        let spec = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            consistency: Consistency::Eventual,
            ..LimitSpec::simple("api", limit, window.len())
        };
        let mut regions: Vec<RegionBudget> = ids
            .iter()
            .map(|id| {
                let cfg = crate::budget::BudgetConfig {
                    sync_interval: Duration::from_millis(1),
                    ..crate::budget::BudgetConfig::new(id.clone(), ids.clone())
                };
                RegionBudget::new(cfg, vec![spec.clone()]).expect("valid config")
            })
            .collect();
        let mut relay = Relay::default();
        let mut admitted: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut now = at(0);
        for (pick, gap_permille, cost) in steps {
            now = now + Duration::from_micros(window_ms * gap_permille).max(Duration::from_millis(1));
            let r = pick % region_count;
            let d = acquire(&mut regions[r], now, "api", "k", cost);
            let index = window.index(now).0;
            if d.allowed {
                *admitted.entry(index).or_default() += cost;
                let count = |i: u64| u128::from(admitted.get(&i).copied().unwrap_or(0));
                let w = window.len().as_nanos();
                let e = now.saturating_duration_since(window.start(WindowIndex(index))).as_nanos();
                let before = index.checked_sub(1).map_or(0, count);
                proptest::prop_assert!(
                    before * (w - e) + count(index) * w <= u128::from(limit) * w,
                    "window {index}: {before} before, {} now, at {e} ns of {w}",
                    count(index)
                );
            }
            relay.round(&mut regions, r, now);
        }
    }
}
