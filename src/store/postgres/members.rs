//! Membership (`hdsd_instances`): heartbeats on the database's clock, the
//! sweep of instances silent for `cluster.instance_timeout`, and leaving
//! at a graceful shutdown.

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_postgres::Pool;

use super::schema::*;
use super::streams::release_payload;
use super::{millis, pg_error, PgStore};
use crate::readiness::Timestamp;
use crate::store::StoreError;

/// Writes this instance's heartbeat (the database's clock); true when the
/// row was missing (first beat, or the instance was swept as dead).
async fn heartbeat(pool: &Pool, instance: &str) -> Result<bool, StoreError> {
    let client = pool.get().await.map_err(pg_error)?;
    let row = client
        .query_one(
            "INSERT INTO hdsd_instances (instance) VALUES ($1)
             ON CONFLICT (instance) DO UPDATE SET heartbeat_at = now()
             RETURNING (xmax = 0)",
            &[&instance],
        )
        .await
        .map_err(pg_error)?;
    Ok(row.get(0))
}

/// The instances to take for dead at `now`: those whose last heartbeat is
/// older than `timeout`, and those that hold streams without a heartbeat
/// row (swept or shut down) whose newest stream attached before that.
pub fn dead_instances(
    heartbeats: &[(String, Timestamp)],
    unregistered: &[(String, Timestamp)],
    now: Timestamp,
    timeout: Duration,
) -> Vec<String> {
    let timeout = chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX);
    let mut dead: Vec<String> = heartbeats
        .iter()
        .chain(unregistered)
        .filter(|(_, last)| now - *last > timeout)
        .map(|(instance, _)| instance.clone())
        .collect();
    dead.sort();
    dead.dedup();
    dead
}

/// One sweep's outcome: each dead instance and how many dataplanes' streams
/// it held.
pub type Swept = Vec<(String, u64)>;

impl PgStore {
    /// Writes this instance's heartbeat; true when its row was missing.
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        heartbeat(&self.pool, &self.instance).await
    }

    /// Takes the instances silent for `timeout` for dead, if no other
    /// instance is sweeping: deletes their heartbeat rows and the stream
    /// rows they still hold (dataplanes claimed since by another instance
    /// are no longer theirs) and announces each released stream.
    pub async fn sweep(&self, timeout: Duration) -> Result<Swept, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let locked: bool = tx
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SWEEP_LOCK])
            .await
            .map_err(pg_error)?
            .get(0);
        if !locked {
            return Ok(Vec::new());
        }
        let now = millis(
            tx.query_one(
                "SELECT floor(extract(epoch FROM now()) * 1000)::bigint",
                &[],
            )
            .await
            .map_err(pg_error)?
            .get(0),
        );
        let as_pairs = |rows: Vec<tokio_postgres::Row>| -> Vec<(String, Timestamp)> {
            rows.iter()
                .map(|r| (r.get::<_, String>(0), millis(r.get(1))))
                .collect()
        };
        let heartbeats = as_pairs(
            tx.query(
                "SELECT instance, floor(extract(epoch FROM heartbeat_at) * 1000)::bigint
                 FROM hdsd_instances",
                &[],
            )
            .await
            .map_err(pg_error)?,
        );
        let unregistered = as_pairs(
            tx.query(
                "SELECT s.instance, floor(extract(epoch FROM max(s.attached_at)) * 1000)::bigint
                 FROM hdsd_streams s
                 WHERE NOT EXISTS (SELECT 1 FROM hdsd_instances i WHERE i.instance = s.instance)
                 GROUP BY s.instance",
                &[],
            )
            .await
            .map_err(pg_error)?,
        );
        let dead = dead_instances(&heartbeats, &unregistered, now, timeout);
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        let released = tx
            .query(
                "DELETE FROM hdsd_streams WHERE instance = ANY($1) RETURNING mesh, name, instance",
                &[&dead],
            )
            .await
            .map_err(pg_error)?;
        tx.execute(
            "DELETE FROM hdsd_instances WHERE instance = ANY($1)",
            &[&dead],
        )
        .await
        .map_err(pg_error)?;
        let mut payloads = Vec::with_capacity(released.len());
        let mut swept: BTreeMap<String, u64> = dead.into_iter().map(|d| (d, 0)).collect();
        for row in &released {
            let instance: String = row.get(2);
            if let Some(id) = super::row_id(row, 0) {
                payloads.push(release_payload(&id, &instance));
            }
            *swept.entry(instance).or_default() += 1;
        }
        tx.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
            &[&STREAMS_CHANNEL, &payloads],
        )
        .await
        .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        Ok(swept.into_iter().collect())
    }

    /// Leaves the cluster at a graceful shutdown: releases the streams and
    /// the leases this instance still holds (announced) and deletes its
    /// heartbeat row, so the others need not wait for
    /// `cluster.instance_timeout`.
    pub async fn leave(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let released = tx
            .query(
                "DELETE FROM hdsd_streams WHERE instance = $1 RETURNING mesh, name",
                &[&self.instance],
            )
            .await
            .map_err(pg_error)?;
        let payloads: Vec<String> = released
            .iter()
            .filter_map(|row| super::row_id(row, 0))
            .map(|id| release_payload(&id, &self.instance))
            .collect();
        tx.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
            &[&STREAMS_CHANNEL, &payloads],
        )
        .await
        .map_err(pg_error)?;
        super::leases::release_all(&tx, &self.instance)
            .await
            .map_err(pg_error)?;
        tx.execute(
            "DELETE FROM hdsd_instances WHERE instance = $1",
            &[&self.instance],
        )
        .await
        .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(ms: i64) -> Timestamp {
        chrono::Utc
            .timestamp_millis_opt(1_700_000_000_000 + ms)
            .unwrap()
    }

    #[test]
    fn an_instance_is_dead_once_silent_for_longer_than_the_timeout() {
        let timeout = Duration::from_secs(10);
        let heartbeats = vec![
            ("a/1".to_string(), t(0)),
            ("b/2".to_string(), t(5_000)),
            ("c/3".to_string(), t(9_000)),
        ];
        // At 15 s: a is 15 s silent, b exactly 10 s (not yet), c 6 s.
        assert_eq!(
            dead_instances(&heartbeats, &[], t(15_000), timeout),
            vec!["a/1".to_string()]
        );
        assert_eq!(
            dead_instances(&heartbeats, &[], t(15_001), timeout),
            vec!["a/1".to_string(), "b/2".to_string()]
        );
        assert!(dead_instances(&heartbeats, &[], t(9_000), timeout).is_empty());
    }

    #[test]
    fn streams_of_an_instance_without_heartbeat_are_released_only_once_old() {
        let timeout = Duration::from_secs(2);
        // d/4 shut down (or was swept) and still holds a stream that
        // attached at 1 s; e/5 claimed one at 9 s (its row may be on its way back).
        let unregistered = vec![("d/4".to_string(), t(1_000)), ("e/5".to_string(), t(9_000))];
        assert_eq!(
            dead_instances(&[], &unregistered, t(10_000), timeout),
            vec!["d/4".to_string()]
        );
        // Listed both ways, an instance is named once.
        let heartbeats = vec![("d/4".to_string(), t(0))];
        assert_eq!(
            dead_instances(&heartbeats, &unregistered, t(10_000), timeout),
            vec!["d/4".to_string()]
        );
    }
}
