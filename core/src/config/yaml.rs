//! A YAML document as a tree of nodes that remember where they were written.
//!
//! Built from saphyr-parser's event stream rather than a ready-made loader, because the limits
//! loader needs what a loader does not give: every duplicate key of a mapping (not only the
//! first), each scalar's text as written (envoyproxy/ratelimit reads `value: 200` as the string
//! "200"), and no recursion on the input's nesting, so a hostile file cannot overflow the stack.
//! Scalars are resolved lazily, by the schema walker that knows which type each field wants.

use std::collections::BTreeMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

/// Deepest nesting of sequences and mappings accepted. A limits file needs about three levels
/// per descriptor level; anything deeper is a mistake or an attack on the stack.
pub const MAX_NESTING_DEPTH: usize = 64;

/// Most nodes that aliases (`*anchor`) may expand to in one file, so that a few nested anchors
/// cannot blow up into millions of nodes ("billion laughs").
pub const MAX_ALIAS_EXPANSION_NODES: usize = 10_000;

/// A place in a file: line and column, both counted from 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    fn of(span: Span) -> Pos {
        let marker = span.start;
        Pos {
            line: u32::try_from(marker.line()).unwrap_or(u32::MAX),
            column: u32::try_from(marker.col().saturating_add(1)).unwrap_or(u32::MAX),
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `quoted` is true for any non-plain style (quotes, block scalars) and for `!!str`:
    /// such a scalar is always a string, whatever its text.
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Entries in document order; duplicate keys are kept so that each can be reported.
    Map(Vec<(Node, Node)>),
}

/// What a plain scalar means under the YAML 1.2 core schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plain {
    Null,
    Bool(bool),
    /// `None` when the digits do not fit in an `i128`.
    Int(Option<i128>),
    Float,
    Str,
}

impl Node {
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, quoted: false } if resolve_plain(text) == Plain::Null)
    }

    /// The scalar's text when it is a string in YAML's eyes (quoted, or plain text that is not
    /// a number, boolean or null).
    pub fn as_yaml_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, quoted: true } => Some(text),
            Kind::Scalar {
                text,
                quoted: false,
            } if resolve_plain(text) == Plain::Str => Some(text),
            _ => None,
        }
    }

    /// How the node reads in an error message ("a list", "the integer 5", ...).
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Seq(_) => "a list".to_owned(),
            Kind::Map(_) => "a mapping".to_owned(),
            Kind::Scalar { text, quoted: true } => format!("the string \"{text}\""),
            Kind::Scalar {
                text,
                quoted: false,
            } => match resolve_plain(text) {
                Plain::Null => "an empty value".to_owned(),
                Plain::Bool(_) => format!("the boolean {text}"),
                Plain::Int(_) => format!("the integer {text}"),
                Plain::Float => format!("the number {text}"),
                Plain::Str => format!("the string \"{text}\""),
            },
        }
    }

    /// Nodes in this subtree, counting this one.
    fn count(&self) -> usize {
        match &self.kind {
            Kind::Scalar { .. } => 1,
            Kind::Seq(items) => 1 + items.iter().map(Node::count).sum::<usize>(),
            Kind::Map(entries) => {
                1 + entries
                    .iter()
                    .map(|(k, v)| k.count() + v.count())
                    .sum::<usize>()
            }
        }
    }
}

/// Resolves a plain scalar as the YAML 1.2 core schema does.
pub fn resolve_plain(text: &str) -> Plain {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Plain::Null,
        "true" | "True" | "TRUE" => return Plain::Bool(true),
        "false" | "False" | "FALSE" => return Plain::Bool(false),
        _ => {}
    }
    if let Some(int) = core_schema_int(text) {
        return Plain::Int(int);
    }
    if is_core_schema_float(text) {
        return Plain::Float;
    }
    Plain::Str
}

/// `[-+]?[0-9]+`, `0o[0-7]+` or `0x[0-9a-fA-F]+`; `Some(None)` for an integer out of range.
fn core_schema_int(text: &str) -> Option<Option<i128>> {
    let (radix, digits, negative) = if let Some(hex) = text.strip_prefix("0x") {
        (16, hex, false)
    } else if let Some(oct) = text.strip_prefix("0o") {
        (8, oct, false)
    } else if let Some(rest) = text.strip_prefix('-') {
        (10, rest, true)
    } else {
        (10, text.strip_prefix('+').unwrap_or(text), false)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok();
    Some(magnitude.map(|m| if negative { -m } else { m }))
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, infinities and NaN.
fn is_core_schema_float(text: &str) -> bool {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((whole, frac)) => digits(whole) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// Why a file is not a YAML document we can walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub pos: Pos,
    /// Where in the document the parser was (e.g. `descriptors[1].rate_limit`).
    pub path: String,
    pub message: String,
}

/// Parses one YAML document. `Ok(None)` for a file with no document (empty or comments only).
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| SyntaxError {
            pos: Pos::of(Span::empty(*e.marker())),
            path: builder.path(),
            message: format!("malformed YAML: {}", e.info()),
        })?;
        builder
            .on_event(event, span)
            .map_err(|message| SyntaxError {
                pos: Pos::of(span),
                path: builder.path(),
                message,
            })?;
    }
    Ok(builder.root)
}

struct Frame {
    node: Node,
    anchor: usize,
    /// A mapping's key waiting for its value.
    pending_key: Option<Node>,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: BTreeMap<usize, Node>,
    alias_nodes: usize,
    documents: usize,
    root: Option<Node>,
}

impl Builder {
    fn on_event(&mut self, event: Event<'_>, span: Span) -> Result<(), String> {
        let pos = Pos::of(span);
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => Ok(()),
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err("a limits file holds one YAML document, this is a second".into());
                }
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => {
                let forced_str = check_tag(tag.as_deref())?;
                let quoted = forced_str || style != ScalarStyle::Plain;
                let text = text.into_owned();
                let kind = Kind::Scalar { text, quoted };
                self.finish(Node { pos, kind }, anchor)
            }
            Event::SequenceStart(anchor, tag) => {
                check_tag(tag.as_deref())?;
                self.open(pos, anchor, Kind::Seq(Vec::new()))
            }
            Event::MappingStart(anchor, tag) => {
                check_tag(tag.as_deref())?;
                self.open(pos, anchor, Kind::Map(Vec::new()))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let frame = self
                    .stack
                    .pop()
                    .ok_or("unbalanced YAML events (end without start)")?;
                self.finish(frame.node, frame.anchor)
            }
            Event::Alias(id) => {
                let node = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or("alias to an unknown anchor")?;
                self.alias_nodes = self.alias_nodes.saturating_add(node.count());
                if self.alias_nodes > MAX_ALIAS_EXPANSION_NODES {
                    return Err(format!(
                        "aliases expand to more than {MAX_ALIAS_EXPANSION_NODES} nodes"
                    ));
                }
                self.finish(node, 0)
            }
        }
    }

    fn open(&mut self, pos: Pos, anchor: usize, kind: Kind) -> Result<(), String> {
        if self.stack.len() >= MAX_NESTING_DEPTH {
            return Err(format!(
                "nested deeper than {MAX_NESTING_DEPTH} levels of lists and mappings"
            ));
        }
        self.stack.push(Frame {
            node: Node { pos, kind },
            anchor,
            pending_key: None,
        });
        Ok(())
    }

    /// Attaches a complete node to its parent, or makes it the document; `anchor` is the
    /// parser's anchor id (0 for none).
    fn finish(&mut self, node: Node, anchor: usize) -> Result<(), String> {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        let Some(parent) = self.stack.last_mut() else {
            self.root = Some(node);
            return Ok(());
        };
        match (&mut parent.node.kind, parent.pending_key.take()) {
            (Kind::Seq(items), _) => items.push(node),
            (Kind::Map(entries), Some(key)) => entries.push((key, node)),
            (Kind::Map(_), None) => parent.pending_key = Some(node),
            (Kind::Scalar { .. }, _) => return Err("unbalanced YAML events".into()),
        }
        Ok(())
    }

    /// The path of the node being built, for syntax errors.
    fn path(&self) -> String {
        let mut path = String::new();
        for frame in &self.stack {
            match (&frame.node.kind, &frame.pending_key) {
                (Kind::Seq(items), _) => path.push_str(&format!("[{}]", items.len())),
                (Kind::Map(_), Some(key)) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    match &key.kind {
                        Kind::Scalar { text, .. } => path.push_str(text),
                        _ => path.push('?'),
                    }
                }
                _ => break,
            }
        }
        path
    }
}

/// Accepts the core schema's tags and returns whether the tag forces a string (`!!str`);
/// application tags (`!thing`) mean nothing to a limits file.
fn check_tag(tag: Option<&Tag>) -> Result<bool, String> {
    match tag {
        None => Ok(false),
        Some(tag) if tag.is_yaml_core_schema() => Ok(tag.suffix == "str"),
        Some(tag) => Err(format!(
            "unsupported YAML tag '{}{}'",
            tag.handle, tag.suffix
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(node: &Node) -> (&str, bool) {
        match &node.kind {
            Kind::Scalar { text, quoted } => (text, *quoted),
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn nodes_keep_their_positions_and_text_as_written() {
        let doc = parse("domain: api\ndescriptors:\n  - key: k\n    value: 0x1F\n")
            .unwrap()
            .unwrap();
        let Kind::Map(entries) = &doc.kind else {
            panic!("root is a mapping")
        };
        assert_eq!(entries[0].1.pos, Pos { line: 1, column: 9 });
        let Kind::Seq(items) = &entries[1].1.kind else {
            panic!("descriptors is a list")
        };
        let Kind::Map(fields) = &items[0].kind else {
            panic!("a descriptor is a mapping")
        };
        // `0x1F` stays the text "0x1F": a string field reads it as written.
        assert_eq!(scalar(&fields[1].1), ("0x1F", false));
        assert_eq!(
            fields[1].1.pos,
            Pos {
                line: 4,
                column: 12
            }
        );
    }

    #[test]
    fn duplicate_keys_are_all_kept_for_reporting() {
        let doc = parse("a: 1\na: 2\na: 3\n").unwrap().unwrap();
        let Kind::Map(entries) = &doc.kind else {
            panic!("root is a mapping")
        };
        assert_eq!(entries.len(), 3);
    }

    #[test]
    fn quoting_and_str_tags_force_strings() {
        let doc = parse("a: '5'\nb: !!str 5\nc: 5\n").unwrap().unwrap();
        let Kind::Map(entries) = &doc.kind else {
            panic!("root is a mapping")
        };
        assert_eq!(entries[0].1.as_yaml_str(), Some("5"));
        assert_eq!(entries[1].1.as_yaml_str(), Some("5"));
        assert_eq!(entries[2].1.as_yaml_str(), None);
    }

    #[test]
    fn plain_scalars_resolve_like_the_core_schema() {
        assert_eq!(resolve_plain("~"), Plain::Null);
        assert_eq!(resolve_plain("True"), Plain::Bool(true));
        assert_eq!(
            resolve_plain("yes"),
            Plain::Str,
            "YAML 1.2: 'yes' is a string"
        );
        assert_eq!(resolve_plain("-12"), Plain::Int(Some(-12)));
        assert_eq!(resolve_plain("0o17"), Plain::Int(Some(15)));
        assert_eq!(resolve_plain("1e3"), Plain::Float);
        assert_eq!(resolve_plain(".5"), Plain::Float);
        assert_eq!(resolve_plain("10.5"), Plain::Float);
        assert_eq!(resolve_plain("1.2.3"), Plain::Str);
        assert_eq!(resolve_plain("foo*"), Plain::Str);
        assert_eq!(
            resolve_plain("999999999999999999999999999999999999999999"),
            Plain::Int(None)
        );
    }

    #[test]
    fn malformed_yaml_reports_position_and_path() {
        let err = parse("domain: api\ndescriptors:\n  - key: [unclosed\n").unwrap_err();
        assert!(err.message.starts_with("malformed YAML"), "{err:?}");
        assert!(err.pos.line >= 3, "{err:?}");
        assert!(err.path.starts_with("descriptors[0]"), "{err:?}");
    }

    #[test]
    fn a_second_document_is_rejected() {
        let err = parse("domain: a\n---\ndomain: b\n").unwrap_err();
        assert_eq!(err.pos.line, 2);
        assert!(err.message.contains("one YAML document"), "{err:?}");
    }

    #[test]
    fn empty_files_have_no_document() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }

    #[test]
    fn deep_nesting_is_refused_instead_of_overflowing() {
        let mut block = String::new();
        for depth in 0..200 {
            block.push_str(&format!("{}a:\n", "  ".repeat(depth)));
        }
        let err = parse(&block).unwrap_err();
        assert!(err.message.contains("nested deeper"), "{err:?}");
        // Flow collections hit the scanner's own limit first; either way an error, no crash.
        assert!(parse(&"[".repeat(100_000)).is_err());
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..6 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        let err = parse(&text).unwrap_err();
        assert!(err.message.contains("aliases expand"), "{err:?}");
    }

    #[test]
    fn aliases_copy_the_anchored_node() {
        let doc = parse("a: &x {k: v}\nb: *x\n").unwrap().unwrap();
        let Kind::Map(entries) = &doc.kind else {
            panic!("root is a mapping")
        };
        assert_eq!(entries[0].1.kind, entries[1].1.kind);
    }

    #[test]
    fn application_tags_are_rejected() {
        let err = parse("a: !custom 5\n").unwrap_err();
        assert!(err.message.contains("unsupported YAML tag"), "{err:?}");
    }
}
