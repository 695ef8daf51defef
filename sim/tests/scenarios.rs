//! The shipped scenarios all parse, and bad scenario files are refused with an error that
//! names the file, the line and the field.

mod common;

use std::time::Duration;

use allot_sim::scenario::{self, Fault};
use allot_sim::{ScenarioError, SimError};
use common::{SHIPPED, scenarios_dir, shipped};

#[test]
fn every_shipped_scenario_parses_and_names_itself() {
    for name in SHIPPED {
        let s = shipped(name);
        assert_eq!(s.name, name, "a scenario's name is its file name");
        assert!(!s.description.is_empty(), "{name} says what it checks");
        assert!(!s.traffic.is_empty());
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = SHIPPED.iter().map(|n| format!("{n}.yaml")).collect();
    expected.sort();
    assert_eq!(on_disk, expected);
}

#[test]
fn shipped_scenarios_carry_the_faults_they_are_named_for() {
    let load = shipped;
    assert!(matches!(
        load("partition").faults[0],
        Fault::Partition { .. }
    ));
    assert!(matches!(
        load("coordinator-failover").faults[0],
        Fault::CoordinatorOutage { .. }
    ));
    let crash = load("agent-crash");
    assert!(
        crash
            .faults
            .iter()
            .any(|f| matches!(f, Fault::AgentCrash { .. }))
    );
    assert!(
        crash
            .faults
            .iter()
            .any(|f| matches!(f, Fault::GatewayCrash { .. }))
    );
    assert!(matches!(
        load("lossy-network").faults[0],
        Fault::Link { .. }
    ));
    let lab = load("lab-partition");
    assert!(matches!(lab.faults[..], [Fault::Partition { .. }]));
    assert_eq!(lab.regions.len(), 3);
    let skew = load("clock-skew");
    assert!(
        skew.regions
            .iter()
            .any(|r| r.clock.drift_ppm != 0 && r.clock.offset_nanos != 0)
    );
    let hot = load("hot-key");
    assert_eq!(hot.traffic.len(), 3);
    assert!(
        hot.traffic.iter().all(|t| t.key == hot.traffic[0].key),
        "one key"
    );
}

fn parse_err(text: &str) -> ScenarioError {
    match scenario::parse("bad.yaml", text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

/// A valid scenario to break one line at a time.
const GOOD: &str = "name: t
duration: 10s
regions:
  - id: a
    latency: 10ms
  - id: b
    latency: 20ms
    gateways: 2
limits: |
  domain: api
  descriptors:
    - key: tenant
      rate_limit:
        unit: second
        requests_per_unit: 100
traffic:
  - region: a
    limit: api/tenant
    key: tenant=1
    rate: {constant_per_sec: 10}
";

#[test]
fn the_base_scenario_of_these_tests_is_valid() {
    let s = scenario::parse("good.yaml", GOOD).unwrap();
    assert_eq!(s.limits.limits[0].quota_units, 100);
    assert_eq!(s.regions[0].weight_ppm, 500_000, "no weights: equal shares");
}

fn assert_error(text: &str, line: usize, field: &str, message: &str) {
    let e = parse_err(text);
    assert_eq!(e.file, "bad.yaml");
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(message), "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with(&format!("bad.yaml:{line}:")), "{shown}");
}

#[test]
fn a_yaml_syntax_error_names_its_line() {
    let text = GOOD.replace(
        "rate: {constant_per_sec: 10}",
        "rate: {constant_per_sec: 10",
    );
    let e = parse_err(&text);
    assert_eq!(e.field, "(syntax)");
    assert!(e.line >= 21, "{e}");
}

#[test]
fn an_unknown_field_is_an_error_not_a_silent_default() {
    let text = GOOD.replace("duration: 10s", "duration: 10s\nsync_intervall: 100ms");
    assert_error(&text, 3, "(top)", "unknown field `sync_intervall`");
    let text = GOOD.replace("    latency: 10ms", "    latency: 10ms\n    wieght: 0.5");
    assert_error(&text, 6, "regions[0]", "unknown field `wieght`");
}

#[test]
fn a_missing_field_is_named() {
    let text = GOOD.replace("name: t\n", "");
    assert_error(&text, 1, "(top)", "missing field `name`");
    let text = GOOD.replace("    latency: 20ms\n", "");
    assert_error(&text, 6, "regions[1]", "missing field `latency`");
}

#[test]
fn a_duration_needs_its_unit() {
    let text = GOOD.replace("duration: 10s", "duration: 10");
    assert_error(&text, 2, "duration", "duration with a unit");
    let text = GOOD.replace("latency: 10ms", "latency: 10 parsecs");
    assert_error(
        &text,
        5,
        "regions[0].latency",
        "invalid duration '10 parsecs'",
    );
    // The grammar of limits files: units written together, no spaces.
    let text = GOOD.replace("duration: 10s", "duration: 1m 30s");
    assert_error(&text, 2, "duration", "expected a duration such as 250ms");
    let s = scenario::parse(
        "good.yaml",
        &GOOD.replace("duration: 10s", "duration: 1m30s"),
    )
    .unwrap();
    assert_eq!(s.duration, Duration::from_secs(90));
}

#[test]
fn references_to_unknown_regions_and_limits_are_named() {
    let text = GOOD.replace("  - region: a", "  - region: c");
    assert_error(&text, 17, "traffic[0].region", "unknown region \"c\"");
    let text = GOOD.replace("limit: api/tenant", "limit: api/tenants");
    assert_error(&text, 18, "traffic[0].limit", "defines: api/tenant");
}

#[test]
fn errors_inside_the_limits_block_point_into_the_scenario_file() {
    let text = GOOD.replace("requests_per_unit: 100", "requests_per_unit: -5");
    // The block's text starts on line 10; `requests_per_unit` is on line 15 of the file. The
    // section is read by the configuration loader, whose words these are.
    assert_error(
        &text,
        15,
        "limits: descriptors[0].rate_limit.requests_per_unit",
        "must be at least 0",
    );
    let text = GOOD.replace("unit: second", "unit: fortnight");
    assert_error(
        &text,
        14,
        "limits: descriptors[0].rate_limit.unit",
        "fortnight",
    );
}

#[test]
fn the_limits_section_means_what_the_loader_says_it_means() {
    // One reader of limits files: a quota of 0 is a rule that admits nothing, as the agent
    // loads it, not an error of the simulator's own.
    let text = GOOD.replace("requests_per_unit: 100", "requests_per_unit: 0");
    let s = scenario::parse("good.yaml", &text).unwrap();
    assert_eq!(s.limits.limits[0].quota_units, 0);
    // An unlimited rule has nothing to judge: with no other rule, nothing to measure.
    let text = GOOD.replace(
        "        unit: second\n        requests_per_unit: 100\n",
        "        unlimited: true\n",
    );
    let e = parse_err(&text);
    assert!(e.message.contains("nothing to measure"), "{e}");
}

#[test]
fn limits_must_be_a_block_of_text() {
    let text = GOOD.replace("limits: |", "limits:");
    let e = parse_err(&text);
    assert_eq!((e.line, e.field.as_str()), (10, "limits"));
    assert!(e.message.contains("block of text"), "{e}");
}

#[test]
fn weights_above_one_and_broken_clocks_are_refused() {
    let text = GOOD
        .replace("    latency: 10ms", "    latency: 10ms\n    weight: 0.7")
        .replace("    latency: 20ms", "    latency: 20ms\n    weight: 0.6");
    assert_error(&text, 4, "regions", "above 1");
    let text = GOOD.replace(
        "    latency: 10ms",
        "    latency: 10ms\n    clock: {drift_ppm: 200000}",
    );
    assert_error(&text, 6, "regions[0].clock.drift_ppm", "drift beyond");
}

#[test]
fn faults_are_checked_against_the_deployment_and_the_timeline() {
    let text = format!("{GOOD}faults:\n  - gateway_crash: {{region: b, gateway: 2, at: 1s}}\n");
    assert_error(
        &text,
        22,
        "faults[0].gateway_crash.gateway",
        "has 2 gateways",
    );
    let text = format!("{GOOD}faults:\n  - partition: {{region: a, start: 5s, end: 20s}}\n");
    assert_error(
        &text,
        22,
        "faults[0].partition.end",
        "after the end of the run",
    );
    let text = format!("{GOOD}faults:\n  - earthquake: {{region: a}}\n");
    assert_error(&text, 22, "faults[0]", "unknown fault \"earthquake\"");
}

#[test]
fn a_missing_file_is_named() {
    let err = scenario::load(&scenarios_dir().join("no-such.yaml")).unwrap_err();
    assert!(matches!(err, SimError::Read { .. }));
    assert!(err.to_string().contains("no-such.yaml"));
}

#[test]
fn a_window_may_be_set_in_the_allot_block_instead_of_the_unit() {
    let text = GOOD.replace(
        "        unit: second\n        requests_per_unit: 100\n",
        "        requests_per_unit: 100\n      allot:\n        window: 1m30s\n",
    );
    let s = scenario::parse("good.yaml", &text).unwrap();
    assert_eq!(s.limits.limits[0].window.len().as_secs(), 90);
    let both = GOOD.replace(
        "        requests_per_unit: 100\n",
        "        requests_per_unit: 100\n      allot:\n        window: 10s\n",
    );
    assert_error(
        &both,
        14,
        "limits: descriptors[0].rate_limit.unit",
        "set the window in one place",
    );
}

/// A `config_reload` with its limits at `units` per `unit`, at `at`, `b` `delay` later.
fn reload(at: &str, units: u32, unit: &str, delay: &str) -> String {
    format!(
        "  - config_reload:
      at: {at}
      stagger: {{b: {delay}}}
      limits: |
        domain: api
        descriptors:
          - key: tenant
            rate_limit: {{unit: {unit}, requests_per_unit: {units}}}
"
    )
}

#[test]
fn a_config_reload_keeps_the_limits_and_their_windows_and_comes_in_time_order() {
    let text = format!("{GOOD}faults:\n{}", reload("2s", 40, "second", "500ms"));
    let s = scenario::parse("good.yaml", &text).unwrap();
    let Fault::ConfigReload { at, stagger, .. } = &s.faults[0] else {
        panic!("{:?}", s.faults[0]);
    };
    assert_eq!(at.as_millis(), 2_000);
    assert_eq!(
        stagger.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        [0, 500]
    );
    // Windows before the reload are judged at 100, those it overlaps at the larger quota,
    // those after the last region's reload at 40.
    let limit = &s.limits.limits[0];
    let second = |at_s: u64| {
        let start = s.start.as_unix_nanos() + at_s * 1_000_000_000;
        limit.quota_units_in(start, start + 1_000_000_000)
    };
    assert_eq!((second(1), second(2), second(3)), (100, 100, 40));
    let window_changed = format!("{GOOD}faults:\n{}", reload("2s", 40, "minute", "0s"));
    assert!(parse_err(&window_changed).message.contains("same windows"));
    let out_of_order = format!(
        "{GOOD}faults:\n{}{}",
        reload("5s", 40, "second", "0s"),
        reload("2s", 60, "second", "0s")
    );
    assert!(parse_err(&out_of_order).message.contains("time order"));
    let unknown = format!("{GOOD}faults:\n{}", reload("2s", 40, "second", "0s"))
        .replace("stagger: {b: 0s}", "stagger: {c: 1s}");
    parse_err(&unknown);
}
