//! The leader's cost per sync interval as the work grows: R regions (3, 10) each sending one
//! SyncUp per 250 ms interval over K escalated counters (1k, 10k, 100k).
//!
//! One iteration is one interval, driven as the daemon's leader task drives it
//! (`coordinator/src/daemon/leader.rs`), once per region: decode the SyncUp, `handle_sync_up`,
//! `poll_proposals`, encode the round's raft entry as the log stores it, apply it to the
//! replicated state (`ClusterState::apply`, which the leader's own state machine runs too),
//! `handle_committed` per command, `poll_sync_down`, encode the SyncDown; then the interval's
//! tick (`poll_proposals` without a SyncUp). Only that is timed: the fake regions' work is not
//! the leader's. Raft IO (fsync, replication to followers) and gRPC framing are not included.
//! Time is the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), in criterion too: the figure is
//! the leader's CPU per interval, not inflated by others' load on a shared machine.
//!
//! The regions are small fakes that keep the agent's rules that matter to the leader: each
//! SyncUp carries entries and demand for at most `MAX_ITEMS_PER_MESSAGE` counters, from a
//! cursor that wraps (the agent's `collect_reported`); grants apply when their epoch is newer;
//! a release request is acked once by id. Each interval, one counter in twenty changes its
//! demand in each region (a seeded generator: every run is the same), so grows and releases
//! keep flowing.
//!
//! Timings (criterion):
//! `nice -n 10 cargo bench -p allot-coordinator --bench leader_round -- --warm-up-time 1 --measurement-time 5`
//! Sizes and per-phase times, as a table (no criterion):
//! `ALLOT_LEADER_REPORT=1 nice -n 10 cargo bench -p allot-coordinator --bench leader_round`
//! Either for some cases only: `ALLOT_LEADER_CASES=3x10000,10x1000`.
//!
//! The report also measures commit latency: every command the run committed (the setup, then
//! each round's entry) is replayed, in order, through real openraft nodes with their sled
//! store in a temporary directory, a single node and a 3-node cluster on loopback gRPC; the
//! latency is the wall time of `client_write` (append, fsync, replication to a majority,
//! apply) of the entries of the measured intervals. Wall time on a shared machine: an upper
//! bound. `ALLOT_LEADER_COMMIT=0` skips it. `ALLOT_LEADER_DIGEST=1` also prints, per case, a
//! hash of every round entry and SyncDown the run encoded (untimed): a change meant to keep
//! what the leader does must keep it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use allot_coordinator::codec;
use allot_coordinator::node::{NodeSettings, RaftNode};
use allot_coordinator::raft_config::raft_config;
use allot_coordinator::{ClusterCommand, ClusterState, CommandOutcome, TypeConfig};
use allot_core::ids::{Epoch, KeyId, LimitId, RegionId};
use allot_core::limit::LimitSpec;
use allot_core::rebalance::{Coordinator, CoordinatorConfig, MAX_TABLE_ROWS};
use allot_core::sync::{
    ClockSample, CounterEntry, CounterRef, DemandReport, MAX_ITEMS_PER_MESSAGE, ReleaseAck,
    SyncDown, SyncUp,
};
use allot_core::time::{Timestamp, Window};
use allot_proto::sync_convert::{decode_sync_up, encode_sync_down, encode_sync_up};
use criterion::{Criterion, criterion_group};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, LogId};

/// The allot binary's allocator (`src/main.rs`, D45): the leader's CPU as the daemon spends it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SYNC_INTERVAL: Duration = Duration::from_millis(250);
/// A day window: no window ends during a run, so every interval does the same kind of work.
const WINDOW: Duration = Duration::from_secs(86_400);
const QUOTA_UNITS: u64 = 1_000_000;
/// Demand rates are drawn from `0..=MAX_RATE_UNITS_PER_SEC`: over a day, a few regions'
/// demand is around the quota, so the plan both grows and releases.
const MAX_RATE_UNITS_PER_SEC: u64 = 10;
/// One counter in this many changes its demand per region per interval.
const DEMAND_CHANGE_ONE_IN: u64 = 20;
/// Intervals run before measuring: every counter reported by every region a few times and
/// the table's rows made.
const WARM_UP_INTERVALS: usize = 60;
const REPORT_INTERVALS: usize = 20;

/// CPU time this thread has used: what the leader spends, whoever else shares the machine
/// (wall time on a loaded machine counts the waits for a core too).
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is always readable on Linux");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn since(start: Duration) -> Duration {
    cpu_now().saturating_sub(start)
}

/// splitmix64: a seeded generator, so every run feeds the same demand.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Default)]
struct FakeCounter {
    granted_units: u64,
    allowance_units: u64,
    epoch: Epoch,
    rate_units_per_sec: u64,
    /// Fractional use carried between intervals, in units per second times intervals.
    carry: u64,
}

/// Most release acks a fake region remembers by id (a repeated request is acked again, never
/// released twice); the oldest are forgotten first.
const MAX_REMEMBERED_ACKS: usize = 1 << 16;

struct FakeRegion {
    id: RegionId,
    seq: u64,
    config_version: u64,
    counters: Vec<FakeCounter>,
    index: HashMap<CounterRef, usize>,
    refs: Vec<CounterRef>,
    cursor: usize,
    acks: BTreeMap<u64, ReleaseAck>,
    unsent_acks: Vec<u64>,
    rng: Rng,
}

impl FakeRegion {
    fn new(id: RegionId, refs: &[CounterRef], state: &ClusterState, seed: u64) -> Self {
        let default_units = refs
            .first()
            .map_or(0, |c| state.table().default_allowance(c, &id));
        let mut rng = Rng(seed);
        let counters = refs
            .iter()
            .map(|_| FakeCounter {
                allowance_units: default_units,
                rate_units_per_sec: rng.below(MAX_RATE_UNITS_PER_SEC + 1),
                ..FakeCounter::default()
            })
            .collect();
        FakeRegion {
            id,
            seq: 0,
            config_version: state.table().config_version(),
            counters,
            index: refs
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, c)| (c, i))
                .collect(),
            refs: refs.to_vec(),
            cursor: 0,
            acks: BTreeMap::new(),
            unsent_acks: Vec::new(),
            rng,
        }
    }

    /// One interval of use and demand changes, then the SyncUp.
    fn poll_transmit(&mut self, now: Timestamp) -> SyncUp {
        let intervals_per_sec = Duration::from_secs(1).as_millis() / SYNC_INTERVAL.as_millis();
        let intervals_per_sec = intervals_per_sec as u64;
        for c in &mut self.counters {
            if self.rng.below(DEMAND_CHANGE_ONE_IN) == 0 {
                c.rate_units_per_sec = self.rng.below(MAX_RATE_UNITS_PER_SEC + 1);
            }
            c.carry += c.rate_units_per_sec;
            let used = c.carry / intervals_per_sec;
            c.carry %= intervals_per_sec;
            let room = c.allowance_units.saturating_sub(c.granted_units);
            c.granted_units += used.min(room);
        }
        self.seq += 1;
        let take = self.refs.len().min(MAX_ITEMS_PER_MESSAGE);
        let mut entries = Vec::with_capacity(take);
        let mut demand = Vec::with_capacity(take);
        for _ in 0..take {
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % self.refs.len();
            let (counter, c) = (&self.refs[i], &self.counters[i]);
            entries.push(CounterEntry {
                counter: counter.clone(),
                region: self.id.clone(),
                granted_units: c.granted_units,
                refunded_units: 0,
            });
            demand.push(DemandReport {
                counter: counter.clone(),
                demand_micro_units_per_sec: c.rate_units_per_sec * 1_000_000,
                allowance_units: c.allowance_units,
            });
        }
        let release_acks = self
            .unsent_acks
            .drain(..)
            .take(MAX_ITEMS_PER_MESSAGE)
            .filter_map(|id| self.acks.get(&id).cloned())
            .collect();
        SyncUp {
            region: self.id.clone(),
            boot: 1,
            restored: false,
            seq: self.seq,
            sent_at: now,
            config_version: self.config_version,
            entries,
            demand,
            release_acks,
            clock: Some(ClockSample {
                offset_nanos: 0,
                round_trip_nanos: 1_000_000,
            }),
            // The bench's leader answers under term 1.
            clock_leader_term: 1,
            stats: Vec::new(),
            view_expired: false,
            clock_guard: None,
        }
    }

    fn handle_sync_down(&mut self, down: &SyncDown) {
        self.config_version = down.config_version;
        for g in &down.grants {
            let Some(&i) = self.index.get(&g.counter) else {
                continue;
            };
            let c = &mut self.counters[i];
            if g.epoch > c.epoch {
                c.allowance_units = g.allowance_units;
                c.epoch = g.epoch;
            }
        }
        for r in &down.release_requests {
            let Some(&i) = self.index.get(&r.counter) else {
                continue;
            };
            if !self.acks.contains_key(&r.id) {
                let c = &mut self.counters[i];
                let released = r
                    .units
                    .min(c.allowance_units.saturating_sub(c.granted_units));
                c.allowance_units -= released;
                c.epoch = c.epoch.max(r.epoch);
                let ack = ReleaseAck {
                    id: r.id,
                    counter: r.counter.clone(),
                    released_units: released,
                    allowance_after_units: c.allowance_units,
                };
                self.acks.insert(r.id, ack);
                while self.acks.len() > MAX_REMEMBERED_ACKS {
                    self.acks.pop_first();
                }
            }
            self.unsent_acks.push(r.id);
        }
    }
}

/// What one interval cost and carried.
#[derive(Clone, Copy, Default)]
struct IntervalFigures {
    leader: Duration,
    /// Of `leader`: decoding and `handle_sync_up`; `poll_proposals` (the plan); encoding the
    /// entry, applying it and `handle_committed`; `poll_sync_down`; encoding the SyncDown.
    ingest: Duration,
    propose: Duration,
    commit: Duration,
    answer: Duration,
    encode_down: Duration,
    raft_entries: usize,
    raft_entry_bytes: usize,
    commands: usize,
    sync_up_bytes: usize,
    sync_down_bytes: usize,
    sync_down_max_bytes: usize,
}

impl IntervalFigures {
    fn add(&mut self, o: &IntervalFigures) {
        self.leader += o.leader;
        self.ingest += o.ingest;
        self.propose += o.propose;
        self.commit += o.commit;
        self.answer += o.answer;
        self.encode_down += o.encode_down;
        self.raft_entries += o.raft_entries;
        self.raft_entry_bytes += o.raft_entry_bytes;
        self.commands += o.commands;
        self.sync_up_bytes += o.sync_up_bytes;
        self.sync_down_bytes += o.sync_down_bytes;
        self.sync_down_max_bytes = self.sync_down_max_bytes.max(o.sync_down_max_bytes);
    }
}

struct World {
    state: ClusterState,
    coord: Coordinator,
    regions: Vec<FakeRegion>,
    now: Timestamp,
    log_index: u64,
    /// Every command applied so far, the setup's included, when recording (the report):
    /// replayed through real raft nodes for the commit latency.
    committed: Vec<ClusterCommand>,
    record: bool,
    /// Every round entry and SyncDown of the run, as encoded, hashed in order: two builds
    /// that print the same digest (`ALLOT_LEADER_DIGEST=1`) committed and answered the same.
    digest: DefaultHasher,
}

impl World {
    fn new(regions: usize, counters: usize) -> World {
        let mut state = ClusterState::default();
        let spec = LimitSpec::simple("bench", QUOTA_UNITS, WINDOW);
        let mut committed = Vec::new();
        let mut put = |cmd: ClusterCommand| {
            committed.push(cmd.clone());
            match state.apply(cmd) {
                Ok(CommandOutcome::Refused(r)) => panic!("setup refused: {r:?}"),
                Ok(_) => {}
                Err(e) => panic!("setup failed: {e}"),
            }
        };
        put(ClusterCommand::PutLimits {
            version: 1,
            limits: vec![spec],
        });
        let ids: Vec<RegionId> = (0..regions)
            .map(|i| RegionId::new(format!("r{i:02}")))
            .collect();
        for id in &ids {
            put(ClusterCommand::AddRegion {
                region: id.clone(),
                weight_ppm: None,
            });
        }
        // An hour into a window: far from its end, so no pre-issue or collection runs.
        let window = Window::new(WINDOW);
        let start = Timestamp::from_unix_millis(1_800_000_000_000);
        let now = window.start(window.index(start)) + Duration::from_secs(3_600);
        let refs: Vec<CounterRef> = (0..counters)
            .map(|i| CounterRef {
                limit: LimitId::new("bench"),
                key: KeyId::new(format!("tenant-{i:06}")),
                window: window.index(now),
            })
            .collect();
        let cfg = CoordinatorConfig {
            // The default (65,536) is below the largest case: track them all.
            max_tracked_counters: counters.max(CoordinatorConfig::default().max_tracked_counters),
            ..CoordinatorConfig::default()
        };
        let coord = Coordinator::new(cfg, state.table().clone(), now, 1);
        let fakes = ids
            .iter()
            .enumerate()
            .map(|(i, id)| FakeRegion::new(id.clone(), &refs, &state, i as u64 + 1))
            .collect();
        World {
            state,
            coord,
            regions: fakes,
            now,
            log_index: 1,
            committed,
            record: false,
            digest: DefaultHasher::new(),
        }
    }

    /// Commits what the rebalancer proposes as one round entry, as the leader task does.
    fn commit_proposals(&mut self, figures: &mut IntervalFigures) {
        let started = cpu_now();
        let cmds = self.coord.poll_proposals(self.now);
        figures.propose += since(started);
        if cmds.is_empty() {
            return;
        }
        let committing = cpu_now();
        self.log_index += 1;
        let cmd = ClusterCommand::Round(cmds.clone());
        let entry: openraft::Entry<TypeConfig> = openraft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.log_index),
            payload: EntryPayload::Normal(cmd.clone()),
        };
        let bytes = codec::encode("log entry", &entry).expect("a round encodes");
        figures.raft_entries += 1;
        figures.raft_entry_bytes += black_box(&bytes).len();
        figures.commands += cmds.len();
        if self.record {
            self.committed.push(cmd.clone());
        }
        let outcomes = match self.state.apply(cmd) {
            Ok(CommandOutcome::Round(outcomes)) => outcomes,
            other => panic!("a round answered {other:?}"),
        };
        for (cmd, replicated) in cmds.iter().zip(outcomes) {
            let mine = self.coord.handle_committed(self.now, cmd);
            assert_eq!(mine, replicated, "{cmd:?}");
        }
        figures.commit += since(committing);
        // Untimed: what was committed, byte for byte (`ALLOT_LEADER_DIGEST`).
        self.digest.write(&bytes);
    }

    /// One sync interval: every region's SyncUp answered, then the tick.
    fn interval(&mut self) -> IntervalFigures {
        let mut figures = IntervalFigures::default();
        let spacing = SYNC_INTERVAL / self.regions.len() as u32;
        let start = self.now;
        for i in 0..self.regions.len() {
            self.now = start + spacing * i as u32;
            let up = self.regions[i].poll_transmit(self.now);
            let (region, seq) = (up.region.clone(), up.seq);
            let up_bytes = encode_sync_up(up);
            figures.sync_up_bytes += up_bytes.len();

            let started = cpu_now();
            let up = decode_sync_up(&up_bytes).expect("a SyncUp decodes");
            self.coord
                .handle_sync_up(self.now, up)
                .expect("a member's SyncUp is taken");
            let mut inner = IntervalFigures {
                ingest: since(started),
                ..IntervalFigures::default()
            };
            self.commit_proposals(&mut inner);
            let answering = cpu_now();
            let down = self
                .coord
                .poll_sync_down(self.now, &region, seq)
                .expect("no region is removed");
            inner.answer += since(answering);
            let encoding = cpu_now();
            let down_bytes = encode_sync_down(down.clone());
            inner.encode_down += since(encoding);
            inner.leader += since(started);
            figures.add(&inner);
            figures.sync_down_bytes += down_bytes.len();
            figures.sync_down_max_bytes = figures.sync_down_max_bytes.max(down_bytes.len());
            self.digest.write(&down_bytes);

            self.regions[i].handle_sync_down(&down);
        }
        self.now = start + SYNC_INTERVAL;
        let started = cpu_now();
        let mut inner = IntervalFigures::default();
        self.commit_proposals(&mut inner);
        inner.leader += since(started);
        figures.add(&inner);
        figures
    }

    fn warmed(regions: usize, counters: usize, record: bool) -> World {
        let mut w = World::new(regions, counters);
        w.record = record;
        for _ in 0..WARM_UP_INTERVALS {
            w.interval();
        }
        w
    }
}

const CASES: [(usize, usize); 6] = [
    (3, 1_000),
    (3, 10_000),
    (3, 100_000),
    (10, 1_000),
    (10, 10_000),
    (10, 100_000),
];

fn leader_round(c: &mut Criterion) {
    let mut group = c.benchmark_group("leader_round");
    for (regions, counters) in chosen_cases() {
        if counters >= 100_000 {
            group.sample_size(10);
        } else {
            group.sample_size(20);
        }
        let mut world = World::warmed(regions, counters, false);
        group.bench_function(format!("{regions}x{counters}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| world.interval().leader)
                    .sum::<Duration>()
            })
        });
    }
    group.finish();
}

/// The cases `ALLOT_LEADER_CASES` names (`3x10000,10x1000`), or all of them.
fn chosen_cases() -> Vec<(usize, usize)> {
    let Some(names) = std::env::var("ALLOT_LEADER_CASES").ok() else {
        return CASES.to_vec();
    };
    CASES
        .into_iter()
        .filter(|(r, k)| names.split(',').any(|n| n.trim() == format!("{r}x{k}")))
        .collect()
}

/// Latency percentiles of committing `commands[measured_from..]`, after the ones before,
/// through a fresh cluster of `nodes` real nodes (sled store, loopback gRPC).
fn commit_latency(commands: &[ClusterCommand], measured_from: usize, nodes: u64) -> [Duration; 2] {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let dir = tempfile::TempDir::new().expect("a temporary directory");
        let mut members = BTreeMap::new();
        let mut started = BTreeMap::new();
        for id in 1..=nodes {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let addr: SocketAddr = listener.local_addr().expect("its address");
            members.insert(id, BasicNode::new(addr.to_string()));
            let settings = NodeSettings {
                id,
                data_dir: dir.path().join(format!("node-{id}")),
                raft: raft_config("bench").expect("valid settings"),
                tls: None,
            };
            let node = RaftNode::start(settings, listener)
                .await
                .expect("a node starts");
            started.insert(id, node);
        }
        started[&1]
            .raft
            .initialize(members)
            .await
            .expect("the cluster initialises");
        let leader = started[&1]
            .raft
            .wait(Some(Duration::from_secs(30)))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .expect("a leader is elected")
            .current_leader
            .expect("checked above");
        let raft = started[&leader].raft.clone();
        let mut latencies = Vec::new();
        for (i, cmd) in commands.iter().enumerate() {
            let at = Instant::now();
            raft.client_write(cmd.clone()).await.expect("committed");
            if i >= measured_from {
                latencies.push(at.elapsed());
            }
        }
        for node in started.into_values() {
            node.shutdown().await.expect("a node stops");
        }
        latencies.sort();
        let pick = |q: f64| {
            let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
            latencies.get(i).copied().unwrap_or_default()
        };
        [pick(0.5), pick(0.99)]
    })
}

/// Per case: the average over `REPORT_INTERVALS` intervals after the warm-up.
fn report() {
    println!(
        "| regions | counters | leader ms/interval | of one core at 250 ms | ingest ms | propose ms \
         | commit ms | answer ms | encode down ms | raft entries | entry KiB | commands | SyncUp KiB (per region) | SyncDown KiB (avg / max) \
         | table rows |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let with_commit = !std::env::var("ALLOT_LEADER_COMMIT").is_ok_and(|v| v == "0");
    let with_digest = std::env::var("ALLOT_LEADER_DIGEST").is_ok_and(|v| v == "1");
    let mut latency_rows = Vec::new();
    let mut digests = Vec::new();
    for (regions, counters) in chosen_cases() {
        let mut world = World::warmed(regions, counters, with_commit);
        let measured_from = world.committed.len();
        let mut sum = IntervalFigures::default();
        for _ in 0..REPORT_INTERVALS {
            sum.add(&world.interval());
        }
        let n = REPORT_INTERVALS as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / n;
        let kib = |b: usize| b as f64 / 1024.0 / n;
        let per_region = n * regions as f64;
        println!(
            "| {regions} | {counters} | {:.2} | {:.1}% | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} \
             | {:.1} | {:.1} | {:.0} \
             | {:.1} | {:.1} / {:.1} | {} of {MAX_TABLE_ROWS} |",
            ms(sum.leader),
            ms(sum.leader) / SYNC_INTERVAL.as_secs_f64() / 1e3 * 100.0,
            ms(sum.ingest),
            ms(sum.propose),
            ms(sum.commit),
            ms(sum.answer),
            ms(sum.encode_down),
            sum.raft_entries as f64 / n,
            kib(sum.raft_entry_bytes),
            sum.commands as f64 / n,
            sum.sync_up_bytes as f64 / 1024.0 / per_region,
            sum.sync_down_bytes as f64 / 1024.0 / per_region,
            sum.sync_down_max_bytes as f64 / 1024.0,
            world.state.table().row_count(),
        );
        digests.push(format!(
            "{regions}x{counters}: {:016x}",
            world.digest.finish()
        ));
        if with_commit {
            let [one_p50, one_p99] = commit_latency(&world.committed, measured_from, 1);
            let [three_p50, three_p99] = commit_latency(&world.committed, measured_from, 3);
            latency_rows.push(format!(
                "| {regions} | {counters} | {} | {:.1} / {:.1} | {:.1} / {:.1} |",
                world.committed.len() - measured_from,
                one_p50.as_secs_f64() * 1e3,
                one_p99.as_secs_f64() * 1e3,
                three_p50.as_secs_f64() * 1e3,
                three_p99.as_secs_f64() * 1e3,
            ));
        }
    }
    if with_digest {
        println!();
        println!("digest of every round entry and SyncDown, warm-up included:");
        for d in digests {
            println!("{d}");
        }
    }
    if !latency_rows.is_empty() {
        println!();
        println!(
            "| regions | counters | entries measured | commit ms p50 / p99, 1 node | commit ms p50 / p99, 3 nodes |"
        );
        println!("|---|---|---|---|---|");
        for row in latency_rows {
            println!("{row}");
        }
    }
}

criterion_group!(benches, leader_round);

fn main() {
    if std::env::var_os("ALLOT_LEADER_REPORT").is_some() {
        report();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
