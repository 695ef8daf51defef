//! The leader's probes of the other nodes' clocks (D43 in docs/decisions.md): NTP's estimate
//! over `allot.raft.v1.RaftService/Clock`, so that a later leader can carry the regions' clock
//! samples, measured against this leader's clock, over to its own.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::sync::ClockSample;
use allot_core::time::Timestamp;
use allot_proto::raft::v1::ClockProbe;
use allot_proto::raft::v1::raft_service_client::RaftServiceClient;
use allot_proto::tls::Dialer;
use tonic::transport::Channel;

use crate::network::client::CONNECT_TIMEOUT;
use crate::network::leader_admin::ProbeFrom;
use crate::sync_service::ClusterClock;
use crate::types::NodeId;

/// Longest a probe may take: a slower answer is no sample (its error would be as large).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Channels to the nodes probed, kept between probes.
pub struct ClockProber {
    cluster: String,
    /// The leader probing, named in each probe; none for a probe that is not a leader's.
    from: Option<ProbeFrom>,
    dialer: Dialer,
    channels: BTreeMap<NodeId, (String, RaftServiceClient<Channel>)>,
}

/// One node's answer to a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probed {
    /// Its wall clock against the prober's `clock`, with the round trip.
    pub sample: ClockSample,
    /// When the answer came back, on the prober's `clock`.
    pub taken_at: Timestamp,
    /// Its admin HTTP address, as it named it (empty: not named).
    pub admin_http: String,
}

impl ClockProber {
    pub fn new(cluster: impl Into<String>, from: Option<ProbeFrom>, dialer: Dialer) -> ClockProber {
        ClockProber {
            cluster: cluster.into(),
            from,
            dialer,
            channels: BTreeMap::new(),
        }
    }

    /// Samples the clock of the node at `addr`: its wall clock minus our `clock`, with the
    /// round trip, and when the probe came back (on `clock`). A node that does not answer in
    /// time gives none.
    pub async fn probe(
        &mut self,
        node: NodeId,
        addr: &str,
        clock: ClusterClock,
    ) -> Result<Probed, String> {
        let mut client = self.client(node, addr).await?;
        let probe = ClockProbe {
            cluster: self.cluster.clone(),
            leader_node: self.from.as_ref().map_or(0, |f| f.node),
            leader_admin_http: self
                .from
                .as_ref()
                .map(|f| f.admin_http.clone())
                .unwrap_or_default(),
        };
        let t0 = clock.now();
        let answered = tokio::time::timeout(PROBE_TIMEOUT, client.clock(probe)).await;
        let t3 = clock.now();
        let reading = match answered {
            Ok(Ok(reading)) => reading.into_inner(),
            Ok(Err(status)) => {
                self.channels.remove(&node);
                return Err(status.message().to_owned());
            }
            Err(_) => return Err(format!("no answer in {PROBE_TIMEOUT:?}")),
        };
        let t1 = Timestamp::from_unix_nanos(reading.received_at_unix_nanos);
        let t2 = Timestamp::from_unix_nanos(reading.sent_at_unix_nanos);
        Ok(Probed {
            sample: ClockSample::from_round_trip(t0, t1, t2, t3),
            taken_at: t3,
            admin_http: reading.admin_http,
        })
    }

    async fn client(
        &mut self,
        node: NodeId,
        addr: &str,
    ) -> Result<RaftServiceClient<Channel>, String> {
        if let Some((known, client)) = self.channels.get(&node)
            && known == addr
        {
            return Ok(client.clone());
        }
        let endpoint = self
            .dialer
            .endpoint(addr)
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        let client = RaftServiceClient::new(channel);
        self.channels
            .insert(node, (addr.to_owned(), client.clone()));
        Ok(client)
    }
}
