//! Why a configuration was refused, and where.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::debug_as_display;

/// Why a configuration was refused: where (file, line) and which field, and what is
/// wrong. Its `Display` is `line 7, rules[1].policy: unknown policy "logn"`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub(super) path: Option<PathBuf>,
    pub(super) line: Option<usize>,
    pub(super) field: String,
    pub(super) message: String,
}

impl ConfigError {
    /// The line (from 1) the error is on, when it is about the file's content.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The field, as a path such as `rules[1].policy` (empty for a syntax error or a
    /// file that cannot be read).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The file, when loaded with [`Config::from_path`](crate::config::Config::from_path).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        if let Some(line) = self.line {
            write!(f, "line {line}")?;
            if !self.field.is_empty() {
                f.write_str(", ")?;
            }
        }
        if !self.field.is_empty() {
            f.write_str(&self.field)?;
        }
        if self.line.is_some() || !self.field.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

debug_as_display!(ConfigError);
