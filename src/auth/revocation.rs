//! The revocation list: token ids (`jti`) that must no longer be accepted.
//!
//! Format: a text file with one jti per line. Blank lines are ignored; `#`
//! starts a comment (a whole line, or the rest of a line after the jti).
//!
//! ```text
//! # leaked in ticket 1234
//! 3f2a9c0d1e8b4f7a9c6d5e4f3a2b1c0d
//! 0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e  # web-01 decommissioned
//! ```

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Why the revocation list could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RevocationError {
    /// A file-system operation failed.
    #[error("cannot {action} revocation list {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A line holds more than one word.
    #[error("revocation list {path} line {line}: {text:?} is not a single token id; put one jti per line (`#` starts a comment)")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// [`Revocations::revoke`] was given an empty id or one with spaces or `#`.
    #[error("{0:?} is not a token id: a jti is one word (hex or uuid), as printed by `hdsd token inspect`")]
    BadJti(String),
    /// Another user could change the list (take a revocation back).
    #[error(transparent)]
    Untrusted(#[from] crate::config::permissions::Untrusted),
}

/// A set of revoked token ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    jtis: BTreeSet<String>,
}

impl Revocations {
    /// Reads the list at `path`. A missing file is an empty list.
    pub fn load(path: &Path) -> Result<Revocations, RevocationError> {
        // Whoever can write it can take a revocation back.
        crate::config::permissions::check_writable("revocation list", path)?;
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Revocations::default()),
            Err(source) => {
                return Err(RevocationError::Io {
                    action: "read",
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Revocations::parse(&text).map_err(|(line, text)| RevocationError::BadLine {
            path: path.to_path_buf(),
            line,
            text,
        })
    }

    /// Adds `jti` to the list at `path` (creating the file and its parent
    /// directory if needed). Returns `true` if it was newly added, `false` if
    /// it was already revoked. Appends; never rewrites existing lines.
    pub fn revoke(path: &Path, jti: &str) -> Result<bool, RevocationError> {
        let jti = jti.trim();
        if !valid_jti(jti) {
            return Err(RevocationError::BadJti(jti.to_string()));
        }
        if Revocations::load(path)?.contains(jti) {
            return Ok(false);
        }
        let io_err = |action| {
            move |source| RevocationError::Io {
                action,
                path: path.to_path_buf(),
                source,
            }
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(io_err("create the directory of"))?;
        }
        // Start on a fresh line if the file does not end with one.
        let needs_newline = match fs::read(path) {
            Ok(bytes) => bytes.last().is_some_and(|b| *b != b'\n'),
            Err(_) => false,
        };
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err("open"))?;
        let line = format!("{}{jti}\n", if needs_newline { "\n" } else { "" });
        file.write_all(line.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io_err("write"))?;
        Ok(true)
    }

    /// Whether `jti` is revoked.
    pub fn contains(&self, jti: &str) -> bool {
        self.jtis.contains(jti)
    }

    /// How many ids are revoked.
    pub fn len(&self) -> usize {
        self.jtis.len()
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.jtis.is_empty()
    }

    /// Every id revoked in either list.
    pub fn union(&self, other: &Revocations) -> Revocations {
        Revocations {
            jtis: self.jtis.union(&other.jtis).cloned().collect(),
        }
    }

    /// Parses the file format; on error, the 1-based line number and line.
    fn parse(text: &str) -> Result<Revocations, (usize, String)> {
        let mut jtis = BTreeSet::new();
        for (i, raw) in text.lines().enumerate() {
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            if content.split_whitespace().count() != 1 {
                return Err((i + 1, raw.to_string()));
            }
            jtis.insert(content.to_string());
        }
        Ok(Revocations { jtis })
    }
}

impl<S: Into<String>> FromIterator<S> for Revocations {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        Revocations {
            jtis: iter.into_iter().map(Into::into).collect(),
        }
    }
}

fn valid_jti(jti: &str) -> bool {
    !jti.is_empty() && !jti.contains('#') && !jti.chars().any(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_union_holds_the_ids_of_both() {
        let file: Revocations = ["a", "b"].into_iter().collect();
        let shared: Revocations = ["b", "c"].into_iter().collect();
        let all = file.union(&shared);
        assert_eq!(all.len(), 3);
        assert!(["a", "b", "c"].iter().all(|j| all.contains(j)));
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let r = Revocations::load(&dir.path().join("revoked")).unwrap();
        assert!(r.is_empty());
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn parses_comments_and_blank_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked");
        fs::write(&path, "# header\n\n  abc  \ndef # trailing\n#ghi\n").unwrap();
        let r = Revocations::load(&path).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.contains("abc"));
        assert!(r.contains("def"));
        assert!(!r.contains("ghi"));
    }

    #[test]
    fn rejects_two_words_on_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked");
        fs::write(&path, "abc\nabc def\n").unwrap();
        let err = Revocations::load(&path).unwrap_err();
        assert!(
            matches!(err, RevocationError::BadLine { line: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn revoke_appends_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("revoked");
        assert!(Revocations::revoke(&path, "abc").unwrap());
        assert!(!Revocations::revoke(&path, "abc").unwrap());
        // A file without a trailing newline gets one before the new id.
        fs::write(&path, "abc\n# note").unwrap();
        assert!(Revocations::revoke(&path, "def").unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "abc\n# note\ndef\n");
        let r = Revocations::load(&path).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.contains("def"));
    }

    #[test]
    fn revoke_refuses_bad_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked");
        for bad in ["", "  ", "a b", "a#b"] {
            assert!(matches!(
                Revocations::revoke(&path, bad),
                Err(RevocationError::BadJti(_))
            ));
        }
        assert!(!path.exists());
    }
}
