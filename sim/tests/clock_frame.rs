//! The leader's clock frame across a leader change (`allot_sim::clock_frame`): a region cut
//! off before the leader is lost is never heard by the next one, which reclaims its floor from
//! the samples the frame replicated, as the daemon's does, and the bound holds with the
//! handover's probe error drawn.

mod common;

use allot_sim::{Report, scenario};

/// Three regions on a strict closed limit of 6,000 units per 4 s window, 20% floors each.
/// `a` asks 8,000 a window; `c` is cut off from 8 s to 36 s, and the leader is lost from 9 s
/// to 10 s, so the leader from 10 s on never hears `c`.
const SCENARIO: &str = r#"
name: frame-across-leader-change
duration: 40s
sync_interval: 250ms
view_ttl: 2s
coordinator: {commit_latency: 10ms}
regions:
  - {id: a, weight: 0.2, latency: 10ms}
  - {id: b, weight: 0.2, latency: 20ms}
  - {id: c, weight: 0.2, latency: 35ms}
limits: |
  domain: lab
  descriptors:
    - key: closed
      rate_limit: {requests_per_unit: 6000}
      allot: {window: 4s, weights: {a: 0.2, b: 0.2, c: 0.2}, partition_policy: closed}
traffic:
  - {region: a, limit: lab/closed, key: closed, cost: {constant_units: 40}, rate: {steps: [{at: 0s, per_sec: 50}]}}
  - {region: b, limit: lab/closed, key: closed, cost: {constant_units: 40}, rate: {steps: [{at: 0s, per_sec: 4}]}}
  - {region: c, limit: lab/closed, key: closed, cost: {constant_units: 40}, rate: {steps: [{at: 0s, per_sec: 4}]}}
faults:
  - partition: {region: c, start: 8s, end: 36s}
  - coordinator_outage: {start: 9s, end: 10s}
"#;

fn run(text: &str, seeds: std::ops::Range<u64>) -> Report {
    let s = scenario::parse("frame.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    common::run(&s, seeds)
}

/// What `a` and `b` admitted together in the window starting at `start_ms`.
fn a_and_b(report: &Report, seed: usize, start_ms: u64) -> u64 {
    let w = report.per_seed[seed]
        .windows
        .iter()
        .find(|w| w.start_ms == start_ms)
        .unwrap_or_else(|| panic!("no window at {start_ms} ms"));
    w.admitted_units_per_region[0] + w.admitted_units_per_region[1]
}

/// `c`'s last SyncUp reached the first leader before 8 s; the second leader starts at 10 s
/// with `c`'s sample from the frame, so `c`'s deadline is 10 s + 2 s TTL + 0.5 s drift margin
/// plus its clock's uncertainty: the window from 16 s on is reclaimed, and `a` grows into
/// `c`'s floor of 1,200 there. Without the frame nothing of `c` is reclaimed until it is heard
/// again at 36 s, and `a` and `b` keep to 4,800 in every window of the cut.
#[test]
fn a_new_leader_reclaims_a_region_cut_off_before_it_from_the_replicated_frame() {
    let report = run(SCENARIO, 0..4);
    assert_eq!(
        report.figures.violations,
        0,
        "{:?}",
        report.failing_seeds().next().map(|s| &s.violation_details)
    );
    for seed in 0..4 {
        for start_ms in [16_000, 20_000, 24_000, 28_000] {
            let used = a_and_b(&report, seed, start_ms);
            assert!(
                used > 4_800,
                "seed {seed}, window at {start_ms} ms: a and b admitted {used}, c's floor was not reclaimed"
            );
            assert!(used <= 6_000, "seed {seed}: {used} above the quota");
        }
    }
}

/// The same cut with a long commit latency (the handover's probe round trip, whose error is
/// drawn up to half of it): the bound still holds on every seed.
#[test]
fn a_drawn_probe_error_keeps_the_bound() {
    let slow = SCENARIO.replace("commit_latency: 10ms", "commit_latency: 400ms");
    let report = run(&slow, 0..8);
    assert_eq!(
        report.figures.violations,
        0,
        "{:?}",
        report.failing_seeds().next().map(|s| &s.violation_details)
    );
}
