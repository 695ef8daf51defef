//! The driver task: everything that talks to the agent. Each round it sweeps every shard's
//! gateway (`handle_timeout`), takes its messages (`poll_transmit`) and turns them into lease
//! API calls: a lease request carries the key's refill (`top_up_lease_id`) and the leases
//! waiting to be handed back (`returns`); the answers go back into the gateway. While the
//! agent is unreachable every lease request is answered "unavailable" at once (the key's
//! failure mode decides once its leases are spent) and the driver reconnects with capped
//! exponential backoff and full jitter.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use allot_core::gateway::{
    LeaseDenial, LeaseGrant, LeaseRelease, LeaseWanted, SettleDelta, ToAgent,
};
use allot_core::ids::LeaseId;
use allot_core::time::Timestamp;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use allot_proto::lease::v1::{self as pb, MAX_LEASES_PER_BATCH};
use tokio::sync::{Semaphore, watch};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::backoff::Backoff;
use crate::client::Shared;
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::target::Target;

/// Most messages taken from the gateways per round; a round that reaches it runs again at once.
const MAX_MESSAGES_PER_ROUND: usize = 1_024;

/// How long a key whose lease request the agent refused as out of this gateway's scope is
/// denied locally before asking again (a callers file may be fixed meanwhile).
const REFUSED_CALLER_RETRY: Duration = Duration::from_secs(1);

/// Most hand-backs carried by one lease request (the agent's limit on `returns`).
const MAX_RETURNS_PER_LEASE: usize = 64;

pub(crate) type Conn = LeaseServiceClient<InterceptedService<Channel, Bearer>>;

/// Puts the configured token on every call (D59).
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

impl Bearer {
    fn of(config: &ClientConfig) -> Bearer {
        // The token was checked as printable ASCII by `ClientConfig::validate`.
        Bearer(
            config
                .bearer_token
                .as_ref()
                .and_then(|t| format!("Bearer {t}").parse().ok()),
        )
    }
}

pub(crate) fn check_address(config: &ClientConfig) -> Result<()> {
    endpoint(config, Duration::from_secs(1)).map(|_| ())
}

fn endpoint(config: &ClientConfig, timeout: Duration) -> Result<Endpoint> {
    let address = &config.agent;
    let bad = |e: tonic::transport::Error| Error::Address {
        address: address.to_owned(),
        reason: e.to_string(),
    };
    let e = Endpoint::from_shared(address.to_owned())
        .map(|e| e.connect_timeout(timeout).timeout(timeout))
        .map_err(bad)?;
    match &config.tls {
        Some(tls) => e.tls_config(tls.clone()).map_err(bad),
        None => Ok(e),
    }
}

/// What a pass over the shards does before taking their messages.
#[derive(Clone, Copy)]
enum Poll {
    Sweep,
    EarlyRefills,
}

struct Driver {
    shared: Arc<Shared>,
    conn: Option<Conn>,
    backoff: Backoff,
    next_connect_at: Instant,
    in_flight: Arc<Semaphore>,
}

pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let config = &shared.config;
    let seed = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    )
    .unwrap_or(1);
    let mut driver = Driver {
        backoff: Backoff::new(config.reconnect_base, config.reconnect_cap, seed),
        in_flight: Arc::new(Semaphore::new(config.max_in_flight_rpcs)),
        conn: None,
        next_connect_at: Instant::now(),
        shared: shared.clone(),
    };
    let tick = shared.config.gateway.sweep_interval;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = shared.wake_driver.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
        if *stop.borrow() {
            break;
        }
        driver.round().await;
    }
    driver.give_back_all().await;
}

impl Driver {
    async fn round(&mut self) {
        self.ensure_connected().await;
        let now = self.shared.now();
        let mut messages = Vec::new();
        self.poll_shards(now, Poll::Sweep, &mut messages);
        if messages
            .iter()
            .any(|(_, m)| matches!(m, ToAgent::LeaseWanted(_)))
        {
            // A request goes anyway: keys of every shard past their early mark ride with it,
            // so many keys' refills share one exchange (`early_refill_percent`).
            self.poll_shards(now, Poll::EarlyRefills, &mut messages);
        }
        if messages.len() >= MAX_MESSAGES_PER_ROUND {
            self.shared.wake_driver.notify_one();
        }
        let mut wanted = Vec::new();
        for (shard, message) in messages {
            match message {
                ToAgent::LeaseWanted(w) => wanted.push((shard, w)),
                ToAgent::Release(r) => self.shared.push_return(r),
                ToAgent::Settle(s) => {
                    let c = &self.shared.counters;
                    let (counter, units) = match s.delta {
                        SettleDelta::Refund { units } => (&c.unsent_refund_units, units),
                        SettleDelta::Overage { units } => (&c.unsent_overage_units, units),
                    };
                    counter.fetch_add(units, Ordering::Relaxed);
                }
            }
        }
        self.send_leases(wanted).await;
        self.send_releases().await;
        self.send_slot_releases().await;
    }

    /// Takes every shard's messages, after its sweep or its early refills.
    fn poll_shards(&self, now: Timestamp, poll: Poll, messages: &mut Vec<(usize, ToAgent)>) {
        for (index, shard) in self.shared.shards.iter().enumerate() {
            let mut gateway = shard.lock();
            match poll {
                Poll::Sweep => gateway.handle_timeout(now),
                Poll::EarlyRefills => gateway.refill_early(now),
            }
            while messages.len() < MAX_MESSAGES_PER_ROUND {
                match gateway.poll_transmit(now) {
                    Some(m) => messages.push((index, m)),
                    None => break,
                }
            }
        }
    }

    /// Slots whose guards were dropped.
    async fn send_slot_releases(&mut self) {
        let Some(conn) = self.conn.clone() else {
            return;
        };
        loop {
            let Some(slot_id) = self.shared.pending_slots().pop_front() else {
                return;
            };
            let (shared, conn) = (self.shared.clone(), conn.clone());
            if !self
                .spawn_call(async move { release_slot_call(&shared, conn, slot_id).await })
                .await
            {
                return;
            }
        }
    }

    /// Connects when there is no connection and the backoff allows.
    async fn ensure_connected(&mut self) {
        if self.conn.is_some() && !self.shared.connected.load(Ordering::Relaxed) {
            // An RPC found the connection broken.
            self.conn = None;
            self.fail_connection();
        }
        if self.conn.is_some() || Instant::now() < self.next_connect_at {
            return;
        }
        let config = &self.shared.config;
        let connected = match endpoint(config, config.rpc_timeout) {
            Ok(e) => e.connect().await.ok(),
            Err(_) => None,
        };
        match connected {
            Some(channel) => {
                let conn = LeaseServiceClient::with_interceptor(channel, Bearer::of(config));
                *self.shared.conn() = Some(conn.clone());
                self.conn = Some(conn);
                self.shared.connected.store(true, Ordering::Relaxed);
                self.backoff.reset();
            }
            None => self.fail_connection(),
        }
    }

    fn fail_connection(&mut self) {
        self.shared.connected.store(false, Ordering::Relaxed);
        *self.shared.conn() = None;
        self.shared
            .counters
            .reconnects
            .fetch_add(1, Ordering::Relaxed);
        self.next_connect_at = Instant::now() + self.backoff.next_delay();
    }

    /// The round's lease requests, up to [`MAX_LEASES_PER_BATCH`] per call: a gateway refilling
    /// many keys at once costs the agent one exchange, not one per key.
    async fn send_leases(&mut self, wanted: Vec<(usize, LeaseWanted)>) {
        let Some(conn) = self.conn.clone() else {
            for (shard, w) in wanted {
                self.feed(shard, |g, now| g.handle_agent_unavailable(now, w.ticket));
            }
            return;
        };
        let mut wanted = wanted.into_iter().peekable();
        while wanted.peek().is_some() {
            let batch: Vec<Asked> = wanted
                .by_ref()
                .take(MAX_LEASES_PER_BATCH)
                .map(|(shard, w)| Asked {
                    shard,
                    w,
                    returns: self.take_returns(),
                })
                .collect();
            let (shared, conn) = (self.shared.clone(), conn.clone());
            if !self
                .spawn_call(async move { lease_call(&shared, conn, batch).await })
                .await
            {
                return;
            }
        }
    }

    /// Hand-backs to ride with one lease request.
    fn take_returns(&self) -> Vec<LeaseRelease> {
        let mut pending = self.shared.pending_returns();
        let n = pending.len().min(MAX_RETURNS_PER_LEASE);
        pending.drain(..n).collect()
    }

    /// Runs `call` on its own task once one of the bounded in-flight permits is free, holding
    /// the permit until it ends. False when the permits are closed (shutting down).
    async fn spawn_call(&self, call: impl Future<Output = ()> + Send + 'static) -> bool {
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return false;
        };
        tokio::spawn(async move {
            call.await;
            drop(permit);
        });
        true
    }

    /// Hand-backs that found no lease request to ride with go as Release calls.
    async fn send_releases(&mut self) {
        let Some(conn) = self.conn.clone() else {
            return;
        };
        loop {
            let Some(release) = self.shared.pending_returns().pop_front() else {
                return;
            };
            let (shared, conn) = (self.shared.clone(), conn.clone());
            if !self
                .spawn_call(async move { release_call(&shared, conn, release).await })
                .await
            {
                return;
            }
        }
    }

    fn feed(
        &self,
        shard: usize,
        f: impl FnOnce(&mut allot_core::gateway::Gateway, allot_core::time::Timestamp),
    ) {
        feed(&self.shared, shard, f);
    }

    /// Shutdown: waits for the calls in flight, then gives back every unused unit.
    async fn give_back_all(mut self) {
        let config = &self.shared.config;
        let deadline = Instant::now() + config.shutdown_timeout;
        let permits = u32::try_from(config.max_in_flight_rpcs).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(
            config.shutdown_timeout,
            self.in_flight.acquire_many(permits),
        )
        .await;
        let now = self.shared.now();
        for shard in self.shared.shards.iter() {
            // Fast budgets first: their unspent units go back with the leases.
            let mut gateway = shard.release_all(now);
            while let Some(m) = gateway.poll_transmit(now) {
                if let ToAgent::Release(r) = m {
                    self.shared.push_return(r);
                }
            }
        }
        self.ensure_connected().await;
        let Some(conn) = self.conn.clone() else {
            return;
        };
        while Instant::now() < deadline {
            let Some(release) = self.shared.pending_returns().pop_front() else {
                break;
            };
            release_call(&self.shared, conn.clone(), release).await;
        }
        while Instant::now() < deadline {
            let Some(slot_id) = self.shared.pending_slots().pop_front() else {
                break;
            };
            release_slot_call(&self.shared, conn.clone(), slot_id).await;
        }
    }
}

fn feed(
    shared: &Shared,
    shard: usize,
    f: impl FnOnce(&mut allot_core::gateway::Gateway, allot_core::time::Timestamp),
) {
    let now = shared.now();
    f(&mut shared.shards[shard].lock(), now);
    shared.shards[shard].answered.notify_waiters();
}

/// Whether an RPC's failure says the connection is gone (rather than this call refused).
fn connection_lost(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

/// One lease request of a round: the gateway's ask and the hand-backs riding with it.
struct Asked {
    shard: usize,
    w: LeaseWanted,
    returns: Vec<LeaseRelease>,
}

/// One call for a round's lease requests: `Lease` for one, `LeaseBatch` for more.
async fn lease_call(shared: &Shared, mut conn: Conn, batch: Vec<Asked>) {
    let config = &shared.config;
    let mut asked = Vec::with_capacity(batch.len());
    let mut requests = Vec::with_capacity(batch.len());
    for a in batch {
        match lease_request(config, &a) {
            Some(request) => {
                requests.push(request);
                asked.push(a);
            }
            None => {
                // No request to ride with: the hand-backs wait for the next one.
                for r in a.returns {
                    shared.push_return(r);
                }
                feed(shared, a.shard, |g, now| {
                    g.handle_agent_unavailable(now, a.w.ticket)
                });
            }
        }
    }
    if requests.is_empty() {
        return;
    }
    let c = &shared.counters;
    c.lease_rpcs.fetch_add(1, Ordering::Relaxed);
    c.lease_requests
        .fetch_add(requests.len() as u64, Ordering::Relaxed);
    let answers = if requests.len() == 1 {
        let request = requests.pop().expect("one request");
        vec![call(config.rpc_timeout, conn.lease(request)).await]
    } else {
        let n = requests.len();
        let batch = pb::LeaseBatchRequest { leases: requests };
        match call(config.rpc_timeout, conn.lease_batch(batch)).await {
            Ok(response) => batch_answers(response, n),
            Err(code) => vec![Err(code); n],
        }
    };
    for (a, answer) in asked.into_iter().zip(answers) {
        lease_answered(shared, a, answer);
    }
}

fn lease_request(config: &crate::config::ClientConfig, a: &Asked) -> Option<pb::LeaseRequest> {
    let target = Target::from_ids(&a.w.limit, &a.w.key)?;
    Some(pb::LeaseRequest {
        target: Some(target.to_proto()),
        units_wanted: a.w.units,
        min_units: a.w.min_units,
        ttl_ms: u64::try_from(config.lease_ttl.as_millis()).unwrap_or(u64::MAX),
        idempotency_key: String::new(),
        returns: a
            .returns
            .iter()
            .map(|r| pb::LeaseReturn {
                lease_id: r.lease.0,
                unused_units: r.units,
            })
            .collect(),
        top_up_lease_id: a.w.refill.map_or(0, |l| l.0),
    })
}

/// An RPC's answer, or the code it failed with (a timeout is `DeadlineExceeded`).
async fn call<T>(
    timeout: Duration,
    rpc: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> std::result::Result<T, Code> {
    match tokio::time::timeout(timeout, rpc).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status.code()),
        Err(_) => Err(Code::DeadlineExceeded),
    }
}

/// A batch's answers, one per item; an item the agent left unanswered failed as `Internal`.
fn batch_answers(
    response: pb::LeaseBatchResponse,
    n: usize,
) -> Vec<std::result::Result<pb::LeaseResponse, Code>> {
    let mut answers: Vec<_> = response
        .results
        .into_iter()
        .take(n)
        .map(|r| match r.result {
            Some(pb::lease_batch_result::Result::Lease(lease)) => Ok(lease),
            Some(pb::lease_batch_result::Result::Error(e)) => Err(Code::from_i32(e.code)),
            None => Err(Code::Internal),
        })
        .collect();
    answers.resize(n, Err(Code::Internal));
    answers
}

fn lease_answered(shared: &Shared, a: Asked, answer: std::result::Result<pb::LeaseResponse, Code>) {
    let Asked { shard, w, returns } = a;
    match answer {
        Ok(response) => {
            let max_lease_units = shared.config.gateway.max_lease_units;
            feed(shared, shard, |g, now| {
                match lease_answer(response, max_lease_units) {
                    Ok(grant) => g.handle_lease_granted(now, w.ticket, grant),
                    Err(denial) => g.handle_lease_denied(now, w.ticket, denial),
                }
            });
        }
        Err(code @ (Code::Unauthenticated | Code::PermissionDenied)) => {
            // Not this gateway's to spend: a refusal, never the failure mode's admission (an
            // open failure mode would otherwise admit a domain the agent refuses it). The
            // hand-backs go again with the next request.
            shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
            shared
                .counters
                .refused_callers
                .fetch_add(1, Ordering::Relaxed);
            for r in returns {
                shared.push_return(r);
            }
            tracing::warn!(
                ?code,
                limit = w.limit.as_str(),
                "the agent refused this gateway's lease request"
            );
            let denial = LeaseDenial {
                retry_after: REFUSED_CALLER_RETRY,
            };
            feed(shared, shard, |g, now| {
                g.handle_lease_denied(now, w.ticket, denial)
            });
        }
        Err(code) => {
            shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
            if connection_lost(code) {
                shared.connected.store(false, Ordering::Relaxed);
                // The agent may not have seen them: send again (a return of an ended lease is
                // skipped by the agent, so a second delivery changes nothing).
                for r in returns {
                    shared.push_return(r);
                }
            }
            tracing::debug!(?code, "lease request failed");
            feed(shared, shard, |g, now| {
                g.handle_agent_unavailable(now, w.ticket)
            });
        }
    }
}

/// The gateway's view of a lease answer.
fn lease_answer(
    response: pb::LeaseResponse,
    max_lease_units: u64,
) -> Result<LeaseGrant, LeaseDenial> {
    let decision = response.decision.unwrap_or_default();
    match response.lease {
        Some(lease) if lease.units > 0 || lease.lease_id == 0 => {
            // Lease 0: no rule, or an unlimited or disabled one; spend freely, in leases of
            // the largest size so the key is asked about rarely.
            let (units, remaining_units) = if lease.lease_id == 0 {
                (max_lease_units, max_lease_units)
            } else {
                (lease.units, decision.remaining_units)
            };
            Ok(LeaseGrant {
                lease: LeaseId(lease.lease_id),
                units,
                ttl: Duration::from_millis(lease.ttl_ms),
                remaining_units,
            })
        }
        _ => Err(LeaseDenial {
            retry_after: Duration::from_millis(
                decision
                    .retry_after_ms
                    .unwrap_or(decision.reset_after_ms)
                    .max(1),
            ),
        }),
    }
}

async fn release_call(shared: &Shared, mut conn: Conn, release: LeaseRelease) {
    let request = pb::ReleaseRequest {
        lease_id: release.lease.0,
        unused_units: release.units,
        idempotency_key: String::new(),
    };
    shared.counters.release_rpcs.fetch_add(1, Ordering::Relaxed);
    let Err(code) = call(shared.config.rpc_timeout, conn.release(request)).await else {
        return;
    };
    // NOT_FOUND: the lease ended already (expired); nothing to give back.
    if code == Code::NotFound {
        return;
    }
    shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
    if connection_lost(code) {
        shared.connected.store(false, Ordering::Relaxed);
        shared.push_return(release);
    }
}

async fn release_slot_call(shared: &Shared, mut conn: Conn, slot_id: u64) {
    let request = pb::ReleaseSlotRequest { slot_id };
    // `released: false`: the slot's TTL ended it already.
    let Err(code) = call(shared.config.rpc_timeout, conn.release_slot(request)).await else {
        return;
    };
    shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
    if connection_lost(code) {
        shared.connected.store(false, Ordering::Relaxed);
        shared.push_slot_release(slot_id);
    }
}

/// The agent's answer to a slot request.
pub(crate) enum SlotAnswer {
    /// Held (`slot_id` 0: the rule has no concurrency cap, nothing to release).
    Acquired {
        slot_id: u64,
    },
    Denied {
        retry_after: Duration,
    },
    /// No connection, or the call failed.
    Unreachable,
}

/// One AcquireSlot call, made by the spender's task (a slot is a network hop by nature: the
/// agent counts slots across gateways).
pub(crate) async fn acquire_slot(shared: &Shared, target: &Target) -> SlotAnswer {
    let conn = shared.conn().clone();
    let Some(mut conn) = conn else {
        return SlotAnswer::Unreachable;
    };
    let request = pb::AcquireSlotRequest {
        target: Some(target.to_proto()),
        idempotency_key: String::new(),
    };
    match tokio::time::timeout(shared.config.rpc_timeout, conn.acquire_slot(request)).await {
        Ok(Ok(response)) => {
            let r = response.into_inner();
            if r.acquired {
                SlotAnswer::Acquired { slot_id: r.slot_id }
            } else {
                SlotAnswer::Denied {
                    retry_after: Duration::from_millis(r.retry_after_ms.unwrap_or(1_000).max(1)),
                }
            }
        }
        Ok(Err(status)) => {
            shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
            if connection_lost(status.code()) {
                shared.connected.store(false, Ordering::Relaxed);
            }
            SlotAnswer::Unreachable
        }
        Err(_) => {
            shared.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
            SlotAnswer::Unreachable
        }
    }
}
