//! envoyproxy/ratelimit compatibility: its own files load unchanged, and match as its own
//! tests of them say (`testdata/envoyproxy/`, copied from upstream), with upstream's
//! `Stats.Key` expectations written in allot's counter-key form (`key=value/...`, with `%2F`
//! for a `/` inside a value).

use super::*;

const WILDCARD: &str = include_str!("testdata/envoyproxy/wildcard.yaml");
const SHARE_THRESHOLD: &str = include_str!("testdata/envoyproxy/share_threshold.yaml");
const METADATA: &str = include_str!("testdata/envoyproxy/metadata.yaml");
const EXAMPLE: &str = include_str!("testdata/envoyproxy/example.yaml");
const ENVOY_COMPAT: &str = include_str!("../../../examples/limits/envoy_compat.yaml");

fn load(name: &str, text: &str) -> LimitsConfig {
    let file = SourceFile::new(name, text);
    match LimitsConfig::load(&[file], &LoadOptions::default()) {
        Ok(config) => config,
        Err(e) => panic!("{name} should load unchanged, got:\n{e}"),
    }
}

fn errors(text: &str) -> Vec<String> {
    match LimitsConfig::load(
        &[SourceFile::new("limits.yaml", text)],
        &LoadOptions::default(),
    ) {
        Ok(_) => panic!("expected errors, the file loaded"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

/// (limit id, counter key, metric value) of what one descriptor matches.
fn matched(
    config: &LimitsConfig,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<(String, String, Option<String>)> {
    config.match_descriptor(domain, entries).map(|m| {
        (
            m.rule.spec.id.as_str().to_owned(),
            m.key.as_str().to_owned(),
            m.metric_value,
        )
    })
}

fn id_and_key(config: &LimitsConfig, entries: &[(&str, &str)]) -> Option<(String, String)> {
    matched(config, "test-domain", entries).map(|(id, key, _)| (id, key))
}

fn pair(id: &str, key: &str) -> Option<(String, String)> {
    Some((id.to_owned(), key.to_owned()))
}

/// upstream TestWildcardConfig.
#[test]
fn wildcards_anywhere_in_a_value_match_as_upstream_tests_say() {
    let c = load("wildcard.yaml", WILDCARD);
    let m = |k, v| id_and_key(&c, &[(k, v)]);
    assert_eq!(m("noVal", "foo1"), pair("test-domain/noVal", "noVal=foo1"));
    // Without share_threshold each value counts on its own, under the pattern's rule.
    assert_eq!(
        m("wild", "foo1"),
        pair("test-domain/wild=foo*", "wild=foo1")
    );
    assert_eq!(
        m("wild", "foo2"),
        pair("test-domain/wild=foo*", "wild=foo2")
    );
    assert_eq!(
        id_and_key(&c, &[("nestedWild", "val1"), ("wild", "goo2")]),
        pair(
            "test-domain/nestedWild=val1/wild=goo*",
            "nestedWild=val1/wild=goo2"
        )
    );
    assert_eq!(m("wild", "bar"), None);
    assert_eq!(m("noWild", "foo1"), None, "an exact value is not a prefix");
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(
            m("midWild", v).map(|p| p.0).as_deref(),
            Some("test-domain/midWild=bar*b")
        );
    }
    assert_eq!(m("midWild", "bara"), None, "needs the suffix");
    assert_eq!(m("midWild", "xbarb"), None, "needs the prefix");
    for v in ["foo123bar456baz", "foobarbaz"] {
        let id = m("multiWild", v).map(|p| p.0);
        assert_eq!(id.as_deref(), Some("test-domain/multiWild=foo*bar*baz"));
    }
    assert_eq!(m("multiWild", "foo123baz"), None, "needs the middle part");
    assert_eq!(m("multiWild", "bar456baz"), None, "needs the first part");
}

/// upstream TestShareThreshold: every value a shared wildcard matches spends from the one
/// counter named by the pattern; without it, each value has its own.
#[test]
fn share_threshold_gives_a_wildcards_values_one_counter() {
    let c = load("share_threshold.yaml", SHARE_THRESHOLD);
    let one = |k, v| id_and_key(&c, &[(k, v)]);
    for v in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        assert_eq!(
            one("files", v),
            pair("test-domain/files=files/*", "files=files%2F*")
        );
    }
    assert_eq!(
        id_and_key(&c, &[("nested", "parent"), ("files", "nested/file1.txt")]),
        pair(
            "test-domain/nested=parent/files=nested/*",
            "nested=parent/files=nested%2F*"
        )
    );
    assert_eq!(
        id_and_key(
            &c,
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")]
        ),
        pair(
            "test-domain/files=top/*/files=nested/*",
            "files=top%2F*/files=nested%2F*"
        )
    );
    // The parent shares, the child wildcard does not: only the parent's value is the pattern.
    assert_eq!(
        id_and_key(
            &c,
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]
        )
        .map(|p| p.1)
        .as_deref(),
        Some("path=path%2F*/file=file%2Fdoc1/type=pdf")
    );
    assert_eq!(
        id_and_key(
            &c,
            &[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read")
            ]
        )
        .map(|p| p.1)
        .as_deref(),
        Some("user=user%2F*/resource=res%2F*/action=read")
    );
    // An exact value is tried first and keeps its own counter.
    assert_eq!(
        one("file", "test1"),
        pair("test-domain/file=test1", "file=test1")
    );
    for v in ["test2", "test23", "test123"] {
        assert_eq!(one("file", v), pair("test-domain/file=test*", "file=test*"));
    }
    for v in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        assert_eq!(
            one("midpath", v).map(|p| p.1).as_deref(),
            Some("midpath=%2Fapi*v1")
        );
    }
    assert_eq!(one("midpath", "/api/v2"), None);
    for v in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        assert_eq!(
            one("multiroute", v).map(|p| p.1).as_deref(),
            Some("multiroute=svc*ep*rpc")
        );
    }
    assert_eq!(one("multiroute", "svcABCrpc"), None);
    for (tenant, resource) in [("t1prod", "resAv2"), ("t99prod", "resBBBv2")] {
        let key = id_and_key(&c, &[("tenant", tenant), ("resource", resource)]).map(|p| p.1);
        assert_eq!(key.as_deref(), Some("tenant=t*prod/resource=res*v2"));
    }
}

/// upstream's metric keys for detailed_metric, value_to_metric and their combination with
/// share_threshold (README examples 8, 10 and 11; TestShareThreshold, TestValueToMetric_*).
#[test]
fn metric_values_follow_upstreams_metric_keys() {
    let c = load("envoy_compat.yaml", ENVOY_COMPAT);
    let metric = |entries: &[(&str, &str)]| matched(&c, "envoy_compat", entries).map(|m| m.2);
    // Example 8: detailed_metric on a key-only rule shows the value; an exact rule without
    // it reports under its id alone.
    assert_eq!(
        metric(&[("key1", "unspecified_value")]),
        Some(Some("key1=unspecified_value".into()))
    );
    assert_eq!(metric(&[("key1", "value1")]), Some(None));
    // Example 10: each value_to_metric level shows the request's value.
    assert_eq!(
        metric(&[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "123")
        ]),
        Some(Some("route=api/http_method=GET/subject_id".into()))
    );
    // ... a value_to_metric wildcard shows the value, not the pattern.
    assert_eq!(
        metric(&[
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents")
        ]),
        Some(Some("user=alice/action=readfile/resource".into()))
    );
    // Example 11: share_threshold wins over value_to_metric: the pattern, as the rule's id
    // already shows it, so no per-value metric.
    assert_eq!(
        metric(&[("route", "api/v1"), ("method", "GET")]),
        Some(None)
    );
    // Nothing asked for: no per-value metric.
    assert_eq!(metric(&[("path", "/api/1/action")]), Some(None));

    let shared = load("share_threshold.yaml", SHARE_THRESHOLD);
    // share_threshold with detailed_metric: the pattern, then the detailed values.
    assert_eq!(
        matched(
            &shared,
            "test-domain",
            &[("service", "svc/user"), ("endpoint", "get")]
        )
        .map(|m| m.2),
        Some(Some("service=svc%2F*/endpoint=get".into()))
    );
}

/// upstream example.yaml and metadata.yaml: quota_mode and metadata are kept on the rule.
#[test]
fn quota_mode_and_metadata_are_kept_on_the_rule() {
    let c = load("example.yaml", EXAMPLE);
    let rule = |id: &str| match c.rule(&crate::ids::LimitId::from(id)) {
        Some(rule) => rule.clone(),
        None => panic!("no rule {id}"),
    };
    let service_1 = rule("rl/service=service_1");
    assert!(service_1.quota_mode);
    let name = MetadataValue::String("service_1".into());
    let expected = vec![(
        "service_with_quota".to_owned(),
        MetadataValue::Map(vec![("name".to_owned(), name)]),
    )];
    assert_eq!(service_1.metadata, Some(expected));
    let foo = rule("rl/foo");
    assert!(!foo.quota_mode);
    assert_eq!(foo.metadata, None);

    let m = load("metadata.yaml", METADATA);
    let key2 = m
        .rule(&crate::ids::LimitId::from("test-domain/key2"))
        .cloned();
    assert!(key2.is_some_and(|r| r.metadata.is_some()));
}

#[test]
fn metadata_keeps_every_yaml_type_as_written() {
    let text = "\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata:
      n: 1.50
      b: true
      z: ~
      s: '7'
      l: [1, x]
";
    let c = load("limits.yaml", text);
    let metadata = c.rules().next().and_then(|r| r.metadata.clone());
    let v = |s: &str| MetadataValue::String(s.into());
    let n = |s: &str| MetadataValue::Number(s.into());
    assert_eq!(
        metadata,
        Some(vec![
            ("n".into(), n("1.50")),
            ("b".into(), MetadataValue::Bool(true)),
            ("z".into(), MetadataValue::Null),
            ("s".into(), v("7")),
            ("l".into(), MetadataValue::List(vec![n("1"), v("x")])),
        ])
    );
}

#[test]
fn the_shipped_compatibility_example_loads() {
    let c = load("envoy_compat.yaml", ENVOY_COMPAT);
    assert_eq!(c.rules().len(), 12);
    let m = |k, v| matched(&c, "envoy_compat", &[(k, v)]).map(|m| m.0);
    assert_eq!(
        m("path", "/api/123/action").as_deref(),
        Some("envoy_compat/path=/api/*/action")
    );
    assert_eq!(m("path", "/api/123/other"), None);
    assert_eq!(
        m("route", "/api/v1/resource/123/action").as_deref(),
        Some("envoy_compat/route=/api/*/resource/*/action")
    );
    // Exact first: value1 is not counted under value*.
    assert_eq!(
        m("key1", "value1").as_deref(),
        Some("envoy_compat/key1=value1")
    );
    assert_eq!(
        m("key1", "valueXYZ").as_deref(),
        Some("envoy_compat/key1=value*")
    );
}

#[test]
fn share_threshold_needs_a_wildcard_value() {
    let text = "\
domain: d
descriptors:
  - key: files
    value: files
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: any
    share_threshold: yes
";
    assert_eq!(
        errors(text),
        [
            "limits.yaml:5:22: descriptors[0].share_threshold: share_threshold can only be \
             used with wildcard values (containing '*'), but found 'files=files'",
            "limits.yaml:8:22: descriptors[1].share_threshold: share_threshold can only be \
             used with wildcard values (containing '*'), but found 'any'",
        ]
    );
}

#[test]
fn new_fields_are_checked_for_their_type() {
    let text = "\
domain: d
descriptors:
  - key: k
    value: a*
    quota_mode: maybe
    value_to_metric: [1]
    metadata: just text
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: m
    metadata: {a: 1, a: 2}
";
    assert_eq!(
        errors(text),
        [
            "limits.yaml:5:17: descriptors[0].quota_mode: expected true or false, found the \
             string \"maybe\"",
            "limits.yaml:6:22: descriptors[0].value_to_metric: expected true or false, found a \
             list",
            "limits.yaml:7:15: descriptors[0].metadata: metadata must be a mapping, found the \
             string \"just text\"",
            "limits.yaml:10:22: descriptors[1].metadata.a: duplicate key 'a'",
        ]
    );
}

/// A later wildcard that an earlier one covers could never match: rejected, with middle and
/// multiple wildcards judged on every value, not only on their prefix.
#[test]
fn a_wildcard_covered_by_an_earlier_one_is_rejected() {
    let text = "\
domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*/action
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: '*/action'
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: /v1*
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        errors(text),
        [
            "limits.yaml:6:5: descriptors[1]: wildcard 'path=/api/*/action' can never match: the \
          wildcard '/api/*' at limits.yaml:3:5 is tried first and matches every value it would"
        ]
    );
}
