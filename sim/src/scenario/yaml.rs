//! Reading YAML with positions: every accessor that fails names the file, line, column and
//! dotted field path, and unknown fields are errors (a typo never silently means a default).

use std::cell::{Cell, RefCell};
use std::time::Duration;

use allot_core::config::parse_duration;
use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use crate::error::ScenarioError;

/// Where a document came from: a file, or YAML embedded in a file at some line and column.
#[derive(Clone, Debug)]
pub(super) struct Source<'f> {
    pub(super) file: &'f str,
    /// Added to the parser's 1-based lines.
    pub(super) line_offset: usize,
    /// Added to the parser's 0-based columns.
    pub(super) column_offset: usize,
}

impl<'f> Source<'f> {
    pub(super) fn file(file: &'f str) -> Self {
        Source {
            file,
            line_offset: 0,
            column_offset: 0,
        }
    }

    fn error_at(&self, line: usize, col: usize, field: &str, msg: String) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            line: line + self.line_offset,
            column: col + self.column_offset + 1,
            field: field.to_string(),
            message: msg,
        }
    }

    /// Parses `text` into its documents.
    pub(super) fn load<'i>(&self, text: &'i str) -> Result<Vec<MarkedYaml<'i>>, ScenarioError> {
        MarkedYaml::load_from_str(text).map_err(|e| {
            let m = e.marker();
            self.error_at(m.line(), m.col(), "(syntax)", e.info().to_string())
        })
    }
}

/// A node and the path that led to it.
#[derive(Clone)]
pub(super) struct Node<'a, 'i> {
    src: &'a Source<'a>,
    y: &'a MarkedYaml<'i>,
    path: String,
}

impl<'a, 'i> Node<'a, 'i> {
    pub(super) fn root(src: &'a Source<'a>, y: &'a MarkedYaml<'i>) -> Self {
        Node {
            src,
            y,
            path: String::from("(top)"),
        }
    }

    pub(super) fn file(&self) -> &'a str {
        self.src.file
    }

    /// 1-based line in the file.
    pub(super) fn line(&self) -> usize {
        self.y.span.start.line() + self.src.line_offset
    }

    pub(super) fn column(&self) -> usize {
        self.y.span.start.col() + self.src.column_offset + 1
    }

    pub(super) fn err(&self, msg: impl Into<String>) -> ScenarioError {
        let start = self.y.span.start;
        self.src
            .error_at(start.line(), start.col(), &self.path, msg.into())
    }

    fn child(&self, y: &'a MarkedYaml<'i>, path: String) -> Self {
        Node {
            src: self.src,
            y,
            path,
        }
    }

    fn scalar(&self) -> Option<&'a Scalar<'i>> {
        match &self.y.data {
            YamlData::Value(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn as_str(&self) -> Result<&'a str, ScenarioError> {
        match self.scalar() {
            Some(Scalar::String(s)) => Ok(s),
            _ => Err(self.err("expected a string")),
        }
    }

    pub(super) fn as_u64(&self) -> Result<u64, ScenarioError> {
        match self.scalar() {
            Some(Scalar::Integer(i)) => {
                u64::try_from(*i).map_err(|_| self.err("expected a non-negative integer"))
            }
            _ => Err(self.err("expected a non-negative integer")),
        }
    }

    pub(super) fn as_u32(&self) -> Result<u32, ScenarioError> {
        u32::try_from(self.as_u64()?).map_err(|_| self.err("too large"))
    }

    pub(super) fn as_i64(&self) -> Result<i64, ScenarioError> {
        match self.scalar() {
            Some(Scalar::Integer(i)) => Ok(*i),
            _ => Err(self.err("expected an integer")),
        }
    }

    /// A finite number (integer or decimal).
    pub(super) fn as_f64(&self) -> Result<f64, ScenarioError> {
        let v = match self.scalar() {
            Some(Scalar::Integer(i)) => *i as f64,
            Some(Scalar::FloatingPoint(f)) => f.into_inner(),
            _ => return Err(self.err("expected a number")),
        };
        if v.is_finite() {
            Ok(v)
        } else {
            Err(self.err("expected a finite number"))
        }
    }

    /// A number at least zero.
    pub(super) fn as_non_negative(&self) -> Result<f64, ScenarioError> {
        let v = self.as_f64()?;
        if v < 0.0 {
            return Err(self.err("must not be negative"));
        }
        Ok(v)
    }

    /// A probability, in `[0, 1]`.
    pub(super) fn as_probability(&self) -> Result<f64, ScenarioError> {
        let v = self.as_f64()?;
        if !(0.0..=1.0).contains(&v) {
            return Err(self.err("expected a probability between 0 and 1"));
        }
        Ok(v)
    }

    pub(super) fn as_bool(&self) -> Result<bool, ScenarioError> {
        match self.scalar() {
            Some(Scalar::Boolean(b)) => Ok(*b),
            _ => Err(self.err("expected true or false")),
        }
    }

    /// A duration with its unit, e.g. `250ms`, `10s`, `2m`, `1h30m`: the grammar of limits
    /// files (`allot_core::config::parse_duration`), so that one scenario's limits block and
    /// the rest of it read durations alike.
    pub(super) fn as_duration(&self) -> Result<Duration, ScenarioError> {
        match self.scalar() {
            Some(Scalar::String(s)) => parse_duration(s).map_err(|e| self.err(e)),
            Some(Scalar::Integer(0)) => Ok(Duration::ZERO),
            _ => Err(self.err("expected a duration with a unit, e.g. 250ms, 10s, 5m")),
        }
    }

    /// A duration that may be negative (`-30ms`), in nanoseconds.
    pub(super) fn as_signed_duration_nanos(&self) -> Result<i64, ScenarioError> {
        let (negative, text) = match self.scalar() {
            Some(Scalar::String(s)) => match s.strip_prefix('-') {
                Some(rest) => (true, rest.trim_start()),
                None => (false, &**s),
            },
            Some(Scalar::Integer(0)) => return Ok(0),
            _ => return Err(self.err("expected a duration with a unit, e.g. -30ms, 2s")),
        };
        let d = parse_duration(text).map_err(|e| self.err(e))?;
        let nanos = i64::try_from(d.as_nanos()).map_err(|_| self.err("duration too large"))?;
        Ok(if negative { -nanos } else { nanos })
    }

    pub(super) fn as_seq(&self) -> Result<Vec<Node<'a, 'i>>, ScenarioError> {
        match &self.y.data {
            YamlData::Sequence(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, y)| self.child(y, format!("{}[{i}]", self.path)))
                .collect()),
            _ => Err(self.err("expected a list")),
        }
    }

    pub(super) fn as_map(&self) -> Result<Map<'a, 'i>, ScenarioError> {
        let YamlData::Mapping(m) = &self.y.data else {
            return Err(self.err("expected a mapping (key: value lines)"));
        };
        let mut entries = Vec::with_capacity(m.len());
        for (k, v) in m.iter() {
            let key = match &k.data {
                YamlData::Value(Scalar::String(s)) => &**s,
                _ => {
                    return Err(self.child(k, self.path.clone()).err("keys must be strings"));
                }
            };
            entries.push((key, k, v));
        }
        Ok(Map {
            node: self.clone(),
            seen: vec![Cell::new(false); entries.len()],
            entries,
            asked: RefCell::new(Vec::new()),
        })
    }

    /// A choice written either as a bare word (`none`) or as a one-key mapping
    /// (`backoff: {...}`): the word and its body, if any.
    pub(super) fn as_variant(&self) -> Result<(&'a str, Option<Node<'a, 'i>>), ScenarioError> {
        if let Some(Scalar::String(s)) = self.scalar() {
            return Ok((s, None));
        }
        let map = self.as_map()?;
        if map.entries.len() != 1 {
            return Err(self.err("expected exactly one of the choices documented for this field"));
        }
        let (key, _, body) = map.entries[0];
        Ok((key, Some(self.child(body, format!("{}.{key}", self.path)))))
    }
}

/// A mapping whose fields are taken one by one; [`Map::finish`] rejects the ones left over.
pub(super) struct Map<'a, 'i> {
    node: Node<'a, 'i>,
    entries: Vec<(&'a str, &'a MarkedYaml<'i>, &'a MarkedYaml<'i>)>,
    seen: Vec<Cell<bool>>,
    /// Every field asked for, present or not: the fields this mapping allows.
    asked: RefCell<Vec<String>>,
}

impl<'a, 'i> Map<'a, 'i> {
    pub(super) fn node(&self) -> &Node<'a, 'i> {
        &self.node
    }

    pub(super) fn opt(&self, key: &str) -> Option<Node<'a, 'i>> {
        self.asked.borrow_mut().push(key.to_string());
        let i = self.entries.iter().position(|(k, _, _)| *k == key)?;
        self.seen[i].set(true);
        let path = if self.node.path == "(top)" {
            key.to_string()
        } else {
            format!("{}.{key}", self.node.path)
        };
        Some(self.node.child(self.entries[i].2, path))
    }

    pub(super) fn req(&self, key: &str) -> Result<Node<'a, 'i>, ScenarioError> {
        self.opt(key)
            .ok_or_else(|| self.node.err(format!("missing field `{key}`")))
    }

    /// Fails on the first field that no `opt`/`req` asked for, naming the fields allowed.
    pub(super) fn finish(&self) -> Result<(), ScenarioError> {
        let allowed = self.asked.borrow().join(", ");
        for ((key, k, _), seen) in self.entries.iter().zip(&self.seen) {
            if !seen.get() {
                let at = self.node.child(k, self.node.path.clone());
                return Err(at.err(format!(
                    "unknown field `{key}` (expected one of: {allowed})"
                )));
            }
        }
        Ok(())
    }
}
