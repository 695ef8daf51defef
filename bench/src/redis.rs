//! The Redis baseline: `redis-server` started by the harness on a free loopback port with no
//! persistence, and a GCRA Lua script (`bench/lua/gcra.lua`, whose header has the math) called
//! through `EVALSHA` on a multiplexed async connection.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use redis::Script;
use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::process::{ChildProcess, find_on_path, free_loopback_port, is_executable};

/// The GCRA script's source.
pub const GCRA_LUA: &str = include_str!("../lua/gcra.lua");

/// Environment variable naming the `redis-server` binary, when it is not on `PATH`.
pub const REDIS_SERVER_ENV: &str = "ALLOT_REDIS_SERVER";

/// Where Debian's `redis-server` package puts the binary.
const DEBIAN_REDIS_SERVER: &str = "/usr/bin/redis-server";

/// How long a started `redis-server` gets to answer PING.
pub const REDIS_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between readiness probes.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The script's rate parameters, in the script's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GcraParams {
    /// T: microseconds per unit (the window divided by the quota).
    pub emission_interval_us: u64,
    /// B: units that may pass back to back.
    pub burst_units: u64,
}

impl GcraParams {
    /// A rate no benchmark reaches (a million units per second, a burst of a billion), so the
    /// baseline, like the agent under its huge quota, never denies yet does all the work.
    pub const NEVER_DENIES: GcraParams = GcraParams {
        emission_interval_us: 1,
        burst_units: 1_000_000_000,
    };
}

/// The script's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraReply {
    pub allowed: bool,
    pub remaining_units: u64,
    /// On a denial: when the same call may pass; `None` when it never can (cost above burst).
    pub retry_after: Option<Duration>,
    pub reset_after: Duration,
}

/// The script, ready to invoke (its SHA1 computed once).
#[derive(Clone)]
pub struct GcraScript {
    script: Script,
}

impl Default for GcraScript {
    fn default() -> Self {
        Self::new()
    }
}

impl GcraScript {
    pub fn new() -> Self {
        GcraScript {
            script: Script::new(GCRA_LUA),
        }
    }

    /// Loads the script (`SCRIPT LOAD`), so the measured calls are all `EVALSHA` hits.
    pub async fn load(&self, con: &mut MultiplexedConnection) -> Result<()> {
        self.script.prepare_invoke().load_async(con).await?;
        Ok(())
    }

    /// One check of `cost_units` on `key`. `now_us`: the time to decide at, or `None` for the
    /// server's clock (what the benchmark uses: no client clock involved).
    pub async fn check(
        &self,
        con: &mut MultiplexedConnection,
        key: &str,
        params: GcraParams,
        cost_units: u64,
        now_us: Option<u64>,
    ) -> Result<GcraReply> {
        let mut call = self.script.key(key);
        call.arg(params.emission_interval_us)
            .arg(params.burst_units)
            .arg(cost_units);
        if let Some(now) = now_us {
            call.arg(now);
        }
        let (allowed, remaining, retry_us, reset_us): (i64, i64, i64, i64) =
            call.invoke_async(con).await?;
        let micros = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
        Ok(GcraReply {
            allowed: allowed == 1,
            remaining_units: u64::try_from(remaining).unwrap_or(0),
            retry_after: match (allowed, retry_us) {
                (1, _) => None,
                (_, r) if r < 0 => None,
                (_, r) => Some(micros(r)),
            },
            reset_after: micros(reset_us),
        })
    }
}

/// Opens a multiplexed connection to the Redis at `addr`.
pub async fn connect(addr: std::net::SocketAddr) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// The `redis-server` binary: `$ALLOT_REDIS_SERVER`, else `redis-server` on `PATH`, else
/// Debian's path.
pub fn find_redis_server() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(REDIS_SERVER_ENV) {
        let path = PathBuf::from(path);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(Error::NotFound {
            what: "redis-server",
            hint: format!("{REDIS_SERVER_ENV}={} is not executable", path.display()),
        });
    }
    find_on_path("redis-server")
        .or_else(|| Some(PathBuf::from(DEBIAN_REDIS_SERVER)).filter(|p| is_executable(p)))
        .ok_or(Error::NotFound {
            what: "redis-server",
            hint: format!(
                "install Debian's `redis-server` package or set {REDIS_SERVER_ENV} (.ci/run installs it)"
            ),
        })
}

/// A `redis-server` of our own: loopback only, no RDB snapshots, no AOF, its files in a
/// temporary directory. Stopped when dropped.
pub struct RedisServer {
    process: ChildProcess,
    addr: std::net::SocketAddr,
}

impl RedisServer {
    /// Starts `binary` on a free loopback port and waits until it answers PING.
    pub async fn start(binary: &Path, work_dir: &Path) -> Result<Self> {
        let port = free_loopback_port()?;
        let mut cmd = Command::new(binary);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(work_dir)
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"]);
        let process = ChildProcess::spawn("redis-server", cmd, work_dir)?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut server = RedisServer { process, addr };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let mut last_error = String::from("no attempt");
        while started.elapsed() < REDIS_START_TIMEOUT {
            if self.process.exit_status().is_some() {
                break;
            }
            match ping(self.addr).await {
                Ok(()) => return Ok(()),
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
        Err(self.process.not_ready(started.elapsed(), &last_error))
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops the server (SIGTERM; it has nothing to save).
    pub fn stop(mut self) {
        self.process.stop();
    }
}

async fn ping(addr: std::net::SocketAddr) -> Result<()> {
    let mut con = connect(addr).await?;
    let _: String = redis::cmd("PING").query_async(&mut con).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running server, or `None` (after saying why) where redis-server is not installed
    /// and this is not CI.
    async fn server(dir: &Path) -> Option<RedisServer> {
        let binary = match find_redis_server() {
            Ok(b) => b,
            Err(e) if !crate::process::missing_tools_are_errors() => {
                eprintln!("skipped: {e}");
                return None;
            }
            Err(e) => panic!("{e}"),
        };
        Some(RedisServer::start(&binary, dir).await.unwrap())
    }

    /// The worked example of the script's header: 100 per minute, burst 20.
    const PER_MINUTE_100_BURST_20: GcraParams = GcraParams {
        emission_interval_us: 600_000,
        burst_units: 20,
    };

    /// A realistic clock reading (2026-01-01T00:00:00Z in µs): 16 digits, beyond what a Lua
    /// number prints without losing digits, so the state's round trip is exercised.
    const NOW_US: u64 = 1_767_225_600_000_000;

    #[tokio::test]
    async fn gcra_script_passes_the_burst_then_denies_with_the_exact_retry() {
        let dir = tempfile::tempdir().unwrap();
        let Some(server) = server(dir.path()).await else {
            return;
        };
        let mut con = connect(server.addr()).await.unwrap();
        let gcra = GcraScript::new();
        gcra.load(&mut con).await.unwrap();
        let p = PER_MINUTE_100_BURST_20;

        // Calls 1..=20 at the same instant pass; call k leaves 20 - k units.
        for k in 1..=20u64 {
            let r = gcra.check(&mut con, "t", p, 1, Some(NOW_US)).await.unwrap();
            assert!(r.allowed, "call {k}: {r:?}");
            assert_eq!(r.remaining_units, 20 - k, "call {k}");
            // The bucket is full again k * 600 ms later.
            assert_eq!(r.reset_after, Duration::from_millis(600 * k), "call {k}");
        }
        // Call 21: 21 * 600 ms = 12.6 s of the 12 s bucket: denied, retry in 600 ms.
        let r = gcra.check(&mut con, "t", p, 1, Some(NOW_US)).await.unwrap();
        assert!(!r.allowed);
        assert_eq!(r.remaining_units, 0);
        assert_eq!(r.retry_after, Some(Duration::from_millis(600)));
        // A denial charges nothing: at the same instant the answer is the same.
        let again = gcra.check(&mut con, "t", p, 1, Some(NOW_US)).await.unwrap();
        assert_eq!(again, r);
        // 599 ms later still denied (1 ms short), at 600 ms the next call passes.
        let r = gcra
            .check(&mut con, "t", p, 1, Some(NOW_US + 599_000))
            .await
            .unwrap();
        assert_eq!(r.retry_after, Some(Duration::from_millis(1)));
        let r = gcra
            .check(&mut con, "t", p, 1, Some(NOW_US + 600_000))
            .await
            .unwrap();
        assert!(r.allowed, "{r:?}");
        assert_eq!(r.remaining_units, 0);
        server.stop();
    }

    #[tokio::test]
    async fn gcra_script_keeps_keys_apart_and_refuses_costs_above_the_burst() {
        let dir = tempfile::tempdir().unwrap();
        let Some(server) = server(dir.path()).await else {
            return;
        };
        let mut con = connect(server.addr()).await.unwrap();
        let gcra = GcraScript::new();
        let p = PER_MINUTE_100_BURST_20;
        // Key a spends its whole burst in one call of 20; key b is untouched by it.
        let a = gcra
            .check(&mut con, "a", p, 20, Some(NOW_US))
            .await
            .unwrap();
        assert!(a.allowed);
        assert_eq!(a.remaining_units, 0);
        let b = gcra.check(&mut con, "b", p, 1, Some(NOW_US)).await.unwrap();
        assert!(b.allowed);
        assert_eq!(b.remaining_units, 19);
        // A cost of 21 can never fit a burst of 20: denied with no retry time.
        let c = gcra
            .check(&mut con, "c", p, 21, Some(NOW_US))
            .await
            .unwrap();
        assert!(!c.allowed);
        assert_eq!(c.retry_after, None);
        server.stop();
    }

    #[tokio::test]
    async fn gcra_script_on_the_server_clock_admits_a_fresh_key() {
        let dir = tempfile::tempdir().unwrap();
        let Some(server) = server(dir.path()).await else {
            return;
        };
        let mut con = connect(server.addr()).await.unwrap();
        let gcra = GcraScript::new();
        let r = gcra
            .check(&mut con, "fresh", GcraParams::NEVER_DENIES, 1, None)
            .await
            .unwrap();
        assert!(r.allowed);
        assert_eq!(r.remaining_units, GcraParams::NEVER_DENIES.burst_units - 1);
        server.stop();
    }
}
