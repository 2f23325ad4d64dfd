//! The database's names: the tables (as migrations), the channels changes
//! are announced on, and the advisory lock keys.

use std::time::Duration;

use tokio_postgres::NoTls;

/// The channel definition changes are announced on; the payload is `mesh.name`.
pub const CHANNEL: &str = "hdsd_definitions";

/// The advisory lock key held while migrating ("hdsd" in ASCII, then 1).
pub const MIGRATION_LOCK: i64 = 0x6864_7364_0000_0001;

/// The schema, one step per version. Never edit a step once released: add one.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE SEQUENCE hdsd_revision;
     CREATE TABLE hdsd_definitions (
         mesh text NOT NULL,
         name text NOT NULL,
         format text NOT NULL CHECK (format IN ('yaml', 'json')),
         document text NOT NULL,
         revision bigint NOT NULL,
         updated_at timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (mesh, name)
     );",
    ),
    (
        2,
        "CREATE SEQUENCE hdsd_readiness_seq;
         CREATE TABLE hdsd_readiness (
             mesh text NOT NULL,
             name text NOT NULL,
             health text NOT NULL,
             seq bigint NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (mesh, name)
         );
         CREATE INDEX hdsd_readiness_by_seq ON hdsd_readiness (seq);",
    ),
    (
        3,
        "CREATE TABLE hdsd_revocations (
             jti text PRIMARY KEY,
             revoked_at timestamptz NOT NULL DEFAULT now()
         );",
    ),
    (
        4,
        "CREATE TABLE hdsd_instances (
             instance text PRIMARY KEY,
             started_at timestamptz NOT NULL DEFAULT now(),
             heartbeat_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE hdsd_streams (
             mesh text NOT NULL,
             name text NOT NULL,
             instance text NOT NULL,
             attached_at timestamptz NOT NULL,
             PRIMARY KEY (mesh, name)
         );
         CREATE INDEX hdsd_streams_by_instance ON hdsd_streams (instance);",
    ),
    (
        5,
        "CREATE TABLE hdsd_signing_keys (
             kid text NOT NULL,
             publisher text NOT NULL,
             public_key text NOT NULL,
             instance text NOT NULL,
             added_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (kid, publisher)
         );",
    ),
    (
        6,
        "CREATE SEQUENCE hdsd_zone_seq;
         CREATE TABLE hdsd_zone_links (
             zone text PRIMARY KEY,
             claim text,
             instance text,
             epoch bigint NOT NULL,
             zone_instance text NOT NULL,
             held bigint,
             snapshot boolean NOT NULL,
             opened_at timestamptz,
             heartbeat_at timestamptz,
             online_since timestamptz,
             seq bigint NOT NULL
         );
         CREATE INDEX hdsd_zone_links_by_seq ON hdsd_zone_links (seq);
         CREATE TABLE hdsd_zone_dataplanes (
             zone text NOT NULL,
             mesh text NOT NULL,
             name text NOT NULL,
             body bytea,
             seq bigint NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (zone, mesh, name)
         );
         CREATE INDEX hdsd_zone_dataplanes_by_seq ON hdsd_zone_dataplanes (seq);",
    ),
    (
        7,
        "CREATE TABLE hdsd_leases (
             name text PRIMARY KEY,
             holder text,
             epoch bigint NOT NULL,
             changed_at timestamptz NOT NULL DEFAULT now()
         );",
    ),
    (
        8,
        "CREATE TABLE hdsd_zone_registrations (
             zone text PRIMARY KEY,
             state text NOT NULL CHECK (state IN ('registered', 'disabled', 'deleted')),
             tokens_not_before timestamptz,
             changed_at timestamptz NOT NULL DEFAULT now(),
             seq bigint NOT NULL
         );
         CREATE INDEX hdsd_zone_registrations_by_seq ON hdsd_zone_registrations (seq);",
    ),
];

/// The advisory lock key the sweep of dead instances takes, per transaction
/// (`pg_try_advisory_xact_lock`): one live instance sweeps at a time.
pub const SWEEP_LOCK: i64 = 0x6864_7364_0000_0002;

/// The advisory lock key every readiness write transaction takes
/// (`pg_advisory_xact_lock`, released at commit) before it draws sequence
/// numbers from `hdsd_readiness_seq`. The writes of all instances then commit
/// one at a time, in sequence order: a reader that saw sequence number `n`
/// has seen every row numbered below it, so reading `seq > last` skips
/// nothing, and a read has seen everything committed before it started
/// (the change feed's watermark rests on that). The cost: readiness writes
/// of all instances serialize (each is at most one transaction per 200 ms
/// per instance, of two statements).
pub const READINESS_LOCK: i64 = 0x6864_7364_0000_0003;

/// How often the readiness follower reads at least, so that its watermark
/// (and the change feed's revisions) advance while nothing changes.
pub const READINESS_READ_INTERVAL: Duration = Duration::from_secs(1);

/// The channel revocations are announced on (no payload: readers read all).
pub const REVOCATIONS_CHANNEL: &str = "hdsd_revocations";

/// The channel changes of the shared public keys are announced on (no
/// payload: readers read all).
pub const KEYS_CHANNEL: &str = "hdsd_signing_keys";

/// The channel stream claims are announced on, one JSON object per
/// dataplane ([`StreamPayload`]): `{"mesh", "name", "instance", "at"}` when a
/// stream for the dataplane attached on that instance at `at`, without `at`
/// when that instance no longer holds it (its stream ended, or the instance
/// was found dead). Encoded, not joined with separators: no name can forge
/// another field, and with names and instance names bounded
/// ([`crate::names`], [`MAX_INSTANCE`]) every payload fits PostgreSQL's
/// 8,000 bytes by construction ([`MAX_STREAM_PAYLOAD`]).
pub const STREAMS_CHANNEL: &str = "hdsd_streams";

/// The advisory lock key every zone write transaction takes
/// (`pg_advisory_xact_lock`) before it draws numbers from `hdsd_zone_seq`:
/// zone rows commit in sequence order, as readiness rows do under
/// [`READINESS_LOCK`].
pub const ZONES_LOCK: i64 = 0x6864_7364_0000_0004;

/// The channel zone writes are announced on (no payload: readers read the
/// rows whose `seq` is above the last they saw).
pub const ZONES_CHANNEL: &str = "hdsd_zones";

/// The channel a lease's change of holder is announced on (taken, released
/// or given up), the lease's name as payload: instances waiting for it try
/// at once instead of at their next check.
pub const LEASES_CHANNEL: &str = "hdsd_leases";

/// The channel readiness writes are announced on (no payload: readers
/// read the rows whose `seq` is above the last they saw).
pub const READINESS_CHANNEL: &str = "hdsd_readiness";

/// advisory lock; closing the connection releases the lock whatever happens.
/// Applies the missing migrations on a connection of its own, holding the
/// advisory lock; closing the connection releases the lock whatever happens.
pub(super) async fn migrate(config: &tokio_postgres::Config) -> Result<(), tokio_postgres::Error> {
    let (mut client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS hdsd_schema (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
    let applied: i32 = client
        .query_one("SELECT coalesce(max(version), 0) FROM hdsd_schema", &[])
        .await?
        .get(0);
    let newest = MIGRATIONS.last().map(|(v, _)| *v).unwrap_or(0);
    if applied > newest {
        tracing::warn!(
            schema = applied,
            known = newest,
            "the database's schema is newer than this hdsd knows; an instance of a newer version migrated it"
        );
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > applied) {
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute("INSERT INTO hdsd_schema (version) VALUES ($1)", &[version])
            .await?;
        tx.commit().await?;
        tracing::info!(version, "PostgreSQL store: applied schema migration");
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    drop(client);
    let _ = driver.await;
    Ok(())
}
