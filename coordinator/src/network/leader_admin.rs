//! Where the nodes' admin HTTP is, as they learn it from each other's clock probes. The
//! leader's probes carry its id and admin address (`ClockProbe`), and a follower's
//! `/v1/status` names that address while the node that sent it leads, so that the dashboard
//! opened on any node reads the leader's figures. Each answer (`ClockReading`) carries the
//! answering node's own address, so the leader's status lists every node's: a dashboard whose
//! own node dies reads on through another.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::lock;
use crate::types::NodeId;

/// What a leader's probes say of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFrom {
    pub node: NodeId,
    pub admin_http: String,
}

/// The last leader's address a probe named, the other nodes' addresses their answers to this
/// node's probes named, and this node's own.
#[derive(Debug, Default)]
pub struct LeaderAdmin {
    leader: Mutex<Option<ProbeFrom>>,
    nodes: Mutex<BTreeMap<NodeId, String>>,
    own: OnceLock<String>,
}

impl LeaderAdmin {
    pub fn record(&self, from: ProbeFrom) {
        *lock(&self.leader) = Some(from);
    }

    /// The admin address `leader` named in its last probe; none when another node probed
    /// last (a leader before it, or after it).
    pub fn of(&self, leader: NodeId) -> Option<String> {
        lock(&self.leader)
            .as_ref()
            .filter(|f| f.node == leader)
            .map(|f| f.admin_http.clone())
    }

    /// This node's admin address, which its answers to probes name. Set once, when the
    /// admin HTTP is bound.
    pub fn set_own(&self, admin_http: String) {
        let _ = self.own.set(admin_http);
    }

    pub fn own(&self) -> Option<&str> {
        self.own.get().map(String::as_str)
    }

    /// `node` answered this node's probe naming `admin_http`.
    pub fn record_node(&self, node: NodeId, admin_http: String) {
        if !admin_http.is_empty() {
            lock(&self.nodes).insert(node, admin_http);
        }
    }

    /// The admin address `node` last named in an answer to this node's probes.
    pub fn node(&self, node: NodeId) -> Option<String> {
        lock(&self.nodes).get(&node).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_node_that_probed_last_is_named() {
        let known = LeaderAdmin::default();
        assert_eq!(known.of(1), None);
        known.record(ProbeFrom {
            node: 1,
            admin_http: "127.0.0.1:9001".into(),
        });
        assert_eq!(known.of(1).as_deref(), Some("127.0.0.1:9001"));
        assert_eq!(known.of(2), None, "a new leader that has not probed yet");
    }

    #[test]
    fn answers_name_each_node_and_an_empty_one_names_none() {
        let known = LeaderAdmin::default();
        known.record_node(2, "127.0.0.1:9002".into());
        known.record_node(3, String::new());
        assert_eq!(known.node(2).as_deref(), Some("127.0.0.1:9002"));
        assert_eq!(known.node(3), None);
        known.set_own("127.0.0.1:9001".into());
        known.set_own("127.0.0.1:9999".into());
        assert_eq!(known.own(), Some("127.0.0.1:9001"), "set once");
    }
}
