//! `allot demo`, run as the real binary: three coordinator processes and three agents under
//! the demo's own traffic, the leader SIGKILLed mid-run. Checks the `--json` summary against
//! what the system promises (strict: no window above its quota; every window within its quota
//! plus the bound a leader stated for it), and its figures against each other: the agents'
//! totals (`/metrics`) against their per-window counters (`/v1/keys`), and against what the
//! demo's gateways were admitted. Also: bad flags are refused before anything starts; and
//! (slow tier) a region cut off through the demo's relay loses its sync stream for the cut
//! and no longer, and no window goes over its quota meanwhile.

mod support;

use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use support::slow_tier;

fn demo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .arg("demo")
        .args(args)
        .output()
        .expect("the allot binary runs")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a whole number: {v}"))
}

#[test]
fn the_demo_kills_the_leader_and_every_window_holds_its_bound() {
    let started = Instant::now();
    let out = demo(&["--duration", "20s", "--kill-leader-at", "8", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout: {e}\n{stderr}"));
    let all = format!("{s:#}\n{stderr}");
    eprintln!("the demo ran {:?}", started.elapsed());

    assert!(s["duration_s"].as_f64().is_some_and(|d| d >= 19.0), "{all}");
    // The kill happened, and a leader of a later term took over within the run.
    let killed_term = u(&s["killed"]["term"]);
    assert!(u(&s["leader_changes"]) >= 1, "{all}");
    let leaders = s["leaders"].as_array().expect("leaders");
    assert!(
        leaders.iter().any(|l| u(&l["term"]) > killed_term),
        "no leader after the kill: {all}"
    );

    let mut windows_admitted = 0;
    for l in s["limits"].as_array().expect("limits") {
        let quota = u(&l["quota"]);
        let windows = l["windows"].as_array().expect("windows");
        assert!(!windows.is_empty(), "{all}");
        for w in windows {
            let admitted = u(&w["admitted"]);
            windows_admitted += admitted;
            // The limit is strict: per window index, the regions' allowances add up to at
            // most the quota, with or without a leader.
            assert!(admitted <= quota, "window {}: {all}", w["index"]);
            if let Some(bound) = w["bound"].as_u64() {
                assert!(admitted <= quota + bound, "window {}: {all}", w["index"]);
            }
            assert!(w["exact"] == true, "a window read before it closed: {all}");
        }
        let max = u(&l["admitted_max_window"]);
        let bound = u(&l["bound"]);
        assert!(max <= quota + bound, "{all}");
        assert_eq!(u(&l["overshoot_max"]), max.saturating_sub(quota), "{all}");
        assert_eq!(l["within_bound"], true, "{all}");
    }

    let mut regions_admitted = 0;
    let mut client_denied = 0;
    for r in s["regions"].as_array().expect("regions") {
        let admitted = u(&r["admitted"]);
        assert!(admitted > 0, "{}: {all}", r["name"]);
        regions_admitted += admitted;
        // The agent counts every unit it leased and never got back: at least what the
        // region's gateway spent.
        assert!(
            u(&r["client"]["admitted"]) <= admitted,
            "{}: {all}",
            r["name"]
        );
        assert!(r["allowance_last"].as_u64().is_some(), "{all}");
        client_denied += u(&r["client"]["denied"]);
    }
    // The agents' totals and their per-window counters are two records of the same units.
    assert_eq!(regions_admitted, windows_admitted, "{all}");
    // Demand is above the quota: windows fill and gateways are refused.
    assert!(client_denied > 0, "{all}");
}

/// 10 s cut of `eu-west`, from second 4 to 14 of a 20 s run, with no leader kill.
#[test]
fn a_region_cut_off_by_the_relay_loses_its_link_for_the_cut_only() {
    if !slow_tier() {
        return;
    }
    let out = demo(&[
        "--duration",
        "20s",
        "--partition",
        "eu-west@4..14",
        // The cut alone: the default kill half way would cut every region's link a while.
        "--kill-leader-at",
        "none",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout: {e}\n{stderr}"));
    let all = format!("{s:#}\n{stderr}");
    assert_eq!(s["partition"]["region"], "eu-west", "{all}");
    for r in s["regions"].as_array().expect("regions") {
        let down = r["sync_down_s"].as_f64().expect("sync_down_s");
        if r["name"] == "eu-west" {
            // The cut, plus at most a read to notice and the agent's reconnection backoff.
            assert!((9.0..=16.0).contains(&down), "eu-west down {down} s: {all}");
        } else {
            assert!(down <= 1.0, "{} down {down} s: {all}", r["name"]);
        }
        assert!(u(&r["admitted"]) > 0, "{all}");
    }
    for l in s["limits"].as_array().expect("limits") {
        for w in l["windows"].as_array().expect("windows") {
            assert!(
                u(&w["admitted"]) <= u(&l["quota"]),
                "window {}: {all}",
                w["index"]
            );
        }
    }
}

#[test]
fn bad_flags_are_refused_before_anything_starts() {
    let cases: [(&[&str], &str); 4] = [
        (&["--partition", "mars@1..2"], "unknown region 'mars'"),
        (&["--partition", "eu-west@9..3"], "FROM must come before TO"),
        (
            &["--duration", "20s", "--kill-leader-at", "25"],
            "--kill-leader-at 25: past the run's end",
        ),
        (&["--duration", "soon"], "--duration 'soon'"),
    ];
    for (args, why) in cases {
        let out = demo(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
