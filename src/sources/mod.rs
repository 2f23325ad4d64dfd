//! The definitions pipeline: where dataplanes are defined, turned into the
//! one [`Loaded`] snapshot every reader follows.
//!
//! - [`assemble`] is pure: what an origin read and the previous snapshot in,
//!   the new snapshot out.
//! - An [`Origin`] reads definitions and yields what changed ([`Changed`]),
//!   nothing more: [`dir::Dir`] (the files of `dataplanes.dir`, followed with
//!   the file watcher) and [`stored::Stored`] (the definitions store,
//!   followed through its announcements). A third origin is one file that
//!   implements [`Origin`], and one arm in [`start`].
//! - [`follow`] is the only writer of [`Loaded`], whatever the origin: it
//!   assembles on the blocking pool with the one specifier builder
//!   ([`specify`], timed and counted), logs the problems new since the last
//!   snapshot ([`log_problems`]) and publishes when the revision moved.
//!
//! [`start`] returns the writer as a future: the caller runs it (and is told
//! when it ends), it spawns nothing.

pub mod assemble;
pub mod dir;
pub mod stored;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

pub use assemble::{
    assemble, assemble_with, excerpted, reassemble, reassemble_with, Build, Defined, FileError,
    FileRead, FileState, Loaded, CHANGE_LOG,
};
pub use dir::DirError;
pub use stored::{check_document, Rejected};

use crate::config::{Config, DataplanesSource};
use crate::dataplane::{Dataplane, FileLimits};
use crate::specifier::{build, Specifier, SpecifierError, SpecifierSettings};
use crate::store::definitions::DefinitionStore;
use crate::store::StoreError;

/// How a definition is read, whatever its origin: the limits of a dataplane
/// file (`dataplanes.max_*`, a stored document is held to them too) and the
/// server's specifier settings.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub specifier: SpecifierSettings,
    pub limits: FileLimits,
}

/// What an origin read.
#[derive(Debug)]
pub enum Changed {
    /// Every file there is now: a file of the snapshot not named here is gone.
    Everything(BTreeMap<PathBuf, FileRead>),
    /// These files only: `Some` is a file's new content, `None` a file that
    /// is gone. Every other file keeps its state.
    Files(BTreeMap<PathBuf, Option<FileRead>>),
}

/// Where definitions come from. An origin reads and yields what changed; it
/// never makes a snapshot ([`follow`] does).
pub trait Origin: Send + 'static {
    /// Why a read failed: at the first read, a startup failure; later,
    /// logged, and the definitions read before stay in force.
    type Error: std::fmt::Display + Send + Into<SourceError>;
    /// What [`Loaded::dir`] names: the directory, or the store.
    fn root(&self) -> PathBuf;
    /// Reads every definition once: the first snapshot's files.
    fn first(
        &mut self,
    ) -> impl Future<Output = Result<BTreeMap<PathBuf, FileRead>, Self::Error>> + Send;
    /// Waits for the next change and reads it; `None` when the origin has
    /// ended (nothing will change again).
    fn next(&mut self) -> impl Future<Output = Option<Result<Changed, Self::Error>>> + Send;
}

/// Why the definitions could not be read or followed at startup.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("cannot watch the dataplanes directory for changes: {0}; check that it exists and that the inotify limits (fs.inotify.max_user_instances, max_user_watches) are not exhausted")]
    Watch(#[from] notify::Error),
    #[error("cannot read the dataplane definitions: {0}")]
    Store(#[from] StoreError),
    #[error("assembling the first snapshot of the definitions failed: {0}")]
    Assembly(String),
}

/// Where definitions come from, as the API's write calls see it.
#[derive(Debug, Clone)]
pub enum Definitions {
    /// `dataplanes.source = "dir"`: the files of this directory; writes are refused.
    Dir(PathBuf),
    /// `dataplanes.source = "api"`: the store, and how a document is checked
    /// ([`check_document`]).
    Store {
        store: Arc<dyn DefinitionStore>,
        rules: Arc<Rules>,
    },
}

/// The definitions, read once and followed.
#[derive(Debug)]
pub struct Sources {
    /// The snapshots; holds the first one.
    pub rx: watch::Receiver<Arc<Loaded>>,
    /// What the API writes to (the store) or refuses (files).
    pub definitions: Definitions,
}

/// The writer of [`Loaded`], to be run by the caller: it ends when its
/// origin does (a failure: nothing would change again) or when no
/// receiver is left.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Reads the definitions of `dataplanes.source` (the files of
/// `dataplanes.dir`, or `store`) and returns them with the task that
/// follows them. A directory that cannot be read or watched, or a store that
/// does not answer, is a startup failure.
pub async fn start(
    config: &Config,
    specifier: &SpecifierSettings,
    store: Arc<dyn DefinitionStore>,
) -> Result<(Sources, Task), SourceError> {
    let rules = Arc::new(Rules {
        specifier: specifier.clone(),
        limits: config.dataplanes.limits(),
    });
    match config.dataplanes.source {
        DataplanesSource::Dir => {
            let dir = config.dataplanes.dir.clone();
            let origin = dir::Dir::open(dir.clone(), &rules.limits)?;
            let (rx, task) = following(origin, rules).await?;
            let definitions = Definitions::Dir(dir);
            Ok((Sources { rx, definitions }, Box::pin(task)))
        }
        DataplanesSource::Api => {
            let origin = stored::Stored::open(store.clone());
            let (rx, task) = following(origin, rules.clone()).await?;
            let definitions = Definitions::Store { store, rules };
            Ok((Sources { rx, definitions }, Box::pin(task)))
        }
    }
}

/// Reads `origin` once, and returns the receiver of its snapshots (holding
/// the first) with the writer that follows it from there.
pub async fn following<O: Origin>(
    mut origin: O,
    rules: Arc<Rules>,
) -> Result<
    (
        watch::Receiver<Arc<Loaded>>,
        impl Future<Output = ()> + Send + 'static,
    ),
    SourceError,
> {
    let files = origin.first().await.map_err(Into::into)?;
    let root = origin.root();
    let first = on_blocking_pool(
        Arc::new(Loaded::default()),
        root.clone(),
        Changed::Everything(files),
        rules.clone(),
    )
    .await
    .map_err(|e| SourceError::Assembly(e.to_string()))?;
    log_problems(&first, &Loaded::default());
    tracing::info!(
        from = %root.display(),
        dataplanes = first.dataplanes.len(),
        broken_files = first.error_count(),
        "dataplanes loaded"
    );
    let (tx, rx) = watch::channel(Arc::new(first));
    Ok((rx, follow(origin, rules, tx)))
}

/// The only writer of [`Loaded`]: applies each change `origin` yields to the
/// snapshot `tx` holds, and publishes the result. A read that failed is
/// logged and the snapshot kept; the origin reads again at its next change.
/// Runs until the origin ends or `tx` has no receivers left.
pub async fn follow<O: Origin>(mut origin: O, rules: Arc<Rules>, tx: watch::Sender<Arc<Loaded>>) {
    let root = origin.root();
    loop {
        let next = tokio::select! {
            next = origin.next() => next,
            () = tx.closed() => return,
        };
        let changed = match next {
            None => return,
            Some(Ok(changed)) => changed,
            Some(Err(e)) => {
                tracing::error!(
                    "{e}; keeping the definitions read before, reading again at the next change"
                );
                continue;
            }
        };
        let previous = tx.borrow().clone();
        match on_blocking_pool(previous.clone(), root.clone(), changed, rules.clone()).await {
            Ok(loaded) => {
                publish(&tx, &previous, loaded);
            }
            Err(e) => tracing::error!(
                error = %e,
                "assembling the dataplane definitions failed; keeping the definitions read before"
            ),
        }
    }
}

/// [`assembled`] on the blocking pool: parsing and building specifiers
/// costs what the changed files hold, which may be a whole fleet.
async fn on_blocking_pool(
    previous: Arc<Loaded>,
    root: PathBuf,
    changed: Changed,
    rules: Arc<Rules>,
) -> Result<Loaded, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || assembled(&previous, &root, changed, &rules)).await
}

/// The next snapshot: `changed` applied to `previous`, each new
/// dataplane's specifier built by [`specify`].
pub fn assembled(previous: &Loaded, root: &Path, changed: Changed, rules: &Rules) -> Loaded {
    let mut build = |dp: &Dataplane| specify(dp, &rules.specifier);
    match changed {
        Changed::Everything(files) => {
            assemble_with(root, files, previous, &rules.limits, &mut build)
        }
        Changed::Files(files) => reassemble_with(previous, files, &rules.limits, &mut build),
    }
}

/// Builds one dataplane's specifier, timed and counted in the metrics: the
/// one place the pipeline builds one.
pub fn specify(dp: &Dataplane, settings: &SpecifierSettings) -> Result<Specifier, SpecifierError> {
    let started = std::time::Instant::now();
    let built = build(dp, settings);
    crate::metrics::specifier_built(built.is_ok(), started.elapsed());
    built
}

/// The one publish: logs what is new in `loaded` since `previous` (which
/// `tx` holds), then replaces the snapshot when its revision moved (a
/// snapshot of the same revision, of this lineage, is the same). Whether
/// it published.
fn publish(tx: &watch::Sender<Arc<Loaded>>, previous: &Loaded, loaded: Loaded) -> bool {
    log_problems(&loaded, previous);
    tx.send_if_modified(|current| {
        if current.revision() == loaded.revision() {
            return false;
        }
        *current = Arc::new(loaded);
        true
    })
}

/// Logs each file error once, when it appears or changes, and a file's
/// warnings when they change; counts the limits hit in
/// `hdsd_dataplane_file_limit_hits_total`. Also sets
/// `hdsd_dataplane_document_cache_bytes` and
/// `hdsd_dataplane_document_cache_documents`: what the files' kept parses
/// hold now. Returns the number of file errors it logged.
pub fn log_problems(loaded: &Loaded, before: &Loaded) -> usize {
    let (bytes, documents) = loaded.document_cache();
    crate::metrics::document_cache(bytes, documents);
    let mut logged = 0;
    for (path, state) in &loaded.files {
        if before.files.get(path).map(|f| &f.warnings) != Some(&state.warnings) {
            for w in &state.warnings {
                tracing::warn!(file = %path.display(), line = w.line, "{}", w.message);
            }
        }
        let Some(error) = &state.error else { continue };
        if before.files.get(path).and_then(|f| f.error.as_ref()) == Some(error) {
            continue;
        }
        if let Some(limit) = error.limit {
            crate::metrics::dataplane_file_limit_hit(limit.as_str());
        }
        let kept = state.dataplanes.len();
        tracing::error!(
            file = %path.display(),
            line = error.line,
            kept_dataplanes = kept,
            "dataplane file rejected: {}; its last good definitions stay in force",
            error.message
        );
        logged += 1;
    }
    logged
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

    use crate::dataplane::DataplaneId;

    fn doc(name: &str, port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {port}\n"
        )
    }

    fn names(l: &Loaded) -> Vec<String> {
        l.dataplanes.keys().map(|k| k.to_string()).collect()
    }

    /// An origin driven by the test: each message is what `next` yields;
    /// dropping the sender ends it. Also shows what a third origin is.
    struct Script {
        first: BTreeMap<PathBuf, FileRead>,
        next: mpsc::UnboundedReceiver<Result<Changed, DirError>>,
    }

    impl Origin for Script {
        type Error = DirError;
        fn root(&self) -> PathBuf {
            PathBuf::from("script")
        }
        async fn first(&mut self) -> Result<BTreeMap<PathBuf, FileRead>, DirError> {
            Ok(std::mem::take(&mut self.first))
        }
        async fn next(&mut self) -> Option<Result<Changed, DirError>> {
            self.next.recv().await
        }
    }

    fn script(
        first: &[(&str, String)],
    ) -> (Script, mpsc::UnboundedSender<Result<Changed, DirError>>) {
        let (tx, next) = mpsc::unbounded_channel();
        let first = first
            .iter()
            .map(|(p, t)| (PathBuf::from(p), Ok(t.clone())))
            .collect();
        (Script { first, next }, tx)
    }

    fn one(path: &str, text: Option<String>) -> Result<Changed, DirError> {
        Ok(Changed::Files([(PathBuf::from(path), text.map(Ok))].into()))
    }

    async fn until(
        rx: &mut watch::Receiver<Arc<Loaded>>,
        what: &str,
        f: impl FnMut(&Arc<Loaded>) -> bool,
    ) -> Arc<Loaded> {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(f))
            .await
            .unwrap_or_else(|_| panic!("{what} did not come"))
            .expect("the writer ended")
            .clone()
    }

    #[tokio::test]
    async fn the_writer_applies_each_change_and_survives_a_failed_read() {
        let (origin, send) = script(&[("a.yaml", doc("a", 1))]);
        let (mut rx, task) = following(origin, Default::default()).await.unwrap();
        let first = rx.borrow().clone();
        assert_eq!(names(&first), ["default.a"]);
        assert_eq!(first.dir, PathBuf::from("script"), "the origin's root");
        let body = async move {
            send.send(one("b.yaml", Some(doc("b", 2)))).unwrap();
            let second = until(&mut rx, "b", |l| l.dataplanes.len() == 2).await;
            assert_eq!(second.revision(), first.revision() + 1);
            // A failed read keeps the snapshot; the next change still lands.
            send.send(Err(DirError {
                dir: "script".into(),
                source: std::io::Error::other("gone for a moment"),
            }))
            .unwrap();
            // The same content again: the revision does not move, nothing
            // is published.
            send.send(one("b.yaml", Some(doc("b", 2)))).unwrap();
            send.send(one("a.yaml", None)).unwrap();
            let third = until(&mut rx, "a gone", |l| l.dataplanes.len() == 1).await;
            assert_eq!(names(&third), ["default.b"]);
            assert_eq!(third.revision(), second.revision() + 1);
            // Everything: a file not named is gone.
            send.send(Ok(Changed::Everything(
                [(PathBuf::from("c.yaml"), Ok(doc("c", 3)))].into(),
            )))
            .unwrap();
            let fourth = until(&mut rx, "c alone", |l| {
                l.dataplanes.contains_key(&DataplaneId::new("default", "c"))
            })
            .await;
            assert_eq!(names(&fourth), ["default.c"]);
            send
        };
        let mut task = std::pin::pin!(task);
        let send = tokio::select! {
            () = &mut task => panic!("the writer ended before its origin"),
            send = body => send,
        };
        // The origin ends: so does the writer.
        drop(send);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the writer did not end with its origin");
    }

    #[tokio::test]
    async fn the_writer_ends_when_no_reader_is_left() {
        let (origin, _send) = script(&[]);
        let (rx, task) = following(origin, Default::default()).await.unwrap();
        drop(rx);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the writer outlived its readers");
    }

    #[test]
    fn a_snapshot_of_the_same_revision_is_not_published() {
        let rules = Rules::default();
        let first = assembled(
            &Loaded::default(),
            Path::new("d"),
            Changed::Everything([(PathBuf::from("d/a.yaml"), Ok(doc("a", 1)))].into()),
            &rules,
        );
        let (tx, mut rx) = watch::channel(Arc::new(first.clone()));
        rx.mark_unchanged();
        let same = assembled(
            &first,
            Path::new("d"),
            Changed::Files([(PathBuf::from("d/a.yaml"), Some(Ok(doc("a", 1))))].into()),
            &rules,
        );
        assert!(!publish(&tx, &first, same));
        assert!(!rx.has_changed().unwrap());
        let moved = assembled(
            &first,
            Path::new("d"),
            Changed::Files([(PathBuf::from("d/a.yaml"), Some(Ok(doc("a", 2))))].into()),
            &rules,
        );
        assert!(publish(&tx, &first, moved));
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn a_file_error_is_logged_once_until_it_changes() {
        let rules = Rules::default();
        let apply = |previous: &Loaded, text: &str| {
            assembled(
                previous,
                Path::new("d"),
                Changed::Files([(PathBuf::from("d/a.yaml"), Some(Ok(text.to_string())))].into()),
                &rules,
            )
        };
        let good = apply(&Loaded::default(), &doc("a", 1));
        assert_eq!(log_problems(&good, &Loaded::default()), 0);
        let broken = apply(&good, "mesh: [");
        assert_eq!(log_problems(&broken, &good), 1, "a new error is logged");
        let still = apply(&broken, "mesh: [");
        assert_eq!(
            log_problems(&still, &broken),
            0,
            "the same error is not logged again"
        );
        let other = apply(
            &still,
            "type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: db.local\n",
        );
        assert_eq!(log_problems(&other, &still), 1, "a different error is");
        assert_eq!(
            names(&other),
            ["default.a"],
            "the last good definition stays"
        );
    }

    #[tokio::test]
    async fn the_directory_publishes_through_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), doc("a", 1)).unwrap();
        let rules = Arc::new(Rules::default());
        let origin = dir::Dir::open(dir.path().to_path_buf(), &rules.limits).unwrap();
        let (mut rx, task) = following(origin, rules).await.unwrap();
        assert_eq!(names(&rx.borrow()), ["default.a"]);
        assert_eq!(rx.borrow().dir, dir.path());
        let path = dir.path().to_path_buf();
        let body = async move {
            std::fs::write(path.join("b.yaml"), doc("b", 2)).unwrap();
            until(&mut rx, "b", |l| l.dataplanes.len() == 2).await;
            std::fs::write(path.join("b.yaml"), "mesh: [").unwrap();
            let broken = until(&mut rx, "b broken", |l| l.error_count() == 1).await;
            assert_eq!(broken.dataplanes.len(), 2, "the last good definition stays");
            std::fs::remove_file(path.join("a.yaml")).unwrap();
            let gone = until(&mut rx, "a gone", |l| l.dataplanes.len() == 1).await;
            assert_eq!(names(&gone), ["default.b"]);
        };
        tokio::select! {
            () = task => panic!("the writer ended"),
            () = body => {}
        }
    }

    #[tokio::test]
    async fn a_missing_directory_is_named_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let e = dir::Dir::open(dir.path().join("missing"), &FileLimits::default()).unwrap_err();
        assert!(
            e.to_string().contains("create it or point dataplanes.dir"),
            "{e}"
        );
    }
}
