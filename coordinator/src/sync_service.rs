//! The sync stream's server side (`allot.sync.v1.Sync`): one task per agent stream reads its
//! SyncUps, hands each to a [`SyncHandler`] with the time it arrived, and writes the answer.
//!
//! The handler is the daemon's business (a raft leader, a follower that redirects, a test
//! double); this file knows only the wire. [`MemoryCoordinator`] is the simplest real handler:
//! one node, no raft, `allot_core::rebalance::Coordinator` driven as its driver contract asks,
//! every proposal committed at once to its own table. It serves tests and single-node trials.
//!
//! A stream ends, with a status the agent logs, when a SyncUp does not convert (the field is
//! named), when the handler refuses one (unknown region), or when the agent sends nothing for
//! [`STREAM_IDLE_TIMEOUT`]. None of that touches the table.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_core::ids::RegionId;
use allot_core::limit::LimitSpec;
use allot_core::rebalance::{AllowanceTable, Coordinator, CoordinatorConfig, TableCommand};
use allot_core::sync::{SyncDown, SyncUp};
use allot_core::time::Timestamp;
use allot_proto::sync::v1 as pb;
use allot_proto::sync::v1::sync_server::{Sync, SyncServer};
use allot_proto::sync_convert::{MAX_SYNC_MESSAGE_BYTES, sync_down_to_wire, sync_up_from_wire};
use allot_proto::tls::{self, Peer};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::daemon::metrics::{MALFORMED_SYNC_UPS, REFUSED_PEERS, SHED};
use crate::places::Places;
use crate::types::NodeId;

/// Answers buffered per stream; past it the stream's task waits for the agent to read (only
/// that agent's stream waits).
pub const ANSWER_QUEUE: usize = 4;

/// Sync streams open at once: an agent keeps one, and a few more while it reconnects. One
/// more is refused at once (`RESOURCE_EXHAUSTED`, counted), so that streams opened and left
/// idle cannot pile up tasks until their idle timeout.
pub const MAX_SYNC_STREAMS: usize = 4 * crate::state::MAX_REGIONS;

/// Sync streams one region's certificate may hold open at once: one, and a few while it
/// reconnects. So the holder of one region's key cannot take the places of the others.
pub const MAX_SYNC_STREAMS_PER_REGION: usize = 8;

/// A stream on which the agent sends nothing for this long is closed: an agent syncs every
/// sync interval, so this is a dead or stuck peer holding a task.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a handler does with one SyncUp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The leader's answer for the region.
    Down(SyncDown),
    /// This node does not lead; where the agent goes next when this node knows.
    NotLeader(Option<LeaderHint>),
    /// The SyncUp is refused (unknown region...): the stream ends with this message.
    Refused(String),
    /// No answer to this SyncUp (the leader is busy or just starting): the stream goes on.
    /// SyncUps are cumulative, so the agent's next one carries everything again.
    Unanswered,
}

/// Where a node that does not lead sends an agent: a node's raft id and its address as the
/// membership gives it (the leader's, or a member's that knows the leader). The id lets an
/// agent that reaches that node through an address of its own go there instead (D35).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderHint {
    pub node_id: NodeId,
    pub address: String,
}

/// Takes a SyncUp with the time it was received, gives the answer for its region.
pub trait SyncHandler: Send + std::marker::Sync + 'static {
    fn handle(&self, received_at: Timestamp, up: SyncUp) -> impl Future<Output = Answer> + Send;
}

/// The tonic service over a handler.
pub struct SyncService<H> {
    handler: Arc<H>,
    /// One per open stream, up to [`MAX_SYNC_STREAMS`].
    streams: Arc<Semaphore>,
    /// Streams open per region its certificate names (mutual TLS only).
    regions: Arc<RegionPlaces>,
}

/// Streams open per region, up to [`MAX_SYNC_STREAMS_PER_REGION`] each.
pub type RegionPlaces = Places<RegionId>;

impl<H: SyncHandler> SyncService<H> {
    pub fn new(handler: Arc<H>) -> Self {
        SyncService {
            handler,
            streams: Arc::new(Semaphore::new(MAX_SYNC_STREAMS)),
            regions: Arc::new(Places::new(MAX_SYNC_STREAMS_PER_REGION)),
        }
    }

    /// The service, ready for `Server::add_service`, decoding at most
    /// [`MAX_SYNC_MESSAGE_BYTES`] per message.
    pub fn into_server(self) -> SyncServer<Self> {
        SyncServer::new(self)
            .max_decoding_message_size(MAX_SYNC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_SYNC_MESSAGE_BYTES)
    }
}

type AnswerResult = Result<pb::SyncAnswer, Status>;

#[tonic::async_trait]
impl<H: SyncHandler> Sync for SyncService<H> {
    type StreamStream = ReceiverStream<AnswerResult>;

    async fn stream(
        &self,
        request: Request<Streaming<pb::SyncUp>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let caller = match tls::peer_of(&request) {
            Ok(None) => None,
            Ok(Some(Peer::Region(region))) => Some(RegionId::from(region.as_str())),
            Ok(Some(other)) => {
                metrics::counter!(REFUSED_PEERS, "kind" => "not_a_region").increment(1);
                return Err(Status::permission_denied(format!(
                    "a sync stream is a region's; the certificate names {other}"
                )));
            }
            Err(e) => {
                metrics::counter!(REFUSED_PEERS, "kind" => "unnamed").increment(1);
                return Err(Status::permission_denied(e.to_string()));
            }
        };
        let place = match &caller {
            Some(region) => match self.regions.take(region) {
                Some(place) => Some(place),
                None => {
                    metrics::counter!(SHED, "what" => "sync_stream_region").increment(1);
                    return Err(Status::resource_exhausted(format!(
                        "region {region} has {MAX_SYNC_STREAMS_PER_REGION} sync streams open on \
                         this node: try again shortly"
                    )));
                }
            },
            None => None,
        };
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            metrics::counter!(SHED, "what" => "sync_stream").increment(1);
            return Err(Status::resource_exhausted(format!(
                "this coordinator node has {MAX_SYNC_STREAMS} sync streams open: try again shortly"
            )));
        };
        let (tx, rx) = mpsc::channel(ANSWER_QUEUE);
        let handler = self.handler.clone();
        tokio::spawn(async move {
            serve_stream(handler, caller, request.into_inner(), tx).await;
            drop((permit, place));
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One agent's stream, until either side ends it.
/// `caller`: the region the stream's certificate names (none on plaintext); a SyncUp for any
/// other region ends the stream.
async fn serve_stream<H: SyncHandler>(
    handler: Arc<H>,
    caller: Option<RegionId>,
    mut inbound: Streaming<pb::SyncUp>,
    tx: mpsc::Sender<AnswerResult>,
) {
    loop {
        let next = tokio::time::timeout(STREAM_IDLE_TIMEOUT, inbound.message()).await;
        let wire = match next {
            Ok(Ok(Some(up))) => up,
            Ok(Ok(None)) => return,
            Ok(Err(status)) => {
                tracing::debug!(%status, "sync stream broken");
                // A message that did not decode (or was too large) is the agent's bad input,
                // answered as such; a broken connection takes no answer.
                let _ = tx.send(Err(undecodable_is_invalid_argument(status))).await;
                return;
            }
            Err(_) => {
                let msg = format!("no SyncUp for {STREAM_IDLE_TIMEOUT:?}");
                let _ = tx.send(Err(Status::deadline_exceeded(msg))).await;
                return;
            }
        };
        let received_at = system_now();
        let up = match sync_up_from_wire(wire) {
            Ok(up) => up,
            Err(e) => {
                tracing::warn!(error = %e, "malformed SyncUp: closing the stream");
                let _ = tx
                    .send(Err(Status::invalid_argument(format!("SyncUp: {e}"))))
                    .await;
                return;
            }
        };
        if let Some(caller) = &caller
            && *caller != up.region
        {
            metrics::counter!(REFUSED_PEERS, "kind" => "other_region").increment(1);
            tracing::warn!(%caller, claimed = %up.region, "a SyncUp for another region: closing the stream");
            let msg = format!(
                "the certificate names region {caller}; a SyncUp for region {} is refused",
                up.region
            );
            let _ = tx.send(Err(Status::permission_denied(msg))).await;
            return;
        }
        let answer = match handler.handle(received_at, up).await {
            Answer::Down(down) => Ok(pb::SyncAnswer {
                answer: Some(pb::sync_answer::Answer::SyncDown(sync_down_to_wire(down))),
            }),
            Answer::NotLeader(leader) => Ok(pb::SyncAnswer {
                answer: Some(pb::sync_answer::Answer::NotLeader(match leader {
                    Some(l) => pb::NotLeader {
                        leader_address: l.address,
                        leader_node_id: Some(l.node_id),
                    },
                    None => pb::NotLeader::default(),
                })),
            }),
            Answer::Refused(msg) => Err(Status::failed_precondition(msg)),
            Answer::Unanswered => continue,
        };
        let last = answer.is_err();
        if tx.send(answer).await.is_err() || last {
            return;
        }
    }
}

/// tonic's status for an inbound message it could not decode says `INTERNAL`, which reads as
/// the coordinator failing: it is the caller's bad input, answered `INVALID_ARGUMENT` and
/// counted. Any other status (too large: `OUT_OF_RANGE`) goes back as it is.
fn undecodable_is_invalid_argument(status: Status) -> Status {
    if status.code() != tonic::Code::Internal || !status.message().starts_with("failed to decode") {
        return status;
    }
    metrics::counter!(MALFORMED_SYNC_UPS).increment(1);
    Status::invalid_argument(format!("SyncUp: {}", status.message()))
}

/// This node's wall clock, as the core's `now`.
pub fn system_now() -> Timestamp {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    Timestamp::from_unix_nanos(nanos)
}

/// The cluster's timebase as a leader reads it (D47 in docs/decisions.md): its wall clock plus
/// the offset that makes it read what the earlier leader's did, so that the regions, whose
/// windows follow the leader's clock (D22), see no step when the lead moves between nodes
/// whose clocks differ. The first leader's offset is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterClock {
    /// Cluster time minus this node's wall clock.
    offset_nanos: i64,
}

impl ClusterClock {
    pub fn with_offset(offset_nanos: i64) -> ClusterClock {
        ClusterClock { offset_nanos }
    }

    pub fn offset_nanos(&self) -> i64 {
        self.offset_nanos
    }

    pub fn now(&self) -> Timestamp {
        self.from_system(system_now())
    }

    /// A reading of this node's wall clock (`system_now`) as cluster time.
    pub fn from_system(&self, at: Timestamp) -> Timestamp {
        let nanos = i128::from(at.as_unix_nanos()) + i128::from(self.offset_nanos);
        Timestamp::from_unix_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX))
    }
}

/// Answers every SyncUp by naming another node as the leader: a follower, as the agent sees it.
#[derive(Clone, Debug)]
pub struct RedirectTo(pub Option<LeaderHint>);

impl SyncHandler for RedirectTo {
    async fn handle(&self, _received_at: Timestamp, _up: SyncUp) -> Answer {
        Answer::NotLeader(self.0.clone())
    }
}

/// One node, no raft: the rebalancer and its table in memory, proposals committed as they
/// are polled. Loses everything when dropped, and says so by its name.
pub struct MemoryCoordinator {
    coordinator: Mutex<Coordinator>,
    /// Table commands the table refused (a stale proposal): expected now and then, counted.
    rejected: Mutex<u64>,
}

impl MemoryCoordinator {
    /// A leader of term `leader_term` over a table holding configuration `config_version`
    /// (which agents must run too: grants of another version are ignored by them).
    pub fn new(
        cfg: CoordinatorConfig,
        config_version: u64,
        limits: Vec<LimitSpec>,
        regions: Vec<RegionId>,
        leader_term: u64,
    ) -> Result<Self, String> {
        let mut table = AllowanceTable::new();
        let outcome = table.apply(TableCommand::SetConfig {
            version: config_version,
            limits,
            regions,
        });
        if !outcome.is_applied() {
            return Err(format!("the configuration is refused: {outcome:?}"));
        }
        let coordinator = Coordinator::new(cfg, table, system_now(), leader_term);
        Ok(MemoryCoordinator {
            coordinator: Mutex::new(coordinator),
            rejected: Mutex::new(0),
        })
    }

    /// Reads the rebalancer's state (its table, its views).
    pub fn with<T>(&self, f: impl FnOnce(&Coordinator) -> T) -> T {
        f(&self.lock())
    }

    /// Table commands refused so far.
    pub fn rejected_commands(&self) -> u64 {
        *self.rejected.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Coordinator> {
        // The machine is left consistent between calls; a panic elsewhere cannot half-set it.
        self.coordinator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The driver contract: record the SyncUp, commit every proposal, then answer from the
    /// committed table.
    fn answer(&self, now: Timestamp, up: SyncUp) -> Answer {
        let region = up.region.clone();
        let seq = up.seq;
        let mut c = self.lock();
        if let Err(e) = c.handle_sync_up(now, up) {
            return Answer::Refused(e.to_string());
        }
        let mut rejected = 0;
        for cmd in c.poll_proposals(now) {
            if !c.handle_committed(now, &cmd).is_applied() {
                rejected += 1;
            }
        }
        let down = c.poll_sync_down(now, &region, seq);
        drop(c);
        if rejected > 0 {
            *self.rejected.lock().unwrap_or_else(|p| p.into_inner()) += rejected;
        }
        match down {
            Ok(down) => Answer::Down(down),
            Err(e) => Answer::Refused(e.to_string()),
        }
    }
}

impl SyncHandler for MemoryCoordinator {
    async fn handle(&self, received_at: Timestamp, up: SyncUp) -> Answer {
        self.answer(received_at, up)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use allot_core::ids::{KeyId, LimitId};
    use allot_core::limit::RegionWeights;
    use allot_core::sync::{CounterEntry, CounterRef, DemandReport};
    use allot_core::time::Window;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// 1000 an hour, 30% each for `a` and `b`: 400 free for a grow.
    fn coordinator() -> MemoryCoordinator {
        let mut spec = LimitSpec::simple("api/t", 1000, HOUR);
        let ppm: BTreeMap<RegionId, u32> = [("a", 300_000), ("b", 300_000)]
            .into_iter()
            .map(|(r, w)| (RegionId::from(r), w))
            .collect();
        spec.weights = RegionWeights::new(ppm).expect("weights");
        let regions = vec![RegionId::from("a"), RegionId::from("b")];
        MemoryCoordinator::new(CoordinatorConfig::default(), 1, vec![spec], regions, 1)
            .expect("configuration")
    }

    fn up(region: &str, now: Timestamp) -> SyncUp {
        let counter = CounterRef {
            limit: LimitId::from("api/t"),
            key: KeyId::from("t=1"),
            window: Window::new(HOUR).index(now),
        };
        SyncUp {
            region: RegionId::from(region),
            boot: 1,
            seq: 7,
            sent_at: now,
            config_version: 1,
            entries: vec![CounterEntry {
                counter: counter.clone(),
                region: RegionId::from(region),
                granted_units: 300,
                refunded_units: 0,
            }],
            demand: vec![DemandReport {
                counter,
                demand_micro_units_per_sec: 10_000_000,
                allowance_units: 300,
            }],
            release_acks: Vec::new(),
            clock: None,
            clock_leader_term: 0,
            stats: Vec::new(),
            view_expired: false,
            restored: false,
            clock_guard: None,
        }
    }

    #[test]
    fn a_grow_is_committed_before_the_answer_that_carries_it() {
        let c = coordinator();
        let now = system_now();
        let Answer::Down(down) = c.answer(now, up("a", now)) else {
            panic!("answered");
        };
        assert_eq!(down.reply_to_seq, 7);
        let grant = down.grants.first().expect("a grant in the same answer");
        assert!(grant.allowance_units > 300, "{grant:?}");
        let in_table = c.with(|co| co.table().allowance(&grant.counter, &grant.region));
        assert_eq!(in_table, grant.allowance_units);
        assert_eq!(c.rejected_commands(), 0);
    }

    #[test]
    fn an_unknown_region_is_refused_and_changes_nothing() {
        let c = coordinator();
        let now = system_now();
        let answer = c.answer(now, up("mars", now));
        assert_eq!(
            answer,
            Answer::Refused("invalid request: sync from unknown region mars".to_owned())
        );
        assert_eq!(c.with(|co| co.table().row_count()), 0);
    }
}
