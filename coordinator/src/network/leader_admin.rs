//! Where the leader's admin HTTP is, as the other nodes learn it: the leader's clock probes
//! carry its id and admin address (`ClockProbe`), and a follower's `/v1/status` names that
//! address while the node that sent it leads, so that the dashboard opened on any node reads
//! the leader's figures.

use std::sync::Mutex;

use crate::types::NodeId;

/// What a leader's probes say of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFrom {
    pub node: NodeId,
    pub admin_http: String,
}

/// The last leader's address a probe named.
#[derive(Debug, Default)]
pub struct LeaderAdmin(Mutex<Option<ProbeFrom>>);

impl LeaderAdmin {
    pub fn record(&self, from: ProbeFrom) {
        *self.lock() = Some(from);
    }

    /// The admin address `leader` named in its last probe; none when another node probed
    /// last (a leader before it, or after it).
    pub fn of(&self, leader: NodeId) -> Option<String> {
        self.lock()
            .as_ref()
            .filter(|f| f.node == leader)
            .map(|f| f.admin_http.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ProbeFrom>> {
        // One whole value is replaced at a time: a poisoned one is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
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
}
