//! One decision from a held lease through `allot_client::Client::try_spend`, next to governor's
//! in-process GCRA (`RateLimiter::direct`) on the same workload, in the same run.
//!
//! Fairness:
//! - Both admit every request: the client holds a lease far larger than the run spends, and
//!   governor's quota is far above the rate a loop reaches. What is measured is the allow path.
//! - Both read a real clock per decision, the same one: quanta's (governor's default clock, and
//!   the client's).
//! - The client's lease comes from an in-process gRPC server that grants whatever is asked
//!   (the agent's lease path is measured elsewhere); it is asked once before measuring.
//! - Asymmetries left, inherent: the client locks its key's shard (a mutex) and does the
//!   gateway's bookkeeping (rate sample, refill check); governor does one compare-exchange.
//!
//! Two threads: `two_threads/*` spends from two OS threads at once, on one key (both on one
//! shard's mutex) and on 256 keys each (spread over the shards), for throughput and scaling.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_client::{Client, ClientConfig, Decision, Key, Target};
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_server::{LeaseService, LeaseServiceServer};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tonic::{Request, Response, Status};

/// Larger than any run spends: the lease never runs low while measured.
const LEASE_UNITS: u64 = 1 << 40;
const KEYS_PER_THREAD: usize = 256;

/// Grants every lease request in full, for a minute.
#[derive(Default)]
struct Granting {
    next_lease: AtomicU64,
}

#[tonic::async_trait]
impl LeaseService for Granting {
    async fn acquire(
        &self,
        _: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        Err(Status::unimplemented("acquire"))
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let req = request.into_inner();
        let lease_id = match req.top_up_lease_id {
            0 => self.next_lease.fetch_add(1, Ordering::Relaxed) + 1,
            id => id,
        };
        Ok(Response::new(pb::LeaseResponse {
            lease: Some(pb::Lease {
                lease_id,
                units: req.units_wanted,
                expires_at_unix_ms: 0,
                ttl_ms: 60_000,
            }),
            decision: Some(pb::Decision {
                allowed: true,
                remaining_units: LEASE_UNITS,
                ..pb::Decision::default()
            }),
        }))
    }

    async fn lease_batch(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        let mut results = Vec::new();
        for req in request.into_inner().leases {
            let lease = self.lease(Request::new(req)).await?.into_inner();
            results.push(pb::LeaseBatchResult {
                result: Some(pb::lease_batch_result::Result::Lease(lease)),
            });
        }
        Ok(Response::new(pb::LeaseBatchResponse { results }))
    }

    async fn renew(
        &self,
        _: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        Err(Status::unimplemented("renew"))
    }

    async fn release(
        &self,
        _: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(pb::ReleaseResponse::default()))
    }

    async fn settle(
        &self,
        _: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        Err(Status::unimplemented("settle"))
    }

    async fn acquire_slot(
        &self,
        _: Request<pb::AcquireSlotRequest>,
    ) -> Result<Response<pb::AcquireSlotResponse>, Status> {
        Err(Status::unimplemented("acquire_slot"))
    }

    async fn release_slot(
        &self,
        _: Request<pb::ReleaseSlotRequest>,
    ) -> Result<Response<pb::ReleaseSlotResponse>, Status> {
        Err(Status::unimplemented("release_slot"))
    }
}

struct Setup {
    runtime: tokio::runtime::Runtime,
    client: Arc<Client>,
}

fn setup() -> Setup {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let client = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LeaseServiceServer::new(Granting::default()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut config = ClientConfig::new(format!("http://{address}"));
        config.gateway.initial_lease_units = LEASE_UNITS;
        config.gateway.max_lease_units = LEASE_UNITS;
        // Keys stay held between the bench functions.
        config.gateway.idle_release_after = Duration::from_secs(3_600);
        Client::start(config).expect("client")
    });
    Setup {
        runtime,
        client: Arc::new(client),
    }
}

/// Resolves a key and has its lease granted before measuring.
fn held_key(s: &Setup, name: &str) -> Key {
    let key = s
        .client
        .key(&Target::new("bench").entry("key", name))
        .expect("key");
    let first = s.runtime.block_on(s.client.spend(&key, 1));
    assert_eq!(first, Decision::Allowed, "the lease was granted");
    key
}

fn single_thread(c: &mut Criterion) {
    let s = setup();
    let key = held_key(&s, "one");
    let mut group = c.benchmark_group("decision");
    group.bench_function("client/held_lease", |b| {
        b.iter(|| black_box(&s.client).try_spend(black_box(&key), 1))
    });
    let quota = Quota::per_second(NonZeroU32::MAX);
    let limiter = RateLimiter::direct(quota);
    group.bench_function("governor/direct", |b| {
        b.iter(|| black_box(&limiter).check())
    });
    group.finish();
    assert_eq!(s.client.try_spend(&key, 1), Some(Decision::Allowed));
}

/// `iters` decisions split over two threads; the time until both are done.
fn two_threads(iters: u64, spend: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let spend = &spend;
            scope.spawn(move || {
                for i in 0..iters / 2 {
                    spend(thread, i);
                }
            });
        }
    });
    start.elapsed()
}

fn scaling(c: &mut Criterion) {
    let s = setup();
    let one = held_key(&s, "shared");
    let many: Vec<Vec<Key>> = (0..2)
        .map(|t| {
            (0..KEYS_PER_THREAD)
                .map(|k| held_key(&s, &format!("t{t}-k{k}")))
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("two_threads");
    group.bench_function("client/one_key", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_, _| {
                black_box(s.client.try_spend(&one, 1));
            })
        })
    });
    group.bench_function("client/many_keys", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, i| {
                let key = &many[t][i as usize % KEYS_PER_THREAD];
                black_box(s.client.try_spend(key, 1));
            })
        })
    });
    let limiter = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
    group.bench_function("governor/one_key", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_, _| {
                black_box(limiter.check().is_ok());
            })
        })
    });
    group.finish();
}

criterion_group!(benches, single_thread, scaling);
criterion_main!(benches);
