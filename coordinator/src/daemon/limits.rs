//! The limits given at start (`--limits FILE...`): loaded with the core's configuration
//! loader, as the agent loads them, and put through raft as their files at a version when the
//! cluster holds an older one (or none), so that agents on another version receive them.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_core::limit::LimitSpec;
use allot_core::sync::{ConfigFile, ConfigFiles};
use tokio::sync::{oneshot, watch};

use crate::daemon::handler::LeaderSlot;
use crate::daemon::leader::Job;
use crate::state::{ClusterCommand, CommandOutcome};
use crate::store::StateReader;

/// Largest limits file read, as in the agent: real ones are kilobytes.
pub const MAX_LIMITS_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Time between attempts to put the limits while no leader of this node can take them.
const PUT_RETRY: Duration = Duration::from_millis(500);

/// What a node is started with to put: the files (`--limits`), so that agents on another
/// version receive them, or bare limits (tests, and clusters that never send files).
#[derive(Clone, Debug)]
pub enum StartLimits {
    Files(ConfigFiles),
    Specs {
        version: u64,
        limits: Vec<LimitSpec>,
    },
}

impl StartLimits {
    pub fn version(&self) -> u64 {
        match self {
            StartLimits::Files(f) => f.version,
            StartLimits::Specs { version, .. } => *version,
        }
    }

    fn command(&self) -> ClusterCommand {
        match self {
            StartLimits::Files(f) => ClusterCommand::PutConfig(f.clone()),
            StartLimits::Specs { version, limits } => ClusterCommand::PutLimits {
                version: *version,
                limits: limits.clone(),
            },
        }
    }
}

/// Reads `files` as a configuration at `version` and checks it loads, or returns every
/// problem (file:line:column: ...).
pub fn read(
    files: &[PathBuf],
    version: u64,
    merge_domains: bool,
) -> Result<ConfigFiles, Vec<String>> {
    let mut texts = Vec::new();
    for path in files {
        let mut text = String::new();
        let read = std::fs::File::open(path)
            .and_then(|f| f.take(MAX_LIMITS_FILE_BYTES).read_to_string(&mut text));
        match read {
            Ok(_) => texts.push(ConfigFile {
                name: path.display().to_string(),
                text,
            }),
            Err(e) => return Err(vec![format!("{}: {e}", path.display())]),
        }
    }
    let config = ConfigFiles {
        version,
        merge_domains,
        files: texts,
    };
    config.check_size().map_err(|p| vec![p])?;
    config
        .load()
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    Ok(config)
}

/// Reads and loads `files`, or returns every problem (file:line:column: ...).
pub fn load(files: &[PathBuf], merge_domains: bool) -> Result<Vec<LimitSpec>, Vec<String>> {
    let config = read(files, 1, merge_domains)?
        .load()
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    Ok(config.rules().map(|r| r.spec.clone()).collect())
}

/// Puts `limits` through this node's rebalancer once it leads, unless the committed state
/// already holds their version or a newer one (put by another node, or an earlier run).
/// Gives up at `stop`.
pub async fn put_when_older(
    state: StateReader,
    slot: Arc<LeaderSlot>,
    limits: StartLimits,
    mut stop: watch::Receiver<bool>,
) {
    let version = limits.version();
    loop {
        let current = state.read(|a| a.state.table().config_version());
        if current >= version {
            tracing::info!(current, version, "limits in force: nothing to put");
            return;
        }
        if let Some(outcome) = try_put(&slot, limits.command()).await {
            match outcome {
                CommandOutcome::Configured { version, .. } => {
                    tracing::info!(version, "limits put")
                }
                other => tracing::warn!(?other, version, "limits not put"),
            }
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(PUT_RETRY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The outcome of the put, if this node's rebalancer committed it.
async fn try_put(slot: &LeaderSlot, cmd: ClusterCommand) -> Option<CommandOutcome> {
    let jobs = slot.sender()?;
    let (reply, answer) = oneshot::channel();
    jobs.send(Job::Write { cmd, reply }).await.ok()?;
    answer.await.ok()
}
