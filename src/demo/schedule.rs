//! What the run does at given seconds: the leader's kill and restart, the cut and the heal.

use std::sync::Mutex;

use super::cluster::Cluster;
use super::observe::Observed;
use super::plan::Plan;
use super::reader::lock;

/// What the run does at given seconds: the kill, the restart, the cut and the heal.
pub struct Schedule {
    kill_at: Option<u64>,
    /// A killed leader is started again this long after the kill.
    restart_after_secs: u64,
    /// The leader killed: (node, term, second).
    pub killed: Option<(u64, u64, u64)>,
    restart: Option<(u64, u64)>,
    cut: Option<(u64, u64)>,
    pub cut_now: bool,
}

impl Schedule {
    pub fn new(plan: &Plan) -> Schedule {
        Schedule {
            kill_at: plan.kill_leader_at_secs,
            restart_after_secs: plan.restart_after_secs,
            killed: None,
            restart: None,
            cut: plan.partition.as_ref().map(|p| (p.from_secs, p.to_secs)),
            cut_now: false,
        }
    }

    /// Does what is due at `secs`; returns what it did, for the table's stream.
    pub fn apply(
        &mut self,
        secs: u64,
        cluster: &mut Cluster,
        obs: &Mutex<Observed>,
    ) -> Vec<String> {
        let mut did = Vec::new();
        if self.kill_at.is_some_and(|at| secs >= at) {
            let leader = lock(obs).leader();
            if let Some((node, term)) = leader
                && cluster.kill(node)
            {
                did.push(format!(
                    "{secs}s: SIGKILL coordinator {node}, the leader (term {term})"
                ));
                self.kill_at = None;
                self.killed = Some((node, term, secs));
                self.restart = Some((secs + self.restart_after_secs, node));
            }
        }
        if let Some((at, node)) = self.restart
            && secs >= at
        {
            self.restart = None;
            did.push(match cluster.restart(node) {
                Ok(()) => format!("{secs}s: coordinator {node} started again"),
                Err(e) => format!("{secs}s: coordinator {node} could not start again: {e}"),
            });
        }
        if let Some((from, to)) = self.cut {
            let cut = (from..to).contains(&secs);
            if cut != self.cut_now {
                self.cut_now = cut;
                cluster.set_cut(cut);
                let what = if cut {
                    "cut off from"
                } else {
                    "reconnected to"
                };
                did.push(format!(
                    "{secs}s: the partitioned region {what} the coordinators"
                ));
            }
        }
        did
    }
}
