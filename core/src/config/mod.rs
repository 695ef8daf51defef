//! Limits configuration: envoyproxy/ratelimit YAML files, plus allot's optional `allot:` block,
//! loaded into [`LimitSpec`]s, and request descriptors matched to them as Envoy's rate limit
//! service does it.
//!
//! The loader does no IO: it takes `(file name, text)` pairs ([`SourceFile`]) and returns
//! either a [`LimitsConfig`] or every problem in every file ([`ConfigErrors`]), each naming the
//! file, the line and column, the path inside the document and the problem. `docs/config.md`
//! is the user's description of the schema.
//!
//! Files by concern:
//! - `yaml`: the YAML text as a tree of nodes that keep their positions;
//! - `schema`: the file schema, field by field, into descriptor definitions;
//! - `units`: durations, rates and weights as written;
//! - `load`: joining files by domain, and the checks that need all of them;
//! - `matcher`: descriptor matching and counter keys;
//! - `glob`: value wildcards (`/api/*/action`);
//! - `model`, `errors`: the public types.

mod errors;
mod glob;
mod load;
mod matcher;
mod model;
mod schema;
mod units;
mod yaml;

#[cfg(test)]
mod compat_tests;
#[cfg(test)]
mod tests;

pub use errors::{ConfigError, ConfigErrors, Location, MAX_REPORTED_ERRORS};
pub use glob::Glob;
pub use matcher::{Matched, RequestEntry};
pub use model::{LoadOptions, Metadata, MetadataValue, Rule, RuleEntry, SourceFile, ValuePattern};
pub use schema::{DEFAULT_BURST_UNITS, DEFAULT_SLOT_TTL, MAX_WINDOW, MIN_WINDOW};
pub use units::{format_duration, parse_duration};
pub use yaml::{MAX_ALIAS_EXPANSION_NODES, MAX_NESTING_DEPTH};

use crate::ids::LimitId;
use crate::limit::LimitSpec;

use matcher::{FixedHashMap, Level};

/// The shipped default limits file (`examples/limits/default.yaml`), for daemons started
/// without one.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../examples/limits/default.yaml");

/// The name [`LimitsConfig::embedded_default`] gives [`EMBEDDED_DEFAULT`] in errors.
pub const EMBEDDED_DEFAULT_NAME: &str = "<embedded default>";

/// A loaded, valid set of limits files.
#[derive(Clone, Debug)]
pub struct LimitsConfig {
    /// In the order written: files in load order, each depth-first.
    rules: Vec<Rule>,
    by_id: FixedHashMap<LimitId, usize>,
    domains: FixedHashMap<Box<str>, Level>,
}

impl LimitsConfig {
    /// Loads a set of files, or returns every error found in them (in file order, then line
    /// and column order).
    pub fn load(files: &[SourceFile<'_>], opts: &LoadOptions) -> Result<Self, ConfigErrors> {
        load::load(files, opts)
    }

    /// Loads [`EMBEDDED_DEFAULT`].
    pub fn embedded_default() -> Result<Self, ConfigErrors> {
        let file = SourceFile::new(EMBEDDED_DEFAULT_NAME, EMBEDDED_DEFAULT);
        Self::load(&[file], &LoadOptions::default())
    }

    /// Every rule, in the order written (files in load order, each depth-first).
    pub fn rules(&self) -> impl ExactSizeIterator<Item = &Rule> {
        self.rules.iter()
    }

    pub fn rule(&self, id: &LimitId) -> Option<&Rule> {
        // Indices in `by_id` and in the trees come from `rules` as it was built: in bounds.
        self.by_id.get(id).map(|&i| &self.rules[i])
    }

    pub fn limit(&self, id: &LimitId) -> Option<&LimitSpec> {
        self.rule(id).map(|r| &r.spec)
    }

    /// The domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(|d| &**d).collect();
        names.sort_unstable();
        names
    }

    /// The rule one request descriptor (its ordered entries) matches in `domain`, with the
    /// counter key built from the request's values (and its metric value, when the rule
    /// reports values). `None` for an unknown domain, an empty descriptor, or no rule at the
    /// descriptor's last entry.
    pub fn match_descriptor<E: RequestEntry>(
        &self,
        domain: &str,
        entries: &[E],
    ) -> Option<Matched<'_>> {
        let top = self.domains.get(domain)?;
        let (index, flags) = matcher::find_rule(top, entries)?;
        let rule = &self.rules[index];
        let (key, metric_value) = matcher::describe(top, entries, flags, rule.spec.detailed_metric);
        Some(Matched {
            rule,
            key,
            metric_value,
        })
    }

    /// One answer per descriptor of a request, in order, after dropping the rules that
    /// another matched rule `replaces`.
    pub fn match_request<E, D>(&self, domain: &str, descriptors: &[D]) -> Vec<Option<Matched<'_>>>
    where
        E: RequestEntry,
        D: AsRef<[E]>,
    {
        let mut matches: Vec<Option<Matched<'_>>> = descriptors
            .iter()
            .map(|d| self.match_descriptor(domain, d.as_ref()))
            .collect();
        matcher::apply_replaces(&mut matches);
        matches
    }
}
