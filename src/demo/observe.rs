//! What the demo reads from the daemons' own admin APIs, and what it keeps of it: the
//! leaders the nodes' `/v1/status` name and the bounds they state per window, the agents'
//! counters per window from `/v1/keys/watch` (which has each agent remember the key's closed
//! windows, so every ended window's final count is read, as `closed_windows`, however late
//! the read), and their totals from `/metrics`. The summary and the live table are
//! computed from this only, never from the demo's clients.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Time for one admin call (connect, send, read).
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Largest admin answer read.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;

/// One limit the demo watches: its id, its descriptor as `/v1/keys` takes it, its figures.
#[derive(Clone, Debug)]
pub struct Watched {
    pub limit: String,
    pub domain: String,
    pub descriptor: String,
    pub quota_units: u64,
    pub window_ms: u64,
}

/// A bound one leader stated for one window: the largest total it stated, and the reason if
/// it stated none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stated {
    pub total_units: u64,
    pub unbounded: Option<String>,
}

/// One region's counter of one window, as its agent showed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// `net_units` at the last read while the window was current.
    pub net_seen_units: u64,
    /// The count the agent closed the window at (`previous_window`), or the last read after
    /// traffic stopped: nothing can change it any more.
    pub net_final_units: Option<u64>,
    /// Units its end band carried in from the window before (counted in both).
    pub carried_in_units: u64,
}

impl WindowCount {
    /// What the region admitted in the window: its count, less what the window before
    /// already counted.
    pub fn admitted_units(&self) -> u64 {
        let net = self.net_final_units.unwrap_or(self.net_seen_units);
        net.saturating_sub(self.carried_in_units)
    }
}

/// One agent now: its current window's figures for the limit and its link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentNow {
    pub window: u64,
    pub allowance_units: u64,
    pub used_units: u64,
    pub connected: bool,
}

/// An agent's counters from `/metrics`, over every rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentTotals {
    pub lease_granted_units: u64,
    pub lease_returned_units: u64,
    /// Calls the agent refused (a lease request, most often).
    pub denied: u64,
}

/// Everything read so far.
#[derive(Debug, Default)]
pub struct Observed {
    /// Leaders in the order seen, as (node, term), each once.
    pub leaders: Vec<(u64, u64)>,
    /// Per leader, the last time it was seen leading, on cluster time (ms since the epoch).
    pub leading_until_ms: BTreeMap<(u64, u64), u64>,
    /// Per (limit, window), the bound per leader that stated it.
    pub bounds: BTreeMap<(String, u64), BTreeMap<(u64, u64), Stated>>,
    /// Per (limit, window, region): the region's counter.
    pub windows: BTreeMap<(String, u64, String), WindowCount>,
    /// Per (limit, region): its agent now.
    pub agents: BTreeMap<(String, String), AgentNow>,
    pub totals: BTreeMap<String, AgentTotals>,
    /// Per region, how long its agent said its sync stream was down: the time since the read
    /// before, summed over the reads that found it down.
    pub sync_down_ms: BTreeMap<String, u64>,
    /// Per region, when its agent's link was last read (this machine's clock).
    link_read_ms: BTreeMap<String, u64>,
    /// How many of `leaders` were seen before traffic started: the last of them led when it
    /// did, and leader changes are counted from there.
    pub leaders_before_run: usize,
    /// The last cluster time a leader was seen at.
    pub last_seen_ms: u64,
    /// How far cluster time reads ahead of this machine's clock, as the leader last said.
    pub cluster_ahead_ms: i64,
}

pub fn unix_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

impl Observed {
    /// Traffic starts now: leaders seen from here on are the run's leader changes.
    pub fn mark_run_start(&mut self) {
        self.leaders_before_run = self.leaders.len();
        // Agents still connecting before the run are no outage of the run's.
        self.sync_down_ms.clear();
    }

    /// Leaders that took over after traffic started.
    pub fn leader_changes(&self) -> usize {
        let before = self.leaders_before_run.max(1);
        self.leaders.len().saturating_sub(before)
    }

    /// The current leader, if one was seen.
    pub fn leader(&self) -> Option<(u64, u64)> {
        self.leaders.last().copied()
    }

    /// Takes one node's `/v1/status`, read at `now_ms` on this machine's clock. Only a node
    /// that says it leads is taken: a follower's view of the leader may be behind.
    pub fn take_status(&mut self, status: &Value, now_ms: u64) {
        let (Some(node), Some(term), true) = (
            status["node"].as_u64(),
            status["term"].as_u64(),
            status["state"] == "leader",
        ) else {
            return;
        };
        let leader = (node, term);
        // Windows are counted on cluster time (D47), which the leader reads ahead of its clock.
        let offset_ms = status["cluster_clock_offset_nanos"].as_i64().unwrap_or(0) / 1_000_000;
        let at_ms = now_ms.saturating_add_signed(offset_ms);
        self.cluster_ahead_ms = offset_ms;
        if !self.leaders.contains(&leader) {
            self.leaders.push(leader);
        }
        self.leading_until_ms.insert(leader, at_ms);
        self.last_seen_ms = self.last_seen_ms.max(at_ms);
        for l in status["limits"].as_array().into_iter().flatten() {
            let bound = &l["bound"];
            let (Some(limit), Some(window)) = (l["limit"].as_str(), bound["window"].as_u64())
            else {
                continue;
            };
            let stated = self
                .bounds
                .entry((limit.to_owned(), window))
                .or_default()
                .entry(leader)
                .or_default();
            stated.total_units = stated
                .total_units
                .max(bound["total_units"].as_u64().unwrap_or(0));
            if let Some(why) = bound["unbounded"].as_str() {
                stated.unbounded = Some(why.to_owned());
            }
        }
    }

    /// Takes `region`'s `/v1/keys` answer for one limit. `last`: read after traffic stopped,
    /// so the window's count is final.
    pub fn take_key(&mut self, region: &str, key: &Value, last: bool) {
        let (Some(limit), Some(window), Some(net)) = (
            key["rule"].as_str(),
            key["window"].as_u64(),
            key["net_units"].as_u64(),
        ) else {
            return;
        };
        let carried = key["carried_in_units"].as_u64().unwrap_or(0);
        let count = self
            .windows
            .entry((limit.to_owned(), window, region.to_owned()))
            .or_default();
        count.net_seen_units = net;
        count.carried_in_units = carried;
        if last {
            count.net_final_units = Some(net);
        }
        let closed = key["closed_windows"].as_array().into_iter().flatten();
        for prev in closed.chain([&key["previous_window"]]) {
            if let (Some(w), Some(n)) = (prev["window"].as_u64(), prev["net_units"].as_u64()) {
                self.windows
                    .entry((limit.to_owned(), w, region.to_owned()))
                    .or_default()
                    .net_final_units = Some(n);
            }
        }
        let now = AgentNow {
            window,
            allowance_units: key["allowance_units"].as_u64().unwrap_or(0),
            used_units: net.saturating_sub(carried),
            connected: key["sync"]["connected"].as_bool().unwrap_or(false),
        };
        self.agents
            .insert((limit.to_owned(), region.to_owned()), now);
    }

    /// Takes whether `region`'s agent said its sync stream was up, read at `now_ms`.
    pub fn take_link(&mut self, region: &str, connected: bool, now_ms: u64) {
        let before = self.link_read_ms.insert(region.to_owned(), now_ms);
        if let (false, Some(before)) = (connected, before) {
            *self.sync_down_ms.entry(region.to_owned()).or_default() +=
                now_ms.saturating_sub(before);
        }
    }

    /// Takes `region`'s `/metrics` text: its lease and refusal counters over every rule.
    pub fn take_metrics(&mut self, region: &str, text: &str) {
        let sum = |name: &str, label: Option<&str>| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
                .filter(|l| label.is_none_or(|x| l.contains(x)))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .sum()
        };
        self.totals.insert(
            region.to_owned(),
            AgentTotals {
                lease_granted_units: sum("allot_lease_granted_units_total", None),
                lease_returned_units: sum("allot_lease_returned_units_total", None),
                denied: sum("allot_decisions_total", Some("result=\"denied\"")),
            },
        );
    }
}

/// `GET path` on `addr`: the body of a `200`, or `None` (not there, another status, slow).
pub async fn get(addr: &str, path: &str) -> Option<String> {
    call(addr, "GET", path).await
}

/// `method path` on `addr`, with no body: the body of a `200`, or `None`.
async fn call(addr: &str, method: &str, path: &str) -> Option<String> {
    tokio::time::timeout(CALL_TIMEOUT, call_inner(addr, method, path))
        .await
        .ok()
        .flatten()
}

async fn call_inner(addr: &str, method: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut resp = Vec::new();
    s.take(MAX_ANSWER_BYTES).read_to_end(&mut resp).await.ok()?;
    let resp = String::from_utf8(resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

pub async fn get_json(addr: &str, path: &str) -> Option<Value> {
    serde_json::from_str(&get(addr, path).await?).ok()
}

/// An agent's view of a watched limit's key, watching it (again): from the first such read
/// on, the agent keeps the final count of every window the key closes.
pub async fn watch_key(addr: &str, w: &Watched) -> Option<Value> {
    let path = format!(
        "/v1/keys/watch?domain={}&descriptor={}",
        w.domain, w.descriptor
    );
    serde_json::from_str(&call(addr, "POST", &path).await?).ok()
}
