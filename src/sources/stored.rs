//! The store origin (`dataplanes.source = "api"`): definitions written
//! through the API into the definitions store (redb or PostgreSQL).
//!
//! Each stored definition stands for a "file" named `<mesh>/<name>.yaml|json`
//! ([`path_of`]), so the assembler treats a written document exactly as a
//! file it read, and the registry picks API writes up as it picks file
//! changes (one catalog path, one writer). [`Stored`] turns the store's
//! announcements ([`DefinitionChange`]) into the changed "files": a change
//! to one definition reads that one only; [`DefinitionChange::All`] and a
//! lagging receiver compare every revision and read only the documents
//! that differ. It makes no snapshot: the pipeline does (`sources::follow`).
//!
//! [`check_document`] is the validation of a `PUT`: the same parser and
//! specifier builder as the files, so the same rules and messages.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::broadcast;

use super::assemble::FileRead;
use super::{Changed, Origin, Rules};
use crate::dataplane::{self, DataplaneId};
use crate::specifier::build;
use crate::store::definitions::{
    DefinitionChange, DefinitionStore, DocumentFormat, StoredDefinition,
};
use crate::store::StoreError;

/// Why a document cannot be stored: every problem, each with its rule's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub problems: Vec<String>,
}

/// Validates a document for `id` as the assembler would validate a file
/// holding it: parse (YAML or JSON, Kuma's format), then build its
/// specifier (and drop it: the pipeline builds the one in force when the
/// store announces the write). It must define exactly the dataplane `id`;
/// documents of other resource types beside it are ignored, as in files.
/// The limits of dataplane files (`dataplanes.max_*`) apply to a document
/// as to a file.
pub fn check_document(
    id: &DataplaneId,
    format: DocumentFormat,
    document: &str,
    rules: &Rules,
) -> Result<(), Rejected> {
    let parsed =
        dataplane::parse_file_with(document, format.parser(), &rules.limits).map_err(|e| {
            Rejected {
                problems: vec![e.to_string()],
            }
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
            if let Err(e) = build(dp, &rules.specifier) {
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

/// The "file" a stored definition stands for in a snapshot.
pub fn path_of(id: &DataplaneId, format: DocumentFormat) -> PathBuf {
    PathBuf::from(format!("{}/{}.{}", id.mesh, id.name, format.as_str()))
}

fn files_of(definitions: Vec<StoredDefinition>) -> BTreeMap<PathBuf, FileRead> {
    definitions
        .into_iter()
        .map(|d| (path_of(&d.id, d.format), Ok(d.document)))
        .collect()
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

/// The definitions store, followed through its announcements.
#[derive(Debug)]
pub struct Stored {
    store: Arc<dyn DefinitionStore>,
    changes: broadcast::Receiver<DefinitionChange>,
    /// The revision and format of each definition read so far: a full read
    /// parses only what changed since (a reconcile of an unchanged fleet
    /// parses nothing).
    known: BTreeMap<DataplaneId, (u64, DocumentFormat)>,
}

impl Stored {
    /// Subscribes to the store's announcements now, before the first read:
    /// no change falls in between.
    pub fn open(store: Arc<dyn DefinitionStore>) -> Stored {
        let changes = store.changes();
        Stored::hearing(store, changes)
    }

    /// Follows `store` through the announcements of `changes`.
    pub fn hearing(
        store: Arc<dyn DefinitionStore>,
        changes: broadcast::Receiver<DefinitionChange>,
    ) -> Stored {
        Stored {
            store,
            changes,
            known: BTreeMap::new(),
        }
    }

    /// One definition, written or deleted: its "files".
    async fn read_one(
        &mut self,
        id: &DataplaneId,
    ) -> Result<BTreeMap<PathBuf, Option<FileRead>>, StoreError> {
        let found = self.store.get(id).await?;
        let mut changed = removed(id, None);
        match found {
            Some(d) => {
                self.known.insert(id.clone(), (d.revision, d.format));
                changed.insert(path_of(id, d.format), Some(Ok(d.document)));
            }
            None => {
                self.known.remove(id);
            }
        }
        Ok(changed)
    }

    /// A full read after the first: every definition's revision and format
    /// first, then the documents of those that differ from what was read
    /// before, as the changed "files". A reconcile of an unchanged fleet
    /// reads no document: at 25k definitions, reading every document every
    /// `reconcile_interval` on every instance was megabytes each time. What
    /// was read is remembered only once every read succeeded, so a failed
    /// read misses nothing at the next one.
    async fn read_changed(&mut self) -> Result<BTreeMap<PathBuf, Option<FileRead>>, StoreError> {
        let now: BTreeMap<DataplaneId, (u64, DocumentFormat)> = self
            .store
            .revisions()
            .await?
            .into_iter()
            .map(|(id, revision, format)| (id, (revision, format)))
            .collect();
        let gone: Vec<(DataplaneId, DocumentFormat)> = self
            .known
            .iter()
            .filter(|(id, _)| !now.contains_key(*id))
            .map(|(id, (_, format))| (id.clone(), *format))
            .collect();
        let differ: Vec<DataplaneId> = now
            .iter()
            .filter(|(id, at)| self.known.get(*id) != Some(*at))
            .map(|(id, _)| id.clone())
            .collect();
        let found = self.store.get_many(&differ).await?;
        let mut changed = BTreeMap::new();
        for (id, format) in gone {
            changed.extend(removed(&id, Some(format)));
            self.known.remove(&id);
        }
        for id in &differ {
            // Gone since its revision was read: removed; else replaced.
            changed.extend(removed(id, None));
            self.known.remove(id);
        }
        for d in found {
            self.known.insert(d.id.clone(), (d.revision, d.format));
            changed.insert(path_of(&d.id, d.format), Some(Ok(d.document)));
        }
        Ok(changed)
    }
}

impl Origin for Stored {
    type Error = StoreError;

    fn root(&self) -> PathBuf {
        PathBuf::from(self.store.describe())
    }

    async fn first(&mut self) -> Result<BTreeMap<PathBuf, FileRead>, StoreError> {
        let list = self.store.list().await?;
        self.known = list
            .iter()
            .map(|d| (d.id.clone(), (d.revision, d.format)))
            .collect();
        Ok(files_of(list))
    }

    async fn next(&mut self) -> Option<Result<Changed, StoreError>> {
        let read = match self.changes.recv().await {
            Ok(DefinitionChange::One(id)) => self.read_one(&id).await,
            Ok(DefinitionChange::All) | Err(broadcast::error::RecvError::Lagged(_)) => {
                self.read_changed().await
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some(read.map(Changed::Files))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::FileLimits;
    use crate::sources::following;
    use crate::specifier::SpecifierSettings;
    use crate::store::definitions::{DefinitionRevision, Precondition, StoreFuture, WriteError};
    use crate::store::RedbStore;
    use std::path::Path;

    fn doc(name: &str, port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: 8080\n"
        )
    }

    fn check(id: &DataplaneId, text: &str) -> Result<(), Rejected> {
        check_document(id, DocumentFormat::Yaml, text, &Rules::default())
    }

    #[test]
    fn a_document_is_held_to_the_limits_of_a_file() {
        let id = DataplaneId::new("default", "a");
        let rules = Rules {
            specifier: SpecifierSettings::default(),
            limits: FileLimits {
                max_inbounds: 1,
                max_file_size: 400,
                ..FileLimits::default()
            },
        };
        let check = |text: &str| check_document(&id, DocumentFormat::Yaml, text, &rules);
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
        // The writer hears only what this test announces: every write below
        // is a "missed notification" until an `All`.
        let (announce, heard) = broadcast::channel(16);
        let (mut rx, task) = following(Stored::hearing(store.clone(), heard), Default::default())
            .await
            .unwrap();
        assert_eq!(
            counting.documents(),
            2,
            "the first read reads every document"
        );
        let primed = rx.borrow().clone();
        let body = async move {
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
        };
        tokio::select! {
            () = task => panic!("the writer ended"),
            () = body => {}
        }
    }

    #[tokio::test]
    async fn the_watcher_publishes_each_write_like_a_file_change() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn DefinitionStore> =
            Arc::new(RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let a = DataplaneId::new("default", "a");
        store
            .put(&a, DocumentFormat::Yaml, &doc("a", 1), Precondition::Any)
            .await
            .unwrap();
        let (mut rx, task) = following(Stored::open(store.clone()), Default::default())
            .await
            .unwrap();
        assert_eq!(rx.borrow().dataplanes.len(), 1);
        let body = async move {
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
        };
        tokio::select! {
            () = task => panic!("the writer ended"),
            () = body => {}
        }
    }
}
