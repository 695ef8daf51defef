//! The demo's gateways: one `allot-client` per region, in this process, spending the
//! tenant's key at a rate that follows the sun (each region's demand rises and falls in
//! turn over the run) with one flash crowd. What the clients count is the demand side only:
//! the summary's admitted figures come from the agents (`summary.rs`).

use std::f64::consts::TAU;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use allot_client::{Client, ClientConfig, Decision, FailureMode, Target};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::plan::REGIONS;

/// Requests a second in a region at night, and at its noon.
const NIGHT_PER_SEC: f64 = 10.0;
const NOON_PER_SEC: f64 = 250.0;
/// The flash crowd: requests a second added in its region, over its share of the run (its
/// evening: the allowance must move back to a region that had given it away).
const FLASH_PER_SEC: f64 = 600.0;
const FLASH_REGION: usize = 0;
const FLASH_FROM: f64 = 0.55;
const FLASH_TO: f64 = 0.65;
/// How often a region's gateway spends what its rate owes.
const TICK: Duration = Duration::from_millis(20);
/// Most requests one tick sends: a late tick does not send a burst to catch up.
const MAX_PER_TICK: u64 = 100;

/// The demand of region `region` (an index into [`REGIONS`]) at `fraction` of the run
/// (0..1), in requests a second: a day of the run's length, each region's noon a third of it
/// after the one before.
pub fn demand_per_sec(region: usize, fraction: f64) -> f64 {
    let noon = (region as f64 + 0.5) / REGIONS.len() as f64;
    let sun = 0.5 * (1.0 + (TAU * (fraction - noon)).cos());
    let flash = if region == FLASH_REGION && (FLASH_FROM..FLASH_TO).contains(&fraction) {
        FLASH_PER_SEC
    } else {
        0.0
    };
    NIGHT_PER_SEC + (NOON_PER_SEC - NIGHT_PER_SEC) * sun + flash
}

/// What one region's gateway has seen, counted by the demo.
#[derive(Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub admitted: AtomicU64,
    pub denied: AtomicU64,
    /// Decided by the failure mode (closed) while the agent could not be reached.
    pub unavailable: AtomicU64,
}

/// The gateways of every region, until [`Traffic::stop`].
pub struct Traffic {
    pub counts: Vec<Arc<Counts>>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Traffic {
    /// One client per region on `agents` (gRPC addresses, in [`REGIONS`] order), spending
    /// `domain` `key=value` for `run`.
    pub fn start(agents: &[String], target: &Target, run: Duration) -> Result<Traffic, String> {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut counts = Vec::new();
        for (region, agent) in agents.iter().enumerate() {
            let mut config = ClientConfig::new(format!("http://{agent}"));
            // Honest figures: a request the agent could not be asked about is refused.
            config.failure_mode = FailureMode::Closed;
            let client = Client::start(config).map_err(|e| format!("client: {e}"))?;
            let key = client.key(target).map_err(|e| format!("client: {e}"))?;
            let c = Arc::new(Counts::default());
            counts.push(c.clone());
            tasks.spawn(drive(client, key, region, run, c, stopped.clone()));
        }
        Ok(Traffic {
            counts,
            stop,
            tasks,
        })
    }

    /// Stops every gateway; each gives its unspent units back to its agent.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn drive(
    client: Client,
    key: allot_client::Key,
    region: usize,
    run: Duration,
    counts: Arc<Counts>,
    mut stop: watch::Receiver<bool>,
) {
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut owed = 0.0_f64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let fraction = start.elapsed().as_secs_f64() / run.as_secs_f64().max(1.0);
        owed += demand_per_sec(region, fraction.min(1.0)) * TICK.as_secs_f64();
        let due = (owed.floor() as u64).min(MAX_PER_TICK);
        owed -= owed.floor();
        for _ in 0..due {
            let decision = client.spend(&key, 1).await;
            count(&counts, decision);
        }
    }
    client.shutdown().await;
}

fn count(c: &Counts, decision: Decision) {
    c.requests.fetch_add(1, Ordering::Relaxed);
    let which = match decision {
        Decision::Allowed | Decision::Unavailable { allowed: true } => &c.admitted,
        Decision::Denied { .. } => &c.denied,
        Decision::Unavailable { allowed: false } => &c.unavailable,
    };
    which.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each region peaks in turn, a third of the run apart; the flash crowd adds to one
    /// region, for its span only.
    #[test]
    fn demand_follows_the_sun_with_one_flash_crowd() {
        let peak = |r: usize| (r as f64 + 0.5) / 3.0;
        for r in 0..3 {
            let noon = demand_per_sec(r, peak(r));
            let night = demand_per_sec(r, (peak(r) + 0.5) % 1.0);
            assert!(noon >= NOON_PER_SEC - 1e-9, "region {r} at noon: {noon}");
            assert!(
                night <= NIGHT_PER_SEC + 1e-9,
                "region {r} at night: {night}"
            );
        }
        assert!(demand_per_sec(0, 1.0 / 6.0) > demand_per_sec(1, 1.0 / 6.0));
        assert!(demand_per_sec(2, 5.0 / 6.0) > demand_per_sec(1, 5.0 / 6.0));
        let flash = demand_per_sec(FLASH_REGION, 0.6);
        assert!(flash >= FLASH_PER_SEC + NIGHT_PER_SEC, "{flash}");
        assert!(demand_per_sec(FLASH_REGION, 0.7) < FLASH_PER_SEC);
    }
}
