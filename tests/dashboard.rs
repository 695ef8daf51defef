//! The dashboard in a real browser (slow tier, `ALLOT_SLOW_TESTS=1`): `allot demo` runs as a
//! child process with its leader killed mid-run, and headless Chromium, driven through
//! chromedriver over WebDriver (D52), opens the page on a follower. Checks that the page shows
//! no error and logs none, that its figures move between two reads and agree with the leader's
//! `/v1/status` read beside them, and that after the kill the same page shows the new
//! leader's figures; and that a page loaded from the leader the demo kills reads on through
//! the other nodes while its own is down. Outside CI, a machine without `chromium` or `chromedriver` skips it.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use support::{free_port, slow_tier};

/// Time for one admin call.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the demo, the browser or the page to get somewhere: a bound on a hang on
/// a loaded 2-core machine, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(60);
/// The run: the leader is killed once the first checks are done.
/// The killed leader stays down 15 s: long enough to see a page loaded from it read on
/// through the other nodes.
const RUN: &[&str] = &[
    "--duration",
    "50s",
    "--kill-leader-at",
    "22",
    "--restart-after",
    "15",
    "--json",
];

/// Collects what the page logs as an error from here on, and errors thrown in it.
const HOOKS: &str = r#"
window.caught = [];
for (const level of ["error", "warn"]) {
  const original = console[level];
  console[level] = (...args) => { window.caught.push(level + ": " + args.join(" ")); original(...args); };
}
window.addEventListener("error", (e) => window.caught.push("error event: " + e.message));
window.addEventListener("unhandledrejection", (e) => window.caught.push("rejection: " + e.reason));
"#;

/// The figures the page shows: the leader, and for its first limit the window, the admitted
/// total and per region allowance and admitted.
const READ_PAGE: &str = r##"
const leader = document.querySelector("#leader");
const limit = document.querySelector("section.limit");
if (!leader.dataset.term || !limit) return null;
const regions = {};
for (const tr of limit.querySelectorAll("tr[data-region]")) {
  const figure = (name) => Number(tr.querySelector("[data-figure=" + name + "]").textContent);
  regions[tr.dataset.region] = { allowance: figure("allowance"), used: figure("used") };
}
const error = document.querySelector("#error");
return {
  node: Number(leader.dataset.node), term: Number(leader.dataset.term),
  limit: limit.dataset.limit, window: Number(limit.dataset.window),
  admitted: Number(limit.querySelector("[data-figure=admitted]").textContent),
  regions, error: error.hidden ? null : error.textContent,
  leader_events: [...document.querySelectorAll("#events li")].filter((li) => li.textContent.includes("leader:")).length,
  script_errors: typeof scriptErrors === "undefined" ? ["scriptErrors unreachable"] : scriptErrors,
  caught: window.caught || [],
};
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_on_a_follower_shows_the_leaders_figures_through_a_leader_kill() {
    if !slow_tier() || !browser_here() {
        return;
    }
    let demo = Demo::start();
    let (page_node, first) = demo.follower().await;
    let driver = ChromeDriver::start();
    let browser = driver.session().await;
    open_page(&browser, &page_node).await;

    let before = agreeing_read(&browser, &demo, first.1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = agreeing_read(&browser, &demo, first.1).await;
    assert!(
        (after["window"].clone(), after["admitted"].clone())
            != (before["window"].clone(), before["admitted"].clone()),
        "the page's figures did not move: {before} then {after}"
    );

    // A second window, on the leader's own node: the node the demo is about to kill.
    let follower_window = browser.window().await.expect("the window");
    let (leader_addr, leader_node) = demo.leader().expect("a leader");
    let on_leader = browser
        .new_window(false)
        .await
        .expect("a new window")
        .handle;
    browser
        .switch_to_window(on_leader.clone())
        .await
        .expect("to the new window");
    open_page(&browser, &leader_addr).await;
    agreeing_read(&browser, &demo, first.1).await;

    // The kill: both pages go on, with a later leader's figures. (An election before the
    // kill may have made another node the leader the demo kills: then the second page's
    // node is alive, and the first page's may be the one killed.)
    let (killed_node, killed_term) = demo.kill().await;
    eprintln!(
        "first leader {first:?}, pages on {page_node} and {leader_addr} (node {leader_node}), \
         killed node {killed_node} (term {killed_term})"
    );
    let later = agreeing_read(&browser, &demo, killed_term + 1).await;
    if killed_node == leader_node {
        // The page's own node is down (for 15 s): the page reads through another node.
        let detour = browser
            .execute(
                "return document.querySelector('#source').dataset.detour",
                vec![],
            )
            .await
            .expect("the source");
        assert!(
            detour
                .as_str()
                .is_some_and(|d| !d.is_empty() && d != leader_addr),
            "the page on the killed node does not read through another: {detour} {later}"
        );
        assert!(
            status_of(&leader_addr).is_none(),
            "the killed node answered already"
        );
    } else {
        eprintln!("the leader changed before the kill: the second page's node was not killed");
    }
    assert_eq!(later["error"], Value::Null, "{later}");
    assert_eq!(later["script_errors"], json!([]), "{later}");
    assert_eq!(later["caught"], json!([]), "{later}");
    browser
        .switch_to_window(follower_window)
        .await
        .expect("back to the first window");
    let later = agreeing_read(&browser, &demo, killed_term + 1).await;
    assert_ne!(later["node"].as_u64(), Some(killed_node), "{later}");
    // A good read clears the failed reads' error; the change is listed.
    assert_eq!(later["error"], Value::Null, "{later}");
    assert!(later["leader_events"].as_u64() >= Some(2), "{later}");
    save_screenshot(&browser).await;
    let last = page(&browser).await.expect("figures shown");
    assert_eq!(last["script_errors"], json!([]), "{last}");
    assert_eq!(last["caught"], json!([]), "{last}");
    browser.close().await.expect("the session closes");
    demo.finish();
}

/// A cluster started with a read token (D63): the page of a follower, given the token as
/// `#token=TOKEN`, reads its own node's status and the leader's through it (a cross-origin read
/// with the token, after the browser's preflight) and takes the token out of the address bar;
/// a window opened without it says the token is needed instead of showing a network error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_reads_with_the_token_given_in_its_address() {
    if !slow_tier() || !browser_here() {
        return;
    }
    const TOKEN: &str = "read-5be0a1";
    let dir = support::scratch("dashboard", "read_token", Some(TOKEN_LIMITS));
    let addrs: Vec<(String, String)> = (0..3)
        .map(|_| {
            let port = || format!("127.0.0.1:{}", free_port());
            (port(), port())
        })
        .collect();
    let peers: Vec<String> = (1..=3)
        .map(|id| format!("{id}={}", addrs[id - 1].0))
        .collect();
    let nodes: Vec<support::Process> = (1..=3_usize)
        .map(|id| {
            let (grpc, http) = &addrs[id - 1];
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
            cmd.arg("coordinator")
                .args(["--id", &id.to_string(), "--grpc", grpc, "--http", http])
                .args(["--peers", &peers.join(",")])
                .args(["--read-token-sha256", &support::sha256_hex(TOKEN)])
                .arg("--data")
                .arg(dir.join(format!("node-{id}")))
                .arg("--limits")
                .arg(dir.join("limits.yaml"));
            support::Process::start(cmd, "coordinator")
        })
        .collect();
    let follower = support::eventually(
        "a leader whose probes named it to a follower",
        || {
            nodes.iter().find_map(|n| {
                let (_, status) = support::http_request(
                    &n.http,
                    "GET",
                    "/v1/status",
                    &support::bearer_header(Some(TOKEN)),
                    "",
                );
                (status["state"] == "follower" && status["leader_admin_http"].is_string())
                    .then(|| n.http.clone())
            })
        },
        Option::is_some,
    )
    .await
    .expect("checked");
    let driver = ChromeDriver::start();
    let browser = driver.session().await;
    let shown = |browser: &Client| {
        let browser = browser.clone();
        async move {
            browser
                .execute(
                    "const e = document.querySelector('#error'); return { \
                     term: document.querySelector('#leader').dataset.term || null, \
                     error: e.hidden ? null : e.textContent, hash: location.hash };",
                    vec![],
                )
                .await
                .expect("the page runs the read")
        }
    };
    browser
        .goto(&format!("http://{follower}/#token={TOKEN}"))
        .await
        .expect("the page loads");
    let with = wait_for(&browser, &shown, |v| !v["term"].is_null()).await;
    assert_eq!(with["error"], Value::Null, "{with}");
    assert_eq!(
        with["hash"], "",
        "the token stays in the address bar: {with}"
    );

    let without = browser.new_window(false).await.expect("a window").handle;
    browser.switch_to_window(without).await.expect("to it");
    browser
        .goto(&format!("http://{follower}/"))
        .await
        .expect("the page loads");
    let refused = wait_for(&browser, &shown, |v| !v["error"].is_null()).await;
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("401") && e.contains("#token=TOKEN")),
        "{refused}"
    );
    assert_eq!(refused["term"], Value::Null, "{refused}");
    browser.close().await.expect("the session closes");
}

const TOKEN_LIMITS: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
";

/// The page's answer to `read` once `done` holds of it.
async fn wait_for<F, Fut>(browser: &Client, read: &F, done: impl Fn(&Value) -> bool) -> Value
where
    F: Fn(&Client) -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = read(browser).await;
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "the page never got there: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The dashboard of the node at `addr` in the current window, with the error hooks in.
async fn open_page(browser: &Client, addr: &str) {
    browser
        .goto(&format!("http://{addr}/"))
        .await
        .expect("the page loads");
    browser
        .execute(HOOKS, vec![])
        .await
        .expect("hooks installed");
}

/// Whether chromium and chromedriver are here; in CI (`.ci/run` installs both) their absence
/// is a failure.
fn browser_here() -> bool {
    let found = |name: &str| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if found("chromium") && found("chromedriver") {
        return true;
    }
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false");
    assert!(!ci, "CI installs chromium and chromium-driver (.ci/run)");
    eprintln!(
        "skipped: chromium or chromedriver missing \
         (apt-get install chromium chromium-driver)"
    );
    false
}

/// The page's figures once it shows a limit with every region's row, checked against the
/// leader's `/v1/status` read just after, under a leader of at least `min_term`; retried
/// while a read falls between a change and the page's next refresh.
async fn agreeing_read(browser: &Client, demo: &Demo, min_term: u64) -> Value {
    let deadline = Instant::now() + PATIENCE;
    let mut last = String::new();
    loop {
        if let Some(shown) = page(browser).await
            && shown["term"].as_u64().is_some_and(|t| t >= min_term)
        {
            match demo.leader_status() {
                Some(status) => match disagreement(&shown, &status) {
                    None => return shown,
                    Some(why) => last = why,
                },
                None => last = format!("no leader answers; the page shows {shown}"),
            }
        }
        assert!(
            Instant::now() < deadline,
            "the page never agreed with /v1/status: {last}\n{}",
            demo.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn page(browser: &Client) -> Option<Value> {
    let shown = browser
        .execute(READ_PAGE, vec![])
        .await
        .expect("the page runs the read");
    (!shown.is_null()).then_some(shown)
}

/// Why the page's figures cannot be the leader's status read after them, if they cannot.
fn disagreement(shown: &Value, status: &Value) -> Option<String> {
    agree(shown, status)
        .err()
        .map(|what| format!("{what}: the page shows {shown}, the leader {status}"))
}

fn agree(shown: &Value, status: &Value) -> Result<(), &'static str> {
    if (&shown["node"], &shown["term"]) != (&status["node"], &status["term"]) {
        return Err("another leader");
    }
    let limit = shown["limit"].as_str().ok_or("no limit shown")?;
    let limits = status["limits"].as_array().ok_or("no limits")?;
    let l = limits
        .iter()
        .find(|l| l["limit"] == limit)
        .ok_or("not the leader's limit")?;
    if l["bound"]["window"] != shown["window"] {
        return Err("another window");
    }
    let counters: Vec<&Value> = status["counters"]
        .as_array()
        .ok_or("no counters")?
        .iter()
        .filter(|c| c["counter"]["limit"] == limit && c["counter"]["window"] == shown["window"])
        .collect();
    let [counter] = counters[..] else {
        return Err("not one key in the window");
    };
    let rows = counter["regions"].as_object().ok_or("no rows")?;
    let page_rows = shown["regions"].as_object().ok_or("no rows shown")?;
    if rows.len() != page_rows.len() || rows.len() < 3 {
        return Err("not every region");
    }
    let mut admitted = 0;
    for (region, row) in rows {
        let page_row = &page_rows.get(region).ok_or("a region missing")?;
        if page_row["allowance"].as_f64() != row["allowance_units"].as_f64() {
            return Err("an allowance moved");
        }
        // Use within a window only grows: what the page shows was read first.
        let page_used = page_row["used"].as_f64().ok_or("no use shown")?;
        let used = row["used_units"].as_f64().ok_or("no use heard")?;
        if page_used > used {
            return Err("use went back");
        }
        admitted += page_used as u64;
    }
    if shown["admitted"].as_u64() != Some(admitted) {
        return Err("the total is not the regions' sum");
    }
    Ok(())
}

/// Where the page's picture goes when the test ends: a look at it is a look at the product.
async fn save_screenshot(browser: &Client) {
    let png = browser.screenshot().await.expect("a screenshot");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&path, png).expect("write the screenshot");
    eprintln!("the page: {}", path.display());
}

/// `allot demo` as a child: the addresses it prints, and its stderr kept for a failure.
struct Demo {
    child: Child,
    nodes: Vec<String>,
    lines: mpsc::Receiver<String>,
    log: std::cell::RefCell<Vec<String>>,
}

impl Demo {
    fn start() -> Demo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
            .arg("demo")
            .args(RUN)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the allot binary runs");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        // Read to the end, so the demo never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut demo = Demo {
            child,
            nodes: Vec::new(),
            lines,
            log: Default::default(),
        };
        demo.nodes = demo.addresses();
        demo
    }

    /// The nodes' admin addresses, from the line that names them; the dashboard's line must
    /// come before it and name the first.
    fn addresses(&mut self) -> Vec<String> {
        let deadline = Instant::now() + PATIENCE;
        let mut dashboard = None;
        loop {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no admin addresses printed:\n{}", self.log()));
            self.log.borrow_mut().push(line.clone());
            if let Some(rest) = line.trim().strip_prefix("dashboard: http://") {
                dashboard = rest.split('/').next().map(str::to_owned);
            }
            if let Some(rest) = line.trim().strip_prefix("coordinators' admin HTTP: ") {
                let nodes: Vec<String> = rest
                    .split_whitespace()
                    .filter_map(|w| w.strip_prefix("http://"))
                    .map(str::to_owned)
                    .collect();
                assert_eq!(dashboard.as_ref(), nodes.first(), "{}", self.log());
                return nodes;
            }
        }
    }

    /// A node that follows a leader already heard by every region, and that leader as (node,
    /// term).
    async fn follower(&self) -> (String, (u64, u64)) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(leader) = self.leader_status()
                && leader["regions"]
                    .as_array()
                    .is_some_and(|r| r.iter().all(|r| r["sync_lag_ms"].is_u64()))
                && let Some(follower) = self.nodes.iter().find(|n| {
                    status_of(n).is_some_and(|s| {
                        s["state"] == "follower"
                            && s["leader_admin_http"].is_string()
                            && s["term"] == leader["term"]
                    })
                })
            {
                let first = (leader["node"].as_u64(), leader["term"].as_u64());
                if let (Some(node), Some(term)) = first {
                    return (follower.clone(), (node, term));
                }
            }
            assert!(
                Instant::now() < deadline,
                "no follower naming a leader:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The leader the demo SIGKILLed, as (node, term), from its line
    /// `Ns: SIGKILL coordinator NODE, the leader (term TERM)`.
    async fn kill(&self) -> (u64, u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let line = match self.lines.try_recv() {
                Ok(line) => line,
                Err(_) => {
                    assert!(Instant::now() < deadline, "no kill:\n{}", self.log());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            self.log.borrow_mut().push(line.clone());
            let Some((_, rest)) = line.split_once("SIGKILL coordinator ") else {
                continue;
            };
            let number = |s: &str| s.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok();
            let node = rest.split(',').next().and_then(number);
            let term = rest.split("(term ").nth(1).and_then(number);
            if let (Some(node), Some(term)) = (node, term) {
                return (node, term);
            }
            panic!("a kill line not understood: {line}");
        }
    }

    /// The admin address and id of the node that says it leads, if one does.
    fn leader(&self) -> Option<(String, u64)> {
        self.nodes.iter().find_map(|n| {
            let s = status_of(n)?;
            if s["state"] != "leader" {
                return None;
            }
            Some((n.clone(), s["node"].as_u64()?))
        })
    }

    /// The status of the node that says it leads, if one does.
    fn leader_status(&self) -> Option<Value> {
        self.nodes
            .iter()
            .filter_map(|n| status_of(n))
            .find(|s| s["state"] == "leader")
    }

    fn log(&self) -> String {
        let mut log = self.log.borrow_mut();
        log.extend(self.lines.try_iter());
        log.join("\n")
    }

    /// Waits for the run's end: the demo exits 0 with its summary.
    fn finish(mut self) {
        let status = self.child.wait().expect("the demo ends");
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        assert!(status.success(), "{out}\n{}", self.log());
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // A failed test leaves no demo behind: SIGTERM stops its children cleanly.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: a plain signal to our own child's pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// A node's `/v1/status`, or none if it does not answer (a killed node) or answers badly.
fn status_of(addr: &str) -> Option<Value> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(CALL_TIMEOUT)).ok()?;
    write!(
        s,
        "GET /v1/status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// chromedriver on a free loopback port, killed at the end.
struct ChromeDriver {
    child: Child,
    port: u16,
}

impl ChromeDriver {
    fn start() -> ChromeDriver {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
        ChromeDriver { child, port }
    }

    /// A headless Chromium session. No sandbox: CI runs as root, which Chromium's sandbox
    /// refuses.
    async fn session(&self) -> Client {
        let options = json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,2200"]
        });
        let capabilities = serde_json::Map::from_iter([("goog:chromeOptions".to_owned(), options)]);
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a browser session")
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
