//! The demo's reads of the daemons' admin APIs: every node's `/v1/status` and every agent's
//! `/v1/keys/watch`, every [`OBSERVE_EVERY`] and just past each window's end, into [`Observed`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::observe::{Observed, Watched, get, get_json, unix_ms, watch_key};
use super::plan::REGIONS;

/// How often the demo reads the nodes' and agents' admin APIs.
const OBSERVE_EVERY: Duration = Duration::from_millis(250);
/// A read is also made this long after each window's end, so the live table moves to the
/// new window at once. (The ended window's final count does not depend on it: the agents
/// keep it for the watched key, in `closed_windows`.)
const AFTER_EDGE: Duration = Duration::from_millis(2);
/// Tries of each agent's last read: a window's final count is read once, after traffic
/// stopped, so one read lost to a loaded machine must not leave the window unjudged.
const LAST_READ_TRIES: u32 = 5;
/// Longest wait for a leader and every agent's sync stream before traffic starts.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

pub fn lock(obs: &Mutex<Observed>) -> MutexGuard<'_, Observed> {
    // A reader that panicked mid-update leaves figures no worse than a missed read.
    obs.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Until a leader leads and every agent's sync stream is up.
pub async fn wait_for_cluster(obs: &Mutex<Observed>, limits: &[Watched]) -> Result<(), String> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let first = limits.first().map(|w| w.limit.clone()).unwrap_or_default();
    loop {
        let ready = {
            let o = lock(obs);
            let synced = REGIONS.iter().all(|r| {
                o.agents
                    .get(&(first.clone(), (*r).to_owned()))
                    .is_some_and(|a| a.connected)
            });
            o.leader().is_some() && synced
        };
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no leader with every agent synced within {}s (the logs say why)",
                STARTUP_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(OBSERVE_EVERY).await;
    }
}

/// Reads the nodes' status and the agents' keys into [`Observed`].
#[derive(Clone)]
pub struct Reader {
    pub nodes: Vec<(u64, String)>,
    pub agents: Vec<(String, String)>,
    pub limits: Vec<Watched>,
    pub obs: Arc<Mutex<Observed>>,
}

impl Reader {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            self.read(false).await;
            let pause = self.pause();
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Until the next read: [`OBSERVE_EVERY`], or just past the next window's end on cluster
    /// time if that comes first.
    fn pause(&self) -> Duration {
        let Some(window_ms) = self.limits.first().map(|w| w.window_ms.max(1)) else {
            return OBSERVE_EVERY;
        };
        let ahead = lock(&self.obs).cluster_ahead_ms;
        let now = unix_ms().saturating_add_signed(ahead);
        let to_edge = Duration::from_millis(window_ms - now % window_ms);
        OBSERVE_EVERY.min(to_edge + AFTER_EDGE)
    }

    /// After traffic stopped: every count is final, and the agents' totals are read.
    pub async fn read_last(&self, agents: &[(String, String)]) {
        self.read(true).await;
        for (region, (_, http)) in REGIONS.iter().zip(agents) {
            if let Some(text) = get(http, "/metrics").await {
                lock(&self.obs).take_metrics(region, &text);
            }
        }
    }

    /// An agent's key of `w`; the last read is tried again (after a pause) when it fails.
    async fn read_key(&self, http: &str, w: &Watched, last: bool) -> Option<serde_json::Value> {
        let tries = if last { LAST_READ_TRIES } else { 1 };
        for attempt in 1..=tries {
            if let Some(k) = watch_key(http, w).await {
                return Some(k);
            }
            if attempt < tries {
                tokio::time::sleep(OBSERVE_EVERY).await;
            }
        }
        None
    }

    /// One read of everything; `last`: after traffic stopped.
    async fn read(&self, last: bool) {
        for (_, http) in &self.nodes {
            if let Some(s) = get_json(http, "/v1/status").await {
                lock(&self.obs).take_status(&s, unix_ms());
            }
        }
        for (region, http) in &self.agents {
            for (i, w) in self.limits.iter().enumerate() {
                if let Some(k) = self.read_key(http, w, last).await {
                    let mut obs = lock(&self.obs);
                    obs.take_key(region, &k, last);
                    if i == 0 {
                        let connected = k["sync"]["connected"] == true;
                        obs.take_link(region, connected, unix_ms());
                    }
                }
            }
        }
    }
}
