//! One limiting decision in allot against the same workload through the `governor` crate.
//!
//! Fairness:
//! - Same quota on both sides: one unit per 600 ms with a burst of 20 (100/min, burst 20), one
//!   unit per request, GCRA on both sides with the same emission interval and tolerance.
//! - Same traffic: time moves 300 ms per request, twice the sustained rate, so after the
//!   initial burst half of the requests are allowed and half denied (both paths measured).
//! - Same time source where the time source is part of the measurement: the "fake clock" pair
//!   advances one `governor::clock::FakeRelativeClock` per request on both sides and allot reads
//!   it back, so the harness cost is identical and the difference is the decision.
//!   `harness/fake_clock_advance` measures that shared cost alone.
//! - Parameters and state go through `black_box`, so neither side gets its emission interval
//!   folded into a constant or its state kept in registers across requests.
//! - The asymmetries left are inherent: governor's state is an atomic behind `&self` (a lock-free
//!   compare-exchange; the keyed store also takes a mutex), allot's is a plain value behind
//!   `&mut` because its agent owns each key's state on one thread. allot also computes
//!   `remaining` and `reset_after` on every decision; governor's default middleware does not.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_core::algo::fixed_window::{FixedWindow, FixedWindowState};
use allot_core::algo::gcra::{Gcra, GcraState};
use allot_core::algo::sliding_window::{SlidingWindow, SlidingWindowState};
use allot_core::limit::RateCap;
use allot_core::time::{Timestamp, Window, duration_nanos};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::{Clock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

/// 100 per minute: one unit per 600 ms.
const EMISSION_INTERVAL: Duration = Duration::from_millis(600);
const BURST: u32 = 20;
/// Twice the sustained rate: half the requests pass once the burst is spent.
const REQUEST_GAP: Duration = Duration::from_millis(300);
/// Keys of the keyed variant, visited round-robin.
const KEYS: u64 = 1_000;
/// For the real-clock pair: a rate high enough that a real clock, moving a few tens of
/// nanoseconds per decision, still sees both answers.
const FAST_EMISSION_INTERVAL: Duration = Duration::from_nanos(50);
/// Decisions sampled to report the real-clock allow/deny mix.
const MIX_SAMPLE: usize = 2_000_000;
/// 1 November 2023, a realistic epoch offset for timestamps built from a relative clock.
const EPOCH_OFFSET_NANOS: u64 = 1_698_796_800_000_000_000;

const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("burst must be positive"),
    }
}

fn allot_gcra(emission_interval: Duration) -> Gcra {
    Gcra::new(RateCap {
        units: 1,
        per: emission_interval,
        burst: u64::from(BURST),
    })
}

fn governor_quota(emission_interval: Duration) -> Quota {
    match Quota::with_period(emission_interval) {
        Some(q) => q.allow_burst(nonzero(BURST)),
        None => panic!("emission interval must be positive"),
    }
}

fn fake_clock_timestamp(clock: &FakeRelativeClock) -> Timestamp {
    Timestamp::from_unix_nanos(EPOCH_OFFSET_NANOS + u64::from(clock.now()))
}

/// (a) The decision alone: time comes from a fake clock (or the caller).
fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra_decision");
    let gap_nanos = duration_nanos(REQUEST_GAP);

    let clock = FakeRelativeClock::default();
    group.bench_function("harness/fake_clock_advance", |b| {
        b.iter(|| {
            clock.advance(REQUEST_GAP);
            black_box(fake_clock_timestamp(&clock))
        })
    });

    let gcra = allot_gcra(EMISSION_INTERVAL);
    let mut state = GcraState::default();
    let clock = FakeRelativeClock::default();
    group.bench_function("allot/fake_clock", |b| {
        b.iter(|| {
            clock.advance(REQUEST_GAP);
            let now = fake_clock_timestamp(&clock);
            black_box(&gcra).check(black_box(&mut state), now, 1)
        })
    });

    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(governor_quota(EMISSION_INTERVAL), clock.clone());
    group.bench_function("governor/fake_clock", |b| {
        b.iter(|| {
            clock.advance(REQUEST_GAP);
            black_box(&limiter).check()
        })
    });

    let mut state = GcraState::default();
    let mut now_nanos = EPOCH_OFFSET_NANOS;
    group.bench_function("allot/caller_time", |b| {
        b.iter(|| {
            now_nanos += gap_nanos;
            let now = Timestamp::from_unix_nanos(black_box(now_nanos));
            black_box(&gcra).check(black_box(&mut state), now, 1)
        })
    });
    group.finish();
}

/// (b) The decision plus a real clock read, as a daemon would make it.
fn with_clock_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra_with_clock");

    // The same quanta read governor's default clock makes, anchored to the Unix epoch once.
    let gcra = allot_gcra(FAST_EMISSION_INTERVAL);
    let mut state = GcraState::default();
    let clock = quanta::Clock::new();
    let epoch_offset_nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(EPOCH_OFFSET_NANOS, duration_nanos);
    group.bench_function("allot/quanta", |b| {
        b.iter(|| {
            let since_start = clock.delta_as_nanos(0, clock.raw());
            let now = Timestamp::from_unix_nanos(epoch_offset_nanos + since_start);
            black_box(&gcra).check(black_box(&mut state), now, 1)
        })
    });

    let mut state = GcraState::default();
    group.bench_function("allot/system_time", |b| {
        b.iter(|| {
            let since_epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let now = Timestamp::from_unix_nanos(duration_nanos(since_epoch));
            black_box(&gcra).check(black_box(&mut state), now, 1)
        })
    });

    let limiter = RateLimiter::direct(governor_quota(FAST_EMISSION_INTERVAL));
    group.bench_function("governor/quanta", |b| {
        b.iter(|| black_box(&limiter).check())
    });
    group.finish();

    // With a real clock the mix depends on each side's speed, so it is printed, not assumed.
    let mut state = GcraState::default();
    let allot_share = allowed_share(|| {
        let since_start = clock.delta_as_nanos(0, clock.raw());
        let now = Timestamp::from_unix_nanos(epoch_offset_nanos + since_start);
        gcra.check(&mut state, now, 1).is_allowed()
    });
    let limiter = RateLimiter::direct(governor_quota(FAST_EMISSION_INTERVAL));
    let governor_share = allowed_share(|| limiter.check().is_ok());
    eprintln!(
        "gcra_with_clock allowed share: allot {allot_share:.2}, governor {governor_share:.2}"
    );
}

/// The share of `MIX_SAMPLE` back-to-back decisions that were allowed.
fn allowed_share(mut decide: impl FnMut() -> bool) -> f64 {
    let allowed = (0..MIX_SAMPLE).filter(|_| decide()).count();
    allowed as f64 / MIX_SAMPLE as f64
}

/// (c) Keyed: 1,000 keys round-robin, each seeing a request every 300 ms as in (a).
fn keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra_keyed");
    let step = REQUEST_GAP / KEYS as u32;

    let gcra = allot_gcra(EMISSION_INTERVAL);
    let mut states: HashMap<u64, GcraState> = HashMap::new();
    let clock = FakeRelativeClock::default();
    let mut key = 0u64;
    group.bench_function("allot/hashmap", |b| {
        b.iter(|| {
            clock.advance(step);
            key = (key + 1) % KEYS;
            let now = fake_clock_timestamp(&clock);
            let state = states.entry(black_box(key)).or_default();
            black_box(&gcra).check(state, now, 1)
        })
    });

    let clock = FakeRelativeClock::default();
    let limiter: RateLimiter<u64, _, _, NoOpMiddleware<_>> = RateLimiter::new(
        governor_quota(EMISSION_INTERVAL),
        DefaultKeyedStateStore::<u64>::default(),
        clock.clone(),
    );
    let mut key = 0u64;
    group.bench_function("governor/default_keyed_store", |b| {
        b.iter(|| {
            clock.advance(step);
            key = (key + 1) % KEYS;
            black_box(&limiter).check_key(&black_box(key))
        })
    });
    group.finish();
}

/// (d) The window counters on the same traffic (100 per minute, a request every 300 ms).
fn windows(c: &mut Criterion) {
    let mut group = c.benchmark_group("window_decision");
    let gap_nanos = duration_nanos(REQUEST_GAP);
    let minute = Window::new(Duration::from_secs(60));

    let fixed = FixedWindow::new(100, minute);
    let mut state = FixedWindowState::default();
    let mut now_nanos = EPOCH_OFFSET_NANOS;
    group.bench_function("fixed_window/caller_time", |b| {
        b.iter(|| {
            now_nanos += gap_nanos;
            let now = Timestamp::from_unix_nanos(black_box(now_nanos));
            black_box(&fixed).check(black_box(&mut state), now, 1)
        })
    });

    let sliding = SlidingWindow::new(100, minute);
    let mut state = SlidingWindowState::default();
    let mut now_nanos = EPOCH_OFFSET_NANOS;
    group.bench_function("sliding_window/caller_time", |b| {
        b.iter(|| {
            now_nanos += gap_nanos;
            let now = Timestamp::from_unix_nanos(black_box(now_nanos));
            black_box(&sliding).check(black_box(&mut state), now, 1)
        })
    });
    group.finish();
}

criterion_group!(benches, decision, with_clock_read, keyed, windows);
criterion_main!(benches);
