//! Child processes the harness starts (no-op server, agent, redis-server, Envoy): output to a
//! log file, stopped with SIGTERM then SIGKILL, and never left behind (stopped on drop).

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a stopped process gets to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often a stopping process is checked for exit.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Bytes of a child's log quoted in an error.
const LOG_TAIL_BYTES: usize = 2_000;

/// A running child process. Dropping it stops it.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
    exited: bool,
}

impl ChildProcess {
    /// Starts `command` with stdin closed and stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, mut command: Command, log_dir: &Path) -> Result<Self> {
        let log_path = log_dir.join(format!("{name}.log"));
        let log = File::create(&log_path)
            .map_err(|e| Error::io(format!("creating {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| Error::io("duplicating a log file handle", e))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| Error::io(format!("starting {name} ({command:?})"), e))?;
        Ok(ChildProcess {
            name: name.to_owned(),
            child,
            log_path,
            exited: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The exit status if the process has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exited = true;
                Some(status)
            }
            _ => None,
        }
    }

    /// The end of the process's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log_path).unwrap_or_default();
        let start = text.len().saturating_sub(LOG_TAIL_BYTES);
        String::from_utf8_lossy(&text[start..]).trim().to_owned()
    }

    /// An error saying this process did not become ready, with its log's tail.
    pub fn not_ready(&mut self, waited: Duration, why: &str) -> Error {
        let state = match self.exit_status() {
            Some(status) => format!("exited with {status}"),
            None => "still running".to_owned(),
        };
        Error::NotReady {
            name: self.name.clone(),
            waited,
            detail: format!(
                "{why}; {state}; log {}:\n{}",
                self.log_path.display(),
                self.log_tail()
            ),
        }
    }

    /// Sends SIGTERM, waits up to [`STOP_GRACE`], then kills. Returns whether the process exited
    /// on SIGTERM (a clean stop).
    pub fn stop(&mut self) -> bool {
        if self.exited || self.exit_status().is_some() {
            return true;
        }
        terminate(self.child.id());
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return true;
            }
            std::thread::sleep(EXIT_POLL_INTERVAL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.exited = true;
        false
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.exited = true;
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn terminate(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own unreaped child, so
    // the id cannot have been reused by another process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

/// A loopback port that was free a moment ago, for a child process to bind next; for servers
/// that accept an already bound listener, bind `127.0.0.1:0` directly instead.
///
/// Drawn below the kernel's ephemeral range: a port from that range can be taken, between this
/// check and the child's bind, by any outgoing connection on the machine (the daemons dialling
/// each other), which made a node fail to start now and then. Another process could still
/// bind the same port first; the draw spreads callers over 20,000-odd ports.
pub fn free_loopback_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000u16.min(ephemeral_from.saturating_sub(1_000));
    let span = u64::from(ephemeral_from.saturating_sub(low).max(1));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(20);
    for _ in 0..FREE_PORT_TRIES {
        // splitmix64 over a counter: distinct draws within this process, spread across them.
        let mut z = seed.wrapping_add(
            DRAWS
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let port = low + (z % span) as u16;
        if TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Invalid(format!(
        "no free loopback port below {ephemeral_from} after {FREE_PORT_TRIES} tries"
    )))
}

const FREE_PORT_TRIES: usize = 200;

/// `name` as the shell would find it on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a file someone may execute.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether tests that need external programs must fail, not skip, when one is missing: CI
/// installs them (`.ci/run`), so there a missing program is a broken setup.
pub fn missing_tools_are_errors() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_child_is_gone_and_its_log_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 30"]);
        let mut child = ChildProcess::spawn("sleeper", cmd, dir.path()).unwrap();
        let pid = child.pid();
        // The shell writes before it execs: wait for the line (bounded).
        let give_up = Instant::now() + Duration::from_secs(10);
        while !child.log_tail().contains("started") && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(child.log_tail(), "started");
        assert!(child.stop(), "sleep exits on SIGTERM");
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn sh_is_found_on_path() {
        let sh = find_on_path("sh").unwrap();
        assert!(is_executable(&sh));
        assert!(find_on_path("no-such-program-allot-bench").is_none());
    }
}
