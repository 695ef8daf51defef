//! Loading a set of files: parse and walk each, then join them by domain, checking what only
//! the whole set can show (duplicate domains, duplicate descriptors across merged files,
//! `replaces` naming no rule, ambiguous limit ids).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::ids::LimitId;

use super::LimitsConfig;
use super::errors::{ConfigError, ConfigErrors, Location};
use super::matcher::{Conflict, FixedHashMap, Level};
use super::model::{LoadOptions, Rule, RuleEntry, SourceFile};
use super::schema::{DescriptorDef, FileDef, walk_file};
use super::yaml::{self, Pos};

pub(super) fn load(
    files: &[SourceFile<'_>],
    opts: &LoadOptions,
) -> Result<LimitsConfig, ConfigErrors> {
    let mut builder = Builder::default();
    for (index, source) in files.iter().enumerate() {
        let file: Arc<str> = source.name.into();
        let mut errors = Vec::new();
        match yaml::parse(source.text) {
            Ok(root) => {
                let def = walk_file(&file, root.as_ref(), &mut errors);
                builder.add_file(index, &file, def, opts, &mut errors);
            }
            Err(e) => errors.push(ConfigError::at(&file, e.pos, &e.path, e.message)),
        }
        builder
            .errors
            .extend(errors.into_iter().map(|e| (index, e)));
    }
    builder.check_replaces();
    builder.finish()
}

struct Domain {
    first_file: Arc<str>,
    top: Level,
    /// Every `rate_limit.name` in the domain, for checking `replaces`.
    names: BTreeSet<String>,
}

/// A `replaces` name, checked once every file of its domain is in.
struct Replaces {
    file_index: usize,
    file: Arc<str>,
    domain: String,
    name: String,
    pos: Pos,
    path: String,
}

#[derive(Default)]
struct Builder {
    domains: BTreeMap<String, Domain>,
    rules: Vec<Rule>,
    ids: BTreeMap<LimitId, Location>,
    replaces: Vec<Replaces>,
    errors: Vec<(usize, ConfigError)>,
}

/// What inserting one file's descriptors needs besides the level being filled.
struct Insert<'a> {
    file_index: usize,
    file: &'a Arc<str>,
    domain: &'a str,
    rules: &'a mut Vec<Rule>,
    ids: &'a mut BTreeMap<LimitId, Location>,
    names: &'a mut BTreeSet<String>,
    replaces: &'a mut Vec<Replaces>,
    errors: &'a mut Vec<ConfigError>,
}

impl Builder {
    fn add_file(
        &mut self,
        file_index: usize,
        file: &Arc<str>,
        def: FileDef,
        opts: &LoadOptions,
        errors: &mut Vec<ConfigError>,
    ) {
        let Some((domain_name, pos)) = def.domain else {
            return;
        };
        if let Some(existing) = self.domains.get(&domain_name)
            && !opts.merge_domains
        {
            let message = format!(
                "duplicate domain '{domain_name}' in config file (first loaded from {}; \
                 turn on domain merging to join them)",
                existing.first_file
            );
            errors.push(ConfigError::at(file, pos, "domain", message));
            return;
        }
        let domain = self
            .domains
            .entry(domain_name.clone())
            .or_insert_with(|| Domain {
                first_file: Arc::clone(file),
                top: Level::default(),
                names: BTreeSet::new(),
            });
        let mut insert = Insert {
            file_index,
            file,
            domain: &domain_name,
            rules: &mut self.rules,
            ids: &mut self.ids,
            names: &mut domain.names,
            replaces: &mut self.replaces,
            errors,
        };
        let mut chain = Vec::new();
        for descriptor in def.descriptors {
            insert.descriptor(&mut domain.top, descriptor, &mut chain);
        }
    }

    fn check_replaces(&mut self) {
        for r in &self.replaces {
            let known = self
                .domains
                .get(&r.domain)
                .is_some_and(|d| d.names.contains(&r.name));
            if !known {
                let message = format!(
                    "replaces '{}', but no rule in domain '{}' has that name",
                    r.name, r.domain
                );
                let error = ConfigError::at(&r.file, r.pos, &r.path, message);
                self.errors.push((r.file_index, error));
            }
        }
    }

    fn finish(self) -> Result<LimitsConfig, ConfigErrors> {
        if !self.errors.is_empty() {
            return Err(ConfigErrors::collect(self.errors));
        }
        let mut by_id = FixedHashMap::default();
        for (index, rule) in self.rules.iter().enumerate() {
            by_id.insert(rule.spec.id.clone(), index);
        }
        // Ambiguous ids were rejected above, so each rule is found by its own id.
        assert_eq!(by_id.len(), self.rules.len(), "limit ids are unique");
        let mut domains = FixedHashMap::default();
        for (name, domain) in self.domains {
            domains.insert(name.into_boxed_str(), domain.top);
        }
        Ok(LimitsConfig {
            rules: self.rules,
            by_id,
            domains,
        })
    }
}

impl Insert<'_> {
    /// Adds a descriptor and its children under `level`; `chain` is the path above it.
    fn descriptor(&mut self, level: &mut Level, def: DescriptorDef, chain: &mut Vec<RuleEntry>) {
        let DescriptorDef {
            pos,
            path,
            entry,
            rule,
            children,
            share_threshold,
            value_to_metric,
        } = def;
        let here = Location::new(self.file, pos);
        chain.push(entry);
        let Some(entry) = chain.last() else {
            return;
        };
        match level.insert(entry, here.clone()) {
            Ok(node) => {
                node.share_threshold = share_threshold;
                node.value_to_metric = value_to_metric;
                if let Some(rule) = rule {
                    node.rule = self.rule(rule, chain, &here, &path);
                }
                for child in children {
                    self.descriptor(&mut node.children, child, chain);
                }
            }
            Err(conflict) => self.conflict(conflict, chain, pos, &path),
        }
        chain.pop();
    }

    fn rule(
        &mut self,
        rule: super::schema::RuleDef,
        chain: &[RuleEntry],
        here: &Location,
        path: &str,
    ) -> Option<usize> {
        let id = rule.spec.id.clone();
        if let Some(first) = self.ids.get(&id) {
            let message = format!(
                "limit id '{id}' is ambiguous: the rule at {first} has the same id \
                 ('/' or '=' inside a key or value)"
            );
            let pos = Pos {
                line: here.line,
                column: here.column,
            };
            self.errors
                .push(ConfigError::at(self.file, pos, path, message));
            return None;
        }
        self.ids.insert(id, here.clone());
        if let Some(name) = &rule.spec.name {
            self.names.insert(name.clone());
        }
        for (name, pos, path) in rule.replaces_at {
            self.replaces.push(Replaces {
                file_index: self.file_index,
                file: Arc::clone(self.file),
                domain: self.domain.to_owned(),
                name,
                pos,
                path,
            });
        }
        self.rules.push(Rule {
            domain: self.domain.to_owned(),
            descriptor: chain.to_vec(),
            spec: rule.spec,
            source: here.clone(),
            quota_mode: rule.quota_mode,
            metadata: rule.metadata,
        });
        Some(self.rules.len() - 1)
    }

    fn conflict(&mut self, conflict: Conflict, chain: &[RuleEntry], pos: Pos, path: &str) {
        let composite = super::model::limit_id(self.domain, chain);
        let message = match conflict {
            Conflict::Duplicate { first } => format!(
                "duplicate descriptor composite key '{composite}' (first defined at {first})"
            ),
            Conflict::Shadowed { pattern, at } => {
                let entry = chain.last().map(ToString::to_string).unwrap_or_default();
                format!(
                    "wildcard '{entry}' can never match: the wildcard '{pattern}' at {at} \
                     is tried first and matches every value it would"
                )
            }
        };
        self.errors
            .push(ConfigError::at(self.file, pos, path, message));
    }
}
