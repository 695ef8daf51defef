//! wrk (Debian's `wrk` 4.1) as the HTTP load tool of the Envoy load run: one command per run,
//! its text report parsed into figures.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::process::find_on_path;

/// The wrk script that spreads requests over N API keys (its header says how).
pub const KEYS_SCRIPT: &str = include_str!("../lua/wrk_keys.lua");

/// The request header carrying the API key, on every request wrk sends.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The key every request carries when the run uses one key.
pub const ONE_KEY: &str = "key-1";

/// How wrk loads a server.
#[derive(Clone, Debug)]
pub struct WrkLoad {
    pub threads: u32,
    pub connections: u32,
    pub duration: Duration,
    /// Distinct API keys: 1 sends [`ONE_KEY`] on every request; more runs [`KEYS_SCRIPT`].
    pub keys: u32,
    /// Where [`KEYS_SCRIPT`] was written (see [`write_keys_script`]); needed when `keys > 1`.
    pub script: Option<PathBuf>,
}

/// The figures of one wrk report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WrkReport {
    /// Responses received (`N requests in ...`).
    pub requests: u64,
    /// `Non-2xx or 3xx responses`, 0 when the line is absent.
    pub non_2xx: u64,
    /// The four `Socket errors` counts summed (connect, read, write, timeout).
    pub socket_errors: u64,
    pub requests_per_sec: f64,
}

impl WrkReport {
    /// Requests answered 2xx (or 3xx): what the gateway admitted.
    pub fn admitted(&self) -> u64 {
        self.requests.saturating_sub(self.non_2xx)
    }
}

/// The `wrk` binary on `PATH`.
pub fn find_wrk() -> Result<PathBuf> {
    find_on_path("wrk").ok_or(Error::NotFound {
        what: "wrk",
        hint: "apt-get install -y wrk".to_owned(),
    })
}

/// Writes [`KEYS_SCRIPT`] into `dir`; returns its path.
pub fn write_keys_script(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("wrk_keys.lua");
    std::fs::write(&path, KEYS_SCRIPT)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// Runs wrk against `http://addr/` until it ends (blocking) and parses its report.
pub fn run_wrk(wrk: &Path, load: &WrkLoad, addr: SocketAddr) -> Result<WrkReport> {
    let mut cmd = Command::new(wrk);
    cmd.arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        // wrk takes whole seconds (or minutes, hours) only.
        .arg(format!("-d{}s", wrk_secs(load.duration)));
    if load.keys > 1 {
        let script = load.script.as_ref().ok_or_else(|| {
            Error::Invalid("more than one key needs the keys script written".to_owned())
        })?;
        cmd.arg("-s").arg(script);
    } else {
        cmd.arg("-H").arg(format!("{API_KEY_HEADER}: {ONE_KEY}"));
    }
    cmd.arg(format!("http://{addr}/"));
    if load.keys > 1 {
        cmd.arg("--").arg(load.keys.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("running {cmd:?}"), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "wrk exited with {}: {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    parse_report(&text).map_err(|why| Error::Failed(format!("wrk's report: {why}:\n{text}")))
}

/// `duration` in wrk's whole seconds, rounded up, at least 1.
pub fn wrk_secs(duration: Duration) -> u64 {
    duration.as_secs_f64().ceil().max(1.0) as u64
}

/// Parses wrk's text report.
pub fn parse_report(text: &str) -> Result<WrkReport, String> {
    let mut requests = None;
    let mut requests_per_sec = None;
    let mut non_2xx = 0;
    let mut socket_errors = 0;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("Requests/sec:") {
            let rps = rest.trim();
            requests_per_sec = Some(
                rps.parse::<f64>()
                    .map_err(|e| format!("Requests/sec `{rps}`: {e}"))?,
            );
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            let n = rest.trim();
            non_2xx = n
                .parse::<u64>()
                .map_err(|e| format!("Non-2xx `{n}`: {e}"))?;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            // `connect 0, read 0, write 0, timeout 12`
            for part in rest.split(',') {
                let n = part.split_whitespace().nth(1).unwrap_or("");
                socket_errors += n
                    .parse::<u64>()
                    .map_err(|e| format!("Socket errors `{part}`: {e}"))?;
            }
        } else if line.contains(" requests in ") {
            let n = line.split_whitespace().next().unwrap_or("");
            requests = Some(
                n.parse::<u64>()
                    .map_err(|e| format!("requests `{n}`: {e}"))?,
            );
        }
    }
    Ok(WrkReport {
        requests: requests.ok_or("no `N requests in` line")?,
        non_2xx,
        socket_errors,
        requests_per_sec: requests_per_sec.ok_or("no `Requests/sec:` line")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of wrk 4.1.0 (Debian) with every optional line.
    const REPORT: &str = "\
Running 5s test @ http://127.0.0.1:10000/
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.21ms  422.35us  12.51ms   83.61%
    Req/Sec    13.26k     1.02k   15.10k    71.00%
  131952 requests in 5.00s, 19.63MB read
  Socket errors: connect 0, read 2, write 0, timeout 5
  Non-2xx or 3xx responses: 1234
Requests/sec:  26385.44
Transfer/sec:      3.92MB
";

    #[test]
    fn durations_go_to_wrk_in_whole_seconds() {
        assert_eq!(wrk_secs(Duration::from_secs(5)), 5);
        assert_eq!(wrk_secs(Duration::from_millis(5_200)), 6);
        assert_eq!(wrk_secs(Duration::from_millis(10)), 1);
    }

    #[test]
    fn a_full_report_parses() {
        let r = parse_report(REPORT).unwrap();
        assert_eq!(
            r,
            WrkReport {
                requests: 131_952,
                non_2xx: 1_234,
                socket_errors: 7,
                requests_per_sec: 26_385.44,
            }
        );
        assert_eq!(r.admitted(), 130_718);
    }

    #[test]
    fn absent_optional_lines_count_zero_and_missing_figures_are_errors() {
        let clean: String = REPORT
            .lines()
            .filter(|l| !l.contains("Socket errors") && !l.contains("Non-2xx"))
            .map(|l| format!("{l}\n"))
            .collect();
        let r = parse_report(&clean).unwrap();
        assert_eq!((r.non_2xx, r.socket_errors, r.admitted()), (0, 0, 131_952));
        assert!(parse_report("Requests/sec: 5\n").is_err());
        assert!(parse_report("  10 requests in 1.00s, 1KB read\n").is_err());
        assert!(parse_report("  x requests in 1.00s\nRequests/sec: 1\n").is_err());
    }
}
