//! `allot demo`: the whole system in one command. Three coordinator nodes and three regional
//! agents as child processes of this binary, gateways in this process whose demand follows
//! the sun with a flash crowd, a live table every second, and on request a leader killed, a
//! region cut off, and a JSON summary whose figures come from the daemons' admin APIs.
//! docs/demo.md.

mod children;
mod cluster;
mod observe;
mod plan;
mod reader;
mod relay;
mod schedule;
mod summary;
mod table;
mod traffic;

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_client::Target;
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use cluster::Cluster;
use observe::{Observed, Watched};
pub use plan::DemoArgs;
use plan::{Plan, REGIONS};
use reader::{Reader, lock, wait_for_cluster};
use schedule::Schedule;
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
    let result = match Cluster::start(dir.path(), &limits, relayed, plan.tls).await {
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
         daemon links: {}\n  \
         dashboard: http://{first}/ (live, in a browser; any node's admin HTTP serves it)\n  \
         coordinators' admin HTTP: {} (/v1/status; `allot status --coordinator {first}`)\n  \
         limit {DOMAIN}/tenant={TENANT}: {QUOTA_UNITS} per {WINDOW_SECS} s worldwide, \
         default share {WEIGHT} of it per region\n  \
         {}",
        cluster::NODES,
        REGIONS.join(", "),
        plan.duration.as_secs(),
        dir.display(),
        if plan.tls {
            "mutual TLS (certificates in certs/, docs/security.md)"
        } else {
            "plaintext (--plaintext)"
        },
        nodes.join(" "),
        match plan.kill_leader_at_secs {
            Some(at) => format!(
                "the leader is killed at {at} s and restarted {} s later                  (--kill-leader-at SECONDS|none)",
                plan.restart_after_secs
            ),
            None => "no leader kill (--kill-leader-at none)".to_owned(),
        },
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

fn figures(c: &traffic::Counts) -> ClientFigures {
    use std::sync::atomic::Ordering::Relaxed;
    ClientFigures {
        requests: c.requests.load(Relaxed),
        admitted: c.admitted.load(Relaxed),
        denied: c.denied.load(Relaxed),
        unavailable: c.unavailable.load(Relaxed),
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
