//! The limits configuration in force: files read and loaded into a `LimitsConfig`, with what
//! the request path needs per rule (its metrics handles, its quota) ready.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use allot_core::config::{
    EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, LimitsConfig, LoadOptions, SourceFile,
};
use allot_core::ids::{LimitId, RegionId};
use allot_core::limit::{FailureMode, LimitSpec, Quota};
use allot_core::sync::ConfigFiles;

use crate::metrics::{RuleMetrics, ValueMetrics};

/// Largest limits file read: real ones are kilobytes; this stops a wrong path (a log, a
/// device) from being read whole.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Where the configuration in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The agent's own `--config` files (or the embedded default).
    Files,
    /// The coordinator cluster's, from the sync stream (or as persisted from it).
    Cluster,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Files => "files",
            Source::Cluster => "cluster",
        }
    }
}

/// One loaded configuration.
#[derive(Debug)]
pub struct Limits {
    pub config: LimitsConfig,
    /// From files: successful loads so far, this one included. From the cluster: the
    /// cluster's version.
    pub version: u64,
    pub source: Source,
    rules: HashMap<LimitId, Arc<RuleInfo>>,
}

/// What the request path reads about a rule besides its `LimitSpec`.
#[derive(Debug)]
pub struct RuleInfo {
    pub id: LimitId,
    /// The rule's `name`, when it has one.
    pub name: Option<String>,
    /// `L`, or 0 for an unlimited rule.
    pub quota_units: u64,
    /// `W`; `None` for an unlimited rule.
    pub window: Option<Duration>,
    pub shadow_mode: bool,
    /// `allot.algorithm: sliding_window`: a refusal can lift before the window's end (D54).
    pub sliding: bool,
    /// envoyproxy/ratelimit's `quota_mode`: over its limit, it refuses the request only when
    /// every quota-mode descriptor of the request is over.
    pub quota_mode: bool,
    pub failure_mode: FailureMode,
    /// An allowed decision leaving at most this many units is near the limit.
    pub near_limit_remaining_units: u64,
    pub metrics: RuleMetrics,
    /// Per-value RLS decisions, for requests whose match carries a metric value.
    pub values: Arc<ValueMetrics>,
}

impl Limits {
    pub fn rule(&self, id: &LimitId) -> Option<&Arc<RuleInfo>> {
        self.rules.get(id)
    }

    pub fn rules(&self) -> impl Iterator<Item = &Arc<RuleInfo>> {
        self.rules.values()
    }

    pub fn specs(&self) -> Vec<LimitSpec> {
        self.config.rules().map(|r| r.spec.clone()).collect()
    }

    /// The deployment's regions: every region some limit's `allot.weights` names. Limits
    /// without weights split their quota equally among these (the coordinator must be given
    /// the same list, or the two would compute different default shares).
    pub fn regions(&self) -> BTreeSet<RegionId> {
        self.config
            .rules()
            .flat_map(|r| r.spec.weights.iter().map(|(region, _)| region.clone()))
            .collect()
    }
}

/// Reads and loads `files` (the embedded default when empty), or returns every problem.
pub fn load(
    files: &[PathBuf],
    merge_domains: bool,
    version: u64,
    near_limit_ratio: f64,
) -> Result<Limits, Vec<String>> {
    let texts = if files.is_empty() {
        vec![(
            EMBEDDED_DEFAULT_NAME.to_owned(),
            EMBEDDED_DEFAULT.to_owned(),
        )]
    } else {
        read_all(files)?
    };
    let sources: Vec<SourceFile<'_>> = texts
        .iter()
        .map(|(name, text)| SourceFile::new(name, text))
        .collect();
    let config = LimitsConfig::load(&sources, &LoadOptions { merge_domains })
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    Ok(with_rules(config, version, Source::Files, near_limit_ratio))
}

/// Loads the cluster's configuration `files` at their version, or returns every problem.
pub fn load_cluster(files: &ConfigFiles, near_limit_ratio: f64) -> Result<Limits, Vec<String>> {
    files.check_size().map_err(|p| vec![p])?;
    let config = files
        .load()
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    Ok(with_rules(
        config,
        files.version,
        Source::Cluster,
        near_limit_ratio,
    ))
}

fn with_rules(config: LimitsConfig, version: u64, source: Source, near_limit_ratio: f64) -> Limits {
    let rules = config
        .rules()
        .map(|r| {
            let info = RuleInfo {
                quota_mode: r.quota_mode,
                ..rule_info(&r.spec, near_limit_ratio)
            };
            (r.spec.id.clone(), Arc::new(info))
        })
        .collect();
    Limits {
        config,
        version,
        source,
        rules,
    }
}

/// The rule's request-path facts from its spec alone; `quota_mode` (not in the spec) is false.
pub(crate) fn rule_info(spec: &LimitSpec, near_limit_ratio: f64) -> RuleInfo {
    let (quota_units, window) = match spec.quota {
        Quota::Unlimited => (0, None),
        Quota::Units { units, window } => (units, Some(window.len())),
    };
    let unmetered = if !spec.enabled {
        "disabled"
    } else if window.is_none() {
        "unlimited"
    } else {
        "allowed"
    };
    let near_used = (quota_units as f64 * near_limit_ratio).floor() as u64;
    RuleInfo {
        id: spec.id.clone(),
        name: spec.name.clone(),
        quota_units,
        window,
        shadow_mode: spec.shadow_mode,
        sliding: spec.is_sliding(),
        quota_mode: false,
        failure_mode: spec.failure_mode,
        near_limit_remaining_units: quota_units.saturating_sub(near_used),
        metrics: RuleMetrics::new(spec.id.as_str(), unmetered),
        values: ValueMetrics::for_rule(spec.id.as_str()),
    }
}

fn read_all(files: &[PathBuf]) -> Result<Vec<(String, String)>, Vec<String>> {
    let mut texts = Vec::new();
    let mut problems = Vec::new();
    for path in files {
        let name = path.display().to_string();
        match read_limits_file(path) {
            Ok(text) => texts.push((name, text)),
            Err(p) => problems.push(format!("{name}: {p}")),
        }
    }
    if problems.is_empty() {
        Ok(texts)
    } else {
        Err(problems)
    }
}

/// A limits file's text, as the agent, `allot check-config` and `allot config` read it (one
/// reader): at most [`MAX_CONFIG_FILE_BYTES`], UTF-8. The error says what is wrong with the
/// file, without its name.
pub fn read_limits_file(path: &Path) -> Result<String, String> {
    let file = File::open(path).map_err(|e| format!("cannot read file: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read file: {e}"))?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_BYTES {
        let mib = MAX_CONFIG_FILE_BYTES >> 20;
        return Err(format!("file is larger than {mib} MiB"));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        format!("file is not UTF-8 text (invalid byte at offset {at})")
    })
}

/// What a file looked like when last read: a change in either means it is read again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp(Option<(u64, SystemTime)>);

pub fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    files
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok();
            Stamp(meta.and_then(|m| Some((m.len(), m.modified().ok()?))))
        })
        .collect()
}
