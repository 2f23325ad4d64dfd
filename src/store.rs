//! The readiness store: per-inbound status, `since` and last report time
//! survive a restart of hdsd, so readiness does not flap while Envoys
//! reconnect.
//!
//! Writes are rare by construction: a dataplane's task sends its state only on
//! a status transition, plus its last report time at most once per report
//! interval. One writer task coalesces those updates and commits them as one
//! transaction per flush (at most every [`FLUSH_INTERVAL`]).
//!
//! The engine is redb (pure Rust, ACID, crash-safe, no C toolchain) behind
//! the [`ReadinessStore`] trait, so a shared store for several hdsd instances
//! can replace it later.
//!
//! Dataplane definitions (`dataplanes.source = "api"`) are kept behind the
//! [`definitions::DefinitionStore`] trait, with two engines: this redb file
//! ([`RedbStore`]) and PostgreSQL ([`postgres::PgStore`]); so are a
//! global's zones registered through its API ([`registrations`]).

pub mod definitions;
pub mod postgres;
pub mod registrations;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redb::{Builder, Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::clock::{Clock as _, SystemClock};
use crate::dataplane::{Dataplane, DataplaneId};
use crate::readiness::{Health, InboundHealth, Status, Timestamp};
use crate::specifier::Specifier;

/// What is kept of one dataplane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHealth {
    pub inbounds: Vec<StoredInbound>,
    #[serde(serialize_with = "rfc3339::option")]
    pub last_report_at: Option<Timestamp>,
    /// [`crate::readiness::Health::reattached_at`]: written on an attach so
    /// that the other instances of a cluster restart the stale window too.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "rfc3339::option"
    )]
    pub reattached_at: Option<Timestamp>,
}

/// What is kept of one inbound, with what identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredInbound {
    pub address: IpAddr,
    pub port: u16,
    /// The probe target the status was reported for.
    pub target: Option<SocketAddr>,
    pub status: String,
    #[serde(serialize_with = "rfc3339::one")]
    pub since: Timestamp,
    #[serde(serialize_with = "rfc3339::option")]
    pub last_report_at: Option<Timestamp>,
}

/// Timestamps written as RFC 3339 with nanoseconds by humantime's
/// formatter: one write of a fixed buffer, where chrono's writes each
/// field through `core::fmt` (a quarter of the instructions of a steady
/// report went there, since every report updates the stored
/// `last_report_at`). chrono reads both forms, so the stored format is
/// unchanged for every version that reads it.
mod rfc3339 {
    use std::time::SystemTime;

    use serde::Serializer;

    use crate::clock::Timestamp;

    pub fn one<S: Serializer>(at: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        // humantime formats years 1970 to 9999 only.
        let in_range = (0..253_402_300_800).contains(&at.timestamp());
        if in_range {
            s.collect_str(&humantime::format_rfc3339_nanos(SystemTime::from(*at)))
        } else {
            serde::Serialize::serialize(at, s)
        }
    }

    pub fn option<S: Serializer>(at: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => one(at, s),
            None => s.serialize_none(),
        }
    }
}

/// The stored form of a dataplane's health.
pub fn snapshot(dataplane: &Dataplane, specifier: &Specifier, health: &Health) -> StoredHealth {
    StoredHealth {
        inbounds: dataplane
            .inbounds
            .iter()
            .zip(&health.inbounds)
            .enumerate()
            .map(|(i, (inbound, h))| StoredInbound {
                address: inbound.address,
                port: inbound.port,
                target: specifier.target_of_inbound[i].map(|t| specifier.targets[t].endpoint),
                status: h.status.as_str().to_string(),
                since: h.since,
                last_report_at: h.last_report_at,
            })
            .collect(),
        last_report_at: health.last_report_at,
        reattached_at: health.reattached_at,
    }
}

/// Takes the stored state of every inbound that is still probed at the same
/// target; the others keep `fresh`'s state (pending / not probed).
pub fn restore(
    stored: &StoredHealth,
    dataplane: &Dataplane,
    specifier: &Specifier,
    fresh: Health,
) -> Health {
    let mut health = fresh;
    for (i, inbound) in dataplane.inbounds.iter().enumerate() {
        let target = specifier.target_of_inbound[i].map(|t| specifier.targets[t].endpoint);
        if target.is_none() {
            continue;
        }
        let found = stored
            .inbounds
            .iter()
            .find(|s| s.address == inbound.address && s.port == inbound.port && s.target == target);
        if let Some(s) = found {
            if let Some(status) = Status::from_name(&s.status) {
                health.inbounds[i] = InboundHealth {
                    last_report_at: s.last_report_at,
                    ..InboundHealth::new(status, s.since)
                };
            }
        }
    }
    health.last_report_at = stored.last_report_at;
    health.reattached_at = stored.reattached_at;
    health
}

/// A store failure. Never fatal: hdsd keeps serving from memory.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("readiness store {path}: {message}")]
    Engine { path: PathBuf, message: String },
    #[error("PostgreSQL store: {0}; check that the database named by store.postgres.url is up and reachable")]
    Postgres(String),
}

/// Where readiness state is kept.
pub trait ReadinessStore: Send + Sync + Debug + 'static {
    /// Everything stored, by dataplane.
    fn load(&self) -> Result<BTreeMap<DataplaneId, StoredHealth>, StoreError>;
    /// Applies a batch atomically: `Some` upserts, `None` deletes.
    fn write(&self, batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<(), StoreError>;
}

const TABLE: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("readiness");

/// The most memory redb may use to cache the store's pages (its default is
/// 1 GiB). A dataplane with 2 inbounds takes about 0.6 KiB in the file (its
/// JSON record, key and B-tree overhead), so 32 MiB holds the whole table of
/// about 50k such dataplanes; a larger table still works, reading the pages
/// it misses from the file. The cache fills as pages are used: a small fleet
/// costs its table's size, not the bound.
pub const CACHE_SIZE: usize = 32 * 1024 * 1024;

fn create(path: &Path) -> Result<Database, redb::DatabaseError> {
    Builder::new().set_cache_size(CACHE_SIZE).create(path)
}

/// The least time between two attempts to reopen a store file that failed.
pub const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// The store's open file. redb refuses every operation after one that
/// failed with an I/O error (a full disk, say) until the file is opened
/// again, so an operation that fails marks the file, and the next one
/// (at most one per [`REOPEN_INTERVAL`]) reopens it once no other operation
/// holds it: writes resume when the disk has room again.
#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    state: Mutex<FileState>,
}

#[derive(Debug)]
struct FileState {
    /// `None` after a reopen that failed.
    db: Option<Arc<Database>>,
    failed: bool,
    last_reopen: Option<Instant>,
}

impl OpenFile {
    fn new(path: &Path, db: Database) -> OpenFile {
        OpenFile {
            path: path.to_path_buf(),
            state: Mutex::new(FileState {
                db: Some(Arc::new(db)),
                failed: false,
                last_reopen: None,
            }),
        }
    }

    /// The database to use now, reopened first if an operation failed.
    fn get(&self) -> Result<Arc<Database>, String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due = state
            .last_reopen
            .is_none_or(|at| at.elapsed() >= REOPEN_INTERVAL);
        if state.failed && due {
            state.last_reopen = Some(Instant::now());
            if let Some(db) = state.db.take() {
                // Another operation still holds it: the next one reopens.
                if let Err(db) = Arc::try_unwrap(db) {
                    state.db = Some(db);
                }
            }
            if state.db.is_none() {
                // redb takes a lock on the file: the old handle is closed.
                match create(&self.path) {
                    Ok(db) => {
                        state.db = Some(Arc::new(db));
                        state.failed = false;
                        tracing::info!(file = %self.path.display(), "reopened the store file after a failed operation");
                    }
                    Err(e) => {
                        tracing::debug!(file = %self.path.display(), "cannot reopen the store file yet: {e}")
                    }
                }
            }
        }
        state.db.clone().ok_or_else(|| {
            "the store file could not be reopened after a failed operation; hdsd tries again at the next one".to_string()
        })
    }

    /// Runs `f` on the database; a failure marks the file for reopening.
    fn run<T>(&self, f: impl FnOnce(&Database) -> Result<T, String>) -> Result<T, String> {
        let db = self.get()?;
        let result = f(&db);
        drop(db);
        if result.is_err() {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).failed = true;
        }
        result
    }
}

/// The embedded redb store, one file under `state_dir`.
#[derive(Debug)]
pub struct RedbStore {
    file: Arc<OpenFile>,
    path: PathBuf,
    /// Tells the definitions' readers about each committed change.
    changes: tokio::sync::broadcast::Sender<definitions::DefinitionChange>,
}

impl RedbStore {
    /// Opens (or creates) the store. A file that cannot be opened as a store
    /// is moved aside (`<file>.corrupt-<time>`) with a log line, and an empty
    /// store takes its place: the state refills within one report interval.
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
        let err = |message: String| StoreError::Engine {
            path: path.to_path_buf(),
            message,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| err(format!("cannot create its directory: {e}")))?;
        }
        let db = match create(path) {
            Ok(db) => db,
            Err(e) if path.exists() => {
                let aside = path.with_extension(format!(
                    "redb.corrupt-{}",
                    SystemClock.now().format("%Y%m%dT%H%M%SZ")
                ));
                tracing::error!(
                    file = %path.display(),
                    moved_to = %aside.display(),
                    "readiness store is unreadable ({e}); moved it aside and starting empty: readiness refills from the next reports"
                );
                std::fs::rename(path, &aside)
                    .map_err(|e| err(format!("cannot move the corrupt file aside: {e}")))?;
                create(path).map_err(|e| err(e.to_string()))?
            }
            Err(e) => return Err(err(e.to_string())),
        };
        let store = RedbStore {
            file: Arc::new(OpenFile::new(path, db)),
            path: path.to_path_buf(),
            changes: tokio::sync::broadcast::channel(definitions::CHANGES_BUFFER).0,
        };
        // Make sure the tables exist so that reads of a new store succeed.
        store.write(&[])?;
        store
            .file
            .run(|db| {
                definitions::redb_create_tables(db).map_err(|e| e.to_string())?;
                registrations::redb_create_tables(db).map_err(|e| e.to_string())
            })
            .map_err(|e| store.err(e))?;
        Ok(store)
    }

    /// Runs `f` on the blocking pool (redb's calls block).
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, String> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = self.file.clone();
        match tokio::task::spawn_blocking(move || file.run(f)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(message)) => Err(self.err(message)),
            Err(e) => Err(self.err(format!("store task failed: {e}"))),
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Engine {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }
}

impl ReadinessStore for RedbStore {
    fn load(&self) -> Result<BTreeMap<DataplaneId, StoredHealth>, StoreError> {
        self.file.run(load_readiness).map_err(|e| self.err(e))
    }

    fn write(&self, batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<(), StoreError> {
        self.file
            .run(|db| write_readiness(db, batch))
            .map_err(|e| self.err(e))
    }
}

fn load_readiness(db: &Database) -> Result<BTreeMap<DataplaneId, StoredHealth>, String> {
    let e = |e: redb::Error| e.to_string();
    let tx = db.begin_read().map_err(|x| e(x.into()))?;
    let table = tx.open_table(TABLE).map_err(|x| e(x.into()))?;
    let mut out = BTreeMap::new();
    for entry in table.iter().map_err(|x| e(x.into()))? {
        let (key, value) = entry.map_err(|x| e(x.into()))?;
        let Ok(id) = key.value().parse::<DataplaneId>() else {
            continue;
        };
        match serde_json::from_slice::<StoredHealth>(value.value()) {
            Ok(h) => {
                out.insert(id, h);
            }
            Err(e) => {
                tracing::warn!(dataplane = %id, "ignoring an unreadable stored readiness entry: {e}")
            }
        }
    }
    Ok(out)
}

fn write_readiness(
    db: &Database,
    batch: &[(DataplaneId, Option<StoredHealth>)],
) -> Result<(), String> {
    let e = |e: redb::Error| e.to_string();
    let tx = db.begin_write().map_err(|x| e(x.into()))?;
    {
        let mut table = tx.open_table(TABLE).map_err(|x| e(x.into()))?;
        for (id, value) in batch {
            let key = id.to_string();
            match value {
                Some(h) => {
                    let bytes = serde_json::to_vec(h).map_err(|x| x.to_string())?;
                    table
                        .insert(key.as_str(), bytes.as_slice())
                        .map_err(|x| e(x.into()))?;
                }
                None => {
                    table.remove(key.as_str()).map_err(|x| e(x.into()))?;
                }
            }
        }
    }
    tx.commit().map_err(|x| e(x.into()))
}

/// The longest a change waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// How often updates kept after a failed write are tried again while no
/// new update comes.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

enum Message {
    Put(DataplaneId, Option<StoredHealth>),
    Flush(oneshot::Sender<()>),
}

/// Sends updates to the store's writer task. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreHandle {
    tx: mpsc::UnboundedSender<Message>,
    /// Updates kept in memory because the store refused them (written by
    /// the writer task only).
    pending: Arc<AtomicUsize>,
}

/// Why the shared store is taken for unreachable, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub since: Timestamp,
    pub error: String,
}

/// Whether the shared store answers, as this instance's heartbeat finds
/// (its single writer): `/readyz` reads it, `hdsd_store_up` shows it, and
/// each change is logged once. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    down: Arc<watch::Sender<Option<Down>>>,
    pending: Arc<AtomicUsize>,
    describe: String,
}

impl StoreStatus {
    /// Up; `handle` tells how many readiness updates wait for the store.
    pub fn new(describe: String, handle: &StoreHandle) -> StoreStatus {
        metrics::gauge!(crate::metrics::STORE_UP).set(1.0);
        StoreStatus {
            down: Arc::new(watch::channel(None).0),
            pending: handle.pending.clone(),
            describe,
        }
    }

    /// The store answered.
    pub fn up(&self) {
        if let Some(down) = self.down.send_replace(None) {
            metrics::gauge!(crate::metrics::STORE_UP).set(1.0);
            let after = (SystemClock.now() - down.since)
                .to_std()
                .unwrap_or_default();
            tracing::info!(
                "{} reachable again after {}; the {} readiness update(s) kept meanwhile are written with the next batch",
                self.describe,
                humantime::format_duration(Duration::from_secs(after.as_secs())),
                self.pending()
            );
        }
    }

    /// The store did not answer.
    pub fn down(&self, error: &str) {
        let changed = self.down.send_if_modified(|down| {
            if down.is_some() {
                return false;
            }
            *down = Some(Down {
                since: SystemClock.now(),
                error: error.to_string(),
            });
            true
        });
        if changed {
            metrics::gauge!(crate::metrics::STORE_UP).set(0.0);
            tracing::error!(
                "{} unreachable ({error}); this instance keeps serving HDS and folding reports from memory, definition writes answer 503, readiness updates are queued (one per dataplane) until it returns (logged once until it does)",
                self.describe
            );
        }
    }

    /// `Some` while the store is unreachable.
    pub fn current(&self) -> Option<Down> {
        self.down.borrow().clone()
    }

    /// Readiness updates waiting for the store.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The line `/readyz` shows.
    pub fn readyz_line(&self, now: Timestamp) -> String {
        match self.current() {
            None => format!("store: {} reachable", self.describe),
            Some(down) => format!(
                "store: {} unreachable since {} ({} ago; {}): still serving HDS and folding reports from memory; definition writes answer 503; {} readiness update(s) queued (at most one per dataplane), written with the first batch after it returns",
                self.describe,
                down.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                humantime::format_duration(Duration::from_secs(
                    (now - down.since).to_std().unwrap_or_default().as_secs()
                )),
                down.error,
                self.pending()
            ),
        }
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Put(id, v) => write!(f, "Put({id}, {})", v.is_some()),
            Message::Flush(_) => f.write_str("Flush"),
        }
    }
}

impl StoreHandle {
    /// Starts the writer task for `store`, for a test: hdsd itself hands
    /// the task to its supervisor ([`StoreHandle::start`]).
    #[cfg(test)]
    pub fn spawn(store: Arc<dyn ReadinessStore>) -> StoreHandle {
        let (handle, task) = StoreHandle::start(store);
        tokio::spawn(task);
        handle
    }

    /// The handle of `store`'s writer and the writer's task, for the caller
    /// to run (the server supervises it). The task ends once every handle
    /// is dropped.
    pub fn start(
        store: Arc<dyn ReadinessStore>,
    ) -> (
        StoreHandle,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let task = run_writer(store, rx, pending.clone());
        (StoreHandle { tx, pending }, task)
    }

    /// Queues the state of one dataplane (`None`: it was deleted).
    pub fn put(&self, id: DataplaneId, value: Option<StoredHealth>) {
        let _ = self.tx.send(Message::Put(id, value));
    }

    /// Writes everything queued so far; returns when it is on disk. False
    /// when the writer is gone (its task ended): what was queued since its
    /// last write is lost.
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Message::Flush(tx)).is_err() {
            return false;
        }
        rx.await.is_ok()
    }
}

async fn run_writer(
    store: Arc<dyn ReadinessStore>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    kept: Arc<AtomicUsize>,
) {
    let mut pending: BTreeMap<DataplaneId, Option<StoredHealth>> = BTreeMap::new();
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    // Failures are logged when they start and when they end, not per batch.
    let mut failing = false;
    loop {
        // Updates kept after a failure are tried again on their own, not
        // only with the next update: a dataplane whose Envoy goes on
        // reporting may write nothing new for `stale_after`.
        let first = if pending.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(RETRY_INTERVAL, rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    write_batch(&store, &mut pending, &mut failing, &kept).await;
                    continue;
                }
            }
        };
        let Some(first) = first else { break };
        let deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
        let mut next = Some(first);
        // Coalesce until the deadline, or at once when someone waits for a flush.
        loop {
            match next.take() {
                Some(Message::Put(id, v)) => {
                    pending.insert(id, v);
                }
                Some(Message::Flush(done)) => {
                    waiters.push(done);
                    break;
                }
                None => {}
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(m)) => next = Some(m),
                _ => break,
            }
        }
        write_batch(&store, &mut pending, &mut failing, &kept).await;
        for w in waiters.drain(..) {
            let _ = w.send(());
        }
    }
    write_batch(&store, &mut pending, &mut failing, &kept).await;
}

async fn write_batch(
    store: &Arc<dyn ReadinessStore>,
    pending: &mut BTreeMap<DataplaneId, Option<StoredHealth>>,
    failing: &mut bool,
    kept: &AtomicUsize,
) {
    if pending.is_empty() {
        return;
    }
    let batch: Vec<_> = std::mem::take(pending).into_iter().collect();
    let count = batch.len();
    // A batch being written is still waiting (a write can hang for as long
    // as the store does not answer).
    kept.store(count, Ordering::Relaxed);
    metrics::gauge!(crate::metrics::STORE_PENDING_WRITES).set(count as f64);
    let store = store.clone();
    let written = tokio::task::spawn_blocking(move || {
        let result = store.write(&batch);
        (result, batch)
    })
    .await;
    match written {
        Ok((Ok(()), _)) => {
            metrics::counter!(crate::metrics::STORE_COMMITS).increment(1);
            tracing::debug!(dataplanes = count, "readiness store: wrote batch");
            if std::mem::take(failing) {
                tracing::info!(
                    "readiness store: writing again; the updates kept meanwhile are written"
                );
            }
        }
        Ok((Err(e), batch)) => {
            // Kept for the next batch (one entry per dataplane at most: the
            // queue is bounded by the fleet); a newer update of the same
            // dataplane replaces it.
            for (id, value) in batch {
                pending.entry(id).or_insert(value);
            }
            metrics::counter!(crate::metrics::STORE_WRITE_FAILURES).increment(1);
            if !std::mem::replace(failing, true) {
                tracing::error!("{e}; keeping readiness updates in memory (one per dataplane) and writing them with the next batch that succeeds (logged once until writes succeed again)")
            }
        }
        Err(e) => tracing::error!("readiness store writer failed: {e}"),
    }
    kept.store(pending.len(), Ordering::Relaxed);
    metrics::gauge!(crate::metrics::STORE_PENDING_WRITES).set(pending.len() as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> Timestamp {
        chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn stored(status: &str) -> StoredHealth {
        StoredHealth {
            inbounds: vec![StoredInbound {
                address: "127.0.0.1".parse().unwrap(),
                port: 10001,
                target: Some("127.0.0.1:8080".parse().unwrap()),
                status: status.into(),
                since: t(1),
                last_report_at: Some(t(2)),
            }],
            last_report_at: Some(t(2)),
            reattached_at: None,
        }
    }

    #[test]
    fn a_failed_operation_reopens_the_file_once_nothing_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("r.redb")).unwrap();
        let file = &store.file;
        let first = file.get().unwrap();
        // A failure while another operation holds the file: kept open.
        let failed: Result<(), String> = file.run(|_| Err("No space left on device".into()));
        assert!(failed.is_err());
        let held = file.get().unwrap();
        assert!(Arc::ptr_eq(&first, &held), "reopened while in use");
        drop((first, held));
        let old = Arc::downgrade(file.state.lock().unwrap().db.as_ref().unwrap());
        // Not within the interval since the last attempt.
        file.get().unwrap();
        assert!(old.upgrade().is_some(), "reopened within the interval");
        file.state.lock().unwrap().last_reopen = None;
        let reopened = file.get().unwrap();
        assert!(old.upgrade().is_none(), "not reopened");
        assert!(!file.state.lock().unwrap().failed);
        drop(reopened);
        // And the reopened file reads and writes.
        let id: DataplaneId = "default.web-01".parse().unwrap();
        store
            .write(&[(id.clone(), Some(stored("healthy")))])
            .unwrap();
        assert_eq!(store.load().unwrap()[&id], stored("healthy"));
    }

    #[test]
    fn timestamps_are_stored_as_rfc3339_that_chrono_reads_back() {
        let mut health = stored("healthy");
        let at = chrono::Utc
            .timestamp_opt(1_700_000_000, 123_456_789)
            .unwrap();
        health.last_report_at = Some(at);
        health.inbounds[0].since = chrono::Utc.timestamp_opt(-86_400, 5).unwrap();
        let json = serde_json::to_string(&health).unwrap();
        assert!(
            json.contains(r#""last_report_at":"2023-11-14T22:13:20.123456789Z""#),
            "{json}"
        );
        // Before 1970 (only a hand-edited store has one): chrono's form.
        assert!(
            json.contains(r#""since":"1969-12-31T00:00:00.000000005Z""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<StoredHealth>(&json).unwrap(), health);
        // What chrono wrote before reads the same.
        let old = json.replace(
            "2023-11-14T22:13:20.123456789Z",
            "2023-11-14T22:13:20.123456789+00:00",
        );
        assert_eq!(serde_json::from_str::<StoredHealth>(&old).unwrap(), health);
    }

    #[test]
    fn round_trip_upsert_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readiness.redb");
        let a = DataplaneId::new("default", "a");
        let b = DataplaneId::new("default", "b");
        {
            let store = RedbStore::open(&path).unwrap();
            assert!(store.load().unwrap().is_empty());
            store
                .write(&[
                    (a.clone(), Some(stored("healthy"))),
                    (b.clone(), Some(stored("unhealthy"))),
                ])
                .unwrap();
            store.write(&[(b.clone(), None)]).unwrap();
        }
        let store = RedbStore::open(&path).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[&a], stored("healthy"));
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_and_the_store_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readiness.redb");
        std::fs::write(&path, b"this is not a database, it is a sandwich").unwrap();
        let store = RedbStore::open(&path).unwrap();
        assert!(store.load().unwrap().is_empty());
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1);
    }

    /// A store that refuses writes while `down` is set.
    #[derive(Debug, Default)]
    struct Flaky {
        down: std::sync::atomic::AtomicBool,
        rows: std::sync::Mutex<BTreeMap<DataplaneId, StoredHealth>>,
    }

    impl ReadinessStore for Flaky {
        fn load(&self) -> Result<BTreeMap<DataplaneId, StoredHealth>, StoreError> {
            Ok(self.rows.lock().unwrap().clone())
        }
        fn write(&self, batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<(), StoreError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Postgres("down".into()));
            }
            let mut rows = self.rows.lock().unwrap();
            for (id, v) in batch {
                match v {
                    Some(h) => rows.insert(id.clone(), h.clone()),
                    None => rows.remove(id),
                };
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn updates_that_failed_are_written_when_the_store_answers_again() {
        let store = Arc::new(Flaky::default());
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let handle = StoreHandle::spawn(store.clone());
        let (a, b) = (
            DataplaneId::new("default", "a"),
            DataplaneId::new("default", "b"),
        );
        handle.put(a.clone(), Some(stored("unhealthy")));
        handle.put(b.clone(), Some(stored("healthy")));
        handle.flush().await;
        assert!(store.load().unwrap().is_empty());
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
        // A newer update of `a` wins over the kept one; `b` is written as kept.
        handle.put(a.clone(), Some(stored("healthy")));
        handle.flush().await;
        let rows = store.load().unwrap();
        assert_eq!(rows[&a], stored("healthy"));
        assert_eq!(rows[&b], stored("healthy"));
    }

    /// Kept updates are written once the store answers again, with no new
    /// update to carry them.
    #[tokio::test(start_paused = true)]
    async fn kept_updates_are_tried_again_without_a_new_update() {
        let store = Arc::new(Flaky::default());
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let handle = StoreHandle::spawn(store.clone());
        let a = DataplaneId::new("default", "a");
        handle.put(a.clone(), Some(stored("unhealthy")));
        handle.flush().await;
        assert!(store.load().unwrap().is_empty());
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..100 {
            if !store.load().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(store.load().unwrap().get(&a), Some(&stored("unhealthy")));
    }

    #[tokio::test]
    async fn the_status_tells_since_when_the_store_is_down_and_what_waits() {
        let store = Arc::new(Flaky::default());
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let handle = StoreHandle::spawn(store.clone());
        let status = StoreStatus::new("the store".into(), &handle);
        assert_eq!(status.readyz_line(t(0)), "store: the store reachable");
        handle.put(DataplaneId::new("default", "a"), Some(stored("healthy")));
        handle.flush().await;
        status.down("connection refused");
        let since = status.current().unwrap().since;
        // A second failure is the same outage: same start, same error.
        status.down("timed out");
        assert_eq!(
            status.current(),
            Some(Down {
                since,
                error: "connection refused".into()
            })
        );
        let line = status.readyz_line(since + chrono::Duration::seconds(12));
        assert!(
            line.starts_with(&format!(
                "store: the store unreachable since {} (12s ago; connection refused): still serving HDS",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )),
            "{line}"
        );
        assert!(line.contains("1 readiness update(s) queued"), "{line}");
        status.up();
        assert_eq!(status.current(), None);
        assert_eq!(status.readyz_line(t(0)), "store: the store reachable");
    }

    #[tokio::test]
    async fn the_writer_coalesces_and_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ReadinessStore> =
            Arc::new(RedbStore::open(&dir.path().join("r.redb")).unwrap());
        let handle = StoreHandle::spawn(store.clone());
        let a = DataplaneId::new("default", "a");
        handle.put(a.clone(), Some(stored("unhealthy")));
        handle.put(a.clone(), Some(stored("healthy")));
        handle.flush().await;
        assert_eq!(store.load().unwrap()[&a], stored("healthy"));
    }
}
