//! Zones shared by the instances of a global (`hdsd_zone_links`,
//! `hdsd_zone_dataplanes`): the instance holding a zone's stream writes the
//! zone's link (who holds it, the lease epoch, the revision held complete,
//! the liveness times) and its dataplanes; every instance reads what the
//! others wrote.
//!
//! - **Times on the database's clock**: a writer sends the *age* of each of
//!   its receive times (heartbeat, stream opened, online since) and the row
//!   stores `now() - age`; a reader gets `now() - time` back as an age and
//!   puts it on its own clock. No two instances' clocks are ever compared.
//! - **Order**: every write transaction takes [`ZONES_LOCK`] before it draws
//!   numbers from `hdsd_zone_seq`, so rows commit in sequence order and a
//!   reader of `seq > last` skips nothing (as readiness does).
//! - **The lease**: a claim takes the link when the epoch is at least the
//!   one held, when it is the same claim, or when the zone has been silent
//!   for `zone_timeout` (the rule of `zones::remote`); every later write of
//!   the claim is conditional on still holding it, and a claim that lost
//!   writes nothing more ([`Written::Lost`]).
//! - **Deletions** are tombstones (`body IS NULL`) so a reader of `seq >
//!   last` sees them; a full read ignores them and the writer prunes those
//!   older than [`TOMBSTONE_TTL`].

use std::time::Duration;

use super::schema::*;
use super::{pg_error, PgStore};
use crate::dataplane::DataplaneId;
use crate::store::StoreError;

/// How long a deleted zone dataplane stays as a tombstone: a reader behind
/// by more reads everything again (every `reconcile_interval`).
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(3600);

/// The link of a zone as the holding instance has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// The zone's lease epoch, and the zone instance holding the uplink.
    pub epoch: u64,
    pub zone_instance: String,
    /// The zone revision held complete (`None`: syncing).
    pub held: Option<u64>,
    /// True while a snapshot is in progress.
    pub snapshot: bool,
    /// How long ago, at the write, the stream was accepted, the last
    /// message arrived and the zone came online.
    pub opened_age: Option<Duration>,
    pub heartbeat_age: Option<Duration>,
    pub online_since_age: Option<Duration>,
}

/// What a write does to the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkChange {
    /// A stream of this instance won the zone: take the link if the lease
    /// rule allows.
    Claim(LinkState),
    /// The holding stream's news.
    Update(LinkState),
    /// The holding stream ended: the link is held by nobody (the times
    /// stay, so the zone goes offline on time everywhere).
    Release,
}

/// One zone's write, by the instance holding its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneWrite {
    pub zone: String,
    /// The holding stream (`<instance>#<stream>`).
    pub claim: String,
    pub link: LinkChange,
    /// Dataplanes created or changed (protobuf `hdsd.v1.Dataplane`), and
    /// deleted; one entry per dataplane.
    pub upserts: Vec<(DataplaneId, Vec<u8>)>,
    pub deletes: Vec<DataplaneId>,
}

/// What became of one [`ZoneWrite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Written, the link's row at this sequence number.
    Kept { seq: i64 },
    /// The claim does not hold the link (another one took it): nothing was
    /// written for this zone.
    Lost,
}

/// A zone's link as a reader finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRow {
    pub zone: String,
    /// The holding stream, `None` once released.
    pub claim: Option<String>,
    /// The instance of the global holding it.
    pub instance: Option<String>,
    pub state: LinkState,
    pub seq: i64,
}

/// A zone dataplane as a reader finds it (`body` `None`: deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneDataplaneRow {
    pub zone: String,
    pub id: DataplaneId,
    pub body: Option<Vec<u8>>,
    pub seq: i64,
}

/// One read of the zones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZonesRead {
    /// True for a read from the start: every zone's whole state (no
    /// tombstones); a reader replaces what it holds of those zones.
    pub full: bool,
    pub links: Vec<LinkRow>,
    pub dataplanes: Vec<ZoneDataplaneRow>,
    /// The highest sequence number read (the next read starts after it).
    pub seq: i64,
}

fn millis(age: Option<Duration>) -> Option<i64> {
    age.map(|a| a.as_millis().min(i64::MAX as u128) as i64)
}

fn age(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(ms.max(0) as u64))
}

impl PgStore {
    /// Writes `writes` in one transaction (after [`ZONES_LOCK`]) and
    /// announces them with one `NOTIFY`; `zone_timeout` is how long a zone
    /// may be silent before any epoch may claim it. `prune`: also drop
    /// tombstones older than [`TOMBSTONE_TTL`].
    pub async fn write_zones(
        &self,
        writes: &[ZoneWrite],
        zone_timeout: Duration,
        prune: bool,
    ) -> Result<Vec<Written>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ZONES_LOCK])
            .await
            .map_err(pg_error)?;
        let timeout = millis(Some(zone_timeout));
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            let row = match &w.link {
                LinkChange::Claim(s) => tx
                    .query_opt(
                        "INSERT INTO hdsd_zone_links AS l (zone, claim, instance, epoch, zone_instance,
                             held, snapshot, opened_at, heartbeat_at, online_since, seq)
                         VALUES ($1, $2, $3, $4, $5, $6, $7,
                             now() - $8::bigint * interval '1 millisecond',
                             now() - $9::bigint * interval '1 millisecond',
                             now() - $10::bigint * interval '1 millisecond',
                             nextval('hdsd_zone_seq'))
                         ON CONFLICT (zone) DO UPDATE SET claim = EXCLUDED.claim,
                             instance = EXCLUDED.instance, epoch = EXCLUDED.epoch,
                             zone_instance = EXCLUDED.zone_instance, held = EXCLUDED.held,
                             snapshot = EXCLUDED.snapshot, opened_at = EXCLUDED.opened_at,
                             heartbeat_at = EXCLUDED.heartbeat_at,
                             online_since = EXCLUDED.online_since, seq = EXCLUDED.seq
                         WHERE l.claim = EXCLUDED.claim OR l.epoch <= EXCLUDED.epoch
                             OR greatest(l.heartbeat_at, l.opened_at) IS NULL
                             OR greatest(l.heartbeat_at, l.opened_at)
                                 < now() - $11::bigint * interval '1 millisecond'
                         RETURNING seq",
                        &[
                            &w.zone,
                            &w.claim,
                            &self.instance,
                            &(s.epoch as i64),
                            &s.zone_instance,
                            &s.held.map(|h| h as i64),
                            &s.snapshot,
                            &millis(s.opened_age),
                            &millis(s.heartbeat_age),
                            &millis(s.online_since_age),
                            &timeout,
                        ],
                    )
                    .await
                    .map_err(pg_error)?,
                LinkChange::Update(s) => tx
                    .query_opt(
                        "UPDATE hdsd_zone_links SET epoch = $3, zone_instance = $4, held = $5,
                             snapshot = $6,
                             opened_at = now() - $7::bigint * interval '1 millisecond',
                             heartbeat_at = now() - $8::bigint * interval '1 millisecond',
                             online_since = now() - $9::bigint * interval '1 millisecond',
                             seq = nextval('hdsd_zone_seq')
                         WHERE zone = $1 AND claim = $2
                         RETURNING seq",
                        &[
                            &w.zone,
                            &w.claim,
                            &(s.epoch as i64),
                            &s.zone_instance,
                            &s.held.map(|h| h as i64),
                            &s.snapshot,
                            &millis(s.opened_age),
                            &millis(s.heartbeat_age),
                            &millis(s.online_since_age),
                        ],
                    )
                    .await
                    .map_err(pg_error)?,
                LinkChange::Release => tx
                    .query_opt(
                        "UPDATE hdsd_zone_links SET claim = NULL, instance = NULL,
                             seq = nextval('hdsd_zone_seq')
                         WHERE zone = $1 AND claim = $2
                         RETURNING seq",
                        &[&w.zone, &w.claim],
                    )
                    .await
                    .map_err(pg_error)?,
            };
            let Some(row) = row else {
                out.push(Written::Lost);
                continue;
            };
            out.push(Written::Kept { seq: row.get(0) });
            if !w.upserts.is_empty() {
                let (meshes, names, bodies): (Vec<&str>, Vec<&str>, Vec<&[u8]>) = w
                    .upserts
                    .iter()
                    .map(|(id, body)| (id.mesh.as_str(), id.name.as_str(), body.as_slice()))
                    .fold(Default::default(), |mut acc, (m, n, b)| {
                        acc.0.push(m);
                        acc.1.push(n);
                        acc.2.push(b);
                        acc
                    });
                tx.execute(
                    "INSERT INTO hdsd_zone_dataplanes (zone, mesh, name, body, seq)
                     SELECT $1, mesh, name, body, nextval('hdsd_zone_seq')
                     FROM unnest($2::text[], $3::text[], $4::bytea[]) AS u(mesh, name, body)
                     ON CONFLICT (zone, mesh, name) DO UPDATE SET body = EXCLUDED.body,
                         seq = EXCLUDED.seq, updated_at = now()",
                    &[&w.zone, &meshes, &names, &bodies],
                )
                .await
                .map_err(pg_error)?;
            }
            if !w.deletes.is_empty() {
                let meshes: Vec<&str> = w.deletes.iter().map(|id| id.mesh.as_str()).collect();
                let names: Vec<&str> = w.deletes.iter().map(|id| id.name.as_str()).collect();
                tx.execute(
                    "UPDATE hdsd_zone_dataplanes AS d SET body = NULL,
                         seq = nextval('hdsd_zone_seq'), updated_at = now()
                     FROM unnest($2::text[], $3::text[]) AS u(mesh, name)
                     WHERE d.zone = $1 AND d.mesh = u.mesh AND d.name = u.name
                         AND d.body IS NOT NULL",
                    &[&w.zone, &meshes, &names],
                )
                .await
                .map_err(pg_error)?;
            }
        }
        if prune {
            tx.execute(
                "DELETE FROM hdsd_zone_dataplanes
                 WHERE body IS NULL AND updated_at < now() - $1::bigint * interval '1 millisecond'",
                &[&millis(Some(TOMBSTONE_TTL))],
            )
            .await
            .map_err(pg_error)?;
        }
        tx.batch_execute(&format!("NOTIFY {ZONES_CHANNEL}"))
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        Ok(out)
    }

    /// The zones' rows written after `seq` (0: everything, without
    /// tombstones), oldest first, read in one snapshot; every time as its
    /// age on the database's clock.
    pub async fn zones_since(&self, seq: i64) -> Result<ZonesRead, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg_error)?;
        let age_sql =
            |column: &str| format!("(extract(epoch FROM now() - {column}) * 1000)::bigint");
        let links = tx
            .query(
                &format!(
                    "SELECT zone, claim, instance, epoch, zone_instance, held, snapshot,
                         {}, {}, {}, seq
                     FROM hdsd_zone_links WHERE seq > $1 ORDER BY seq",
                    age_sql("opened_at"),
                    age_sql("heartbeat_at"),
                    age_sql("online_since")
                ),
                &[&seq],
            )
            .await
            .map_err(pg_error)?;
        let dataplanes = tx
            .query(
                "SELECT zone, mesh, name, body, seq FROM hdsd_zone_dataplanes
                 WHERE seq > $1 AND ($1 > 0 OR body IS NOT NULL) ORDER BY seq",
                &[&seq],
            )
            .await
            .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        let mut read = ZonesRead {
            full: seq == 0,
            seq,
            ..ZonesRead::default()
        };
        for row in &links {
            let seq: i64 = row.get(10);
            read.seq = read.seq.max(seq);
            read.links.push(LinkRow {
                zone: row.get(0),
                claim: row.get(1),
                instance: row.get(2),
                state: LinkState {
                    epoch: row.get::<_, i64>(3).max(0) as u64,
                    zone_instance: row.get(4),
                    held: row.get::<_, Option<i64>>(5).map(|h| h.max(0) as u64),
                    snapshot: row.get(6),
                    opened_age: age(row.get(7)),
                    heartbeat_age: age(row.get(8)),
                    online_since_age: age(row.get(9)),
                },
                seq,
            });
        }
        for row in &dataplanes {
            let seq: i64 = row.get(4);
            read.seq = read.seq.max(seq);
            // Names were checked when written; a row that breaks the
            // rules now (a hand edit) is skipped, not trusted.
            let Some(id) = super::row_id(row, 1) else {
                continue;
            };
            read.dataplanes.push(ZoneDataplaneRow {
                zone: row.get(0),
                id,
                body: row.get(3),
                seq,
            });
        }
        Ok(read)
    }

    /// Poked on each zone write of any instance, and on every reconnect.
    pub fn zones_signal(&self) -> tokio::sync::watch::Receiver<()> {
        self.zones_signal.subscribe()
    }
}
