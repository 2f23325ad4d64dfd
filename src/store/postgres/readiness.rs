//! Readiness shared by the instances (`hdsd_readiness`): batched writes
//! under the readiness lock, and the follower that reads what the others
//! wrote with the watermark that numbers the change feed.

use std::collections::BTreeMap;

use super::schema::*;
use super::{pg_error, PgStore};
use crate::dataplane::DataplaneId;
use crate::store::{ReadinessStore, StoreError, StoredHealth};

/// Readiness shared by the instances: each instance writes the state of the
/// dataplanes whose streams it holds (the batches of [`super::StoreHandle`]:
/// at most one transaction per 200 ms, whatever the report rate) and
/// announces each batch with one `NOTIFY`; [`PgStore::follow_readiness`]
/// hands every instance the rows written since it last looked. Called on
/// the blocking pool (the store writer), so it may wait for its queries.
impl ReadinessStore for PgStore {
    fn load(&self) -> Result<BTreeMap<DataplaneId, StoredHealth>, StoreError> {
        self.runtime.block_on(async {
            let (rows, _) = self.readiness_since(0).await?;
            Ok(rows
                .into_iter()
                .map(|(id, health, _)| (id, health))
                .collect())
        })
    }

    /// One statement whatever the batch's size, in a transaction of its
    /// own: it takes the [`READINESS_LOCK`] that orders the instances'
    /// writes, upserts every row from `unnest(...)` numbered from the
    /// sequence, deletes every row to delete, and notifies; the lock is
    /// released when that transaction commits. So the lock is held for the
    /// server's time alone, never across a round trip to a client: with five
    /// round trips under it (lock, insert, delete, notify, commit), one
    /// instance slow to be scheduled stretched every other instance's wait,
    /// and at 16k dataplanes on eight instances the writes stalled for
    /// seconds. (At 10k dataplanes per-row statements made a batch take
    /// seconds; hence the arrays.)
    fn write(&self, batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<(), StoreError> {
        let rows = batch_rows(batch)?;
        if rows.is_empty() {
            return Ok(());
        }
        self.runtime.block_on(async {
            let client = self.client().await?;
            // Prepared outside the lock, once per connection.
            let statement = client
                .prepare_cached(WRITE_READINESS)
                .await
                .map_err(pg_error)?;
            client
                .execute(
                    &statement,
                    &[
                        &READINESS_LOCK,
                        &rows.upsert_meshes,
                        &rows.upsert_names,
                        &rows.upsert_health,
                        &rows.delete_meshes,
                        &rows.delete_names,
                        &READINESS_CHANNEL,
                    ],
                )
                .await
                .map_err(pg_error)?;
            Ok(())
        })
    }
}

/// The readiness write, one statement (see [`PgStore::write`]). The lock's
/// CTE is joined to the rows to upsert, so it is taken before the first
/// `nextval` (sequence order = commit order, see [`READINESS_LOCK`]); a CTE
/// referenced more than once, and one calling a volatile function, is
/// evaluated once. The upsert and the delete never touch the same row
/// ([`batch_rows`] keeps one entry per dataplane).
const WRITE_READINESS: &str = "
    WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock($1)),
    upserted AS (
        INSERT INTO hdsd_readiness (mesh, name, health, seq)
        SELECT u.mesh, u.name, u.health, nextval('hdsd_readiness_seq')
        FROM locked, unnest($2::text[], $3::text[], $4::text[]) AS u(mesh, name, health)
        ON CONFLICT (mesh, name) DO UPDATE SET health = EXCLUDED.health,
            seq = EXCLUDED.seq, updated_at = now()
        RETURNING 1
    ),
    deleted AS (
        DELETE FROM hdsd_readiness AS r
        USING locked, unnest($5::text[], $6::text[]) AS u(mesh, name)
        WHERE r.mesh = u.mesh AND r.name = u.name
        RETURNING 1
    )
    SELECT pg_notify($7, '') FROM locked";

/// A readiness batch as the columns of its two statements. One row per
/// dataplane, the last update in the batch winning (one statement may not
/// touch a row twice).
#[derive(Debug, Default, PartialEq)]
struct BatchRows {
    upsert_meshes: Vec<String>,
    upsert_names: Vec<String>,
    upsert_health: Vec<String>,
    delete_meshes: Vec<String>,
    delete_names: Vec<String>,
}

impl BatchRows {
    fn is_empty(&self) -> bool {
        self.upsert_meshes.is_empty() && self.delete_meshes.is_empty()
    }
}

fn batch_rows(batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<BatchRows, StoreError> {
    let mut last: BTreeMap<&DataplaneId, &Option<StoredHealth>> = BTreeMap::new();
    for (id, value) in batch {
        last.insert(id, value);
    }
    let mut rows = BatchRows::default();
    for (id, value) in last {
        match value {
            Some(health) => {
                rows.upsert_meshes.push(id.mesh.clone());
                rows.upsert_names.push(id.name.clone());
                rows.upsert_health
                    .push(serde_json::to_string(health).map_err(pg_error)?);
            }
            None => {
                rows.delete_meshes.push(id.mesh.clone());
                rows.delete_names.push(id.name.clone());
            }
        }
    }
    Ok(rows)
}

impl PgStore {
    /// Readiness rows written after `seq`, oldest first, and the watermark
    /// of the read: the database's `statement_timestamp()` in microseconds
    /// since the UNIX epoch, taken in the same statement, before its
    /// snapshot. Every row committed before the watermark is in the
    /// snapshot, and (under [`READINESS_LOCK`]) every row committed before
    /// one in the snapshot is too.
    async fn readiness_since(&self, seq: i64) -> Result<(Vec<ReadinessRow>, u64), StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "WITH clock AS (
                     SELECT (extract(epoch FROM statement_timestamp()) * 1000000)::bigint AS us
                 )
                 SELECT clock.us, r.mesh, r.name, r.health, r.seq
                 FROM clock LEFT JOIN hdsd_readiness AS r ON r.seq > $1
                 ORDER BY r.seq",
                &[&seq],
            )
            .await
            .map_err(pg_error)?;
        Ok(parse_rows(&rows))
    }

    /// Every readiness row's dataplane and sequence number, without its
    /// health: what the periodic check compares with the rows handed on.
    async fn readiness_seqs(&self) -> Result<Vec<(DataplaneId, i64)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT mesh, name, seq FROM hdsd_readiness", &[])
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = super::row_id(row, 0)?;
                Some((id, row.get::<_, i64>(2)))
            })
            .collect())
    }

    /// The readiness rows of `ids`, with the database clock of the read.
    async fn readiness_of(
        &self,
        ids: &[DataplaneId],
    ) -> Result<(Vec<ReadinessRow>, u64), StoreError> {
        let client = self.client().await?;
        let meshes: Vec<&str> = ids.iter().map(|id| id.mesh.as_str()).collect();
        let names: Vec<&str> = ids.iter().map(|id| id.name.as_str()).collect();
        let rows = client
            .query(
                "WITH clock AS (
                     SELECT (extract(epoch FROM statement_timestamp()) * 1000000)::bigint AS us
                 )
                 SELECT clock.us, r.mesh, r.name, r.health, r.seq
                 FROM clock LEFT JOIN (
                     hdsd_readiness AS r
                     JOIN unnest($1::text[], $2::text[]) AS u(mesh, name)
                       ON r.mesh = u.mesh AND r.name = u.name
                 ) ON true
                 ORDER BY r.seq",
                &[&meshes, &names],
            )
            .await
            .map_err(pg_error)?;
        Ok(parse_rows(&rows))
    }

    /// Hands `observe` the readiness other instances write, with the
    /// watermark of the read: the rows written since the last look on each
    /// notification and at least every [`READINESS_READ_INTERVAL`]. Once
    /// `observe` has completed (every change the rows made is in the change
    /// feed), hands the watermark to `watermark`, but only while the
    /// listener is in force, so that definition changes were heard as well.
    /// A failed read hands nothing: the watermark stays where it was.
    ///
    /// Once per `reconcile_interval`, a check (a safety net: under
    /// [`READINESS_LOCK`] no row is skipped) reads every row's sequence
    /// number alone and fetches the few rows whose number differs from the
    /// one handed on ([`Followed`]), among them the rows of dataplanes this
    /// instance did not know yet when they were read. It used to read and
    /// hand on every row whole: at 25k dataplanes on eight instances that
    /// held the follower for seconds every 30 s. Runs until the store is
    /// dropped.
    pub async fn follow_readiness<O, Fut>(
        self: std::sync::Arc<Self>,
        observe: O,
        watermark: impl Fn(u64) + Send + 'static,
    ) where
        O: Fn(Vec<(DataplaneId, StoredHealth)>, u64) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Vec<DataplaneId>> + Send,
    {
        let mut signal = self.readiness_signal.subscribe();
        let listening = self.listening.subscribe();
        let mut full =
            tokio::time::interval_at(tokio::time::Instant::now() + self.reconcile, self.reconcile);
        full.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tick = tokio::time::interval(READINESS_READ_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = 0;
        let mut followed = Followed::default();
        let mut failing = false;
        loop {
            let check = tokio::select! {
                changed = signal.changed() => if changed.is_err() { return } else { false },
                _ = full.tick() => true,
                _ = tick.tick() => false,
            };
            let heard = *listening.borrow();
            let started = std::time::Instant::now();
            let read = if check {
                self.check_readiness(&mut followed).await
            } else {
                self.readiness_since(last)
                    .await
                    .map(|(rows, w)| (rows, Some(w)))
            };
            match read {
                Ok((rows, w)) => {
                    failing = false;
                    let count = rows.len();
                    let mut observed = Vec::with_capacity(count);
                    for (id, health, seq) in rows {
                        // A check's rows are not all those above `last`: a
                        // row written since its first read may be missing.
                        if !check {
                            last = last.max(seq);
                        }
                        // Handed on already (by a check that came first).
                        if !followed.handed(id.clone(), seq) {
                            continue;
                        }
                        observed.push((id, health));
                    }
                    for unknown in observe(observed, w.unwrap_or(0)).await {
                        followed.forget(&unknown);
                    }
                    if let (Some(w), true) = (w, heard && *listening.borrow()) {
                        watermark(w);
                    }
                    crate::metrics::readiness_followed(check, count, started.elapsed());
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "cannot read the readiness of other instances: {e}; retrying every {}s",
                            READINESS_READ_INTERVAL.as_secs()
                        );
                    }
                    failing = true;
                }
            }
        }
    }

    /// The periodic check: the rows whose sequence number differs from the
    /// one handed on, and no watermark (they are not every row committed
    /// before the read).
    async fn check_readiness(
        &self,
        followed: &mut Followed,
    ) -> Result<(Vec<ReadinessRow>, Option<u64>), StoreError> {
        let differing = followed.differing(self.readiness_seqs().await?);
        if differing.is_empty() {
            return Ok((Vec::new(), None));
        }
        let (rows, _) = self.readiness_of(&differing).await?;
        Ok((rows, None))
    }
}

/// The readiness rows a follower has handed on, by sequence number: the
/// periodic check compares them with the table's and fetches only the rows
/// that differ. Plain data.
#[derive(Debug, Default)]
struct Followed {
    seqs: std::collections::HashMap<DataplaneId, i64>,
}

impl Followed {
    /// The row of `id` numbered `seq` is handed on; `false` if it was
    /// already.
    fn handed(&mut self, id: DataplaneId, seq: i64) -> bool {
        self.seqs.insert(id, seq) != Some(seq)
    }

    /// The row of `id` could not be applied (its dataplane is not known
    /// here yet): the next check fetches it again.
    fn forget(&mut self, id: &DataplaneId) {
        self.seqs.remove(id);
    }

    /// Given every row's dataplane and sequence number in the table now:
    /// forgets the rows deleted since, and returns the dataplanes whose row
    /// was not handed on at that number.
    fn differing(&mut self, table: Vec<(DataplaneId, i64)>) -> Vec<DataplaneId> {
        let mut present = std::collections::HashSet::with_capacity(table.len());
        let mut differing = Vec::new();
        for (id, seq) in table {
            if self.seqs.get(&id) != Some(&seq) {
                differing.push(id.clone());
            }
            present.insert(id);
        }
        self.seqs.retain(|id, _| present.contains(id));
        differing
    }
}

/// Parses the rows of a readiness read (watermark, mesh, name, health,
/// seq), and the watermark: rows left joined to the clock, so an empty read
/// still has one.
fn parse_rows(rows: &[tokio_postgres::Row]) -> (Vec<ReadinessRow>, u64) {
    let watermark = rows
        .first()
        .map_or(0, |row| row.get::<_, i64>(0).max(0) as u64);
    let rows = rows
        .iter()
        .filter_map(|row| {
            let mesh = row.get::<_, Option<String>>(1)?;
            let name = row.get::<_, Option<String>>(2)?;
            let id = DataplaneId::try_new(mesh, name).ok()?;
            let health: StoredHealth = serde_json::from_str(row.get::<_, Option<&str>>(3)?).ok()?;
            Some((id, health, row.get::<_, Option<i64>>(4)?))
        })
        .collect();
    (rows, watermark)
}

/// One readiness row: dataplane, health, sequence number.
type ReadinessRow = (DataplaneId, StoredHealth, i64);

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    /// A batch becomes one row per dataplane, the last update winning, split
    /// into the upsert's and the delete's columns.
    #[test]
    fn a_batch_is_one_row_per_dataplane_the_last_update_winning() {
        let health = |n: usize| StoredHealth {
            inbounds: Vec::new(),
            last_report_at: Some(
                chrono::Utc
                    .timestamp_opt(1_700_000_000 + n as i64, 0)
                    .unwrap(),
            ),
            reattached_at: None,
        };
        let (a, b, c) = (
            DataplaneId::new("default", "a"),
            DataplaneId::new("default", "b"),
            DataplaneId::new("other", "c"),
        );
        let rows = batch_rows(&[
            (a.clone(), Some(health(1))),
            (b.clone(), Some(health(2))),
            (a.clone(), None),
            (c.clone(), None),
            (c.clone(), Some(health(3))),
        ])
        .unwrap();
        assert_eq!(rows.upsert_meshes, ["default", "other"]);
        assert_eq!(rows.upsert_names, ["b", "c"]);
        assert_eq!(
            rows.upsert_health,
            [
                serde_json::to_string(&health(2)).unwrap(),
                serde_json::to_string(&health(3)).unwrap()
            ]
        );
        assert_eq!(
            (rows.delete_meshes, rows.delete_names),
            (vec!["default".to_string()], vec!["a".to_string()])
        );
        assert!(batch_rows(&[]).unwrap().is_empty());
    }

    /// The check fetches the rows not handed on at their number (new,
    /// rewritten, or forgotten because they could not be applied), forgets
    /// deleted ones, and a row handed on is not handed on twice.
    #[test]
    fn the_check_fetches_only_the_rows_not_handed_on() {
        let id = |n: &str| DataplaneId::new("default", n);
        let mut followed = Followed::default();
        assert!(followed.handed(id("a"), 1));
        assert!(followed.handed(id("b"), 2));
        assert!(followed.handed(id("c"), 3));
        assert!(!followed.handed(id("a"), 1), "the same row twice");
        followed.forget(&id("c"));
        let table = vec![(id("a"), 1), (id("b"), 5), (id("c"), 3), (id("d"), 4)];
        assert_eq!(
            followed.differing(table),
            [id("b"), id("c"), id("d")],
            "rewritten, forgotten, new"
        );
        assert!(followed.handed(id("b"), 5));
        assert!(followed.handed(id("c"), 3));
        assert!(followed.handed(id("d"), 4));
        // `a` deleted from the table: forgotten, so a row written for it
        // again is handed on even at a number seen before.
        assert_eq!(
            followed.differing(vec![(id("b"), 5), (id("c"), 3), (id("d"), 4)]),
            Vec::<DataplaneId>::new()
        );
        assert!(followed.handed(id("a"), 1));
    }
}
