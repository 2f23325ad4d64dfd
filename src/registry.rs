//! The registry of dataplanes: who owns which state.
//!
//! - The registry task is the single writer of the catalog (which dataplanes
//!   exist). It diffs each new [`Loaded`] source snapshot against the catalog
//!   and publishes the catalog on a watch channel.
//! - Each dataplane has its own task, the single writer of that dataplane's
//!   [`DataplaneState`] (definition, specifier version, health, connection).
//!   Streams and the registry send it [`Command`]s; everyone else reads
//!   snapshots from its watch channel. No lock is shared between dataplanes,
//!   so the report path never contends with other dataplanes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::capability::{EnvoyVersion, Reason, Support};
use crate::clock::Clock;
use crate::dataplane::{Dataplane, DataplaneId};
use crate::feed::{Change, ChangeKind, FeedSender, Subject};
use crate::readiness::{
    apply_support, expire, fold_report, next_expiry, rebase, FoldOutcome, Health, Timestamp, Window,
};
use crate::report::Report;
use crate::sources::{Defined, Loaded};
use crate::specifier::Specifier;
use crate::store::{restore, snapshot, StoreHandle, StoredHealth};

/// Identifies one HDS stream for the lifetime of the process.
pub type StreamId = u64;

/// Which stream currently speaks for a dataplane.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// The stream whose reports count (the newest one); `None` when disconnected.
    pub stream: Option<StreamId>,
    /// The instance (sharing the store) where a newer stream for this
    /// dataplane attached: the stream of this instance must end.
    pub replaced_on: Option<String>,
    /// Another instance (sharing the store) holding this dataplane's
    /// stream, as it announced; `None` when none does, or when it is held
    /// here. Cleared when that instance ends the stream, leaves, or is
    /// found dead (silent for `cluster.instance_timeout`).
    pub holder: Option<String>,
    pub peer: Option<SocketAddr>,
    pub connected_at: Option<Timestamp>,
    /// When the token of the stream held here expires.
    pub token_expires_at: Option<Timestamp>,
}

/// Everything known about one dataplane. Written only by its own task.
#[derive(Debug, Clone, PartialEq)]
pub struct DataplaneState {
    /// The current definition; `None` once the dataplane was deleted.
    pub defined: Option<Defined>,
    /// Increases whenever the specifier to send changes.
    pub version: u64,
    pub health: Health,
    pub connection: Connection,
    /// The dataplane's Envoy: its version and what it runs of the specifier.
    pub envoy: EnvoyRun,
}

impl DataplaneState {
    /// The specifier this dataplane's Envoy is sent: the definition's, or
    /// the part of it its version runs ([`EnvoyRun::restricted`]).
    pub fn specifier(&self) -> Option<&Arc<Specifier>> {
        let defined = self.defined.as_ref()?;
        Some(
            self.envoy
                .restricted
                .as_ref()
                .map_or(&defined.specifier, |r| &r.specifier),
        )
    }

    /// How the Envoy runs the target of inbound `index`, and the reason to
    /// show for it when that is not as configured.
    pub fn reason_of_inbound(&self, index: usize) -> Option<Reason> {
        let restricted = self.envoy.restricted.as_ref()?;
        let target = self
            .defined
            .as_ref()?
            .specifier
            .target_of_inbound
            .get(index)?;
        restricted
            .support
            .get((*target)?)?
            .reason(self.envoy.version)
    }
}

/// Streams in a row that the Envoy ended soon after a specifier push, with
/// no report, before hdsd says it rejects or crashes on its specifier.
pub const REJECTED_STREAMS: u32 = 3;

/// An Envoy that ends its stream this soon after a specifier push, with no
/// report since, may be rejecting or crashing on the specifier (the HDS
/// stream decides, `hds::stream`; [`REJECTED_STREAMS`] in a row flag it).
pub const REJECTION_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// What hdsd knows of a dataplane's Envoy, from its streams.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvoyRun {
    /// The version the last attached Envoy reported (`None`: it reported none).
    pub version: Option<EnvoyVersion>,
    /// Whether an Envoy attached since this dataplane's task began: what it
    /// runs is known only then.
    pub seen: bool,
    /// The specifier this Envoy is sent when its version cannot run the
    /// definition's whole; `None` when it runs it as built.
    pub restricted: Option<Restricted>,
    /// Consecutive streams the Envoy ended within
    /// [`REJECTION_WINDOW`] of a specifier push, with no report
    /// since that push. A report starts the count again.
    pub rejected_streams: u32,
    /// The Envoy rejected (`rejects_specifier`) specifiers that carried
    /// TLS checks: it is sent none of them (`Support::Withheld`) until the
    /// definition's TLS settings change. Envoy aborts on a TLS file it
    /// cannot read, and hdsd cannot see its files: this bounds the crash
    /// loop a missing file would cause to the streams that flag it.
    pub tls_withheld: bool,
}

impl EnvoyRun {
    /// The Envoy ends the stream after every specifier it is sent.
    pub fn rejects_specifier(&self) -> bool {
        self.rejected_streams >= REJECTED_STREAMS
    }

    /// The reason to show for a dataplane whose Envoy rejects its specifier.
    pub fn problem(&self) -> Option<Reason> {
        self.rejects_specifier().then(|| Reason {
            code: "specifier_rejected",
            message: format!(
                "Envoy ends the stream after every specifier ({} in a row, each within {}s of a push and with no report): it may be rejecting or crashing on it; read the Envoy's log for a critical line or a restart",
                self.rejected_streams,
                REJECTION_WINDOW.as_secs()
            ),
        })
    }
}

/// A specifier restricted to what one Envoy's version runs.
#[derive(Debug, Clone)]
pub struct Restricted {
    pub specifier: Arc<Specifier>,
    /// How the Envoy runs each target of the definition's specifier.
    pub support: Arc<[Support]>,
}

impl PartialEq for Restricted {
    fn eq(&self, other: &Self) -> bool {
        self.support == other.support && self.specifier.message == other.specifier.message
    }
}

/// A request to a dataplane's task.
#[derive(Debug)]
pub enum Command {
    Define(Defined),
    Remove,
    Attach {
        stream: StreamId,
        peer: Option<SocketAddr>,
        /// The version the Envoy's node reported, if any.
        envoy: Option<EnvoyVersion>,
        /// When the stream's token expires (the stream ends then).
        token_expires: Option<Timestamp>,
    },
    Detach {
        stream: StreamId,
        /// The Envoy ended the stream soon after a specifier push, without
        /// reporting since ([`REJECTION_WINDOW`]).
        rejected: bool,
    },
    Report {
        stream: StreamId,
        report: Report,
        /// When the stream handed the report on: the start of
        /// `hdsd_report_processing_seconds` (report received -> visible).
        received: std::time::Instant,
    },
    /// Readiness written by another instance sharing the store (the one
    /// holding this dataplane's stream): taken while no stream of this
    /// instance speaks for the dataplane, and never written back.
    Observed {
        stored: Box<StoredHealth>,
        /// The watermark of the store read that brought it: the change feed
        /// numbers a change it makes no lower ([`Change::at_least`]).
        at_least: u64,
        /// Dropped once applied (and any change told to the feed).
        done: Option<tokio::sync::oneshot::Sender<()>>,
    },
    /// A stream for this dataplane attached on another instance at `at`:
    /// ours ends unless it attached later.
    ReplacedOn {
        instance: String,
        at: Timestamp,
    },
    /// `instance` no longer holds this dataplane's stream (it ended there,
    /// or the instance left or was found dead).
    Released {
        instance: String,
    },
}

/// How to reach one dataplane's task and read its state.
#[derive(Debug, Clone)]
pub struct DataplaneHandle {
    commands: mpsc::Sender<Command>,
    state: watch::Receiver<DataplaneState>,
}

impl DataplaneHandle {
    /// Sends a command; false when the dataplane's task has ended.
    pub async fn send(&self, command: Command) -> bool {
        self.commands.send(command).await.is_ok()
    }

    /// Sends a command without waiting when the queue has room (almost
    /// always); otherwise waits in a future of its own, so that the caller's
    /// future does not carry a waiting send in its size. False when the
    /// dataplane's task has ended.
    pub async fn send_now(&self, command: Command) -> bool {
        match self.commands.try_send(command) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(command)) => Box::pin(self.send(command)).await,
        }
    }

    /// Sends a command if the queue has room now.
    pub fn try_send(&self, command: Command) -> Result<(), mpsc::error::TrySendError<Command>> {
        self.commands.try_send(command)
    }

    /// A receiver that wakes on every relevant change (specifier, status,
    /// connection), not on reports that change nothing.
    pub fn subscribe(&self) -> watch::Receiver<DataplaneState> {
        self.state.clone()
    }

    /// A consistent copy of the current state.
    pub fn state(&self) -> DataplaneState {
        self.state.borrow().clone()
    }
}

pub type Catalog = BTreeMap<DataplaneId, DataplaneHandle>;

/// What moved between two catalogs: each dataplane defined since, with its
/// handle, then each deleted since, without. (A dataplane's first event can
/// come before the catalog that holds it is published: the readers of the
/// feed that count dataplanes follow the catalog too.)
pub fn catalog_changes<'a>(
    prev: &'a Catalog,
    next: &'a Catalog,
) -> impl Iterator<Item = (&'a DataplaneId, Option<&'a DataplaneHandle>)> {
    let added = next
        .iter()
        .filter(|(id, _)| !prev.contains_key(*id))
        .map(|(id, h)| (id, Some(h)));
    let removed = prev
        .keys()
        .filter(|id| !next.contains_key(*id))
        .map(|id| (id, None));
    added.chain(removed)
}

/// Read access to the catalog. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Registry {
    catalog: watch::Receiver<Arc<Catalog>>,
}

/// Per-dataplane command queue length: reports wait (backpressure on their
/// stream) rather than pile up.
const COMMAND_QUEUE: usize = 64;

impl Registry {
    /// Starts the registry task, fed by the source's snapshots.
    pub fn spawn(sources: watch::Receiver<Arc<Loaded>>, options: RegistryOptions) -> Registry {
        let (tx, rx) = watch::channel(Arc::new(Catalog::new()));
        tokio::spawn(run_registry(sources, tx, options));
        Registry { catalog: rx }
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }

    /// A receiver that wakes whenever dataplanes are added or removed.
    pub fn watch_catalog(&self) -> watch::Receiver<Arc<Catalog>> {
        self.catalog.clone()
    }

    pub fn get(&self, id: &DataplaneId) -> Option<DataplaneHandle> {
        self.catalog.borrow().get(id).cloned()
    }

    /// Hands readiness read from a shared store, by a read at `watermark`,
    /// to each dataplane's task (waiting for room in its queue: none is
    /// dropped), and completes once every task has applied its row and told
    /// the change feed what changed. So a watermark sent to the feed
    /// afterwards arrives behind every change these rows made. Rows of
    /// dataplanes this instance does not have are skipped and returned (a
    /// definition may arrive after its readiness: the follower reads them
    /// again at its next check).
    pub async fn observe(
        &self,
        rows: Vec<(DataplaneId, StoredHealth)>,
        watermark: u64,
    ) -> Vec<DataplaneId> {
        let catalog = self.catalog();
        let mut applied = Vec::with_capacity(rows.len());
        let mut unknown = Vec::new();
        for (id, stored) in rows {
            let Some(handle) = catalog.get(&id) else {
                unknown.push(id);
                continue;
            };
            let (done, rx) = tokio::sync::oneshot::channel();
            let command = Command::Observed {
                stored: Box::new(stored),
                at_least: watermark,
                done: Some(done),
            };
            if handle.send_now(command).await {
                applied.push(rx);
            }
        }
        for rx in applied {
            // An error is a task that ended: nothing more to wait for.
            let _ = rx.await;
        }
        unknown
    }

    /// Tells the dataplane's task that a stream attached on `instance` at `at`.
    pub fn replaced_on(&self, id: &DataplaneId, instance: String, at: Timestamp) {
        if let Some(handle) = self.get(id) {
            let _ = handle
                .commands
                .try_send(Command::ReplacedOn { instance, at });
        }
    }

    /// Tells the dataplane's task that `instance` no longer holds its stream.
    pub fn released(&self, id: &DataplaneId, instance: String) {
        if let Some(handle) = self.get(id) {
            let _ = handle.commands.try_send(Command::Released { instance });
        }
    }

    /// The dataplanes whose stream this instance holds, with their attach times.
    pub fn held_here(&self) -> Vec<(DataplaneId, Timestamp)> {
        self.catalog()
            .iter()
            .filter_map(|(id, handle)| {
                let state = handle.state.borrow();
                let c = &state.connection;
                c.stream.and(c.connected_at).map(|at| (id.clone(), at))
            })
            .collect()
    }

    /// Brings every dataplane's view of which other instance holds its
    /// stream in line with `holders` (the whole shared table; rows naming
    /// `own` are this instance's and not news).
    pub fn sync_holders(&self, holders: &BTreeMap<DataplaneId, (String, Timestamp)>, own: &str) {
        for (id, handle) in self.catalog().iter() {
            let have = handle.state.borrow().connection.holder.clone();
            let command = match (holders.get(id).filter(|(i, _)| i != own), have) {
                (Some((instance, _)), Some(have)) if *instance == have => continue,
                (Some((instance, at)), _) => Command::ReplacedOn {
                    instance: instance.clone(),
                    at: *at,
                },
                (None, Some(instance)) => Command::Released { instance },
                (None, None) => continue,
            };
            let _ = handle.commands.try_send(command);
        }
    }

    pub fn get_defined(&self, id: &DataplaneId) -> Option<DataplaneHandle> {
        self.get(id).filter(|h| h.state.borrow().defined.is_some())
    }

    /// The dataplane's handle as soon as it is defined, or `None` at `deadline`.
    pub async fn wait_for(&self, id: &DataplaneId, deadline: Instant) -> Option<DataplaneHandle> {
        let mut rx = self.catalog.clone();
        loop {
            let found = rx
                .borrow_and_update()
                .get(id)
                .filter(|h| h.state.borrow().defined.is_some())
                .cloned();
            if found.is_some() {
                return found;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }
}

/// How the registry's dataplane tasks behave.
#[derive(Debug)]
pub struct RegistryOptions {
    pub clock: Arc<dyn Clock>,
    /// A report older than this no longer counts (`hds.stale_after`).
    pub stale_after: Duration,
    pub store: Option<StoreHandle>,
    /// State loaded from the store at start, by dataplane.
    pub restored: BTreeMap<DataplaneId, StoredHealth>,
    /// Where dataplane tasks tell each change; `None` in tests without consumers.
    pub feed: Option<FeedSender>,
    /// Told when a stream of this instance attaches, so that instances
    /// sharing the store end their older streams; `None` alone.
    pub claims: Option<Claims>,
}

/// Announces "a stream for this dataplane attached here" to other instances.
#[derive(Clone)]
pub struct Claims(pub Arc<Claim>);

/// Called with the dataplane and the time its stream attached here, or
/// `None` when the stream holding it here ended.
pub type Claim = dyn Fn(&DataplaneId, Option<Timestamp>) + Send + Sync;

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Claims")
    }
}

async fn run_registry(
    mut sources: watch::Receiver<Arc<Loaded>>,
    catalog_tx: watch::Sender<Arc<Catalog>>,
    mut options: RegistryOptions,
) {
    let mut current: BTreeMap<DataplaneId, (Defined, DataplaneHandle)> = BTreeMap::new();
    // The source revision reconciled last: the next snapshot says which
    // dataplanes changed since (a change costs what it touched, not the fleet).
    let mut reconciled: Option<u64> = None;
    loop {
        let loaded = sources.borrow_and_update().clone();
        let mut changed = false;
        let ids: Vec<DataplaneId> = match reconciled.and_then(|r| loaded.changed_since(r)) {
            Some(ids) => ids.into_iter().collect(),
            // The first snapshot, or one further ahead than its change log
            // reaches: every dataplane either side.
            None => current
                .keys()
                .filter(|id| !loaded.dataplanes.contains_key(*id))
                .cloned()
                .chain(loaded.dataplanes.keys().cloned())
                .collect(),
        };
        reconciled = Some(loaded.revision());
        for id in ids {
            changed |= reconcile(&mut current, &id, loaded.dataplanes.get(&id), &mut options).await;
        }
        // Stored state of dataplanes that no longer exist is dropped.
        if let Some(store) = &options.store {
            for (id, _) in std::mem::take(&mut options.restored) {
                store.put(id, None);
            }
        }
        if changed {
            let catalog: Catalog = current
                .iter()
                .map(|(id, (_, h))| (id.clone(), h.clone()))
                .collect();
            catalog_tx.send_replace(Arc::new(catalog));
        }
        if sources.changed().await.is_err() {
            return;
        }
    }
}

/// Brings one dataplane of the catalog in line with its definition (`None`:
/// removed). True when the catalog's membership changed.
async fn reconcile(
    current: &mut BTreeMap<DataplaneId, (Defined, DataplaneHandle)>,
    id: &DataplaneId,
    defined: Option<&Defined>,
    options: &mut RegistryOptions,
) -> bool {
    match (current.get_mut(id), defined) {
        (None, None) => false,
        (Some(_), None) => {
            if let Some((_, handle)) = current.remove(id) {
                // Sent from its own task: a full queue must not block the registry.
                tokio::spawn(async move { handle.send(Command::Remove).await });
                tracing::info!(dataplane = %id, "dataplane removed");
            }
            true
        }
        (Some((old, _)), Some(defined)) if old == defined => false,
        (Some((old, handle)), Some(defined)) => {
            *old = defined.clone();
            handle.send(Command::Define(defined.clone())).await;
            tracing::info!(dataplane = %id, "dataplane definition changed");
            false
        }
        (None, Some(defined)) => {
            let restored = options.restored.remove(id);
            let handle = spawn_dataplane(defined.clone(), restored, options);
            current.insert(id.clone(), (defined.clone(), handle));
            tracing::info!(dataplane = %id, file = %defined.file.display(), "dataplane added");
            true
        }
    }
}

fn spawn_dataplane(
    defined: Defined,
    restored: Option<StoredHealth>,
    options: &RegistryOptions,
) -> DataplaneHandle {
    let now = options.clock.now();
    let id = defined.dataplane.id.clone();
    let fresh = rebase(None, &defined.dataplane, &defined.specifier, now);
    let health = match &restored {
        Some(stored) => restore(stored, &defined.dataplane, &defined.specifier, fresh),
        None => fresh,
    };
    let (state_tx, state_rx) = watch::channel(DataplaneState {
        defined: Some(defined),
        version: 1,
        health,
        connection: Connection::default(),
        envoy: EnvoyRun::default(),
    });
    let (commands_tx, commands_rx) = mpsc::channel(COMMAND_QUEUE);
    static INCARNATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let task = DataplaneTask {
        id,
        feed: options.feed.clone(),
        incarnation: INCARNATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        last_definition: state_rx
            .borrow()
            .defined
            .as_ref()
            .map(|d| d.dataplane.clone()),
        state: state_tx,
        clock: options.clock.clone(),
        stale_after: chrono::Duration::from_std(options.stale_after)
            .unwrap_or(chrono::Duration::MAX),
        store: options.store.clone(),
        from_store: restored.is_some(),
        stored_report_at: restored.and_then(|r| r.last_report_at),
        stored_unreported_attach: false,
        claims: options.claims.clone(),
    };
    tokio::spawn(task.run(commands_rx));
    DataplaneHandle {
        commands: commands_tx,
        state: state_rx,
    }
}

/// The single writer of one dataplane's state.
struct DataplaneTask {
    id: DataplaneId,
    state: watch::Sender<DataplaneState>,
    clock: Arc<dyn Clock>,
    stale_after: chrono::Duration,
    store: Option<StoreHandle>,
    /// The last report time written to the store.
    stored_report_at: Option<Timestamp>,
    /// The record written says "attached, no report since": readers count
    /// `stale_after` from that attach, with no lag, so the first report
    /// after it is written at once.
    stored_unreported_attach: bool,
    /// The health held was read from the store (restored at start, or
    /// written by the instance holding the stream), not folded here: its
    /// report times trail by up to `stale_after` ([`Self::persist`]), so it
    /// goes stale after twice that ([`Self::stale_window`]).
    from_store: bool,
    /// Told about every change consumers can see.
    feed: Option<FeedSender>,
    /// Which task of this dataplane this is (see [`Change::incarnation`]).
    incarnation: u64,
    /// The last definition, named in the feed also once deleted.
    last_definition: Option<Arc<Dataplane>>,
    /// Told when a stream of this instance attaches.
    claims: Option<Claims>,
}

impl DataplaneTask {
    /// Applies commands and expires stale reports until every handle is gone.
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        // Created: consumers learn about it.
        self.publish();
        // State restored from the store may already be stale.
        self.expire();
        // One timer for the task's life, re-armed only when the next expiry
        // moves earlier. A report moves it later: the timer then fires early,
        // `expire` finds nothing to do, and the timer is re-armed. So a
        // report costs neither a clock read nor a timer-wheel update here.
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<Timestamp> = None;
        loop {
            if let Some(at) = next_expiry(&self.state.borrow().health, self.stale_window()) {
                if armed.is_none_or(|armed| at < armed) {
                    let wait = (at - self.clock.now()).to_std().unwrap_or_default();
                    timer.as_mut().reset(Instant::now() + wait);
                    armed = Some(at);
                }
            }
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.command(command),
                    None => return,
                },
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    self.expire();
                }
            }
        }
    }

    fn command(&mut self, mut command: Command) {
        let now = self.clock.now();
        // Held until the change (if any) is told to the feed.
        let (at_least, _done) = match &mut command {
            Command::Observed { at_least, done, .. } => (*at_least, done.take()),
            _ => (0, None),
        };
        let received = match &command {
            Command::Report { received, .. } => Some(*received),
            _ => None,
        };
        let observed = matches!(
            command,
            Command::Observed { .. } | Command::ReplacedOn { .. } | Command::Released { .. }
        );
        let attach = matches!(command, Command::Attach { .. });
        let detach = matches!(command, Command::Detach { .. });
        let holder_news = matches!(
            command,
            Command::ReplacedOn { .. } | Command::Released { .. }
        );
        let redefines = matches!(command, Command::Define(_) | Command::Remove);
        let mut applied = Applied::default();
        let mut visible = true;
        self.state.send_if_modified(|s| {
            // A new definition file with the same dataplane and health (a
            // rename) wakes the HDS stream but is no change to consumers.
            let before = matches!(command, Command::Define(_)).then(|| {
                (
                    s.defined.as_ref().map(|d| d.dataplane.clone()),
                    s.health.clone(),
                )
            });
            let shown_before = holder_news.then(|| shown_holder(&s.connection));
            let envoy_before = (attach || detach || redefines).then(|| s.envoy.clone());
            let recorded = s.health.recorded;
            let stream_before = s.connection.stream;
            applied = apply(s, command, now);
            if let Some(before) = envoy_before {
                log_envoy_news(&self.id, &before, &s.envoy);
            }
            if attach && s.connection.stream != stream_before && s.connection.stream.is_some() {
                let version = s.envoy.version.map(|v| v.to_string());
                crate::journal::connected(
                    &self.id,
                    s.connection.peer,
                    version.as_ref().map(|v| v as &dyn std::fmt::Display),
                );
            }
            if detach && stream_before.is_some() && s.connection.stream.is_none() {
                crate::journal::disconnected(&self.id, s.connection.peer);
            }
            journal_changes(&self.id, s, recorded);
            if let Some((dataplane, health)) = before {
                visible = dataplane.as_deref() != s.defined.as_ref().map(|d| &*d.dataplane)
                    || health != s.health;
            }
            // Which instance holds the stream is part of the fleet view
            // every reader shows (connected, held by whom), so news of a
            // holder is a change when it changes what they show.
            if let Some(shown) = shown_before {
                visible = shown != shown_holder(&s.connection);
            }
            applied.notify
        });
        // Until a report is folded here, the report times held are the
        // store's, also once a stream of ours attached.
        if applied.stored {
            self.from_store = true;
        } else if applied.reported {
            self.from_store = false;
        }
        if applied.notify && visible {
            self.publish_at_least(at_least);
        }
        if (attach || detach) && applied.notify {
            if let Some(claims) = &self.claims {
                (claims.0)(&self.id, attach.then_some(now));
            }
        }
        if let Some(received) = received {
            // Folded and published: what the API and every consumer read now.
            let fold = &applied.fold;
            crate::metrics::report_folded(received.elapsed(), fold.unknown_endpoints);
            crate::metrics::transitions(fold.became_ready, fold.became_not_ready);
            if fold.held > 0 {
                tracing::debug!(
                    dataplane = %self.id,
                    held = fold.held,
                    "report held: a TLS change made Envoy recreate the host, which reads UNHEALTHY until its first check"
                );
            }
        }
        // Another instance's state is its writer's to store, not ours.
        // With a shared store an attach is written at once: the other
        // instances restart the stale window from it too
        // (`readiness::reattached`). Alone, nobody reads it before the next
        // report: a reconnect storm writes nothing.
        let shared = self.claims.is_some();
        if !observed {
            self.persist(
                applied.fold.changed || ((redefines || (attach && shared)) && applied.notify),
            );
        }
    }

    /// How long the reports behind the health held count: `stale_after`
    /// for reports folded here; for health read from the store, whose report
    /// times its writer moves only once they trail by `stale_after`, that
    /// much more (an attach since still gives the Envoy `stale_after` from
    /// the attach): a reader never marks stale what the writer, reading
    /// every report, would not have. The writer marks a silent Envoy stale
    /// itself (and writes it at once), so the longer window counts only
    /// when the writer is gone too.
    fn stale_window(&self) -> Window {
        Window {
            stale_after: self.stale_after,
            lag: if self.from_store {
                self.stale_after
            } else {
                chrono::Duration::zero()
            },
        }
    }

    fn expire(&mut self) {
        let now = self.clock.now();
        let mut outcome = FoldOutcome::default();
        let window = self.stale_window();
        self.state.send_if_modified(|s| {
            let recorded = s.health.recorded;
            outcome = expire(&mut s.health, now, window);
            journal_changes(&self.id, s, recorded);
            outcome.changed
        });
        if outcome.changed {
            crate::metrics::transitions(outcome.became_ready, outcome.became_not_ready);
            self.publish();
            self.persist(true);
        }
    }

    /// Tells the feed that this dataplane changed (or was deleted).
    fn publish(&mut self) {
        self.publish_at_least(0);
    }

    /// [`Self::publish`], for a change that a store read at `at_least`
    /// brought (0: computed here).
    fn publish_at_least(&mut self, at_least: u64) {
        let Some(feed) = &self.feed else { return };
        let state = self.state.borrow();
        if let Some(defined) = &state.defined {
            self.last_definition = Some(defined.dataplane.clone());
        }
        let Some(dataplane) = self.last_definition.clone() else {
            return;
        };
        feed.publish(Change {
            subject: Subject::Local(dataplane),
            incarnation: self.incarnation,
            kind: match state.defined {
                Some(_) => ChangeKind::Changed,
                None => ChangeKind::Deleted,
            },
            ready: state.health.inbounds.iter().all(|i| i.status.is_ready()),
            at_least,
        });
    }

    /// Writes the state on a transition, and the last report time when the
    /// stored one trails by `stale_after` (once every three reports at the
    /// defaults, not once per report) or is the first since an attach
    /// written (readers give that attach `stale_after`, with no lag). Every instance reads every row
    /// written (at 16k dataplanes on eight instances, reading them was most
    /// of each instance's CPU), and one rewritten only to move a time is
    /// most of the write's cost per report. Readers of the store allow for
    /// the lag ([`Self::stale_window`]).
    fn persist(&mut self, transition: bool) {
        let Some(store) = &self.store else { return };
        let state = self.state.borrow();
        let Some(defined) = &state.defined else {
            // Deleted: forget it.
            store.put(self.id.clone(), None);
            return;
        };
        let last = state.health.last_report_at;
        let report_due = match (last, self.stored_report_at) {
            (Some(now), Some(before)) => {
                now - before >= self.stale_after || (self.stored_unreported_attach && now > before)
            }
            (Some(_), None) => true,
            (None, _) => false,
        };
        if transition || report_due {
            store.put(
                defined.dataplane.id.clone(),
                Some(snapshot(
                    &defined.dataplane,
                    &defined.specifier,
                    &state.health,
                )),
            );
            self.stored_report_at = last;
            self.stored_unreported_attach = state
                .health
                .reattached_at
                .is_some_and(|at| last.is_none_or(|last| at > last));
        }
    }
}

/// What applying a command did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Watchers must wake (specifier, status or connection changed).
    pub notify: bool,
    pub fold: FoldOutcome,
    /// The health is now what the store holds (another instance's).
    pub stored: bool,
    /// A report was folded into the health.
    pub reported: bool,
}

/// Applies one command to the state behind `state` and wakes its watchers
/// only when [`Applied::notify`] says so: what a dataplane's task does with
/// each command.
pub fn publish(state: &watch::Sender<DataplaneState>, command: Command, now: Timestamp) -> Applied {
    let mut applied = Applied::default();
    state.send_if_modified(|s| {
        applied = apply(s, command, now);
        applied.notify
    });
    applied
}

/// Applies one command to a dataplane's state: the pure core of its task.
pub fn apply(s: &mut DataplaneState, command: Command, now: Timestamp) -> Applied {
    match command {
        Command::Define(defined) => {
            let previous = s.defined.as_ref();
            if previous == Some(&defined) {
                return Applied::default();
            }
            let sent_before = s.specifier().cloned();
            if s.envoy.tls_withheld
                && previous.is_none_or(|p| p.specifier.tls_differs(&defined.specifier))
            {
                // New TLS settings: worth another try.
                s.envoy.tls_withheld = false;
            }
            s.health = rebase(
                previous.map(|p| (&*p.dataplane, &*p.specifier, &s.health)),
                &defined.dataplane,
                &defined.specifier,
                now,
            );
            s.defined = Some(defined);
            let fold = adapt(s, now);
            bump_if_sent_changes(s, sent_before);
            Applied {
                notify: true,
                fold,
                ..Default::default()
            }
        }
        Command::Remove => {
            s.defined = None;
            s.version += 1;
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Attach {
            stream,
            peer,
            envoy,
            token_expires,
        } => {
            // Stream ids grow: an older stream never takes over from a newer one.
            if s.connection.stream.is_some_and(|owner| owner > stream) {
                return Applied::default();
            }
            s.connection = Connection {
                stream: Some(stream),
                peer,
                connected_at: Some(now),
                replaced_on: None,
                holder: None,
                token_expires_at: token_expires,
            };
            crate::readiness::reattached(&mut s.health, now);
            let sent_before = s.specifier().cloned();
            s.envoy.version = envoy;
            s.envoy.seen = true;
            let fold = adapt(s, now);
            bump_if_sent_changes(s, sent_before);
            Applied {
                notify: true,
                fold,
                ..Default::default()
            }
        }
        Command::Detach { stream, rejected } => {
            if s.connection.stream != Some(stream) {
                return Applied::default();
            }
            s.connection.stream = None;
            s.connection.replaced_on = None;
            s.envoy.rejected_streams = match rejected {
                true => s.envoy.rejected_streams.saturating_add(1),
                false => 0,
            };
            let sent_tls = s.specifier().is_some_and(|sent| sent.sends_tls());
            let mut fold = FoldOutcome::default();
            if s.envoy.rejects_specifier() && sent_tls && !s.envoy.tls_withheld {
                let sent_before = s.specifier().cloned();
                s.envoy.tls_withheld = true;
                fold = adapt(s, now);
                bump_if_sent_changes(s, sent_before);
            }
            Applied {
                notify: true,
                fold,
                ..Default::default()
            }
        }
        Command::Report { stream, report, .. } => {
            // Only the newest stream speaks for the dataplane.
            if s.connection.stream != Some(stream) {
                return Applied::default();
            }
            let Some(defined) = &s.defined else {
                return Applied::default();
            };
            let fold = fold_report(&mut s.health, &defined.specifier, &report, now);
            // A report: the Envoy runs what it was sent.
            let accepted = s.envoy.rejected_streams != 0;
            s.envoy.rejected_streams = 0;
            Applied {
                notify: fold.changed || accepted,
                fold,
                reported: true,
                ..Default::default()
            }
        }
        Command::ReplacedOn { instance, at } => {
            // A claim older than our (last) stream is news of a stream ours
            // replaced.
            if s.connection.connected_at.is_some_and(|ours| ours > at) {
                return Applied::default();
            }
            let mut notify = false;
            if s.connection.holder.as_ref() != Some(&instance) {
                s.connection.holder = Some(instance.clone());
                notify = true;
            }
            if s.connection.stream.is_some() && s.connection.replaced_on.is_none() {
                s.connection.replaced_on = Some(instance);
                notify = true;
            }
            Applied {
                notify,
                ..Default::default()
            }
        }
        Command::Released { instance } => {
            if s.connection.holder.as_ref() != Some(&instance) {
                return Applied::default();
            }
            s.connection.holder = None;
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Observed { stored, .. } => {
            // Our own stream's reports win; an older observation never
            // replaces a newer state.
            if s.connection.stream.is_some() || stored.last_report_at < s.health.last_report_at {
                return Applied::default();
            }
            let Some(defined) = &s.defined else {
                return Applied::default();
            };
            let health = restore(
                &stored,
                &defined.dataplane,
                &defined.specifier,
                s.health.clone(),
            );
            // Like a report: watchers wake when a status changed, not when
            // only the report time moved.
            let changed = health.inbounds != s.health.inbounds;
            s.health = health;
            Applied {
                notify: changed,
                stored: true,
                ..Default::default()
            }
        }
    }
}

/// What readers show of who holds a dataplane's stream: the other instance
/// holding it (none while ours does), and whether ours was replaced.
fn shown_holder(c: &Connection) -> (Option<String>, bool) {
    (
        c.holder.clone().filter(|_| c.stream.is_none()),
        c.replaced_on.is_some(),
    )
}

/// Logs, once per change, what an Envoy cannot run of its specifier and
/// that an Envoy began ending its streams after every specifier.
/// One journal line per inbound status change recorded since `before`
/// (a [`Health::recorded`] count).
fn journal_changes(id: &DataplaneId, s: &DataplaneState, before: u64) {
    if s.health.recorded == before {
        return;
    }
    let Some(defined) = &s.defined else { return };
    for change in s.health.recorded_since(before) {
        if change.from.is_ready() == change.to.is_ready() {
            continue;
        }
        if let Some(inbound) = defined.dataplane.inbounds.get(change.inbound) {
            crate::journal::transition(
                id,
                inbound.port,
                change.from.as_str(),
                change.to.as_str(),
                change.to.is_ready(),
            );
        }
    }
}

fn log_envoy_news(id: &DataplaneId, before: &EnvoyRun, after: &EnvoyRun) {
    let version = after
        .version
        .map_or_else(|| "reporting no version".to_string(), |v| v.to_string());
    if after.restricted != before.restricted {
        if let Some(r) = &after.restricted {
            let (mut left_out, mut fallback) = (0, 0);
            let mut reason = None;
            for s in r.support.iter() {
                match s {
                    Support::Full => continue,
                    Support::Unsupported(_) | Support::Withheld => left_out += 1,
                    Support::Fallback(_) => fallback += 1,
                }
                reason = reason.or(s.reason(after.version));
            }
            crate::metrics::unsupported_probes(left_out, false);
            crate::metrics::unsupported_probes(fallback, true);
            if let Some(reason) = reason {
                tracing::warn!(
                    dataplane = %id,
                    envoy = %version,
                    left_out,
                    fallback,
                    "{}",
                    reason.message
                );
            }
        }
    }
    if after.rejects_specifier() && !before.rejects_specifier() {
        crate::metrics::specifier_rejected();
        if let Some(problem) = after.problem() {
            tracing::warn!(dataplane = %id, envoy = %version, "{}", problem.message);
        }
    }
}

/// Works out what the attached Envoy runs of the definition (once an Envoy
/// attached: before, nothing is known) and makes the inbounds' statuses
/// agree (`unsupported` where it runs nothing).
fn adapt(s: &mut DataplaneState, now: Timestamp) -> FoldOutcome {
    let DataplaneState {
        defined,
        envoy,
        health,
        ..
    } = s;
    let Some(defined) = defined else {
        return FoldOutcome::default();
    };
    if envoy.seen {
        envoy.restricted = defined
            .specifier
            .for_envoy(envoy.version, envoy.tls_withheld)
            .map(|(specifier, support)| Restricted {
                specifier: Arc::new(specifier),
                support: support.into(),
            });
    }
    let support = envoy.restricted.as_ref().map(|r| &r.support[..]);
    apply_support(health, &defined.specifier, support, now)
}

/// Bumps the version when the specifier to send is no longer the one sent
/// before (`None`: the dataplane was not defined).
fn bump_if_sent_changes(s: &mut DataplaneState, before: Option<Arc<Specifier>>) {
    let after = s.specifier().map(|a| &a.message);
    if before.as_ref().map(|b| &b.message) != after {
        s.version += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::readiness::Status;
    use crate::specifier::{build, endpoint, SpecifierSettings};
    use chrono::{TimeZone, Utc};
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
    };

    fn t(s: i64) -> Timestamp {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn defined(service_port: u16) -> Defined {
        let text = format!("type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {service_port}\n");
        let dp = parse_documents(&text).unwrap().remove(0);
        let settings = SpecifierSettings::default();
        Defined {
            specifier: Arc::new(build(&dp, &settings).unwrap()),
            dataplane: Arc::new(dp),
            file: "a.yaml".into(),
        }
    }

    fn state(d: Defined) -> DataplaneState {
        DataplaneState {
            health: rebase(None, &d.dataplane, &d.specifier, t(0)),
            defined: Some(d),
            version: 1,
            connection: Connection::default(),
            envoy: Default::default(),
        }
    }

    /// A HEALTHY report of the target on `port`, from `stream`.
    fn healthy_report(stream: StreamId, port: u16) -> Command {
        Command::Report {
            stream,
            report: healthy(port),
            received: std::time::Instant::now(),
        }
    }

    fn healthy(port: u16) -> Report {
        Report::from(EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: format!("probe_127.0.0.1:{port}"),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![EndpointHealth {
                        endpoint: Some(endpoint(([127, 0, 0, 1], port).into())),
                        health_status: HealthStatus::Healthy as i32,
                        health_metadata: None,
                    }],
                }],
            }],
            ..Default::default()
        })
    }

    #[test]
    fn only_the_newest_stream_counts() {
        let mut s = state(defined(8080));
        apply(
            &mut s,
            Command::Attach {
                stream: 1,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(1),
        );
        apply(
            &mut s,
            Command::Attach {
                stream: 2,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(2),
        );
        let a = apply(&mut s, healthy_report(1, 8080), t(3));
        assert!(!a.notify);
        assert_eq!(s.health.inbounds[0].status, Status::Pending);
        let a = apply(&mut s, healthy_report(2, 8080), t(4));
        assert!(a.notify);
        assert_eq!(s.health.inbounds[0].status, Status::Healthy);
        // The old stream closing does not disconnect the new one.
        assert!(
            !apply(
                &mut s,
                Command::Detach {
                    stream: 1,
                    rejected: false
                },
                t(5)
            )
            .notify
        );
        assert_eq!(s.connection.stream, Some(2));
        assert!(
            apply(
                &mut s,
                Command::Detach {
                    stream: 2,
                    rejected: false
                },
                t(6)
            )
            .notify
        );
        assert_eq!(s.connection.stream, None);
        assert_eq!(s.connection.connected_at, Some(t(2)));
    }

    /// The registry applies what each snapshot says changed, also when it
    /// only sees the last of several snapshots.
    #[tokio::test]
    async fn the_registry_follows_the_changes_the_snapshots_name() {
        use crate::sources::{assemble, reassemble};
        use std::path::PathBuf;
        let doc = |name: &str, port: u16| {
            format!("type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {port}\n")
        };
        let settings = SpecifierSettings::default();
        let first = assemble(
            std::path::Path::new("d"),
            [
                (PathBuf::from("d/a.yaml"), Ok(doc("a", 1))),
                (PathBuf::from("d/b.yaml"), Ok(doc("b", 2))),
            ]
            .into(),
            &Loaded::default(),
            &settings,
        );
        let (tx, rx) = watch::channel(Arc::new(first.clone()));
        let registry = Registry::spawn(
            rx,
            RegistryOptions {
                clock: Arc::new(crate::clock::ManualClock::new(t(0))),
                stale_after: Duration::from_secs(15),
                store: None,
                restored: BTreeMap::new(),
                feed: None,
                claims: None,
            },
        );
        let (a, b) = (
            DataplaneId::new("default", "a"),
            DataplaneId::new("default", "b"),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(registry.wait_for(&a, deadline).await.is_some());
        let second = reassemble(
            &first,
            [(PathBuf::from("d/b.yaml"), Some(Ok(doc("b", 20))))].into(),
            &settings,
        );
        let third = reassemble(
            &second,
            [(PathBuf::from("d/a.yaml"), None)].into(),
            &settings,
        );
        tx.send_replace(Arc::new(second));
        tx.send_replace(Arc::new(third));
        let port = |h: &DataplaneHandle| {
            h.state()
                .defined
                .map(|d| d.dataplane.inbounds[0].service_port)
        };
        loop {
            let catalog = registry.catalog();
            if !catalog.contains_key(&a) && catalog.get(&b).and_then(port) == Some(20) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a removed and b redefined in time"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn observed(stored: StoredHealth) -> Command {
        Command::Observed {
            stored: Box::new(stored),
            at_least: 0,
            done: None,
        }
    }

    #[test]
    fn an_envoy_moving_to_another_instance_restarts_the_stale_window_everywhere() {
        let window = chrono::Duration::seconds(15);
        let d = defined(8080);
        let attach = |stream| Command::Attach {
            stream,
            peer: None,
            envoy: None,
            token_expires: None,
        };
        let mut old_holder = state(d.clone());
        apply(&mut old_holder, attach(1), t(0));
        apply(&mut old_holder, healthy_report(1, 8080), t(1));
        let before_the_move = snapshot(&d.dataplane, &d.specifier, &old_holder.health);
        let mut survivor = state(d.clone());
        apply(&mut survivor, observed(before_the_move.clone()), t(2));
        assert_eq!(next_expiry(&survivor.health, window), Some(t(16)));
        // The old holder dies; the Envoy attaches to a third instance at
        // 12 s, which has the same stored state and writes it on attach.
        let mut new_holder = state(d.clone());
        apply(&mut new_holder, observed(before_the_move), t(3));
        apply(&mut new_holder, attach(9), t(12));
        assert_eq!(new_holder.health.reattached_at, Some(t(12)));
        assert_eq!(next_expiry(&new_holder.health, window), Some(t(27)));
        let written = snapshot(&d.dataplane, &d.specifier, &new_holder.health);
        assert_eq!(written.reattached_at, Some(t(12)));
        // The survivor reads that row: not stale at 16 s any more.
        apply(&mut survivor, observed(written), t(12));
        assert_eq!(next_expiry(&survivor.health, window), Some(t(27)));
        assert_eq!(survivor.health.inbounds[0].status, Status::Healthy);
    }

    #[test]
    fn another_instances_readiness_counts_only_while_no_stream_of_ours_does() {
        let d = defined(8080);
        let mut holder = state(d.clone());
        apply(
            &mut holder,
            Command::Attach {
                stream: 1,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(1),
        );
        apply(&mut holder, healthy_report(1, 8080), t(2));
        let written = snapshot(&d.dataplane, &d.specifier, &holder.health);

        // Another instance without a stream takes it.
        let mut other = state(d.clone());
        let a = apply(
            &mut other,
            Command::Observed {
                stored: Box::new(written.clone()),
                at_least: 0,
                done: None,
            },
            t(3),
        );
        assert!(a.notify);
        assert_eq!(other.health.inbounds[0].status, Status::Healthy);
        assert_eq!(other.health.last_report_at, Some(t(2)));
        // An older write never replaces a newer state.
        let mut older = written.clone();
        older.last_report_at = Some(t(1));
        older.inbounds[0].status = "unhealthy".into();
        assert!(
            !apply(
                &mut other,
                Command::Observed {
                    stored: Box::new(older),
                    at_least: 0,
                    done: None,
                },
                t(4)
            )
            .notify
        );
        assert_eq!(other.health.inbounds[0].status, Status::Healthy);
        // Once the Envoy is here, its own reports win.
        apply(
            &mut other,
            Command::Attach {
                stream: 7,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(5),
        );
        let mut later = written;
        later.last_report_at = Some(t(9));
        later.inbounds[0].status = "unhealthy".into();
        assert!(
            !apply(
                &mut other,
                Command::Observed {
                    stored: Box::new(later),
                    at_least: 0,
                    done: None,
                },
                t(9)
            )
            .notify
        );
        assert_eq!(other.health.inbounds[0].status, Status::Healthy);
    }

    #[test]
    fn a_stream_elsewhere_marks_ours_replaced_until_it_detaches() {
        let mut s = state(defined(8080));
        // Nothing of ours to replace: B holds it.
        let on_b = |at| Command::ReplacedOn {
            instance: "b/1".into(),
            at,
        };
        assert!(apply(&mut s, on_b(t(1)), t(1)).notify);
        assert_eq!(s.connection.replaced_on, None);
        assert_eq!(s.connection.holder.as_deref(), Some("b/1"));
        apply(
            &mut s,
            Command::Attach {
                stream: 3,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(2),
        );
        // A claim from before our stream attached is old news.
        assert!(!apply(&mut s, on_b(t(1)), t(3)).notify);
        assert!(apply(&mut s, on_b(t(3)), t(3)).notify);
        assert_eq!(s.connection.replaced_on.as_deref(), Some("b/1"));
        apply(
            &mut s,
            Command::Detach {
                stream: 3,
                rejected: false,
            },
            t(4),
        );
        assert_eq!(
            s.connection,
            Connection {
                connected_at: Some(t(2)),
                holder: Some("b/1".into()),
                ..Default::default()
            }
        );
        // A stream attaching here later is not replaced.
        apply(
            &mut s,
            Command::Attach {
                stream: 4,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(5),
        );
        assert_eq!(s.connection.replaced_on, None);
        assert_eq!(s.connection.holder, None);
    }

    #[test]
    fn a_dead_or_leaving_holder_is_forgotten_but_a_newer_one_is_kept() {
        let mut s = state(defined(8080));
        let claim = |instance: &str, at| Command::ReplacedOn {
            instance: instance.into(),
            at,
        };
        let released = |instance: &str| Command::Released {
            instance: instance.into(),
        };
        apply(&mut s, claim("a/1", t(1)), t(1));
        assert_eq!(s.connection.holder.as_deref(), Some("a/1"));
        // The Envoy moved to C before A was found dead: A's release is old news.
        assert!(apply(&mut s, claim("c/3", t(2)), t(2)).notify);
        assert!(!apply(&mut s, released("a/1"), t(3)).notify);
        assert_eq!(s.connection.holder.as_deref(), Some("c/3"));
        // C dies (or leaves): nobody holds it; the readiness is untouched
        // and goes stale by the usual rule.
        let health = s.health.clone();
        assert!(apply(&mut s, released("c/3"), t(4)).notify);
        assert_eq!(s.connection.holder, None);
        assert_eq!(s.health, health);
        assert!(!apply(&mut s, released("c/3"), t(5)).notify);
    }

    /// The task expires reports by itself, on the clock the test controls.
    #[tokio::test(start_paused = true)]
    async fn a_dataplane_task_marks_silent_inbounds_stale_on_time() {
        use crate::clock::ManualClock;
        let clock = ManualClock::new(t(0));
        let d = defined(8080);
        let id = d.dataplane.id.clone();
        let loaded = Loaded {
            dataplanes: vec![(id.clone(), d)].into(),
            ..Default::default()
        };
        let (_sources, rx) = watch::channel(Arc::new(loaded));
        let registry = Registry::spawn(
            rx,
            RegistryOptions {
                claims: None,
                clock: Arc::new(clock.clone()),
                stale_after: Duration::from_secs(15),
                store: None,
                restored: BTreeMap::new(),
                feed: None,
            },
        );
        let handle = registry
            .wait_for(&id, Instant::now() + Duration::from_secs(1))
            .await
            .expect("the dataplane is registered");
        let mut state = handle.subscribe();
        handle
            .send(Command::Attach {
                stream: 1,
                peer: None,
                envoy: None,
                token_expires: None,
            })
            .await;
        handle.send(healthy_report(1, 8080)).await;
        let status = |s: &DataplaneState| s.health.inbounds[0].status;
        state
            .wait_for(|s| status(s) == Status::Healthy)
            .await
            .unwrap();

        // 14s later: still healthy.
        clock.advance(Duration::from_secs(14));
        tokio::time::advance(Duration::from_secs(14)).await;
        tokio::task::yield_now().await;
        assert_eq!(status(&handle.state()), Status::Healthy);

        // Past 15s: stale, since the moment the window ended.
        clock.advance(Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(2)).await;
        let s = state
            .wait_for(|s| status(s) == Status::Stale)
            .await
            .unwrap()
            .clone();
        assert_eq!(s.health.inbounds[0].since, t(15));
    }

    /// A store that records every row written.
    #[derive(Debug, Default)]
    struct Recording {
        rows: std::sync::Mutex<Vec<(DataplaneId, Option<StoredHealth>)>>,
    }

    impl crate::store::ReadinessStore for Recording {
        fn load(&self) -> Result<BTreeMap<DataplaneId, StoredHealth>, crate::store::StoreError> {
            Ok(BTreeMap::new())
        }
        fn write(
            &self,
            batch: &[(DataplaneId, Option<StoredHealth>)],
        ) -> Result<(), crate::store::StoreError> {
            self.rows.lock().unwrap().extend(batch.iter().cloned());
            Ok(())
        }
    }

    /// A registry of the one dataplane `d` on `clock`, stale after 15 s,
    /// with `restored` state and `store`.
    fn one_dataplane(
        d: &Defined,
        clock: &crate::clock::ManualClock,
        restored: Option<StoredHealth>,
        store: Option<StoreHandle>,
    ) -> (watch::Sender<Arc<Loaded>>, Registry) {
        one_dataplane_claimed(d, clock, restored, store, None)
    }

    /// [`one_dataplane`] with a store shared by other instances (`claims`).
    fn one_dataplane_claimed(
        d: &Defined,
        clock: &crate::clock::ManualClock,
        restored: Option<StoredHealth>,
        store: Option<StoreHandle>,
        claims: Option<Claims>,
    ) -> (watch::Sender<Arc<Loaded>>, Registry) {
        let id = d.dataplane.id.clone();
        let loaded = Loaded {
            dataplanes: vec![(id.clone(), d.clone())].into(),
            ..Default::default()
        };
        let (sources, rx) = watch::channel(Arc::new(loaded));
        let registry = Registry::spawn(
            rx,
            RegistryOptions {
                claims,
                clock: Arc::new(clock.clone()),
                stale_after: Duration::from_secs(15),
                store,
                restored: restored.map(|r| (id, r)).into_iter().collect(),
                feed: None,
            },
        );
        (sources, registry)
    }

    /// Moves both clocks on by `secs`.
    async fn advance(clock: &crate::clock::ManualClock, secs: u64) {
        clock.advance(Duration::from_secs(secs));
        tokio::time::advance(Duration::from_secs(secs)).await;
        tokio::task::yield_now().await;
    }

    /// Its own Envoy reporting every 5 s, a dataplane's record is written
    /// on the transition and then once its stored report time trails by
    /// `stale_after` (every third report), not at every report.
    #[tokio::test(start_paused = true)]
    async fn the_report_time_is_written_once_it_trails_by_stale_after() {
        use crate::clock::ManualClock;
        let clock = ManualClock::new(t(0));
        let d = defined(8080);
        let id = d.dataplane.id.clone();
        let store = Arc::new(Recording::default());
        let handle_store = StoreHandle::spawn(store.clone());
        let (_sources, registry) = one_dataplane(&d, &clock, None, Some(handle_store.clone()));
        let handle = registry
            .wait_for(&id, Instant::now() + Duration::from_secs(1))
            .await
            .expect("the dataplane is registered");
        handle.send(attach(1, None)).await;
        for i in 0..10 {
            handle.send(healthy_report(1, 8080)).await;
            // A report that moves only the time wakes no watcher: look.
            let mut spins = 0;
            while handle.state().health.last_report_at != Some(t(5 * i)) {
                spins += 1;
                assert!(spins < 10_000, "report {i} not folded");
                tokio::task::yield_now().await;
            }
            // Written one by one (the writer keeps only a dataplane's last
            // update of a batch).
            handle_store.flush().await;
            advance(&clock, 5).await;
        }
        let written: Vec<Option<Timestamp>> = store
            .rows
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, row)| row.as_ref().map(|r| r.last_report_at))
            .collect();
        // Reports at 0, 5, ..., 45 s: the first (a transition), then 15, 30, 45.
        assert_eq!(written, [Some(t(0)), Some(t(15)), Some(t(30)), Some(t(45))]);
    }

    /// With a shared store, an Envoy moving here from a dead holder is
    /// written at once (the attach: the other instances give it
    /// `stale_after` from then, with no lag), and so is its first report
    /// here, though the stored time does not trail by `stale_after` yet:
    /// else the others would mark it stale at the attach + `stale_after`,
    /// before the next write. Then every third report again.
    #[tokio::test(start_paused = true)]
    async fn the_first_report_after_an_attach_written_is_written_at_once() {
        use crate::clock::ManualClock;
        let d = defined(8080);
        let mut before = state(d.clone());
        apply(&mut before, attach(1, None), t(0));
        apply(&mut before, healthy_report(1, 8080), t(0));
        let stored = snapshot(&d.dataplane, &d.specifier, &before.health);
        let clock = ManualClock::new(t(0));
        let id = d.dataplane.id.clone();
        let store = Arc::new(Recording::default());
        let handle_store = StoreHandle::spawn(store.clone());
        let claims = Claims(Arc::new(|_: &DataplaneId, _: Option<Timestamp>| {}));
        let (_sources, registry) = one_dataplane_claimed(
            &d,
            &clock,
            Some(stored),
            Some(handle_store.clone()),
            Some(claims),
        );
        let handle = registry
            .wait_for(&id, Instant::now() + Duration::from_secs(1))
            .await
            .expect("the dataplane is registered");
        advance(&clock, 8).await;
        handle.send(attach(2, None)).await;
        let mut spins = 0;
        while handle.state().connection.stream != Some(2) {
            spins += 1;
            assert!(spins < 10_000, "not attached");
            tokio::task::yield_now().await;
        }
        handle_store.flush().await;
        advance(&clock, 4).await;
        for i in 0..4 {
            handle.send(healthy_report(2, 8080)).await;
            let mut spins = 0;
            while handle.state().health.last_report_at != Some(t(12 + 5 * i)) {
                spins += 1;
                assert!(spins < 10_000, "report {i} not folded");
                tokio::task::yield_now().await;
            }
            handle_store.flush().await;
            advance(&clock, 5).await;
        }
        let written: Vec<(Option<Timestamp>, Option<Timestamp>)> = store
            .rows
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, row)| row.as_ref().map(|r| (r.last_report_at, r.reattached_at)))
            .collect();
        // The attach at 8 s (with the report time stored before it), the
        // first report here at 12 s, then 27 s (reports at 17 and 22 s not).
        assert_eq!(
            written,
            [
                (Some(t(0)), Some(t(8))),
                (Some(t(12)), Some(t(8))),
                (Some(t(27)), Some(t(8))),
            ]
        );
    }

    /// Health read from the store (restored here, or written by another
    /// instance) trails its writer's reports by up to `stale_after`: it goes
    /// stale that much later. An attach here without a report (the Envoy
    /// moved from a dead holder) gives the Envoy `stale_after` from the
    /// attach; reports folded here count for `stale_after`.
    #[tokio::test(start_paused = true)]
    async fn stored_health_counts_for_its_lag_more_and_reports_here_for_stale_after() {
        use crate::clock::ManualClock;
        let d = defined(8080);
        let mut written = state(d.clone());
        apply(&mut written, attach(1, None), t(0));
        apply(&mut written, healthy_report(1, 8080), t(0));
        let stored = snapshot(&d.dataplane, &d.specifier, &written.health);
        let status = |s: &DataplaneState| s.health.inbounds[0].status;
        let since = |s: &DataplaneState| s.health.inbounds[0].since;

        // Left alone: stale at 30 s, not 15 s.
        let clock = ManualClock::new(t(0));
        let (_sources, registry) = one_dataplane(&d, &clock, Some(stored.clone()), None);
        let handle = registry
            .wait_for(&d.dataplane.id, Instant::now() + Duration::from_secs(1))
            .await
            .expect("the dataplane is registered");
        let mut state = handle.subscribe();
        assert_eq!(status(&handle.state()), Status::Healthy);
        advance(&clock, 29).await;
        assert_eq!(
            status(&handle.state()),
            Status::Healthy,
            "29 s < 15 s + 15 s"
        );
        advance(&clock, 2).await;
        let s = state
            .wait_for(|s| status(s) == Status::Stale)
            .await
            .unwrap();
        assert_eq!(since(&s), t(30));
        drop(s);

        // Its Envoy reports here: the usual window.
        handle.send(attach(2, None)).await;
        handle.send(healthy_report(2, 8080)).await;
        state
            .wait_for(|s| status(s) == Status::Healthy)
            .await
            .unwrap();
        advance(&clock, 14).await;
        assert_eq!(status(&handle.state()), Status::Healthy);
        advance(&clock, 2).await;
        let s = state
            .wait_for(|s| status(s) == Status::Stale)
            .await
            .unwrap();
        assert_eq!(since(&s), t(46));
        drop(s);

        // Another dataplane task with the same stored state: its Envoy
        // attaches here at 20 s and has not reported yet: stale 15 s after
        // the attach, not 15 s after the stored time.
        let clock = ManualClock::new(t(0));
        let (_sources, registry) = one_dataplane(&d, &clock, Some(stored), None);
        let handle = registry
            .wait_for(&d.dataplane.id, Instant::now() + Duration::from_secs(1))
            .await
            .expect("the dataplane is registered");
        let mut state = handle.subscribe();
        advance(&clock, 20).await;
        handle.send(attach(3, None)).await;
        state
            .wait_for(|s| s.connection.stream == Some(3))
            .await
            .unwrap();
        advance(&clock, 14).await;
        assert_eq!(status(&handle.state()), Status::Healthy, "34 s");
        advance(&clock, 2).await;
        let s = state
            .wait_for(|s| status(s) == Status::Stale)
            .await
            .unwrap();
        assert_eq!(since(&s), t(35));
    }

    #[test]
    fn an_older_stream_never_takes_over_from_a_newer_one() {
        let mut s = state(defined(8080));
        apply(
            &mut s,
            Command::Attach {
                stream: 5,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(1),
        );
        assert!(
            !apply(
                &mut s,
                Command::Attach {
                    stream: 3,
                    peer: None,
                    envoy: None,
                    token_expires: None,
                },
                t(2)
            )
            .notify
        );
        assert_eq!(s.connection.stream, Some(5));
        assert_eq!(s.connection.connected_at, Some(t(1)));
    }

    #[test]
    fn redefinition_bumps_version_only_when_the_specifier_changes() {
        let mut s = state(defined(8080));
        apply(
            &mut s,
            Command::Attach {
                stream: 1,
                peer: None,
                envoy: None,
                token_expires: None,
            },
            t(1),
        );
        apply(&mut s, healthy_report(1, 8080), t(2));
        assert!(!apply(&mut s, Command::Define(defined(8080)), t(3)).notify);
        assert_eq!(s.version, 1);
        let mut renamed = defined(8080);
        renamed.file = "b.yaml".into();
        assert!(apply(&mut s, Command::Define(renamed), t(3)).notify);
        assert_eq!(s.version, 1, "same specifier, nothing to push");
        assert_eq!(s.health.inbounds[0].status, Status::Healthy);
        apply(&mut s, Command::Define(defined(9090)), t(4));
        assert_eq!(s.version, 2);
        assert_eq!(s.health.inbounds[0].status, Status::Pending);
        apply(&mut s, Command::Remove, t(5));
        assert_eq!(s.version, 3);
        assert!(s.defined.is_none());
        // Reports after removal are ignored.
        assert!(!apply(&mut s, healthy_report(1, 9090), t(6)).notify);
    }

    /// A dataplane with a gRPC inbound (8080) and a TCP one (8081).
    fn grpc_and_tcp(tcp_fallback: bool) -> Defined {
        let dp = parse_documents(
            "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n    serviceProbe: {grpc: {service: shop.Cart}}\n  - port: 10002\n    servicePort: 8081\n    tags: {kuma.io/service: web}\n",
        )
        .unwrap()
        .remove(0);
        let settings = SpecifierSettings {
            tcp_fallback,
            ..SpecifierSettings::default()
        };
        Defined {
            specifier: Arc::new(build(&dp, &settings).unwrap()),
            dataplane: Arc::new(dp),
            file: "web.yaml".into(),
        }
    }

    fn attach(stream: StreamId, envoy: Option<&str>) -> Command {
        Command::Attach {
            stream,
            peer: None,
            envoy: envoy.map(|v| v.parse().unwrap()),
            token_expires: None,
        }
    }

    fn statuses(s: &DataplaneState) -> Vec<Status> {
        s.health.inbounds.iter().map(|i| i.status).collect()
    }

    fn sent_clusters(s: &DataplaneState) -> Vec<String> {
        s.specifier()
            .unwrap()
            .message
            .cluster_health_checks
            .iter()
            .map(|c| c.cluster_name.clone())
            .collect()
    }

    /// An Envoy too old for a gRPC check is never sent it: its inbound reads
    /// `unsupported` with the reason, the TCP inbound is served as usual; a
    /// newer Envoy on the same dataplane runs everything.
    #[test]
    fn an_envoy_is_sent_only_what_its_version_runs() {
        let mut s = state(grpc_and_tcp(false));
        // Before any Envoy: the whole specifier, nothing unsupported yet.
        assert_eq!(sent_clusters(&s).len(), 2);
        assert_eq!(statuses(&s), [Status::Pending, Status::Pending]);

        let applied = apply(&mut s, attach(1, Some("1.37.0")), t(1));
        assert!(applied.notify);
        assert_eq!(sent_clusters(&s), ["probe_127.0.0.1:8081"]);
        assert_eq!(statuses(&s), [Status::Unsupported, Status::Pending]);
        assert_eq!(s.version, 2, "what is sent changed");
        let reason = s.reason_of_inbound(0).unwrap();
        assert_eq!(reason.code, "envoy_too_old");
        assert!(reason
            .message
            .starts_with("gRPC probe needs Envoy >= 1.38; this Envoy is 1.37.0"));
        assert_eq!(s.reason_of_inbound(1), None);
        // Unsupported stays so: no report can make it ready, no time stale.
        apply(&mut s, healthy_report(1, 8081), t(2));
        assert_eq!(statuses(&s), [Status::Unsupported, Status::Healthy]);
        crate::readiness::expire(&mut s.health, t(100), chrono::Duration::seconds(1));
        assert_eq!(s.health.inbounds[0].status, Status::Unsupported);

        // The same Envoy again: nothing changes.
        apply(
            &mut s,
            Command::Detach {
                stream: 1,
                rejected: false,
            },
            t(3),
        );
        let version = s.version;
        apply(&mut s, attach(2, Some("1.37.0")), t(4));
        assert_eq!(s.version, version);
        assert_eq!(s.health.inbounds[0].status, Status::Unsupported);

        // Upgraded: the gRPC check is sent, its inbound pending until reported.
        apply(&mut s, attach(3, Some("1.38.3")), t(5));
        assert_eq!(sent_clusters(&s).len(), 2);
        assert_eq!(s.health.inbounds[0].status, Status::Pending);
        assert_eq!(s.reason_of_inbound(0), None);
        assert!(s.envoy.restricted.is_none());

        // No version reported: the conservative set.
        apply(&mut s, attach(4, None), t(6));
        assert_eq!(sent_clusters(&s), ["probe_127.0.0.1:8081"]);
        assert!(s
            .reason_of_inbound(0)
            .unwrap()
            .message
            .contains("reports no version"));

        // A new definition keeps the restriction for the Envoy attached.
        let mut redefined = grpc_and_tcp(false);
        redefined.file = "moved.yaml".into();
        apply(&mut s, Command::Define(redefined), t(7));
        assert_eq!(sent_clusters(&s), ["probe_127.0.0.1:8081"]);
        assert_eq!(s.health.inbounds[0].status, Status::Unsupported);
    }

    /// With `hds.check.fallback = "tcp"`, the old Envoy gets a TCP connect
    /// on the same cluster, and its reports fold as usual.
    #[test]
    fn a_configured_fallback_checks_the_target_with_a_connect() {
        let mut s = state(grpc_and_tcp(true));
        apply(&mut s, attach(1, Some("1.36.4")), t(1));
        let sent = &s.specifier().unwrap().message.cluster_health_checks;
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].cluster_name, "probe_127.0.0.1:8080");
        assert!(matches!(
            sent[0].health_checks[0].health_checker,
            Some(envoy_types::pb::envoy::config::core::v3::health_check::HealthChecker::TcpHealthCheck(_))
        ));
        assert_eq!(statuses(&s), [Status::Pending, Status::Pending]);
        assert_eq!(s.reason_of_inbound(0).unwrap().code, "probe_fallback");
        apply(&mut s, healthy_report(1, 8080), t(2));
        assert_eq!(s.health.inbounds[0].status, Status::Healthy);
    }

    /// Three streams in a row ended by the Envoy right after a push, with
    /// no report: it rejects or crashes on its specifier. A report clears it.
    #[test]
    fn an_envoy_ending_every_stream_after_a_push_is_flagged_until_it_reports() {
        let mut s = state(defined(8080));
        for stream in 1..=REJECTED_STREAMS as u64 {
            assert!(!s.envoy.rejects_specifier());
            apply(&mut s, attach(stream, Some("1.37.0")), t(stream as i64));
            apply(
                &mut s,
                Command::Detach {
                    stream,
                    rejected: true,
                },
                t(stream as i64),
            );
        }
        assert!(s.envoy.rejects_specifier());
        let problem = s.envoy.problem().unwrap();
        assert_eq!(problem.code, "specifier_rejected");
        assert!(problem
            .message
            .starts_with("Envoy ends the stream after every specifier"));
        // Still flagged while it reconnects; a report ends it.
        apply(&mut s, attach(10, Some("1.37.0")), t(10));
        assert!(s.envoy.rejects_specifier());
        let applied = apply(&mut s, healthy_report(10, 8080), t(11));
        assert!(applied.notify);
        assert!(!s.envoy.rejects_specifier());
        // An ordinary end in between starts the count again.
        apply(
            &mut s,
            Command::Detach {
                stream: 10,
                rejected: true,
            },
            t(12),
        );
        apply(&mut s, attach(11, None), t(13));
        apply(
            &mut s,
            Command::Detach {
                stream: 11,
                rejected: false,
            },
            t(14),
        );
        assert_eq!(s.envoy.rejected_streams, 0);
    }

    /// An HTTPS inbound (10001, CA `ca`) beside a TCP one (10002).
    fn https_and_tcp(ca: &str) -> Defined {
        let dp = parse_documents(&format!(
            "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8443\n    serviceProbe: {{http: {{path: /healthz, tls: {{caFile: {ca}}}}}}}\n  - port: 10002\n    servicePort: 8081\n"
        ))
        .unwrap()
        .remove(0);
        Defined {
            specifier: Arc::new(build(&dp, &SpecifierSettings::default()).unwrap()),
            dataplane: Arc::new(dp),
            file: "web.yaml".into(),
        }
    }

    fn reject(s: &mut DataplaneState, stream: StreamId, at: i64) {
        apply(s, attach(stream, Some("1.40.0")), t(at));
        apply(
            s,
            Command::Detach {
                stream,
                rejected: true,
            },
            t(at),
        );
    }

    /// Envoy aborts on a TLS file it cannot read: an Envoy that ends every
    /// stream after a specifier with TLS checks is sent none of them any
    /// more (its TLS inbounds read `unsupported`, `tls_withheld`), whatever
    /// it reports, until the TLS settings change.
    #[test]
    fn tls_checks_are_withheld_from_an_envoy_that_rejects_them() {
        let mut s = state(https_and_tcp("/missing/ca.pem"));
        let both = ["probe_127.0.0.1:8443", "probe_127.0.0.1:8081"];
        for stream in 1..REJECTED_STREAMS as u64 {
            reject(&mut s, stream, stream as i64);
            assert_eq!(sent_clusters(&s), both);
        }
        let version = s.version;
        reject(&mut s, 9, 9);
        assert!(s.envoy.tls_withheld);
        assert!(s.version > version, "the streams send the new specifier");
        assert_eq!(sent_clusters(&s), ["probe_127.0.0.1:8081"]);
        assert_eq!(statuses(&s), [Status::Unsupported, Status::Pending]);
        let reason = s.reason_of_inbound(0).unwrap();
        assert_eq!(reason.code, "tls_withheld");
        assert!(
            reason.message.contains("Invalid path"),
            "{}",
            reason.message
        );
        // It runs the rest and reports: still withheld.
        apply(&mut s, attach(10, Some("1.40.0")), t(10));
        apply(&mut s, healthy_report(10, 8081), t(11));
        assert!(!s.envoy.rejects_specifier() && s.envoy.tls_withheld);
        assert_eq!(statuses(&s), [Status::Unsupported, Status::Healthy]);
        // Another definition with the same TLS keeps it withheld...
        let mut moved = https_and_tcp("/missing/ca.pem");
        moved.file = "moved.yaml".into();
        apply(&mut s, Command::Define(moved), t(12));
        assert!(s.envoy.tls_withheld);
        // ...new TLS settings are sent again.
        apply(
            &mut s,
            Command::Define(https_and_tcp("/etc/envoy/ca.pem")),
            t(13),
        );
        assert!(!s.envoy.tls_withheld);
        assert_eq!(sent_clusters(&s), both);
        assert_eq!(statuses(&s), [Status::Pending, Status::Healthy]);
    }

    /// Rejections of a specifier without TLS withhold nothing.
    #[test]
    fn rejections_without_tls_withhold_nothing() {
        let mut s = state(defined(8080));
        for stream in 1..=REJECTED_STREAMS as u64 {
            reject(&mut s, stream, stream as i64);
        }
        assert!(s.envoy.rejects_specifier() && !s.envoy.tls_withheld);
    }
}
