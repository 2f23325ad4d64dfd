//! Dataplane definitions kept in a store (`dataplanes.source = "api"`).
//!
//! - [`DefinitionStore`] is the one trait with two engines: the embedded redb
//!   file ([`RedbStore`], one instance) and PostgreSQL
//!   ([`super::postgres::PgStore`], several instances). Each stored document
//!   carries a revision: writes may be conditional on it (`If-Match`), and
//!   every committed change is announced on [`DefinitionStore::changes`].
//! - [`check_document`] is the validation of a `PUT` (pure): the same parser
//!   and specifier builder as the files, so the same rules and messages.
//! - [`watch`] turns the store into the same [`Loaded`] snapshots the
//!   directory source publishes: each stored definition is a "file" named
//!   `<mesh>/<name>.yaml|json`, so the registry picks API writes up exactly
//!   as it picks file changes (one catalog path, one writer).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch as watch_channel};

use super::{RedbStore, StoreError};
use crate::dataplane::{self, Dataplane, DataplaneId, FileLimits, Format};
use crate::source::{self, FileRead, Loaded};
use crate::specifier::{build, Specifier, SpecifierError, SpecifierSettings};

/// One stored definition: the document as it was sent, and its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDefinition {
    pub id: DataplaneId,
    pub format: DocumentFormat,
    pub document: String,
    /// Increases with every write; the `ETag`.
    pub revision: u64,
}

/// The form a document was sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocumentFormat {
    Yaml,
    Json,
}

impl DocumentFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentFormat::Yaml => "yaml",
            DocumentFormat::Json => "json",
        }
    }

    pub fn from_name(name: &str) -> Option<DocumentFormat> {
        match name {
            "yaml" => Some(DocumentFormat::Yaml),
            "json" => Some(DocumentFormat::Json),
            _ => None,
        }
    }

    fn parser(self) -> Format {
        match self {
            DocumentFormat::Yaml => Format::Yaml,
            DocumentFormat::Json => Format::Json,
        }
    }
}

/// What a conditional write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Whatever is there (no `If-Match`).
    Any,
    /// Nothing (`If-None-Match: *`).
    Absent,
    /// Something (`If-Match: *`).
    Present,
    /// Exactly this revision (`If-Match: "<revision>"`).
    Revision(u64),
}

impl Precondition {
    fn holds(self, current: Option<u64>) -> bool {
        match (self, current) {
            (Precondition::Any, _) => true,
            (Precondition::Absent, current) => current.is_none(),
            (Precondition::Present, current) => current.is_some(),
            (Precondition::Revision(want), Some(have)) => want == have,
            (Precondition::Revision(_), None) => false,
        }
    }
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The precondition does not hold: `current` is what is stored now.
    #[error("the stored definition is at revision {current:?}, not the one expected")]
    Conflict { current: Option<u64> },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A stored definition's identity, revision and format, without its
/// document ([`DefinitionStore::revisions`]).
pub type DefinitionRevision = (DataplaneId, u64, DocumentFormat);

/// A change announced by a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefinitionChange {
    /// One definition was written or deleted.
    One(DataplaneId),
    /// Anything may have changed (a reconnect, a periodic reconcile): read all.
    All,
}

/// How many announced changes a slow reader may fall behind before it reads
/// everything again.
pub const CHANGES_BUFFER: usize = 1024;

/// A boxed future, so that the trait can be used as `dyn`.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where definitions are kept. Two engines: redb and PostgreSQL.
pub trait DefinitionStore: Send + Sync + Debug + 'static {
    /// What the store is, for messages and `/api/v1/sources`.
    fn describe(&self) -> String;
    /// Every stored definition.
    fn list(&self) -> StoreFuture<'_, Result<Vec<StoredDefinition>, StoreError>>;
    fn get<'a>(
        &'a self,
        id: &'a DataplaneId,
    ) -> StoreFuture<'a, Result<Option<StoredDefinition>, StoreError>>;
    /// Writes a definition if `expect` holds; returns what is stored now.
    fn put<'a>(
        &'a self,
        id: &'a DataplaneId,
        format: DocumentFormat,
        document: &'a str,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<StoredDefinition, WriteError>>;
    /// Deletes a definition if `expect` holds; `false` when there was none.
    fn delete<'a>(
        &'a self,
        id: &'a DataplaneId,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<bool, WriteError>>;
    /// Committed changes (of any instance sharing the store), from now on.
    fn changes(&self) -> broadcast::Receiver<DefinitionChange>;
    /// Every stored definition's revision and format, without its
    /// document: what a reconcile compares before it reads documents.
    fn revisions(&self) -> StoreFuture<'_, Result<Vec<DefinitionRevision>, StoreError>> {
        Box::pin(async move {
            Ok(self
                .list()
                .await?
                .into_iter()
                .map(|d| (d.id, d.revision, d.format))
                .collect())
        })
    }
    /// The stored definitions among `ids` (one deleted is left out).
    fn get_many<'a>(
        &'a self,
        ids: &'a [DataplaneId],
    ) -> StoreFuture<'a, Result<Vec<StoredDefinition>, StoreError>> {
        Box::pin(async move {
            let mut found = Vec::with_capacity(ids.len());
            for id in ids {
                found.extend(self.get(id).await?);
            }
            Ok(found)
        })
    }
}

const DEFINITIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("definitions");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const REVISION: &str = "definition_revision";

/// Creates the definitions' tables of a redb store.
pub(super) fn redb_create_tables(db: &Database) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    tx.open_table(DEFINITIONS)?;
    tx.open_table(META)?;
    tx.commit()?;
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct RedbRecord {
    format: DocumentFormat,
    document: String,
    revision: u64,
}

impl RedbRecord {
    fn into_definition(self, id: DataplaneId) -> StoredDefinition {
        StoredDefinition {
            id,
            format: self.format,
            document: self.document,
            revision: self.revision,
        }
    }
}

fn redb_read(db: &Database, id: Option<&DataplaneId>) -> Result<Vec<StoredDefinition>, String> {
    let tx = db.begin_read().map_err(|e| e.to_string())?;
    let table = tx.open_table(DEFINITIONS).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut take = |key: &str, value: &[u8]| {
        let Ok(id) = key.parse::<DataplaneId>() else {
            return;
        };
        match serde_json::from_slice::<RedbRecord>(value) {
            Ok(r) => out.push(r.into_definition(id)),
            Err(e) => {
                tracing::warn!(dataplane = %id, "ignoring an unreadable stored definition: {e}")
            }
        }
    };
    match id {
        Some(id) => {
            let key = id.to_string();
            if let Some(v) = table.get(key.as_str()).map_err(|e| e.to_string())? {
                take(&key, v.value());
            }
        }
        None => {
            for entry in table.iter().map_err(|e| e.to_string())? {
                let (k, v) = entry.map_err(|e| e.to_string())?;
                take(k.value(), v.value());
            }
        }
    }
    Ok(out)
}

/// One write transaction: checks `expect` against the stored revision, then
/// writes (`Some`) or deletes (`None`). `Ok(None)`: the precondition failed,
/// with the current revision.
type RedbWrite = Result<Result<Option<StoredDefinition>, Option<u64>>, String>;

fn redb_write(
    db: &Database,
    id: &DataplaneId,
    new: Option<(DocumentFormat, &str)>,
    expect: Precondition,
) -> RedbWrite {
    let e = |e: redb::Error| e.to_string();
    let tx = db.begin_write().map_err(|x| e(x.into()))?;
    let key = id.to_string();
    let stored = {
        let mut table = tx.open_table(DEFINITIONS).map_err(|x| e(x.into()))?;
        let current = table
            .get(key.as_str())
            .map_err(|x| e(x.into()))?
            .and_then(|v| serde_json::from_slice::<RedbRecord>(v.value()).ok())
            .map(|r| r.revision);
        if !expect.holds(current) {
            return Ok(Err(current));
        }
        match new {
            Some((format, document)) => {
                let mut meta = tx.open_table(META).map_err(|x| e(x.into()))?;
                let revision = meta
                    .get(REVISION)
                    .map_err(|x| e(x.into()))?
                    .map(|v| v.value())
                    .unwrap_or(0)
                    + 1;
                meta.insert(REVISION, revision).map_err(|x| e(x.into()))?;
                let record = RedbRecord {
                    format,
                    document: document.to_string(),
                    revision,
                };
                let bytes = serde_json::to_vec(&record).map_err(|x| x.to_string())?;
                table
                    .insert(key.as_str(), bytes.as_slice())
                    .map_err(|x| e(x.into()))?;
                Some(record.into_definition(id.clone()))
            }
            None => {
                if current.is_none() {
                    None
                } else {
                    table.remove(key.as_str()).map_err(|x| e(x.into()))?;
                    None
                }
            }
        }
    };
    tx.commit().map_err(|x| e(x.into()))?;
    Ok(Ok(stored))
}

impl DefinitionStore for RedbStore {
    fn describe(&self) -> String {
        format!("redb store {}", self.path.display())
    }

    fn list(&self) -> StoreFuture<'_, Result<Vec<StoredDefinition>, StoreError>> {
        Box::pin(self.blocking(|db| redb_read(db, None)))
    }

    fn get<'a>(
        &'a self,
        id: &'a DataplaneId,
    ) -> StoreFuture<'a, Result<Option<StoredDefinition>, StoreError>> {
        let id = id.clone();
        Box::pin(async move {
            let found = self.blocking(move |db| redb_read(db, Some(&id))).await?;
            Ok(found.into_iter().next())
        })
    }

    fn put<'a>(
        &'a self,
        id: &'a DataplaneId,
        format: DocumentFormat,
        document: &'a str,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<StoredDefinition, WriteError>> {
        let (owned_id, document) = (id.clone(), document.to_string());
        Box::pin(async move {
            let written = self
                .blocking(move |db| redb_write(db, &owned_id, Some((format, &document)), expect))
                .await?;
            match written {
                Ok(Some(stored)) => {
                    let _ = self.changes.send(DefinitionChange::One(id.clone()));
                    Ok(stored)
                }
                Ok(None) => Err(WriteError::Store(self.err("the write stored nothing"))),
                Err(current) => Err(WriteError::Conflict { current }),
            }
        })
    }

    fn delete<'a>(
        &'a self,
        id: &'a DataplaneId,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<bool, WriteError>> {
        let owned_id = id.clone();
        Box::pin(async move {
            let existed = self
                .blocking(move |db| {
                    let existed = !redb_read(db, Some(&owned_id))?.is_empty();
                    Ok(redb_write(db, &owned_id, None, expect)?.map(|_| existed))
                })
                .await?;
            match existed {
                Ok(existed) => {
                    if existed {
                        let _ = self.changes.send(DefinitionChange::One(id.clone()));
                    }
                    Ok(existed)
                }
                Err(current) => Err(WriteError::Conflict { current }),
            }
        })
    }

    fn changes(&self) -> broadcast::Receiver<DefinitionChange> {
        self.changes.subscribe()
    }
}

/// Why a document cannot be stored: every problem, each with its rule's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub problems: Vec<String>,
}

/// Validates a document for `id` as the directory source would validate a
/// file holding it: parse (YAML or JSON, Kuma's format), then build its
/// specifier. It must define exactly the dataplane `id`; documents of other
/// resource types beside it are ignored, as in files. The limits of
/// dataplane files (`dataplanes.max_*`) apply to a document as to a file.
pub fn check_document(
    id: &DataplaneId,
    format: DocumentFormat,
    document: &str,
    limits: &FileLimits,
    build: &mut dyn FnMut(&Dataplane) -> Result<Specifier, SpecifierError>,
) -> Result<(), Rejected> {
    let parsed =
        dataplane::parse_file_with(document, format.parser(), limits).map_err(|e| Rejected {
            problems: vec![e.to_string()],
        })?;
    let mut problems = Vec::new();
    match parsed.dataplanes.as_slice() {
        [] => problems.push(format!(
            "the document defines no Dataplane; send one `type: Dataplane` document with mesh: {} and name: {}",
            id.mesh, id.name
        )),
        [dp] if dp.id != *id => problems.push(format!(
            "the document defines dataplane {} (mesh {:?}, name {:?}) but the URL names {} (mesh {:?}, name {:?}); make them agree",
            dp.id, dp.id.mesh, dp.id.name, id, id.mesh, id.name
        )),
        [dp] => {
            if let Err(e) = build(dp) {
                problems.push(format!("dataplane {}: {e}", dp.id));
            }
        }
        many => problems.push(format!(
            "the document defines {} dataplanes; send one per request (`hdsd apply` splits files)",
            many.len()
        )),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Rejected { problems })
    }
}

/// The `Loaded.dir` of definitions from a store.
fn store_dir(store: &dyn DefinitionStore) -> PathBuf {
    PathBuf::from(store.describe())
}

/// The "file" a stored definition stands for in [`Loaded`].
pub fn path_of(id: &DataplaneId, format: DocumentFormat) -> PathBuf {
    PathBuf::from(format!("{}/{}.{}", id.mesh, id.name, format.as_str()))
}

fn files_of(definitions: Vec<StoredDefinition>) -> BTreeMap<PathBuf, FileRead> {
    definitions
        .into_iter()
        .map(|d| (path_of(&d.id, d.format), Ok(d.document)))
        .collect()
}

fn measured(
    settings: &SpecifierSettings,
) -> impl FnMut(&Dataplane) -> Result<Specifier, SpecifierError> + '_ {
    move |dp| {
        let started = std::time::Instant::now();
        let built = build(dp, settings);
        crate::metrics::specifier_built(built.is_ok(), started.elapsed());
        built
    }
}

/// Reads every definition once: the first snapshot. Each stored document
/// is held to the limits of a dataplane file.
pub async fn load(
    store: &dyn DefinitionStore,
    previous: &Loaded,
    settings: &SpecifierSettings,
    limits: &FileLimits,
) -> Result<Loaded, StoreError> {
    let files = files_of(store.list().await?);
    Ok(source::assemble_with(
        &store_dir(store),
        files,
        previous,
        limits,
        &mut measured(settings),
    ))
}

/// Follows the store's changes and publishes each new snapshot to `tx`
/// (which must hold the first one). A change to one definition reads that
/// one only; [`DefinitionChange::All`] and a lagging receiver read all. A
/// failed read is logged and retried at the next change. Runs until `tx`
/// has no receivers left.
pub async fn watch(
    store: Arc<dyn DefinitionStore>,
    settings: SpecifierSettings,
    limits: FileLimits,
    tx: watch_channel::Sender<Arc<Loaded>>,
    mut changes: broadcast::Receiver<DefinitionChange>,
) {
    // The revision and format of each definition read so far: a full read
    // parses only what changed since (a reconcile of an unchanged fleet
    // parses nothing). `None` until the first full read.
    let mut known: Option<BTreeMap<DataplaneId, (u64, DocumentFormat)>> = None;
    loop {
        let change = tokio::select! {
            change = changes.recv() => change,
            () = tx.closed() => return,
        };
        let previous = tx.borrow().clone();
        let next = match change {
            Ok(DefinitionChange::One(id)) => match store.get(&id).await {
                Ok(found) => {
                    let mut changed = removed(&id, None);
                    if let Some(known) = &mut known {
                        match &found {
                            Some(d) => known.insert(id.clone(), (d.revision, d.format)),
                            None => known.remove(&id),
                        };
                    }
                    if let Some(d) = found {
                        changed.insert(path_of(&id, d.format), Some(Ok(d.document)));
                    }
                    Ok(source::reassemble_with(
                        &previous,
                        changed,
                        &limits,
                        &mut measured(&settings),
                    ))
                }
                Err(e) => Err(e),
            },
            Ok(DefinitionChange::All) | Err(broadcast::error::RecvError::Lagged(_)) => {
                match &mut known {
                    None => match store.list().await {
                        Ok(list) => {
                            known = Some(
                                list.iter()
                                    .map(|d| (d.id.clone(), (d.revision, d.format)))
                                    .collect(),
                            );
                            Ok(source::assemble_with(
                                &store_dir(store.as_ref()),
                                files_of(list),
                                &previous,
                                &limits,
                                &mut measured(&settings),
                            ))
                        }
                        Err(e) => Err(e),
                    },
                    Some(known) => match read_changed(store.as_ref(), known).await {
                        Ok(changed) => Ok(source::reassemble_with(
                            &previous,
                            changed,
                            &limits,
                            &mut measured(&settings),
                        )),
                        Err(e) => Err(e),
                    },
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        match next {
            Ok(loaded) => {
                source::log_problems(&loaded, &previous);
                // A snapshot of the same revision (of this lineage) is the same.
                tx.send_if_modified(|current| {
                    if current.revision() == loaded.revision() {
                        return false;
                    }
                    *current = Arc::new(loaded);
                    true
                });
            }
            Err(e) => tracing::error!(
                "{e}; keeping the definitions read before, reading again at the next change"
            ),
        }
    }
}

/// A full read after the first: every definition's revision and format
/// first, then the documents of those that differ from `known` (which it
/// brings up to date), as the changed "files". A reconcile of an unchanged
/// fleet reads no document: at 25k definitions, reading every document
/// every `reconcile_interval` on every instance was megabytes each time.
async fn read_changed(
    store: &dyn DefinitionStore,
    known: &mut BTreeMap<DataplaneId, (u64, DocumentFormat)>,
) -> Result<BTreeMap<PathBuf, Option<FileRead>>, StoreError> {
    let now: BTreeMap<DataplaneId, (u64, DocumentFormat)> = store
        .revisions()
        .await?
        .into_iter()
        .map(|(id, revision, format)| (id, (revision, format)))
        .collect();
    let mut changed = BTreeMap::new();
    for (id, (_, format)) in known.iter() {
        if !now.contains_key(id) {
            changed.extend(removed(id, Some(*format)));
        }
    }
    known.retain(|id, _| now.contains_key(id));
    let differ: Vec<DataplaneId> = now
        .iter()
        .filter(|(id, at)| known.get(*id) != Some(*at))
        .map(|(id, _)| id.clone())
        .collect();
    let found = store.get_many(&differ).await?;
    for id in &differ {
        // Gone since its revision was read: removed; else replaced.
        changed.extend(removed(id, None));
        known.remove(id);
    }
    for d in found {
        known.insert(d.id.clone(), (d.revision, d.format));
        changed.insert(path_of(&d.id, d.format), Some(Ok(d.document)));
    }
    Ok(changed)
}

/// The "files" of a definition that is gone: of `format`, or of either.
fn removed(
    id: &DataplaneId,
    format: Option<DocumentFormat>,
) -> BTreeMap<PathBuf, Option<FileRead>> {
    let formats = match format {
        Some(f) => vec![f],
        None => vec![DocumentFormat::Yaml, DocumentFormat::Json],
    };
    formats
        .into_iter()
        .map(|f| (path_of(id, f), None))
        .collect()
}

/// The [`DefinitionStore`] contract, run against each engine (redb here,
/// PostgreSQL in the integration tests). Panics on the first violation.
/// Behind the `test-util` feature (on in test builds): a release build
/// does not compile it.
#[cfg(any(test, feature = "test-util"))]
pub async fn conformance(store: &dyn DefinitionStore) {
    use std::time::Duration;
    let a = DataplaneId::new("default", "conformance-a");
    let b = DataplaneId::new("default", "conformance-b");
    let mut changes = store.changes();
    assert!(
        store.list().await.unwrap().is_empty(),
        "a new store is empty"
    );
    assert_eq!(store.get(&a).await.unwrap(), None);

    let first = store
        .put(&a, DocumentFormat::Yaml, "one", Precondition::Any)
        .await
        .unwrap();
    assert_eq!(
        (first.id.clone(), first.format, first.document.as_str()),
        (a.clone(), DocumentFormat::Yaml, "one")
    );
    assert_eq!(store.get(&a).await.unwrap(), Some(first.clone()));
    // The change is announced (for PostgreSQL, through NOTIFY).
    let seen = loop {
        match tokio::time::timeout(Duration::from_secs(2), changes.recv()).await {
            Ok(Ok(DefinitionChange::All)) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(&seen, Ok(Ok(DefinitionChange::One(id))) if *id == a),
        "{seen:?}"
    );

    let second = store
        .put(
            &a,
            DocumentFormat::Json,
            "two",
            Precondition::Revision(first.revision),
        )
        .await
        .unwrap();
    assert!(second.revision > first.revision, "revisions increase");
    assert_eq!(second.format, DocumentFormat::Json);
    // A write on a stale revision is refused and names the current one.
    match store
        .put(
            &a,
            DocumentFormat::Yaml,
            "late",
            Precondition::Revision(first.revision),
        )
        .await
    {
        Err(WriteError::Conflict { current }) => assert_eq!(current, Some(second.revision)),
        other => panic!("a stale If-Match must conflict: {other:?}"),
    }
    assert_eq!(store.get(&a).await.unwrap().unwrap().document, "two");

    // Create-only, and must-exist.
    store
        .put(&b, DocumentFormat::Yaml, "b", Precondition::Absent)
        .await
        .unwrap();
    assert!(matches!(
        store
            .put(&b, DocumentFormat::Yaml, "b2", Precondition::Absent)
            .await,
        Err(WriteError::Conflict { current: Some(_) })
    ));
    let missing = DataplaneId::new("default", "conformance-missing");
    assert!(matches!(
        store
            .put(&missing, DocumentFormat::Yaml, "x", Precondition::Present)
            .await,
        Err(WriteError::Conflict { current: None })
    ));
    assert!(matches!(
        store
            .put(
                &missing,
                DocumentFormat::Yaml,
                "x",
                Precondition::Revision(1)
            )
            .await,
        Err(WriteError::Conflict { current: None })
    ));
    let ids: Vec<DataplaneId> = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&a) && ids.contains(&b), "{ids:?}");
    // Revisions without documents, and several documents at once.
    let mut revisions = store.revisions().await.unwrap();
    revisions.sort_by(|x, y| x.0.cmp(&y.0));
    let b_now = store.get(&b).await.unwrap().unwrap();
    assert_eq!(
        revisions,
        [
            (a.clone(), second.revision, DocumentFormat::Json),
            (b.clone(), b_now.revision, DocumentFormat::Yaml)
        ]
    );
    let mut many = store
        .get_many(&[b.clone(), missing.clone(), a.clone()])
        .await
        .unwrap();
    many.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(many, [second.clone(), b_now], "a missing one is left out");
    assert!(store.get_many(&[]).await.unwrap().is_empty());

    // Deletes: conditional, and false for nothing.
    assert!(matches!(
        store.delete(&a, Precondition::Revision(first.revision)).await,
        Err(WriteError::Conflict { current }) if current == Some(second.revision)
    ));
    assert!(store
        .delete(&a, Precondition::Revision(second.revision))
        .await
        .unwrap());
    assert!(!store.delete(&a, Precondition::Any).await.unwrap());
    assert_eq!(store.get(&a).await.unwrap(), None);
    // A later write gets a revision above every earlier one.
    let again = store
        .put(&a, DocumentFormat::Yaml, "three", Precondition::Absent)
        .await
        .unwrap();
    assert!(again.revision > second.revision);
    store.delete(&a, Precondition::Any).await.unwrap();
    store.delete(&b, Precondition::Any).await.unwrap();
    assert!(store.list().await.unwrap().is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn doc(name: &str, port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: 8080\n"
        )
    }

    fn check(id: &DataplaneId, text: &str) -> Result<(), Rejected> {
        let settings = SpecifierSettings::default();
        check_document(
            id,
            DocumentFormat::Yaml,
            text,
            &FileLimits::default(),
            &mut |dp| build(dp, &settings),
        )
    }

    #[tokio::test]
    async fn the_redb_engine_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        conformance(&store).await;
    }

    #[tokio::test]
    async fn redb_definitions_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let id = DataplaneId::new("default", "a");
        let written = {
            let store = RedbStore::open(&path).unwrap();
            store
                .put(&id, DocumentFormat::Yaml, &doc("a", 1), Precondition::Any)
                .await
                .unwrap()
        };
        let store = RedbStore::open(&path).unwrap();
        assert_eq!(store.get(&id).await.unwrap(), Some(written));
    }

    #[test]
    fn a_document_is_held_to_the_limits_of_a_file() {
        let id = DataplaneId::new("default", "a");
        let settings = SpecifierSettings::default();
        let limits = FileLimits {
            max_inbounds: 1,
            max_file_size: 400,
            ..FileLimits::default()
        };
        let check = |text: &str| {
            check_document(&id, DocumentFormat::Yaml, text, &limits, &mut |dp| {
                build(dp, &settings)
            })
        };
        assert_eq!(check(&doc("a", 10001)), Ok(()));
        let two = format!(
            "{}  - port: 10002\n    servicePort: 8081\n",
            doc("a", 10001)
        );
        let e = check(&two).unwrap_err();
        assert!(e.problems[0].contains("max_inbounds"), "{e:?}");
        let padded = format!("{}# {}\n", doc("a", 10001), "x".repeat(400));
        let e = check(&padded).unwrap_err();
        assert!(e.problems[0].contains("max_file_size"), "{e:?}");
    }

    #[test]
    fn a_document_is_checked_like_a_file() {
        let id = DataplaneId::new("default", "a");
        assert_eq!(check(&id, &doc("a", 10001)), Ok(()));
        // A Mesh beside it is ignored, as in files.
        assert_eq!(
            check(
                &id,
                &format!("type: Mesh\nname: default\n---\n{}", doc("a", 1))
            ),
            Ok(())
        );
        let wrong_name = check(&id, &doc("b", 1)).unwrap_err();
        assert!(
            wrong_name.problems[0].contains("the URL names default.a"),
            "{wrong_name:?}"
        );
        let bad_ip = check(
            &id,
            "type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: db.local\n",
        )
        .unwrap_err();
        assert!(
            bad_ip.problems[0].contains("not an IP literal"),
            "{bad_ip:?}"
        );
        let none = check(&id, "type: Mesh\nname: default\n").unwrap_err();
        assert!(
            none.problems[0].contains("defines no Dataplane"),
            "{none:?}"
        );
        let two = check(&id, &format!("{}---\n{}", doc("a", 1), doc("b", 2))).unwrap_err();
        assert!(two.problems[0].contains("defines 2 dataplanes"), "{two:?}");
        let probe = check(
            &id,
            &format!(
                "{}    serviceProbe:\n      unhealthyThreshold: 0\n",
                doc("a", 1)
            ),
        )
        .unwrap_err();
        assert!(
            probe.problems[0].contains("unhealthy_threshold must be >= 1"),
            "{probe:?}"
        );
    }

    /// A store that counts the documents it hands out.
    #[derive(Debug)]
    struct Counting {
        inner: RedbStore,
        /// Documents handed out so far, watched by tests that wait on it.
        documents: tokio::sync::watch::Sender<usize>,
    }

    impl Counting {
        fn read(&self, n: usize) {
            self.documents.send_modify(|read| *read += n);
        }
        fn documents(&self) -> usize {
            *self.documents.borrow()
        }
    }

    impl DefinitionStore for Counting {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn list(&self) -> StoreFuture<'_, Result<Vec<StoredDefinition>, StoreError>> {
            Box::pin(async move {
                let all = self.inner.list().await?;
                self.read(all.len());
                Ok(all)
            })
        }
        fn get<'a>(
            &'a self,
            id: &'a DataplaneId,
        ) -> StoreFuture<'a, Result<Option<StoredDefinition>, StoreError>> {
            Box::pin(async move {
                let found = self.inner.get(id).await?;
                self.read(found.iter().count());
                Ok(found)
            })
        }
        fn put<'a>(
            &'a self,
            id: &'a DataplaneId,
            format: DocumentFormat,
            document: &'a str,
            expect: Precondition,
        ) -> StoreFuture<'a, Result<StoredDefinition, WriteError>> {
            self.inner.put(id, format, document, expect)
        }
        fn delete<'a>(
            &'a self,
            id: &'a DataplaneId,
            expect: Precondition,
        ) -> StoreFuture<'a, Result<bool, WriteError>> {
            self.inner.delete(id, expect)
        }
        fn changes(&self) -> broadcast::Receiver<DefinitionChange> {
            self.inner.changes()
        }
        fn revisions(&self) -> StoreFuture<'_, Result<Vec<DefinitionRevision>, StoreError>> {
            self.inner.revisions()
        }
    }

    #[tokio::test]
    async fn a_full_read_heals_missed_changes_and_parses_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let counting = Arc::new(Counting {
            inner: RedbStore::open(&dir.path().join("s.redb")).unwrap(),
            documents: Default::default(),
        });
        let store: Arc<dyn DefinitionStore> = counting.clone();
        let settings = SpecifierSettings::default();
        let (a, b, c) = (
            DataplaneId::new("default", "a"),
            DataplaneId::new("default", "b"),
            DataplaneId::new("default", "c"),
        );
        for (id, port) in [(&a, 1), (&b, 2)] {
            store
                .put(
                    id,
                    DocumentFormat::Yaml,
                    &doc(&id.name, port),
                    Precondition::Any,
                )
                .await
                .unwrap();
        }
        // The watcher hears only what this test announces: every write below
        // is a "missed notification" until an `All`.
        let (announce, heard) = broadcast::channel(16);
        let first = load(
            store.as_ref(),
            &Loaded::default(),
            &settings,
            &FileLimits::default(),
        )
        .await
        .unwrap();
        let (tx, mut rx) = watch_channel::channel(Arc::new(first));
        tokio::spawn(watch(
            store.clone(),
            settings,
            FileLimits::default(),
            tx,
            heard,
        ));
        // The watcher's first full read reads both documents; the writes
        // below must come after it (it publishes nothing new to wait on).
        let primed_at = counting.documents() + 2;
        announce.send(DefinitionChange::All).unwrap();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            counting
                .documents
                .subscribe()
                .wait_for(|read| *read >= primed_at),
        )
        .await
        .expect("the first full read did not come")
        .unwrap();
        let primed = rx.borrow().clone();

        store
            .put(&b, DocumentFormat::Yaml, &doc("b", 20), Precondition::Any)
            .await
            .unwrap();
        store
            .put(&c, DocumentFormat::Yaml, &doc("c", 3), Precondition::Any)
            .await
            .unwrap();
        store.delete(&a, Precondition::Any).await.unwrap();
        let before = counting.documents();
        announce.send(DefinitionChange::All).unwrap();
        let healed = rx
            .wait_for(|l| l.dataplanes.contains_key(&c))
            .await
            .unwrap()
            .clone();
        assert_eq!(healed.dataplanes.keys().collect::<Vec<_>>(), vec![&b, &c]);
        assert_eq!(healed.dataplanes[&b].dataplane.inbounds[0].port, 20);
        assert_eq!(
            counting.documents() - before,
            2,
            "a full read reads the documents of the changed and the new alone"
        );
        let before = counting.documents();

        // A full read where only `a` is new reads `a` alone: the unchanged
        // keep their specifiers, a changed one got a new one.
        store
            .put(&a, DocumentFormat::Yaml, &doc("a", 1), Precondition::Any)
            .await
            .unwrap();
        announce.send(DefinitionChange::All).unwrap();
        let last = rx
            .wait_for(|l| l.dataplanes.contains_key(&a))
            .await
            .unwrap()
            .clone();
        assert_eq!(
            counting.documents() - before,
            1,
            "a full read read the unchanged documents"
        );
        assert!(Arc::ptr_eq(
            &last.dataplanes[&c].specifier,
            &healed.dataplanes[&c].specifier
        ));
        assert!(!Arc::ptr_eq(
            &primed.dataplanes[&b].specifier,
            &last.dataplanes[&b].specifier
        ));
    }

    #[tokio::test]
    async fn the_watcher_publishes_each_write_like_a_file_change() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn DefinitionStore> =
            Arc::new(RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let settings = SpecifierSettings::default();
        let a = DataplaneId::new("default", "a");
        store
            .put(&a, DocumentFormat::Yaml, &doc("a", 1), Precondition::Any)
            .await
            .unwrap();
        let changes = store.changes();
        let first = load(
            store.as_ref(),
            &Loaded::default(),
            &settings,
            &FileLimits::default(),
        )
        .await
        .unwrap();
        assert_eq!(first.dataplanes.len(), 1);
        let (tx, mut rx) = watch_channel::channel(Arc::new(first));
        tokio::spawn(watch(
            store.clone(),
            settings,
            FileLimits::default(),
            tx,
            changes,
        ));

        let b = DataplaneId::new("default", "b");
        let json = r#"{"type": "Dataplane", "mesh": "default", "name": "b", "networking": {"address": "127.0.0.2"}}"#;
        store
            .put(&b, DocumentFormat::Json, json, Precondition::Any)
            .await
            .unwrap();
        let loaded = rx
            .wait_for(|l| l.dataplanes.contains_key(&b))
            .await
            .unwrap()
            .clone();
        assert_eq!(loaded.dataplanes[&b].file, PathBuf::from("default/b.json"));
        // A change of format replaces the old "file".
        store
            .put(&a, DocumentFormat::Json, r#"{"type": "Dataplane", "mesh": "default", "name": "a", "networking": {"address": "127.0.0.3"}}"#, Precondition::Any)
            .await
            .unwrap();
        let loaded = rx
            .wait_for(|l| {
                l.dataplanes
                    .get(&a)
                    .is_some_and(|d| d.file == Path::new("default/a.json"))
            })
            .await
            .unwrap()
            .clone();
        assert_eq!(
            loaded.files.len(),
            2,
            "{:?}",
            loaded.files.keys().collect::<Vec<_>>()
        );
        store.delete(&a, Precondition::Any).await.unwrap();
        let loaded = rx
            .wait_for(|l| !l.dataplanes.contains_key(&a))
            .await
            .unwrap()
            .clone();
        assert_eq!(loaded.dataplanes.keys().collect::<Vec<_>>(), vec![&b]);
    }
}
