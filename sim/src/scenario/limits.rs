//! The scenario's `limits:` section, read by the product's configuration loader (the one
//! reader of limits files, `LimitsConfig::load`), one source per YAML document: the machines
//! take its rules' specs, and the simulator measures each counted rule's windows against its
//! quota. Errors are placed at their line in the scenario file.

use allot_core::config::{ConfigErrors, LimitsConfig, LoadOptions, SourceFile};
use allot_core::ids::LimitId;
use allot_core::limit::{LimitSpec, Quota};
use allot_core::time::Window;

use super::yaml::Node;
use crate::error::ScenarioError;

/// What the simulator measures a limit against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitInfo {
    /// `domain/key[=value]/...`, the id the configuration loader gives the rule.
    pub id: LimitId,
    /// The quota of the scenario's own section (before any `config_reload`).
    pub quota_units: u64,
    pub window: Window,
    /// `allot.algorithm: sliding_window`: admissions are judged by the sliding window's
    /// estimate (docs/sim.md, "What a run measures"). A reload keeps it.
    pub sliding: bool,
    /// The quota's changes by `config_reload` faults, in time order.
    pub reloads: Vec<QuotaReload>,
}

/// A `config_reload` as it changes one limit's quota: from the coordinator's reload to the
/// last region's (unix nanoseconds, true clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaReload {
    pub from_nanos: u64,
    pub until_nanos: u64,
    pub quota_units: u64,
}

impl LimitInfo {
    /// The quota a window `[start, end)` (unix nanoseconds) is judged against: the one in
    /// force, or while a reload rolls out during it the larger of the quotas before and after
    /// (units admitted under the old quota before the change were within it).
    pub fn quota_units_in(&self, start_nanos: u64, end_nanos: u64) -> u64 {
        let mut in_force = self.quota_units;
        let mut rolling: Option<u64> = None;
        for r in &self.reloads {
            if end_nanos <= r.from_nanos {
                break;
            }
            if start_nanos >= r.until_nanos {
                in_force = r.quota_units;
                rolling = None;
                continue;
            }
            let before = rolling.unwrap_or(in_force).max(in_force);
            rolling = Some(before.max(r.quota_units));
            in_force = r.quota_units;
        }
        rolling.unwrap_or(in_force)
    }
}

/// Reads the embedded limits YAML of `section` (`text`, its block) through the loader: what
/// the simulator measures, one entry per counted rule (an unlimited rule has nothing to judge).
pub(super) fn read(section: &Node<'_, '_>, text: &str) -> Result<Vec<LimitInfo>, ScenarioError> {
    let config = load(section.file(), section.line(), section.column(), text)?;
    let out: Vec<LimitInfo> = config.rules().filter_map(|r| info(&r.spec)).collect();
    if out.is_empty() {
        return Err(section.err("no rule with a rate_limit: the simulator has nothing to measure"));
    }
    Ok(out)
}

fn info(spec: &LimitSpec) -> Option<LimitInfo> {
    match spec.quota {
        Quota::Units { units, window } => Some(LimitInfo {
            id: spec.id.clone(),
            quota_units: units,
            window: Window::new(window.len()),
            sliding: spec.is_sliding(),
            reloads: Vec::new(),
        }),
        Quota::Unlimited => None,
    }
}

/// `yaml`, the block of `file` that starts at `first_line` and `first_column`, through the
/// configuration loader, one source per YAML document (a limits file holds one). The loader's
/// first error comes back placed in the scenario file.
pub fn load(
    file: &str,
    first_line: usize,
    first_column: usize,
    yaml: &str,
) -> Result<LimitsConfig, ScenarioError> {
    let docs = documents(yaml);
    let names: Vec<String> = (0..docs.len())
        .map(|i| format!("{file}#limits[{i}]"))
        .collect();
    let files: Vec<SourceFile<'_>> = docs
        .iter()
        .zip(&names)
        .map(|(d, name)| SourceFile::new(name, &d.text))
        .collect();
    LimitsConfig::load(&files, &LoadOptions::default()).map_err(|errors| {
        let place = Place {
            file,
            first_line,
            first_column,
        };
        place.error(&docs, &names, &errors)
    })
}

/// One YAML document of the limits text, and the line of the text it starts on (from 0).
struct Document {
    text: String,
    first_line: usize,
}

/// The text's documents, split at `---` lines (empty ones dropped).
fn documents(yaml: &str) -> Vec<Document> {
    let mut docs = vec![Document {
        text: String::new(),
        first_line: 0,
    }];
    for (i, line) in yaml.lines().enumerate() {
        if line.trim_end() == "---" {
            docs.push(Document {
                text: String::new(),
                first_line: i + 1,
            });
            continue;
        }
        if let Some(d) = docs.last_mut() {
            d.text.push_str(line);
            d.text.push('\n');
        }
    }
    docs.retain(|d| !d.text.trim().is_empty());
    docs
}

/// Where the limits block sits in the scenario file.
struct Place<'a> {
    file: &'a str,
    first_line: usize,
    first_column: usize,
}

impl Place<'_> {
    /// The loader's first error, placed in the scenario file.
    fn error(&self, docs: &[Document], names: &[String], errors: &ConfigErrors) -> ScenarioError {
        let first = errors.iter().next();
        let doc = first
            .and_then(|e| names.iter().position(|n| n == e.file_name()))
            .unwrap_or(0);
        let (line, column) = first.and_then(|e| e.line_column()).unwrap_or((1, 1));
        let more = errors.len().saturating_sub(1);
        let message = match first {
            Some(e) if more > 0 => format!("{} (and {more} more problems)", e.message()),
            Some(e) => e.message().to_string(),
            None => errors.to_string(),
        };
        let path = first.map_or("", |e| e.path());
        ScenarioError {
            file: self.file.to_string(),
            line: self.first_line + docs.get(doc).map_or(0, |d| d.first_line) + line as usize - 1,
            column: self.first_column + column as usize - 1,
            field: if path.is_empty() {
                "limits".to_string()
            } else {
                format!("limits: {path}")
            },
            message,
        }
    }
}
