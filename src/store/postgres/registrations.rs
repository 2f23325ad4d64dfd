//! Zones registered through a global's API, shared by its instances
//! (`hdsd_zone_registrations`; the rule is [`registrations::next`]).
//!
//! A write takes [`ZONES_LOCK`] and its number from `hdsd_zone_seq`, as the
//! zones' link and dataplane writes do, and is announced on
//! [`ZONES_CHANNEL`]: every instance's zone ledger reads the rows above the
//! last number it saw. A deletion, and a registration of a zone that had
//! none or was deleted, also drop the zone's link and dataplane rows in the
//! same transaction: a deleted zone's rows go, and a zone registered again
//! starts from nothing.
//!
//! [`registrations::next`]: crate::store::registrations::next

use super::schema::*;
use super::{millis, pg_error, PgStore};
use crate::store::registrations::{
    next, RegistrationChange, RegistrationState, RegistrationWrite, ZoneRegistration,
};
use crate::store::StoreError;

/// The columns of a row, times as milliseconds since the epoch.
const COLUMNS: &str = "zone, state, (extract(epoch FROM tokens_not_before) * 1000)::bigint,
     (extract(epoch FROM changed_at) * 1000)::bigint, seq";

fn row_of(row: &tokio_postgres::Row) -> Option<ZoneRegistration> {
    let state: String = row.get(1);
    Some(ZoneRegistration {
        zone: row.get(0),
        state: RegistrationState::parse(&state)?,
        tokens_not_before: row.get::<_, Option<i64>>(2).map(millis),
        changed_at: millis(row.get(3)),
        seq: row.get(4),
    })
}

impl PgStore {
    /// Applies `change` to `zone`'s registration (the database's clock) and
    /// announces it; a deletion or a new registration drops the zone's
    /// link and dataplane rows.
    pub async fn change_zone_registration(
        &self,
        zone: &str,
        change: RegistrationChange,
    ) -> Result<RegistrationWrite, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ZONES_LOCK])
            .await
            .map_err(pg_error)?;
        let current = tx
            .query_opt(
                &format!("SELECT {COLUMNS} FROM hdsd_zone_registrations WHERE zone = $1"),
                &[&zone],
            )
            .await
            .map_err(pg_error)?
            .as_ref()
            .and_then(row_of);
        let now: i64 = tx
            .query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[])
            .await
            .map_err(pg_error)?
            .get(0);
        let before = current.as_ref().map(|c| c.state);
        let Some(mut row) = next(zone, current.as_ref(), change, millis(now), 0) else {
            tx.commit().await.map_err(pg_error)?;
            return Ok(RegistrationWrite {
                registration: current.expect("nothing changes only with a row"),
                before,
            });
        };
        row.seq = tx
            .query_one(
                "INSERT INTO hdsd_zone_registrations AS r (zone, state, tokens_not_before, changed_at, seq)
                 VALUES ($1, $2, to_timestamp($3::bigint / 1000.0), now(), nextval('hdsd_zone_seq'))
                 ON CONFLICT (zone) DO UPDATE SET state = EXCLUDED.state,
                     tokens_not_before = EXCLUDED.tokens_not_before,
                     changed_at = EXCLUDED.changed_at, seq = EXCLUDED.seq
                 RETURNING seq",
                &[
                    &zone,
                    &row.state.as_str(),
                    &row.tokens_not_before.map(|t| t.timestamp_millis()),
                ],
            )
            .await
            .map_err(pg_error)?
            .get(0);
        let fresh = matches!(before, None | Some(RegistrationState::Deleted));
        if row.state == RegistrationState::Deleted || fresh {
            tx.execute("DELETE FROM hdsd_zone_links WHERE zone = $1", &[&zone])
                .await
                .map_err(pg_error)?;
            tx.execute("DELETE FROM hdsd_zone_dataplanes WHERE zone = $1", &[&zone])
                .await
                .map_err(pg_error)?;
        }
        tx.batch_execute(&format!("NOTIFY {ZONES_CHANNEL}"))
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        Ok(RegistrationWrite {
            registration: row,
            before,
        })
    }

    /// The registrations written after `seq` (0: all), oldest first.
    pub async fn zone_registrations(&self, seq: i64) -> Result<Vec<ZoneRegistration>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM hdsd_zone_registrations WHERE seq > $1 ORDER BY seq"
                ),
                &[&seq],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().filter_map(row_of).collect())
    }
}
