//! `allot check-config`: load limits files the way the daemons will, then print one line per
//! rule, or every error.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use allot_agent::limits::read_limits_file;
use allot_core::config::{
    ConfigError, LimitsConfig, LoadOptions, Rule, SourceFile, format_duration,
};
use allot_core::limit::{Consistency, Quota};

/// Loads `files`; prints the rules to stdout and exits 0, or prints every error to stderr
/// (unreadable files first, then the loader's errors in file order) and exits 1.
pub fn run(files: &[PathBuf], merge_domains: bool) -> ExitCode {
    let mut unreadable = Vec::new();
    let mut texts = Vec::new();
    for path in files {
        let name = path.display().to_string();
        match read_limits_file(path) {
            Ok(text) => texts.push((name, text)),
            Err(problem) => unreadable.push(ConfigError::file(&name, problem)),
        }
    }
    let sources: Vec<SourceFile<'_>> = texts
        .iter()
        .map(|(name, text)| SourceFile::new(name, text))
        .collect();
    let loaded = LimitsConfig::load(&sources, &LoadOptions { merge_domains });
    match (loaded, unreadable.is_empty()) {
        (Ok(config), true) => print_rules(&config, files.len()),
        (Ok(_), false) => print_errors(unreadable.iter(), 0),
        (Err(errors), _) => print_errors(unreadable.iter().chain(errors.iter()), errors.omitted()),
    }
}

fn print_rules(config: &LimitsConfig, file_count: usize) -> ExitCode {
    let mut out = io::stdout().lock();
    for rule in config.rules() {
        if writeln!(out, "{}", rule_line(rule)).is_err() {
            // stdout closed (e.g. piped into `head`): nothing more to say.
            return ExitCode::SUCCESS;
        }
    }
    eprintln!(
        "ok: {} in {} from {}",
        counted(config.rules().len(), "rule"),
        counted(config.domains().len(), "domain"),
        counted(file_count, "file"),
    );
    ExitCode::SUCCESS
}

fn print_errors<'a>(errors: impl Iterator<Item = &'a ConfigError>, omitted: usize) -> ExitCode {
    let mut err = io::stderr().lock();
    let mut count = 0;
    for e in errors {
        count += 1;
        let _ = writeln!(err, "{e}");
    }
    if omitted > 0 {
        let _ = writeln!(err, "... and {omitted} more errors");
    }
    let _ = writeln!(err, "check-config: {}", counted(count + omitted, "error"));
    ExitCode::FAILURE
}

/// `domain=D descriptor=P quota=N window=W mode=M`, plus `sliding_window`, `shadow`,
/// `disabled`, `quota_mode` and `metadata` when set.
/// Values with spaces or quotes are quoted, so each line splits on spaces.
pub fn rule_line(rule: &Rule) -> String {
    let (quota, window, mode) = match rule.spec.quota {
        Quota::Unlimited => ("unlimited".to_owned(), "-".to_owned(), "-"),
        Quota::Units { units, window } => {
            let mode = match rule.spec.consistency {
                Consistency::Strict => "strict",
                Consistency::Eventual => "eventual",
            };
            (units.to_string(), format_duration(window.len()), mode)
        }
    };
    let mut line = format!(
        "domain={} descriptor={} quota={quota} window={window} mode={mode}",
        quoted(&rule.domain),
        quoted(&rule.descriptor_path()),
    );
    if rule.spec.is_sliding() {
        line.push_str(" sliding_window");
    }
    if rule.spec.shadow_mode {
        line.push_str(" shadow");
    }
    if !rule.spec.enabled {
        line.push_str(" disabled");
    }
    if rule.quota_mode {
        line.push_str(" quota_mode");
    }
    if rule.metadata.is_some() {
        line.push_str(" metadata");
    }
    line
}

/// `1 rule`, `2 rules`.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn quoted(value: &str) -> String {
    if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '"') {
        let mut q = String::new();
        let _ = write!(q, "{value:?}");
        q
    } else {
        value.to_owned()
    }
}
