//! The demo's child processes: `allot coordinator` and `allot agent`, run from this very
//! binary, each logging to its own file in the demo's folder, each in a process group of its
//! own so that a Ctrl-C at the terminal reaches the demo only, which then stops them in order.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a child may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a child has to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a starting or stopping child is looked at.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// What a child logs at, unless `ALLOT_LOG` says otherwise.
const CHILD_LOG_LEVEL: &str = "info";

/// One running child: its process, what it is, the addresses its ready line gave, its log.
pub struct Running {
    pub name: String,
    child: Child,
    pub grpc: String,
    pub http: String,
    pub log: PathBuf,
}

/// Starts `current_exe ARGS` logging to `log` (appended: a restart keeps the earlier run's
/// lines), and waits for its ready line, `ready grpc=ADDR http=ADDR`.
pub fn start(name: &str, args: &[String], log: &Path) -> Result<Running, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let start_len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        // Its own group: the terminal's Ctrl-C goes to the demo, which stops children itself.
        .process_group(0);
    if std::env::var_os("ALLOT_LOG").is_none() {
        cmd.env("ALLOT_LOG", CHILD_LOG_LEVEL);
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    let mut running = Running {
        name: name.to_owned(),
        child,
        grpc: String::new(),
        http: String::new(),
        log: log.to_owned(),
    };
    match wait_ready(&mut running, start_len) {
        Ok((grpc, http)) => {
            running.grpc = grpc;
            running.http = http;
            Ok(running)
        }
        Err(why) => {
            running.stop();
            Err(format!(
                "{name} did not start: {why} (log: {})",
                log.display()
            ))
        }
    }
}

/// Reads the log from `from` until the ready line, the child's exit, or the timeout.
fn wait_ready(r: &mut Running, from: u64) -> Result<(String, String), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(found) = ready_line(&r.log, from) {
            return Ok(found);
        }
        if let Ok(Some(status)) = r.child.try_wait() {
            return Err(format!("it exited ({status})"));
        }
        if Instant::now() > deadline {
            return Err(format!("no ready line in {}s", READY_TIMEOUT.as_secs()));
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// The addresses of the first `ready grpc=ADDR http=ADDR` line past `from` in `log`.
fn ready_line(log: &Path, from: u64) -> Option<(String, String)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(log).ok()?;
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut text = String::new();
    // A ready line comes within the first lines a child writes.
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    parse_ready(&text)
}

pub fn parse_ready(text: &str) -> Option<(String, String)> {
    let line = text.lines().find(|l| l.starts_with("ready "))?;
    let addr = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_owned)
    };
    Some((addr("grpc=")?, addr("http=")?))
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(why)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL if it has not exited within [`STOP_TIMEOUT`]. Returns false when
    /// it had to be killed.
    pub fn stop(&mut self) -> bool {
        if self.exited().is_some() {
            return true;
        }
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            self.kill();
            return false;
        };
        // SAFETY: kill(2) with a pid this process spawned and has not reaped yet (try_wait
        // above saw it running), so the pid is still this child's.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return true;
            }
            std::thread::sleep(POLL_EVERY);
        }
        self.kill();
        false
    }
}

impl Drop for Running {
    /// A child is never left behind, whatever path the demo leaves by.
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_both_addresses() {
        let log = "2026 INFO starting\nready grpc=127.0.0.1:7070 http=127.0.0.1:7071\n";
        assert_eq!(
            parse_ready(log),
            Some(("127.0.0.1:7070".to_owned(), "127.0.0.1:7071".to_owned()))
        );
        assert_eq!(
            parse_ready("INFO agent ready grpc_addr=x http_addr=y\n"),
            None
        );
        assert_eq!(parse_ready("ready grpc=a\n"), None);
    }
}
