//! Benchmarks of the regional budget state machine: one lease grant, one acquire (a hot key
//! in steady state, and a rotating set of keys), and the heap held per idle key, measured
//! with a counting global allocator.
//!
//! Run: `cargo bench -p allot-core --bench budget -- --warm-up-time 1 --measurement-time 3`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use allot_core::budget::{AcquireRequest, BudgetConfig, LeaseOutcome, LeaseRequest, RegionBudget};
use allot_core::ids::{KeyId, LimitId, RegionId, RequestId};
use allot_core::limit::LimitSpec;
use allot_core::time::Timestamp;
use criterion::{Criterion, criterion_group};

/// Counts live heap bytes (as requested by callers; the system allocator's own per-block
/// overhead is not included).
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// An hour-long window starting at a round hour; benches stay well inside it.
const T0: Timestamp = Timestamp::from_unix_millis(1_699_999_200_000);
const HOT_QUOTA_UNITS: u64 = 1 << 50;
/// Operations timed together; the agent's per-call `drain_dirty` runs untimed between batches.
const BATCH: u64 = 256;
/// An odd 128-bit multiplier: consecutive counters become scattered request ids.
const SCATTER: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;

fn region() -> RegionBudget {
    region_with_idempotency(BudgetConfig::new(RegionId::from("eu"), vec![]).idempotency_capacity)
}

fn region_with_idempotency(capacity: usize) -> RegionBudget {
    let regions: Vec<RegionId> = ["eu", "us", "ap"].into_iter().map(RegionId::from).collect();
    let mut cfg = BudgetConfig::new(RegionId::from("eu"), regions);
    cfg.max_leases_per_key = 1_024;
    cfg.idempotency_capacity = capacity;
    let spec = LimitSpec::simple("api", HOT_QUOTA_UNITS, Duration::from_secs(3_600));
    RegionBudget::new(cfg, vec![spec]).expect("valid config")
}

fn key_name(i: u64) -> String {
    // A multiplicative permutation, so keys arrive in no particular order (16 characters).
    format!("api_key={:08x}", i.wrapping_mul(0x9E37_79B1) as u32)
}

fn bench_lease(c: &mut Criterion, name: &str, with_request_id: bool, idempotency_capacity: usize) {
    let limit = LimitId::new("api");
    let key = KeyId::new("api_key=00000001");
    let mut b = region_with_idempotency(idempotency_capacity);
    let mut now = T0;
    let mut next_request = 0u128;
    c.bench_function(name, |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = BATCH.min(iters - done);
                let mut leases = Vec::with_capacity(n as usize);
                let start = Instant::now();
                for _ in 0..n {
                    now = now + Duration::from_micros(1);
                    next_request += 1;
                    let out = b.lease(
                        now,
                        LeaseRequest {
                            limit: limit.clone(),
                            key: key.clone(),
                            units_wanted: 100,
                            min_units: 1,
                            denied_units: 0,
                            rate_units_per_sec: None,
                            ttl: Duration::from_secs(10),
                            // Real ids are hashes of clients' idempotency keys: scattered.
                            request_id: with_request_id
                                .then_some(RequestId(next_request.wrapping_mul(SCATTER))),
                        },
                    );
                    leases.push(black_box(out));
                }
                total += start.elapsed();
                for out in leases {
                    if let Ok(LeaseOutcome::Granted(g)) = out {
                        let _ = b.release(now, g.lease, 0, None);
                    }
                }
                black_box(b.drain_dirty());
                done += n;
            }
            total
        })
    });
}

fn bench_acquire(c: &mut Criterion, name: &str, keys: u64) {
    let limit = LimitId::new("api");
    let names: Vec<KeyId> = (0..keys).map(|i| KeyId::new(key_name(i))).collect();
    let mut b = region();
    let mut now = T0;
    let mut i = 0usize;
    c.bench_function(name, |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = BATCH.min(iters - done);
                let start = Instant::now();
                for _ in 0..n {
                    now = now + Duration::from_micros(1);
                    i = (i + 1) % names.len();
                    let req = AcquireRequest {
                        limit: limit.clone(),
                        key: names[i].clone(),
                        cost_units: 1,
                        request_id: None,
                    };
                    black_box(b.acquire(now, req).map(|d| d.allowed).unwrap_or(false));
                }
                total += start.elapsed();
                black_box(b.drain_dirty());
                done += n;
            }
            total
        })
    });
}

fn benches(c: &mut Criterion) {
    let full = BudgetConfig::new(RegionId::from("eu"), vec![]).idempotency_capacity;
    bench_lease(c, "lease grant (hot key, no request id)", false, full);
    bench_lease(
        c,
        "lease grant (hot key, request id, 100k-entry cache)",
        true,
        full,
    );
    bench_lease(
        c,
        "lease grant (hot key, request id, 4k-entry cache)",
        true,
        4_096,
    );
    bench_acquire(c, "acquire (hot key, steady state)", 1);
    bench_acquire(c, "acquire (rotating over 100k keys)", 100_000);
}

/// Heap bytes held per key that was used in an earlier window and is idle now: 100k keys
/// created by one acquire each, persisted (drained), then looked at from the next window.
fn bytes_per_idle_key(scrambled: bool) -> f64 {
    const KEYS: u64 = 100_000;
    let mut cfg = BudgetConfig::new(RegionId::from("eu"), vec![RegionId::from("eu")]);
    cfg.max_keys_per_limit = 2 * KEYS as usize;
    let spec = LimitSpec::simple("api", 1_000, Duration::from_secs(60));
    let limit = LimitId::new("api");
    let mut b = RegionBudget::new(cfg, vec![spec]).expect("valid config");
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for i in 0..KEYS {
        let name = if scrambled {
            key_name(i)
        } else {
            format!("api_key={i:08}")
        };
        let req = AcquireRequest {
            limit: limit.clone(),
            key: KeyId::new(name),
            cost_units: 1,
            request_id: None,
        };
        b.acquire(T0, req).expect("room for every key");
        drop(b.drain_dirty());
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    assert_eq!(b.key_count(&limit), KEYS as usize);
    black_box(&b);
    (after - before) as f64 / KEYS as f64
}

criterion_group!(budget_benches, benches);

fn main() {
    let scrambled = bytes_per_idle_key(true);
    let sequential = bytes_per_idle_key(false);
    println!(
        "bytes held per idle key (100k keys, 16-byte names): {scrambled:.1} (keys in random order), {sequential:.1} (keys in order); target <= 128"
    );
    budget_benches();
    Criterion::default().configure_from_args().final_summary();
}
