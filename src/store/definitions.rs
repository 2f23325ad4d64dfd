//! Dataplane definitions kept in a store (`dataplanes.source = "api"`).
//!
//! - [`DefinitionStore`] is the one trait with two engines: the embedded redb
//!   file ([`RedbStore`], one instance) and PostgreSQL
//!   ([`super::postgres::PgStore`], several instances). Each stored document
//!   carries a revision: writes may be conditional on it (`If-Match`), and
//!   every committed change is announced on [`DefinitionStore::changes`].
//! - [`conformance`] is the contract both engines are held to.
//!
//! Storage only: what a stored document means (it is checked and read as a
//! dataplane file would be) is the definitions pipeline's, `sources::stored`.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::{RedbStore, StoreError};
use crate::dataplane::{DataplaneId, Format};

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

    /// The parser of documents in this form.
    pub fn parser(self) -> Format {
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

    fn doc(name: &str, port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: 8080\n"
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
}
