//! What the instances of one hdsd cluster share, behind one trait:
//! membership and heartbeats, who holds which dataplane's stream, the sweep
//! of dead instances, shared signing public keys and revocations, the
//! numbering of revisions (the change feed's watermark), named leases (one
//! live instance holds each, with a growing epoch: [`lease`]), and a
//! global's zones (their links and dataplanes, and the zones registered
//! through its API).
//!
//! Two implementations: [`Solo`] (the embedded default: one instance, which
//! shares with nobody, holds in memory what the other keeps in rows) and
//! [`PgCluster`] (instances sharing one PostgreSQL database). `server::run`
//! picks one and hands it to [`join`], which wires it to the registry, the
//! change feed and the token gate; nothing else knows which one runs. The
//! same [`conformance`] tests run against both.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::auth::{Gate, SharedKey};
use crate::dataplane::DataplaneId;
use crate::feed::{Feed, FeedSender, HistoryLimits};
use crate::readiness::Timestamp;
use crate::registry::{Claims, Registry};
use crate::store::{StoreError, StoreStatus, StoredHealth};

pub mod conformance;
pub mod lease;
mod postgres;
mod solo;

pub use crate::store::postgres::Lease;
pub use crate::store::postgres::{
    KeyPublication, LinkChange, LinkRow, LinkState, StreamNote, Swept, Written, ZoneDataplaneRow,
    ZoneWrite, ZonesRead,
};
pub use crate::store::registrations::{
    RegistrationChange, RegistrationState, RegistrationWrite, ZoneRegistration,
};
pub use postgres::PgCluster;
pub use solo::Solo;

/// What a cluster call returns.
pub type ClusterFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Which instance holds each dataplane's stream, since when.
pub type Holders = BTreeMap<DataplaneId, (String, Timestamp)>;

/// Called with readiness other instances wrote and the watermark of the
/// read; completes once every change is in the feed, with the dataplanes
/// this instance does not know (their rows are read again later).
pub type Observe = Box<
    dyn Fn(
            Vec<(DataplaneId, StoredHealth)>,
            u64,
        ) -> Pin<Box<dyn Future<Output = Vec<DataplaneId>> + Send>>
        + Send
        + Sync,
>;

/// What a follower is poked about: something of that kind changed, or the
/// cluster reconnected and must be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// Stream holders.
    Holders,
    /// Revoked token ids.
    Revocations,
    /// Shared public signing keys.
    Keys,
    /// A global's zones.
    Zones,
    /// A lease changed holder.
    Leases,
}

/// What several instances share. Every method is about this instance's
/// view of the cluster; a call that needs the shared store returns
/// [`StoreError`] when it does not answer.
pub trait Cluster: Send + Sync + Debug + 'static {
    /// This instance's name as the others know it (`<host>/<pid>`).
    fn instance(&self) -> &str;
    /// Whether other instances may exist (false: [`Solo`]).
    fn shared(&self) -> bool;
    /// Where the shared state lives, for logs.
    fn describe(&self) -> String;
    /// How this instance announces that a stream attached here (`Some`) or
    /// ended here (`None`); announcements leave in order, in bursts.
    fn claims(&self) -> Claims;
    /// Streams that attached on, or were released by, other instances.
    fn stream_notes(&self) -> broadcast::Receiver<StreamNote>;
    /// Which instance holds each dataplane's stream.
    fn holders(&self) -> ClusterFuture<'_, Holders>;
    /// Writes this instance's heartbeat; true when it was not registered
    /// (the first beat, or another instance swept it as dead).
    fn heartbeat(&self) -> ClusterFuture<'_, bool>;
    /// Takes instances silent for `timeout` for dead: releases their
    /// streams (announced) and forgets them.
    fn sweep(&self, timeout: Duration) -> ClusterFuture<'_, Swept>;
    /// Leaves at a graceful shutdown: releases this instance's streams and
    /// its registration, so the others need not wait for the timeout.
    fn leave(&self) -> ClusterFuture<'_, ()>;
    /// Revokes a token id on every instance; false when it already was.
    fn revoke<'a>(&'a self, jti: &'a str) -> ClusterFuture<'a, bool>;
    /// Every revoked token id.
    fn revocations(&self) -> ClusterFuture<'_, Vec<String>>;
    /// Makes `keys` (kid -> SPKI PEM) the public keys `publisher` shares.
    fn publish_keys<'a>(
        &'a self,
        publisher: &'a str,
        keys: &'a BTreeMap<String, String>,
        alive_within: Duration,
    ) -> ClusterFuture<'a, KeyPublication>;
    /// Every shared public key.
    fn shared_keys(&self) -> ClusterFuture<'_, Vec<SharedKey>>;
    /// Writes the zones whose streams this instance holds (a global with
    /// several instances): one [`Written`] per write, in order.
    /// `zone_timeout`: how long a zone may be silent before any lease epoch
    /// may claim it; `prune`: also drop old tombstones.
    fn write_zones<'a>(
        &'a self,
        writes: &'a [ZoneWrite],
        zone_timeout: Duration,
        prune: bool,
    ) -> ClusterFuture<'a, Vec<Written>>;
    /// The zones' rows written after `seq` (0: all of them).
    fn zones_since(&self, seq: i64) -> ClusterFuture<'_, ZonesRead>;
    /// Takes the lease `name` for this instance when it is free or its
    /// holder has been silent (no heartbeat) for longer than `timeout`,
    /// keeps it when this instance holds it (holding is beating: it writes
    /// this instance's heartbeat), and says who holds it now. Every new
    /// holder gets a higher epoch, across restarts. An instance without a
    /// live heartbeat takes nothing (and gives its own lease up). Alone
    /// ([`Solo`]), this instance always holds it.
    fn acquire_lease<'a>(&'a self, name: &'a str, timeout: Duration) -> ClusterFuture<'a, Lease>;
    /// Gives the lease `name` up if this instance holds it (false when it
    /// did not); the others hear of it on [`Topic::Leases`] and may take it
    /// at once. [`Cluster::leave`] gives up every lease too.
    fn release_lease<'a>(&'a self, name: &'a str) -> ClusterFuture<'a, bool>;
    /// Registers, disables, enables or deletes a zone of a global (its API:
    /// `hdsd zone add`, ...), for every instance and across restarts; a
    /// deletion also drops the zone's rows of [`Cluster::write_zones`].
    /// Announced on the [`Topic::Zones`] signal.
    fn change_zone_registration<'a>(
        &'a self,
        zone: &'a str,
        change: RegistrationChange,
    ) -> ClusterFuture<'a, RegistrationWrite>;
    /// The zone registrations written after `seq` (0: all of them, the
    /// deleted ones included), oldest first.
    fn zone_registrations(&self, seq: i64) -> ClusterFuture<'_, Vec<ZoneRegistration>>;
    /// Poked when something of `topic` may have changed.
    fn signal(&self, topic: Topic) -> watch::Receiver<()>;
    /// How often followers read everything anyway (heals a missed poke).
    fn reconcile_interval(&self) -> Duration;
    /// A change feed numbered as this cluster numbers revisions: from this
    /// process's start alone, the shared watermark with several instances
    /// (a resume this instance cannot prove complete gets RESYNC).
    fn feed(&self, limits: HistoryLimits, now: Timestamp) -> Feed;
    /// Hands `observe` the readiness other instances write, then the
    /// watermark to `watermark`; alone, never returns and hands nothing.
    fn follow_readiness(
        self: Arc<Self>,
        observe: Observe,
        watermark: Box<dyn Fn(u64) + Send>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// What [`join`] connects a cluster to.
pub struct Members {
    pub registry: Registry,
    pub feed: FeedSender,
    /// The token gate, when tokens are in force: revocations and public
    /// keys are shared with it.
    pub gate: Option<Arc<Gate>>,
    /// This instance's publisher id for its public keys.
    pub publisher: Option<String>,
    /// Told whether the shared store answers (heartbeats).
    pub status: Option<StoreStatus>,
    /// `cluster.instance_timeout`.
    pub instance_timeout: Duration,
}

/// What [`join`] wired: the tasks, by name, for the caller to run (the
/// server supervises them; none ends while the cluster is joined), and
/// [`Joined::leave`] for the end, once they are stopped.
pub struct Joined {
    cluster: Arc<dyn Cluster>,
    pub tasks: Vec<(&'static str, crate::task::Task)>,
}

/// Wires `cluster` to the registry, the feed and the gate: streams attached
/// elsewhere end ours, stream holders are reconciled, readiness written by
/// other instances is observed and numbers the feed, heartbeats keep this
/// instance alive and sweep the dead, revocations and public keys are
/// shared. Alone ([`Solo`]), only what has meaning for one instance runs.
pub fn join(cluster: Arc<dyn Cluster>, members: Members) -> Joined {
    let mut tasks: Vec<(&'static str, crate::task::Task)> = Vec::new();
    if cluster.shared() {
        tasks.push((
            "cluster readiness follower",
            Box::pin(follow_readiness(
                cluster.clone(),
                members.registry.clone(),
                members.feed.clone(),
            )),
        ));
        tasks.push((
            "cluster stream notes follower",
            Box::pin(follow_notes(
                cluster.stream_notes(),
                members.registry.clone(),
            )),
        ));
        let syncing = members.registry.clone();
        let own = cluster.instance().to_string();
        tasks.push((
            "cluster stream holders follower",
            Box::pin(follow(
                cluster.clone(),
                Topic::Holders,
                |c| c.holders(),
                move |holders| syncing.sync_holders(&holders, &own),
                "cannot read the stream holders",
            )),
        ));
        tracing::info!(
            instance = cluster.instance(),
            store = %cluster.describe(),
            instance_timeout = %humantime::format_duration(members.instance_timeout),
            "sharing the store with other instances"
        );
    }
    if let Some(status) = members.status.clone() {
        let claims = cluster.claims();
        let holding = members.registry.clone();
        let reclaim = move || {
            let held = holding.held_here();
            tracing::info!(
                streams = held.len(),
                "claiming the streams held here again in the shared store"
            );
            for (id, at) in held {
                (claims.0)(&id, Some(at));
            }
        };
        tasks.push((
            "cluster membership",
            Box::pin(membership(
                cluster.clone(),
                members.instance_timeout,
                status,
                reclaim,
            )),
        ));
    }
    if let (Some(gate), true) = (members.gate, cluster.shared()) {
        // A token revoked through any instance ends its streams on this one.
        let revoking = gate.clone();
        tasks.push((
            "cluster revocations follower",
            Box::pin(follow(
                cluster.clone(),
                Topic::Revocations,
                |c| c.revocations(),
                move |all| revoking.set_shared_revocations(all.into_iter().collect()),
                "cannot read the shared revocations",
            )),
        ));
        // Tokens signed by any instance's key verify on this one: this
        // instance publishes the public keys of its files (and withdraws
        // those it no longer has) and trusts the ones the others publish.
        if let Some(publisher) = members.publisher {
            tasks.push((
                "cluster key publisher",
                Box::pin(publish_keys_from(
                    cluster.clone(),
                    publisher,
                    gate.published_keys(),
                    members.instance_timeout,
                )),
            ));
        }
        let trusting = gate.clone();
        tasks.push((
            "cluster signing keys follower",
            Box::pin(follow(
                cluster.clone(),
                Topic::Keys,
                |c| c.shared_keys(),
                move |all| trusting.set_shared_keys(all),
                "cannot read the shared signing keys",
            )),
        ));
    }
    Joined { cluster, tasks }
}

impl Joined {
    /// Leaves the cluster: gone at once for the other instances, not after
    /// `cluster.instance_timeout`. Call it once [`Joined::tasks`] are
    /// stopped (a heartbeat after it would count this instance in again).
    pub async fn leave(self) {
        if !self.cluster.shared() {
            return;
        }
        match self.cluster.leave().await {
            Ok(()) => {
                tracing::info!("left the cluster: the other instances no longer count this one")
            }
            Err(e) => tracing::warn!(
                "cannot leave the cluster ({e}); the other instances take this one for dead after cluster.instance_timeout"
            ),
        }
    }
}

/// Every instance keeps the whole fleet's readiness from what the instances
/// holding the streams write; each read's watermark follows the changes it
/// made into the feed and numbers its revisions.
async fn follow_readiness(cluster: Arc<dyn Cluster>, registry: Registry, feed: FeedSender) {
    let observe: Observe = Box::new(move |rows, watermark| {
        let registry = registry.clone();
        Box::pin(async move { registry.observe(rows, watermark).await })
    });
    cluster
        .follow_readiness(observe, Box::new(move |w| feed.watermark(w)))
        .await
}

/// The newest stream wins across instances: one attached elsewhere ends ours.
async fn follow_notes(mut notes: broadcast::Receiver<StreamNote>, registry: Registry) {
    loop {
        match notes.recv().await {
            Ok(StreamNote::Claimed((id, instance, at))) => registry.replaced_on(&id, instance, at),
            Ok(StreamNote::Released(id, instance)) => registry.released(&id, instance),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reads `read` on every poke of `topic` and once per reconcile interval,
/// and hands what it read to `apply`: what a missed poke left wrong is
/// healed. A failed read is logged at debug (the store's listener logs the
/// outage once) and tried again on the next poke or tick. Ends when the
/// cluster's signal is gone.
async fn follow<T>(
    cluster: Arc<dyn Cluster>,
    topic: Topic,
    read: impl for<'a> Fn(&'a dyn Cluster) -> ClusterFuture<'a, T>,
    apply: impl Fn(T),
    what: &str,
) {
    let mut signal = cluster.signal(topic);
    let mut full = tokio::time::interval(cluster.reconcile_interval());
    loop {
        tokio::select! {
            changed = signal.changed() => if changed.is_err() { return },
            _ = full.tick() => {}
        }
        match read(cluster.as_ref()).await {
            Ok(all) => apply(all),
            Err(e) => tracing::debug!("{what}: {e}"),
        }
    }
}

/// Heartbeats every `timeout / 4` and sweeps the instances silent for
/// `timeout`; tells `status` whether the shared store answers. Calls
/// `reclaim` (which claims again every stream held here) when a heartbeat
/// succeeds after failing, or finds this instance unregistered: claims made
/// meanwhile were lost, or a sweep released them. Runs until aborted.
async fn membership(
    cluster: Arc<dyn Cluster>,
    timeout: Duration,
    status: StoreStatus,
    reclaim: impl Fn() + Send + 'static,
) {
    let mut tick = tokio::time::interval(timeout / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when this instance's heartbeats succeed without a gap. It
    // sweeps only after `timeout` of that: after a start, or an outage
    // of the store that silenced every instance, the others have beaten
    // again by then and are not taken for dead.
    let mut beating_since: Option<tokio::time::Instant> = None;
    // Whether a heartbeat registered this instance yet (the first one does;
    // later, a missing registration means a sweep removed it), and whether
    // one failed since the last that succeeded.
    let (mut registered, mut failed) = (false, false);
    loop {
        tick.tick().await;
        let beat = tokio::time::timeout(timeout / 2, cluster.heartbeat())
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Postgres(format!(
                    "{}: no answer within {}",
                    cluster.describe(),
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
                        instance = %cluster.instance(),
                        "this instance's heartbeat row was gone (another instance took it for dead after cluster.instance_timeout without a heartbeat); registered again and claiming its streams again"
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
        match cluster.sweep(timeout).await {
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

/// Publishes this instance's public keys as `publisher` now, on every
/// change of `keys`, and once per reconcile interval (which heals a
/// publication that failed, or rows deleted by hand while the instance
/// still has the keys). Runs until `keys`' sender is dropped.
async fn publish_keys_from(
    cluster: Arc<dyn Cluster>,
    publisher: String,
    mut keys: watch::Receiver<BTreeMap<String, String>>,
    alive_within: Duration,
) {
    let mut full = tokio::time::interval(cluster.reconcile_interval());
    // The loop publishes first; the first tick is one interval later.
    full.reset();
    let mut trouble: Option<String> = None;
    loop {
        let current = keys.borrow_and_update().clone();
        let problem = match cluster.publish_keys(&publisher, &current, alive_within).await {
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
