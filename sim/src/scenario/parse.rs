//! Scenario YAML to [`Scenario`], with every bad input reported by file, line and field.

use std::path::Path;
use std::time::Duration;

use allot_core::ids::{KeyId, LimitId, RegionId};
use allot_core::limit::WEIGHT_SCALE_PPM;
use allot_core::sync::{MAX_ITEMS_PER_MESSAGE, MIN_ITEMS_PER_MESSAGE};
use allot_core::time::Timestamp;

use super::limits::QuotaReload;
use super::yaml::{Map, Node, Source};
use super::{
    ArrivalProcess, Caps, CoordinatorSettings, Direction, Fault, LeaseSettings, LimitsSection,
    MAX_ENVOY_FALLBACK_UNITS, MAX_FAULTS, MAX_GATEWAYS_PER_REGION, MAX_REGIONS, MAX_SOURCES,
    MeasureSettings, RegionSel, RegionSpec, Scenario, SourceSpec, limits,
};
use crate::clock::{ClockSpec, MAX_DRIFT_PPM};
use crate::error::{ScenarioError, SimError};
use crate::link::LinkFaults;
use crate::traffic::{
    CostModel, Jitter, LatencyDist, LlmCost, RateProfile, RetryPolicy, Step, TokenDist,
};

/// 2026-01-01T00:00:00Z: aligned to every window length up to a day.
const DEFAULT_START_UNIX_SECS: u64 = 1_767_225_600;

/// Most leases a gateway may hold per key.
const MAX_LEASES_PER_KEY: usize = 64;

/// Most time-series buckets per run (duration / sample_interval).
pub const MAX_SAMPLES: u64 = 200_000;

/// Reads and parses a scenario file.
pub fn load(path: &Path) -> Result<Scenario, SimError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse(&path.display().to_string(), &text)?)
}

/// Parses scenario `text`; `file` names it in errors and replay commands.
pub fn parse(file: &str, text: &str) -> Result<Scenario, ScenarioError> {
    let src = Source::file(file);
    let docs = src.load(text)?;
    let [doc] = docs.as_slice() else {
        return Err(ScenarioError {
            file: file.to_string(),
            line: 1,
            column: 1,
            field: "(top)".to_string(),
            message: format!("expected one YAML document, found {}", docs.len()),
        });
    };
    let root = Node::root(&src, doc);
    let map = root.as_map()?;
    let scenario = read_scenario(&map, file)?;
    map.finish()?;
    Ok(scenario)
}

fn read_scenario(map: &Map<'_, '_>, file: &str) -> Result<Scenario, ScenarioError> {
    let name = map.req("name")?.as_str()?.to_string();
    let description = opt_str(map, "description")?.unwrap_or_default();
    let start_secs = opt_u64(map, "start_unix_secs")?.unwrap_or(DEFAULT_START_UNIX_SECS);
    let duration_node = map.req("duration")?;
    let duration = positive(&duration_node)?;
    let sync_interval = opt_positive(map, "sync_interval")?.unwrap_or(Duration::from_millis(250));
    let view_ttl = opt_positive(map, "view_ttl")?.unwrap_or(sync_interval * 4);
    let max_clock_uncertainty = read_max_clock_uncertainty(map)?;
    let lease = read_lease(map)?;
    let coordinator = read_coordinator(map)?;
    let caps = read_caps(map)?;
    let measure = read_measure(map, duration)?;
    let regions = read_regions(&map.req("regions")?)?;
    let limits = read_limits(&map.req("limits")?)?;
    let ctx = Ctx {
        regions: &regions,
        limits: &limits,
        duration,
    };
    let traffic = read_traffic(&map.req("traffic")?, &ctx)?;
    let faults = match map.opt("faults") {
        Some(f) => read_faults(&f, &ctx)?,
        None => Vec::new(),
    };
    let start = Timestamp::from_unix_nanos(start_secs.saturating_mul(1_000_000_000));
    let mut limits = limits;
    if let Some(f) = map.opt("faults") {
        note_reloads(&f, start, &faults, &mut limits)?;
    }
    Ok(Scenario {
        name,
        description,
        file: file.to_string(),
        start,
        duration,
        sync_interval,
        view_ttl,
        max_clock_uncertainty,
        lease,
        coordinator,
        caps,
        measure,
        regions,
        limits,
        traffic,
        faults,
    })
}

/// What later sections are checked against.
struct Ctx<'s> {
    regions: &'s [RegionSpec],
    limits: &'s LimitsSection,
    duration: Duration,
}

impl Ctx<'_> {
    fn region(&self, node: &Node<'_, '_>) -> Result<usize, ScenarioError> {
        let id = node.as_str()?;
        self.regions
            .iter()
            .position(|r| r.id.as_str() == id)
            .ok_or_else(|| node.err(format!("unknown region {id:?} (not in `regions`)")))
    }

    fn region_sel(&self, node: &Node<'_, '_>) -> Result<RegionSel, ScenarioError> {
        if node.as_str()? == "all" {
            return Ok(RegionSel::All);
        }
        self.region(node).map(RegionSel::One)
    }

    /// An offset on the timeline, within the run.
    fn at(&self, node: &Node<'_, '_>) -> Result<Duration, ScenarioError> {
        let d = node.as_duration()?;
        if d > self.duration {
            return Err(node.err(format!(
                "{} is after the end of the run ({})",
                humantime::format_duration(d),
                humantime::format_duration(self.duration)
            )));
        }
        Ok(d)
    }

    /// `[start, end)` from the mapping's `start` and `end`, defaulting to the whole run.
    fn span(&self, map: &Map<'_, '_>) -> Result<(Duration, Duration), ScenarioError> {
        let start = match map.opt("start") {
            Some(n) => self.at(&n)?,
            None => Duration::ZERO,
        };
        let end = match map.opt("end") {
            Some(n) => {
                let end = self.at(&n)?;
                if end <= start {
                    return Err(n.err("must be after `start`"));
                }
                end
            }
            None => self.duration,
        };
        Ok((start, end))
    }
}

fn opt_str(map: &Map<'_, '_>, key: &str) -> Result<Option<String>, ScenarioError> {
    map.opt(key)
        .map(|n| n.as_str().map(str::to_string))
        .transpose()
}

fn opt_u64(map: &Map<'_, '_>, key: &str) -> Result<Option<u64>, ScenarioError> {
    map.opt(key).map(|n| n.as_u64()).transpose()
}

fn opt_positive_u64(map: &Map<'_, '_>, key: &str) -> Result<Option<u64>, ScenarioError> {
    map.opt(key)
        .map(|n| {
            let v = n.as_u64()?;
            if v == 0 {
                return Err(n.err("must be at least 1"));
            }
            Ok(v)
        })
        .transpose()
}

fn opt_percent(map: &Map<'_, '_>, key: &str) -> Result<Option<u8>, ScenarioError> {
    map.opt(key)
        .map(|n| {
            let v = n.as_u64()?;
            u8::try_from(v)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| n.err("expected a percentage, 0 to 100"))
        })
        .transpose()
}

fn positive(node: &Node<'_, '_>) -> Result<Duration, ScenarioError> {
    let d = node.as_duration()?;
    if d.is_zero() {
        return Err(node.err("must be longer than zero"));
    }
    Ok(d)
}

/// `max_clock_uncertainty`: a duration, `off` (each agent on its own clock), or the default.
fn read_max_clock_uncertainty(map: &Map<'_, '_>) -> Result<Option<Duration>, ScenarioError> {
    match map.opt("max_clock_uncertainty") {
        None => Ok(Some(super::DEFAULT_MAX_CLOCK_UNCERTAINTY)),
        // `off`, or `false` for a reader that takes `off` for YAML 1.1's boolean.
        Some(n) if n.as_str().is_ok_and(|v| v == "off") || matches!(n.as_bool(), Ok(false)) => {
            Ok(None)
        }
        Some(n) => positive(&n).map(Some),
    }
}

fn opt_positive(map: &Map<'_, '_>, key: &str) -> Result<Option<Duration>, ScenarioError> {
    map.opt(key).map(|n| positive(&n)).transpose()
}

fn read_lease(map: &Map<'_, '_>) -> Result<LeaseSettings, ScenarioError> {
    let mut lease = LeaseSettings {
        initial_units: 10,
        max_units: 1_000,
        ttl: Duration::from_secs(5),
        target: Duration::from_millis(500),
        idle_release_after: Duration::from_secs(2),
        max_leases_per_key: 2,
        refill_in_place: true,
    };
    let Some(node) = map.opt("lease") else {
        return Ok(lease);
    };
    let m = node.as_map()?;
    lease.initial_units = opt_positive_u64(&m, "initial_units")?.unwrap_or(lease.initial_units);
    lease.max_units = opt_positive_u64(&m, "max_units")?.unwrap_or(lease.max_units);
    lease.ttl = opt_positive(&m, "ttl")?.unwrap_or(lease.ttl);
    lease.target = opt_positive(&m, "target")?.unwrap_or(lease.target);
    lease.idle_release_after =
        opt_positive(&m, "idle_release_after")?.unwrap_or(lease.idle_release_after);
    if let Some(node) = m.opt("max_leases_per_key") {
        let n = node.as_u64()?;
        if n == 0 || n > MAX_LEASES_PER_KEY as u64 {
            return Err(node.err(format!("expected 1 to {MAX_LEASES_PER_KEY}")));
        }
        lease.max_leases_per_key = n as usize;
    }
    if let Some(node) = m.opt("refill_in_place") {
        lease.refill_in_place = node.as_bool()?;
    }
    if lease.initial_units > lease.max_units {
        return Err(node.err("initial_units is above max_units"));
    }
    m.finish()?;
    Ok(lease)
}

fn read_coordinator(map: &Map<'_, '_>) -> Result<CoordinatorSettings, ScenarioError> {
    let mut c = CoordinatorSettings {
        commit_latency: Duration::from_millis(5),
    };
    if let Some(node) = map.opt("coordinator") {
        let m = node.as_map()?;
        if let Some(n) = m.opt("commit_latency") {
            c.commit_latency = n.as_duration()?;
        }
        m.finish()?;
    }
    Ok(c)
}

/// `caps: {message_items, max_keys_per_limit, max_tracked_counters}`, each optional.
fn read_caps(map: &Map<'_, '_>) -> Result<Caps, ScenarioError> {
    let mut caps = Caps::default();
    let Some(node) = map.opt("caps") else {
        return Ok(caps);
    };
    let m = node.as_map()?;
    if let Some(n) = m.opt("message_items") {
        let items = n.as_u64()?;
        let range = MIN_ITEMS_PER_MESSAGE as u64..=MAX_ITEMS_PER_MESSAGE as u64;
        if !range.contains(&items) {
            return Err(n.err(format!(
                "message_items {items}: expected {MIN_ITEMS_PER_MESSAGE} to \
                 {MAX_ITEMS_PER_MESSAGE}"
            )));
        }
        caps.message_items = Some(items as usize);
    }
    caps.max_keys_per_limit = opt_positive_u64(&m, "max_keys_per_limit")?.map(|n| n as usize);
    caps.max_tracked_counters = opt_positive_u64(&m, "max_tracked_counters")?.map(|n| n as usize);
    m.finish()?;
    Ok(caps)
}

fn read_measure(map: &Map<'_, '_>, duration: Duration) -> Result<MeasureSettings, ScenarioError> {
    let mut s = MeasureSettings {
        sample_interval: Duration::from_millis(100),
        false_denial_threshold_percent: 1,
        convergence_tolerance_percent: 1,
        convergence_hold: Duration::from_secs(1),
    };
    let Some(node) = map.opt("measure") else {
        return check_samples(s, duration, map.node());
    };
    let m = node.as_map()?;
    s.sample_interval = opt_positive(&m, "sample_interval")?.unwrap_or(s.sample_interval);
    s.false_denial_threshold_percent = opt_percent(&m, "false_denial_threshold_percent")?
        .unwrap_or(s.false_denial_threshold_percent);
    s.convergence_tolerance_percent = opt_percent(&m, "convergence_tolerance_percent")?
        .unwrap_or(s.convergence_tolerance_percent);
    s.convergence_hold = opt_positive(&m, "convergence_hold")?.unwrap_or(s.convergence_hold);
    m.finish()?;
    check_samples(s, duration, &node)
}

fn check_samples(
    s: MeasureSettings,
    duration: Duration,
    node: &Node<'_, '_>,
) -> Result<MeasureSettings, ScenarioError> {
    let samples = duration.as_nanos() / s.sample_interval.as_nanos();
    if samples > u128::from(MAX_SAMPLES) {
        return Err(node.err(format!(
            "duration / sample_interval is {samples} samples, above {MAX_SAMPLES}: \
             raise measure.sample_interval"
        )));
    }
    Ok(s)
}

fn read_regions(node: &Node<'_, '_>) -> Result<Vec<RegionSpec>, ScenarioError> {
    let items = node.as_seq()?;
    if items.is_empty() || items.len() > MAX_REGIONS {
        return Err(node.err(format!("expected 1 to {MAX_REGIONS} regions")));
    }
    let mut regions: Vec<RegionSpec> = Vec::with_capacity(items.len());
    let mut weighted = Vec::new();
    for item in &items {
        let m = item.as_map()?;
        let id_node = m.req("id")?;
        let id = RegionId::new(id_node.as_str()?);
        if regions.iter().any(|r| r.id == id) {
            return Err(id_node.err(format!("region {id} appears twice")));
        }
        let weight = match m.opt("weight") {
            Some(w) => Some(w.as_probability()?),
            None => None,
        };
        weighted.push(weight.is_some());
        let gateways = match m.opt("gateways") {
            Some(g) => {
                let n = g.as_u32()?;
                if n == 0 || n > MAX_GATEWAYS_PER_REGION {
                    return Err(g.err(format!("expected 1 to {MAX_GATEWAYS_PER_REGION}")));
                }
                n
            }
            None => 1,
        };
        let envoy_fallback_units = match m.opt("envoy_fallback_units") {
            Some(n) => {
                let units = n.as_u64()?;
                if units > MAX_ENVOY_FALLBACK_UNITS {
                    return Err(n.err(format!("expected at most {MAX_ENVOY_FALLBACK_UNITS}")));
                }
                units
            }
            None => 0,
        };
        regions.push(RegionSpec {
            id,
            weight_ppm: weight.map_or(0, |w| (w * WEIGHT_SCALE_PPM as f64).round() as u32),
            latency: m.req("latency")?.as_duration()?,
            clock: read_clock(&m, "clock")?,
            gateway_clock: read_clock(&m, "gateway_clock")?,
            gateways,
            envoy_fallback_units,
        });
        m.finish()?;
    }
    settle_weights(node, &mut regions, &weighted)?;
    Ok(regions)
}

/// Either every region has a weight (adding up to at most 1) or none has (equal shares).
fn settle_weights(
    node: &Node<'_, '_>,
    regions: &mut [RegionSpec],
    weighted: &[bool],
) -> Result<(), ScenarioError> {
    if weighted.iter().all(|w| !w) {
        let share = (WEIGHT_SCALE_PPM / regions.len() as u64) as u32;
        regions.iter_mut().for_each(|r| r.weight_ppm = share);
        return Ok(());
    }
    if !weighted.iter().all(|w| *w) {
        return Err(node.err("give every region a weight, or none (equal shares)"));
    }
    let total: u64 = regions.iter().map(|r| u64::from(r.weight_ppm)).sum();
    if total > WEIGHT_SCALE_PPM {
        return Err(node.err(format!(
            "region weights add up to {:.6}, above 1",
            total as f64 / WEIGHT_SCALE_PPM as f64
        )));
    }
    Ok(())
}

/// A clock error under `field` (`clock`, or `gateway_clock` relative to the agent's clock).
fn read_clock(m: &Map<'_, '_>, field: &str) -> Result<ClockSpec, ScenarioError> {
    let Some(node) = m.opt(field) else {
        return Ok(ClockSpec::default());
    };
    let c = node.as_map()?;
    let offset_nanos = match c.opt("offset") {
        Some(o) => o.as_signed_duration_nanos()?,
        None => 0,
    };
    let drift_ppm = match c.opt("drift_ppm") {
        Some(d) => {
            let v = d.as_i64()?;
            if v.abs() > MAX_DRIFT_PPM {
                return Err(d.err(format!("drift beyond +-{MAX_DRIFT_PPM} ppm")));
            }
            v
        }
        None => 0,
    };
    c.finish()?;
    Ok(ClockSpec {
        offset_nanos,
        drift_ppm,
    })
}

fn read_limits(node: &Node<'_, '_>) -> Result<LimitsSection, ScenarioError> {
    let text = node
        .as_str()
        .map_err(|_| node.err("expected the limits YAML as a block of text (`limits: |`)"))?;
    let limits = limits::read(node, text)?;
    Ok(LimitsSection {
        yaml: text.to_string(),
        first_line: node.line(),
        first_column: node.column(),
        limits,
    })
}

fn read_traffic(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<Vec<SourceSpec>, ScenarioError> {
    let items = node.as_seq()?;
    if items.is_empty() || items.len() > MAX_SOURCES {
        return Err(node.err(format!("expected 1 to {MAX_SOURCES} traffic sources")));
    }
    items.iter().map(|item| read_source(item, ctx)).collect()
}

fn read_source(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<SourceSpec, ScenarioError> {
    let m = node.as_map()?;
    let region = ctx.region(&m.req("region")?)?;
    let limit_node = m.req("limit")?;
    let limit = LimitId::new(limit_node.as_str()?);
    if !ctx.limits.limits.iter().any(|l| l.id == limit) {
        let known: Vec<&str> = ctx.limits.limits.iter().map(|l| l.id.as_str()).collect();
        return Err(limit_node.err(format!(
            "unknown limit {limit} (the limits section defines: {})",
            known.join(", ")
        )));
    }
    let key = KeyId::new(m.req("key")?.as_str()?);
    let rate = read_rate(&m.req("rate")?, ctx)?;
    let arrivals = match m.opt("arrivals") {
        None => ArrivalProcess::Poisson,
        Some(n) => match n.as_str()? {
            "poisson" => ArrivalProcess::Poisson,
            "uniform" => ArrivalProcess::Uniform,
            other => return Err(n.err(format!("unknown arrivals {other:?} (poisson or uniform)"))),
        },
    };
    let cost = match m.opt("cost") {
        Some(n) => read_cost(&n)?,
        None => CostModel::Constant { units: 1 },
    };
    let retry = match m.opt("retry") {
        Some(n) => read_retry(&n)?,
        None => RetryPolicy::None,
    };
    let (start, end) = ctx.span(&m)?;
    m.finish()?;
    Ok(SourceSpec {
        region,
        limit,
        key,
        rate,
        arrivals,
        cost,
        retry,
        start,
        end,
    })
}

fn read_rate(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<RateProfile, ScenarioError> {
    let (kind, body) = node.as_variant()?;
    let body = body.ok_or_else(|| node.err(format!("`{kind}` needs its parameters")))?;
    match kind {
        "constant_per_sec" => Ok(RateProfile::Constant {
            per_sec: body.as_non_negative()?,
        }),
        "steps" => read_steps(&body, ctx),
        "diurnal" => {
            let m = body.as_map()?;
            let r = RateProfile::Diurnal {
                base_per_sec: m.req("base_per_sec")?.as_non_negative()?,
                peak_per_sec: m.req("peak_per_sec")?.as_non_negative()?,
                period: positive(&m.req("period")?)?,
                peak_at: m.req("peak_at")?.as_duration()?,
            };
            m.finish()?;
            Ok(r)
        }
        "flash_crowd" => {
            let m = body.as_map()?;
            let factor_node = m.req("factor")?;
            let factor = factor_node.as_non_negative()?;
            let (start, end) = ctx.span(&m)?;
            let r = RateProfile::FlashCrowd {
                base_per_sec: m.req("base_per_sec")?.as_non_negative()?,
                factor,
                start,
                end: (end < ctx.duration).then_some(end),
            };
            m.finish()?;
            Ok(r)
        }
        other => Err(node.err(format!(
            "unknown rate {other:?} (constant_per_sec, steps, diurnal or flash_crowd)"
        ))),
    }
}

fn read_steps(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<RateProfile, ScenarioError> {
    let mut steps: Vec<Step> = Vec::new();
    for item in node.as_seq()? {
        let m = item.as_map()?;
        let at_node = m.req("at")?;
        let at = ctx.at(&at_node)?;
        if steps.last().is_some_and(|s| s.at >= at) {
            return Err(at_node.err("steps must be in increasing order of `at`"));
        }
        steps.push(Step {
            at,
            per_sec: m.req("per_sec")?.as_non_negative()?,
        });
        m.finish()?;
    }
    if steps.is_empty() {
        return Err(node.err("expected at least one step"));
    }
    Ok(RateProfile::Steps { steps })
}

fn read_cost(node: &Node<'_, '_>) -> Result<CostModel, ScenarioError> {
    let (kind, body) = node.as_variant()?;
    let body = body.ok_or_else(|| node.err(format!("`{kind}` needs its parameters")))?;
    match kind {
        "constant_units" => {
            let units = body.as_u64()?;
            if units == 0 {
                return Err(body.err("must be at least 1"));
            }
            Ok(CostModel::Constant { units })
        }
        "llm" => {
            let m = body.as_map()?;
            let reserve = m.req("reserve_units")?;
            let reserve_units = reserve.as_u64()?;
            if reserve_units == 0 {
                return Err(reserve.err("must be at least 1"));
            }
            let llm = LlmCost {
                reserve_units,
                actual: read_tokens(&m.req("actual")?)?,
                settle_after: read_latency(&m.req("settle_after")?)?,
            };
            m.finish()?;
            Ok(CostModel::Llm(llm))
        }
        other => Err(node.err(format!("unknown cost {other:?} (constant_units or llm)"))),
    }
}

fn read_tokens(node: &Node<'_, '_>) -> Result<TokenDist, ScenarioError> {
    let (kind, body) = node.as_variant()?;
    let body = body.ok_or_else(|| node.err(format!("`{kind}` needs its parameters")))?;
    match kind {
        "constant_units" => Ok(TokenDist::Constant {
            units: body.as_u64()?,
        }),
        "uniform_units" => {
            let [min, max] = pair(&body)?;
            let (min_units, max_units) = (min.as_u64()?, max.as_u64()?);
            if min_units > max_units {
                return Err(body.err("expected [min, max] with min <= max"));
            }
            Ok(TokenDist::Uniform {
                min_units,
                max_units,
            })
        }
        "lognormal" => {
            let m = body.as_map()?;
            let median = m.req("median_units")?;
            let median_units = median.as_f64()?;
            if median_units < 1.0 {
                return Err(median.err("must be at least 1"));
            }
            let sigma_node = m.req("sigma")?;
            let sigma = sigma_node.as_f64()?;
            if !(sigma > 0.0 && sigma <= 5.0) {
                return Err(sigma_node.err("expected a sigma in (0, 5]"));
            }
            let max_units = m.req("max_units")?.as_u64()?.max(1);
            m.finish()?;
            Ok(TokenDist::LogNormal {
                median_units,
                sigma,
                max_units,
            })
        }
        other => Err(node.err(format!(
            "unknown token count {other:?} (constant_units, uniform_units or lognormal)"
        ))),
    }
}

fn read_latency(node: &Node<'_, '_>) -> Result<LatencyDist, ScenarioError> {
    if let Ok(d) = node.as_duration() {
        return Ok(LatencyDist::Constant(d));
    }
    let (kind, body) = node.as_variant()?;
    match (kind, body) {
        ("uniform", Some(body)) => {
            let [min, max] = pair(&body)?;
            let (min, max) = (min.as_duration()?, max.as_duration()?);
            if min > max {
                return Err(body.err("expected [min, max] with min <= max"));
            }
            Ok(LatencyDist::Uniform { min, max })
        }
        _ => Err(node.err("expected a duration (e.g. 2s) or uniform: [min, max]")),
    }
}

fn pair<'a, 'i>(node: &Node<'a, 'i>) -> Result<[Node<'a, 'i>; 2], ScenarioError> {
    let items = node.as_seq()?;
    <[Node<'a, 'i>; 2]>::try_from(items).map_err(|_| node.err("expected [min, max]"))
}

fn read_retry(node: &Node<'_, '_>) -> Result<RetryPolicy, ScenarioError> {
    let (kind, body) = node.as_variant()?;
    match (kind, body) {
        ("none", None) => Ok(RetryPolicy::None),
        ("immediate", Some(body)) => {
            let m = body.as_map()?;
            let p = RetryPolicy::Immediate {
                max_retries: m.req("max_retries")?.as_u32()?,
                delay: match m.opt("delay") {
                    Some(d) => d.as_duration()?,
                    None => Duration::ZERO,
                },
            };
            m.finish()?;
            Ok(p)
        }
        ("backoff", Some(body)) => {
            let m = body.as_map()?;
            let base = positive(&m.req("base")?)?;
            let cap_node = m.req("cap")?;
            let cap = positive(&cap_node)?;
            if cap < base {
                return Err(cap_node.err("must be at least `base`"));
            }
            let jitter = match m.opt("jitter") {
                None => Jitter::Full,
                Some(j) => match j.as_str()? {
                    "none" => Jitter::None,
                    "full" => Jitter::Full,
                    "equal" => Jitter::Equal,
                    other => {
                        return Err(
                            j.err(format!("unknown jitter {other:?} (none, full or equal)"))
                        );
                    }
                },
            };
            let p = RetryPolicy::Backoff {
                base,
                cap,
                max_retries: m.req("max_retries")?.as_u32()?,
                jitter,
                respect_retry_after: match m.opt("respect_retry_after") {
                    Some(r) => r.as_bool()?,
                    None => true,
                },
            };
            m.finish()?;
            Ok(p)
        }
        _ => Err(node.err("expected none, immediate: {...} or backoff: {...}")),
    }
}

fn read_faults(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<Vec<Fault>, ScenarioError> {
    let items = node.as_seq()?;
    if items.len() > MAX_FAULTS {
        return Err(node.err(format!("more than {MAX_FAULTS} faults")));
    }
    items.iter().map(|item| read_fault(item, ctx)).collect()
}

fn read_fault(node: &Node<'_, '_>, ctx: &Ctx<'_>) -> Result<Fault, ScenarioError> {
    let (kind, body) = node.as_variant()?;
    let body = body.ok_or_else(|| node.err(format!("`{kind}` needs its parameters")))?;
    let m = body.as_map()?;
    let fault = match kind {
        "partition" => {
            let (start, end) = ctx.span(&m)?;
            Fault::Partition {
                regions: ctx.region_sel(&m.req("region")?)?,
                direction: read_direction(&m)?,
                start,
                end,
            }
        }
        "coordinator_outage" => {
            let (start, end) = ctx.span(&m)?;
            Fault::CoordinatorOutage { start, end }
        }
        "agent_crash" => Fault::AgentCrash {
            region: ctx.region(&m.req("region")?)?,
            at: ctx.at(&m.req("at")?)?,
            restart_after: m.req("restart_after")?.as_duration()?,
        },
        "agent_restore" => {
            let at = ctx.at(&m.req("at")?)?;
            let from_node = m.req("from")?;
            let from = ctx.at(&from_node)?;
            if from >= at {
                return Err(from_node.err("`from` must be before `at` (the store as it was then)"));
            }
            Fault::AgentRestore {
                region: ctx.region(&m.req("region")?)?,
                at,
                from,
            }
        }
        "gateway_crash" => {
            let region = ctx.region(&m.req("region")?)?;
            let g = m.req("gateway")?;
            let gateway = g.as_u32()?;
            if gateway >= ctx.regions[region].gateways {
                return Err(g.err(format!(
                    "region {} has {} gateways (numbered from 0)",
                    ctx.regions[region].id, ctx.regions[region].gateways
                )));
            }
            Fault::GatewayCrash {
                region,
                gateway,
                at: ctx.at(&m.req("at")?)?,
                restart_after: m
                    .opt("restart_after")
                    .map(|n| n.as_duration())
                    .transpose()?,
            }
        }
        "link" => {
            let (start, end) = ctx.span(&m)?;
            Fault::Link {
                regions: ctx.region_sel(&m.req("region")?)?,
                direction: read_direction(&m)?,
                start,
                end,
                faults: read_link_faults(&m)?,
            }
        }
        "config_reload" => read_config_reload(&m, ctx)?,
        "region_removal" => Fault::RegionRemoval {
            region: ctx.region(&m.req("region")?)?,
            at: ctx.at(&m.req("at")?)?,
            restore_after: m
                .opt("restore_after")
                .map(|n| n.as_duration())
                .transpose()?,
        },
        "clock_step" => {
            let by = m.req("by")?;
            let by_nanos = by.as_signed_duration_nanos()?;
            if by_nanos == 0 {
                return Err(by.err("a clock step of 0 is no step"));
            }
            Fault::ClockStep {
                region: ctx.region(&m.req("region")?)?,
                at: ctx.at(&m.req("at")?)?,
                by_nanos,
            }
        }
        other => {
            return Err(node.err(format!(
                "unknown fault {other:?} (partition, coordinator_outage, agent_crash, \
                 agent_restore, gateway_crash, config_reload, region_removal, clock_step \
                 or link)"
            )));
        }
    };
    m.finish()?;
    Ok(fault)
}

/// Reloads must come in time order (their versions follow it); each limit's quota changes
/// are noted on it, for judging its windows.
fn note_reloads(
    node: &Node<'_, '_>,
    start: Timestamp,
    faults: &[Fault],
    limits: &mut LimitsSection,
) -> Result<(), ScenarioError> {
    let mut last = None;
    for f in faults {
        let Fault::ConfigReload {
            at, limits: new, ..
        } = f
        else {
            continue;
        };
        if last.is_some_and(|l| *at <= l) {
            return Err(node.err("config_reload faults must be listed in time order"));
        }
        last = Some(*at);
        let from_nanos = (start + *at).as_unix_nanos();
        let until_nanos = f
            .heals_at()
            .map_or(from_nanos, |h| (start + h).as_unix_nanos());
        for l in &mut limits.limits {
            if let Some(n) = new.limits.iter().find(|n| n.id == l.id) {
                l.reloads.push(QuotaReload {
                    from_nanos,
                    until_nanos,
                    quota_units: n.quota_units,
                });
            }
        }
    }
    Ok(())
}

/// `config_reload: {at, limits: |..., stagger: {region: delay, ...}}`: the same limits (ids
/// and windows) as the scenario's own section, with other quotas, weights, modes or policies.
fn read_config_reload(m: &Map<'_, '_>, ctx: &Ctx<'_>) -> Result<Fault, ScenarioError> {
    let at = ctx.at(&m.req("at")?)?;
    let limits_node = m.req("limits")?;
    let limits = read_limits(&limits_node)?;
    let same = limits.limits.len() == ctx.limits.limits.len()
        && limits.limits.iter().all(|l| {
            ctx.limits
                .limits
                .iter()
                .any(|o| o.id == l.id && o.window == l.window && o.sliding == l.sliding)
        });
    if !same {
        return Err(limits_node.err(
            "a reload must keep the same limits with the same windows and algorithms (the \
             simulator measures each limit's windows from the start of the run)",
        ));
    }
    let mut stagger = vec![Duration::ZERO; ctx.regions.len()];
    if let Some(node) = m.opt("stagger") {
        let sm = node.as_map()?;
        for (i, r) in ctx.regions.iter().enumerate() {
            if let Some(d) = sm.opt(r.id.as_str()) {
                stagger[i] = d.as_duration()?;
            }
        }
        sm.finish()?;
    }
    Ok(Fault::ConfigReload {
        at,
        limits,
        stagger,
    })
}

fn read_direction(m: &Map<'_, '_>) -> Result<Direction, ScenarioError> {
    let Some(n) = m.opt("direction") else {
        return Ok(Direction::Both);
    };
    match n.as_str()? {
        "up" => Ok(Direction::Up),
        "down" => Ok(Direction::Down),
        "both" => Ok(Direction::Both),
        other => Err(n.err(format!("unknown direction {other:?} (up, down or both)"))),
    }
}

fn read_link_faults(m: &Map<'_, '_>) -> Result<LinkFaults, ScenarioError> {
    let prob = |key: &str| -> Result<f64, ScenarioError> {
        m.opt(key).map_or(Ok(0.0), |n| n.as_probability())
    };
    let dur = |key: &str| -> Result<Duration, ScenarioError> {
        m.opt(key).map_or(Ok(Duration::ZERO), |n| n.as_duration())
    };
    let faults = LinkFaults {
        loss: prob("loss")?,
        duplicate: prob("duplicate")?,
        reorder: prob("reorder")?,
        reorder_window: dur("reorder_window")?,
        extra_delay: dur("delay")?,
    };
    if faults.reorder > 0.0 && faults.reorder_window.is_zero() {
        return Err(m
            .node()
            .err("`reorder` needs a `reorder_window` (how long a message may be held back)"));
    }
    Ok(faults)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY_CLOCKS: &str = r#"
name: gateway-clocks
duration: 10s
regions:
  - {id: a, latency: 5ms, clock: {offset: 1s}, gateway_clock: {offset: -2500ms, drift_ppm: -300}}
  - {id: b, latency: 5ms}
limits: |
  domain: api
  descriptors:
    - key: t
      rate_limit: {unit: second, requests_per_unit: 100}
traffic:
  - {region: a, limit: api/t, key: t=1, rate: {constant_per_sec: 10}}
"#;

    #[test]
    fn a_gateway_clock_is_read_relative_to_the_agent_s_and_defaults_to_it() {
        let s = parse("gateway-clocks.yaml", GATEWAY_CLOCKS).unwrap();
        let expected = ClockSpec {
            offset_nanos: -2_500_000_000,
            drift_ppm: -300,
        };
        assert_eq!(s.regions[0].gateway_clock, expected);
        assert_eq!(s.regions[0].clock.offset_nanos, 1_000_000_000);
        assert_eq!(s.regions[1].gateway_clock, ClockSpec::default());
    }

    #[test]
    fn envoy_fallback_units_default_to_none_and_are_checked() {
        let s = parse("gateway-clocks.yaml", GATEWAY_CLOCKS).unwrap();
        assert_eq!(s.regions[0].envoy_fallback_units, 0);
        let with = GATEWAY_CLOCKS.replace(
            "  - {id: b, latency: 5ms}",
            "  - {id: b, latency: 5ms, envoy_fallback_units: 40}",
        );
        assert_eq!(
            parse("f.yaml", &with).unwrap().regions[1].envoy_fallback_units,
            40
        );
        for bad in ["-1", "lots", "1000000001"] {
            let text = GATEWAY_CLOCKS.replace(
                "  - {id: b, latency: 5ms}",
                &format!("  - {{id: b, latency: 5ms, envoy_fallback_units: {bad}}}"),
            );
            let e = parse("f.yaml", &text).unwrap_err();
            assert_eq!(e.field, "regions[1].envoy_fallback_units", "{bad}: {e}");
        }
    }

    #[test]
    fn a_gateway_clock_is_checked_as_a_clock_is() {
        let text = GATEWAY_CLOCKS.replace("drift_ppm: -300", "drift_ppm: -300000");
        let e = parse("gateway-clocks.yaml", &text).unwrap_err();
        assert_eq!(e.field, "regions[0].gateway_clock.drift_ppm", "{e}");
        assert!(e.message.contains("drift beyond"), "{e}");
        let text = GATEWAY_CLOCKS.replace("drift_ppm: -300", "skew: 1");
        let e = parse("gateway-clocks.yaml", &text).unwrap_err();
        assert_eq!(e.field, "regions[0].gateway_clock", "{e}");
        assert!(e.message.contains("unknown field `skew`"), "{e}");
    }
}
