//! What leases save the agent: admitted requests per agent CPU-second, and agent RPCs per
//! admitted request, with the client spending leases of `--lease-units` against a running
//! `allot agent`, next to the per-request path (one `Acquire` per request) in the same run.
//! docs/benchmarks.md, "Gateway client", has the command and the figures.
//!
//! ```text
//! allot agent --config limits.yaml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --data ./d &
//! cargo run --release -p allot-client --example agent_cpu -- \
//!     --agent 127.0.0.1:18081 --pid <agent pid> --rounds 3 --secs 4 [--keys 16]
//! ```
//!
//! Both sides run 16 callers in a closed loop on `--keys` keys of domain `bench` (1 by
//! default: every caller on descriptor `key=hot0`; with N, caller i on `key=hot{i % N}`),
//! whose quota no run reaches; the agent's CPU is user plus system time of its process, from
//! `/proc/<pid>/stat`, read as each interval starts and ends. One key is the client's worst
//! case: it holds one lease at a time, so every refill reaches the agent alone, where many
//! keys' refills share the agent's reads and writes as the per-request side's calls do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_client::{Client, ClientConfig, Decision, Target};
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;

const CALLERS: usize = 16;

struct Args {
    agent: String,
    pid: u32,
    rounds: u32,
    secs: u64,
    lease_units: u64,
    keys: usize,
    early_refill_percent: Option<u8>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        agent: "127.0.0.1:8081".into(),
        pid: 0,
        rounds: 3,
        secs: 4,
        lease_units: 100,
        keys: 1,
        early_refill_percent: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--agent" => args.agent = value,
            "--pid" => args.pid = num(&value)? as u32,
            "--rounds" => args.rounds = num(&value)? as u32,
            "--secs" => args.secs = num(&value)?,
            "--lease-units" => args.lease_units = num(&value)?,
            "--keys" => args.keys = num(&value)?.clamp(1, CALLERS as u64) as usize,
            "--early-refill-percent" => {
                let p =
                    u8::try_from(num(&value)?).map_err(|_| format!("{flag} {value}: over 255"))?;
                args.early_refill_percent = Some(p);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.pid == 0 {
        return Err("--pid PID of the agent is required".into());
    }
    Ok(args)
}

/// The agent's user plus system CPU time so far.
fn agent_cpu(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of proc(5); `after` starts at field 3.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    let per_sec = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    Duration::from_secs_f64(ticks as f64 / per_sec)
}

struct Measured {
    admitted: u64,
    rpcs: u64,
    /// Lease requests per lease RPC (1 on the per-request side).
    per_lease_rpc: f64,
    cpu: Duration,
}

/// Every call the client made to the agent: lease requests and releases.
fn rpcs_of(client: &Client) -> u64 {
    let s = client.stats();
    s.lease_rpcs + s.release_rpcs
}

async fn run_client(args: &Args, client: &Arc<Client>) -> Measured {
    let keys: Vec<_> = (0..args.keys)
        .map(|k| {
            let target = Target::new("bench").entry("key", format!("hot{k}"));
            Arc::new(client.key(&target).expect("key"))
        })
        .collect();
    // Warm up: the first lease and the rate estimate of each key.
    for key in &keys {
        for _ in 0..10_000 {
            let _ = client.spend(key, 1).await;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let (cpu0, rpcs0, s0) = (agent_cpu(args.pid), rpcs_of(client), client.stats());
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (client, key, stop, admitted) = (
                client.clone(),
                keys[i % keys.len()].clone(),
                stop.clone(),
                admitted.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    if client.spend(&key, 1).await == Decision::Allowed {
                        n += 1;
                    }
                    // Let the driver and the other callers run between decisions.
                    if n % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                admitted.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    stop.store(true, Ordering::Relaxed);
    let (cpu1, rpcs1, s1) = (agent_cpu(args.pid), rpcs_of(client), client.stats());
    for t in tasks {
        let _ = t.await;
    }
    Measured {
        admitted: admitted.load(Ordering::Relaxed),
        rpcs: rpcs1 - rpcs0,
        per_lease_rpc: (s1.lease_requests - s0.lease_requests) as f64
            / (s1.lease_rpcs - s0.lease_rpcs).max(1) as f64,
        cpu: cpu1 - cpu0,
    }
}

async fn run_acquire(args: &Args) -> Measured {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", args.agent))
        .expect("address")
        .connect()
        .await
        .expect("agent");
    let request = |i: usize| pb::AcquireRequest {
        target: Some(pb::Target {
            domain: "bench".into(),
            entries: vec![pb::Entry {
                key: "key".into(),
                value: format!("hot{}", i % args.keys),
            }],
        }),
        cost_units: 1,
        idempotency_key: String::new(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let cpu0 = agent_cpu(args.pid);
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let mut client = LeaseServiceClient::new(channel.clone());
            let request = request(i);
            let (stop, admitted) = (stop.clone(), admitted.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let ok = client.acquire(request.clone()).await.ok();
                    if ok
                        .and_then(|r| r.into_inner().decision)
                        .is_some_and(|d| d.allowed)
                    {
                        n += 1;
                    }
                }
                admitted.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    stop.store(true, Ordering::Relaxed);
    let cpu1 = agent_cpu(args.pid);
    for t in tasks {
        let _ = t.await;
    }
    Measured {
        admitted: admitted.load(Ordering::Relaxed),
        rpcs: admitted.load(Ordering::Relaxed),
        per_lease_rpc: 1.0,
        cpu: cpu1 - cpu0,
    }
}

fn per_cpu_sec(m: &Measured) -> f64 {
    m.admitted as f64 / m.cpu.as_secs_f64().max(1e-3)
}

#[tokio::main]
async fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut config = ClientConfig::new(format!("http://{}", args.agent));
    config.gateway.initial_lease_units = args.lease_units;
    config.gateway.max_lease_units = args.lease_units;
    if let Some(p) = args.early_refill_percent {
        config.gateway.early_refill_percent = p;
    }
    let client = Arc::new(Client::start(config).expect("client"));
    let started = Instant::now();
    let mut ratios = Vec::new();
    for round in 1..=args.rounds {
        let leased = run_client(&args, &client).await;
        let direct = run_acquire(&args).await;
        let ratio = per_cpu_sec(&leased) / per_cpu_sec(&direct);
        ratios.push(ratio);
        println!(
            "round {round}: {} keys, leases of {}: {} admitted, {} RPCs (1/{:.0}, {:.2} leases per lease RPC), agent CPU {:.2} s, \
             {:.0} admitted per agent CPU-s | per request: {} admitted, agent CPU {:.2} s, \
             {:.0} per agent CPU-s | ratio {ratio:.1}x",
            args.keys,
            args.lease_units,
            leased.admitted,
            leased.rpcs,
            leased.admitted as f64 / leased.rpcs.max(1) as f64,
            leased.per_lease_rpc,
            leased.cpu.as_secs_f64(),
            per_cpu_sec(&leased),
            direct.admitted,
            direct.cpu.as_secs_f64(),
            per_cpu_sec(&direct),
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median ratio {:.1}x over {} rounds ({:.0} s)",
        ratios[ratios.len() / 2],
        ratios.len(),
        started.elapsed().as_secs_f64()
    );
}
