//! The lease API over HTTP/JSON on a real `allot agent`: the calls answer as their gRPC
//! twins do (one code path: an idempotency key used over gRPC is the same request over JSON),
//! every bad input is a 4xx with a JSON error, and the Python gateway example
//! (`client/examples/python/gateway.py`) holds a tokens budget with reserve-then-settle.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use allot_proto::lease::v1 as pb;
use serde_json::{Value, json};

use support::Process;

const DOMAIN: &str = "llm_gateway";

/// The example's limits with an hour's window instead of a minute's, so that no window ends
/// mid-test; 100 tokens per key, and slots for the slot calls.
const LIMITS: &str = "\
domain: llm_gateway
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: worker
    rate_limit: {unit: hour, requests_per_unit: 1000}
    allot:
      concurrency: {max_slots: 1, slot_ttl: 30s}
";

fn agent(test: &str) -> Process {
    let dir = support::scratch("lease_http", test, Some(LIMITS));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, &dir, "local", None);
    Process::start(cmd, "agent")
}

/// One HTTP/1.1 request on its own connection: the status and the body as JSON (Null when
/// the body is not JSON).
fn request(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("connects");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let headers = "Content-Type: application/json\r\n";
    request(addr, "POST", path, headers, &body.to_string())
}

fn target(entry: &str, value: &str) -> Value {
    json!({ "domain": DOMAIN, "entries": [{ "key": entry, "value": value }] })
}

fn key_view(agent: &Process, value: &str) -> Value {
    agent.json(&format!(
        "/v1/keys?domain={DOMAIN}&descriptor=api_key={value}"
    ))
}

/// Net tokens the agent counts for `api_key=value`: granted minus refunded.
fn net_units(agent: &Process, value: &str) -> u64 {
    let v = key_view(agent, value);
    v["granted_units"].as_u64().expect("granted") - v["refunded_units"].as_u64().expect("refunded")
}

#[tokio::test]
async fn json_calls_are_the_lease_api_calls() {
    let agent = agent("calls");
    let http = agent.http.as_str();

    // Acquire: the gRPC call's decision, field for field. The same idempotency key sent over
    // gRPC afterwards is a replay of the JSON call (one code path), charging nothing.
    let (status, first) = post(
        http,
        "/v1/acquire",
        &json!({ "target": target("api_key", "a"), "cost_units": 7, "idempotency_key": "k1" }),
    );
    assert_eq!(status, 200, "{first}");
    let d = &first["decision"];
    assert_eq!(d["allowed"], true);
    assert_eq!(d["remaining_units"], 93);
    assert_eq!(d["limit_units"], 100);
    assert_eq!(d["rule"], "llm_gateway/api_key");
    assert_eq!(d["reason"], "allowance");
    let mut grpc = agent.lease_client().await;
    let replay = grpc
        .acquire(pb::AcquireRequest {
            target: Some(pb::Target {
                domain: DOMAIN.into(),
                entries: vec![pb::Entry {
                    key: "api_key".into(),
                    value: "a".into(),
                }],
            }),
            cost_units: 7,
            idempotency_key: "k1".into(),
        })
        .await
        .expect("answers")
        .into_inner()
        .decision
        .expect("decision");
    assert_eq!(replay.remaining_units, 93, "a replay, not a second charge");
    assert_eq!(net_units(&agent, "a"), 7);

    // Lease, refilled in place with top_up_lease_id, then handed back in `returns`.
    let lease = |body: Value| post(http, "/v1/lease", &body);
    let (status, l1) = lease(json!({ "target": target("api_key", "b"), "units_wanted": 10 }));
    assert_eq!(status, 200, "{l1}");
    let id = l1["lease"]["lease_id"].as_u64().expect("lease id");
    assert_eq!(l1["lease"]["units"], 10);
    let (_, l2) = lease(json!({
        "target": target("api_key", "b"), "units_wanted": 5, "top_up_lease_id": id,
    }));
    assert_eq!(l2["lease"]["lease_id"], id, "a refill keeps the lease's id");
    assert_eq!(l2["lease"]["units"], 5);
    let (_, l3) = lease(json!({
        "target": target("api_key", "b"), "units_wanted": 3,
        "returns": [{ "lease_id": id, "unused_units": 15 }],
    }));
    assert_ne!(l3["lease"]["lease_id"], id);
    assert_eq!(
        net_units(&agent, "b"),
        3,
        "the returned lease's 15 units are refunded"
    );
    let id3 = l3["lease"]["lease_id"].as_u64().expect("lease id");
    // Granted for the default 10 s, renewed for 20 s.
    let (status, renewed) = post(
        http,
        "/v1/renew",
        &json!({ "lease_id": id3, "ttl_ms": 20_000 }),
    );
    assert_eq!(status, 200, "{renewed}");
    assert!(
        renewed["ttl_ms"].as_u64().expect("ttl") > 10_000,
        "{renewed}"
    );
    let (_, released) = post(
        http,
        "/v1/release",
        &json!({ "lease_id": id3, "unused_units": 2 }),
    );
    assert_eq!(released["refunded_units"], 2);

    // A lease the key cannot cover is an answer, not an error: no lease, a retry-after.
    let (status, refused) = lease(json!({
        "target": target("api_key", "b"), "units_wanted": 500, "min_units": 500,
    }));
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["lease"], Value::Null);
    assert_eq!(refused["decision"]["allowed"], false);

    // Slots: one per worker; released, the next caller gets it.
    let slot = |w: &str| {
        post(
            http,
            "/v1/slots/acquire",
            &json!({ "target": target("worker", w) }),
        )
    };
    let (_, s1) = slot("w");
    assert_eq!(s1["acquired"], true, "{s1}");
    let (_, s2) = slot("w");
    assert_eq!(s2["acquired"], false, "{s2}");
    assert_eq!(s2["max_slots"], 1);
    let (_, freed) = post(
        http,
        "/v1/slots/release",
        &json!({ "slot_id": s1["slot_id"] }),
    );
    assert_eq!(freed["released"], true);
    assert_eq!(slot("w").1["acquired"], true);
}

#[tokio::test]
async fn a_settle_retried_with_its_key_counts_once() {
    let agent = agent("settle");
    let http = agent.http.as_str();
    let (_, l) = post(
        http,
        "/v1/lease",
        &json!({ "target": target("api_key", "s"), "units_wanted": 40, "min_units": 40 }),
    );
    let id = l["lease"]["lease_id"].as_u64().expect("lease id");
    let settle = |actual: u64| {
        post(
            http,
            "/v1/settle",
            &json!({ "lease_id": id, "actual_units": actual, "idempotency_key": "call-1" }),
        )
    };
    let (status, first) = settle(15);
    assert_eq!(
        (status, &first["refunded_units"]),
        (200, &json!(25)),
        "{first}"
    );
    assert_eq!(
        settle(15),
        (200, first.clone()),
        "a retry answers as the first"
    );
    assert_eq!(net_units(&agent, "s"), 15, "refunded once");
    let (status, conflict) = settle(16);
    assert_eq!(status, 409, "another amount under the same key: {conflict}");
    assert_eq!(conflict["code"], "failed_precondition");
    assert_eq!(net_units(&agent, "s"), 15);
}

#[tokio::test]
async fn a_json_batch_answers_each_item_as_its_lease_would() {
    let agent = agent("batch");
    let http = agent.http.as_str();
    let batch = |leases: Vec<Value>| post(http, "/v1/lease/batch", &json!({ "leases": leases }));
    let (status, first) = batch(vec![
        json!({ "target": target("api_key", "x"), "units_wanted": 30 }),
        json!({ "target": target("api_key", "y"), "units_wanted": 500, "min_units": 500 }),
        json!({ "target": { "domain": "" } }),
        json!({ "target": target("api_key", "z"), "units_wanted": 5, "idempotency_key": "z1" }),
    ]);
    assert_eq!(status, 200, "{first}");
    let items = first["results"].as_array().expect("results");
    assert_eq!(items.len(), 4, "{first}");
    assert_eq!(items[0]["lease"]["units"], 30);
    assert_eq!(items[1]["lease"], Value::Null, "refused, as an answer");
    assert_eq!(items[1]["decision"]["allowed"], false);
    assert_eq!(items[2]["code"], "invalid_argument", "{}", items[2]);
    assert!(
        items[2]["error"]
            .as_str()
            .expect("error")
            .contains("domain")
    );
    assert_eq!(items[3]["lease"]["units"], 5);

    // Refill item 0's lease and replay item 3 by its key: the same id, and no second charge.
    let id = items[0]["lease"]["lease_id"].as_u64().expect("lease id");
    let (_, second) = batch(vec![
        json!({ "target": target("api_key", "x"), "units_wanted": 10, "top_up_lease_id": id }),
        json!({ "target": target("api_key", "z"), "units_wanted": 5, "idempotency_key": "z1" }),
    ]);
    assert_eq!(second["results"][0]["lease"]["lease_id"], id, "{second}");
    // A replay answers as the first: the same lease (its relative times are read anew).
    assert_eq!(
        second["results"][1]["lease"]["lease_id"],
        items[3]["lease"]["lease_id"]
    );
    assert_eq!(second["results"][1]["lease"]["units"], 5);
    assert_eq!(net_units(&agent, "x"), 40);
    assert_eq!(net_units(&agent, "y"), 0);
    assert_eq!(net_units(&agent, "z"), 5);

    // Over the batch limit: the call fails as a whole, nothing granted.
    let many = vec![json!({ "target": target("api_key", "m"), "units_wanted": 1 }); 65];
    let (status, refused) = batch(many);
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .expect("error")
            .contains("at most 64")
    );
    assert_eq!(net_units(&agent, "m"), 0);
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_a_json_error() {
    let agent = agent("bad_input");
    let http = agent.http.as_str();
    let json_type = "Content-Type: application/json\r\n";
    let long = "v".repeat(2_000);
    let cases: Vec<(&str, &str, &str, String, u16, &str)> = vec![
        ("POST", "/v1/acquire", "", "{}".into(), 415, "Content-Type"),
        ("POST", "/v1/acquire", json_type, "{".into(), 400, "JSON"),
        (
            "POST",
            "/v1/acquire",
            json_type,
            r#"{"targt":{}}"#.into(),
            422,
            "unknown field",
        ),
        (
            "POST",
            "/v1/acquire",
            json_type,
            r#"{"cost_units":-1}"#.into(),
            422,
            "u64",
        ),
        (
            "POST",
            "/v1/acquire",
            json_type,
            "{}".into(),
            400,
            "target is required",
        ),
        (
            "POST",
            "/v1/acquire",
            json_type,
            json!({ "target": { "domain": "", "entries": [] } }).to_string(),
            400,
            "domain",
        ),
        (
            "POST",
            "/v1/lease",
            json_type,
            json!({ "target": target("api_key", &long) }).to_string(),
            400,
            "longer than",
        ),
        (
            "POST",
            "/v1/settle",
            json_type,
            r#"{"lease_id":5}"#.into(),
            422,
            "actual_units",
        ),
        (
            "POST",
            "/v1/settle",
            json_type,
            r#"{"lease_id":5,"actual_units":1}"#.into(),
            404,
            "unknown lease",
        ),
        ("GET", "/v1/lease", "", String::new(), 405, "POST"),
        (
            "POST",
            "/v1/lease/batch",
            json_type,
            r#"{"leases":{}}"#.into(),
            422,
            "leases",
        ),
        (
            "POST",
            "/v1/acquire",
            json_type,
            format!(r#"{{"idempotency_key":"{}"}}"#, "k".repeat(70_000)),
            413,
            "",
        ),
    ];
    for (method, path, headers, body, want, says) in cases {
        let (status, answer) = request(http, method, path, headers, &body);
        let short: String = body.chars().take(60).collect();
        assert_eq!(status, want, "{method} {path} {short}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(says) && !error.is_empty(),
            "{method} {path} {short}: {answer}"
        );
    }
}

/// The example gateway, serving on a port of its own; killed when dropped.
struct Gateway {
    child: Child,
    addr: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn example() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/client/examples/python/gateway.py"
    ))
}

fn python_present() -> bool {
    let found = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: python3 is not installed");
    }
    found
}

fn start_gateway(agent: &Process) -> Gateway {
    let mut child = Command::new("python3")
        .arg(example())
        .args(["--agent", &format!("http://{}", agent.http)])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the example");
    let line = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .next()
        .and_then(Result::ok)
        .unwrap_or_default();
    let Some(addr) = line.strip_prefix("ready http=").map(str::to_owned) else {
        let _ = child.kill();
        panic!("the gateway did not start: {line:?}");
    };
    Gateway { child, addr }
}

/// A completion call of `prompt_words` words with `max_tokens`: the stand-in model echoes the
/// prompt, so it uses `prompt_words + min(prompt_words, max_tokens)` tokens.
fn complete(gateway: &str, key: &str, prompt_words: usize, max_tokens: u64) -> (u16, Value) {
    let prompt = vec!["word"; prompt_words].join(" ");
    let headers = format!("Authorization: Bearer {key}\r\n");
    let body = json!({ "prompt": prompt, "max_tokens": max_tokens }).to_string();
    request(gateway, "POST", "/v1/completions", &headers, &body)
}

#[tokio::test]
async fn the_python_gateway_reserves_then_settles_tokens() {
    if !python_present() {
        return;
    }
    let agent = agent("python");
    let running = start_gateway(&agent);
    let gateway = running.addr.as_str();

    // Reserve 10 + 40, use 20: 30 refunded, 20 counted.
    let (status, r) = complete(gateway, "team-a", 10, 40);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["total_tokens"], 20);
    assert_eq!(
        (&r["reserved_tokens"], &r["refunded_tokens"]),
        (&json!(50), &json!(30))
    );
    assert_eq!(net_units(&agent, "team-a"), 20);
    // 80 left: a call that reserves 90 is refused before the model runs, with Retry-After.
    let (status, refused) = complete(gateway, "team-a", 10, 80);
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["decision"]["remaining_units"], 80);
    assert_eq!(net_units(&agent, "team-a"), 20, "a refusal costs nothing");
    // Reserving exactly what is left passes; only its refunds let the next calls in.
    assert_eq!(complete(gateway, "team-a", 10, 70).0, 200);
    assert_eq!(net_units(&agent, "team-a"), 40);
    assert_eq!(
        complete(gateway, "team-a", 10, 50).0,
        200,
        "60 reserved of 60 left"
    );
    assert_eq!(
        complete(gateway, "team-a", 10, 50).0,
        429,
        "60 reserved of 40 left"
    );
    assert_eq!(net_units(&agent, "team-a"), 60);
    // Another key has its own budget.
    assert_eq!(complete(gateway, "team-b", 10, 80).0, 200);

    // Concurrent calls on one key: what the agent counts is exactly what the admitted calls
    // used, and never above the quota.
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let addr = gateway.to_owned();
            std::thread::spawn(move || complete(&addr, "team-c", 10, 20))
        })
        .collect();
    let mut used = 0;
    for call in calls {
        let (status, r) = call.join().expect("call");
        match status {
            200 => used += r["usage"]["total_tokens"].as_u64().expect("usage"),
            429 => {}
            other => panic!("{other}: {r}"),
        }
    }
    assert!(
        used >= 60,
        "at least three calls of 30 reserved fit: {used}"
    );
    assert_eq!(net_units(&agent, "team-c"), used);
    assert!(used <= 100);

    // The example's own check: a retried reservation is the same lease, a retried settle
    // answers alike and refunds once, another amount under the key is refused.
    let out = Command::new("python3")
        .arg(example())
        .args(["--agent", &format!("http://{}", agent.http), "--self-test"])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("self-test ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
