//! The loaded form of a limits configuration: rules, their descriptor paths and their ids.

use std::fmt;

use crate::ids::LimitId;
use crate::limit::LimitSpec;

use super::errors::Location;
use super::glob::Glob;

/// One configuration file handed to the loader: its name (used in every error) and its text.
/// The loader does no IO; whoever reads the files builds these.
#[derive(Clone, Copy, Debug)]
pub struct SourceFile<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

impl<'a> SourceFile<'a> {
    pub fn new(name: &'a str, text: &'a str) -> Self {
        SourceFile { name, text }
    }
}

/// How a set of files is loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files of the same domain merge into one domain instead of being rejected as duplicate
    /// domains (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`). Duplicate descriptors are still
    /// detected across the merged files.
    pub merge_domains: bool,
}

/// What a rule entry's value matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValuePattern {
    /// No `value`: any value, one counter per distinct value.
    Any,
    /// `value: foo`: exactly this value.
    Exact(String),
    /// A value with a `*` anywhere (`foo*`, `/api/*/action`, `foo*bar*baz`): each `*`
    /// matches any run of characters.
    Wildcard(Glob),
}

/// One level of a rule's descriptor path: a `key` and what its value matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleEntry {
    pub key: String,
    pub value: ValuePattern,
}

impl fmt::Display for RuleEntry {
    /// `key` for key-only entries, `key=value` otherwise, wildcards as written (`key=foo*`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            ValuePattern::Any => f.write_str(&self.key),
            ValuePattern::Exact(v) => write!(f, "{}={v}", self.key),
            ValuePattern::Wildcard(g) => write!(f, "{}={g}", self.key),
        }
    }
}

/// One rule of the configuration: a descriptor path in a domain that carries a `rate_limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub domain: String,
    /// The path from the domain's top level down to the descriptor holding the rule.
    pub descriptor: Vec<RuleEntry>,
    pub spec: LimitSpec,
    /// Where the descriptor was written.
    pub source: Location,
    /// envoyproxy/ratelimit's `quota_mode`: over its limit, this rule refuses a request only
    /// when every quota-mode descriptor of the request is over too (the answer's overall
    /// code); its own descriptor status still says over the limit.
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's `metadata`, kept as written; `None` when absent or empty.
    pub metadata: Option<Metadata>,
}

/// A descriptor's `metadata`: a mapping of anything, in the order written.
pub type Metadata = Vec<(String, MetadataValue)>;

/// One value inside `metadata`. Scalars keep their text as written; the type is what YAML
/// reads (envoyproxy/ratelimit turns them into a protobuf `Struct`: null, bool, number,
/// string, list, struct).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataValue {
    Null,
    Bool(bool),
    /// An integer or a float, as written.
    Number(String),
    String(String),
    List(Vec<MetadataValue>),
    Map(Metadata),
}

impl Rule {
    /// The descriptor path as it appears in the limit id: `api_key/route=orders_post`.
    pub fn descriptor_path(&self) -> String {
        join_entries(&self.descriptor)
    }
}

fn join_entries(entries: &[RuleEntry]) -> String {
    let mut path = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&entry.to_string());
    }
    path
}

/// `domain` then the rule's descriptor path: `public_api/api_key/route=orders_post`.
pub(crate) fn limit_id(domain: &str, entries: &[RuleEntry]) -> LimitId {
    LimitId::new(format!("{domain}/{}", join_entries(entries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_ids_follow_the_descriptor_path() {
        let entries = [
            RuleEntry {
                key: "api_key".into(),
                value: ValuePattern::Any,
            },
            RuleEntry {
                key: "route".into(),
                value: ValuePattern::Exact("orders_post".into()),
            },
            RuleEntry {
                key: "path".into(),
                value: ValuePattern::Wildcard(Glob::new("/v1/*").expect("a pattern")),
            },
        ];
        assert_eq!(
            limit_id("public_api", &entries).as_str(),
            "public_api/api_key/route=orders_post/path=/v1/*"
        );
    }
}
