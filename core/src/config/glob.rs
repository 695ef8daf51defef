//! Value wildcards as envoyproxy/ratelimit reads them: each `*` in a descriptor's `value`
//! matches any run of characters, the empty run too, and every other character matches
//! itself. There is no escape, no `?` and no character class (upstream has none), so a value
//! with a `*` is always a pattern.

use std::fmt;

/// A `value` with at least one `*`, split at load so that matching allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Glob {
    /// As written: the rule's id, its counter key under `share_threshold` and its metrics
    /// show it.
    text: String,
    /// `text` split on `*`: at least two parts, the first a prefix and the last a suffix of
    /// every value matched, the others found in order between them.
    parts: Vec<Box<str>>,
    /// Length of all parts together: no shorter value can match.
    fixed_len: usize,
}

impl Glob {
    /// The pattern `text`, or `None` when it has no `*` (an exact value).
    pub fn new(text: &str) -> Option<Glob> {
        if !text.contains('*') {
            return None;
        }
        let parts: Vec<Box<str>> = text.split('*').map(Into::into).collect();
        let fixed_len = parts.iter().map(|p| p.len()).sum();
        Some(Glob {
            text: text.to_owned(),
            parts,
            fixed_len,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches. Leftmost-first search of each middle part is exact for
    /// patterns whose only operator is `*`: taking an earlier occurrence never leaves less
    /// room for the parts after it.
    pub fn matches(&self, value: &str) -> bool {
        if value.len() < self.fixed_len {
            return false;
        }
        // `new` keeps at least two parts (one `*`), so both ends exist.
        let (Some((first, rest)), Some(last)) = (self.parts.split_first(), self.parts.last())
        else {
            return false;
        };
        // Prefix then suffix of what the prefix left, so the two can never overlap.
        let Some(mut inner) = value
            .strip_prefix(&**first)
            .and_then(|v| v.strip_suffix(&**last))
        else {
            return false;
        };
        let middle = &rest[..rest.len() - 1];
        for part in middle {
            match inner.find(&**part) {
                Some(at) => inner = &inner[at + part.len()..],
                None => return false,
            }
        }
        true
    }

    /// Whether every value `later` matches is matched by `self` too, so that `later`, tried
    /// after `self`, can never be reached. Exact: `self` matches every value of `later` if
    /// and only if it matches `later`'s text read literally, because `self`'s parts hold no
    /// `*`, so each `*` of `later` falls within a run one of `self`'s `*` absorbs, and any
    /// text put there instead is absorbed the same way.
    pub fn covers(&self, later: &Glob) -> bool {
        self.matches(&later.text)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(text: &str) -> Glob {
        Glob::new(text).expect("a pattern")
    }

    /// envoyproxy/ratelimit's documented examples (README "Example 9", test/config/wildcard.yaml
    /// and share_threshold.yaml with their tests), each with what it must and must not match.
    #[test]
    fn upstream_examples_match_as_documented() {
        let table: &[(&str, &[&str], &[&str])] = &[
            // Trailing: any value starting with the prefix.
            (
                "value*",
                &["value1", "value2", "valueXYZ", "value"],
                &["valu", "xvalue1"],
            ),
            ("foo*", &["foo1", "foo2"], &["bar", "fo"]),
            (
                "files/*",
                &["files/a.pdf", "files/b.csv", "files/"],
                &["file/a", "xfiles/a"],
            ),
            // Middle: a fixed prefix and suffix.
            (
                "/api/*/action",
                &["/api/123/action", "/api/user-id/action", "/api//action"],
                &[
                    "/api/123/other",
                    "/api/action",
                    "x/api/1/action",
                    "/api/1/actions",
                ],
            ),
            (
                "bar*b",
                &["barab", "bar123b", "barb"],
                &["bara", "xbarb", "bar"],
            ),
            (
                "/api*v1",
                &["/api/v1", "/api-beta-v1", "/apiXYZv1"],
                &["/api/v2"],
            ),
            ("t*prod", &["t1prod", "tprod"], &["tprodx", "prod"]),
            // Several: each part in order.
            (
                "/api/*/resource/*/action",
                &["/api/v1/resource/123/action", "/api/v2/resource/456/action"],
                &[
                    "/api/v1/resource/123/other",
                    "/api/v1/action",
                    "/api/v1/123/action",
                ],
            ),
            (
                "foo*bar*baz",
                &["foo123bar456baz", "foobarbaz"],
                &["foo123baz", "bar456baz", "foobazbar", "foobarba"],
            ),
            (
                "svc*ep*rpc",
                &["svc1ep2rpc", "svcereprpc"],
                &["svcrpc", "svc1ep2"],
            ),
            // Overlapping ends: the prefix and the suffix need their own characters.
            ("ab*ba", &["abba", "ab-ba"], &["aba", "ab"]),
            // A lone `*` matches everything, the empty value too.
            ("*", &["", "anything"], &[]),
            ("**", &["", "x"], &[]),
            ("a**b", &["ab", "axb"], &["a", "ba"]),
            // Multi-byte text is matched as text.
            ("é*ü", &["éü", "é—ü"], &["éu"]),
        ];
        for (pattern, yes, no) in table {
            let g = glob(pattern);
            for v in *yes {
                assert!(g.matches(v), "{pattern} should match {v:?}");
            }
            for v in *no {
                assert!(!g.matches(v), "{pattern} should not match {v:?}");
            }
        }
    }

    #[test]
    fn a_value_without_a_star_is_not_a_pattern() {
        assert_eq!(Glob::new("orders_post"), None);
        assert_eq!(glob("a*b").to_string(), "a*b");
    }

    #[test]
    fn covering_is_judged_on_every_value() {
        assert!(glob("foo*").covers(&glob("foobar*")));
        assert!(glob("*").covers(&glob("/api/*/action")));
        assert!(glob("/api/*").covers(&glob("/api/*/action")));
        assert!(glob("*/action").covers(&glob("/api/*/action")));
        assert!(glob("a*c").covers(&glob("ab*c")));
        assert!(!glob("foobar*").covers(&glob("foo*")));
        assert!(!glob("/api/*/action").covers(&glob("/api/*")));
        // Both match "abc", but "ab*" also matches "abd", which "*c" does not.
        assert!(!glob("*c").covers(&glob("ab*")));
    }
}
