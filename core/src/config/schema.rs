//! The limits file schema: walks one file's YAML tree into descriptor definitions, checking
//! every field and reporting every problem with its line, column and path.
//!
//! Field by field this follows envoyproxy/ratelimit (same keys, same meaning, its error
//! wording where it has one), and it is stricter where a silent mistake would cost a user:
//! keys are checked per mapping rather than against one global list, types are checked, and
//! quotas must be positive integers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::ids::{LimitId, RegionId};
use crate::limit::{
    Algorithm, ConcurrencyCap, Consistency, FailureMode, LimitSpec, PartitionPolicy, Quota,
    RateCap, RegionWeights, WEIGHT_SCALE_PPM,
};

use super::errors::ConfigError;
use super::glob::Glob;
use super::model::{Metadata, MetadataValue, RuleEntry, ValuePattern, limit_id};
use super::units::{
    RATE_LIMIT_UNITS_HELP, format_ppm, parse_duration, parse_rate, parse_weight_ppm,
    rate_limit_unit,
};
use super::yaml::{Kind, Node, Plain, Pos, resolve_plain};

/// Shortest window accepted: below this no two regions could ever exchange a counter in time.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// Longest window accepted: a year, envoyproxy/ratelimit's longest unit.
pub const MAX_WINDOW: Duration = Duration::from_secs(365 * 86_400);

/// How long a concurrency slot lives unless `allot.concurrency.slot_ttl` says otherwise.
pub const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(30);

/// Burst of a rate cap without `burst`: one unit, so the cap is a pure rate.
pub const DEFAULT_BURST_UNITS: u64 = 1;

/// `max_settle_overage` without the setting: a settle charges nothing above its reservation,
/// so the bound's settle-overage term is 0 unless a rule allows more.
pub const DEFAULT_MAX_SETTLE_OVERAGE_PPM: u64 = 0;

/// Largest `max_settle_overage` accepted: a settle may charge 100 times its reservation.
pub const MAX_SETTLE_OVERAGE_PPM: u64 = 100 * WEIGHT_SCALE_PPM;

/// Largest `rlqs_fallback_units` accepted (a typo of many digits is refused, not believed).
pub const MAX_RLQS_FALLBACK_UNITS: u64 = 1_000_000_000_000;

const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "quota_mode",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "allot",
];
const RATE_LIMIT_KEYS: &[&str] = &["requests_per_unit", "unit", "unlimited", "name", "replaces"];
const REPLACES_KEYS: &[&str] = &["name"];
const ALLOT_KEYS: &[&str] = &[
    "window",
    "consistency",
    "weights",
    "partition_policy",
    "rate_cap",
    "concurrency",
    "failure_mode",
    "enabled",
    "max_settle_overage",
    "algorithm",
    "rlqs_fallback_units",
];
/// `allot` settings that still mean something on an unlimited rule.
const ALLOT_KEYS_FOR_UNLIMITED: &[&str] = &["failure_mode", "enabled"];
const RATE_CAP_KEYS: &[&str] = &["rate", "burst"];
const CONCURRENCY_KEYS: &[&str] = &["max_slots", "slot_ttl"];
const PARTITION_POLICY_KEYS: &[&str] = &["open"];

/// One file, walked.
#[derive(Debug, Default)]
pub struct FileDef {
    /// `None` when the domain is missing or empty (already reported).
    pub domain: Option<(String, Pos)>,
    pub descriptors: Vec<DescriptorDef>,
}

#[derive(Debug)]
pub struct DescriptorDef {
    pub pos: Pos,
    pub path: String,
    pub entry: RuleEntry,
    /// `None` when the descriptor has no `rate_limit`, or an invalid one (already reported).
    pub rule: Option<RuleDef>,
    pub children: Vec<DescriptorDef>,
    /// `share_threshold` (checked: only on a wildcard value).
    pub share_threshold: bool,
    pub value_to_metric: bool,
}

#[derive(Debug)]
pub struct RuleDef {
    pub spec: LimitSpec,
    /// Each `replaces` name with where it was written, for the cross-file check.
    pub replaces_at: Vec<(String, Pos, String)>,
    pub quota_mode: bool,
    pub metadata: Option<Metadata>,
}

/// Walks one file's document (`None` for an empty file), appending problems to `errors`.
pub fn walk_file(file: &Arc<str>, root: Option<&Node>, errors: &mut Vec<ConfigError>) -> FileDef {
    let mut walk = Walk { file, errors };
    let Some(root) = root else {
        walk.err(
            Pos { line: 1, column: 1 },
            &Path::root().key("domain"),
            "config file cannot have empty domain".into(),
        );
        return FileDef::default();
    };
    walk.root(root)
}

/// A path inside the document, e.g. `descriptors[0].rate_limit.unit`.
#[derive(Clone, Debug, Default)]
struct Path(String);

impl Path {
    fn root() -> Self {
        Path(String::new())
    }

    fn key(&self, key: &str) -> Path {
        if self.0.is_empty() {
            Path(key.to_owned())
        } else {
            Path(format!("{}.{key}", self.0))
        }
    }

    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
}

/// A known key of a mapping, its value and where it was written.
struct Field<'n> {
    name: &'static str,
    key_pos: Pos,
    value: &'n Node,
    path: Path,
}

struct Fields<'n>(Vec<Field<'n>>);

impl<'n> Fields<'n> {
    fn get(&self, name: &str) -> Option<&Field<'n>> {
        self.0.iter().find(|f| f.name == name)
    }
}

struct Walk<'a> {
    file: &'a Arc<str>,
    errors: &'a mut Vec<ConfigError>,
}

impl Walk<'_> {
    fn err(&mut self, pos: Pos, path: &Path, message: String) {
        self.errors
            .push(ConfigError::at(self.file, pos, &path.0, message));
    }

    fn root(&mut self, root: &Node) -> FileDef {
        let path = Path::root();
        let Some(fields) = self.mapping(root, &path, "a limits file", ROOT_KEYS) else {
            return FileDef::default();
        };
        let domain = fields.get("domain").and_then(|f| {
            let name = self.string(f)?;
            Some((name, f.value.pos))
        });
        let domain = match domain {
            Some((name, pos)) if !name.is_empty() => Some((name, pos)),
            _ => {
                let pos = fields.get("domain").map_or(root.pos, |f| f.value.pos);
                let message = "config file cannot have empty domain".to_owned();
                self.err(pos, &path.key("domain"), message);
                None
            }
        };
        let domain_name = domain.as_ref().map_or("", |(name, _)| name.as_str());
        let descriptors = self.descriptors(fields.get("descriptors"), domain_name, &[]);
        FileDef {
            domain,
            descriptors,
        }
    }

    fn descriptors(
        &mut self,
        field: Option<&Field<'_>>,
        domain: &str,
        parents: &[RuleEntry],
    ) -> Vec<DescriptorDef> {
        let Some(field) = field else {
            return Vec::new();
        };
        let mut defs = Vec::new();
        for (i, node) in self.list(field).iter().enumerate() {
            let path = field.path.index(i);
            if let Some(def) = self.descriptor(node, path, domain, parents) {
                defs.push(def);
            }
        }
        defs
    }

    fn descriptor(
        &mut self,
        node: &Node,
        path: Path,
        domain: &str,
        parents: &[RuleEntry],
    ) -> Option<DescriptorDef> {
        let fields = self.mapping(node, &path, "a descriptor", DESCRIPTOR_KEYS)?;
        let entry = self.entry(node, &path, &fields);
        // Children are checked even under a broken entry, so every error shows at once.
        let placeholder = RuleEntry {
            key: String::new(),
            value: ValuePattern::Any,
        };
        let mut chain = parents.to_vec();
        chain.push(entry.clone().unwrap_or(placeholder));
        let flags = Flags {
            shadow_mode: self.flag(&fields, "shadow_mode"),
            detailed_metric: self.flag(&fields, "detailed_metric"),
            quota_mode: self.flag(&fields, "quota_mode"),
        };
        let value_to_metric = self.flag(&fields, "value_to_metric");
        let share_threshold = self.share_threshold(&fields, entry.as_ref());
        // Read (and checked) with or without a rule, as envoyproxy/ratelimit reads it; only a
        // rule keeps it.
        let metadata = fields.get("metadata").and_then(|f| self.metadata(f));
        let rule = match fields.get("rate_limit") {
            Some(rate_limit) => self
                .rule(&fields, rate_limit, flags, limit_id(domain, &chain))
                .map(|rule| RuleDef { metadata, ..rule }),
            None => {
                if let Some(allot) = fields.get("allot") {
                    let message =
                        "allot settings need a rate_limit on the same descriptor".to_owned();
                    self.err(allot.key_pos, &allot.path, message);
                }
                None
            }
        };
        let children = self.descriptors(fields.get("descriptors"), domain, &chain);
        Some(DescriptorDef {
            pos: node.pos,
            path: path.0,
            entry: entry?,
            rule,
            children,
            share_threshold,
            value_to_metric,
        })
    }

    /// `share_threshold`, which only a wildcard value can carry (envoyproxy/ratelimit's rule
    /// and wording).
    fn share_threshold(&mut self, fields: &Fields<'_>, entry: Option<&RuleEntry>) -> bool {
        let Some(f) = fields.get("share_threshold") else {
            return false;
        };
        let Some(on) = self.boolean(f) else {
            return false;
        };
        match entry {
            Some(e) if on && !matches!(e.value, ValuePattern::Wildcard(_)) => {
                let message = format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found '{e}'"
                );
                self.err(f.value.pos, &f.path, message);
                false
            }
            _ => on,
        }
    }

    /// `metadata`: a mapping of anything, kept as written. `None` when empty or invalid
    /// (reported).
    fn metadata(&mut self, f: &Field<'_>) -> Option<Metadata> {
        if f.value.is_null() {
            return None;
        }
        let Kind::Map(_) = f.value.kind else {
            let message = format!("metadata must be a mapping, found {}", f.value.describe());
            self.err(f.value.pos, &f.path, message);
            return None;
        };
        let errors_before = self.errors.len();
        let value = self.metadata_value(f.value, &f.path);
        match value {
            MetadataValue::Map(entries) if self.errors.len() == errors_before => {
                Some(entries).filter(|e| !e.is_empty())
            }
            _ => None,
        }
    }

    /// One node inside `metadata`. The YAML tree's depth is bounded, so the recursion is too.
    fn metadata_value(&mut self, node: &Node, path: &Path) -> MetadataValue {
        match &node.kind {
            Kind::Scalar { text, quoted: true } => MetadataValue::String(text.clone()),
            Kind::Scalar {
                text,
                quoted: false,
            } => match resolve_plain(text) {
                Plain::Null => MetadataValue::Null,
                Plain::Bool(b) => MetadataValue::Bool(b),
                Plain::Int(_) | Plain::Float => MetadataValue::Number(text.clone()),
                Plain::Str => MetadataValue::String(text.clone()),
            },
            Kind::Seq(items) => MetadataValue::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| self.metadata_value(item, &path.index(i)))
                    .collect(),
            ),
            Kind::Map(entries) => {
                let mut map: Metadata = Vec::with_capacity(entries.len());
                for (key, value) in entries {
                    // Any scalar key reads as its text, as upstream prints keys.
                    let Kind::Scalar { text: name, .. } = &key.kind else {
                        let message = format!("key is not a scalar: {}", key.describe());
                        self.err(key.pos, path, message);
                        continue;
                    };
                    let here = path.key(name);
                    if map.iter().any(|(k, _)| k == name) {
                        self.err(key.pos, &here, format!("duplicate key '{name}'"));
                        continue;
                    }
                    let value = self.metadata_value(value, &here);
                    map.push((name.clone(), value));
                }
                MetadataValue::Map(map)
            }
        }
    }

    /// The descriptor's `key` and `value`.
    fn entry(&mut self, node: &Node, path: &Path, fields: &Fields<'_>) -> Option<RuleEntry> {
        let key = match fields.get("key") {
            // A key of the wrong type was reported as such.
            Some(f) => self.string(f)?,
            None => String::new(),
        };
        if key.is_empty() {
            let pos = fields.get("key").map_or(node.pos, |f| f.value.pos);
            self.err(pos, &path.key("key"), "descriptor has empty key".into());
            return None;
        }
        if key.ends_with('*') {
            let f = fields.get("key")?;
            let message = format!(
                "wildcards apply to values only: key '{key}' ends with '*' (put the pattern in value)"
            );
            self.err(f.value.pos, &f.path, message);
            return None;
        }
        let value = match fields.get("value").and_then(|f| self.string(f)) {
            None => ValuePattern::Any,
            Some(v) if v.is_empty() => ValuePattern::Any,
            Some(v) => match Glob::new(&v) {
                Some(glob) => ValuePattern::Wildcard(glob),
                None => ValuePattern::Exact(v),
            },
        };
        Some(RuleEntry { key, value })
    }

    /// A descriptor's `rate_limit` with its `allot` block and flags, as a [`LimitSpec`].
    /// `None` when anything about it is wrong (each problem is reported).
    fn rule(
        &mut self,
        descriptor: &Fields<'_>,
        rate_limit: &Field<'_>,
        flags: Flags,
        id: LimitId,
    ) -> Option<RuleDef> {
        let errors_before = self.errors.len();
        // The allot block is checked first, so that its errors show even when the
        // rate_limit itself is unusable.
        let allot = match descriptor.get("allot") {
            Some(f) => self.mapping(f.value, &f.path, "allot", ALLOT_KEYS),
            None => Some(Fields(Vec::new())),
        };
        let settings = allot.as_ref().map(|a| self.settings(a));
        if rate_limit.value.is_null() {
            let message =
                "rate_limit is empty: set requests_per_unit and unit, or unlimited: true".into();
            self.err(rate_limit.key_pos, &rate_limit.path, message);
            return None;
        }
        let rl = self.mapping(
            rate_limit.value,
            &rate_limit.path,
            "rate_limit",
            RATE_LIMIT_KEYS,
        )?;
        let unlimited = rl.get("unlimited").and_then(|f| self.boolean(f)) == Some(true);
        let unit = rl.get("unit").map(|f| self.unit(f));
        let name = rl
            .get("name")
            .and_then(|f| self.string(f))
            .filter(|n| !n.is_empty());
        let replaces_at = self.replaces(&rl, name.as_deref());
        let quota = if unlimited {
            self.check_unlimited(&rl, allot.as_ref(), unit.flatten().flatten());
            Some(Quota::Unlimited)
        } else {
            // A window written but invalid (or an allot block that is not a mapping) was
            // reported already; saying the window is missing as well would only confuse.
            let window = match (&allot, &settings) {
                (Some(a), Some(s)) if s.window.is_some() || a.get("window").is_none() => {
                    Window::Valid(s.window)
                }
                _ => Window::Invalid,
            };
            self.quota(rate_limit, &rl, unit, window)
        };
        if self.errors.len() > errors_before {
            return None;
        }
        let (quota, s) = (quota?, settings?);
        let spec = LimitSpec {
            id,
            quota,
            consistency: s.consistency,
            weights: s.weights,
            partition_policy: s.partition_policy,
            rate_cap: s.rate_cap,
            concurrency: s.concurrency,
            failure_mode: s.failure_mode,
            enabled: s.enabled,
            shadow_mode: flags.shadow_mode,
            detailed_metric: flags.detailed_metric,
            name,
            replaces: replaces_at.iter().map(|(n, _, _)| n.clone()).collect(),
            max_settle_overage_ppm: s.max_settle_overage_ppm,
            algorithm: s.algorithm,
            rlqs_fallback_units: s.rlqs_fallback_units,
        };
        Some(RuleDef {
            spec,
            replaces_at,
            quota_mode: flags.quota_mode,
            metadata: None,
        })
    }

    /// `rate_limit.unit`: `None` when invalid (reported), `Some(None)` when empty.
    fn unit(&mut self, f: &Field<'_>) -> Option<Option<(Duration, Pos)>> {
        let unit = self.string(f)?;
        if unit.is_empty() {
            return Some(None);
        }
        match rate_limit_unit(&unit) {
            Some(len) => Some(Some((len, f.value.pos))),
            None => {
                let message =
                    format!("invalid rate limit unit '{unit}' (expected {RATE_LIMIT_UNITS_HELP})");
                self.err(f.value.pos, &f.path, message);
                None
            }
        }
    }

    /// The quota of a counted rule: `requests_per_unit` per window, the window coming from
    /// exactly one of `rate_limit.unit` and `allot.window`.
    fn quota(
        &mut self,
        rate_limit: &Field<'_>,
        rl: &Fields<'_>,
        unit: Option<Option<Option<(Duration, Pos)>>>,
        window: Window,
    ) -> Option<Quota> {
        let units = match rl.get("requests_per_unit") {
            // 0 is a valid quota that admits nothing: envoyproxy/ratelimit uses it to ban a value.
            Some(f) => self.whole(f, 0),
            None => {
                let message = "rate_limit has neither requests_per_unit nor unlimited: true";
                let path = rate_limit.path.key("requests_per_unit");
                self.err(rate_limit.key_pos, &path, message.into());
                None
            }
        };
        let window = match window {
            Window::Valid(window) => window,
            Window::Invalid => return None,
        };
        let window = match (unit, window) {
            // An invalid unit was reported already.
            (Some(None), _) => None,
            (Some(Some(Some((_, unit_pos)))), Some((_, window_pos))) => {
                let message = format!(
                    "unit conflicts with allot.window (at line {window_pos}): set the window in one place"
                );
                self.err(unit_pos, &rate_limit.path.key("unit"), message);
                None
            }
            (Some(Some(Some((len, _)))), None) => Some(len),
            (_, Some((len, _))) => Some(len),
            (None | Some(Some(None)), None) => {
                let message = format!(
                    "missing rate limit unit (expected {RATE_LIMIT_UNITS_HELP}, or an allot.window)"
                );
                let path = rate_limit.path.key("unit");
                self.err(rate_limit.key_pos, &path, message);
                None
            }
        };
        Some(Quota::Units {
            units: units?,
            window: crate::time::Window::new(window?),
        })
    }

    /// An unlimited rule counts nothing, so anything that shapes counting is a mistake.
    fn check_unlimited(
        &mut self,
        rl: &Fields<'_>,
        allot: Option<&Fields<'_>>,
        unit: Option<(Duration, Pos)>,
    ) {
        if let (Some((_, pos)), Some(f)) = (unit, rl.get("unit")) {
            let message = "should not specify rate limit unit when unlimited".to_owned();
            self.err(pos, &f.path, message);
        }
        if let Some(f) = rl.get("requests_per_unit") {
            let message = "should not specify requests_per_unit when unlimited".to_owned();
            self.err(f.key_pos, &f.path, message);
        }
        for f in allot.map_or(&[][..], |a| &a.0) {
            if !ALLOT_KEYS_FOR_UNLIMITED.contains(&f.name) {
                let message = format!("allot.{} has no effect on an unlimited rule", f.name);
                self.err(f.key_pos, &f.path, message);
            }
        }
    }

    /// `rate_limit.replaces`: the names with where they were written.
    fn replaces(&mut self, rl: &Fields<'_>, own: Option<&str>) -> Vec<(String, Pos, String)> {
        let Some(field) = rl.get("replaces") else {
            return Vec::new();
        };
        let mut names = Vec::new();
        for (i, node) in self.list(field).iter().enumerate() {
            let path = field.path.index(i);
            let Some(entry) = self.mapping(node, &path, "a replaces entry", REPLACES_KEYS) else {
                continue;
            };
            let name = entry.get("name").and_then(|f| self.string(f));
            let pos = entry.get("name").map_or(node.pos, |f| f.value.pos);
            let path = path.key("name");
            match name {
                None => {}
                Some(name) if name.is_empty() => {
                    let message = "should not have an empty replaces entry".to_owned();
                    self.err(pos, &path, message);
                }
                Some(name) if Some(name.as_str()) == own => {
                    let message =
                        format!("replaces should not contain name of same descriptor ('{name}')");
                    self.err(pos, &path, message);
                }
                Some(name) => names.push((name, pos, path.0)),
            }
        }
        names
    }

    fn flag(&mut self, fields: &Fields<'_>, key: &str) -> bool {
        fields
            .get(key)
            .and_then(|f| self.boolean(f))
            .unwrap_or(false)
    }
}

/// A descriptor's envoyproxy/ratelimit flags, read (and type-checked) with or without a rule.
#[derive(Clone, Copy)]
struct Flags {
    shadow_mode: bool,
    detailed_metric: bool,
    quota_mode: bool,
}

/// `allot.window` as far as the quota is concerned.
enum Window {
    /// Absent (`None`) or valid.
    Valid(Option<(Duration, Pos)>),
    /// Written but invalid, already reported.
    Invalid,
}

/// The `allot` block, defaults filled in.
struct Settings {
    window: Option<(Duration, Pos)>,
    consistency: Consistency,
    weights: RegionWeights,
    partition_policy: PartitionPolicy,
    rate_cap: Option<RateCap>,
    concurrency: Option<ConcurrencyCap>,
    failure_mode: FailureMode,
    enabled: bool,
    max_settle_overage_ppm: u64,
    algorithm: Algorithm,
    rlqs_fallback_units: u64,
}

impl Walk<'_> {
    fn settings(&mut self, allot: &Fields<'_>) -> Settings {
        let window = allot
            .get("window")
            .and_then(|f| Some((self.window(f)?, f.value.pos)));
        let consistency = allot.get("consistency").and_then(|f| {
            let options = [
                ("strict", Consistency::Strict),
                ("eventual", Consistency::Eventual),
            ];
            self.choice(f, &options)
        });
        let weights = allot.get("weights").and_then(|f| self.weights(f));
        let partition_policy = allot
            .get("partition_policy")
            .and_then(|f| self.partition_policy(f));
        let rate_cap = allot
            .get("rate_cap")
            .and_then(|f| self.rate_cap(f.value, &f.path, "rate_cap"));
        let concurrency = allot.get("concurrency").and_then(|f| self.concurrency(f));
        let failure_mode = allot.get("failure_mode").and_then(|f| {
            let options = [("open", FailureMode::Open), ("closed", FailureMode::Closed)];
            self.choice(f, &options)
        });
        let enabled = allot.get("enabled").and_then(|f| self.boolean(f));
        let max_settle_overage_ppm = allot
            .get("max_settle_overage")
            .and_then(|f| self.settle_overage(f));
        let algorithm = allot.get("algorithm").and_then(|f| self.algorithm(f));
        let rlqs_fallback_units = allot
            .get("rlqs_fallback_units")
            .and_then(|f| self.rlqs_fallback_units(f));
        Settings {
            window,
            consistency: consistency.unwrap_or_default(),
            weights: weights.unwrap_or_default(),
            partition_policy: partition_policy.unwrap_or_default(),
            rate_cap,
            concurrency,
            failure_mode: failure_mode.unwrap_or_default(),
            enabled: enabled.unwrap_or(true),
            max_settle_overage_ppm: max_settle_overage_ppm
                .unwrap_or(DEFAULT_MAX_SETTLE_OVERAGE_PPM),
            algorithm: algorithm.unwrap_or_default(),
            rlqs_fallback_units: rlqs_fallback_units.unwrap_or(0),
        }
    }

    /// `rlqs_fallback_units: 20`: the most the Envoys of one region admit of one key in one
    /// window outside their assignments (D69), a whole number of units.
    fn rlqs_fallback_units(&mut self, f: &Field<'_>) -> Option<u64> {
        let units = self.whole(f, 0)?;
        if units > MAX_RLQS_FALLBACK_UNITS {
            let message = format!("rlqs_fallback_units {units} is above {MAX_RLQS_FALLBACK_UNITS}");
            self.err(f.value.pos, &f.path, message);
            return None;
        }
        Some(units)
    }

    /// `algorithm: fixed_window | sliding_window` (docs/decisions.md, D54 and, in eventual
    /// mode, D83).
    fn algorithm(&mut self, f: &Field<'_>) -> Option<Algorithm> {
        let options = [
            ("fixed_window", Algorithm::FixedWindow),
            ("sliding_window", Algorithm::SlidingWindow),
        ];
        self.choice(f, &options)
    }

    /// `max_settle_overage: 0.5`: a ratio of the reservation with at most six decimals, kept
    /// in parts per million.
    fn settle_overage(&mut self, f: &Field<'_>) -> Option<u64> {
        let help = "a ratio of the reservation such as 0.5";
        let ppm = match &f.value.kind {
            Kind::Scalar {
                text,
                quoted: false,
            } if matches!(resolve_plain(text), Plain::Int(_) | Plain::Float) => {
                parse_weight_ppm(text).map_err(|_| {
                    format!(
                        "max_settle_overage must be {help} (at most six decimals), found {text}"
                    )
                })
            }
            _ => Err(format!(
                "max_settle_overage must be {help}, found {}",
                f.value.describe()
            )),
        };
        let problem = match ppm {
            Ok(ppm) if ppm <= MAX_SETTLE_OVERAGE_PPM => return Some(ppm),
            Ok(ppm) => format!(
                "max_settle_overage {} is above {}",
                format_ppm(ppm),
                format_ppm(MAX_SETTLE_OVERAGE_PPM)
            ),
            Err(message) => message,
        };
        self.err(f.value.pos, &f.path, problem);
        None
    }

    fn window(&mut self, f: &Field<'_>) -> Option<Duration> {
        let window = self.duration(f)?;
        let problem = if window < MIN_WINDOW {
            "shorter than 1ms"
        } else if window > MAX_WINDOW {
            "longer than a year (365d)"
        } else {
            return Some(window);
        };
        let text = super::units::format_duration(window);
        self.err(f.value.pos, &f.path, format!("window {text} is {problem}"));
        None
    }

    /// `weights: { region: share, ... }`, shares in [0, 1] adding up to at most 1.
    fn weights(&mut self, f: &Field<'_>) -> Option<RegionWeights> {
        let Kind::Map(entries) = &f.value.kind else {
            let found = f.value.describe();
            let message = format!("weights must be a mapping of region to share, found {found}");
            self.err(f.value.pos, &f.path, message);
            return None;
        };
        let errors_before = self.errors.len();
        let mut ppm: BTreeMap<RegionId, u32> = BTreeMap::new();
        let mut first_at: BTreeMap<&str, Pos> = BTreeMap::new();
        for (key, value) in entries {
            let Some(region) = key.as_yaml_str() else {
                let message = format!("region is not a string: {}", key.describe());
                self.err(key.pos, &f.path, message);
                continue;
            };
            let path = f.path.key(region);
            if region.is_empty() || region.contains(|c: char| c.is_whitespace() || c == '/') {
                let message = format!("invalid region name '{region}'");
                self.err(key.pos, &path, message);
                continue;
            }
            if let Some(first) = first_at.insert(region, key.pos) {
                let message = format!("duplicate key '{region}' (first at line {first})");
                self.err(key.pos, &path, message);
                continue;
            }
            let share = match &value.kind {
                Kind::Scalar {
                    text,
                    quoted: false,
                } if matches!(resolve_plain(text), Plain::Int(_) | Plain::Float) => {
                    parse_weight_ppm(text)
                }
                _ => Err(format!(
                    "expected a number between 0 and 1, found {}",
                    value.describe()
                )),
            };
            match share {
                Ok(share) if share > WEIGHT_SCALE_PPM => {
                    let share = format_ppm(share);
                    let message = format!("weight {share} for region '{region}' is above 1");
                    self.err(value.pos, &path, message);
                }
                // At most one million, so it fits.
                Ok(share) => {
                    ppm.insert(RegionId::from(region), share as u32);
                }
                Err(message) => self.err(value.pos, &path, message),
            }
        }
        if self.errors.len() > errors_before {
            return None;
        }
        match RegionWeights::new(ppm) {
            Ok(weights) => Some(weights),
            Err(e) => {
                let total = format_ppm(e.total_ppm);
                let message = format!("region weights add up to {total}, above 1");
                self.err(f.value.pos, &f.path, message);
                None
            }
        }
    }

    /// `floor`, `closed`, or `{ open: { rate: ..., burst: ... } }`.
    fn partition_policy(&mut self, f: &Field<'_>) -> Option<PartitionPolicy> {
        let help = "expected floor, closed or { open: { rate: 100/s, burst: 10 } }";
        if let Kind::Map(_) = f.value.kind {
            let m = self.mapping(f.value, &f.path, "partition_policy", PARTITION_POLICY_KEYS)?;
            let Some(open) = m.get("open") else {
                let message = format!("partition_policy mapping needs 'open' ({help})");
                self.err(f.value.pos, &f.path, message);
                return None;
            };
            let rate = self.rate_cap(open.value, &open.path, "open")?;
            return Some(PartitionPolicy::Open { rate });
        }
        let policy = self.string(f)?;
        let message = match policy.to_ascii_lowercase().as_str() {
            "floor" => return Some(PartitionPolicy::Floor),
            "closed" => return Some(PartitionPolicy::Closed),
            "open" => format!("partition policy open needs a rate cap ({help})"),
            _ => format!("invalid partition_policy '{policy}' ({help})"),
        };
        self.err(f.value.pos, &f.path, message);
        None
    }

    /// `{ rate: 100/minute, burst: 20 }`.
    fn rate_cap(&mut self, node: &Node, path: &Path, what: &str) -> Option<RateCap> {
        let m = self.mapping(node, path, what, RATE_CAP_KEYS)?;
        let Some(rate_field) = m.get("rate") else {
            let message = format!("{what} needs a rate, such as 100/s or 100/minute");
            self.err(node.pos, &path.key("rate"), message);
            return None;
        };
        let rate = self.string(rate_field).and_then(|text| {
            parse_rate(&text)
                .map_err(|message| self.err(rate_field.value.pos, &rate_field.path, message))
                .ok()
        });
        let burst = match m.get("burst") {
            Some(f) => self.positive(f),
            None => Some(DEFAULT_BURST_UNITS),
        };
        let rate = rate?;
        Some(RateCap {
            units: rate.units,
            per: rate.per,
            burst: burst?,
        })
    }

    /// `{ max_slots: 10, slot_ttl: 30s }`.
    fn concurrency(&mut self, f: &Field<'_>) -> Option<ConcurrencyCap> {
        let m = self.mapping(f.value, &f.path, "concurrency", CONCURRENCY_KEYS)?;
        let Some(max_field) = m.get("max_slots") else {
            let message = "concurrency needs max_slots (the most requests in flight)".to_owned();
            self.err(f.value.pos, &f.path.key("max_slots"), message);
            return None;
        };
        let max_slots = self.positive(max_field).and_then(|max| {
            u32::try_from(max)
                .map_err(|_| {
                    let message = format!("max_slots {max} is above {}", u32::MAX);
                    self.err(max_field.value.pos, &max_field.path, message);
                })
                .ok()
        });
        let slot_ttl = match m.get("slot_ttl") {
            None => Some(DEFAULT_SLOT_TTL),
            Some(ttl) => self.duration(ttl).filter(|d| {
                if d.is_zero() {
                    let message = "slot_ttl must be longer than zero".to_owned();
                    self.err(ttl.value.pos, &ttl.path, message);
                }
                !d.is_zero()
            }),
        };
        Some(ConcurrencyCap {
            max_slots: max_slots?,
            slot_ttl: slot_ttl?,
        })
    }
}

/// Readers for one field each: they report a value of the wrong type and return `None`.
impl<'n> Walk<'_> {
    fn mapping(
        &mut self,
        node: &'n Node,
        path: &Path,
        what: &str,
        allowed: &[&'static str],
    ) -> Option<Fields<'n>> {
        let Kind::Map(entries) = &node.kind else {
            let message = format!("{what} must be a mapping, found {}", node.describe());
            self.err(node.pos, path, message);
            return None;
        };
        let mut fields: Vec<Field<'n>> = Vec::new();
        for (key, value) in entries {
            let Some(name) = key.as_yaml_str() else {
                let message = format!("key is not of type string: {}", key.describe());
                self.err(key.pos, path, message);
                continue;
            };
            let Some(known) = allowed.iter().copied().find(|a| *a == name) else {
                self.err(key.pos, &path.key(name), unknown_key(name, allowed));
                continue;
            };
            if let Some(first) = fields.iter().find(|f| f.name == known) {
                let message = format!("duplicate key '{name}' (first at line {})", first.key_pos);
                self.err(key.pos, &path.key(name), message);
                continue;
            }
            fields.push(Field {
                name: known,
                key_pos: key.pos,
                value,
                path: path.key(name),
            });
        }
        Some(Fields(fields))
    }

    fn list(&mut self, f: &Field<'n>) -> &'n [Node] {
        match &f.value.kind {
            Kind::Seq(items) => items,
            _ if f.value.is_null() => &[],
            _ => {
                let message = format!("{} must be a list, found {}", f.name, f.value.describe());
                self.err(f.value.pos, &f.path, message);
                &[]
            }
        }
    }
}

impl Walk<'_> {
    /// Any scalar reads as its text (`value: 200` is "200", as in envoyproxy/ratelimit);
    /// an empty value reads as "".
    fn string(&mut self, f: &Field<'_>) -> Option<String> {
        match &f.value.kind {
            _ if f.value.is_null() => Some(String::new()),
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => {
                let message = format!("expected a string, found {}", f.value.describe());
                self.err(f.value.pos, &f.path, message);
                None
            }
        }
    }

    /// `true`/`false`, and the YAML 1.1 spellings envoyproxy/ratelimit's parser also takes.
    fn boolean(&mut self, f: &Field<'_>) -> Option<bool> {
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &f.value.kind
        {
            if let Plain::Bool(b) = resolve_plain(text) {
                return Some(b);
            }
            match text.as_str() {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => return Some(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => return Some(false),
                _ => {}
            }
        }
        let message = format!("expected true or false, found {}", f.value.describe());
        self.err(f.value.pos, &f.path, message);
        None
    }

    /// A whole number of at least 1.
    fn positive(&mut self, f: &Field<'_>) -> Option<u64> {
        self.whole(f, 1)
    }

    /// A whole number of at least `min`.
    fn whole(&mut self, f: &Field<'_>, min: i128) -> Option<u64> {
        let name = f.name;
        let message = match &f.value.kind {
            Kind::Scalar {
                text,
                quoted: false,
            } => match resolve_plain(text) {
                Plain::Int(Some(n)) if n >= min => match u64::try_from(n) {
                    Ok(n) => return Some(n),
                    Err(_) => format!("{name} {text} is too large (at most {})", u64::MAX),
                },
                Plain::Int(Some(n)) => format!("{name} must be at least {min}, found {n}"),
                Plain::Int(None) => format!("{name} {text} is too large (at most {})", u64::MAX),
                Plain::Float => format!("{name} must be a whole number, found {text}"),
                _ => format!("{name} must be an integer, found {}", f.value.describe()),
            },
            _ => format!("{name} must be an integer, found {}", f.value.describe()),
        };
        self.err(f.value.pos, &f.path, message);
        None
    }

    fn duration(&mut self, f: &Field<'_>) -> Option<Duration> {
        let text = match &f.value.kind {
            Kind::Scalar { text, .. } if !f.value.is_null() => text,
            _ => {
                let found = f.value.describe();
                let message = format!("expected a duration such as 90s, found {found}");
                self.err(f.value.pos, &f.path, message);
                return None;
            }
        };
        parse_duration(text)
            .map_err(|message| self.err(f.value.pos, &f.path, message))
            .ok()
    }

    /// One of a few words, matched case-insensitively.
    fn choice<T: Copy>(&mut self, f: &Field<'_>, options: &[(&str, T)]) -> Option<T> {
        let word = self.string(f)?;
        if let Some((_, value)) = options.iter().find(|(w, _)| w.eq_ignore_ascii_case(&word)) {
            return Some(*value);
        }
        let names: Vec<&str> = options.iter().map(|(w, _)| *w).collect();
        let message = format!(
            "invalid {} '{word}' (expected {})",
            f.name,
            names.join(" or ")
        );
        self.err(f.value.pos, &f.path, message);
        None
    }
}

/// "unknown key" with the most useful hint: where the key belongs, a near spelling, or the
/// list of keys valid here.
fn unknown_key(name: &str, allowed: &[&str]) -> String {
    const HOMES: [(&[&str], &str); 5] = [
        (RATE_LIMIT_KEYS, "rate_limit"),
        (ALLOT_KEYS, "an allot block"),
        (DESCRIPTOR_KEYS, "a descriptor"),
        (RATE_CAP_KEYS, "a rate_cap"),
        (CONCURRENCY_KEYS, "allot.concurrency"),
    ];
    if let Some((_, home)) = HOMES.iter().find(|(keys, _)| keys.contains(&name)) {
        return format!("unknown key '{name}' here (it belongs in {home})");
    }
    if let Some(near) = allowed.iter().find(|a| edit_distance(a, name) <= 2) {
        return format!("unknown key '{name}' (did you mean '{near}'?)");
    }
    format!(
        "unknown key '{name}' (expected one of: {})",
        allowed.join(", ")
    )
}

/// Levenshtein distance; keys are short, so the quadratic table is tiny.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_get_a_suggestion() {
        assert_eq!(edit_distance("rate_limt", "rate_limit"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(
            unknown_key("ratelimit", DESCRIPTOR_KEYS),
            "unknown key 'ratelimit' (did you mean 'rate_limit'?)"
        );
        assert_eq!(
            unknown_key("unit", DESCRIPTOR_KEYS),
            "unknown key 'unit' here (it belongs in rate_limit)"
        );
        assert!(unknown_key("zzz", ROOT_KEYS).contains("expected one of: domain, descriptors"));
    }
}
