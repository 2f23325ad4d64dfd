//! Why a dataplane file is refused: [`ParseError`], and the [`Limit`] it
//! went past when that is the reason. Parsing and the limit checks both
//! return it; neither names the other's types for it.

use std::fmt;

/// Why a document could not be turned into a dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line, when the parser knows it.
    pub line: Option<usize>,
    pub message: String,
    /// The limit the file went past, when that is the problem.
    pub limit: Option<Limit>,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl ParseError {
    /// The error of a file past `limit`.
    pub(super) fn limit(limit: Limit, line: Option<usize>, message: String) -> ParseError {
        ParseError {
            line,
            message,
            limit: Some(limit),
        }
    }
}

/// A limit a dataplane file can go past: the `limit` label of
/// `hdsd_dataplane_file_limit_hits_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Not a regular file (a FIFO, a device, a socket, or a symlink to one).
    NotRegularFile,
    /// Larger than `dataplanes.max_file_size`.
    FileSize,
    /// YAML nested deeper than `dataplanes.max_nesting`.
    Nesting,
    /// More YAML aliases than `dataplanes.max_aliases`.
    Aliases,
    /// YAML aliases that expand the file past `dataplanes.max_file_size`.
    Expansion,
    /// A dataplane with more inbounds than `dataplanes.max_inbounds`.
    Inbounds,
    /// An inbound with more tags than `dataplanes.max_tags`.
    Tags,
    /// More documents than `dataplanes.max_documents`.
    Documents,
    /// A parse that would keep more than `dataplanes.max_kept_bytes`.
    KeptBytes,
}

impl Limit {
    pub const ALL: [Limit; 9] = [
        Limit::NotRegularFile,
        Limit::FileSize,
        Limit::Nesting,
        Limit::Aliases,
        Limit::Expansion,
        Limit::Inbounds,
        Limit::Tags,
        Limit::Documents,
        Limit::KeptBytes,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::NotRegularFile => "not_regular_file",
            Limit::FileSize => "file_size",
            Limit::Nesting => "nesting",
            Limit::Aliases => "aliases",
            Limit::Expansion => "alias_expansion",
            Limit::Inbounds => "inbounds",
            Limit::Tags => "tags",
            Limit::Documents => "documents",
            Limit::KeptBytes => "kept_bytes",
        }
    }
}
