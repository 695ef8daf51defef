//! The limits loader: the files `allot check-config` and the agent read, loaded as both load
//! them (`LimitsConfig::load`, then the agent's `limits::load_cluster` on a success), every
//! error formatted as they print it, and each loaded rule matched by a request naming its own
//! descriptor path.
//!
//! Input: the first byte's low bit turns domain merging on; the rest is up to
//! `MAX_FILES` files separated by NUL bytes. A file that is not UTF-8 ends the run (both
//! readers refuse it before the loader sees it).

#![no_main]

use allot_core::config::{LimitsConfig, LoadOptions, SourceFile, ValuePattern};
use allot_core::sync::{ConfigFile, ConfigFiles};
use libfuzzer_sys::fuzz_target;

/// Most files one input is split into.
const MAX_FILES: usize = 4;

/// The agent's default `near_limit_ratio`.
const NEAR_LIMIT_RATIO: f64 = 0.8;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let merge_domains = flags & 1 == 1;
    let mut texts = Vec::new();
    for part in rest.splitn(MAX_FILES, |&b| b == 0) {
        let Ok(text) = std::str::from_utf8(part) else {
            return;
        };
        texts.push(text);
    }
    let names: Vec<String> = (0..texts.len())
        .map(|i| format!("limits-{i}.yaml"))
        .collect();
    let sources: Vec<SourceFile<'_>> = names
        .iter()
        .zip(&texts)
        .map(|(name, text)| SourceFile::new(name, text))
        .collect();
    match LimitsConfig::load(&sources, &LoadOptions { merge_domains }) {
        Err(errors) => {
            for e in errors.iter() {
                let _ = e.to_string();
            }
        }
        Ok(config) => {
            for rule in config.rules() {
                let entries: Vec<(String, String)> = rule
                    .descriptor
                    .iter()
                    .map(|e| {
                        let value = match &e.value {
                            ValuePattern::Any => "any".to_owned(),
                            ValuePattern::Exact(v) => v.clone(),
                            ValuePattern::Wildcard(g) => g.to_string(),
                        };
                        (e.key.clone(), value)
                    })
                    .collect();
                let _ = config.match_request(&rule.domain, &[entries]);
                let _ = rule.descriptor_path();
            }
            let files = ConfigFiles {
                version: 1,
                merge_domains,
                files: names
                    .iter()
                    .zip(&texts)
                    .map(|(name, text)| ConfigFile {
                        name: name.clone(),
                        text: (*text).to_owned(),
                    })
                    .collect(),
            };
            let loaded = allot_agent::limits::load_cluster(&files, NEAR_LIMIT_RATIO);
            assert!(
                loaded.is_ok(),
                "files that load on their own fail to load as the cluster's: {:?}",
                loaded.err()
            );
        }
    }
});
