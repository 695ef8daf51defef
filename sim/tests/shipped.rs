//! The shipped scenarios over the real machines: a few seeds of each in every `cargo test`
//! (the fast tier), and 100 seeds of each when `ALLOT_SLOW_TESTS=1` (the CI tier, which
//! `.ci/run` sets). Every invariant must hold on every seed; a failing seed is printed with
//! the command that replays it.

mod common;

use allot_sim::measure::WindowReport;
use allot_sim::report::SeedReport;
use allot_sim::runner::{RunOptions, run_scenario};
use allot_sim::{CoreFactory, Report};
use common::{SHIPPED, shipped};

/// Seeds per scenario in the fast tier.
const FAST_SEEDS: u64 = 2;
/// Seeds per scenario in the CI tier.
const SLOW_SEEDS: u64 = 100;

fn run(name: &str, seeds: u64) -> Report {
    let s = shipped(name);
    let factory = CoreFactory::new(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let options = RunOptions {
        jobs,
        wall_clock: false,
    };
    let report =
        run_scenario(&s, 0..seeds, options, &factory).unwrap_or_else(|e| panic!("{name}: {e}"));
    let failing: Vec<String> = report
        .failing_seeds()
        .map(|seed| {
            let first = seed
                .violation_details
                .first()
                .map_or(String::new(), |v| format!("{}: {}", v.kind, v.detail));
            format!("seed {} ({first})\n  replay: {}", seed.seed, seed.replay)
        })
        .collect();
    assert!(failing.is_empty(), "{name}:\n{}", failing.join("\n"));
    report
}

/// The windows of `seed` judged against their bound (not unbounded, not cut off by the run's
/// end): at least `least` of them.
fn judged_windows(seed: &SeedReport, least: usize) -> Vec<&WindowReport> {
    let judged: Vec<_> = seed
        .windows
        .iter()
        .filter(|w| !w.unbounded && !w.cut_off)
        .collect();
    assert!(
        judged.len() >= least,
        "seed {}: {} judged",
        seed.seed,
        judged.len()
    );
    judged
}

#[test]
fn every_shipped_scenario_holds_every_invariant_on_a_few_seeds() {
    for name in SHIPPED {
        let r = run(name, FAST_SEEDS);
        assert_eq!(r.figures.violations, 0, "{name}");
        assert_eq!(r.runs, FAST_SEEDS, "{name}");
    }
}

#[test]
fn sliding_windows_are_judged_by_their_estimate_and_hold_it_through_a_partition() {
    // Demand is above the quota in every window, so the window before always weighs. Every
    // window of both limits is judged by the sliding window's estimate over all regions
    // (D54); `tenant` (floor) holds the quota with a bound of 0 once a window and the one
    // before it were watched whole, and `batch` (open while partitioned) states its fail-open
    // units again in the next window. With the weight ignored (each region admitting its
    // whole allowance) the estimate went up to 554 units above a bound of 0.
    let r = run("sliding-partition", FAST_SEEDS);
    assert_eq!(r.figures.violations, 0);
    for seed in &r.per_seed {
        let judged = judged_windows(seed, 18);
        for w in &judged {
            let estimate = w
                .estimate_units
                .expect("a sliding window is judged by its estimate");
            assert!(estimate >= w.admitted_units);
            if w.limit.ends_with("tenant") && w.start_ms >= 15_000 {
                assert!(estimate <= w.quota_units, "{w:?}");
            }
        }
        let previous = judged.iter().filter(|w| {
            w.bound.as_ref().is_some_and(|b| {
                b.terms
                    .iter()
                    .any(|t| t.name == "previous_window" && t.units > 0)
            })
        });
        assert!(previous.count() >= 3, "seed {}", seed.seed);
    }
}

#[test]
fn an_eventual_sliding_window_takes_the_window_before_off_its_view() {
    // Eventual mode (D83): a region admitting by its view holds `L - U` less the window
    // before's weight, `P^` its view of every region's use there. Every window is judged by
    // the estimate over all regions against the quota plus the bound (eventual terms kept
    // small by a rate cap and a 25 ms sync). Without the weight in view mode this scenario
    // failed 20 windows in seeds 0..4 (up to 595 units past the bound); with the weight
    // scaling the view's room instead of coming off it, 20 too (up to 142 past).
    let r = run("sliding-eventual", FAST_SEEDS);
    assert_eq!(r.figures.violations, 0);
    for seed in &r.per_seed {
        let judged = judged_windows(seed, 20);
        // Demand is far above the quota: the estimate, not the window's own count, is what
        // keeps each window near the quota.
        let weighed = judged
            .iter()
            .filter(|w| {
                let estimate = w.estimate_units.expect("judged by its estimate");
                estimate > w.admitted_units && estimate * 10 >= w.quota_units * 9
            })
            .count();
        assert!(weighed * 2 >= judged.len(), "seed {}: {weighed}", seed.seed);
    }
}

#[test]
fn rebalancing_follows_the_sun_where_a_static_split_cannot() {
    // Each region peaks well above its third of the quota while the others are quiet.
    let r = run("follow-the-sun", FAST_SEEDS);
    let (used, baseline) = (
        r.figures.utilization_p50.unwrap(),
        r.figures.baseline_utilization_p50.unwrap(),
    );
    assert!(used >= 0.99, "utilization {used}");
    assert!(
        baseline < 0.8,
        "the static split leaves shares unused: {baseline}"
    );
}

#[test]
fn strict_scenarios_never_admit_beyond_the_quota_on_a_perfect_clock() {
    // No clock skew, no settle overage, no open policy: the bound (beyond the skew term the
    // true-clock judgment allows) is zero, and so is the overshoot.
    for name in [
        "flash-crowd",
        "hot-key",
        "coordinator-failover",
        "retry-storm",
    ] {
        let r = run(name, FAST_SEEDS);
        assert_eq!(r.figures.overshoot_max, 0, "{name}");
        assert_eq!(r.figures.overshoot_max_on_region_clocks, 0, "{name}");
    }
}

/// The CI tier: `ALLOT_SLOW_TESTS=1 cargo test -p allot-sim --test shipped --release`.
#[test]
fn ci_tier_every_shipped_scenario_holds_on_a_hundred_seeds() {
    if std::env::var("ALLOT_SLOW_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set ALLOT_SLOW_TESTS=1 to run 100 seeds of every scenario");
        return;
    }
    for name in SHIPPED {
        let r = run(name, SLOW_SEEDS);
        eprintln!(
            "{name}: {} seeds, violations {}, overshoot max {}, utilization p50 {:?}",
            r.runs, r.figures.violations, r.figures.overshoot_max, r.figures.utilization_p50
        );
    }
}
