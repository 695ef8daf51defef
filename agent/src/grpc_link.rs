//! The real [`SyncLink`]: one `allot.sync.v1.Sync` stream to the coordinator cluster's leader.
//!
//! The timer task never waits on the network. `send` puts the SyncUp in a small queue and
//! returns; a background task owns the connection: it connects to one of the configured
//! addresses (or to the leader a follower named: through this agent's own address for that
//! node when `--coordinator` gives one, [`crate::coordinators`]), writes queued SyncUps, reads
//! answers and
//! hands SyncDowns to `recv`. When the stream fails it reconnects after a capped exponential
//! backoff with full jitter, cycling through the addresses. Meanwhile the budget machine's
//! view ages as it would with no answers at all: once it expires, each limit's partition
//! policy applies, and the first answer after reconnecting makes it fresh again.
//!
//! Why a full queue may drop its oldest SyncUp: a SyncUp is cumulative. The machine
//! (`core/src/budget/sync.rs`, `poll_transmit`) puts in every SyncUp the counter entries,
//! release acks and bound figures the coordinator has not yet confirmed, as absolute values,
//! and the current demand; it confirms them only from an answer to the SyncUp that carried
//! them. A SyncUp never sent is never answered, so what it carried stays unconfirmed and goes
//! out again in a later one. Dropping it costs a round, never an update.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_core::sync::{SyncDown, SyncUp};
use allot_proto::sync::v1 as pb;
use allot_proto::sync::v1::sync_client::SyncClient;
use allot_proto::sync_convert::{
    LEADER_ID_METADATA_KEY, LEADER_METADATA_KEY, MAX_SYNC_MESSAGE_BYTES, sync_down_from_wire,
    sync_up_to_wire,
};
use allot_proto::tls::Dialer;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::coordinators::{Coordinators, LeaderHint};
use crate::error::Result;
use crate::metrics;
use crate::sync_link::SyncLink;

/// SyncUps waiting for the connection; when full, the oldest is dropped for the newest.
pub const SYNC_UP_QUEUE: usize = 4;
/// SyncUps handed to the stream and not yet written to the socket.
pub const STREAM_SEND_BUFFER: usize = 2;
/// SyncDowns received and not yet applied by the timer task.
pub const SYNC_DOWN_QUEUE: usize = 16;
/// First reconnect delay (before jitter); doubled per failed attempt.
pub const RECONNECT_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest reconnect delay (before jitter). A leader's loss is an election of 1-2 s (4 s on a
/// loaded 2-core machine), through which every attempt fails and the delay grows: capped at a
/// second, an agent hears the new leader at most a second after its election, so that its
/// rebalancing resumes within 3 s of it. (At 5 s, a new leader's first round came 3.5 s after
/// its election: one agent was still waiting.) An attempt a second per agent costs a cluster
/// that is down nothing.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Longest a connection attempt (TCP, HTTP/2 handshake, the stream's opening) waits.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// An open stream with no answer for this long is given up and reconnected: the leader is
/// gone or stuck (the agent sends a SyncUp every sync interval, so answers are due).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Redirects followed in a row without waiting; past it the backoff applies, so that nodes
/// naming each other cannot make the agent spin.
pub const MAX_REDIRECT_HOPS: u32 = 3;
/// How often the last-answer-age gauge is refreshed.
pub const STATUS_REFRESH: Duration = Duration::from_millis(250);

/// The link's state, for metrics and the admin API.
#[derive(Debug, Default)]
pub struct LinkStatus {
    state: Mutex<LinkState>,
}

#[derive(Clone, Debug, Default)]
struct LinkState {
    connected: bool,
    /// The node the link talks to or tries next.
    address: Option<String>,
    /// The node that last answered as leader.
    leader: Option<String>,
    last_answer: Option<Instant>,
    reconnects: u64,
    dropped_sync_ups: u64,
    bad_answers: u64,
    last_error: Option<String>,
}

/// A snapshot of [`LinkStatus`], as `/v1/status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkSnapshot {
    pub connected: bool,
    pub address: Option<String>,
    pub leader: Option<String>,
    /// Seconds since the last SyncDown; `None` before the first.
    pub last_answer_age_secs: Option<f64>,
    pub reconnects: u64,
    pub dropped_sync_ups: u64,
    pub bad_answers: u64,
    pub last_error: Option<String>,
}

impl LinkStatus {
    pub fn snapshot(&self) -> LinkSnapshot {
        let s = self.lock().clone();
        LinkSnapshot {
            connected: s.connected,
            address: s.address,
            leader: s.leader,
            last_answer_age_secs: s.last_answer.map(|t| t.elapsed().as_secs_f64()),
            reconnects: s.reconnects,
            dropped_sync_ups: s.dropped_sync_ups,
            bad_answers: s.bad_answers,
            last_error: s.last_error,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn trying(&self, address: &str) {
        let old = self.lock().address.replace(address.to_owned());
        metrics::sync_link_node(metrics::SYNC_COORDINATOR, old.as_deref(), address);
    }

    fn answered(&self, address: &str) {
        let mut s = self.lock();
        s.last_answer = Some(Instant::now());
        if !s.connected || s.leader.as_deref() != Some(address) {
            s.connected = true;
            let old = s.leader.replace(address.to_owned());
            s.last_error = None;
            metrics::sync_link_node(metrics::SYNC_LEADER, old.as_deref(), address);
        }
        metrics::sync_link_connected(true);
        metrics::sync_link_age(0.0);
    }

    fn ended(&self, why: &str) {
        let mut s = self.lock();
        s.connected = false;
        s.reconnects += 1;
        s.last_error = Some(why.to_owned());
        metrics::sync_link_connected(false);
        metrics::sync_reconnect();
    }

    fn dropped_sync_up(&self) {
        self.lock().dropped_sync_ups += 1;
        metrics::sync_up_dropped();
    }

    fn bad_answer(&self) {
        self.lock().bad_answers += 1;
        metrics::sync_bad_answer();
    }

    fn refresh_age(&self) {
        let age = self.lock().last_answer.map(|t| t.elapsed().as_secs_f64());
        metrics::sync_link_age(age.unwrap_or(f64::INFINITY));
    }
}

/// SyncUps waiting for the connection, newest kept.
#[derive(Debug, Default)]
struct Outbox {
    queue: Mutex<VecDeque<SyncUp>>,
    ready: Notify,
}

impl Outbox {
    /// Queues `up`; returns true when an older one was dropped to make room.
    fn push(&self, up: SyncUp) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let dropped = q.len() >= SYNC_UP_QUEUE;
        if dropped {
            q.pop_front();
        }
        q.push_back(up);
        drop(q);
        self.ready.notify_one();
        dropped
    }

    async fn pop(&self) -> SyncUp {
        loop {
            let next = self
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            if let Some(up) = next {
                return up;
            }
            self.ready.notified().await;
        }
    }
}

/// The link the timer task owns; the connection task stops when it is dropped.
pub struct GrpcSyncLink {
    outbox: Arc<Outbox>,
    inbox: mpsc::Receiver<SyncDown>,
    status: Arc<LinkStatus>,
    task: JoinHandle<()>,
}

impl GrpcSyncLink {
    /// Starts the connection task over `coordinators` (at least one); its state is published
    /// in `status`.
    /// `dialer`: plaintext, or TLS with this region's certificate.
    pub fn start(
        coordinators: Coordinators,
        status: Arc<LinkStatus>,
        seed: u64,
        dialer: Dialer,
    ) -> Self {
        metrics::sync_link_connected(false);
        metrics::sync_link_age(f64::INFINITY);
        let outbox = Arc::new(Outbox::default());
        let (tx, inbox) = mpsc::channel(SYNC_DOWN_QUEUE);
        let conn = Connection {
            coordinators,
            outbox: outbox.clone(),
            inbox: tx,
            status: status.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            dialer,
        };
        let task = tokio::spawn(conn.run());
        GrpcSyncLink {
            outbox,
            inbox,
            status,
            task,
        }
    }

    pub fn status(&self) -> &Arc<LinkStatus> {
        &self.status
    }
}

impl Drop for GrpcSyncLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SyncLink for GrpcSyncLink {
    /// Never waits: queues the SyncUp (dropping the oldest queued one when full).
    async fn send(&mut self, up: SyncUp) -> Result<()> {
        if self.outbox.push(up) {
            self.status.dropped_sync_up();
        }
        Ok(())
    }

    async fn recv(&mut self) -> Option<SyncDown> {
        match self.inbox.recv().await {
            Some(down) => Some(down),
            // The connection task is gone (aborted): nothing will come.
            None => std::future::pending().await,
        }
    }
}

/// How a session with one node ended.
enum Ended {
    /// The node does not lead; it named the leader, or knows none.
    Redirect(Option<LeaderHint>),
    Failed(String),
}

struct Connection {
    coordinators: Coordinators,
    outbox: Arc<Outbox>,
    inbox: mpsc::Sender<SyncDown>,
    status: Arc<LinkStatus>,
    rng: ChaCha8Rng,
    dialer: Dialer,
}

impl Connection {
    async fn run(mut self) {
        let addresses = self.coordinators.addresses().to_vec();
        if addresses.is_empty() {
            tracing::error!("sync link started with no coordinator address: nothing to connect to");
            return;
        }
        let mut next = 0usize;
        let mut hint: Option<String> = None;
        let mut failures = 0u32;
        let mut hops = 0u32;
        loop {
            let address = hint.take().unwrap_or_else(|| {
                let a = addresses[next % addresses.len()].clone();
                next = next.wrapping_add(1);
                a
            });
            self.status.trying(&address);
            let (ended, answered) = self.session(&address).await;
            if answered {
                failures = 0;
                hops = 0;
            }
            let why = match ended {
                Ended::Redirect(Some(leader)) => {
                    let to = self.coordinators.redirect(&leader);
                    tracing::info!(
                        from = %address,
                        named = %leader.address,
                        node = ?leader.node_id,
                        %to,
                        "following the leader"
                    );
                    hint = Some(to);
                    hops += 1;
                    format!("{address} is not the leader")
                }
                Ended::Redirect(None) => format!("{address} is not the leader and knows none"),
                Ended::Failed(e) => e,
            };
            tracing::warn!(coordinator = %address, reason = %why, "sync stream ended");
            self.status.ended(&why);
            if hint.is_some() && hops <= MAX_REDIRECT_HOPS {
                continue;
            }
            hops = 0;
            let delay = backoff(failures, &mut self.rng);
            failures = failures.saturating_add(1);
            self.sleep_refreshing(delay).await;
        }
    }

    async fn sleep_refreshing(&self, delay: Duration) {
        let until = tokio::time::Instant::now() + delay;
        while tokio::time::Instant::now() < until {
            self.status.refresh_age();
            tokio::time::sleep_until(until.min(tokio::time::Instant::now() + STATUS_REFRESH)).await;
        }
    }

    /// One stream with `address`, until it fails or redirects; also says whether it carried
    /// at least one answer.
    async fn session(&self, address: &str) -> (Ended, bool) {
        let (tx, rx) = mpsc::channel(STREAM_SEND_BUFFER);
        let writer = tokio::spawn(write_sync_ups(self.outbox.clone(), tx));
        // A peer that accepts the connection and then says nothing must not hold the link:
        // the handshake and the stream's opening are bounded too, not only the TCP connect.
        let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut client = connect(address, &self.dialer)
                .await
                .map_err(Ended::Failed)?;
            client
                .stream(ReceiverStream::new(rx))
                .await
                .map_err(|status| refused(&status))
        })
        .await;
        let ended = match opened {
            Ok(Ok(response)) => self.read_answers(address, response.into_inner()).await,
            Ok(Err(ended)) => (ended, false),
            Err(_) => {
                let e = format!("{address} did not open the stream within {CONNECT_TIMEOUT:?}");
                (Ended::Failed(e), false)
            }
        };
        writer.abort();
        ended
    }

    async fn read_answers(
        &self,
        address: &str,
        mut inbound: tonic::Streaming<pb::SyncAnswer>,
    ) -> (Ended, bool) {
        let mut answered = false;
        let mut refresh = tokio::time::interval(STATUS_REFRESH);
        let mut deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
        loop {
            let message = tokio::select! {
                m = inbound.message() => m,
                _ = refresh.tick() => {
                    self.status.refresh_age();
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let e = format!("no answer from {address} for {ANSWER_TIMEOUT:?}");
                    return (Ended::Failed(e), answered);
                }
            };
            let answer = match message {
                Ok(Some(a)) => a,
                Ok(None) => {
                    return (
                        Ended::Failed(format!("{address} closed the stream")),
                        answered,
                    );
                }
                Err(status) => return (refused(&status), answered),
            };
            let down = match answer.answer {
                Some(pb::sync_answer::Answer::SyncDown(d)) => d,
                Some(pb::sync_answer::Answer::NotLeader(n)) => {
                    let leader = Some(n.leader_address)
                        .filter(|a| !a.is_empty())
                        .map(|address| LeaderHint {
                            node_id: n.leader_node_id,
                            address,
                        });
                    return (Ended::Redirect(leader), answered);
                }
                None => {
                    self.status.bad_answer();
                    let e = format!("{address} sent an empty answer");
                    return (Ended::Failed(e), answered);
                }
            };
            let down = match sync_down_from_wire(down) {
                Ok(d) => d,
                Err(e) => {
                    self.status.bad_answer();
                    return (
                        Ended::Failed(format!("bad SyncDown from {address}: {e}")),
                        answered,
                    );
                }
            };
            answered = true;
            deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
            self.status.answered(address);
            // Waits only for the timer task to take it: the coordinator's stream waits, never
            // the agent.
            if self.inbox.send(down).await.is_err() {
                return (Ended::Failed("the agent is stopping".to_owned()), answered);
            }
        }
    }
}

/// Moves queued SyncUps to the stream, one at a time: while the network is slow, the queue
/// keeps the newest.
async fn write_sync_ups(outbox: Arc<Outbox>, tx: mpsc::Sender<pb::SyncUp>) {
    loop {
        let up = outbox.pop().await;
        if tx.send(sync_up_to_wire(up)).await.is_err() {
            return;
        }
    }
}

async fn connect(
    address: &str,
    dialer: &Dialer,
) -> std::result::Result<SyncClient<tonic::transport::Channel>, String> {
    let channel = dialer
        .endpoint(address)
        .map_err(|e| format!("bad coordinator address {address}: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    Ok(SyncClient::new(channel)
        .max_decoding_message_size(MAX_SYNC_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_SYNC_MESSAGE_BYTES))
}

/// A status ending the stream; a refusal naming the leader is a redirect.
fn refused(status: &tonic::Status) -> Ended {
    let meta = |key| {
        status
            .metadata()
            .get(key)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
    };
    let leader = meta(LEADER_METADATA_KEY);
    match leader {
        Some(l) => Ended::Redirect(Some(LeaderHint {
            node_id: meta(LEADER_ID_METADATA_KEY).and_then(|id| id.parse().ok()),
            address: l.to_owned(),
        })),
        None => Ended::Failed(format!(
            "stream refused: {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// Full jitter over a capped exponential: uniform in `[0, min(max, base * 2^failures)]`, so
/// agents that lost the same leader do not all come back at the same instant.
pub fn backoff(failures: u32, rng: &mut impl Rng) -> Duration {
    let cap = RECONNECT_BACKOFF_BASE
        .saturating_mul(1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX))
        .min(RECONNECT_BACKOFF_MAX);
    let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use allot_core::ids::RegionId;
    use allot_core::time::Timestamp;

    use super::*;

    fn up(seq: u64) -> SyncUp {
        SyncUp::new(
            RegionId::from("eu"),
            1,
            seq,
            Timestamp::from_unix_nanos(seq),
            1,
        )
    }

    #[test]
    fn a_full_queue_keeps_the_newest_sync_ups() {
        let outbox = Outbox::default();
        let dropped: Vec<bool> = (0..6).map(|s| outbox.push(up(s))).collect();
        assert_eq!(dropped, [false, false, false, false, true, true]);
        let seqs: Vec<u64> = outbox
            .queue
            .lock()
            .expect("lock")
            .iter()
            .map(|u| u.seq)
            .collect();
        assert_eq!(seqs, [2, 3, 4, 5]);
    }

    #[test]
    fn an_agent_that_failed_through_an_election_tries_again_within_a_second() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for failures in [5, 6, 10, u32::MAX] {
            let longest = (0..1_000).map(|_| backoff(failures, &mut rng)).max();
            assert!(longest <= Some(Duration::from_secs(1)), "{longest:?}");
        }
    }

    #[test]
    fn backoff_grows_to_its_cap_and_stays_within_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for failures in [0, 1, 3, 10, 40, u32::MAX] {
            let cap = RECONNECT_BACKOFF_BASE
                .saturating_mul(1 << failures.min(6))
                .min(RECONNECT_BACKOFF_MAX);
            let draws: Vec<Duration> = (0..200).map(|_| backoff(failures, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= cap), "{failures}: {cap:?}");
            // Full jitter: spread over the whole range, not bunched at the cap.
            assert!(draws.iter().any(|d| *d < cap / 4), "{failures}");
            assert!(draws.iter().any(|d| *d > cap / 2), "{failures}");
        }
    }
}
