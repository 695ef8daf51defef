//! Child processes the harness starts (no-op server, agent, redis-server, Envoy): output to a
//! log file, stopped with SIGTERM then SIGKILL, and never left behind (stopped on drop).

use std::fs::File;
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

/// A loopback port that was free a moment ago, for a child process to bind next
/// (`allot_proto::ports`: drawn below the kernel's ephemeral range); for servers that accept an
/// already bound listener, bind `127.0.0.1:0` directly instead.
pub fn free_loopback_port() -> Result<u16> {
    allot_proto::ports::free_loopback_port().map_err(|e| Error::io("choosing a loopback port", e))
}

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
