//! A drawn world: the few facts a swarm seed chooses, and their scenario YAML.
//!
//! The world is kept as data rather than as a [`crate::Scenario`] so that the shrinker can
//! drop a region, a limit or a source and keep every reference consistent, and so that every
//! world prints as a scenario file that `allot sim --scenario` replays unchanged.

use std::fmt::Write;

/// The limits domain of every drawn world.
pub const DOMAIN: &str = "swarm";

#[derive(Clone, Debug, PartialEq)]
pub struct World {
    /// The seed it was drawn from (also the seed its run uses).
    pub seed: u64,
    pub duration_ms: u64,
    pub sync_interval_ms: u64,
    /// Eventual mode's view lifetime; `None`: the default (4 sync intervals).
    pub view_ttl_ms: Option<u64>,
    pub commit_latency_ms: u64,
    pub sample_interval_ms: u64,
    pub lease: LeaseDraw,
    /// Region weights are given for all regions or for none (equal shares).
    pub regions: Vec<RegionDraw>,
    pub limits: Vec<LimitDraw>,
    pub sources: Vec<SourceDraw>,
    pub faults: Vec<FaultSpec>,
    /// The product's caps, lowered (the scenario's `caps:`); `None` keeps each default.
    pub caps: CapsDraw,
    /// The timebase every agent ran on, as `--max-clock-uncertainty-ms` set it (never drawn;
    /// `None`: the scenario's default, 0: each agent on its own clock): written with the world
    /// so that it replays as it ran.
    pub max_clock_uncertainty_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapsDraw {
    pub message_items: Option<u64>,
    pub max_keys_per_limit: Option<u64>,
    pub max_tracked_counters: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseDraw {
    pub initial_units: u64,
    pub max_units: u64,
    pub ttl_ms: u64,
    /// The rest: `None` keeps the scenario format's default.
    pub target_ms: Option<u64>,
    pub idle_release_after_ms: Option<u64>,
    pub max_leases_per_key: Option<u64>,
    /// `Some(false)`: gateways take a new lease for each refill.
    pub refill_in_place: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionDraw {
    pub id: String,
    /// `None` on every region: equal shares.
    pub weight_ppm: Option<u32>,
    pub latency_ms: u64,
    pub gateways: u32,
    pub offset_ms: i64,
    pub drift_ppm: i64,
    /// The gateways' clock against their agent's (`gateway_clock`); 0 and 0: the agent's.
    pub gateway_offset_ms: i64,
    pub gateway_drift_ppm: i64,
    /// Envoy's fallback (`envoy_fallback_units`): what each gateway admits of a key in a
    /// window on its own while its agent is down; 0: none.
    pub envoy_fallback_units: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    Strict,
    Eventual,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionPolicy {
    Floor,
    Closed,
    /// Admits up to `units` per window (burst `burst_units`) while open.
    Open {
        units: u64,
        burst_units: u64,
    },
}

/// A GCRA rate: `units` per window, with a burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateDraw {
    pub units: u64,
    pub burst_units: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitDraw {
    /// The descriptor key; the limit id is `swarm/<key>`.
    pub key: String,
    pub window_secs: u64,
    pub quota_units: u64,
    pub consistency: Consistency,
    pub policy: PartitionPolicy,
    pub rate_cap: Option<RateDraw>,
    pub failure_closed: bool,
    /// `algorithm: sliding_window` (D54, and in eventual mode D83), here and in every reload.
    pub sliding: bool,
    /// `rlqs_fallback_units`: what the operator states the regions' fallback to be (D69).
    pub rlqs_fallback_units: u64,
    /// `max_settle_overage` in percent of the reservation (0: none, the loader's default).
    pub settle_overage_percent: u64,
}

impl LimitDraw {
    pub fn id(&self) -> String {
        format!("{DOMAIN}/{}", self.key)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Constant {
        per_sec: f64,
    },
    /// `(at_ms, per_sec)`, the first at 0.
    Steps(Vec<(u64, f64)>),
    Flash {
        base_per_sec: f64,
        factor: f64,
        start_ms: u64,
        end_ms: u64,
    },
    Diurnal {
        base_per_sec: f64,
        peak_per_sec: f64,
        period_ms: u64,
        peak_at_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum CostDraw {
    Units(u64),
    Llm {
        reserve_units: u64,
        median_units: u64,
        sigma: f64,
        max_units: u64,
        settle_min_ms: u64,
        settle_max_ms: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDraw {
    None,
    Immediate { max_retries: u32, delay_ms: u64 },
    Backoff { base_ms: u64, max_retries: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct SourceDraw {
    pub region: usize,
    pub limit: usize,
    /// The key's value: the counter is `<limit key>=k<key>`.
    pub key: u32,
    pub shape: Shape,
    pub uniform_arrivals: bool,
    pub cost: CostDraw,
    pub retry: RetryDraw,
}

/// What a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Nothing,
    AllRegions,
    Region(usize),
    Gateway { region: usize, gateway: u32 },
}

/// When a fault holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTime {
    /// `start`, `end`.
    Span { start_ms: u64, end_ms: u64 },
    /// `at`.
    At { at_ms: u64 },
}

/// A fault's other parameters, printed in order after its target and time.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    Ms(u64),
    Prob(f64),
    Word(&'static str),
    /// Printed as it is (a number, or a flow mapping or list). It must not name a region or a
    /// limit: the shrinker renames neither inside it.
    Raw(String),
    /// A delay per region (by index), printed as `{region: delay, ...}`.
    Stagger(Vec<(usize, u64)>),
    /// A limits section, one entry per limit of the world (by index), printed as a block of
    /// limits text: a fault with it prints in block style.
    Limits(Vec<ReloadLimit>),
}

/// A limit as a reload states it: the world's limit `limit` (same key, window and failure
/// mode) with other terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadLimit {
    pub limit: usize,
    pub quota_units: u64,
    pub consistency: Consistency,
    pub policy: PartitionPolicy,
    pub rate_cap: Option<RateDraw>,
    /// Region weights in parts per million, by region index; `None`: the regions' weights.
    pub weights_ppm: Option<Vec<(usize, u32)>>,
    /// `rlqs_fallback_units` and `max_settle_overage` (percent) as the reload states them;
    /// `None`: the world's limit's.
    pub rlqs_fallback_units: Option<u64>,
    pub settle_overage_percent: Option<u64>,
}

/// One fault of the scenario's `faults:` list, kind-agnostic, so that a new fault kind is a
/// new drawing function (`super::faults`) and nothing here changes.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// The scenario's name for it (`partition`, `agent_crash`, ...).
    pub kind: &'static str,
    pub target: Target,
    pub time: FaultTime,
    pub params: Vec<(&'static str, Param)>,
}

impl FaultSpec {
    fn start_ms(&self) -> u64 {
        match self.time {
            FaultTime::Span { start_ms, .. } => start_ms,
            FaultTime::At { at_ms } => at_ms,
        }
    }

    /// The fault cut to a run of `duration_ms`, or `None` if it starts at or after its end.
    pub fn truncated(&self, duration_ms: u64) -> Option<FaultSpec> {
        if self.start_ms() >= duration_ms {
            return None;
        }
        let mut f = self.clone();
        if let FaultTime::Span { end_ms, .. } = &mut f.time {
            *end_ms = (*end_ms).min(duration_ms);
        }
        Some(f)
    }

    /// Whether it names `region` (its gateways included).
    pub fn names_region(&self, region: usize) -> bool {
        match self.target {
            Target::Region(r) | Target::Gateway { region: r, .. } => r == region,
            Target::Nothing | Target::AllRegions => false,
        }
    }

    /// The same fault after region `removed` left the list (indices above it shift down).
    pub fn without_region(&self, removed: usize) -> FaultSpec {
        let shift = |r: usize| if r > removed { r - 1 } else { r };
        let mut f = self.clone();
        f.target = match f.target {
            Target::Region(r) => Target::Region(shift(r)),
            Target::Gateway { region, gateway } => Target::Gateway {
                region: shift(region),
                gateway,
            },
            t => t,
        };
        for (_, p) in &mut f.params {
            match p {
                Param::Stagger(delays) => {
                    delays.retain(|(r, _)| *r != removed);
                    delays.iter_mut().for_each(|(r, _)| *r = shift(*r));
                }
                Param::Limits(limits) => {
                    for w in limits.iter_mut().filter_map(|l| l.weights_ppm.as_mut()) {
                        w.retain(|(r, _)| *r != removed);
                        w.iter_mut().for_each(|(r, _)| *r = shift(*r));
                    }
                }
                _ => {}
            }
        }
        f
    }

    /// The same fault after limit `removed` left the list (indices above it shift down).
    pub fn without_limit(&self, removed: usize) -> FaultSpec {
        let mut f = self.clone();
        for (_, p) in &mut f.params {
            if let Param::Limits(limits) = p {
                limits.retain(|l| l.limit != removed);
                limits
                    .iter_mut()
                    .filter(|l| l.limit > removed)
                    .for_each(|l| l.limit -= 1);
            }
        }
        f
    }

    /// Its `at`, if it is a reload (reloads are printed in time order).
    fn reload_at_ms(&self) -> Option<u64> {
        let is_reload = self
            .params
            .iter()
            .any(|(_, p)| matches!(p, Param::Limits(_)));
        match self.time {
            FaultTime::At { at_ms } if is_reload => Some(at_ms),
            _ => None,
        }
    }
}

/// A limit as a limits text states it, with its region weights (`None`: the regions' own).
type LimitText<'a> = (LimitDraw, Option<&'a [(usize, u32)]>);

fn ms(v: u64) -> String {
    format!("{v}ms")
}

fn num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

impl World {
    /// The scenario YAML: `allot sim --scenario` reads it as it is.
    pub fn to_yaml(&self) -> String {
        let mut y = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_yaml(&mut y);
        y
    }

    /// The duration of the longest window.
    pub fn longest_window_ms(&self) -> u64 {
        self.limits
            .iter()
            .map(|l| l.window_secs * 1_000)
            .max()
            .unwrap_or(1_000)
    }

    fn write_yaml(&self, y: &mut String) -> std::fmt::Result {
        writeln!(y, "name: swarm-{}", self.seed)?;
        writeln!(
            y,
            "description: drawn by `allot sim --swarm --seeds {}..{}`",
            self.seed,
            self.seed.saturating_add(1)
        )?;
        writeln!(y, "duration: {}", ms(self.duration_ms))?;
        match self.max_clock_uncertainty_ms {
            Some(0) => writeln!(y, "max_clock_uncertainty: off")?,
            Some(u) => writeln!(y, "max_clock_uncertainty: {}", ms(u))?,
            None => {}
        }
        writeln!(y, "sync_interval: {}", ms(self.sync_interval_ms))?;
        if let Some(v) = self.view_ttl_ms {
            writeln!(y, "view_ttl: {}", ms(v))?;
        }
        writeln!(
            y,
            "coordinator: {{commit_latency: {}}}",
            ms(self.commit_latency_ms)
        )?;
        writeln!(
            y,
            "measure: {{sample_interval: {}}}",
            ms(self.sample_interval_ms)
        )?;
        self.write_caps(y)?;
        let l = &self.lease;
        write!(
            y,
            "lease: {{initial_units: {}, max_units: {}, ttl: {}",
            l.initial_units,
            l.max_units,
            ms(l.ttl_ms)
        )?;
        if let Some(v) = l.target_ms {
            write!(y, ", target: {}", ms(v))?;
        }
        if let Some(v) = l.idle_release_after_ms {
            write!(y, ", idle_release_after: {}", ms(v))?;
        }
        if let Some(v) = l.max_leases_per_key {
            write!(y, ", max_leases_per_key: {v}")?;
        }
        if let Some(v) = l.refill_in_place {
            write!(y, ", refill_in_place: {v}")?;
        }
        writeln!(y, "}}")?;
        self.write_regions(y)?;
        self.write_limits(y)?;
        self.write_traffic(y)?;
        self.write_faults(y)
    }

    fn write_caps(&self, y: &mut String) -> std::fmt::Result {
        let c = &self.caps;
        let caps: Vec<String> = [
            ("message_items", c.message_items),
            ("max_keys_per_limit", c.max_keys_per_limit),
            ("max_tracked_counters", c.max_tracked_counters),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some(format!("{name}: {}", v?)))
        .collect();
        if caps.is_empty() {
            return Ok(());
        }
        writeln!(y, "caps: {{{}}}", caps.join(", "))
    }

    fn write_regions(&self, y: &mut String) -> std::fmt::Result {
        writeln!(y, "regions:")?;
        for r in &self.regions {
            write!(y, "  - {{id: {}", r.id)?;
            if let Some(w) = r.weight_ppm {
                write!(y, ", weight: {}", num(f64::from(w) / 1e6))?;
            }
            write!(
                y,
                ", latency: {}, gateways: {}",
                ms(r.latency_ms),
                r.gateways
            )?;
            if r.offset_ms != 0 || r.drift_ppm != 0 {
                let sign = if r.offset_ms < 0 { "-" } else { "" };
                write!(
                    y,
                    ", clock: {{offset: {sign}{}, drift_ppm: {}}}",
                    ms(r.offset_ms.unsigned_abs()),
                    r.drift_ppm
                )?;
            }
            if r.envoy_fallback_units > 0 {
                write!(y, ", envoy_fallback_units: {}", r.envoy_fallback_units)?;
            }
            if r.gateway_offset_ms != 0 || r.gateway_drift_ppm != 0 {
                let sign = if r.gateway_offset_ms < 0 { "-" } else { "" };
                write!(
                    y,
                    ", gateway_clock: {{offset: {sign}{}, drift_ppm: {}}}",
                    ms(r.gateway_offset_ms.unsigned_abs()),
                    r.gateway_drift_ppm
                )?;
            }
            writeln!(y, "}}")?;
        }
        Ok(())
    }

    fn write_limits(&self, y: &mut String) -> std::fmt::Result {
        writeln!(y, "limits: |")?;
        let limits: Vec<LimitText<'_>> = self.limits.iter().map(|l| (l.clone(), None)).collect();
        self.write_limits_text(y, "  ", &limits)
    }

    /// A limits section's text, each line indented by `indent`: `limits` with each one's
    /// region weights (`None`: the regions' own).
    fn write_limits_text(
        &self,
        y: &mut String,
        indent: &str,
        limits: &[LimitText<'_>],
    ) -> std::fmt::Result {
        writeln!(y, "{indent}domain: {DOMAIN}")?;
        writeln!(y, "{indent}descriptors:")?;
        for (l, weights) in limits {
            let w = format!("{}s", l.window_secs);
            writeln!(y, "{indent}  - key: {}", l.key)?;
            writeln!(
                y,
                "{indent}    rate_limit: {{requests_per_unit: {}}}",
                l.quota_units
            )?;
            writeln!(y, "{indent}    allot:")?;
            writeln!(y, "{indent}      window: {w}")?;
            let consistency = match l.consistency {
                Consistency::Strict => "strict",
                Consistency::Eventual => "eventual",
            };
            writeln!(y, "{indent}      consistency: {consistency}")?;
            if l.sliding {
                writeln!(y, "{indent}      algorithm: sliding_window")?;
            }
            match l.policy {
                PartitionPolicy::Floor => writeln!(y, "{indent}      partition_policy: floor")?,
                PartitionPolicy::Closed => writeln!(y, "{indent}      partition_policy: closed")?,
                PartitionPolicy::Open { units, burst_units } => writeln!(
                    y,
                    "{indent}      partition_policy: {{open: {{rate: {units}/{w}, burst: {burst_units}}}}}"
                )?,
            }
            if let Some(c) = l.rate_cap {
                writeln!(
                    y,
                    "{indent}      rate_cap: {{rate: {}/{w}, burst: {}}}",
                    c.units, c.burst_units
                )?;
            }
            let mode = if l.failure_closed { "closed" } else { "open" };
            writeln!(y, "{indent}      failure_mode: {mode}")?;
            if l.rlqs_fallback_units > 0 {
                writeln!(
                    y,
                    "{indent}      rlqs_fallback_units: {}",
                    l.rlqs_fallback_units
                )?;
            }
            if l.settle_overage_percent > 0 {
                writeln!(
                    y,
                    "{indent}      max_settle_overage: {}",
                    num(l.settle_overage_percent as f64 / 100.0)
                )?;
            }
            if let Some(weights) = weights.filter(|w| !w.is_empty()) {
                let items: Vec<String> = weights
                    .iter()
                    .map(|(r, ppm)| {
                        format!("{}: {}", self.regions[*r].id, num(f64::from(*ppm) / 1e6))
                    })
                    .collect();
                writeln!(y, "{indent}      weights: {{{}}}", items.join(", "))?;
            }
        }
        Ok(())
    }

    fn write_traffic(&self, y: &mut String) -> std::fmt::Result {
        writeln!(y, "traffic:")?;
        for s in &self.sources {
            let limit = &self.limits[s.limit];
            writeln!(y, "  - region: {}", self.regions[s.region].id)?;
            writeln!(y, "    limit: {}", limit.id())?;
            writeln!(y, "    key: {}=k{}", limit.key, s.key)?;
            writeln!(y, "    rate: {}", shape_yaml(&s.shape))?;
            let arrivals = if s.uniform_arrivals {
                "uniform"
            } else {
                "poisson"
            };
            writeln!(y, "    arrivals: {arrivals}")?;
            writeln!(y, "    cost: {}", cost_yaml(&s.cost))?;
            writeln!(y, "    retry: {}", retry_yaml(s.retry))?;
        }
        Ok(())
    }

    fn write_faults(&self, y: &mut String) -> std::fmt::Result {
        if self.faults.is_empty() {
            return Ok(());
        }
        writeln!(y, "faults:")?;
        for f in self.faults_in_order() {
            let mut fields: Vec<String> = Vec::new();
            match f.target {
                Target::Nothing => {}
                Target::AllRegions => fields.push("region: all".to_string()),
                Target::Region(r) => fields.push(format!("region: {}", self.regions[r].id)),
                Target::Gateway { region, gateway } => {
                    fields.push(format!("region: {}", self.regions[region].id));
                    fields.push(format!("gateway: {gateway}"));
                }
            }
            match f.time {
                FaultTime::Span { start_ms, end_ms } => {
                    fields.push(format!("start: {}", ms(start_ms)));
                    fields.push(format!("end: {}", ms(end_ms)));
                }
                FaultTime::At { at_ms } => fields.push(format!("at: {}", ms(at_ms))),
            }
            let mut block = None;
            for (name, p) in &f.params {
                let v = match p {
                    Param::Ms(v) => ms(*v),
                    Param::Prob(p) => num(*p),
                    Param::Word(w) => (*w).to_string(),
                    Param::Raw(r) => r.clone(),
                    // No stagger: every region takes the reload with the coordinator.
                    Param::Stagger(delays) if delays.is_empty() => continue,
                    Param::Stagger(delays) => {
                        let items: Vec<String> = delays
                            .iter()
                            .map(|(r, d)| format!("{}: {}", self.regions[*r].id, ms(*d)))
                            .collect();
                        format!("{{{}}}", items.join(", "))
                    }
                    Param::Limits(limits) => {
                        block = Some((*name, limits));
                        continue;
                    }
                };
                fields.push(format!("{name}: {v}"));
            }
            match block {
                None => writeln!(y, "  - {}: {{{}}}", f.kind, fields.join(", "))?,
                Some((name, limits)) => {
                    // A block scalar cannot sit in a flow mapping: the fault goes in block style.
                    writeln!(y, "  - {}:", f.kind)?;
                    for field in &fields {
                        writeln!(y, "      {field}")?;
                    }
                    writeln!(y, "      {name}: |")?;
                    let limits: Vec<LimitText<'_>> = limits
                        .iter()
                        .map(|r| (self.reloaded(r), r.weights_ppm.as_deref()))
                        .collect();
                    self.write_limits_text(y, "        ", &limits)?;
                }
            }
        }
        Ok(())
    }

    /// The faults as listed, but reloads in time order among themselves (the scenario
    /// format numbers their versions by it).
    fn faults_in_order(&self) -> Vec<&FaultSpec> {
        let mut reloads: Vec<&FaultSpec> = self
            .faults
            .iter()
            .filter(|f| f.reload_at_ms().is_some())
            .collect();
        reloads.sort_by_key(|f| f.reload_at_ms());
        let mut reloads = reloads.into_iter();
        self.faults
            .iter()
            .map(|f| match f.reload_at_ms() {
                Some(_) => reloads.next().unwrap_or(f),
                None => f,
            })
            .collect()
    }

    /// The world's limit a reload names, with the reload's terms.
    fn reloaded(&self, r: &ReloadLimit) -> LimitDraw {
        let l = &self.limits[r.limit];
        LimitDraw {
            quota_units: r.quota_units,
            consistency: r.consistency,
            policy: r.policy,
            rate_cap: r.rate_cap,
            rlqs_fallback_units: r.rlqs_fallback_units.unwrap_or(l.rlqs_fallback_units),
            settle_overage_percent: r.settle_overage_percent.unwrap_or(l.settle_overage_percent),
            ..l.clone()
        }
    }
}

fn shape_yaml(s: &Shape) -> String {
    match s {
        Shape::Constant { per_sec } => format!("{{constant_per_sec: {}}}", num(*per_sec)),
        Shape::Steps(steps) => {
            let items: Vec<String> = steps
                .iter()
                .map(|(at, r)| format!("{{at: {}, per_sec: {}}}", ms(*at), num(*r)))
                .collect();
            format!("{{steps: [{}]}}", items.join(", "))
        }
        Shape::Flash {
            base_per_sec,
            factor,
            start_ms,
            end_ms,
        } => format!(
            "{{flash_crowd: {{base_per_sec: {}, factor: {}, start: {}, end: {}}}}}",
            num(*base_per_sec),
            num(*factor),
            ms(*start_ms),
            ms(*end_ms)
        ),
        Shape::Diurnal {
            base_per_sec,
            peak_per_sec,
            period_ms,
            peak_at_ms,
        } => format!(
            "{{diurnal: {{base_per_sec: {}, peak_per_sec: {}, period: {}, peak_at: {}}}}}",
            num(*base_per_sec),
            num(*peak_per_sec),
            ms(*period_ms),
            ms(*peak_at_ms)
        ),
    }
}

fn cost_yaml(c: &CostDraw) -> String {
    match c {
        CostDraw::Units(u) => format!("{{constant_units: {u}}}"),
        CostDraw::Llm {
            reserve_units,
            median_units,
            sigma,
            max_units,
            settle_min_ms,
            settle_max_ms,
        } => format!(
            "{{llm: {{reserve_units: {reserve_units}, actual: {{lognormal: {{median_units: \
             {median_units}, sigma: {}, max_units: {max_units}}}}}, settle_after: {{uniform: \
             [{}, {}]}}}}}}",
            num(*sigma),
            ms(*settle_min_ms),
            ms(*settle_max_ms)
        ),
    }
}

fn retry_yaml(r: RetryDraw) -> String {
    match r {
        RetryDraw::None => "none".to_string(),
        RetryDraw::Immediate {
            max_retries,
            delay_ms,
        } => format!(
            "{{immediate: {{max_retries: {max_retries}, delay: {}}}}}",
            ms(delay_ms)
        ),
        RetryDraw::Backoff {
            base_ms,
            max_retries,
        } => format!(
            "{{backoff: {{base: {}, cap: {}, max_retries: {max_retries}}}}}",
            ms(base_ms),
            ms(base_ms * 16)
        ),
    }
}
