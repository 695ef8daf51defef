//! `allot check-config`, run as the real binary: exit codes, the rule lines on stdout and the
//! error lines on stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the allot binary runs")
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Writes `text` to a file of this test's own in the target's scratch directory.
fn scratch_file(test: &str, name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("check_config")
        .join(test);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("scratch file");
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("scratch paths are UTF-8")
}

#[test]
fn shipped_examples_load_and_print_one_line_per_rule() {
    let out = allot(&[
        "check-config",
        "examples/limits/default.yaml",
        "examples/limits/public_api.yaml",
        "examples/limits/llm_tokens.yaml",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Files in argument order, each rule in the order written.
    assert_eq!(
        stdout_lines(&out),
        [
            "domain=default descriptor=remote_address quota=100 window=1s mode=strict",
            "domain=default descriptor=generic_key quota=6000 window=1m mode=strict",
            "domain=public_api descriptor=remote_address quota=20 window=1s mode=strict",
            "domain=public_api descriptor=api_key quota=6000 window=1m mode=strict",
            "domain=public_api descriptor=api_key/route=orders_post quota=100 window=1m mode=strict",
            "domain=public_api descriptor=api_key/route=export_create quota=20 window=1h mode=strict",
            "domain=public_api descriptor=api_key/route quota=1000 window=1m mode=strict",
            "domain=public_api descriptor=api_key=ptr_* quota=60000 window=1m mode=strict",
            "domain=public_api descriptor=api_key=lb-health quota=unlimited window=- mode=-",
            "domain=public_api descriptor=path=/v1/* quota=50 window=1s mode=strict",
            "domain=public_api descriptor=path=/v2/search* quota=10 window=1s mode=strict shadow",
            "domain=llm descriptor=tenant quota=1000000 window=1h mode=eventual",
            "domain=llm descriptor=tenant/model=frontier-xl quota=200000 window=90m mode=strict",
            "domain=llm descriptor=plan=free quota=50000 window=1d mode=strict disabled",
        ]
    );
    assert_eq!(
        stderr_lines(&out),
        ["ok: 14 rules in 3 domains from 3 files"]
    );
}

/// envoyproxy/ratelimit's documented examples load unchanged: wildcards anywhere in a value,
/// share_threshold, value_to_metric, detailed_metric, quota_mode and metadata.
#[test]
fn the_envoyproxy_ratelimit_example_loads_unchanged() {
    let out = allot(&["check-config", "examples/limits/envoy_compat.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule = |descriptor: &str, quota: u64, window: &str| {
        format!(
            "domain=envoy_compat descriptor={descriptor} quota={quota} window={window} mode=strict"
        )
    };
    assert_eq!(
        stdout_lines(&out),
        [
            rule("key1", 10, "1m"),
            rule("key1=value1", 20, "1m"),
            rule("key1=value*", 20, "1m"),
            rule("path=/api/*/action", 20, "1m"),
            rule("route=/api/*/resource/*/action", 20, "1m"),
            rule("route/http_method/subject_id", 60, "1m"),
            rule("user/action=read*/resource", 100, "1m"),
            rule("files=files/*", 10, "1h"),
            rule("files_no_share=files_no_share/*", 10, "1h"),
            rule("route=api/*/method", 60, "1m"),
            rule("service=service_1", 1, "1m") + " quota_mode metadata",
            rule("service=service_2", 2, "1m") + " quota_mode metadata",
        ]
    );
    assert_eq!(stderr_lines(&out), ["ok: 12 rules in 1 domain from 1 file"]);
}

#[test]
fn every_error_goes_to_stderr_and_the_exit_code_is_one() {
    let bad = scratch_file(
        "errors",
        "bad.yaml",
        "domain: shop\ndescriptors:\n  - key: route\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: -3\n  - value: orphan\n",
    );
    let out = allot(&["check-config", arg(&bad)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "no rules are printed when loading fails"
    );
    let name = bad.display();
    // `      unit: ` and `      requests_per_unit: ` put the values at columns 13 and 26;
    // the key-less descriptor's mapping starts at line 7, column 5.
    assert_eq!(
        stderr_lines(&out),
        [
            format!(
                "{name}:5:13: descriptors[0].rate_limit.unit: invalid rate limit unit \
                 'fortnight' (expected second, minute, hour, day, week, month or year)"
            ),
            format!(
                "{name}:6:26: descriptors[0].rate_limit.requests_per_unit: requests_per_unit \
                 must be at least 0, found -3"
            ),
            format!("{name}:7:5: descriptors[1].key: descriptor has empty key"),
            "check-config: 3 errors".to_owned(),
        ]
    );
}

#[test]
fn an_unreadable_file_is_an_error_like_the_others() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("check_config/does-not-exist.yaml");
    let bad = scratch_file("unreadable", "bad.yaml", "domain: ''\n");
    let out = allot(&["check-config", arg(&missing), arg(&bad)]);
    assert_eq!(out.status.code(), Some(1));
    let errors = stderr_lines(&out);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(
        errors[0].starts_with(&format!("{}: cannot read file: ", missing.display())),
        "{errors:#?}"
    );
    assert_eq!(
        errors[1],
        format!(
            "{}:1:9: domain: config file cannot have empty domain",
            bad.display()
        )
    );
    assert_eq!(errors[2], "check-config: 2 errors");
}

#[test]
fn a_file_that_is_not_utf8_is_reported() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("check_config/binary");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("limits.yaml");
    std::fs::write(&path, b"domain: \xff\xfe\n").expect("scratch file");
    let out = allot(&["check-config", arg(&path)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&out)[0],
        format!(
            "{}: file is not UTF-8 text (invalid byte at offset 8)",
            path.display()
        )
    );
}

#[test]
fn merge_domains_joins_files_of_one_domain() {
    let a = scratch_file(
        "merge",
        "a.yaml",
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
    );
    let b = scratch_file(
        "merge",
        "b.yaml",
        "domain: api\ndescriptors:\n  - key: route\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
    );
    let separate = allot(&["check-config", arg(&a), arg(&b)]);
    assert_eq!(separate.status.code(), Some(1));
    assert!(
        stderr_lines(&separate)[0].contains("duplicate domain 'api'"),
        "{:?}",
        stderr_lines(&separate)
    );

    let merged = allot(&["check-config", "--merge-domains", arg(&a), arg(&b)]);
    assert!(merged.status.success(), "{:?}", stderr_lines(&merged));
    assert_eq!(
        stdout_lines(&merged),
        [
            "domain=api descriptor=tenant quota=10 window=1m mode=strict",
            "domain=api descriptor=route quota=7 window=1h mode=strict",
        ]
    );
    assert_eq!(
        stderr_lines(&merged),
        ["ok: 2 rules in 1 domain from 2 files"]
    );
}

#[test]
fn values_with_spaces_are_quoted_so_lines_split_on_spaces() {
    let path = scratch_file(
        "quoting",
        "limits.yaml",
        "domain: api\ndescriptors:\n  - key: plan\n    value: free tier\n    rate_limit: {unit: day, requests_per_unit: 5}\n",
    );
    let out = allot(&["check-config", arg(&path)]);
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert_eq!(
        stdout_lines(&out),
        ["domain=api descriptor=\"plan=free tier\" quota=5 window=1d mode=strict"]
    );
}

#[test]
fn a_sliding_window_rule_says_so_in_either_consistency() {
    let path = scratch_file(
        "sliding",
        "limits.yaml",
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    allot: {algorithm: sliding_window}\n",
    );
    let out = allot(&["check-config", arg(&path)]);
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert_eq!(
        stdout_lines(&out),
        ["domain=api descriptor=k quota=100 window=1m mode=strict sliding_window"]
    );
    let path = scratch_file(
        "sliding-eventual",
        "limits.yaml",
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    allot: {consistency: eventual, algorithm: sliding_window}\n",
    );
    let out = allot(&["check-config", arg(&path)]);
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert_eq!(
        stdout_lines(&out),
        ["domain=api descriptor=k quota=100 window=1m mode=eventual sliding_window"]
    );
}

#[test]
fn check_config_needs_at_least_one_file() {
    let out = allot(&["check-config"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error, as clap reports it"
    );
    assert!(out.stdout.is_empty());
}
