//! `allot config put` on real processes: one `allot coordinator` and one `allot agent
//! --coordinator`. A new version with a smaller quota reaches the agent from the sync stream and
//! is enforced there without a restart; a file that does not load is refused with its
//! file:line:column and nothing changes; the same files again commit nothing, other files at an
//! old version are refused; a restarted agent keeps the
//! cluster's version over its own files.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};

use support::{Process, clear_of_the_day_boundary, eventually, free_port, scratch};

/// One region `a` holding the whole quota of a strict day limit.
fn limits(quota: u64) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: strict\n    rate_limit: {{unit: day, requests_per_unit: {quota}}}\n    allot: {{weights: {{a: 1}}}}\n"
    )
}

/// Sends `body` as-is and returns the status line and the body.
fn put_raw(addr: &str, body: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "PUT /v1/config HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("send");
    // The node may answer and close before the whole body is read (too large).
    let _ = s.write_all(body);
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .output()
        .expect("allot runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_version_reaches_the_agent_from_the_sync_stream_and_bad_or_old_ones_change_nothing() {
    clear_of_the_day_boundary().await;
    let dir = scratch("config_put", "put", None);
    std::fs::write(dir.join("limits.yaml"), limits(100)).expect("limits");
    let coordinator = Process::start(support::coordinator_cmd(&dir), "coordinator");
    let agent = Process::agent(&dir, "a", Some(&coordinator.grpc));
    agent.synced().await;
    assert!(agent.acquire("shop", "strict", "t1", 6).await, "6 of 100");

    // Version 2: the quota goes from 100 to 5. Nothing is copied to the agent.
    std::fs::write(dir.join("smaller.yaml"), limits(5)).expect("limits");
    let smaller = dir.join("smaller.yaml").display().to_string();
    // The first address is no node at all: the put goes on to the next.
    let dead = format!("127.0.0.1:{}", free_port());
    let nodes = format!("{dead},{}", coordinator.http);
    let out = allot(&["config", "put", &smaller, "--coordinator", &nodes]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).starts_with("version 2 committed (1 rules)"),
        "{out:?}"
    );
    let status = eventually(
        "the agent takes version 2",
        || agent.json("/v1/status"),
        |s| s["config_version"] == 2,
    )
    .await;
    assert_eq!(status["config_source"], "cluster", "{status}");
    let key = agent.json("/v1/keys?domain=shop&descriptor=strict=t1");
    assert_eq!(key["quota_units"], 5, "{key}");
    // Enforced: 6 used is above the new quota; a fresh key gets 5 and no more.
    assert!(
        !agent.acquire("shop", "strict", "t1", 1).await,
        "t1 is over the new quota"
    );
    assert!(agent.acquire("shop", "strict", "t2", 5).await, "5 of 5");
    assert!(!agent.acquire("shop", "strict", "t2", 1).await, "6 of 5");

    // A file that does not load: every problem at file:line:column, nothing sent.
    std::fs::write(
        dir.join("bad.yaml"),
        limits(7).replace("unit: day", "unit: fortnight"),
    )
    .expect("limits");
    let bad = dir.join("bad.yaml").display().to_string();
    let out = allot(&["config", "put", &bad, "--coordinator", &coordinator.http]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{bad}:4:")), "{err}");
    assert!(err.contains("fortnight"), "{err}");
    assert!(err.contains("nothing sent"), "{err}");
    // The same files again, at their version: nothing committed, their version named (a
    // retry whose answer was lost).
    let again = |file: &str| {
        allot(&[
            "config",
            "put",
            file,
            "--coordinator",
            &coordinator.http,
            "--version",
            "2",
        ])
    };
    let out = again(&smaller);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).contains("version 2 committed (1 rules)")
            && text(&out.stdout).contains("nothing committed again"),
        "{out:?}"
    );
    // Other files at an old version: refused by the cluster, which says which version is in
    // force.
    std::fs::write(dir.join("other.yaml"), limits(7)).expect("limits");
    let out = again(&dir.join("other.yaml").display().to_string());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("limits version 2 is not above the current version 2"),
        "{err}"
    );
    // Garbage and an oversized body to the admin call: clear errors.
    let (line, body) = put_raw(&coordinator.http, b"garbage");
    assert!(line.contains("400"), "{line}");
    assert!(body.contains("not a configuration put"), "{body}");
    let (line, body) = put_raw(&coordinator.http, &vec![b'x'; 1 << 20]);
    assert!(line.contains("413"), "{line} {body}");
    // A file that loads on the node's side only if it is checked there: the node's own check.
    let (line, body) = put_raw(
        &coordinator.http,
        br#"{"files":[{"name":"n.yaml","text":"domain: shop\ndescriptors:\n  - key: strict\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}]}"#,
    );
    assert!(line.contains("400"), "{line}");
    assert!(body.contains("n.yaml:4:"), "{body}");

    let out = allot(&["config", "get", "--coordinator", &coordinator.http]);
    assert!(out.status.success(), "{out:?}");
    let printed = text(&out.stdout);
    assert!(printed.starts_with("version 2\n"), "{printed}");
    assert!(
        printed.contains("descriptor=strict quota=5 window=1d"),
        "{printed}"
    );
    assert_eq!(agent.json("/v1/status")["config_version"], 2);

    // A restart keeps the cluster's version over the agent's own files (quota 100), from its
    // first answer on.
    drop(agent);
    let agent = Process::agent(&dir, "a", Some(&coordinator.grpc));
    let status = agent.json("/v1/status");
    assert_eq!(status["config_version"], 2, "{status}");
    assert_eq!(status["config_source"], "cluster", "{status}");
    let key = agent.json("/v1/keys?domain=shop&descriptor=strict=t2");
    assert_eq!(key["quota_units"], 5, "{key}");
}
