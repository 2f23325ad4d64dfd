//! What tokens need on every instance: the revoked token ids
//! (`hdsd_revocations`) and the public signing keys each instance shares
//! (`hdsd_signing_keys`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::schema::*;
use super::{pg_error, PgStore};
use crate::store::StoreError;

/// What [`PgStore::publish_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPublication {
    /// The rows already said so: nothing written, nothing announced.
    Unchanged,
    /// Rows were added, replaced or withdrawn, and announced.
    Changed,
    /// Another live instance (named) writes under this publisher id:
    /// nothing was written.
    Contested {
        /// That instance (`<host>/<pid>`).
        by: String,
    },
}

impl PgStore {
    /// Revokes a token id for every instance; `false` when it already was.
    pub async fn revoke(&self, jti: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let added = tx
            .execute(
                "INSERT INTO hdsd_revocations (jti) VALUES ($1) ON CONFLICT (jti) DO NOTHING",
                &[&jti],
            )
            .await
            .map_err(pg_error)?;
        tx.batch_execute(&format!("NOTIFY {REVOCATIONS_CHANNEL}"))
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        Ok(added == 1)
    }

    /// Every revoked token id.
    pub async fn revocations(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT jti FROM hdsd_revocations", &[])
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Makes `keys` (kid -> SPKI PEM) the public keys `publisher` shares:
    /// adds the new ones, replaces a changed one, withdraws those it
    /// published and no longer has, in one transaction that announces the
    /// change on [`KEYS_CHANNEL`] when something changed. Other publishers'
    /// rows are never touched. Writes nothing when another instance whose
    /// heartbeat is younger than `alive_within` wrote rows under the same
    /// publisher id (a copied state directory, or this instance's previous
    /// run killed moments ago): two instances rewriting one publisher's rows
    /// would withdraw each other's keys.
    pub async fn publish_keys(
        &self,
        publisher: &str,
        keys: &BTreeMap<String, String>,
        alive_within: Duration,
    ) -> Result<KeyPublication, StoreError> {
        let (kids, pems): (Vec<&str>, Vec<&str>) =
            keys.iter().map(|(k, p)| (k.as_str(), p.as_str())).unzip();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let other = tx
            .query_opt(
                "SELECT k.instance FROM hdsd_signing_keys k
                 JOIN hdsd_instances i ON i.instance = k.instance
                 WHERE k.publisher = $1 AND k.instance <> $2
                   AND i.heartbeat_at > now() - make_interval(secs => $3)
                 LIMIT 1",
                &[&publisher, &self.instance, &alive_within.as_secs_f64()],
            )
            .await
            .map_err(pg_error)?;
        if let Some(row) = other {
            return Ok(KeyPublication::Contested { by: row.get(0) });
        }
        let withdrawn = tx
            .execute(
                "DELETE FROM hdsd_signing_keys WHERE publisher = $1 AND NOT (kid = ANY($2))",
                &[&publisher, &kids],
            )
            .await
            .map_err(pg_error)?;
        let written = tx
            .execute(
                "INSERT INTO hdsd_signing_keys (kid, publisher, public_key, instance)
                 SELECT kid, $1, pem, $4 FROM unnest($2::text[], $3::text[]) AS k(kid, pem)
                 ON CONFLICT (kid, publisher) DO UPDATE
                     SET public_key = EXCLUDED.public_key,
                         instance = EXCLUDED.instance,
                         added_at = CASE WHEN hdsd_signing_keys.public_key = EXCLUDED.public_key
                                         THEN hdsd_signing_keys.added_at ELSE now() END
                     WHERE hdsd_signing_keys.public_key <> EXCLUDED.public_key
                        OR hdsd_signing_keys.instance <> EXCLUDED.instance",
                &[&publisher, &kids, &pems, &self.instance],
            )
            .await
            .map_err(pg_error)?;
        let changed = withdrawn + written > 0;
        if changed {
            tx.batch_execute(&format!("NOTIFY {KEYS_CHANNEL}"))
                .await
                .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(if changed {
            KeyPublication::Changed
        } else {
            KeyPublication::Unchanged
        })
    }

    /// Every public key published by any instance.
    pub async fn shared_keys(&self) -> Result<Vec<crate::auth::SharedKey>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT kid, publisher, public_key FROM hdsd_signing_keys",
                &[],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| crate::auth::SharedKey {
                kid: r.get(0),
                publisher: r.get(1),
                public_pem: r.get(2),
            })
            .collect())
    }
}
