//! `allot demo`: the whole system in one command. Three coordinator nodes and three regional
//! agents as child processes of this binary, gateways in this process whose demand follows
//! the sun with a flash crowd, a live table every second, and on request a leader killed, a
//! region cut off, and a JSON summary whose figures come from the daemons' admin APIs.
//! docs/demo.md.

mod children;
mod cluster;
mod observe;
mod plan;
mod relay;
mod summary;
mod table;
mod traffic;

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use allot_client::Target;
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use cluster::Cluster;
use observe::{Observed, Watched, get, get_json, key_path, unix_ms};
pub use plan::DemoArgs;
use plan::{Plan, REGIONS};
use summary::ClientFigures;
use traffic::Traffic;

/// The tenant's limit: small enough that windows visibly fill under the demo's demand.
const DOMAIN: &str = "demo";
const TENANT: &str = "acme";
const QUOTA_UNITS: u64 = 2_000;
const WINDOW_SECS: u64 = 10;
/// Each region's default share, in parts of the quota: three fifths are shared out by
/// default, two fifths move to where demand is.
const WEIGHT: &str = "0.2";

/// How often the demo reads the nodes' and agents' admin APIs.
const OBSERVE_EVERY: Duration = Duration::from_millis(250);
/// A read is also made this long after each window's end, before the regions' next calls
/// roll their counters: a window's final count is read from the key as it was left
/// (`previous_window` in `/v1/keys`).
const AFTER_EDGE: Duration = Duration::from_millis(2);
/// Longest wait for a leader and every agent's sync stream before traffic starts.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// A killed leader is started again this long after the kill.
const RESTART_AFTER_SECS: u64 = 3;

pub fn run(args: DemoArgs) -> ExitCode {
    let plan = match Plan::from_args(&args) {
        Ok(p) => p,
        Err(msg) => return fail(2, &msg),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(1, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(demo(plan)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(msg) => fail(1, &msg),
    }
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("allot demo: {msg}");
    ExitCode::from(code)
}

fn limits_yaml() -> String {
    let weights: Vec<String> = REGIONS.iter().map(|r| format!("{r}: {WEIGHT}")).collect();
    format!(
        "# Written by `allot demo`: one tenant's quota, worldwide, coordinated across regions.\n\
         domain: {DOMAIN}\n\
         descriptors:\n  \
           - key: tenant\n    \
             value: {TENANT}\n    \
             rate_limit: {{requests_per_unit: {QUOTA_UNITS}}}\n    \
             allot: {{window: {WINDOW_SECS}s, weights: {{{}}}}}\n",
        weights.join(", ")
    )
}

fn watched() -> Vec<Watched> {
    vec![Watched {
        limit: format!("{DOMAIN}/tenant={TENANT}"),
        domain: DOMAIN.to_owned(),
        descriptor: format!("tenant={TENANT}"),
        quota_units: QUOTA_UNITS,
        window_ms: WINDOW_SECS * 1_000,
    }]
}

/// Where the live table and the run's events go: stdout, or stderr under `--json`.
#[derive(Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    fn say(self, text: &str) {
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
}

/// Ctrl-C and SIGTERM, listened for from the start: a signal during startup is taken once the
/// cluster is up (the run then stops at once and cleanly), never left to kill the demo and
/// orphan its children, which sit in process groups of their own.
struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    fn listen() -> Result<StopSignals, String> {
        let listen = |kind| signal(kind).map_err(|e| format!("cannot listen for signals: {e}"));
        Ok(StopSignals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The whole run; `Ok(false)` when a child died on its own.
async fn demo(plan: Plan) -> Result<bool, String> {
    let mut signals = StopSignals::listen()?;
    let out = Out { json: plan.json };
    let dir = tempfile::Builder::new()
        .prefix("allot-demo-")
        .tempdir()
        .map_err(|e| format!("cannot make the demo's folder: {e}"))?;
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, limits_yaml()).map_err(|e| format!("{}: {e}", limits.display()))?;
    let relayed = plan.partition.as_ref().map(|p| p.region);
    let result = match Cluster::start(dir.path(), &limits, relayed).await {
        Ok(mut cluster) => {
            announce(out, &plan, dir.path(), &cluster);
            let result = run_traffic(out, &plan, &mut cluster, &mut signals).await;
            for k in cluster.stop() {
                eprintln!("allot demo: {k}");
            }
            result
        }
        Err(e) => Err(e),
    };
    let healthy = matches!(result, Ok((_, true)));
    // The logs of a child that failed are what tells why: never removed.
    if plan.keep || !healthy {
        let kept = dir.keep();
        eprintln!("allot demo: kept {}", kept.display());
    }
    let (summary, healthy) = result?;
    if plan.json {
        println!("{summary}");
    }
    Ok(healthy)
}

fn announce(out: Out, plan: &Plan, dir: &Path, cluster: &Cluster) {
    let nodes: Vec<String> = cluster
        .node_https()
        .iter()
        .map(|(_, h)| format!("http://{h}"))
        .collect();
    let first = cluster
        .node_https()
        .first()
        .map(|(_, h)| h.clone())
        .unwrap_or_default();
    out.say(&format!(
        "allot demo: {} coordinator nodes, regions {}, {} s of traffic\n  \
         folder {} (logs: coordinator-N.log, agent-REGION.log)\n  \
         coordinators' admin HTTP: {} (/v1/status; `allot status --coordinator {first}`)\n  \
         limit {DOMAIN}/tenant={TENANT}: {QUOTA_UNITS} per {WINDOW_SECS} s worldwide, \
         default share {WEIGHT} of it per region",
        cluster::NODES,
        REGIONS.join(", "),
        plan.duration.as_secs(),
        dir.display(),
        nodes.join(" "),
    ));
}

/// Waits for the cluster, runs the traffic to the end (or Ctrl-C, or a child's death), and
/// returns the summary and whether every child lived.
async fn run_traffic(
    out: Out,
    plan: &Plan,
    cluster: &mut Cluster,
    signals: &mut StopSignals,
) -> Result<(serde_json::Value, bool), String> {
    let limits = watched();
    let obs = Arc::new(Mutex::new(Observed::default()));
    let agents: Vec<(String, String)> = REGIONS
        .iter()
        .zip(&cluster.agent_addrs)
        .map(|(r, (_, http))| ((*r).to_owned(), http.clone()))
        .collect();
    let reader = Reader {
        nodes: cluster.node_https(),
        agents,
        limits: limits.clone(),
        obs: obs.clone(),
    };
    let (stop_reading, stopped) = watch::channel(false);
    let reading = tokio::spawn(reader.clone().run(stopped));
    wait_for_cluster(&obs, &limits).await?;
    let grpcs: Vec<String> = cluster.agent_addrs.iter().map(|(g, _)| g.clone()).collect();
    let target = Target::new(DOMAIN).entry("tenant", TENANT);
    lock(&obs).mark_run_start();
    let traffic = Traffic::start(&grpcs, &target, plan.duration)?;
    let started = Instant::now();
    let looked = Looked {
        obs: &obs,
        limits: &limits,
        traffic: &traffic,
    };
    let (healthy, schedule) = run_loop(out, plan, cluster, looked, signals).await;
    let elapsed = started.elapsed().as_secs_f64();
    let clients: Vec<ClientFigures> = traffic.counts.iter().map(|c| figures(c)).collect();
    // The gateways give their unused units back before the last reads.
    traffic.stop().await;
    stop_reading.send_replace(true);
    let _ = reading.await;
    reader.read_last(&cluster.agent_addrs).await;
    let regions: Vec<(&str, ClientFigures)> = REGIONS.iter().copied().zip(clients).collect();
    let mut summary = summary::summary(&lock(&obs), elapsed, &limits, &regions);
    add_events(&mut summary, plan, &schedule);
    Ok((summary, healthy))
}

/// The kill and the cut, as the run made them.
fn add_events(summary: &mut serde_json::Value, plan: &Plan, schedule: &Schedule) {
    summary["killed"] = json!(
        schedule
            .killed
            .map(|(node, term, at)| json!({ "node": node, "term": term, "at_s": at }))
    );
    summary["partition"] = json!(plan.partition.as_ref().map(|p| {
        json!({ "region": REGIONS[p.region], "from_s": p.from_secs, "to_s": p.to_secs })
    }));
}

fn lock(obs: &Mutex<Observed>) -> std::sync::MutexGuard<'_, Observed> {
    // A reader that panicked mid-update leaves figures no worse than a missed read.
    obs.lock().unwrap_or_else(PoisonError::into_inner)
}

fn figures(c: &traffic::Counts) -> ClientFigures {
    use std::sync::atomic::Ordering::Relaxed;
    ClientFigures {
        requests: c.requests.load(Relaxed),
        admitted: c.admitted.load(Relaxed),
        denied: c.denied.load(Relaxed),
        unavailable: c.unavailable.load(Relaxed),
    }
}

/// Until a leader leads and every agent's sync stream is up.
async fn wait_for_cluster(obs: &Mutex<Observed>, limits: &[Watched]) -> Result<(), String> {
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
struct Reader {
    nodes: Vec<(u64, String)>,
    agents: Vec<(String, String)>,
    limits: Vec<Watched>,
    obs: Arc<Mutex<Observed>>,
}

impl Reader {
    async fn run(self, mut stop: watch::Receiver<bool>) {
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
    async fn read_last(&self, agents: &[(String, String)]) {
        self.read(true).await;
        for (region, (_, http)) in REGIONS.iter().zip(agents) {
            if let Some(text) = get(http, "/metrics").await {
                lock(&self.obs).take_metrics(region, &text);
            }
        }
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
                if let Some(k) = get_json(http, &key_path(w)).await {
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

/// What the run does at given seconds: the kill, the restart, the cut and the heal.
struct Schedule {
    kill_at: Option<u64>,
    /// The leader killed: (node, term, second).
    killed: Option<(u64, u64, u64)>,
    restart: Option<(u64, u64)>,
    cut: Option<(u64, u64)>,
    cut_now: bool,
}

impl Schedule {
    fn new(plan: &Plan) -> Schedule {
        Schedule {
            kill_at: plan.kill_leader_at_secs,
            killed: None,
            restart: None,
            cut: plan.partition.as_ref().map(|p| (p.from_secs, p.to_secs)),
            cut_now: false,
        }
    }

    /// Does what is due at `secs`; returns what it did, for the table's stream.
    fn apply(&mut self, secs: u64, cluster: &mut Cluster, obs: &Mutex<Observed>) -> Vec<String> {
        let mut did = Vec::new();
        if self.kill_at.is_some_and(|at| secs >= at) {
            let leader = lock(obs).leader();
            if let Some((node, term)) = leader
                && cluster.kill(node)
            {
                did.push(format!(
                    "{secs}s: SIGKILL coordinator {node}, the leader (term {term})"
                ));
                self.kill_at = None;
                self.killed = Some((node, term, secs));
                self.restart = Some((secs + RESTART_AFTER_SECS, node));
            }
        }
        if let Some((at, node)) = self.restart
            && secs >= at
        {
            self.restart = None;
            did.push(match cluster.restart(node) {
                Ok(()) => format!("{secs}s: coordinator {node} started again"),
                Err(e) => format!("{secs}s: coordinator {node} could not start again: {e}"),
            });
        }
        if let Some((from, to)) = self.cut {
            let cut = (from..to).contains(&secs);
            if cut != self.cut_now {
                self.cut_now = cut;
                cluster.set_cut(cut);
                let what = if cut {
                    "cut off from"
                } else {
                    "reconnected to"
                };
                did.push(format!(
                    "{secs}s: the partitioned region {what} the coordinators"
                ));
            }
        }
        did
    }
}

/// What the run loop reads each second: the admin APIs' reads, the limits, the gateways.
struct Looked<'a> {
    obs: &'a Mutex<Observed>,
    limits: &'a [Watched],
    traffic: &'a Traffic,
}

/// Every second until the end: the schedule, a look for dead children, the table. Returns
/// false when a child died on its own, and what the schedule did.
async fn run_loop(
    out: Out,
    plan: &Plan,
    cluster: &mut Cluster,
    looked: Looked<'_>,
    signals: &mut StopSignals,
) -> (bool, Schedule) {
    let Looked {
        obs,
        limits,
        traffic,
    } = looked;
    let started = Instant::now();
    let mut schedule = Schedule::new(plan);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut before: Vec<ClientFigures> = vec![ClientFigures::default(); REGIONS.len()];
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.recv() => {
                out.say("allot demo: interrupted; stopping");
                return (true, schedule);
            }
        }
        let secs = started.elapsed().as_secs();
        if started.elapsed() >= plan.duration {
            return (true, schedule);
        }
        for line in schedule.apply(secs, cluster, obs) {
            out.say(&format!("  >> {line}"));
        }
        let gone = cluster.exits();
        for g in &gone {
            eprintln!("allot demo: {g}");
        }
        if !gone.is_empty() {
            return (false, schedule);
        }
        let now: Vec<ClientFigures> = traffic.counts.iter().map(|c| figures(c)).collect();
        let lines: Vec<table::RegionLine> = REGIONS
            .iter()
            .enumerate()
            .map(|(i, name)| table::RegionLine {
                name,
                last_second: delta(now[i], before[i]),
                cut: schedule.cut_now && plan.partition.as_ref().is_some_and(|p| p.region == i),
            })
            .collect();
        out.say(&table::render(&lock(obs), secs, limits, &lines));
        before = now;
    }
}

fn delta(now: ClientFigures, before: ClientFigures) -> ClientFigures {
    ClientFigures {
        requests: now.requests.saturating_sub(before.requests),
        admitted: now.admitted.saturating_sub(before.admitted),
        denied: now.denied.saturating_sub(before.denied),
        unavailable: now.unavailable.saturating_sub(before.unavailable),
    }
}
