//! The PostgreSQL engine of [`DefinitionStore`], for several hdsd instances
//! sharing one database (`store.kind = "postgres"`).
//!
//! - **Schema**: versioned migrations ([`MIGRATIONS`]), applied at start on a
//!   connection of their own that holds `pg_advisory_lock(`[`MIGRATION_LOCK`]`)`:
//!   instances starting together apply each migration once, one after the
//!   other. The versions applied are rows of `hdsd_schema`.
//! - **Writes**: one statement per write (conditional on the revision where
//!   asked), its `pg_notify` in the same transaction, so a notification is
//!   sent exactly when the change commits. Revisions come from one sequence.
//! - **Readiness**: each write transaction takes
//!   `pg_advisory_xact_lock(`[`READINESS_LOCK`]`)` before it numbers its rows
//!   from `hdsd_readiness_seq`, so rows commit in sequence order; the
//!   follower ([`PgStore::follow_readiness`]) reads the rows above the last
//!   sequence number it saw together with the database clock of that read,
//!   the watermark that numbers the change feed (cluster-wide revisions).
//! - **Changes**: one connection per instance `LISTEN`s on
//!   [`CHANNEL`]. When it (re)connects, and every `reconcile_interval`, it
//!   announces [`DefinitionChange::All`], so a notification missed while it
//!   was down is healed by a full read. It reconnects with a backoff and never
//!   gives up; a lost connection is logged once, not once per attempt.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{broadcast, watch};
use tokio_postgres::{AsyncMessage, NoTls};

use super::definitions::{
    DefinitionChange, DefinitionStore, DocumentFormat, Precondition, StoreFuture, StoredDefinition,
    WriteError, CHANGES_BUFFER,
};
use super::{ReadinessStore, StoreError, StoredHealth};
use crate::config::PostgresConfig;
use crate::dataplane::DataplaneId;
use crate::readiness::Timestamp;
use std::collections::BTreeMap;

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

/// The channel stream claims are announced on, one JSON object per
/// dataplane ([`StreamPayload`]): `{"mesh", "name", "instance", "at"}` when a
/// stream for the dataplane attached on that instance at `at`, without `at`
/// when that instance no longer holds it (its stream ended, or the instance
/// was found dead). Encoded, not joined with separators: no name can forge
/// another field, and with names and instance names bounded
/// ([`crate::names`], [`MAX_INSTANCE`]) every payload fits PostgreSQL's
/// 8,000 bytes by construction ([`MAX_STREAM_PAYLOAD`]).
pub const STREAMS_CHANNEL: &str = "hdsd_streams";

/// The channel readiness writes are announced on (no payload: readers
/// read the rows whose `seq` is above the last they saw).
pub const READINESS_CHANNEL: &str = "hdsd_readiness";

fn pg_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Postgres(e.to_string())
}

/// The PostgreSQL store: a connection pool and a listener task.
pub struct PgStore {
    pool: Pool,
    changes: broadcast::Sender<DefinitionChange>,
    /// Poked on each readiness notification and on every (re)connect.
    readiness_signal: watch::Sender<()>,
    /// Poked on each revocation and on every (re)connect.
    revocations_signal: watch::Sender<()>,
    /// Poked on each change of the shared keys and on every (re)connect.
    keys_signal: watch::Sender<()>,
    reconcile: Duration,
    /// The runtime the blocking [`ReadinessStore`] calls run their queries on.
    runtime: tokio::runtime::Handle,
    /// This instance's name in stream claims (`<host>/<pid>`).
    instance: String,
    /// Streams attached on (or released by) other instances.
    replaced: broadcast::Sender<StreamNote>,
    /// Dataplanes whose stream attached here (`Some(when)`) or ended here
    /// (`None`), to announce.
    claims: tokio::sync::mpsc::UnboundedSender<(DataplaneId, Option<Timestamp>)>,
    /// Poked on every (re)connect of the listener: the stream holders are
    /// read whole.
    streams_signal: watch::Sender<()>,
    /// Whether the listener's `LISTEN` is in force (definition changes are
    /// heard): the readiness follower publishes watermarks only then.
    listening: watch::Sender<bool>,
    describe: String,
    /// Dropped with the store: the listener task ends.
    _alive: watch::Sender<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

/// Where a connection string points, without its password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("PostgreSQL database {db} on {host}")
}

impl PgStore {
    /// Connects, applies the migrations this database lacks (under the
    /// advisory lock), and starts listening for changes: it returns once the
    /// listener's `LISTEN` is in force (or after `connect_timeout`, when the
    /// listener keeps retrying in the background), so that every change
    /// committed afterwards is announced on [`DefinitionStore::changes`].
    pub async fn connect(settings: &PostgresConfig) -> Result<PgStore, StoreError> {
        let mut config: tokio_postgres::Config = settings
            .url
            .parse()
            .map_err(|e| pg_error(format!("store.postgres.url: {e}")))?;
        config.connect_timeout(settings.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("hdsd");
        }
        let describe = describe(&config);
        migrate(&config)
            .await
            .map_err(|e| pg_error(format!("{describe}: {e}")))?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .wait_timeout(Some(settings.wait_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(pg_error)?;
        let (changes, _) = broadcast::channel(CHANGES_BUFFER);
        let (alive, alive_rx) = watch::channel(());
        let (readiness_signal, _) = watch::channel(());
        let (revocations_signal, _) = watch::channel(());
        let (keys_signal, _) = watch::channel(());
        let (streams_signal, _) = watch::channel(());
        let (listening_flag, _) = watch::channel(false);
        let instance = instance_name();
        let (replaced, _) = broadcast::channel(CHANGES_BUFFER);
        let (listening_tx, listening) = tokio::sync::oneshot::channel();
        tokio::spawn(listen(
            config,
            listening_tx,
            Announcements {
                changes: changes.clone(),
                readiness: readiness_signal.clone(),
                revocations: revocations_signal.clone(),
                keys: keys_signal.clone(),
                streams: streams_signal.clone(),
                replaced: replaced.clone(),
                listening: listening_flag.clone(),
                instance: instance.clone(),
            },
            settings.reconcile_interval,
            alive_rx,
        ));
        if tokio::time::timeout(settings.connect_timeout, listening)
            .await
            .is_err()
        {
            tracing::warn!("{describe}: not listening for changes yet; every definition is read again once it listens");
        }
        let (claims, claims_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(announce_claims(pool.clone(), instance.clone(), claims_rx));
        Ok(PgStore {
            pool,
            changes,
            readiness_signal,
            revocations_signal,
            keys_signal,
            reconcile: settings.reconcile_interval,
            runtime: tokio::runtime::Handle::current(),
            instance,
            replaced,
            claims,
            streams_signal,
            listening: listening_flag,
            describe,
            _alive: alive,
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| pg_error(format!("{}: no connection: {e}", self.describe)))
    }

    async fn current(
        client: &deadpool_postgres::Transaction<'_>,
        id: &DataplaneId,
    ) -> Result<Option<u64>, tokio_postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT revision FROM hdsd_definitions WHERE mesh = $1 AND name = $2",
                &[&id.mesh, &id.name],
            )
            .await?
            .map(|row| row.get::<_, i64>(0) as u64))
    }
}

/// Applies the missing migrations on a connection of its own, holding the
/// advisory lock; closing the connection releases the lock whatever happens.
async fn migrate(config: &tokio_postgres::Config) -> Result<(), tokio_postgres::Error> {
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

/// Follows [`CHANNEL`] until `alive`'s sender is dropped, reconnecting as needed.
/// Where the listener passes on what it hears.
struct Announcements {
    changes: broadcast::Sender<DefinitionChange>,
    readiness: watch::Sender<()>,
    revocations: watch::Sender<()>,
    keys: watch::Sender<()>,
    streams: watch::Sender<()>,
    replaced: broadcast::Sender<StreamNote>,
    /// Whether the listener's `LISTEN` is in force.
    listening: watch::Sender<bool>,
    /// This instance: its own claims are not news.
    instance: String,
}

/// A stream that attached on another instance: dataplane, instance, when.
pub type Claim = (DataplaneId, String, Timestamp);

/// One announcement of `hdsd_streams` (see [`STREAMS_CHANNEL`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StreamPayload<'a> {
    mesh: std::borrow::Cow<'a, str>,
    name: std::borrow::Cow<'a, str>,
    instance: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<Timestamp>,
}

/// The longest instance name (`<host>/<pid>`) sent to other instances.
pub const MAX_INSTANCE: usize = 200;

/// The largest payload [`stream_payload`] makes: JSON escapes any character
/// in at most 6 bytes; names are checked ASCII, so 1 byte each, the
/// instance name is cut to [`MAX_INSTANCE`] ASCII characters, and the rest
/// is the keys and a timestamp. Under PostgreSQL's 8,000-byte limit.
pub const MAX_STREAM_PAYLOAD: usize =
    crate::names::MAX_LABEL + crate::names::MAX_NAME + MAX_INSTANCE + 128;

fn stream_payload(id: &DataplaneId, instance: &str, at: Option<Timestamp>) -> String {
    serde_json::to_string(&StreamPayload {
        mesh: id.mesh.as_str().into(),
        name: id.name.as_str().into(),
        instance: instance.into(),
        at,
    })
    .unwrap_or_default()
}

/// A stream of the dataplane attached on `instance` at `at`.
fn claim_payload(id: &DataplaneId, instance: &str, at: Timestamp) -> String {
    stream_payload(id, instance, Some(at))
}

/// `instance` no longer holds the dataplane's stream.
fn release_payload(id: &DataplaneId, instance: &str) -> String {
    stream_payload(id, instance, None)
}

/// What another instance announced about a dataplane's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamNote {
    /// A stream for the dataplane attached on that instance.
    Claimed(Claim),
    /// That instance no longer holds the dataplane's stream.
    Released(DataplaneId, String),
}

impl StreamNote {
    /// The instance the note is about.
    pub fn instance(&self) -> &str {
        match self {
            StreamNote::Claimed((_, instance, _)) | StreamNote::Released(_, instance) => instance,
        }
    }
}

fn parse_stream_note(payload: &str) -> Option<StreamNote> {
    let p: StreamPayload<'_> = serde_json::from_str(payload).ok()?;
    let id = DataplaneId::try_new(p.mesh, p.name).ok()?;
    let instance = p.instance.into_owned();
    Some(match p.at {
        Some(at) => StreamNote::Claimed((id, instance, at)),
        None => StreamNote::Released(id, instance),
    })
}

/// `<host>/<pid>`: how other instances name this one.
fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| sanitized_host(h.trim()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hdsd".to_string());
    format!("{host}/{}", std::process::id())
}

/// A host name as other instances are told it: printable ASCII without
/// spaces, at most [`MAX_INSTANCE`] less room for the pid.
fn sanitized_host(host: &str) -> String {
    host.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(MAX_INSTANCE - 12)
        .collect()
}

/// The longest wait between two tries of a stream announcement that failed.
const MAX_ANNOUNCE_BACKOFF: Duration = Duration::from_secs(5);

/// Records and announces the streams that attach and end here: a burst in
/// one transaction (the newest event per dataplane), whose `pg_notify`s are
/// sent when it commits. A row of `hdsd_streams` names the instance holding
/// the dataplane's stream; an attach never overwrites a newer one.
async fn announce_claims(
    pool: Pool,
    instance: String,
    mut claims: tokio::sync::mpsc::UnboundedReceiver<(DataplaneId, Option<Timestamp>)>,
) {
    // A burst that failed is kept and written with the next one (the
    // newest event per dataplane wins), after a backoff: a failure is the
    // database's (names are checked and payloads bounded, so no row can
    // fail alone), and nothing is dropped.
    let mut burst: BTreeMap<DataplaneId, Option<Timestamp>> = BTreeMap::new();
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    loop {
        if burst.is_empty() {
            let Some((id, at)) = claims.recv().await else {
                return;
            };
            burst.insert(id, at);
        }
        while let Ok((id, at)) = claims.try_recv() {
            burst.insert(id, at);
        }
        let count = burst.len();
        match record_streams(&pool, &instance, burst.clone()).await {
            Ok(()) => {
                if failing {
                    tracing::info!("stream changes reach other instances again ({count} written)");
                }
                burst.clear();
                backoff = Duration::from_millis(100);
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        "cannot announce {count} stream change(s) to other instances, retrying every {} at most: {e}",
                        humantime::format_duration(MAX_ANNOUNCE_BACKOFF)
                    );
                }
                failing = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ANNOUNCE_BACKOFF);
            }
        }
    }
}

async fn record_streams(
    pool: &Pool,
    instance: &str,
    burst: BTreeMap<DataplaneId, Option<Timestamp>>,
) -> Result<(), StoreError> {
    let (mut attached, mut released) = ((vec![], vec![], vec![]), (vec![], vec![]));
    let mut payloads = Vec::with_capacity(burst.len());
    for (id, at) in burst {
        match at {
            Some(at) => {
                payloads.push(claim_payload(&id, instance, at));
                attached.0.push(id.mesh);
                attached.1.push(id.name);
                attached.2.push(at.to_rfc3339());
            }
            None => {
                payloads.push(release_payload(&id, instance));
                released.0.push(id.mesh);
                released.1.push(id.name);
            }
        }
    }
    let mut client = pool.get().await.map_err(pg_error)?;
    let tx = client.transaction().await.map_err(pg_error)?;
    if !attached.0.is_empty() {
        tx.execute(
            "INSERT INTO hdsd_streams (mesh, name, instance, attached_at)
             SELECT mesh, name, $1, at::timestamptz
             FROM unnest($2::text[], $3::text[], $4::text[]) AS c(mesh, name, at)
             ON CONFLICT (mesh, name) DO UPDATE
                 SET instance = EXCLUDED.instance, attached_at = EXCLUDED.attached_at
                 WHERE hdsd_streams.attached_at <= EXCLUDED.attached_at",
            &[&instance, &attached.0, &attached.1, &attached.2],
        )
        .await
        .map_err(pg_error)?;
    }
    if !released.0.is_empty() {
        tx.execute(
            "DELETE FROM hdsd_streams s USING unnest($2::text[], $3::text[]) AS r(mesh, name)
             WHERE s.mesh = r.mesh AND s.name = r.name AND s.instance = $1",
            &[&instance, &released.0, &released.1],
        )
        .await
        .map_err(pg_error)?;
    }
    tx.execute(
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&STREAMS_CHANNEL, &payloads],
    )
    .await
    .map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)
}

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

fn millis(ms: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

async fn listen(
    config: tokio_postgres::Config,
    listening: tokio::sync::oneshot::Sender<()>,
    heard: Announcements,
    reconcile: Duration,
    mut alive: watch::Receiver<()>,
) {
    const BACKOFF_MAX: Duration = Duration::from_secs(5);
    let mut backoff = Duration::from_millis(100);
    let mut down: Option<String> = None;
    let mut listening = Some(listening);
    loop {
        let session = async {
            let (client, mut connection) = config.connect(NoTls).await?;
            let (notes_tx, notes) = tokio::sync::mpsc::unbounded_channel();
            // The connection delivers notifications only to whoever polls it.
            tokio::spawn(async move {
                loop {
                    match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                        Some(Ok(AsyncMessage::Notification(n))) => {
                            let note = (n.channel().to_string(), n.payload().to_string());
                            if notes_tx.send(Ok(note)).is_err() {
                                return;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            let _ = notes_tx.send(Err(e));
                            return;
                        }
                        None => return,
                    }
                }
            });
            client
                .batch_execute(&format!(
                    "LISTEN {CHANNEL}; LISTEN {READINESS_CHANNEL}; LISTEN {STREAMS_CHANNEL}; LISTEN {REVOCATIONS_CHANNEL}; LISTEN {KEYS_CHANNEL}"
                ))
                .await?;
            Ok::<_, tokio_postgres::Error>((client, notes))
        };
        let connected = tokio::select! {
            s = session => s,
            _ = alive.changed() => return,
        };
        match connected {
            Ok((client, mut notes)) => {
                if down.take().is_some() {
                    tracing::info!("PostgreSQL store: listening for definition changes again");
                }
                backoff = Duration::from_millis(100);
                if let Some(listening) = listening.take() {
                    let _ = listening.send(());
                }
                heard.listening.send_replace(true);
                // Whatever changed while nobody listened.
                let _ = heard.changes.send(DefinitionChange::All);
                heard.readiness.send_replace(());
                heard.revocations.send_replace(());
                heard.keys.send_replace(());
                heard.streams.send_replace(());
                let mut reconcile_tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + reconcile, reconcile);
                let reason = loop {
                    tokio::select! {
                        note = notes.recv() => match note {
                            Some(Ok((channel, _))) if channel == READINESS_CHANNEL => {
                                heard.readiness.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == REVOCATIONS_CHANNEL => {
                                heard.revocations.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == KEYS_CHANNEL => {
                                heard.keys.send_replace(());
                            }
                            Some(Ok((channel, payload))) if channel == STREAMS_CHANNEL => {
                                if let Some(note) = parse_stream_note(&payload).filter(|n| n.instance() != heard.instance) {
                                    let _ = heard.replaced.send(note);
                                }
                            }
                            Some(Ok((_, payload))) => match payload.parse::<DataplaneId>() {
                                Ok(id) => { let _ = heard.changes.send(DefinitionChange::One(id)); }
                                Err(_) => { let _ = heard.changes.send(DefinitionChange::All); }
                            },
                            Some(Err(e)) => break e.to_string(),
                            None => break "the connection closed".to_string(),
                        },
                        _ = reconcile_tick.tick() => { let _ = heard.changes.send(DefinitionChange::All); }
                        _ = alive.changed() => return,
                    }
                };
                drop(client);
                heard.listening.send_replace(false);
                tracing::warn!(
                    "PostgreSQL store: lost the connection that listens for definition changes ({reason}); reconnecting, then reading every definition again"
                );
                down = Some(reason);
            }
            Err(e) => {
                let reason = e.to_string();
                if down.as_ref() != Some(&reason) {
                    tracing::warn!(
                        "PostgreSQL store: cannot listen for definition changes ({reason}); retrying with a backoff of up to {}s",
                        BACKOFF_MAX.as_secs()
                    );
                }
                down = Some(reason);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = alive.changed() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn row_definition(row: &tokio_postgres::Row) -> Option<StoredDefinition> {
    let id = DataplaneId::try_new(row.get::<_, String>(0), row.get::<_, String>(1)).ok()?;
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

    /// One transaction, two statements whatever the batch's size (after the
    /// [`READINESS_LOCK`] that orders the instances' writes): every
    /// upsert in one `INSERT ... SELECT FROM unnest(...)` and every delete in
    /// one `DELETE`, so a batch of a thousand rows is two round trips, not a
    /// thousand (at 10k dataplanes per-row statements made a batch take
    /// seconds, and the other instances read the rows too late).
    fn write(&self, batch: &[(DataplaneId, Option<StoredHealth>)]) -> Result<(), StoreError> {
        let rows = batch_rows(batch)?;
        if rows.is_empty() {
            return Ok(());
        }
        self.runtime.block_on(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_error)?;
            // Sequence order = commit order (see READINESS_LOCK).
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&READINESS_LOCK])
                .await
                .map_err(pg_error)?;
            if !rows.upsert_meshes.is_empty() {
                tx.execute(
                    "INSERT INTO hdsd_readiness (mesh, name, health, seq)
                     SELECT mesh, name, health, nextval('hdsd_readiness_seq')
                     FROM unnest($1::text[], $2::text[], $3::text[]) AS u(mesh, name, health)
                     ON CONFLICT (mesh, name) DO UPDATE SET health = EXCLUDED.health,
                         seq = EXCLUDED.seq, updated_at = now()",
                    &[&rows.upsert_meshes, &rows.upsert_names, &rows.upsert_health],
                )
                .await
                .map_err(pg_error)?;
            }
            if !rows.delete_meshes.is_empty() {
                tx.execute(
                    "DELETE FROM hdsd_readiness AS r
                     USING unnest($1::text[], $2::text[]) AS u(mesh, name)
                     WHERE r.mesh = u.mesh AND r.name = u.name",
                    &[&rows.delete_meshes, &rows.delete_names],
                )
                .await
                .map_err(pg_error)?;
            }
            tx.batch_execute(&format!("NOTIFY {READINESS_CHANNEL}"))
                .await
                .map_err(pg_error)?;
            tx.commit().await.map_err(pg_error)
        })
    }
}

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
    /// How this instance announces the streams that attach here.
    pub fn claims(&self) -> crate::registry::Claims {
        let claims = self.claims.clone();
        crate::registry::Claims(std::sync::Arc::new(move |id: &DataplaneId, at| {
            let _ = claims.send((id.clone(), at));
        }))
    }

    /// Streams that attached on, or were released by, other instances.
    pub fn replaced(&self) -> broadcast::Receiver<StreamNote> {
        self.replaced.subscribe()
    }

    /// Which instance holds each dataplane's stream (`hdsd_streams`).
    pub async fn holders(&self) -> Result<BTreeMap<DataplaneId, (String, Timestamp)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT mesh, name, instance,
                     floor(extract(epoch FROM attached_at) * 1000)::bigint
                 FROM hdsd_streams",
                &[],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id =
                    DataplaneId::try_new(row.get::<_, String>(0), row.get::<_, String>(1)).ok()?;
                Some((id, (row.get(2), millis(row.get(3)))))
            })
            .collect())
    }

    /// Hands `apply` every stream holder on each (re)connect of the listener
    /// and once per `reconcile_interval`: what a missed announcement left
    /// wrong is healed. Runs until the store is dropped.
    pub async fn follow_holders(
        self: std::sync::Arc<Self>,
        apply: impl Fn(BTreeMap<DataplaneId, (String, Timestamp)>) + Send + 'static,
    ) {
        let store = self.clone();
        follow(
            self.streams_signal.subscribe(),
            self.reconcile,
            move || {
                let store = store.clone();
                async move { store.holders().await }
            },
            apply,
            "cannot read the stream holders",
        )
        .await
    }

    /// Heartbeats every `timeout / 4` and sweeps the instances silent for
    /// `timeout` (one live instance at a time, under [`SWEEP_LOCK`]); tells
    /// `status` whether the database answers. Calls `reclaim` (which claims
    /// again every stream held here) when a heartbeat succeeds after failing,
    /// or finds this instance's row gone: claims made meanwhile were lost,
    /// or a sweep released them. Runs until the task is aborted.
    pub async fn run_cluster(
        self: std::sync::Arc<Self>,
        timeout: Duration,
        status: super::StoreStatus,
        reclaim: impl Fn() + Send + 'static,
    ) {
        let mut tick = tokio::time::interval(timeout / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when this instance's heartbeats succeed without a gap. It
        // sweeps only after `timeout` of that: after a start, or an outage
        // of the database that silenced every instance, the others have
        // beaten again by then and are not taken for dead.
        let mut beating_since: Option<tokio::time::Instant> = None;
        // Whether a heartbeat wrote this instance's row yet (the first one
        // creates it; later, a missing row means a sweep deleted it), and
        // whether one failed since the last that succeeded.
        let (mut registered, mut failed) = (false, false);
        loop {
            tick.tick().await;
            let beat = tokio::time::timeout(timeout / 2, heartbeat(&self.pool, &self.instance))
                .await
                .unwrap_or_else(|_| {
                    Err(pg_error(format!(
                        "{}: no answer within {}",
                        self.describe,
                        humantime::format_duration(timeout / 2)
                    )))
                });
            match beat {
                Ok(missing) => {
                    status.up();
                    beating_since.get_or_insert_with(tokio::time::Instant::now);
                    let swept = missing && registered;
                    if swept {
                        tracing::warn!(
                            instance = %self.instance,
                            "PostgreSQL store: this instance's heartbeat row was gone (another instance took it for dead after cluster.instance_timeout without a heartbeat); registered again and claiming its streams again"
                        );
                    }
                    if swept || failed {
                        reclaim();
                    }
                    (registered, failed) = (true, false);
                }
                Err(e) => {
                    status.down(&e.to_string());
                    beating_since = None;
                    failed = true;
                    continue;
                }
            }
            if beating_since.is_none_or(|since| since.elapsed() < timeout) {
                continue;
            }
            match self.sweep(timeout).await {
                Ok(swept) => {
                    for (instance, dataplanes) in swept {
                        tracing::warn!(
                            dead = %instance,
                            dataplanes,
                            "instance silent for longer than cluster.instance_timeout ({}): marked the dataplanes it held disconnected; they go stale by the usual rule unless their Envoys reconnect",
                            humantime::format_duration(timeout)
                        );
                    }
                }
                Err(e) => tracing::debug!("cannot sweep dead instances: {e}"),
            }
        }
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
            if let Ok(id) = DataplaneId::try_new(row.get::<_, String>(0), row.get::<_, String>(1)) {
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

    /// Leaves the cluster at a graceful shutdown: releases the streams this
    /// instance still holds (announced) and deletes its heartbeat row, so
    /// the others need not wait for `cluster.instance_timeout`.
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
            .filter_map(|row| {
                DataplaneId::try_new(row.get::<_, String>(0), row.get::<_, String>(1)).ok()
            })
            .map(|id| release_payload(&id, &self.instance))
            .collect();
        tx.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
            &[&STREAMS_CHANNEL, &payloads],
        )
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

    /// This instance's name in stream claims.
    pub fn instance(&self) -> &str {
        &self.instance
    }

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

    /// Hands `apply` every revoked id on each revocation, on every
    /// (re)connect and once per `reconcile_interval`. Runs for the process.
    pub async fn follow_revocations(
        self: std::sync::Arc<Self>,
        apply: impl Fn(Vec<String>) + Send + 'static,
    ) {
        let store = self.clone();
        follow(
            self.revocations_signal.subscribe(),
            self.reconcile,
            move || {
                let store = store.clone();
                async move { store.revocations().await }
            },
            apply,
            "cannot read the shared revocations",
        )
        .await
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

    /// Publishes this instance's public keys as `publisher` now, on every
    /// change of `keys`, and once per `reconcile_interval` (which heals a
    /// publication that failed, or rows deleted by hand while the instance
    /// still has the keys). Runs until `keys`' sender is dropped.
    pub async fn publish_keys_from(
        self: std::sync::Arc<Self>,
        publisher: String,
        mut keys: watch::Receiver<BTreeMap<String, String>>,
        alive_within: Duration,
    ) {
        let mut full = tokio::time::interval(self.reconcile);
        // The loop publishes first; the first tick is one interval later.
        full.reset();
        let mut trouble: Option<String> = None;
        loop {
            let current = keys.borrow_and_update().clone();
            let problem = match self.publish_keys(&publisher, &current, alive_within).await {
                Ok(KeyPublication::Unchanged) => None,
                Ok(KeyPublication::Changed) => {
                    tracing::info!(
                        publisher,
                        keys = ?current.keys().collect::<Vec<_>>(),
                        "published this instance's public signing keys to the other instances"
                    );
                    None
                }
                Ok(KeyPublication::Contested { by }) => Some(format!(
                    "not publishing this instance's public signing keys: instance {by}, alive, publishes under the same id {publisher:?}; if this instance was killed and restarted moments ago, it publishes once that run is taken for dead (cluster.instance_timeout); otherwise their state directories were copied from one another: delete {} on one of them and restart it",
                    crate::auth::keys::PUBLISHER_FILE
                )),
                Err(e) => Some(format!(
                    "cannot publish this instance's public signing keys: {e}; other instances may not accept tokens signed by them yet (retrying every reconcile_interval)"
                )),
            };
            match (&problem, &trouble) {
                (Some(now), before) if before.as_ref() != Some(now) => tracing::warn!("{now}"),
                (None, Some(_)) => {
                    tracing::info!(
                        publisher,
                        "published this instance's public signing keys again"
                    )
                }
                _ => {}
            }
            trouble = problem;
            tokio::select! {
                changed = keys.changed() => if changed.is_err() { return },
                _ = full.tick() => {}
            }
        }
    }

    /// Hands `apply` every shared public key on each change, on every
    /// (re)connect and once per `reconcile_interval`. Runs for the process.
    pub async fn follow_shared_keys(
        self: std::sync::Arc<Self>,
        apply: impl Fn(Vec<crate::auth::SharedKey>) + Send + 'static,
    ) {
        let store = self.clone();
        follow(
            self.keys_signal.subscribe(),
            self.reconcile,
            move || {
                let store = store.clone();
                async move { store.shared_keys().await }
            },
            apply,
            "cannot read the shared signing keys",
        )
        .await
    }

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
        let watermark = rows
            .first()
            .map_or(0, |row| row.get::<_, i64>(0).max(0) as u64);
        let rows = rows
            .iter()
            .filter_map(|row| {
                let mesh = row.get::<_, Option<String>>(1)?;
                let name = row.get::<_, Option<String>>(2)?;
                let id = DataplaneId::try_new(mesh, name).ok()?;
                let health = serde_json::from_str(row.get::<_, Option<&str>>(3)?).ok()?;
                Some((id, health, row.get::<_, Option<i64>>(4)?))
            })
            .collect();
        Ok((rows, watermark))
    }

    /// Hands `observe` the readiness other instances write, with the
    /// watermark of the read: the rows written since the last look on each
    /// notification and at least every [`READINESS_READ_INTERVAL`], and
    /// every row once per `reconcile_interval` (a safety net: under
    /// [`READINESS_LOCK`] no row is skipped). Once `observe` has completed
    /// (every change the rows made is in the change feed), hands the
    /// watermark to `watermark`, but only while the listener is in force, so
    /// that definition changes were heard as well. A failed read hands
    /// nothing: the watermark stays where it was. Runs until the store is
    /// dropped.
    pub async fn follow_readiness<O, Fut>(
        self: std::sync::Arc<Self>,
        observe: O,
        watermark: impl Fn(u64) + Send + 'static,
    ) where
        O: Fn(Vec<(DataplaneId, StoredHealth)>, u64) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let mut signal = self.readiness_signal.subscribe();
        let listening = self.listening.subscribe();
        let mut full = tokio::time::interval(self.reconcile);
        let mut tick = tokio::time::interval(READINESS_READ_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = 0;
        let mut failing = false;
        loop {
            tokio::select! {
                changed = signal.changed() => if changed.is_err() { return },
                _ = full.tick() => last = 0,
                _ = tick.tick() => {}
            }
            let heard = *listening.borrow();
            match self.readiness_since(last).await {
                Ok((rows, w)) => {
                    failing = false;
                    let mut observed = Vec::with_capacity(rows.len());
                    for (id, health, seq) in rows {
                        last = last.max(seq);
                        observed.push((id, health));
                    }
                    observe(observed, w).await;
                    if heard && *listening.borrow() {
                        watermark(w);
                    }
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
}

/// One readiness row: dataplane, health, sequence number.
type ReadinessRow = (DataplaneId, StoredHealth, i64);

/// Calls `read` on every `signal` (a notification, a reconnect) and once
/// per `reconcile`, and hands what it read to `apply`: what a missed
/// notification left wrong is healed. A failed read is logged at debug (the
/// listener logs the outage once) and tried again on the next signal or tick.
/// Ends when the signal's sender is gone.
async fn follow<T, F, Fut>(
    mut signal: watch::Receiver<()>,
    reconcile: Duration,
    read: F,
    apply: impl Fn(T),
    what: &str,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut full = tokio::time::interval(reconcile);
    loop {
        tokio::select! {
            changed = signal.changed() => if changed.is_err() { return },
            _ = full.tick() => {}
        }
        match read().await {
            Ok(all) => apply(all),
            Err(e) => tracing::debug!("{what}: {e}"),
        }
    }
}

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

    #[test]
    fn a_claim_round_trips_through_its_payload() {
        let id = DataplaneId::new("default", "web.01");
        let at = chrono::Utc.timestamp_millis_opt(1_700_000_000_123).unwrap();
        let payload = claim_payload(&id, "host-a/7", at);
        assert_eq!(
            parse_stream_note(&payload),
            Some(StreamNote::Claimed((
                id.clone(),
                "host-a/7".to_string(),
                at
            )))
        );
        assert_eq!(
            parse_stream_note(&release_payload(&id, "host-a/7")),
            Some(StreamNote::Released(id, "host-a/7".to_string()))
        );
        assert_eq!(parse_stream_note("default.web\thost\tnot a time"), None);
        assert_eq!(parse_stream_note("no-dot\thost"), None);
    }

    /// The forgery of the attack review: a name that carries the old
    /// separators is refused where it enters, and even unchecked it cannot
    /// turn into another dataplane's claim; the longest names fit.
    #[test]
    fn a_payload_cannot_be_forged_and_always_fits() {
        assert!(
            DataplaneId::try_new("default", "victim\tfake-host/1\t2099-01-01T00:00:00+00:00")
                .is_err()
        );
        let forged = DataplaneId::new("default", "victim\tfake-host/1\t2099-01-01T00:00:00+00:00");
        let payload = release_payload(&forged, "host-a/7");
        // Parsed back, it names no dataplane (the name fails the rules),
        // certainly not default.victim.
        assert_eq!(parse_stream_note(&payload), None);
        let longest = DataplaneId::new(
            "m".repeat(crate::names::MAX_LABEL),
            "n".repeat(crate::names::MAX_NAME),
        );
        let instance = format!("{}/{}", sanitized_host(&"h".repeat(10_000)), u32::MAX);
        assert!(instance.len() <= MAX_INSTANCE);
        let at = chrono::Utc
            .timestamp_millis_opt(i64::from(i32::MAX) * 1000)
            .unwrap();
        let payload = claim_payload(&longest, &instance, at);
        assert!(payload.len() <= MAX_STREAM_PAYLOAD, "{}", payload.len());
        const { assert!(MAX_STREAM_PAYLOAD < 8000) };
        assert!(matches!(
            parse_stream_note(&payload),
            Some(StreamNote::Claimed(_))
        ));
        assert_eq!(sanitized_host("a b\tc\u{7f}d"), "abcd");
    }

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
