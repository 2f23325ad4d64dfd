//! The directory origin (`dataplanes.source = "dir"`): the `*.yaml` /
//! `*.yml` / `*.json` files of `dataplanes.dir`.
//!
//! [`read_dir`] and [`read_file`] read the files, as safely as a directory
//! anyone may drop a file into needs (no FIFO hangs the reader, no file costs
//! more than `dataplanes.max_file_size`). [`Dir`] follows the directory with
//! the file watcher and yields what changed: a burst of events names files,
//! and only those are read again, so a change costs what its file costs, not
//! what the directory costs. It makes no snapshot: the pipeline does
//! (`sources::follow`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::assemble::{FileError, FileRead, Loaded};
use super::{Changed, Origin, Rules, SourceError};
use crate::dataplane::{FileLimits, Format, Limit};
use crate::fswatch;

/// Why the directory itself cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the dataplanes directory {dir}: {source}; create it or point dataplanes.dir at an existing directory")]
pub struct DirError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Reads every `*.yaml` / `*.yml` / `*.json` file of `dir` (not recursive,
/// hidden files and directories skipped) with [`read_file`].
pub fn read_dir(dir: &Path, max_size: u64) -> Result<BTreeMap<PathBuf, FileRead>, DirError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DirError {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if !is_dataplane_file(&path) {
            continue;
        }
        if let Some(read) = read_file(&path, max_size) {
            files.insert(path, read);
        }
    }
    Ok(files)
}

/// Reads one dataplane file, or `None` when there is no file to read (it is
/// gone, or it is a directory). The file is opened without blocking, so a
/// FIFO never hangs the reader; it must be a regular file (a symlink to one
/// is fine: the type is checked on the opened file, not on its name); and
/// at most `max_size` bytes are read, so a symlink to `/dev/zero` or a file
/// still growing costs no more than that.
pub fn read_file(path: &Path, max_size: u64) -> Option<FileRead> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let cannot = |e: std::io::Error| {
        Some(Err(FileError::new(
            None,
            &format!("cannot read file: {e}"),
            None,
        )))
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return cannot(e),
    };
    let meta = match file.metadata() {
        Ok(meta) => meta,
        Err(e) => return cannot(e),
    };
    let kind = meta.file_type();
    if kind.is_dir() {
        return None;
    }
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Some(Err(FileError::new(
            None,
            &format!("this is {what} (or a symlink to one), not a regular file; dataplane files must be regular files (a symlink to a regular file is fine): remove it or give it another extension"),
            Some(Limit::NotRegularFile),
        )));
    }
    let too_large = || {
        Some(Err(FileError::new(
            None,
            &format!("the file is larger than dataplanes.max_file_size ({max_size} bytes); split it into several files or raise the limit"),
            Some(Limit::FileSize),
        )))
    };
    if meta.len() > max_size {
        return too_large();
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = file
        .take(max_size.saturating_add(1))
        .read_to_end(&mut bytes)
    {
        return cannot(e);
    }
    if bytes.len() as u64 > max_size {
        return too_large();
    }
    Some(String::from_utf8(bytes).map_err(|e| {
        FileError::new(
            None,
            &format!(
                "the file is not UTF-8 text (invalid byte at offset {}); save it as UTF-8",
                e.utf8_error().valid_up_to()
            ),
            None,
        )
    }))
}

fn is_dataplane_file(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    !hidden && Format::of_path(path).is_some()
}

/// Reads the named files; `None` for a file that no longer exists.
fn read_files(paths: Vec<PathBuf>, max_size: u64) -> BTreeMap<PathBuf, Option<FileRead>> {
    paths
        .into_iter()
        .map(|path| {
            let read = read_file(&path, max_size);
            (path, read)
        })
        .collect()
}

/// Loads the directory once, without following it (`hdsd validate`).
pub fn load(dir: &Path, rules: &Rules) -> Result<Loaded, DirError> {
    let files = read_dir(dir, rules.limits.max_file_size)?;
    Ok(super::assembled(
        &Loaded::default(),
        dir,
        Changed::Everything(files),
        rules,
    ))
}

/// How long file events are coalesced before the files are read again.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The directory, watched.
pub struct Dir {
    dir: PathBuf,
    max_size: u64,
    /// Keeps the watch alive.
    _watching: fswatch::Watching,
    changes: fswatch::Changes,
}

impl std::fmt::Debug for Dir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dir").field("dir", &self.dir).finish()
    }
}

impl Dir {
    /// Watches `dir` at once, before the first read, so that no change
    /// falls between the two. A missing directory is named as such; a watch
    /// that cannot be set up is a startup failure.
    pub fn open(dir: PathBuf, limits: &FileLimits) -> Result<Dir, SourceError> {
        std::fs::metadata(&dir).map_err(|source| DirError {
            dir: dir.clone(),
            source,
        })?;
        let (mut watching, changes) = fswatch::watch(DEBOUNCE)?;
        watching.add(&dir)?;
        Ok(Dir {
            dir,
            max_size: limits.max_file_size,
            _watching: watching,
            changes,
        })
    }

    /// What a burst of events asks to read: everything (`None`), or the
    /// dataplane files it names (none: nothing to do).
    fn wanted(&self, burst: fswatch::Changed) -> Option<Vec<PathBuf>> {
        for e in &burst.errors {
            tracing::warn!(error = %e, "file watch error; reloading the dataplanes directory");
        }
        let mut everything = burst.rescan;
        let mut named = std::collections::BTreeSet::new();
        for path in burst.paths {
            match path.file_name() {
                Some(name) if path != self.dir => {
                    named.insert(self.dir.join(name));
                }
                _ => everything = true,
            }
        }
        if everything {
            return None;
        }
        Some(named.into_iter().filter(|p| is_dataplane_file(p)).collect())
    }
}

impl Origin for Dir {
    type Error = DirError;

    fn root(&self) -> PathBuf {
        self.dir.clone()
    }

    async fn first(&mut self) -> Result<BTreeMap<PathBuf, FileRead>, DirError> {
        let max_size = self.max_size;
        blocking(&self.dir, move |dir| read_dir(dir, max_size)).await
    }

    async fn next(&mut self) -> Option<Result<Changed, DirError>> {
        loop {
            let burst = self.changes.next().await?;
            let max_size = self.max_size;
            return Some(match self.wanted(burst) {
                None => {
                    tracing::debug!(dir = %self.dir.display(), "dataplanes directory changed; reloading");
                    blocking(&self.dir, move |dir| {
                        read_dir(dir, max_size).map(Changed::Everything)
                    })
                    .await
                }
                Some(files) if files.is_empty() => continue,
                Some(files) => {
                    tracing::debug!(
                        files = files.len(),
                        "dataplanes directory changed; reloading"
                    );
                    blocking(&self.dir, move |_| {
                        Ok(Changed::Files(read_files(files, max_size)))
                    })
                    .await
                }
            });
        }
    }
}

/// Runs a read of `dir` on the blocking pool; a read that panicked is an
/// error of the directory, reported like any other.
async fn blocking<T: Send + 'static>(
    dir: &Path,
    read: impl FnOnce(&Path) -> Result<T, DirError> + Send + 'static,
) -> Result<T, DirError> {
    let owned = dir.to_path_buf();
    tokio::task::spawn_blocking(move || read(&owned))
        .await
        .unwrap_or_else(|e| {
            Err(DirError {
                dir: dir.to_path_buf(),
                source: std::io::Error::other(format!("the read failed: {e}")),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str, service_port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {service_port}\n"
        )
    }

    fn names(l: &Loaded) -> Vec<String> {
        l.dataplanes.keys().map(|k| k.to_string()).collect()
    }

    fn rules(limits: FileLimits) -> Rules {
        Rules {
            specifier: Default::default(),
            limits,
        }
    }

    #[test]
    fn reads_only_yaml_and_json_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), doc("a", 1)).unwrap();
        std::fs::write(dir.path().join("b.yml"), doc("b", 2)).unwrap();
        std::fs::write(
            dir.path().join("c.json"),
            r#"{"type": "Dataplane", "mesh": "default", "name": "c", "networking": {"address": "127.0.0.1"}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("c.txt"), "junk").unwrap();
        std::fs::write(dir.path().join(".d.yaml.swp"), "junk").unwrap();
        std::fs::write(dir.path().join(".e.yaml"), "junk").unwrap();
        let l = load(dir.path(), &rules(FileLimits::default())).unwrap();
        assert_eq!(names(&l), vec!["default.a", "default.b", "default.c"]);
        assert!(
            load(&dir.path().join("missing"), &rules(FileLimits::default()))
                .unwrap_err()
                .to_string()
                .contains("create it or point dataplanes.dir")
        );
    }

    #[test]
    fn only_regular_files_are_read_and_never_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("ok.yaml"), doc("a", 1)).unwrap();
        std::fs::write(d.join("big.yaml"), "#".repeat(2000)).unwrap();
        std::os::unix::fs::symlink(d.join("ok.yaml"), d.join("link.yaml")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("zero.yaml")).unwrap();
        std::fs::create_dir(d.join("dir.yaml")).unwrap();
        let fifo = d.join("fifo.yaml");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());

        assert!(read_file(&d.join("ok.yaml"), 1000).unwrap().is_ok());
        assert!(
            read_file(&d.join("link.yaml"), 1000).unwrap().is_ok(),
            "a symlink to a regular file is read"
        );
        assert!(read_file(&d.join("dir.yaml"), 1000).is_none());
        assert!(read_file(&d.join("gone.yaml"), 1000).is_none());
        let err = |name: &str| read_file(&d.join(name), 1000).unwrap().unwrap_err();
        // A FIFO with no writer: refused at once, not waited on.
        let e = err("fifo.yaml");
        assert_eq!(e.limit, Some(Limit::NotRegularFile));
        assert!(e.message.contains("a FIFO"), "{e:?}");
        let e = err("zero.yaml");
        assert_eq!(e.limit, Some(Limit::NotRegularFile));
        assert!(e.message.contains("character device"), "{e:?}");
        let e = err("big.yaml");
        assert_eq!(e.limit, Some(Limit::FileSize));
        assert!(
            e.message.contains("dataplanes.max_file_size (1000 bytes)"),
            "{e:?}"
        );

        // The directory read reports them too, beside the good files.
        let limits = FileLimits {
            max_file_size: 1000,
            ..FileLimits::default()
        };
        let l = load(d, &rules(limits)).unwrap();
        assert_eq!(names(&l), vec!["default.a"]);
        assert_eq!(l.error_count(), 4, "{:?}", l.problems());
        assert!(!l.files.contains_key(&d.join("dir.yaml")));
    }
}
