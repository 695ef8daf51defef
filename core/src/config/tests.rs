//! Loading, rejection and matching tests for the limits configuration.
//!
//! Positions in the expectations are counted by hand from the test texts: lines from 1,
//! columns from 1 at the first character of the offending node.

use std::time::Duration;

use super::*;
use crate::ids::{LimitId, RegionId};
use crate::limit::{
    Algorithm, ConcurrencyCap, Consistency, FailureMode, PartitionPolicy, Quota, RateCap,
    RegionWeights,
};
use crate::time::Window;

fn load_files(files: &[(&str, &str)], merge_domains: bool) -> Result<LimitsConfig, ConfigErrors> {
    let sources: Vec<SourceFile<'_>> = files
        .iter()
        .map(|(name, text)| SourceFile::new(name, text))
        .collect();
    LimitsConfig::load(&sources, &LoadOptions { merge_domains })
}

fn load_ok(text: &str) -> LimitsConfig {
    match load_files(&[("limits.yaml", text)], false) {
        Ok(config) => config,
        Err(e) => panic!("expected the file to load, got:\n{e}"),
    }
}

fn errors_of(files: &[(&str, &str)], merge_domains: bool) -> Vec<String> {
    match load_files(files, merge_domains) {
        Ok(_) => panic!("expected errors, the files loaded"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

/// The only error of one file named `limits.yaml`.
fn only_error(text: &str) -> String {
    let errors = errors_of(&[("limits.yaml", text)], false);
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one error, got {errors:#?}"
    );
    errors.into_iter().next().unwrap_or_default()
}

fn spec<'a>(config: &'a LimitsConfig, id: &str) -> &'a LimitSpec {
    match config.limit(&LimitId::from(id)) {
        Some(spec) => spec,
        None => panic!(
            "no limit {id}; have {:?}",
            config
                .rules()
                .map(|r| r.spec.id.as_str())
                .collect::<Vec<_>>()
        ),
    }
}

fn units(count: u64, window: Duration) -> Quota {
    Quota::Units {
        units: count,
        window: Window::new(window),
    }
}

const MINUTE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Rejections: each names file, line:column, path and problem.
// ---------------------------------------------------------------------------------------------

#[test]
fn invalid_unit_is_reported_with_file_place_path_and_problem() {
    let text = "\
domain: api
descriptors:
  - key: route
    value: orders_post
    rate_limit:
      requests_per_unit: 5
      unit: fortnight
";
    // Line 7 is `      unit: fortnight`: six spaces and `unit: ` put the value at column 13.
    let errors = errors_of(&[("limits/api.yaml", text)], false);
    assert_eq!(
        errors,
        [
            "limits/api.yaml:7:13: descriptors[0].rate_limit.unit: invalid rate limit unit \
             'fortnight' (expected second, minute, hour, day, week, month or year)"
        ]
    );
}

#[test]
fn structured_errors_expose_each_part() {
    let text = "domain: api\ndescriptors:\n  - value: x\n";
    let Err(errors) = load_files(&[("a.yaml", text)], false) else {
        panic!("a descriptor without key must be rejected")
    };
    let e = errors.iter().next().expect("one error");
    assert_eq!(e.file_name(), "a.yaml");
    // The descriptor mapping starts at `value` on line 3, column 5.
    assert_eq!(e.line_column(), Some((3, 5)));
    assert_eq!(e.path(), "descriptors[0].key");
    assert_eq!(e.message(), "descriptor has empty key");
}

#[test]
fn missing_or_empty_domain_is_rejected() {
    let missing = "descriptors: []\n";
    assert_eq!(
        only_error(missing),
        "limits.yaml:1:1: domain: config file cannot have empty domain"
    );
    let empty = "domain: ''\ndescriptors: []\n";
    assert_eq!(
        only_error(empty),
        "limits.yaml:1:9: domain: config file cannot have empty domain"
    );
    assert_eq!(
        only_error(""),
        "limits.yaml:1:1: domain: config file cannot have empty domain"
    );
}

#[test]
fn duplicate_domain_across_files_is_rejected_in_the_later_file() {
    let a = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "# second file\ndomain: api\n";
    let errors = errors_of(&[("a.yaml", a), ("b.yaml", b)], false);
    assert_eq!(
        errors,
        [
            "b.yaml:2:9: domain: duplicate domain 'api' in config file (first loaded from a.yaml; \
          turn on domain merging to join them)"
        ]
    );
}

#[test]
fn merge_domains_joins_files_and_still_finds_duplicates_across_them() {
    let a = "domain: api\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: api\ndescriptors:\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let merged = load_files(&[("a.yaml", a), ("b.yaml", b)], true).expect("merge");
    assert_eq!(
        spec(&merged, "api/k1").quota,
        units(1, Duration::from_secs(1))
    );
    assert_eq!(spec(&merged, "api/k2").quota, units(2, MINUTE));
    assert_eq!(merged.domains(), ["api"]);

    let again = "domain: api\ndescriptors:\n  - key: k1\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let errors = errors_of(&[("a.yaml", a), ("c.yaml", again)], true);
    // `- key: k1` in c.yaml: the descriptor mapping starts at line 3, column 5.
    assert_eq!(
        errors,
        [
            "c.yaml:3:5: descriptors[0]: duplicate descriptor composite key 'api/k1' \
          (first defined at a.yaml:3:5)"
        ]
    );
}

#[test]
fn empty_key_is_rejected() {
    let text = "domain: api\ndescriptors:\n  - key: ''\n    value: v\n";
    assert_eq!(
        only_error(text),
        "limits.yaml:3:10: descriptors[0].key: descriptor has empty key"
    );
}

#[test]
fn duplicate_composite_key_is_rejected_at_any_depth() {
    let text = "\
domain: api
descriptors:
  - key: tenant
    descriptors:
      - key: route
        value: a
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: route
        value: a
        rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_eq!(
        only_error(text),
        "limits.yaml:8:9: descriptors[0].descriptors[1]: duplicate descriptor composite key \
         'api/tenant/route=a' (first defined at limits.yaml:5:9)"
    );
}

#[test]
fn replaces_naming_its_own_rule_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit:
      name: self
      unit: second
      requests_per_unit: 5
      replaces:
        - name: self
";
    assert_eq!(
        only_error(text),
        "limits.yaml:9:17: descriptors[0].rate_limit.replaces[0].name: replaces should not \
         contain name of same descriptor ('self')"
    );
}

#[test]
fn empty_replaces_entry_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 5
      replaces:
        - name: ''
";
    assert_eq!(
        only_error(text),
        "limits.yaml:8:17: descriptors[0].rate_limit.replaces[0].name: should not have an \
         empty replaces entry"
    );
}

#[test]
fn replaces_naming_no_rule_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 5
      replaces: [{name: genric}]
";
    // `[{name: genric}]` starts at column 17; `genric` at column 25.
    assert_eq!(
        only_error(text),
        "limits.yaml:7:25: descriptors[0].rate_limit.replaces[0].name: replaces 'genric', but \
         no rule in domain 'api' has that name"
    );
}

#[test]
fn misspelt_and_misplaced_keys_are_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    ratelimit:
      unit: second
";
    assert_eq!(
        only_error(text),
        "limits.yaml:4:5: descriptors[0].ratelimit: unknown key 'ratelimit' (did you mean \
         'rate_limit'?)"
    );
    let misplaced = "domain: api\ndescriptors:\n  - key: k\n    unit: second\n";
    assert_eq!(
        only_error(misplaced),
        "limits.yaml:4:5: descriptors[0].unit: unknown key 'unit' here (it belongs in rate_limit)"
    );
    let top = "domain: api\nsettings: {}\n";
    assert_eq!(
        only_error(top),
        "limits.yaml:2:1: settings: unknown key 'settings' (expected one of: domain, descriptors)"
    );
}

#[test]
fn non_string_keys_are_rejected() {
    // envoyproxy/ratelimit's own example of this mistake: a number where `domain` belongs.
    let text = "0.25: test-domain\ndescriptors: []\n";
    let errors = errors_of(&[("limits.yaml", text)], false);
    assert_eq!(
        errors,
        [
            "limits.yaml:1:1: (document): key is not of type string: the number 0.25",
            "limits.yaml:1:1: domain: config file cannot have empty domain",
        ]
    );
}

#[test]
fn unlimited_with_a_unit_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit:
      unlimited: true
      unit: minute
";
    assert_eq!(
        only_error(text),
        "limits.yaml:6:13: descriptors[0].rate_limit.unit: should not specify rate limit unit \
         when unlimited"
    );
}

#[test]
fn unlimited_with_counting_settings_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit: {unlimited: true, requests_per_unit: 5}
    allot:
      window: 90s
      enabled: false
";
    let errors = errors_of(&[("limits.yaml", text)], false);
    assert_eq!(
        errors,
        [
            "limits.yaml:4:35: descriptors[0].rate_limit.requests_per_unit: should not specify \
             requests_per_unit when unlimited",
            "limits.yaml:6:7: descriptors[0].allot.window: allot.window has no effect on an \
             unlimited rule",
        ]
    );
}

#[test]
fn region_weights_above_one_are_rejected() {
    let single = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    allot:
      weights: {us-east: 1.5}
";
    // `{us-east: 1.5}` opens at column 16; `1.5` is at column 26.
    assert_eq!(
        only_error(single),
        "limits.yaml:6:26: descriptors[0].allot.weights.us-east: weight 1.5 for region \
         'us-east' is above 1"
    );
    let sum = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    allot:
      weights:
        us-east: 0.5
        eu-west: 0.4
        ap-south: 0.2
";
    // 0.5 + 0.4 + 0.2 = 1.1; reported at the weights mapping (line 7, column 9).
    assert_eq!(
        only_error(sum),
        "limits.yaml:7:9: descriptors[0].allot.weights: region weights add up to 1.1, above 1"
    );
}

#[test]
fn malformed_yaml_is_reported_with_its_place() {
    let text = "domain: api\ndescriptors:\n  - key: k\n    value: [unclosed\n";
    // The parser notices at the end of the text (line 5, column 1), inside the list that
    // would have been `value`'s, where its second item was expected.
    assert_eq!(
        only_error(text),
        "limits.yaml:5:1: descriptors[0].value[1]: malformed YAML: while parsing a flow \
         sequence, expected ',' or ']'"
    );
}

#[test]
fn requests_per_unit_must_be_a_whole_number() {
    let case = |value: &str| {
        let text = format!(
            "domain: api\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: {value}\n"
        );
        only_error(&text)
    };
    // `      requests_per_unit: ` is 25 characters: values start at column 26.
    let prefix = "limits.yaml:6:26: descriptors[0].rate_limit.requests_per_unit: ";
    assert_eq!(
        case("-5"),
        format!("{prefix}requests_per_unit must be at least 0, found -5")
    );
    assert_eq!(
        case("1.5"),
        format!("{prefix}requests_per_unit must be a whole number, found 1.5")
    );
    assert_eq!(
        case("'10'"),
        format!("{prefix}requests_per_unit must be an integer, found the string \"10\"")
    );
    assert_eq!(
        case("[10]"),
        format!("{prefix}requests_per_unit must be an integer, found a list")
    );
    assert_eq!(
        case("99999999999999999999"),
        format!(
            "{prefix}requests_per_unit 99999999999999999999 is too large (at most {})",
            u64::MAX
        )
    );
}

#[test]
fn a_rate_limit_needs_a_quota_or_unlimited() {
    let text = "domain: api\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n";
    assert_eq!(
        only_error(text),
        "limits.yaml:4:5: descriptors[0].rate_limit.requests_per_unit: rate_limit has neither \
         requests_per_unit nor unlimited: true"
    );
    let empty = "domain: api\ndescriptors:\n  - key: k\n    rate_limit:\n";
    assert_eq!(
        only_error(empty),
        "limits.yaml:4:5: descriptors[0].rate_limit: rate_limit is empty: set requests_per_unit \
         and unit, or unlimited: true"
    );
    let no_unit = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 3}\n";
    assert_eq!(
        only_error(no_unit),
        "limits.yaml:4:5: descriptors[0].rate_limit.unit: missing rate limit unit (expected \
         second, minute, hour, day, week, month or year, or an allot.window)"
    );
}

#[test]
fn values_of_the_wrong_type_are_rejected() {
    let not_a_list = "domain: api\ndescriptors: {key: k}\n";
    assert_eq!(
        only_error(not_a_list),
        "limits.yaml:2:14: descriptors: descriptors must be a list, found a mapping"
    );
    // envoyproxy/ratelimit's example: a list of plain strings where descriptors belong.
    let list_of_strings = "domain: api\ndescriptors:\n  - a\n  - b\n";
    assert_eq!(
        errors_of(&[("limits.yaml", list_of_strings)], false),
        [
            "limits.yaml:3:5: descriptors[0]: a descriptor must be a mapping, found the string \"a\"",
            "limits.yaml:4:5: descriptors[1]: a descriptor must be a mapping, found the string \"b\"",
        ]
    );
    let rate_limit_string = "\
domain: api
descriptors:
  - key: k
    rate_limit: fast
    allot: {consistency: loose}
";
    // The allot block is still checked when the rate_limit beside it is unusable.
    assert_eq!(
        errors_of(&[("limits.yaml", rate_limit_string)], false),
        [
            "limits.yaml:4:17: descriptors[0].rate_limit: rate_limit must be a mapping, found \
             the string \"fast\"",
            "limits.yaml:5:26: descriptors[0].allot.consistency: invalid consistency 'loose' \
             (expected strict or eventual)",
        ]
    );
    let bad_flag = "\
domain: api
descriptors:
  - key: k
    shadow_mode: maybe
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        only_error(bad_flag),
        "limits.yaml:4:18: descriptors[0].shadow_mode: expected true or false, found the string \
         \"maybe\""
    );
    let key_list = "domain: api\ndescriptors:\n  - key: [a]\n";
    assert_eq!(
        only_error(key_list),
        "limits.yaml:3:10: descriptors[0].key: expected a string, found a list"
    );
}

#[test]
fn duplicate_keys_in_one_mapping_are_rejected() {
    let text = "\
domain: api
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 1
      unit: minute
";
    assert_eq!(
        only_error(text),
        "limits.yaml:7:7: descriptors[0].rate_limit.unit: duplicate key 'unit' (first at line 5:7)"
    );
}

#[test]
fn allot_window_and_unit_cannot_both_set_the_window() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    allot:
      window: 90m
";
    assert_eq!(
        only_error(text),
        "limits.yaml:4:24: descriptors[0].rate_limit.unit: unit conflicts with allot.window (at \
         line 6:15): set the window in one place"
    );
}

#[test]
fn allot_needs_a_rate_limit_beside_it() {
    let text = "domain: api\ndescriptors:\n  - key: k\n    allot: {enabled: false}\n";
    assert_eq!(
        only_error(text),
        "limits.yaml:4:5: descriptors[0].allot: allot settings need a rate_limit on the same \
         descriptor"
    );
}

#[test]
fn allot_settings_are_checked_field_by_field() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {requests_per_unit: 1000}
    allot:
      window: 0s
      consistency: eventually
      partition_policy: open
      rate_cap: {rate: 100/fortnight}
      concurrency: {slot_ttl: 10s}
      failure_mode: ajar
      windw: 1h
";
    let errors = errors_of(&[("limits.yaml", text)], false);
    assert_eq!(
        errors,
        [
            "limits.yaml:6:15: descriptors[0].allot.window: window 0s is shorter than 1ms",
            "limits.yaml:7:20: descriptors[0].allot.consistency: invalid consistency \
             'eventually' (expected strict or eventual)",
            "limits.yaml:8:25: descriptors[0].allot.partition_policy: partition policy open \
             needs a rate cap (expected floor, closed or { open: { rate: 100/s, burst: 10 } })",
            "limits.yaml:9:24: descriptors[0].allot.rate_cap.rate: invalid rate '100/fortnight' \
             (expected a rate such as 100/s, 100/minute or 100/10s)",
            "limits.yaml:10:20: descriptors[0].allot.concurrency.max_slots: concurrency needs \
             max_slots (the most requests in flight)",
            "limits.yaml:11:21: descriptors[0].allot.failure_mode: invalid failure_mode 'ajar' \
             (expected open or closed)",
            "limits.yaml:12:7: descriptors[0].allot.windw: unknown key 'windw' (did you mean \
             'window'?)",
        ]
    );
}

#[test]
fn a_wildcard_hidden_by_an_earlier_one_is_rejected() {
    let text = "\
domain: api
descriptors:
  - key: path
    value: /v1/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /v1/orders*
    rate_limit: {unit: second, requests_per_unit: 5}
";
    assert_eq!(
        only_error(text),
        "limits.yaml:6:5: descriptors[1]: wildcard 'path=/v1/orders*' can never match: the \
         wildcard '/v1/*' at limits.yaml:3:5 is tried first and matches every value it would"
    );
}

#[test]
fn wildcards_in_keys_are_rejected() {
    let text = "domain: api\ndescriptors:\n  - key: header*\n";
    assert_eq!(
        only_error(text),
        "limits.yaml:3:10: descriptors[0].key: wildcards apply to values only: key 'header*' \
         ends with '*' (put the pattern in value)"
    );
}

#[test]
fn ambiguous_limit_ids_are_rejected() {
    // Both rules would be `api/path=a/b`: a value with '/' against a nested key-only entry.
    let text = "\
domain: api
descriptors:
  - key: path
    value: a/b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_eq!(
        only_error(text),
        "limits.yaml:9:9: descriptors[1].descriptors[0]: limit id 'api/path=a/b' is ambiguous: \
         the rule at limits.yaml:3:5 has the same id ('/' or '=' inside a key or value)"
    );
}

#[test]
fn every_error_in_every_file_is_reported_in_order() {
    let a = "\
domain: a
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: -1}
  - key: ''
";
    let b = "domain: b\ndescriptors: [{key: x, rate_limit: {unit: minute}}], extra\n";
    let c = "domain: c\ndescriptors:\n  - key: k\n    shadow_mode: perhaps\n";
    let files = [("a.yaml", a), ("b.yaml", b), ("c.yaml", c)];
    let first = errors_of(&files, false);
    // a.yaml in line and column order (the unit at 4:24 before `requests_per_unit: -1` at 4:54,
    // though both sit in one flow mapping), then b.yaml (malformed at the `,` after `]`,
    // column 14 + 38), then c.yaml (the flag is checked even without a rule).
    assert_eq!(
        first,
        [
            "a.yaml:4:24: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight' \
             (expected second, minute, hour, day, week, month or year)",
            "a.yaml:4:54: descriptors[0].rate_limit.requests_per_unit: requests_per_unit must be \
             at least 0, found -1",
            "a.yaml:5:10: descriptors[1].key: descriptor has empty key",
            "b.yaml:2:52: (document): malformed YAML: while parsing a block mapping, did not find \
             expected key",
            "c.yaml:4:18: descriptors[0].shadow_mode: expected true or false, found the string \
             \"perhaps\"",
        ]
    );
    // Loading again gives the same report, byte for byte.
    assert_eq!(errors_of(&files, false), first);
}

#[test]
fn a_flood_of_errors_is_listed_up_to_the_bound_and_counted_beyond() {
    // 1500 descriptors without a key: 1500 errors, one per descriptor.
    let mut text = String::from("domain: api\ndescriptors:\n");
    for _ in 0..1500 {
        text.push_str("  - value: v\n");
    }
    let Err(errors) = load_files(&[("limits.yaml", &text)], false) else {
        panic!("key-less descriptors must be rejected")
    };
    assert_eq!(errors.len(), 1500);
    assert_eq!(errors.iter().len(), MAX_REPORTED_ERRORS);
    assert_eq!(errors.omitted(), 1500 - MAX_REPORTED_ERRORS);
    // The first listed are the first in the file: descriptors start on line 3.
    assert_eq!(
        errors.iter().next().and_then(|e| e.line_column()),
        Some((3, 5))
    );
    assert!(errors.to_string().ends_with("\n... and 500 more errors"));
}

// ---------------------------------------------------------------------------------------------
// Acceptance of envoyproxy/ratelimit files.
// ---------------------------------------------------------------------------------------------

/// A file in envoyproxy/ratelimit's documented format, using each of its features.
const ENVOY_STYLE: &str = "\
# Limits for the storefront, as envoyproxy/ratelimit reads them.
domain: storefront
descriptors:
  # Every client address: 50 per second.
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 50

  # One counter per API key, with tighter limits for some routes below it.
  - key: api_key
    rate_limit:
      name: per_key
      unit: MINUTE
      requests_per_unit: 600
    descriptors:
      - key: route
        value: checkout
        rate_limit:
          unit: minute
          requests_per_unit: 30
      - key: route
        rate_limit:
          unit: minute
          requests_per_unit: 300
        detailed_metric: true

  # A partner's keys are prefixed: the specific limit replaces the generic one.
  - key: partner_key
    value: acme-*
    rate_limit:
      name: acme
      unit: hour
      requests_per_unit: 100000
      replaces:
        - name: per_partner
  - key: partner_key
    rate_limit:
      name: per_partner
      unit: hour
      requests_per_unit: 1000

  # Internal callers are never limited; a new limit is tried in shadow mode first.
  - key: caller
    value: internal
    rate_limit:
      unlimited: true
  - key: caller
    value: batch
    shadow_mode: true
    rate_limit:
      unit: day
      requests_per_unit: 1000000

  # Numbers as values read as text, as envoyproxy/ratelimit reads them.
  - key: status
    value: 429
    rate_limit:
      unit: week
      requests_per_unit: 7
";

#[test]
fn envoy_style_files_load_unchanged() {
    let config = load_ok(ENVOY_STYLE);
    let ids: Vec<&str> = config.rules().map(|r| r.spec.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "storefront/remote_address",
            "storefront/api_key",
            "storefront/api_key/route=checkout",
            "storefront/api_key/route",
            "storefront/partner_key=acme-*",
            "storefront/partner_key",
            "storefront/caller=internal",
            "storefront/caller=batch",
            "storefront/status=429",
        ]
    );
    assert_eq!(
        spec(&config, "storefront/remote_address").quota,
        units(50, Duration::from_secs(1))
    );
    let per_key = spec(&config, "storefront/api_key");
    assert_eq!(
        per_key.quota,
        units(600, MINUTE),
        "unit is case-insensitive"
    );
    assert_eq!(per_key.name.as_deref(), Some("per_key"));
    assert!(spec(&config, "storefront/api_key/route").detailed_metric);
    let acme = spec(&config, "storefront/partner_key=acme-*");
    assert_eq!(acme.replaces, ["per_partner"]);
    assert_eq!(
        spec(&config, "storefront/caller=internal").quota,
        Quota::Unlimited
    );
    let batch = spec(&config, "storefront/caller=batch");
    assert!(batch.shadow_mode);
    assert_eq!(batch.quota, units(1_000_000, Duration::from_secs(86_400)));
    // 7 per week: 7 * 86400 s.
    assert_eq!(
        spec(&config, "storefront/status=429").quota,
        units(7, Duration::from_secs(604_800))
    );
    // Plain envoyproxy/ratelimit rules get allot's defaults.
    assert_eq!(per_key.consistency, Consistency::Strict);
    assert_eq!(per_key.partition_policy, PartitionPolicy::Floor);
    assert_eq!(per_key.failure_mode, FailureMode::Open);
    assert!(per_key.enabled && per_key.weights.is_empty());
    assert_eq!((per_key.rate_cap, per_key.concurrency), (None, None));
}

#[test]
fn yaml_1_1_booleans_and_a_leading_document_marker_are_accepted() {
    let text = "\
---
domain: legacy
descriptors:
  - key: k
    shadow_mode: yes
    rate_limit:
      unlimited: on
";
    let config = load_ok(text);
    let k = spec(&config, "legacy/k");
    assert!(k.shadow_mode);
    assert_eq!(k.quota, Quota::Unlimited);
}

#[test]
fn descriptors_without_limits_shape_matching_but_make_no_rule() {
    let text = "\
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    value: trusted
";
    let config = load_ok(text);
    assert_eq!(config.rules().len(), 1);
    // The exact `trusted` entry wins and has no limit: trusted keys are not limited.
    assert!(
        config
            .match_descriptor("api", &[("api_key", "trusted")])
            .is_none()
    );
    assert!(
        config
            .match_descriptor("api", &[("api_key", "other")])
            .is_some()
    );
}

#[test]
fn the_embedded_default_loads() {
    let config = LimitsConfig::embedded_default().expect("the shipped default is valid");
    assert!(config.rules().len() > 0);
    assert_eq!(config.domains(), ["default"]);
}

// ---------------------------------------------------------------------------------------------
// The allot block.
// ---------------------------------------------------------------------------------------------

#[test]
fn allot_block_sets_every_limit_field() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      requests_per_unit: 1000000
    allot:
      window: 90s
      consistency: eventual
      weights: { us-east: 0.5, eu-west: 0.3, ap-south: 0.2 }
      partition_policy: { open: { rate: 100/s, burst: 10 } }
      rate_cap: { rate: 100/minute, burst: 20 }
      concurrency: { max_slots: 10, slot_ttl: 30s }
      failure_mode: closed
      enabled: false
";
    let config = load_ok(text);
    let tenant = spec(&config, "llm/tenant");
    assert_eq!(tenant.quota, units(1_000_000, Duration::from_secs(90)));
    assert_eq!(tenant.consistency, Consistency::Eventual);
    let weights: Vec<(&str, u32)> = tenant
        .weights
        .iter()
        .map(|(r, w)| (r.as_str(), w))
        .collect();
    // Sorted by region; 0.5 -> 500000 ppm, 0.3 -> 300000, 0.2 -> 200000.
    assert_eq!(
        weights,
        [
            ("ap-south", 200_000),
            ("eu-west", 300_000),
            ("us-east", 500_000)
        ]
    );
    assert_eq!(
        tenant.partition_policy,
        PartitionPolicy::Open {
            rate: RateCap {
                units: 100,
                per: Duration::from_secs(1),
                burst: 10
            }
        }
    );
    assert_eq!(
        tenant.rate_cap,
        Some(RateCap {
            units: 100,
            per: MINUTE,
            burst: 20
        })
    );
    assert_eq!(
        tenant.concurrency,
        Some(ConcurrencyCap {
            max_slots: 10,
            slot_ttl: Duration::from_secs(30)
        })
    );
    assert_eq!(tenant.failure_mode, FailureMode::Closed);
    assert!(!tenant.enabled);
}

#[test]
fn allot_defaults_fill_what_is_left_out() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
    allot:
      partition_policy: closed
      rate_cap: {rate: 10/s}
      concurrency: {max_slots: 3}
";
    let tenant = load_ok(text);
    let tenant = spec(&tenant, "llm/tenant");
    assert_eq!(tenant.quota, units(5, Duration::from_secs(3_600)));
    assert_eq!(tenant.partition_policy, PartitionPolicy::Closed);
    assert_eq!(tenant.rate_cap.map(|c| c.burst), Some(DEFAULT_BURST_UNITS));
    assert_eq!(
        tenant.concurrency.map(|c| c.slot_ttl),
        Some(DEFAULT_SLOT_TTL)
    );
    assert_eq!(tenant.weights, RegionWeights::default());
    assert!(tenant.enabled);
}

#[test]
fn weights_that_add_up_to_exactly_one_are_kept_exactly() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    allot:
      weights: {a: 0.1, b: 0.2, c: 0.7}
";
    let config = load_ok(text);
    let tenant = spec(&config, "llm/tenant");
    let regions = [
        RegionId::from("a"),
        RegionId::from("b"),
        RegionId::from("c"),
    ];
    // 0.1 + 0.2 + 0.7 is 1.0000000000000002 in floating point, but exactly one million ppm
    // here; default allowances of 1000 units are then 100 + 200 + 700 = 1000.
    let sum: u64 = regions
        .iter()
        .map(|r| tenant.weights.default_allowance(r, &regions, 1000))
        .sum();
    assert_eq!(sum, 1000);
}

// ---------------------------------------------------------------------------------------------
// Matching.
// ---------------------------------------------------------------------------------------------

const MATCHING: &str = "\
domain: api
descriptors:
  - key: route
    value: orders_post
    rate_limit: {name: exact, unit: second, requests_per_unit: 1}
  - key: route
    value: orders*
    rate_limit: {name: wildcard, unit: second, requests_per_unit: 2}
  - key: route
    value: ord*
    rate_limit: {name: shorter_wildcard, unit: second, requests_per_unit: 3}
  - key: route
    rate_limit: {name: key_only, unit: second, requests_per_unit: 4}
  - key: tenant
    rate_limit: {name: tenant, unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: export
        rate_limit: {name: tenant_export, unit: minute, requests_per_unit: 5}
      - key: model
        descriptors:
          - key: tokens
            rate_limit: {name: tokens, unit: hour, requests_per_unit: 1000}
  - key: org
    value: acme
    rate_limit:
      name: acme
      unit: minute
      requests_per_unit: 50
      replaces: [{name: tenant}]
  - key: org
    value: free
    rate_limit:
      unlimited: true
      replaces: [{name: key_only}]
";

fn matched_name(config: &LimitsConfig, entries: &[(&str, &str)]) -> Option<String> {
    config
        .match_descriptor("api", entries)
        .and_then(|m| m.limit().name.clone())
}

#[test]
fn exact_beats_wildcard_beats_key_only() {
    let config = load_ok(MATCHING);
    let name = |value| matched_name(&config, &[("route", value)]);
    assert_eq!(name("orders_post").as_deref(), Some("exact"));
    assert_eq!(name("orders_get").as_deref(), Some("wildcard"));
    // `orders*` and `ord*` both match; the one written first wins.
    assert_eq!(name("orders").as_deref(), Some("wildcard"));
    assert_eq!(name("ordinal").as_deref(), Some("shorter_wildcard"));
    assert_eq!(name("users").as_deref(), Some("key_only"));
    assert_eq!(name("").as_deref(), Some("key_only"));
}

#[test]
fn nested_descriptors_match_level_by_level() {
    let config = load_ok(MATCHING);
    let m = config
        .match_descriptor("api", &[("tenant", "t1"), ("route", "export")])
        .expect("tenant + export");
    assert_eq!(m.limit().name.as_deref(), Some("tenant_export"));
    assert_eq!(m.rule.spec.id.as_str(), "api/tenant/route=export");
    assert_eq!(m.key.as_str(), "tenant=t1/route=export");
    let tokens = [("tenant", "t1"), ("model", "gpt"), ("tokens", "in")];
    assert_eq!(matched_name(&config, &tokens).as_deref(), Some("tokens"));
}

#[test]
fn only_the_node_at_the_last_request_entry_decides() {
    let config = load_ok(MATCHING);
    // A rule exists at `tenant`, but the request goes one level deeper where nothing matches.
    assert_eq!(
        matched_name(&config, &[("tenant", "t1"), ("route", "import")]),
        None
    );
    // `tenant/model` has no rule of its own, only a child.
    assert_eq!(
        matched_name(&config, &[("tenant", "t1"), ("model", "gpt")]),
        None
    );
    // Deeper than the configuration.
    let too_deep = [("route", "orders_post"), ("extra", "x")];
    assert_eq!(matched_name(&config, &too_deep), None);
    // The parent's own rule applies when the request stops there.
    assert_eq!(
        matched_name(&config, &[("tenant", "t1")]).as_deref(),
        Some("tenant")
    );
}

#[test]
fn a_matched_entry_is_never_revisited() {
    // As in envoyproxy/ratelimit: `value: a` is taken for the first entry, and as it has no
    // `y` child the request matches nothing, even though the key-only `x` has one.
    let text = "\
domain: api
descriptors:
  - key: x
    value: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    descriptors:
      - key: y
        rate_limit: {unit: second, requests_per_unit: 2}
";
    let config = load_ok(text);
    assert!(
        config
            .match_descriptor("api", &[("x", "a"), ("y", "1")])
            .is_none()
    );
    assert!(
        config
            .match_descriptor("api", &[("x", "b"), ("y", "1")])
            .is_some()
    );
}

#[test]
fn unknown_domains_and_empty_descriptors_match_nothing() {
    let config = load_ok(MATCHING);
    assert!(
        config
            .match_descriptor("other", &[("route", "orders_post")])
            .is_none()
    );
    let empty: [(&str, &str); 0] = [];
    assert!(config.match_descriptor("api", &empty).is_none());
}

#[test]
fn a_key_only_rule_makes_one_counter_per_value() {
    let config = load_ok(MATCHING);
    let a = config
        .match_descriptor("api", &[("tenant", "a")])
        .expect("tenant a");
    let b = config
        .match_descriptor("api", &[("tenant", "b")])
        .expect("tenant b");
    assert_eq!(a.rule.spec.id, b.rule.spec.id, "one limit");
    assert_eq!((a.key.as_str(), b.key.as_str()), ("tenant=a", "tenant=b"));
    // A wildcard rule also counts per actual value.
    let w = config
        .match_descriptor("api", &[("route", "orders_get")])
        .expect("wildcard");
    assert_eq!(w.key.as_str(), "route=orders_get");
}

#[test]
fn owned_entries_match_like_borrowed_ones() {
    let config = load_ok(MATCHING);
    let owned = vec![("route".to_owned(), "orders_post".to_owned())];
    let m = config.match_descriptor("api", &owned).expect("owned");
    assert_eq!(m.limit().name.as_deref(), Some("exact"));
}

#[test]
fn replaced_rules_are_dropped_from_a_request() {
    let config = load_ok(MATCHING);
    let names = |descriptors: &[Vec<(&str, &str)>]| -> Vec<Option<String>> {
        config
            .match_request("api", descriptors)
            .into_iter()
            .map(|m| m.and_then(|m| m.limit().name.clone()))
            .collect()
    };
    let tenant = vec![("tenant", "t1")];
    let acme = vec![("org", "acme")];
    let nothing = vec![("unknown", "x")];
    // `acme` replaces `tenant`: the tenant answer is dropped, positions are kept.
    assert_eq!(
        names(&[tenant.clone(), acme.clone(), nothing]),
        [None, Some("acme".to_owned()), None]
    );
    // Without `acme` in the request, `tenant` stands.
    assert_eq!(names(&[tenant]), [Some("tenant".to_owned())]);
    // An unlimited rule's `replaces` applies to the others...
    let route = vec![("route", "users")];
    let free = vec![("org", "free")];
    assert_eq!(
        names(&[route, free.clone()]),
        [None, None],
        "key_only is replaced; the unlimited rule has no name"
    );
    let free_match = config.match_request("api", &[free]);
    assert_eq!(
        free_match[0].as_ref().map(|m| m.limit().quota),
        Some(Quota::Unlimited)
    );
}

#[test]
fn unlimited_rules_are_never_replaced() {
    let text = "\
domain: api
descriptors:
  - key: caller
    value: internal
    rate_limit: {name: internal, unlimited: true}
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: [{name: internal}]
";
    let config = load_ok(text);
    let request = [vec![("caller", "internal")], vec![("tenant", "t")]];
    let matched = config.match_request("api", &request);
    assert_eq!(
        matched[0].as_ref().map(|m| m.limit().quota),
        Some(Quota::Unlimited)
    );
    assert!(matched[1].is_some());
}

#[test]
fn rules_and_limits_are_found_by_id() {
    let config = load_ok(MATCHING);
    for rule in config.rules() {
        assert_eq!(config.limit(&rule.spec.id), Some(&rule.spec));
        assert_eq!(
            config.rule(&rule.spec.id).map(|r| &r.source),
            Some(&rule.source)
        );
    }
    assert!(config.limit(&LimitId::from("api/nope")).is_none());
    let export = config
        .rule(&LimitId::from("api/tenant/route=export"))
        .expect("export rule");
    assert_eq!(export.domain, "api");
    assert_eq!(export.descriptor_path(), "tenant/route=export");
    // `      - key: route` on line 17: the mapping starts at column 9.
    assert_eq!((export.source.line, export.source.column), (17, 9));
}

// ---------------------------------------------------------------------------------------------
// Property tests: the loader never panics, whatever it is given.
// ---------------------------------------------------------------------------------------------

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// A YAML value built from the schema's vocabulary, rendered in block style.
    #[derive(Clone, Debug)]
    enum Y {
        Plain(&'static str),
        Quoted(String),
        Seq(Vec<Y>),
        Map(Vec<(&'static str, Y)>),
    }

    impl Y {
        fn render(&self, indent: usize, out: &mut String) {
            let pad = " ".repeat(indent);
            match self {
                Y::Plain(_) | Y::Quoted(_) => {
                    out.push_str(&pad);
                    out.push_str(&self.inline());
                    out.push('\n');
                }
                Y::Seq(items) if items.is_empty() => out.push_str(&format!("{pad}[]\n")),
                Y::Map(entries) if entries.is_empty() => out.push_str(&format!("{pad}{{}}\n")),
                Y::Seq(items) => {
                    for item in items {
                        out.push_str(&format!("{pad}-\n"));
                        item.render(indent + 2, out);
                    }
                }
                Y::Map(entries) => {
                    for (key, value) in entries {
                        match value {
                            Y::Plain(_) | Y::Quoted(_) => {
                                out.push_str(&format!("{pad}{key}: {}\n", value.inline()));
                            }
                            _ => {
                                out.push_str(&format!("{pad}{key}:\n"));
                                value.render(indent + 2, out);
                            }
                        }
                    }
                }
            }
        }

        fn inline(&self) -> String {
            match self {
                Y::Plain(text) => (*text).to_owned(),
                Y::Quoted(text) => format!("'{}'", text.replace('\'', "''")),
                Y::Seq(_) | Y::Map(_) => "{}".to_owned(),
            }
        }
    }

    const KEYS: &[&str] = &[
        "domain",
        "descriptors",
        "key",
        "value",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "name",
        "replaces",
        "shadow_mode",
        "detailed_metric",
        "quota_mode",
        "value_to_metric",
        "share_threshold",
        "metadata",
        "allot",
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
        "fixed_window",
        "sliding_window",
        "open",
        "rate",
        "burst",
        "max_slots",
        "slot_ttl",
        "us-east",
        "eu-west",
        "ratelimit",
        "0.25",
    ];

    const SCALARS: &[&str] = &[
        "api",
        "k",
        "v",
        "v*",
        "*",
        "minute",
        "SECOND",
        "fortnight",
        "0",
        "1",
        "-3",
        "1.5",
        "1000000",
        "true",
        "false",
        "yes",
        "~",
        "''",
        "90s",
        "0s",
        "1h30m",
        "100/s",
        "10/minute",
        "0.5",
        "0.7",
        "strict",
        "eventual",
        "floor",
        "closed",
        "open",
        "self",
        "99999999999999999999999",
    ];

    fn value() -> impl Strategy<Value = Y> {
        let leaf = prop_oneof![
            4 => proptest::sample::select(SCALARS).prop_map(Y::Plain),
            1 => "[a-z*_ ]{0,6}".prop_map(Y::Quoted),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Y::Seq),
                proptest::collection::vec((proptest::sample::select(KEYS), inner), 0..6)
                    .prop_map(Y::Map),
            ]
        })
    }

    fn pick(options: &'static [&'static str]) -> impl Strategy<Value = &'static str> + Clone {
        proptest::sample::select(options)
    }

    /// A valid `allot` block: any subset of valid settings.
    fn allot_valid() -> impl Strategy<Value = Y> {
        let options = vec![
            ("consistency", Y::Plain("eventual")),
            (
                "weights",
                Y::Map(vec![
                    ("us-east", Y::Plain("0.5")),
                    ("eu-west", Y::Plain("0.5")),
                ]),
            ),
            ("partition_policy", Y::Plain("closed")),
            (
                "rate_cap",
                Y::Map(vec![("rate", Y::Plain("100/s")), ("burst", Y::Plain("5"))]),
            ),
            ("concurrency", Y::Map(vec![("max_slots", Y::Plain("3"))])),
            ("failure_mode", Y::Plain("closed")),
            ("enabled", Y::Plain("false")),
            ("max_settle_overage", Y::Plain("0.5")),
            ("algorithm", Y::Plain("fixed_window")),
            ("rlqs_fallback_units", Y::Plain("20")),
        ];
        let len = options.len();
        proptest::sample::subsequence(options, 0..=len).prop_map(Y::Map)
    }

    /// A descriptor that is usually valid, so that matching and the deep checks run too;
    /// sometimes one part is replaced by anything at all.
    fn descriptor() -> impl Strategy<Value = Y> {
        let unit = prop_oneof![
            30 => pick(&["minute", "second", "hour", "Day", "week"]),
            1 => pick(&["fortnight", "''"]),
        ];
        let count = prop_oneof![
            30 => pick(&["1", "5", "100", "1000000"]),
            1 => pick(&["0", "2.5", "-1", "ten"]),
        ];
        let rate_limit = prop_oneof![
            30 => (unit, count).prop_map(|(unit, count)| {
                Y::Map(vec![("unit", Y::Plain(unit)), ("requests_per_unit", Y::Plain(count))])
            }),
            1 => Just(Y::Map(vec![("unlimited", Y::Plain("true"))])),
            1 => value(),
        ];
        let allot = prop_oneof![
            15 => Just(None),
            15 => allot_valid().prop_map(Some),
            1 => value().prop_map(Some),
        ];
        let key = prop_oneof![
            40 => pick(&["route", "tenant", "api_key", "model", "path"]),
            1 => pick(&["''", "k*"]),
        ];
        let value_pattern =
            proptest::option::of(pick(&["a", "b", "c", "orders", "ord*", "x*", "200", "''"]));
        let leaf = (key, value_pattern, proptest::option::of(rate_limit), allot).prop_map(
            |(key, value, rate_limit, allot)| {
                let mut fields = vec![("key", Y::Plain(key))];
                if let Some(value) = value {
                    fields.push(("value", Y::Plain(value)));
                }
                if let Some(rate_limit) = rate_limit {
                    fields.push(("rate_limit", rate_limit));
                    if let Some(allot) = allot {
                        fields.push(("allot", allot));
                    }
                }
                Y::Map(fields)
            },
        );
        leaf.prop_recursive(3, 16, 3, |inner| {
            (inner.clone(), proptest::collection::vec(inner, 0..3)).prop_map(
                |(parent, children)| {
                    let Y::Map(mut fields) = parent else {
                        return parent;
                    };
                    fields.retain(|(k, _)| *k != "descriptors");
                    fields.push(("descriptors", Y::Seq(children)));
                    Y::Map(fields)
                },
            )
        })
    }

    fn document() -> impl Strategy<Value = String> {
        (
            prop_oneof![30 => pick(&["api", "llm"]), 1 => Just("''")],
            proptest::collection::vec(descriptor(), 0..4),
            proptest::option::of((pick(KEYS), value())),
        )
            .prop_map(|(domain, descriptors, stray)| {
                let mut fields = vec![
                    ("domain", Y::Plain(domain)),
                    ("descriptors", Y::Seq(descriptors)),
                ];
                // A stray top-level key now and then (usually an error, sometimes a duplicate).
                if let Some(stray) = stray.filter(|(k, _)| k.len() % 8 == 0) {
                    fields.push(stray);
                }
                let mut text = String::new();
                Y::Map(fields).render(0, &mut text);
                text
            })
    }

    /// Whatever the outcome, it is a config or a non-empty list of errors that name the file
    /// and a line inside it; the same input always gives the same outcome.
    fn check(text: &str) {
        let file = SourceFile::new("p.yaml", text);
        let outcome = LimitsConfig::load(&[file], &LoadOptions::default());
        let again = LimitsConfig::load(&[file], &LoadOptions::default());
        match (outcome, again) {
            (Ok(config), Ok(second)) => {
                assert_eq!(config.rules().len(), second.rules().len());
                every_exact_rule_matches_itself(&config);
            }
            (Err(errors), Err(second)) => {
                assert!(!errors.is_empty());
                assert_eq!(errors, second);
                let lines = text.lines().count().max(1) as u32 + 1;
                for e in errors.iter() {
                    assert_eq!(e.file_name(), "p.yaml");
                    let (line, column) = e.line_column().expect("a place");
                    assert!(line >= 1 && line <= lines && column >= 1, "{e}");
                }
            }
            _ => panic!("two loads of the same text disagree"),
        }
    }

    /// A rule whose path is all exact values is what a request with those values matches.
    fn every_exact_rule_matches_itself(config: &LimitsConfig) {
        for rule in config.rules() {
            let entries: Option<Vec<(&str, &str)>> = rule
                .descriptor
                .iter()
                .map(|e| match &e.value {
                    ValuePattern::Exact(v) => Some((e.key.as_str(), v.as_str())),
                    _ => None,
                })
                .collect();
            if let Some(entries) = entries {
                let m = config.match_descriptor(&rule.domain, &entries);
                assert_eq!(m.map(|m| &m.rule.spec.id), Some(&rule.spec.id));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_text_never_panics_the_loader(text in "\\PC{0,200}") {
            check(&text);
        }

        #[test]
        fn yaml_like_text_never_panics_the_loader(
            text in "([a-z_]{1,8}: ?|- |  |[\\[\\]{},:&*!|>'\"#-]|[a-z0-9.*]{1,5}|\n){0,60}"
        ) {
            check(&text);
        }

        #[test]
        fn random_values_in_schema_vocabulary_never_panic_the_loader(
            fields in proptest::collection::vec((proptest::sample::select(KEYS), value()), 0..6)
        ) {
            let mut text = String::new();
            Y::Map(fields).render(0, &mut text);
            check(&text);
        }

        #[test]
        fn structured_documents_load_or_report_errors(text in document()) {
            check(&text);
        }
    }
}

/// envoyproxy/ratelimit's own examples ban a value with a quota of zero; such files must load
/// unchanged, and the rule admits nothing.
#[test]
fn a_zero_quota_loads_and_bans_the_value() {
    let text = "\
domain: messaging
descriptors:
  - key: to_number
    value: '2061234567'
    rate_limit:
      unit: day
      requests_per_unit: 0
";
    let config = LimitsConfig::load(
        &[SourceFile::new("limits.yaml", text)],
        &LoadOptions::default(),
    )
    .expect("a zero quota is valid");
    let matched = config
        .match_descriptor("messaging", &[("to_number", "2061234567")])
        .expect("the rule matches");
    match matched.limit().quota {
        Quota::Units { units, .. } => assert_eq!(units, 0),
        Quota::Unlimited => panic!("a zero quota is not unlimited"),
    }
}

#[test]
fn algorithm_is_fixed_window_unless_a_rule_asks_for_the_sliding_window() {
    let text = "\
domain: api
descriptors:
  - key: tenant
    rate_limit: {requests_per_unit: 100, unit: minute}
    allot:
      algorithm: sliding_window
  - key: region
    rate_limit: {requests_per_unit: 100, unit: minute}
    allot:
      consistency: eventual
      algorithm: sliding_window
  - key: team
    rate_limit: {requests_per_unit: 100, unit: minute}
    allot:
      algorithm: Fixed_Window
  - key: user
    rate_limit: {requests_per_unit: 100, unit: minute}
";
    let config = load_ok(text);
    assert_eq!(
        spec(&config, "api/tenant").algorithm,
        Algorithm::SlidingWindow
    );
    assert!(spec(&config, "api/tenant").is_sliding());
    // Eventual mode too (D83).
    let eventual = spec(&config, "api/region");
    assert_eq!(eventual.consistency, Consistency::Eventual);
    assert!(eventual.is_sliding());
    assert_eq!(spec(&config, "api/team").algorithm, Algorithm::FixedWindow);
    assert_eq!(spec(&config, "api/user").algorithm, Algorithm::FixedWindow);
    let bad = |allot: &str| {
        only_error(&format!(
            "domain: api\ndescriptors:\n  - key: t\n    rate_limit: {{requests_per_unit: 1, \
             unit: second}}\n    allot:\n{allot}"
        ))
    };
    assert_eq!(
        bad("      algorithm: token_bucket\n"),
        "limits.yaml:6:18: descriptors[0].allot.algorithm: invalid algorithm 'token_bucket' \
         (expected fixed_window or sliding_window)"
    );
    assert_eq!(
        only_error(
            "domain: api\ndescriptors:\n  - key: t\n    rate_limit: {unlimited: true}\n    \
             allot:\n      algorithm: sliding_window\n"
        ),
        "limits.yaml:6:7: descriptors[0].allot.algorithm: allot.algorithm has no effect on an \
         unlimited rule"
    );
}

#[test]
fn rlqs_fallback_units_is_a_whole_number_of_units_defaulting_to_none() {
    let text = "\
domain: gw
descriptors:
  - key: api_key
    rate_limit: {requests_per_unit: 1000, unit: minute}
    allot:
      rlqs_fallback_units: 20
  - key: team
    rate_limit: {requests_per_unit: 1000, unit: minute}
";
    let config = load_ok(text);
    assert_eq!(spec(&config, "gw/api_key").rlqs_fallback_units, 20);
    assert_eq!(spec(&config, "gw/team").rlqs_fallback_units, 0);
    let bad = |value: &str| {
        only_error(&format!(
            "domain: gw\ndescriptors:\n  - key: t\n    rate_limit: {{requests_per_unit: 1, \
             unit: second}}\n    allot:\n      rlqs_fallback_units: {value}\n"
        ))
    };
    assert!(bad("-1").contains("rlqs_fallback_units"), "{}", bad("-1"));
    assert!(bad("1.5").contains("rlqs_fallback_units"), "{}", bad("1.5"));
    assert_eq!(
        bad("1000000000001"),
        "limits.yaml:6:28: descriptors[0].allot.rlqs_fallback_units: rlqs_fallback_units \
         1000000000001 is above 1000000000000"
    );
}

#[test]
fn max_settle_overage_is_a_ratio_of_the_reservation_defaulting_to_none() {
    let text = "\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {requests_per_unit: 1000, unit: minute}
    allot:
      max_settle_overage: 0.25
  - key: team
    rate_limit: {requests_per_unit: 1000, unit: minute}
";
    let config = load_ok(text);
    assert_eq!(spec(&config, "llm/tenant").max_settle_overage_ppm, 250_000);
    assert_eq!(
        spec(&config, "llm/tenant").max_settle_overage_units(2_000),
        500
    );
    assert_eq!(spec(&config, "llm/team").max_settle_overage_ppm, 0);
    let bad = |value: &str| {
        only_error(&format!(
            "domain: llm\ndescriptors:\n  - key: t\n    rate_limit: {{requests_per_unit: 1, \
             unit: second}}\n    allot:\n      max_settle_overage: {value}\n"
        ))
    };
    assert_eq!(
        bad("lots"),
        "limits.yaml:6:27: descriptors[0].allot.max_settle_overage: max_settle_overage must \
         be a ratio of the reservation such as 0.5, found the string \"lots\""
    );
    assert_eq!(
        bad("101"),
        "limits.yaml:6:27: descriptors[0].allot.max_settle_overage: max_settle_overage 101 is \
         above 100"
    );
    assert_eq!(
        bad("-1"),
        "limits.yaml:6:27: descriptors[0].allot.max_settle_overage: max_settle_overage must \
         be a ratio of the reservation such as 0.5 (at most six decimals), found -1"
    );
}
