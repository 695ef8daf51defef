//! The scenario's `limits:` section: envoyproxy/ratelimit YAML, checked only as far as the
//! simulator needs it (the quota and window of each rule, to judge admissions against).
//!
//! The full meaning of the section (the `allot:` blocks, weights, modes, policies) belongs to
//! the configuration loader, which reads the same text when the real state machines are built;
//! here `allot:` blocks are only checked to be mappings.

use std::time::Duration;

use allot_core::ids::LimitId;
use allot_core::time::Window;

use super::yaml::{Map, Node, Source};
use crate::error::ScenarioError;

/// Nesting deeper than this is refused (Envoy descriptors are a few levels at most).
const MAX_DESCRIPTOR_DEPTH: usize = 8;

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

/// Reads the embedded limits YAML of `section`; `src` places its lines inside the scenario file.
pub(super) fn read(
    section: &Node<'_, '_>,
    src: &Source<'_>,
    text: &str,
) -> Result<Vec<LimitInfo>, ScenarioError> {
    let docs = src.load(text)?;
    let mut out = Vec::new();
    for doc in &docs {
        let root = Node::root(src, doc);
        let map = root.as_map()?;
        let domain = map.req("domain")?;
        let domain_name = domain.as_str()?;
        if domain_name.is_empty() {
            return Err(domain.err("must not be empty"));
        }
        if let Some(allot) = map.opt("allot") {
            allot.as_map()?;
        }
        for d in map.req("descriptors")?.as_seq()? {
            read_descriptor(&d, domain_name, 1, &mut out)?;
        }
        map.finish()?;
    }
    if out.is_empty() {
        return Err(section.err("no rule with a rate_limit: the simulator has nothing to measure"));
    }
    for (i, l) in out.iter().enumerate() {
        if out[..i].iter().any(|o| o.id == l.id) {
            return Err(section.err(format!("two rules define limit {}", l.id)));
        }
    }
    Ok(out)
}

fn read_descriptor(
    node: &Node<'_, '_>,
    prefix: &str,
    depth: usize,
    out: &mut Vec<LimitInfo>,
) -> Result<(), ScenarioError> {
    if depth > MAX_DESCRIPTOR_DEPTH {
        return Err(node.err(format!(
            "descriptors nest deeper than {MAX_DESCRIPTOR_DEPTH}"
        )));
    }
    let map = node.as_map()?;
    let key = map.req("key")?.as_str()?;
    let id = match map.opt("value") {
        Some(v) => format!("{prefix}/{key}={}", v.as_str()?),
        None => format!("{prefix}/{key}"),
    };
    for flag in ["shadow_mode", "detailed_metric"] {
        if let Some(f) = map.opt(flag) {
            f.as_bool()?;
        }
    }
    let (window, sliding) = match map.opt("allot") {
        Some(allot) => (allot_window(&allot)?, allot_sliding(&allot)?),
        None => (None, false),
    };
    if let Some(rl) = map.opt("rate_limit") {
        let limit = read_rate_limit(&rl.as_map()?, &id, window)?;
        out.extend(limit.map(|l| LimitInfo { sliding, ..l }));
    }
    if let Some(children) = map.opt("descriptors") {
        for child in children.as_seq()? {
            read_descriptor(&child, &id, depth + 1, out)?;
        }
    }
    map.finish()
}

/// Whether the rule sets `allot.algorithm: sliding_window` (the loader checks the value).
fn allot_sliding(allot: &Node<'_, '_>) -> Result<bool, ScenarioError> {
    match allot.as_map()?.opt("algorithm") {
        Some(a) => Ok(a.as_str()?.eq_ignore_ascii_case("sliding_window")),
        None => Ok(false),
    }
}

/// The rule's `allot.window`, if it sets one (the rest of the block is the loader's).
fn allot_window(allot: &Node<'_, '_>) -> Result<Option<Duration>, ScenarioError> {
    let map = allot.as_map()?;
    let Some(w) = map.opt("window") else {
        return Ok(None);
    };
    let text = w.as_str()?;
    match allot_core::config::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        Ok(_) => Err(w.err("the window must be positive")),
        Err(e) => Err(w.err(e)),
    }
}

fn read_rate_limit(
    map: &Map<'_, '_>,
    id: &str,
    allot_window: Option<Duration>,
) -> Result<Option<LimitInfo>, ScenarioError> {
    if let Some(name) = map.opt("name") {
        name.as_str()?;
    }
    if let Some(replaces) = map.opt("replaces") {
        for r in replaces.as_seq()? {
            let r = r.as_map()?;
            r.req("name")?.as_str()?;
            r.finish()?;
        }
    }
    if let Some(allot) = map.opt("allot") {
        allot.as_map()?;
    }
    let unlimited = match map.opt("unlimited") {
        Some(u) => u.as_bool()?,
        None => false,
    };
    let unit = map.opt("unit");
    let per_unit = map.opt("requests_per_unit");
    if unlimited {
        map.finish()?;
        return Ok(None);
    }
    let window = match (unit, allot_window) {
        (None, Some(w)) => w,
        (Some(u), Some(_)) => return Err(u.err("`unit` and `allot.window` both set the window")),
        (None, None) => return Err(map.node().err("missing field `unit` (or `allot.window`)")),
        (Some(unit), None) => unit_window(&unit)?,
    };
    let per_unit = per_unit.ok_or_else(|| map.node().err("missing field `requests_per_unit`"))?;
    let quota_units = per_unit.as_u64()?;
    if quota_units == 0 {
        return Err(per_unit.err("must be at least 1 (use unlimited: true for no limit)"));
    }
    map.finish()?;
    Ok(Some(LimitInfo {
        id: LimitId::new(id),
        quota_units,
        window: Window::new(window),
        sliding: false,
        reloads: Vec::new(),
    }))
}

/// A `rate_limit.unit` as the configuration loader reads it (any case).
fn unit_window(unit: &Node<'_, '_>) -> Result<Duration, ScenarioError> {
    const DAY_SECS: u64 = 86_400;
    let secs = match unit.as_str()?.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => DAY_SECS,
        "week" => 7 * DAY_SECS,
        "month" => 30 * DAY_SECS,
        "year" => 365 * DAY_SECS,
        other => {
            return Err(unit.err(format!(
                "unknown unit {other:?} (second, minute, hour, day, week, month or year)"
            )));
        }
    };
    Ok(Duration::from_secs(secs))
}
