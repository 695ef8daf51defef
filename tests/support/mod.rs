//! What the tests that run the `allot` binary share.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};

/// A started `allot` daemon that printed its ready line (`... grpc=ADDR http=ADDR`).
pub struct Ready {
    pub child: Child,
    pub grpc: String,
    pub http: String,
    /// Held so the process never blocks on a full stderr pipe.
    pub stderr: Option<ChildStderr>,
}

/// Spawns `cmd` (logging at info, stdout and stderr piped) and waits for its first line, the
/// ready line. A process that prints anything else first is killed, and the test fails with
/// its stderr.
pub fn spawn_ready(mut cmd: Command, what: &str) -> Ready {
    let mut child = cmd
        .env("ALLOT_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the allot binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next()
        .and_then(|l| l.ok())
        .unwrap_or_default();
    let addr = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
    };
    let (Some(grpc), Some(http)) = (addr("grpc"), addr("http")) else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = child.kill();
            let _ = e.read_to_string(&mut err);
        }
        panic!("{what} did not become ready: {line:?}\n{err}");
    };
    let stderr = child.stderr.take();
    Ready {
        child,
        grpc,
        http,
        stderr,
    }
}

impl Ready {
    /// Copies the child's log, from here on, to `CARGO_TARGET_TMPDIR/child-logs/WHAT-PID.log`
    /// as it is written: the child logs synchronously and would block once a pipe nobody
    /// reads is full (64 KiB: a few elections' worth), stalling a node mid-test. The file
    /// is there to read when a test fails. Returns the child, its addresses and the file.
    #[allow(dead_code)]
    pub fn logged(self, what: &str) -> (Child, String, String, PathBuf) {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("child-logs");
        std::fs::create_dir_all(&dir).expect("the log directory");
        let path = dir.join(format!("{what}-{}.log", self.child.id()));
        let mut file = std::fs::File::create(&path).expect("the log file");
        if let Some(mut stderr) = self.stderr {
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut file));
        }
        (self.child, self.grpc, self.http, path)
    }
}

// Not every test crate that includes this module uses every helper below.
#[allow(dead_code)]
mod process {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use allot_proto::lease::v1 as pb;
    use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
    use serde_json::Value;
    use tonic::transport::Channel;

    /// Longest a test waits for something that should happen within a few sync intervals, an
    /// election, or a reconnect's backoff: a bound on a hang, not a timing claim.
    pub const PATIENCE: Duration = Duration::from_secs(30);

    /// A child process that printed its ready line; killed when dropped.
    pub struct Process {
        pub child: Child,
        pub grpc: String,
        pub http: String,
        /// Where its log goes ([`Ready::logged`]).
        pub log: PathBuf,
    }

    impl Process {
        pub fn start(cmd: Command, what: &str) -> Process {
            let (child, grpc, http, log) = super::spawn_ready(cmd, what).logged(what);
            Process {
                child,
                grpc,
                http,
                log,
            }
        }

        /// `allot agent` for `region` with `DIR/limits.yaml` and data in `DIR/data-REGION`,
        /// synced with `coordinators` (comma-separated) when given.
        pub fn agent(dir: &Path, region: &str, coordinators: Option<&str>) -> Process {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
            agent_args(&mut cmd, dir, region, coordinators);
            Process::start(cmd, "agent")
        }

        pub fn json(&self, path: &str) -> Value {
            get_json(&self.http, path)
        }

        /// One value of the process's /metrics (0 when absent).
        pub fn metric(&self, line_prefix: &str) -> f64 {
            get_text(&self.http, "/metrics")
                .lines()
                .find(|l| l.starts_with(line_prefix))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        }

        /// Waits until the agent's sync stream to its coordinator is connected.
        pub async fn synced(&self) {
            eventually(
                "the agent syncs",
                || self.json("/v1/status")["sync"]["connected"].clone(),
                |c| *c == Value::Bool(true),
            )
            .await;
        }

        /// Whether the agent admits `cost` units of `domain` `key=value`.
        pub async fn acquire(&self, domain: &str, key: &str, value: &str, cost: u64) -> bool {
            decide(&mut self.lease_client().await, domain, key, value, cost)
                .await
                .allowed
        }

        /// A client of the agent's lease API, for a test that sends many calls on one
        /// connection.
        pub async fn lease_client(&self) -> LeaseServiceClient<Channel> {
            let channel = Channel::from_shared(format!("http://{}", self.grpc))
                .expect("url")
                .connect()
                .await
                .expect("connects to the agent");
            LeaseServiceClient::new(channel)
        }
    }

    /// `allot coordinator`, one node on loopback ports of its choosing, with `DIR/limits.yaml`
    /// and data in `DIR/coordinator`.
    pub fn coordinator_cmd(dir: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args([
            "coordinator",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--data")
        .arg(dir.join("coordinator"))
        .arg("--limits")
        .arg(dir.join("limits.yaml"));
        cmd
    }

    /// The arguments of [`Process::agent`], after `cmd`'s own (a command that runs the binary
    /// elsewhere, in a network namespace, takes the same).
    pub fn agent_args(cmd: &mut Command, dir: &Path, region: &str, coordinators: Option<&str>) {
        cmd.args(["agent", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .arg("--data")
            .arg(dir.join(format!("data-{region}")))
            .arg("--config")
            .arg(dir.join("limits.yaml"))
            .args(["--region", region]);
        if let Some(c) = coordinators {
            cmd.args(["--coordinator", c]);
        }
    }

    /// The agent's decision on `cost` units of `domain` `key=value`.
    pub async fn decide(
        client: &mut LeaseServiceClient<Channel>,
        domain: &str,
        key: &str,
        value: &str,
        cost: u64,
    ) -> pb::Decision {
        client
            .acquire(pb::AcquireRequest {
                target: Some(pb::Target {
                    domain: domain.to_owned(),
                    entries: vec![pb::Entry {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    }],
                }),
                cost_units: cost,
                idempotency_key: String::new(),
            })
            .await
            .expect("the agent answers")
            .into_inner()
            .decision
            .unwrap_or_default()
    }

    impl Drop for Process {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The body of `GET path`, which must answer 200.
    pub fn get_text(addr: &str, path: &str) -> String {
        let mut s = TcpStream::connect(addr).expect("admin HTTP");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("read");
        assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp}");
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        body.to_owned()
    }

    pub fn get_json(addr: &str, path: &str) -> Value {
        serde_json::from_str(&get_text(addr, path)).expect("JSON")
    }

    /// An empty directory `CARGO_TARGET_TMPDIR/GROUP/TEST`, with `limits.yaml` when given.
    pub fn scratch(group: &str, test: &str, limits: Option<&str>) -> PathBuf {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(group)
            .join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        if let Some(l) = limits {
            std::fs::write(dir.join("limits.yaml"), l).expect("config");
        }
        dir
    }

    /// A loopback port nothing listens on now (the test binds it next).
    pub fn free_port() -> u16 {
        allot_bench::process::free_loopback_port().expect("a free port")
    }

    /// Whether the slow tier runs (`ALLOT_SLOW_TESTS=1`, which `.ci/run` sets).
    pub fn slow_tier() -> bool {
        if std::env::var("ALLOT_SLOW_TESTS").as_deref() == Ok("1") {
            return true;
        }
        eprintln!("skipped: set ALLOT_SLOW_TESTS=1 to run it");
        false
    }

    /// Polls `probe` until `check` holds; panics with `what` and the last value otherwise.
    pub async fn eventually<T: std::fmt::Debug>(
        what: &str,
        mut probe: impl FnMut() -> T,
        check: impl Fn(&T) -> bool,
    ) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let v = probe();
            if check(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: never held; last {v:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits past the end of the day if it is less than two minutes away: the counters are
    /// of the day's window and must not roll over mid-test.
    /// Waits for the next window of `len` (aligned to the Unix epoch) to begin, and a
    /// little more; its index.
    pub async fn next_window_start(len: Duration) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_millis();
        let len_ms = len.as_millis();
        let next = now / len_ms + 1;
        let wait_ms = next * len_ms - now + 100;
        tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
        next as u64
    }

    pub async fn clear_of_the_day_boundary() {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let left = 86_400 - secs % 86_400;
        if left < 120 {
            tokio::time::sleep(Duration::from_secs(left + 1)).await;
        }
    }
}

#[allow(unused_imports)]
pub use process::*;

// Shared by the security tests (TLS, callers, admin token, Envoy over TLS).
#[allow(dead_code)]
mod security {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    use serde_json::Value;

    /// `allot certs init DIR` with `args` (`--nodes 1 --regions a ...`); the folder.
    pub fn certs_init(dir: &Path, args: &[&str]) -> PathBuf {
        let out = Command::new(env!("CARGO_BIN_EXE_allot"))
            .args(["certs", "init"])
            .arg(dir)
            .args(args)
            .output()
            .expect("allot runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir.to_owned()
    }

    /// `--tls-cert DIR/STEM.pem --tls-key DIR/STEM-key.pem --tls-ca DIR/ca.pem`.
    pub fn tls_args(cmd: &mut Command, certs: &Path, stem: &str) {
        cmd.arg("--tls-cert")
            .arg(certs.join(format!("{stem}.pem")))
            .arg("--tls-key")
            .arg(certs.join(format!("{stem}-key.pem")))
            .arg("--tls-ca")
            .arg(certs.join("ca.pem"));
    }

    /// A token's SHA-256 in hex, by coreutils' `sha256sum` (not the code under test).
    pub fn sha256_hex(token: &str) -> String {
        let mut child = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("sha256sum runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(token.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("sha256sum");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .expect("a digest")
            .to_owned()
    }

    /// One HTTP/1.1 request on its own connection, with extra header lines (each ending in
    /// CRLF): the status (0 for no HTTP answer) and the body as JSON (Null when not JSON).
    pub fn http_request(
        addr: &str,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> (u16, Value) {
        let mut s = TcpStream::connect(addr).expect("connects");
        let _ = write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        let status = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// `Authorization: Bearer TOKEN\r\n`, or nothing.
    pub fn bearer_header(token: Option<&str>) -> String {
        token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"))
    }
}

#[allow(unused_imports)]
pub use security::*;
