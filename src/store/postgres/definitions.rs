//! Dataplane definitions in `hdsd_definitions`: one statement per write,
//! conditional on the revision where asked, its `pg_notify` in the same
//! transaction.

use tokio::sync::broadcast;

use super::schema::CHANNEL;
use super::{pg_error, PgStore};
use crate::dataplane::DataplaneId;
use crate::store::definitions::{
    DefinitionChange, DefinitionRevision, DefinitionStore, DocumentFormat, Precondition,
    StoreFuture, StoredDefinition, WriteError,
};
use crate::store::StoreError;

fn row_definition(row: &tokio_postgres::Row) -> Option<StoredDefinition> {
    let id = super::row_id(row, 0)?;
    Some(StoredDefinition {
        id,
        format: DocumentFormat::from_name(row.get(2))?,
        document: row.get(3),
        revision: row.get::<_, i64>(4) as u64,
    })
}

const SELECT: &str = "SELECT mesh, name, format, document, revision FROM hdsd_definitions";

impl DefinitionStore for PgStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn list(&self) -> StoreFuture<'_, Result<Vec<StoredDefinition>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(&format!("{SELECT} ORDER BY mesh, name"), &[])
                .await
                .map_err(pg_error)?;
            Ok(rows.iter().filter_map(row_definition).collect())
        })
    }

    fn revisions(&self) -> StoreFuture<'_, Result<Vec<DefinitionRevision>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT mesh, name, revision, format FROM hdsd_definitions",
                    &[],
                )
                .await
                .map_err(pg_error)?;
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let id = super::row_id(row, 0)?;
                    let format = DocumentFormat::from_name(row.get(3))?;
                    Some((id, row.get::<_, i64>(2) as u64, format))
                })
                .collect())
        })
    }

    fn get_many<'a>(
        &'a self,
        ids: &'a [DataplaneId],
    ) -> StoreFuture<'a, Result<Vec<StoredDefinition>, StoreError>> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            let meshes: Vec<&str> = ids.iter().map(|id| id.mesh.as_str()).collect();
            let names: Vec<&str> = ids.iter().map(|id| id.name.as_str()).collect();
            let rows = client
                .query(
                    "SELECT d.mesh, d.name, d.format, d.document, d.revision
                     FROM hdsd_definitions AS d
                     JOIN unnest($1::text[], $2::text[]) AS u(mesh, name)
                       ON d.mesh = u.mesh AND d.name = u.name",
                    &[&meshes, &names],
                )
                .await
                .map_err(pg_error)?;
            Ok(rows.iter().filter_map(row_definition).collect())
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a DataplaneId,
    ) -> StoreFuture<'a, Result<Option<StoredDefinition>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    &format!("{SELECT} WHERE mesh = $1 AND name = $2"),
                    &[&id.mesh, &id.name],
                )
                .await
                .map_err(pg_error)?;
            Ok(row.as_ref().and_then(row_definition))
        })
    }

    fn put<'a>(
        &'a self,
        id: &'a DataplaneId,
        format: DocumentFormat,
        document: &'a str,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<StoredDefinition, WriteError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_error)?;
            let format_name = format.as_str();
            let written = match expect {
                Precondition::Any => {
                    tx.query_opt(
                        "INSERT INTO hdsd_definitions (mesh, name, format, document, revision)
                         VALUES ($1, $2, $3, $4, nextval('hdsd_revision'))
                         ON CONFLICT (mesh, name) DO UPDATE SET format = EXCLUDED.format,
                             document = EXCLUDED.document, revision = EXCLUDED.revision,
                             updated_at = now()
                         RETURNING revision",
                        &[&id.mesh, &id.name, &format_name, &document],
                    )
                    .await
                }
                Precondition::Absent => {
                    tx.query_opt(
                        "INSERT INTO hdsd_definitions (mesh, name, format, document, revision)
                         VALUES ($1, $2, $3, $4, nextval('hdsd_revision'))
                         ON CONFLICT (mesh, name) DO NOTHING
                         RETURNING revision",
                        &[&id.mesh, &id.name, &format_name, &document],
                    )
                    .await
                }
                Precondition::Present => {
                    tx.query_opt(
                        "UPDATE hdsd_definitions SET format = $3, document = $4,
                             revision = nextval('hdsd_revision'), updated_at = now()
                         WHERE mesh = $1 AND name = $2
                         RETURNING revision",
                        &[&id.mesh, &id.name, &format_name, &document],
                    )
                    .await
                }
                Precondition::Revision(want) => {
                    tx.query_opt(
                        "UPDATE hdsd_definitions SET format = $3, document = $4,
                             revision = nextval('hdsd_revision'), updated_at = now()
                         WHERE mesh = $1 AND name = $2 AND revision = $5
                         RETURNING revision",
                        &[&id.mesh, &id.name, &format_name, &document, &(want as i64)],
                    )
                    .await
                }
            }
            .map_err(pg_error)?;
            let Some(row) = written else {
                let current = Self::current(&tx, id).await.map_err(pg_error)?;
                return Err(WriteError::Conflict { current });
            };
            let revision = row.get::<_, i64>(0) as u64;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &id.to_string()])
                .await
                .map_err(pg_error)?;
            tx.commit().await.map_err(pg_error)?;
            Ok(StoredDefinition {
                id: id.clone(),
                format,
                document: document.to_string(),
                revision,
            })
        })
    }

    fn delete<'a>(
        &'a self,
        id: &'a DataplaneId,
        expect: Precondition,
    ) -> StoreFuture<'a, Result<bool, WriteError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_error)?;
            let deleted = match expect {
                Precondition::Absent => {
                    let current = Self::current(&tx, id).await.map_err(pg_error)?;
                    return match current {
                        None => Ok(false),
                        Some(_) => Err(WriteError::Conflict { current }),
                    };
                }
                Precondition::Any | Precondition::Present => tx
                    .query_opt(
                        "DELETE FROM hdsd_definitions WHERE mesh = $1 AND name = $2 RETURNING revision",
                        &[&id.mesh, &id.name],
                    )
                    .await,
                Precondition::Revision(want) => tx
                    .query_opt(
                        "DELETE FROM hdsd_definitions WHERE mesh = $1 AND name = $2 AND revision = $3 RETURNING revision",
                        &[&id.mesh, &id.name, &(want as i64)],
                    )
                    .await,
            }
            .map_err(pg_error)?;
            if deleted.is_none() {
                let current = Self::current(&tx, id).await.map_err(pg_error)?;
                return match (expect, current) {
                    (Precondition::Any, None) => Ok(false),
                    _ => Err(WriteError::Conflict { current }),
                };
            }
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &id.to_string()])
                .await
                .map_err(pg_error)?;
            tx.commit().await.map_err(pg_error)?;
            Ok(true)
        })
    }

    fn changes(&self) -> broadcast::Receiver<DefinitionChange> {
        self.changes.subscribe()
    }
}
