//! The daemon's Prometheus metrics: names, help texts and the process-wide recorder.

use std::sync::Mutex;

use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::error::{Error, Result};

pub const IS_LEADER: &str = "allot_coordinator_is_leader";
pub const TERM: &str = "allot_coordinator_term";
pub const SYNC_UPS: &str = "allot_coordinator_sync_ups_total";
pub const SYNC_UPS_DROPPED: &str = "allot_coordinator_sync_ups_dropped_total";
pub const NOT_LEADER_ANSWERS: &str = "allot_coordinator_not_leader_answers_total";
pub const REFUSED_SYNC_UPS: &str = "allot_coordinator_refused_sync_ups_total";
pub const REMOVED_REGION_SYNC_UPS: &str = "allot_coordinator_removed_region_sync_ups_total";
pub const REGION_CHANGES: &str = "allot_coordinator_region_changes_total";
pub const OTHER_VERSION_SYNC_UPS: &str = "allot_coordinator_other_version_sync_ups_total";
pub const ROUNDS: &str = "allot_coordinator_rounds_total";
pub const ROUND_COMMANDS: &str = "allot_coordinator_round_commands_total";
pub const REJECTED_COMMANDS: &str = "allot_coordinator_rejected_commands_total";
pub const COMMIT_SECONDS: &str = "allot_coordinator_commit_seconds";
pub const REBUILDS: &str = "allot_coordinator_rebalancer_rebuilds_total";
pub const CONFIG_SENT: &str = "allot_coordinator_config_sent_total";
pub const CONFIG_PUTS: &str = "allot_coordinator_config_puts_total";
pub const NODE_CLOCK_OFFSET: &str = "allot_coordinator_node_clock_offset_seconds";
pub const NODE_CLOCK_ROUND_TRIP: &str = "allot_coordinator_node_clock_round_trip_seconds";
pub const CLOCK_PROBE_FAILURES: &str = "allot_coordinator_clock_probe_failures_total";
pub const CLOCK_FRAMES: &str = "allot_coordinator_clock_frames_total";
pub const BOOTS_RECORDED: &str = "allot_coordinator_boots_recorded_total";
pub const CLUSTER_CLOCK_OFFSET: &str = "allot_coordinator_cluster_clock_offset_seconds";
pub const REFUSED_PEERS: &str = "allot_coordinator_refused_peers_total";
pub const SHED: &str = "allot_coordinator_shed_total";
pub const MALFORMED_SYNC_UPS: &str = "allot_coordinator_malformed_sync_ups_total";

/// Installs the process-wide Prometheus recorder (once; later calls, from any thread, get the
/// same handle).
pub fn install() -> Result<PrometheusHandle> {
    static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    // Held only to install once; a panic inside cannot leave a half-installed recorder.
    let mut slot = HANDLE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::Config(format!("metrics recorder: {e}")))?;
    describe();
    *slot = Some(handle.clone());
    Ok(handle)
}

fn describe() {
    describe_gauge!(
        IS_LEADER,
        "1 while this node leads and runs the rebalancer."
    );
    describe_gauge!(TERM, "This node's raft term.");
    describe_counter!(
        MALFORMED_SYNC_UPS,
        "Sync streams ended because a message did not decode as a SyncUp (INVALID_ARGUMENT)."
    );
    describe_counter!(
        SHED,
        "Calls refused at once past a fixed cap, by what: sync_stream (streams open at once, MAX_SYNC_STREAMS), sync_stream_region (streams of one region's certificate, MAX_SYNC_STREAMS_PER_REGION), admin_http (admin HTTP requests at once, MAX_ADMIN_CALLS_IN_FLIGHT), raft_call (raft calls in flight on this node, MAX_RAFT_CALLS_IN_FLIGHT), raft_call_node (raft calls of one node's certificate, MAX_RAFT_CALLS_PER_NODE)."
    );
    describe_counter!(
        REFUSED_PEERS,
        "Calls refused because the caller's certificate does not name a peer allowed to make them (D58), by kind: not_a_region, other_region, not_a_member, unnamed; and admin changes without the admin token (D60): admin_token."
    );
    describe_gauge!(
        NODE_CLOCK_OFFSET,
        "On the leader: each other node's clock minus cluster time, by node, from its latest clock probe (a new leader takes its cluster time from it, D47)."
    );
    describe_gauge!(
        CLUSTER_CLOCK_OFFSET,
        "On the leader: cluster time minus this node's clock (D47); far from 0, this node's clock differs from the first leader's."
    );
    describe_gauge!(
        NODE_CLOCK_ROUND_TRIP,
        "On the leader: the round trip of each node's latest clock probe, by node (twice the sample's error)."
    );
    describe_counter!(
        CLOCK_PROBE_FAILURES,
        "Clock probes of another node that failed or took longer than 500 ms."
    );
    describe_counter!(
        CLOCK_FRAMES,
        "Clock frames (the regions' samples and the nodes' clocks) the leader committed, by result (recorded, refused)."
    );
    describe_counter!(
        BOOTS_RECORDED,
        "Regions' boots the leader committed before answering a SyncUp that changed them (a restart, a restored boot answered, a region first heard), by result (recorded, refused)."
    );
    describe_counter!(SYNC_UPS, "SyncUps received from agents.");
    describe_counter!(
        SYNC_UPS_DROPPED,
        "SyncUps left unanswered because the leader's queue was full or its rebalancer was starting (the agent's next SyncUp carries everything again)."
    );
    describe_counter!(
        NOT_LEADER_ANSWERS,
        "SyncUps answered with the leader's address (this node does not lead)."
    );
    describe_counter!(
        REFUSED_SYNC_UPS,
        "SyncUps refused (a region the table does not know); the stream ends."
    );
    describe_counter!(
        REMOVED_REGION_SYNC_UPS,
        "SyncUps refused because their region was removed (allot cluster remove-region); the stream ends, nothing of them is taken."
    );
    describe_counter!(
        REGION_CHANGES,
        "Region removals and add-backs by the admin API, by action (remove, add) and result (committed, refused, not_leader, failed)."
    );
    describe_counter!(
        ROUNDS,
        "Rebalancing rounds committed through raft (one entry each)."
    );
    describe_counter!(ROUND_COMMANDS, "Table commands committed in rounds.");
    describe_counter!(
        REJECTED_COMMANDS,
        "Table commands the table refused when committed (a stale proposal): nothing changed."
    );
    describe_histogram!(COMMIT_SECONDS, "Time to commit one round through raft.");
    describe_counter!(
        CONFIG_SENT,
        "Answers that carried the limits configuration's files to a region on another version."
    );
    describe_counter!(
        CONFIG_PUTS,
        "Configuration puts by the admin API, by result (committed, refused, not_leader, failed)."
    );
    describe_counter!(
        REBUILDS,
        "Times the leader's rebalancer was rebuilt from the committed state within one term (its table disagreed with the replicated one)."
    );
}
