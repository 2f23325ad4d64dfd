//! The one file watcher of hdsd: the dataplanes directory, the signing keys
//! and revocation list, and the TLS files all use it.
//!
//! notify reports every open, read, write, rename and chmod. [`watch`] drops
//! access events (hdsd's own reads would otherwise trigger the next reload,
//! forever) except a closed write (a file written in place is complete), and
//! [`Changes::next`] coalesces a burst of events (editors and certificate
//! tools write, rename and chmod in quick succession) into one [`Changed`].
//! Directories are watched, not files: tools replace files by renaming, and
//! Kubernetes swaps a symlink.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// One burst of file events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// The paths the events named.
    pub paths: BTreeSet<PathBuf>,
    /// An event named no path, asked for a rescan (the kernel's queue
    /// overflowed) or was an error: anything may have changed.
    pub rescan: bool,
    /// The watch errors of the burst, for the log.
    pub errors: Vec<String>,
}

/// What the notify thread passes on.
#[derive(Debug)]
enum Seen {
    Paths(Vec<PathBuf>),
    Rescan,
    Error(String),
}

/// Keeps the watch alive: dropping it ends [`Changes`].
pub struct Watching {
    watcher: RecommendedWatcher,
}

impl std::fmt::Debug for Watching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watching").finish_non_exhaustive()
    }
}

impl Watching {
    /// Watches the entries of `dir` (not recursive).
    pub fn add(&mut self, dir: &Path) -> Result<(), notify::Error> {
        self.watcher.watch(dir, RecursiveMode::NonRecursive)
    }
}

/// The bursts of changes of the watched directories.
#[derive(Debug)]
pub struct Changes {
    events: mpsc::UnboundedReceiver<Seen>,
    debounce: Duration,
}

/// Starts a watcher whose bursts last `debounce` from their first event. Add
/// directories with [`Watching::add`].
pub fn watch(debounce: Duration) -> Result<(Watching, Changes), notify::Error> {
    let (tx, events) = mpsc::unbounded_channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let seen = match event {
            Ok(e) if !changes_something(&e.kind) => return,
            Ok(e) if e.need_rescan() || e.paths.is_empty() => Seen::Rescan,
            Ok(e) => Seen::Paths(e.paths),
            Err(e) => Seen::Error(e.to_string()),
        };
        let _ = tx.send(seen);
    })?;
    Ok((Watching { watcher }, Changes { events, debounce }))
}

/// Whether an event of this kind can mean that a file's content changed.
fn changes_something(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

impl Changes {
    /// The next burst: waits for an event, then gathers what follows within
    /// the debounce. `None` once the [`Watching`] is dropped.
    pub async fn next(&mut self) -> Option<Changed> {
        let mut changed = Changed::default();
        let first = self.events.recv().await?;
        changed.note(first);
        let deadline = tokio::time::Instant::now() + self.debounce;
        while let Ok(Some(seen)) = tokio::time::timeout_at(deadline, self.events.recv()).await {
            changed.note(seen);
        }
        Some(changed)
    }
}

impl Changed {
    fn note(&mut self, seen: Seen) {
        match seen {
            Seen::Paths(paths) => self.paths.extend(paths),
            Seen::Rescan => self.rescan = true,
            Seen::Error(e) => {
                self.rescan = true;
                self.errors.push(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind};

    #[test]
    fn reads_are_not_changes_but_closed_writes_are() {
        assert!(!changes_something(&EventKind::Access(AccessKind::Read)));
        assert!(!changes_something(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!changes_something(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(changes_something(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(changes_something(&EventKind::Create(CreateKind::File)));
        assert!(changes_something(&EventKind::Modify(ModifyKind::Any)));
        assert!(changes_something(&EventKind::Remove(
            notify::event::RemoveKind::File
        )));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_is_one_change_and_reads_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let read_only = dir.path().join("a.yaml");
        std::fs::write(&read_only, "a").unwrap();
        let (mut watching, mut changes) = watch(Duration::from_millis(200)).unwrap();
        watching.add(dir.path()).unwrap();

        // Reading a file is no change; writing another one twice is one burst.
        std::fs::read_to_string(&read_only).unwrap();
        let written = dir.path().join("b.yaml");
        std::fs::write(&written, "1").unwrap();
        std::fs::write(&written, "2").unwrap();
        let changed = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change within 10s")
            .unwrap();
        assert_eq!(changed.paths, BTreeSet::from([written]));
        assert!(!changed.rescan && changed.errors.is_empty(), "{changed:?}");

        // Dropping the watch ends the changes.
        drop(watching);
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            while changes.next().await.is_some() {}
        })
        .await;
        assert!(drained.is_ok(), "the changes end once the watch is dropped");
    }
}
