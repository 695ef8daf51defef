//! Matching one request descriptor to its rule (`LimitsConfig::match_descriptor`), per kind of
//! rule: what the envoyproxy/ratelimit flags cost on the request path.
//!
//! Every case matches a two-entry descriptor of the same shape in the same domain, so the
//! difference is the kind of match: an exact and a key-only level (the plain path, one walk);
//! a middle wildcard; a `share_threshold` wildcard (a second walk writes the pattern into the
//! counter key); `value_to_metric` and `detailed_metric` (a second walk builds the metric value).
//! Each iteration builds the counter key, as the agent's call does.

use std::hint::black_box;

use allot_core::config::{LimitsConfig, LoadOptions, SourceFile};
use criterion::{Criterion, criterion_group, criterion_main};

const LIMITS: &str = "\
domain: bench
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/*/action
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: files
    value: files/*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plan
    value: gold
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
";

fn matching(c: &mut Criterion) {
    let file = SourceFile::new("bench.yaml", LIMITS);
    let config = LimitsConfig::load(&[file], &LoadOptions::default()).expect("loads");
    let cases: [(&str, [(&str, &str); 2]); 5] = [
        ("plain", [("tenant", "acme"), ("user", "u-123456")]),
        (
            "middle_wildcard",
            [("path", "/api/v1/orders/action"), ("user", "u-123456")],
        ),
        (
            "share_threshold",
            [("files", "files/report.pdf"), ("user", "u-123456")],
        ),
        (
            "value_to_metric",
            [("route", "orders_post"), ("user", "u-123456")],
        ),
        ("detailed_metric", [("plan", "gold"), ("user", "u-123456")]),
    ];
    let mut group = c.benchmark_group("match_descriptor");
    for (name, entries) in cases {
        assert!(
            config.match_descriptor("bench", &entries).is_some(),
            "{name} matches"
        );
        group.bench_function(name, |b| {
            b.iter(|| config.match_descriptor(black_box("bench"), black_box(&entries)))
        });
    }
    group.finish();
}

criterion_group!(benches, matching);
criterion_main!(benches);
