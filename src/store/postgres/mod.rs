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
//!
//! One file per job: [`schema`] (tables, channels, locks, migrations),
//! `listener` (the `LISTEN` connection), `definitions`, `readiness`,
//! `streams` (who holds which stream), `members` (heartbeats, the sweep),
//! `keys` (shared public keys and revocations), `zones` (a global's zones,
//! written by the instance holding each zone's stream), `leases` (named
//! leases held by one live instance, with a growing epoch), `registrations`
//! (zones registered through a global's API).

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{broadcast, watch};
use tokio_postgres::NoTls;

use super::definitions::{DefinitionChange, CHANGES_BUFFER};
use super::StoreError;
use crate::config::PostgresConfig;
use crate::dataplane::DataplaneId;
use crate::readiness::Timestamp;

mod definitions;
mod keys;
mod leases;
mod listener;
mod members;
mod readiness;
mod registrations;
pub mod schema;
mod streams;
mod zones;

pub use keys::KeyPublication;
pub use leases::{decide as decide_lease, Lease, LeaseDecision};
pub use members::{dead_instances, Swept};
pub use schema::*;
pub use streams::{Claim, ClaimSender, StreamNote, MAX_INSTANCE, MAX_STREAM_PAYLOAD};
pub use zones::{
    LinkChange, LinkRow, LinkState, Written, ZoneDataplaneRow, ZoneWrite, ZonesRead, TOMBSTONE_TTL,
};

use listener::{listen, Announcements};
use schema::migrate;
use streams::{announce_claims, instance_name};

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
    /// Poked on each zone write and on every (re)connect.
    zones_signal: watch::Sender<()>,
    /// Poked on each change of a lease's holder and on every (re)connect.
    leases_signal: watch::Sender<()>,
    reconcile: Duration,
    /// The runtime the blocking [`ReadinessStore`] calls run their queries on.
    runtime: tokio::runtime::Handle,
    /// This instance's name in stream claims (`<host>/<pid>`).
    instance: String,
    /// Streams attached on (or released by) other instances.
    replaced: broadcast::Sender<StreamNote>,
    /// Dataplanes whose stream attached here (`Some(when)`) or ended here
    /// (`None`), to announce.
    claims: streams::ClaimSender,
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

/// The tasks a [`PgStore`] needs running: the listener that turns the
/// database's notifications into announcements, and the announcer of
/// this instance's stream claims. Both end once the store is dropped.
pub struct PgTasks {
    pub listen: crate::task::Task,
    pub claims: crate::task::Task,
}

impl PgTasks {
    /// Runs them detached, for a command that runs once and for tests:
    /// nothing supervises them there (hdsd's server does, [`PgStore::open`]).
    pub fn detach(self) {
        tokio::spawn(self.listen);
        tokio::spawn(self.claims);
    }
}

impl PgStore {
    /// Connects, applies the migrations this database lacks (under the
    /// advisory lock), and starts listening for changes: it returns once the
    /// listener's `LISTEN` is in force (or after `connect_timeout`, when the
    /// listener keeps retrying in the background), so that every change
    /// committed afterwards is announced on [`DefinitionStore::changes`].
    /// Its tasks run detached ([`PgTasks::detach`]); hdsd's server uses
    /// [`PgStore::open`] and supervises them.
    pub async fn connect(settings: &PostgresConfig) -> Result<PgStore, StoreError> {
        Self::connect_as(settings, instance_name()).await
    }

    /// [`PgStore::connect`] under the instance name `instance` instead of
    /// `<host>/<pid>`: two instances in one process (tests) need two names.
    pub async fn connect_as(
        settings: &PostgresConfig,
        instance: String,
    ) -> Result<PgStore, StoreError> {
        let (store, tasks) = Self::open_as(settings, instance).await?;
        tasks.detach();
        Ok(store)
    }

    /// [`PgStore::connect`], handing the store's tasks to the caller to run
    /// (the server supervises them). The listener already runs while this
    /// waits for its `LISTEN`: the caller spawns it at once.
    pub async fn open(settings: &PostgresConfig) -> Result<(PgStore, PgTasks), StoreError> {
        Self::open_as(settings, instance_name()).await
    }

    /// [`PgStore::open`] under the instance name `instance`.
    pub async fn open_as(
        settings: &PostgresConfig,
        instance: String,
    ) -> Result<(PgStore, PgTasks), StoreError> {
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
        let (zones_signal, _) = watch::channel(());
        let (leases_signal, _) = watch::channel(());
        let (streams_signal, _) = watch::channel(());
        let (listening_flag, _) = watch::channel(false);
        let (replaced, _) = broadcast::channel(CHANGES_BUFFER);
        let (listening_tx, listening) = tokio::sync::oneshot::channel();
        let mut listener: crate::task::Task = Box::pin(listen(
            config,
            listening_tx,
            Announcements {
                changes: changes.clone(),
                readiness: readiness_signal.clone(),
                revocations: revocations_signal.clone(),
                keys: keys_signal.clone(),
                zones: zones_signal.clone(),
                leases: leases_signal.clone(),
                streams: streams_signal.clone(),
                replaced: replaced.clone(),
                listening: listening_flag.clone(),
                instance: instance.clone(),
            },
            settings.reconcile_interval,
            alive_rx,
        ));
        // The listener makes progress here: it must, to reach its LISTEN.
        let listened = tokio::select! {
            () = &mut listener => None,
            listened = tokio::time::timeout(settings.connect_timeout, listening) => Some(listened),
        };
        match listened {
            Some(Ok(_)) => {}
            Some(Err(_)) => tracing::warn!("{describe}: not listening for changes yet; every definition is read again once it listens"),
            // It ended (it never does while the store lives): the
            // supervisor hears of it at once.
            None => listener = Box::pin(std::future::ready(())),
        }
        let (claims, claims_rx) = tokio::sync::mpsc::unbounded_channel();
        let tasks = PgTasks {
            listen: listener,
            claims: Box::pin(announce_claims(pool.clone(), instance.clone(), claims_rx)),
        };
        let store = PgStore {
            pool,
            changes,
            readiness_signal,
            revocations_signal,
            keys_signal,
            zones_signal,
            leases_signal,
            reconcile: settings.reconcile_interval,
            runtime: tokio::runtime::Handle::current(),
            instance,
            replaced,
            claims,
            streams_signal,
            listening: listening_flag,
            describe,
            _alive: alive,
        };
        Ok((store, tasks))
    }

    /// Poked when stream holders may have changed, and on every reconnect.
    pub fn holders_signal(&self) -> watch::Receiver<()> {
        self.streams_signal.subscribe()
    }

    /// Poked on each revocation, and on every reconnect.
    pub fn revocations_signal(&self) -> watch::Receiver<()> {
        self.revocations_signal.subscribe()
    }

    /// Poked when the shared keys may have changed, and on every reconnect.
    pub fn keys_signal(&self) -> watch::Receiver<()> {
        self.keys_signal.subscribe()
    }

    /// `store.postgres.reconcile_interval`.
    pub fn reconcile_interval(&self) -> Duration {
        self.reconcile
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

/// The dataplane named by columns `mesh` and `mesh + 1` of `row`, if it
/// is a valid name (rows are written by hdsd, which checked them).
fn row_id(row: &tokio_postgres::Row, mesh: usize) -> Option<DataplaneId> {
    DataplaneId::try_new(row.get::<_, String>(mesh), row.get::<_, String>(mesh + 1)).ok()
}

/// A time from milliseconds since the UNIX epoch, as the queries read them.
fn millis(ms: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}
