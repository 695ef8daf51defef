//! Configuration errors: each names the file, the place (line:column and the path inside the
//! document) and the problem, and a load reports all of them at once.

use std::fmt;
use std::sync::Arc;

use super::yaml::Pos;

/// Most errors one load reports; past this the rest are counted, not listed, so a file of
/// garbage cannot produce unbounded output.
pub const MAX_REPORTED_ERRORS: usize = 1_000;

/// Where something was written: a file and a line and column in it (both from 1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    pub file: Arc<str>,
    pub line: u32,
    pub column: u32,
}

impl Location {
    pub(crate) fn new(file: &Arc<str>, pos: Pos) -> Self {
        Location {
            file: Arc::clone(file),
            line: pos.line,
            column: pos.column,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One problem in one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    file: Arc<str>,
    /// `None` for problems with the file as a whole (it cannot be read).
    pos: Option<Pos>,
    /// Path inside the document, e.g. `descriptors[0].rate_limit.unit`; empty for the root.
    path: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn at(file: &Arc<str>, pos: Pos, path: &str, message: String) -> Self {
        ConfigError {
            file: Arc::clone(file),
            pos: Some(pos),
            path: path.to_owned(),
            message,
        }
    }

    /// A problem with a whole file, such as "cannot read": for callers that do the IO.
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.into(),
            pos: None,
            path: String::new(),
            message: message.into(),
        }
    }

    pub fn file_name(&self) -> &str {
        &self.file
    }

    /// Line and column, both counted from 1.
    pub fn line_column(&self) -> Option<(u32, u32)> {
        self.pos.map(|p| (p.line, p.column))
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    fn sort_key(&self) -> Pos {
        self.pos.unwrap_or_default()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(pos) = self.pos else {
            return write!(f, "{}: {}", self.file, self.message);
        };
        let path = if self.path.is_empty() {
            "(document)"
        } else {
            &self.path
        };
        write!(f, "{}:{}: {}: {}", self.file, pos, path, self.message)
    }
}

/// Every problem found while loading configuration files, in file order and, within a file,
/// in line and column order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigErrors {
    errors: Vec<ConfigError>,
    /// Errors found past [`MAX_REPORTED_ERRORS`].
    omitted: usize,
}

impl ConfigErrors {
    /// Orders errors by the index of their file in the load, then by place, then by the order
    /// they were found, and keeps at most [`MAX_REPORTED_ERRORS`].
    pub(crate) fn collect(mut found: Vec<(usize, ConfigError)>) -> Self {
        found.sort_by_key(|(file_index, e)| (*file_index, e.sort_key()));
        let omitted = found.len().saturating_sub(MAX_REPORTED_ERRORS);
        found.truncate(MAX_REPORTED_ERRORS);
        ConfigErrors {
            errors: found.into_iter().map(|(_, e)| e).collect(),
            omitted,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// How many errors were found, including those not listed.
    pub fn len(&self) -> usize {
        self.errors.len() + self.omitted
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &ConfigError> {
        self.errors.iter()
    }

    /// Errors found but not listed because there were more than [`MAX_REPORTED_ERRORS`].
    pub fn omitted(&self) -> usize {
        self.omitted
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        if self.omitted > 0 {
            write!(f, "\n... and {} more errors", self.omitted)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
