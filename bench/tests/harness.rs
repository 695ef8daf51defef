//! `allot-bench run` end to end, as a user runs it: the no-op server started as a subprocess,
//! Redis when installed, every scenario measured for a fraction of a second, the JSON read
//! back. Slow tier (`ALLOT_SLOW_TESTS=1`): it starts processes and runs real load.

use std::process::Command;

use serde_json::Value;

#[test]
fn run_measures_noop_and_redis_side_by_side_and_writes_json() {
    if std::env::var("ALLOT_SLOW_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped (slow tier; set ALLOT_SLOW_TESTS=1)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    // CI installs redis-server, so there its absence is a failure.
    let redis = if allot_bench::process::missing_tools_are_errors() {
        "required"
    } else {
        "auto"
    };
    let out = Command::new(env!("CARGO_BIN_EXE_allot-bench"))
        .args(["run", "--warmup", "100ms", "--duration", "300ms"])
        .args(["--callers", "2", "--many-keys", "10", "--redis", redis])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("acquire_hot"),
        "the table names the scenarios:\n{stdout}"
    );

    let output: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let servers: Vec<&str> = output["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(servers[0], "noop");
    let measurements = output["measurements"].as_array().unwrap();
    for m in measurements {
        let r = &m["report"];
        let label = format!("{} on {}", m["scenario"], m["server"]);
        assert!(
            r["calls"].as_u64().unwrap() > 0,
            "{label}: no call answered"
        );
        assert_eq!(r["error_count"].as_u64(), Some(0), "{label}: {r}");
        assert_eq!(r["denied"].as_u64(), Some(0), "{label}: nothing is denied");
        assert!(
            r["server_cpu"]["cpu_secs"].is_number(),
            "{label}: CPU measured"
        );
        if m["scenario"] == "lease_hot" {
            // Every Lease call is granted its 100 units, all spent locally.
            let allowed = r["allowed"].as_u64().unwrap();
            assert_eq!(r["admitted"].as_u64(), Some(allowed * 100), "{label}");
        } else {
            assert_eq!(r["admitted"], r["allowed"], "{label}");
        }
    }
    // Each of the five scenarios on the no-op server, three of them on Redis when it ran.
    let on = |server: &str| {
        measurements
            .iter()
            .filter(|m| m["server"] == server)
            .count()
    };
    assert_eq!(on("noop"), 5);
    let redis_count = if servers.contains(&"redis") { 3 } else { 0 };
    assert_eq!(on("redis"), redis_count);
    // No agent, so no targets: they are checked on the agent's rows only.
    assert_eq!(output["targets"].as_array().map(Vec::len), Some(0));
}
