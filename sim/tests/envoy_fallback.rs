//! Envoy's RLQS fallback in the simulator (`regions[].envoy_fallback_units`, D69): gateways
//! that hold no lease while their agent is down admit on their own, up to a stated amount a
//! key and window, and report it when the agent is back. The rule's `rlqs_fallback_units`
//! puts it in the bound; without it the judge finds the overshoot, and a report past it
//! leaves its window unbounded.

mod common;

use allot_sim::{Report, scenario};

/// Two regions, strict, 2,000 units per 10 s window, both asking for more than their half
/// from the start. Region `a`'s agent is down from 8 s to 13 s, after its share of the first
/// window is spent: its two gateways then admit up to 100 units each a window on their own,
/// so the first window admits up to 2,000 + 200. A rate cap keeps the skew term small, and
/// the judge on the regions' clocks leaves it out: what is left of the bound is the fallback
/// term, `2 regions * stated_units`. `extra_faults` are appended to the faults.
fn scenario_text(stated_units: u64, gateway_units: u64, extra_faults: &str) -> String {
    format!(
        r#"
name: envoy-fallback
duration: 30s
sync_interval: 250ms
lease: {{initial_units: 5, max_units: 50, ttl: 2s}}
regions:
  - {{id: a, weight: 0.5, latency: 5ms, gateways: 2, envoy_fallback_units: {gateway_units}}}
  - {{id: b, weight: 0.5, latency: 5ms}}
limits: |
  domain: gw
  descriptors:
    - key: api_key
      rate_limit: {{requests_per_unit: 2000}}
      allot: {{window: 10s, weights: {{a: 0.5, b: 0.5}}, failure_mode: closed, rate_cap: {{rate: 1000/s, burst: 20}}, rlqs_fallback_units: {stated_units}}}
traffic:
  - {{region: a, limit: gw/api_key, key: k, rate: {{constant_per_sec: 400}}}}
  - {{region: b, limit: gw/api_key, key: k, rate: {{constant_per_sec: 400}}}}
faults:
  - agent_crash: {{region: a, at: 8s, restart_after: 5s}}
{extra_faults}"#
    )
}

fn run(stated_units: u64, extra_faults: &str, seeds: std::ops::Range<u64>) -> Report {
    let text = scenario_text(stated_units, 100, extra_faults);
    let s = scenario::parse("envoy-fallback.yaml", &text).unwrap_or_else(|e| panic!("{e}"));
    common::run(&s, seeds)
}

/// The first window on every seed: what `a` admitted beyond its share of 1,000 is its
/// gateways' fallback.
fn first_window_fallback(report: &Report) -> Vec<u64> {
    report
        .per_seed
        .iter()
        .map(|s| {
            let w = s
                .windows
                .iter()
                .find(|w| w.start_ms == 0)
                .expect("window 0");
            w.admitted_units_per_region[0].saturating_sub(1_000)
        })
        .collect()
}

/// Stated as it is (`a`'s two gateways admit 200 a window: `rlqs_fallback_units: 200`), the
/// bound holds on every seed; stated as 0, the judge finds the 200 units no term covers.
#[test]
fn the_stated_fallback_keeps_the_bound_and_without_it_the_overshoot_is_found() {
    let stated = run(200, "", 0..6);
    assert_eq!(
        stated.figures.violations,
        0,
        "{:?}",
        stated.failing_seeds().next().map(|s| &s.violation_details)
    );
    assert!(
        first_window_fallback(&stated).iter().all(|u| *u == 200),
        "{:?}",
        first_window_fallback(&stated)
    );
    for s in &stated.per_seed {
        assert_eq!(
            s.stats.envoy_fallback_units_reported, 400,
            "both windows' 200"
        );
        assert_eq!(s.stats.envoy_fallback_units_lost, 0);
    }
    let unstated = run(0, "", 0..6);
    assert_eq!(unstated.figures.violations, 6, "one window on every seed");
    for s in &unstated.per_seed {
        assert!(
            s.violation_details
                .iter()
                .all(|v| v.kind == "overshoot_above_bound_on_region_clocks" && v.at_ms == 0),
            "{:?}",
            s.violation_details
        );
    }
}

/// A statement below what the gateways admit (50 a region: a term of 100 against 200) is
/// caught by the judge, not by the agent: the gateways report after the restart, in the
/// window of the report, which the agent cannot tell from the window they admitted in.
#[test]
fn an_understated_fallback_is_found_by_the_judge() {
    let report = run(50, "", 0..4);
    assert_eq!(report.figures.violations, 4);
}

/// The reports reach the agent in the window it restarted in, where its tally cannot know
/// what an earlier start charged: that window is stated unbounded, never bounded by a term
/// the reports broke. The window after is bounded again.
#[test]
fn fallback_reported_in_the_window_of_a_restart_leaves_it_unbounded() {
    let report = run(200, "", 0..4);
    for s in &report.per_seed {
        let at = |ms| s.windows.iter().find(|w| w.start_ms == ms).expect("window");
        assert!(
            at(10_000).unbounded,
            "the window of the restart and the reports"
        );
        assert!(!at(20_000).unbounded);
        assert!(!at(0).unbounded);
    }
}

/// A gateway that crashes before its agent is back takes its report with it (an Envoy that
/// exits): nothing checks those units, and the stated term still covers them.
#[test]
fn a_gateway_lost_before_it_reports_is_still_covered_by_the_stated_term() {
    let crash = "  - gateway_crash: {region: a, gateway: 0, at: 9500ms, restart_after: 1s}\n";
    let report = run(200, crash, 0..6);
    assert_eq!(
        report.figures.violations,
        0,
        "{:?}",
        report.failing_seeds().next().map(|s| &s.violation_details)
    );
    for s in &report.per_seed {
        assert!(s.stats.envoy_fallback_units_lost > 0, "{:?}", s.stats);
        assert!(s.stats.envoy_fallback_admits > 0);
    }
}
