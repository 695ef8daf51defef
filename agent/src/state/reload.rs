//! Limits in force: a local reload of the agent's files, and the cluster's configuration taken
//! from the sync stream (which then wins over local files).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use allot_core::sync::ConfigFiles;

use super::Agent;
use crate::cluster_config;
use crate::error::Result;
use crate::limits::{self, Limits, Source};
use crate::metrics;

impl Agent {
    /// Reads the limits files again. A configuration that does not load changes nothing: its
    /// every problem is logged and counted.
    pub async fn reload(&self, why: &str) -> bool {
        let current = self.limits();
        if current.source == Source::Cluster {
            // The cluster numbers its versions; a local load would take a number that means
            // other limits there (D25).
            tracing::error!(
                why,
                version = current.version,
                "limits configuration not reloaded: the limits in force are the coordinator \
                 cluster's; change them with `allot config put`"
            );
            metrics::config_reload(false, current.version);
            return false;
        }
        let version = current.version + 1;
        let s = &self.settings;
        let loaded = limits::load(
            &s.config_files,
            s.merge_domains,
            version,
            s.near_limit_ratio,
        );
        let new = match loaded {
            Ok(l) => Arc::new(l),
            Err(problems) => {
                for p in &problems {
                    tracing::error!(problem = %p, "limits configuration not reloaded");
                }
                tracing::error!(
                    errors = problems.len(),
                    why,
                    version = current.version,
                    "keeping the limits configuration in force"
                );
                metrics::config_reload(false, current.version);
                return false;
            }
        };
        if s.is_coordinated() && new.regions() != current.regions() {
            // The machine's default shares were computed over the regions named at start; the
            // coordinator's over its own list. Changing them is a restart of every region.
            tracing::error!(
                why,
                version = current.version,
                "limits configuration not reloaded: it names other regions than the one in \
                 force; the deployment's regions change only with a restart"
            );
            metrics::config_reload(false, current.version);
            return false;
        }
        let rules = new.config.rules().len();
        let res = self.put_in_force(new, version).await;
        tracing::info!(why, version, rules, "limits configuration reloaded");
        if let Err(e) = res {
            tracing::error!(error = %e, "the reloaded state is not yet persisted");
        }
        true
    }

    /// Takes the coordinator cluster's configuration, as a reload takes files (rules that
    /// still exist keep their counters; grants of changed limits go), when it is newer than
    /// the cluster's version in force, or when the agent still runs its own files at another
    /// version: the cluster's wins (D25). Kept in the data directory for the next start.
    pub async fn take_cluster_config(&self, files: ConfigFiles) -> bool {
        let current = self.limits();
        let newer = match current.source {
            Source::Cluster => files.version > current.version,
            Source::Files => files.version != current.version,
        };
        if !newer || self.refused_cluster_version.load(Ordering::Relaxed) == files.version {
            return false;
        }
        let new = match limits::load_cluster(&files, self.settings.near_limit_ratio) {
            Ok(l) => Arc::new(l),
            Err(problems) => {
                for p in &problems {
                    tracing::error!(problem = %p, version = files.version, "the cluster's limits do not load here");
                }
                return self.refuse_cluster_config(files.version, current.version);
            }
        };
        if new.regions() != current.regions() {
            tracing::error!(
                version = files.version,
                "the cluster's limits name other regions than the ones in force; the \
                 deployment's regions change only with a restart"
            );
            return self.refuse_cluster_config(files.version, current.version);
        }
        let version = files.version;
        let rules = new.config.rules().len();
        let res = self.put_in_force(new, version).await;
        tracing::info!(
            version,
            rules,
            "limits configuration taken from the coordinator cluster"
        );
        if let Err(e) = res {
            tracing::error!(error = %e, "the new configuration's state is not yet persisted");
        }
        let dir = self.settings.data_dir.clone();
        let kept = tokio::task::spawn_blocking(move || cluster_config::persist(&dir, &files)).await;
        match kept {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the cluster's limits are not kept for the next start")
            }
            Err(e) => {
                tracing::error!(error = %e, "the cluster's limits are not kept for the next start")
            }
        }
        true
    }

    /// Puts `new` in force as `version`, from files or from the cluster: the machine's limits
    /// (rules that still exist keep their counters), the rules requests read, and the negative
    /// cache, whose denials were the old rules'.
    async fn put_in_force(&self, new: Arc<Limits>, version: u64) -> Result<()> {
        let now = self.now();
        let res = self
            .with_budget(|b| {
                b.set_limits(now, new.specs());
                b.set_config_version(version);
                *self.limits.write().unwrap_or_else(|p| p.into_inner()) = new;
            })
            .await;
        self.negative.invalidate();
        metrics::config_reload(true, version);
        res
    }

    fn refuse_cluster_config(&self, version: u64, in_force: u64) -> bool {
        self.refused_cluster_version
            .store(version, Ordering::Relaxed);
        metrics::config_reload(false, in_force);
        false
    }
}
