//! `allot sim`, run as the real binary over the real machines: the summary, the report file,
//! and the exit status.

use std::path::Path;
use std::process::Command;

#[test]
fn a_shipped_scenario_runs_and_reports() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sim_cli");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let report = dir.join("retry-storm.json");
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args([
            "sim",
            "--scenario",
            "sim/scenarios/retry-storm.yaml",
            "--seeds",
            "3..5",
        ])
        .args(["--jobs", "2", "--report"])
        .arg(&report)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the allot binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("scenario retry-storm: seeds 3..5 (2 runs)"),
        "{stdout}"
    );
    assert!(stdout.contains("violations            0"), "{stdout}");
    let json = std::fs::read_to_string(&report).expect("report written");
    assert!(json.contains("\"seeds\": \"3..5\""), "{json}");
}

#[test]
fn a_scenario_the_loader_refuses_is_an_error_naming_its_line() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sim_cli");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sim/scenarios/partition.yaml"),
    )
    .expect("shipped scenario")
    .replace("partition_policy: floor", "partition_policy: sideways");
    let path = dir.join("bad-policy.yaml");
    std::fs::write(&path, text).expect("scratch file");
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["sim", "--scenario"])
        .arg(&path)
        .args(["--seeds", "0"])
        .output()
        .expect("the allot binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad-policy.yaml:"), "{stderr}");
    assert!(stderr.contains("sideways"), "{stderr}");
}
