//! The change feed: a revision counter and a bounded history of
//! "dataplane X changed (or was deleted) at revision N".
//!
//! [`Feed`] is plain data, written by one task ([`spawn`]): dataplane tasks
//! send it [`Change`]s over an unbounded channel, only when something a
//! consumer can see changed (a status, readiness, the connection or the
//! definition, never a report time alone). Watchers subscribe through the
//! same task, so a subscription's first messages and the live events that
//! follow them never overlap and never leave a gap.
//!
//! A feed can replay only what happened while it ran: its history starts at
//! its **floor**, and a `since` below it gets RESYNC, never a replay that
//! may lack a deletion made before the feed existed.
//!
//! **Embedded** ([`Feed::starting_at`]): revisions count up from the
//! process's start (the wall clock, in microseconds since the UNIX epoch),
//! so a revision of an earlier process is below the floor, never mistaken
//! for one of this process.
//! **Clustered** ([`Feed::clustered`], with PostgreSQL): revisions are
//! cluster time. The store's readiness follower sends the feed a
//! [`Watermark`] after each read (the database clock, in microseconds since
//! the UNIX epoch, of a read that saw everything committed before it), and
//! each event is numbered `max(previous + 1, watermark, change.at_least)`.
//! The floor of a clustered feed is its first watermark: what other
//! instances changed (or deleted) before this one started is not in its
//! history. A revision is then valid on every instance: [`Feed::since`] replays every
//! dataplane whose last event is newer than `since - slack`, and accepts a
//! `since` ahead of its own revision by up to the slack. ARCHITECTURE.md
//! ("Watch revisions are cluster time") has the argument.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;

use crate::dataplane::{Dataplane, DataplaneId};
use crate::pb;

/// A position in the feed; 0 is "nothing yet". Embedded: counts from 1 in
/// each process. Clustered: cluster time in microseconds since the UNIX
/// epoch (the database's clock), strictly increasing in each process.
pub type Revision = u64;

/// The database clock of a readiness read that saw every row committed
/// before it, in microseconds since the UNIX epoch.
pub type Watermark = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created, or its status, readiness, connection or definition changed.
    Changed,
    Deleted,
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// One of this hdsd's own dataplanes, with its (last) definition: watch
    /// filters read its tags.
    Local(Arc<Dataplane>),
    /// On a global: a dataplane of a zone, as the zone last sent it.
    Remote {
        zone: Arc<str>,
        dataplane: Arc<pb::Dataplane>,
    },
    /// On a global: a zone itself; its state (`online`, `offline`,
    /// `disabled`, `never_connected`) changed, or it was deleted (which
    /// takes its dataplanes with it: one event, not one per dataplane).
    Zone { zone: Arc<str>, state: &'static str },
}

/// Identifies what an event is about, across kinds: a zone's dataplane
/// `default/web` and the global's own `default/web` are two keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Local(DataplaneId),
    Remote(Arc<str>, DataplaneId),
    Zone(Arc<str>),
}

impl Subject {
    pub fn key(&self) -> Key {
        match self {
            Subject::Local(d) => Key::Local(d.id.clone()),
            Subject::Remote { zone, dataplane } => Key::Remote(
                zone.clone(),
                DataplaneId::new(dataplane.mesh.clone(), dataplane.name.clone()),
            ),
            Subject::Zone { zone, .. } => Key::Zone(zone.clone()),
        }
    }

    /// The zone it belongs to (none for this hdsd's own dataplanes).
    pub fn zone(&self) -> Option<&Arc<str>> {
        match self {
            Subject::Local(_) => None,
            Subject::Remote { zone, .. } | Subject::Zone { zone, .. } => Some(zone),
        }
    }

    /// The dataplane's mesh and name (none for a zone).
    pub fn mesh_name(&self) -> Option<(&str, &str)> {
        match self {
            Subject::Local(d) => Some((&d.id.mesh, &d.id.name)),
            Subject::Remote { dataplane, .. } => Some((&dataplane.mesh, &dataplane.name)),
            Subject::Zone { .. } => None,
        }
    }
}

/// What a dataplane task (or, on a global, the zones' follower) tells the feed.
#[derive(Debug, Clone)]
pub struct Change {
    pub subject: Subject,
    /// Which task of this dataplane sent it: a dataplane removed and added
    /// again gets a new task, whose changes win over the old task's late ones.
    /// 0 for a zone's dataplane or a zone (one writer, in order).
    pub incarnation: u64,
    pub kind: ChangeKind,
    /// Every inbound is ready (false once deleted).
    pub ready: bool,
    /// The lowest revision this change may get (clustered feeds only): the
    /// watermark of the store read that brought it, so that a change read
    /// from the store is numbered no lower than its commit time even when
    /// the watermark itself reaches the feed later. 0 for a change computed
    /// here.
    pub at_least: Revision,
}

/// One entry of the feed.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub revision: Revision,
    pub kind: ChangeKind,
    pub ready: bool,
    pub subject: Subject,
}

impl Event {
    pub fn key(&self) -> Key {
        self.subject.key()
    }

    /// This hdsd's own dataplane the event is about, if it is one.
    pub fn local(&self) -> Option<&Arc<Dataplane>> {
        match &self.subject {
            Subject::Local(d) => Some(d),
            _ => None,
        }
    }
}

/// Why a watcher must start over from a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// Its revision is older than the history the feed keeps.
    TooOld,
    /// Its revision is newer than this process's (hdsd restarted; or,
    /// clustered, further ahead than the resume slack).
    UnknownRevision,
    /// It read too slowly and its buffer overflowed.
    Overflow,
}

impl ResyncReason {
    pub const ALL: [ResyncReason; 3] = [
        ResyncReason::TooOld,
        ResyncReason::UnknownRevision,
        ResyncReason::Overflow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::TooOld => "too_old",
            ResyncReason::UnknownRevision => "unknown_revision",
            ResyncReason::Overflow => "overflow",
        }
    }
}

/// One message to a watcher, in the order it must see them.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Every matching dataplane at `revision`.
    Snapshot {
        revision: Revision,
        items: Vec<Arc<Event>>,
    },
    /// Up to date as of `revision`.
    Synced { revision: Revision },
    /// One dataplane changed or was deleted.
    Event(Arc<Event>),
    /// Forget what you know: a snapshot follows.
    Resync(ResyncReason),
}

impl Message {
    /// The revision a consumer has seen once it has read this message.
    pub fn revision(&self) -> Option<Revision> {
        match self {
            Message::Snapshot { revision, .. } | Message::Synced { revision } => Some(*revision),
            Message::Event(e) => Some(e.revision),
            Message::Resync(_) => None,
        }
    }
}

/// Which dataplanes a watcher wants. Empty parts match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub mesh: Option<String>,
    pub names: BTreeSet<String>,
    /// Every key=value must be on one inbound.
    pub selector: BTreeMap<String, String>,
    /// Whose dataplanes: this hdsd's own (the default), or on a global
    /// also every zone's, or one zone's.
    pub zones: Zones,
}

/// Which zones a [`Filter`] takes in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Zones {
    /// This hdsd's own dataplanes only (what the EDS index and the uplink
    /// follow; a watch asks for it with `zone=local`).
    #[default]
    Local,
    /// This hdsd's own dataplanes, every zone's dataplanes and the zones'
    /// states (a watch's default).
    All,
    /// One zone's dataplanes and its state.
    Only(String),
}

impl Zones {
    /// The API's `zone` parameter: empty or absent means every zone,
    /// `local` this hdsd's own, anything else one zone.
    pub fn from_param(zone: Option<&str>) -> Zones {
        match zone.map(str::trim) {
            None | Some("") => Zones::All,
            Some(LOCAL_ZONE) => Zones::Local,
            Some(z) => Zones::Only(z.to_string()),
        }
    }

    fn takes(&self, zone: Option<&Arc<str>>) -> bool {
        match (self, zone) {
            (Zones::All, _) | (Zones::Local, None) => true,
            (Zones::Only(w), Some(z)) => w.as_str() == &**z,
            _ => false,
        }
    }
}

/// The API's name for this hdsd's own dataplanes in a zone filter.
pub const LOCAL_ZONE: &str = crate::names::RESERVED_ZONE;

impl Filter {
    /// Whether this hdsd's own dataplane `dp` matches (mesh, names, selector).
    pub fn matches(&self, dp: &Dataplane) -> bool {
        self.mesh.as_ref().is_none_or(|m| &dp.id.mesh == m)
            && (self.names.is_empty() || self.names.contains(&dp.id.name))
            && selects(&self.selector, dp)
    }

    /// Whether an event's subject matches. A zone's state matches when the
    /// filter takes in that zone, whatever the dataplane parts say.
    pub fn matches_subject(&self, subject: &Subject) -> bool {
        if !self.zones.takes(subject.zone()) {
            return false;
        }
        match subject {
            Subject::Local(d) => self.matches(d),
            Subject::Remote { dataplane, .. } => {
                self.mesh.as_ref().is_none_or(|m| &dataplane.mesh == m)
                    && (self.names.is_empty() || self.names.contains(&dataplane.name))
                    && selects_remote(&self.selector, dataplane)
            }
            Subject::Zone { .. } => true,
        }
    }
}

/// True when one inbound of a zone's dataplane carries every tag of
/// `selector` (or it is empty).
pub fn selects_remote(selector: &BTreeMap<String, String>, dp: &pb::Dataplane) -> bool {
    selector.is_empty()
        || dp
            .inbounds
            .iter()
            .any(|i| selector.iter().all(|(k, v)| i.tags.get(k) == Some(v)))
}

/// True when one inbound of `dp` carries every tag of `selector` (or it is empty).
pub fn selects(selector: &BTreeMap<String, String>, dp: &Dataplane) -> bool {
    selector.is_empty()
        || dp
            .inbounds
            .iter()
            .any(|i| selector.iter().all(|(k, v)| i.tags.get(k) == Some(v)))
}

/// How much history the feed keeps: the last `changes` changes, and none
/// older than `age`.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    pub changes: usize,
    pub age: Duration,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            changes: 10_000,
            age: crate::config::FEED_HISTORY_AGE,
        }
    }
}

#[derive(Debug)]
struct Entry {
    incarnation: u64,
    event: Arc<Event>,
}

/// What a clustered feed knows of cluster time.
#[derive(Debug)]
struct Cluster {
    /// How far `since` may be from a revision this feed numbered.
    slack: Duration,
    /// The last watermark and when it arrived.
    watermark: Option<(Watermark, Instant)>,
    /// The last event of each dataplane numbered without a fresh watermark
    /// (none yet, or none for half the slack: the store could not be read).
    /// Their revisions may lie below the commit times of what they show, so
    /// the next watermark publishes them again ([`Feed::watermark`]).
    blind: HashMap<Key, Arc<Event>>,
}

impl Cluster {
    fn slack_us(&self) -> u64 {
        u64::try_from(self.slack.as_micros()).unwrap_or(u64::MAX)
    }

    fn fresh(&self, now: Instant) -> bool {
        self.watermark
            .is_some_and(|(_, at)| now.saturating_duration_since(at) <= self.slack / 2)
    }
}

/// The feed's state. Plain data: the caller passes the time.
#[derive(Debug)]
pub struct Feed {
    revision: Revision,
    /// Every change after this revision is in `history`.
    floor: Revision,
    history: VecDeque<(Instant, Arc<Event>)>,
    /// The last event of every dataplane (and zone) that exists.
    index: HashMap<Key, Entry>,
    /// Incarnations of deleted dataplanes, so a late change of an old task is ignored.
    deleted: HashMap<Key, u64>,
    limits: HistoryLimits,
    /// Clustered (PostgreSQL): revisions are cluster time.
    cluster: Option<Cluster>,
}

impl Feed {
    /// An embedded feed: revisions count from 1.
    pub fn new(limits: HistoryLimits) -> Feed {
        Feed {
            revision: 0,
            floor: 0,
            history: VecDeque::new(),
            index: HashMap::new(),
            deleted: HashMap::new(),
            limits,
            cluster: None,
        }
    }

    /// An embedded feed of a process that starts at `start` (microseconds
    /// since the UNIX epoch): revisions count up from there, and nothing
    /// before it can be replayed.
    pub fn starting_at(limits: HistoryLimits, start: Revision) -> Feed {
        Feed {
            revision: start,
            floor: start,
            ..Feed::new(limits)
        }
    }

    /// A feed of one instance of a cluster: revisions are cluster time once
    /// the first [`Feed::watermark`] arrives (they count from 1 before), and
    /// a `since` within `slack` of them is honoured.
    pub fn clustered(limits: HistoryLimits, slack: Duration) -> Feed {
        Feed {
            cluster: Some(Cluster {
                slack,
                watermark: None,
                blind: HashMap::new(),
            }),
            ..Feed::new(limits)
        }
    }

    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The oldest revision a watcher can resume from.
    pub fn floor(&self) -> Revision {
        self.floor
    }

    /// The last event of what `key` names, if it exists.
    pub fn get(&self, key: &Key) -> Option<&Arc<Event>> {
        self.index.get(key).map(|e| &e.event)
    }

    /// Applies a batch of changes: a burst of changes to one dataplane becomes
    /// one event (its last state), each with the next revision. Returns the
    /// new events, in revision order.
    pub fn apply(&mut self, changes: Vec<Change>, now: Instant) -> Vec<Arc<Event>> {
        let mut events = Vec::with_capacity(changes.len());
        let mut segment = Vec::with_capacity(changes.len());
        for change in changes {
            // A zone's deletion ends a segment: what its dataplanes did
            // before it is not coalesced with what a new zone of the same
            // name does after it.
            let barrier = change.kind == ChangeKind::Deleted
                && matches!(change.subject, Subject::Zone { .. });
            segment.push(change);
            if barrier {
                self.apply_segment(std::mem::take(&mut segment), now, &mut events);
            }
        }
        self.apply_segment(segment, now, &mut events);
        self.evict(now);
        events
    }

    fn apply_segment(&mut self, changes: Vec<Change>, now: Instant, events: &mut Vec<Arc<Event>>) {
        let mut order: Vec<Key> = Vec::new();
        let mut last: HashMap<Key, Change> = HashMap::new();
        for change in changes {
            let key = change.subject.key();
            let current = last
                .get(&key)
                .map(|c| c.incarnation)
                .or_else(|| self.index.get(&key).map(|e| e.incarnation))
                .or_else(|| self.deleted.get(&key).copied());
            if current.is_some_and(|inc| change.incarnation < inc) {
                continue; // a late change from a task that was replaced
            }
            if !last.contains_key(&key) {
                order.push(key.clone());
            }
            last.insert(key, change);
        }
        for key in order {
            if let Some(change) = last.remove(&key) {
                self.commit(key, change, now, events);
            }
        }
    }

    /// Numbers one change, records it and pushes its event.
    fn commit(&mut self, key: Key, change: Change, now: Instant, events: &mut Vec<Arc<Event>>) {
        self.revision = self.next_revision(change.at_least);
        let event = Arc::new(Event {
            revision: self.revision,
            kind: change.kind,
            ready: change.ready && change.kind == ChangeKind::Changed,
            subject: change.subject,
        });
        if let Some(cluster) = &mut self.cluster {
            if change.at_least == 0 && !cluster.fresh(now) {
                cluster.blind.insert(key.clone(), event.clone());
            } else {
                cluster.blind.remove(&key);
            }
        }
        match change.kind {
            ChangeKind::Changed => {
                self.deleted.remove(&key);
                self.index.insert(
                    key,
                    Entry {
                        incarnation: change.incarnation,
                        event: event.clone(),
                    },
                );
            }
            ChangeKind::Deleted => {
                if let Key::Zone(zone) = &key {
                    // The zone's dataplanes go with it, in this one event.
                    let gone = |k: &Key| matches!(k, Key::Remote(z, _) if z == zone);
                    self.index.retain(|k, _| !gone(k));
                    self.deleted.retain(|k, _| !gone(k));
                    if let Some(cluster) = &mut self.cluster {
                        cluster.blind.retain(|k, _| !gone(k));
                    }
                }
                self.index.remove(&key);
                self.deleted.insert(key, change.incarnation);
            }
        }
        self.history.push_back((now, event.clone()));
        events.push(event);
    }

    /// The revision of the next event: the next number, and (clustered) no
    /// lower than the watermark and `at_least`.
    fn next_revision(&self, at_least: Revision) -> Revision {
        let next = self.revision + 1;
        match &self.cluster {
            None => next,
            Some(c) => next.max(c.watermark.map_or(0, |(w, _)| w)).max(at_least),
        }
    }

    /// Clustered: a read of the store at `watermark` has completed and every
    /// change it brought is already in this feed (it arrives behind them).
    /// The feed's revision moves up to it (a watcher subscribing now is up
    /// to date as of the watermark, also while nothing changes), and later
    /// events are numbered above it. The dataplanes whose last event was
    /// numbered without a fresh watermark are published again, with their
    /// current state and a revision from the watermark on; these new events
    /// are returned. An embedded feed ignores watermarks.
    pub fn watermark(&mut self, watermark: Watermark, now: Instant) -> Vec<Arc<Event>> {
        let Some(cluster) = &mut self.cluster else {
            return Vec::new();
        };
        if cluster.watermark.is_none() {
            // The first read of the store: what changed before it (a
            // deletion on another instance, say) is not in this history.
            self.floor = self.floor.max(watermark);
        }
        cluster.watermark = Some((watermark, now));
        if cluster.blind.is_empty() {
            self.revision = self.revision.max(watermark);
            return Vec::new();
        }
        let mut blind: Vec<(Key, Arc<Event>)> = cluster.blind.drain().collect();
        blind.sort_by(|a, b| a.0.cmp(&b.0));
        let mut events = Vec::with_capacity(blind.len());
        for (key, old) in blind {
            self.revision = self.next_revision(0);
            let event = Arc::new(Event {
                revision: self.revision,
                ..(*old).clone()
            });
            if let Some(entry) = self.index.get_mut(&key) {
                entry.event = event.clone();
            }
            self.history.push_back((now, event.clone()));
            events.push(event);
        }
        self.revision = self.revision.max(watermark);
        self.evict(now);
        events
    }

    /// How far a `since` may be from this feed's revisions: the resume
    /// slack when clustered, 0 embedded.
    pub fn slack(&self) -> Revision {
        self.cluster.as_ref().map_or(0, Cluster::slack_us)
    }

    fn evict(&mut self, now: Instant) {
        while let Some((at, event)) = self.history.front() {
            let too_many = self.history.len() > self.limits.changes;
            let too_old = now.saturating_duration_since(*at) > self.limits.age;
            if !too_many && !too_old {
                break;
            }
            self.floor = event.revision;
            self.history.pop_front();
        }
    }

    /// Every matching dataplane (and zone) that exists: this hdsd's own
    /// sorted by mesh and name, then each zone's, then the zones.
    pub fn snapshot(&self, filter: &Filter) -> Vec<Arc<Event>> {
        let mut items: Vec<(&Key, Arc<Event>)> = self
            .index
            .iter()
            .filter(|(_, e)| filter.matches_subject(&e.event.subject))
            .map(|(k, e)| (k, e.event.clone()))
            .collect();
        items.sort_by(|a, b| a.0.cmp(b.0));
        items.into_iter().map(|(_, e)| e).collect()
    }

    /// What changed after `since - slack` for the dataplanes `filter`
    /// matches, one event per dataplane (its last), in revision order; or why
    /// the history cannot tell: `since` is further ahead of this feed's
    /// revision than the slack, or `since - slack` is below the history's
    /// floor. The slack is 0 embedded ([`Feed::slack`]).
    pub fn since(&self, since: Revision, filter: &Filter) -> Result<Vec<Arc<Event>>, ResyncReason> {
        if self.cluster.as_ref().is_some_and(|c| c.watermark.is_none()) {
            // Clustered, before the first read of the store: nothing here
            // proves what changed elsewhere (a deletion on another
            // instance), so no resume can be complete yet.
            return Err(ResyncReason::UnknownRevision);
        }
        let slack = self.slack();
        if since > self.revision.saturating_add(slack) {
            return Err(ResyncReason::UnknownRevision);
        }
        let since = since.saturating_sub(slack);
        if since < self.floor {
            return Err(ResyncReason::TooOld);
        }
        let start = self.history.partition_point(|(_, e)| e.revision <= since);
        let mut latest: HashMap<Key, &Arc<Event>> = HashMap::new();
        let mut zones_deleted: Vec<&Arc<Event>> = Vec::new();
        for (_, e) in self.history.range(start..) {
            if !filter.matches_subject(&e.subject) {
                continue;
            }
            if let (ChangeKind::Deleted, Subject::Zone { zone, .. }) = (e.kind, &e.subject) {
                // Never coalesced away: it is the only word of its
                // dataplanes' deletion. What the zone did before it is moot.
                latest.retain(|k, _| match k {
                    Key::Remote(z, _) | Key::Zone(z) => z != zone,
                    Key::Local(_) => true,
                });
                zones_deleted.push(e);
                continue;
            }
            latest.insert(e.key(), e);
        }
        let mut events: Vec<Arc<Event>> =
            latest.into_values().chain(zones_deleted).cloned().collect();
        events.sort_by_key(|e| e.revision);
        Ok(events)
    }

    /// The first messages of a watch: a replay after `since` then SYNCED, or
    /// (without `since`, or when the history cannot tell) a SNAPSHOT then
    /// SYNCED, preceded by RESYNC when `since` could not be honoured.
    pub fn subscribe(&self, since: Option<Revision>, filter: &Filter) -> Vec<Message> {
        let mut out = Vec::new();
        if let Some(since) = since {
            match self.since(since, filter) {
                Ok(events) => {
                    out.extend(events.into_iter().map(Message::Event));
                    out.push(Message::Synced {
                        revision: self.revision,
                    });
                    return out;
                }
                Err(reason) => out.push(Message::Resync(reason)),
            }
        }
        out.push(Message::Snapshot {
            revision: self.revision,
            items: self.snapshot(filter),
        });
        out.push(Message::Synced {
            revision: self.revision,
        });
        out
    }
}

/// A batch of new events, as broadcast to every watcher.
pub type Batch = Arc<Vec<Arc<Event>>>;

/// Batches a watcher may fall behind before it gets RESYNC.
pub const WATCHER_BUFFER: usize = 1024;

enum Input {
    Change(Change),
    Watermark(Watermark),
    Subscribe {
        since: Option<Revision>,
        filter: Filter,
        reply: oneshot::Sender<(Vec<Message>, broadcast::Receiver<Batch>)>,
    },
    Index {
        reply: oneshot::Sender<Index>,
    },
}

/// The feed's revision and every dataplane's last revision: this hdsd's
/// own, and on a global each zone's.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub revision: Revision,
    pub dataplanes: HashMap<DataplaneId, Revision>,
    pub remote: HashMap<(Arc<str>, DataplaneId), Revision>,
}

/// Sends changes to the feed. Cheap to clone; sending never waits.
#[derive(Debug, Clone)]
pub struct FeedSender {
    tx: mpsc::UnboundedSender<Input>,
}

impl FeedSender {
    pub fn publish(&self, change: Change) {
        // The feed ends only with the process.
        let _ = self.tx.send(Input::Change(change));
    }

    /// Tells a clustered feed that a store read at `watermark` completed.
    /// Send it only once every change that read brought has been published:
    /// it is ordered behind them.
    pub fn watermark(&self, watermark: Watermark) {
        let _ = self.tx.send(Input::Watermark(watermark));
    }
}

/// The feed is gone (the process is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the change feed has stopped (hdsd is shutting down)")]
pub struct FeedClosed;

/// Reads the feed. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FeedHandle {
    tx: mpsc::UnboundedSender<Input>,
    drain: Option<tokio::sync::watch::Receiver<bool>>,
    /// The revision of the last event broadcast.
    broadcast: tokio::sync::watch::Receiver<Revision>,
}

impl FeedHandle {
    /// The same feed, whose watches end once `drain` turns true (shutdown).
    pub fn until(self, drain: tokio::sync::watch::Receiver<bool>) -> FeedHandle {
        FeedHandle {
            drain: Some(drain),
            ..self
        }
    }

    /// Completes when watches must end (never without [`FeedHandle::until`]).
    pub async fn drained(&self) {
        match self.drain.clone() {
            Some(mut drain) => {
                let _ = drain.wait_for(|d| *d).await;
            }
            None => std::future::pending().await,
        }
    }

    pub fn sender(&self) -> FeedSender {
        FeedSender {
            tx: self.tx.clone(),
        }
    }

    /// The first messages of a watch, and a receiver of every batch after them.
    pub async fn subscribe(
        &self,
        since: Option<Revision>,
        filter: Filter,
    ) -> Result<(Vec<Message>, broadcast::Receiver<Batch>), FeedClosed> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Input::Subscribe {
                since,
                filter,
                reply,
            })
            .map_err(|_| FeedClosed)?;
        rx.await.map_err(|_| FeedClosed)
    }

    /// The revision of the last event broadcast (0: none yet): a
    /// subscriber that has applied every batch up to it has seen every
    /// change the feed had numbered when this was read.
    pub fn broadcast_revision(&self) -> Revision {
        *self.broadcast.borrow()
    }

    /// The current revision and each dataplane's last revision.
    pub async fn index(&self) -> Result<Index, FeedClosed> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Input::Index { reply })
            .map_err(|_| FeedClosed)?;
        rx.await.map_err(|_| FeedClosed)
    }
}

/// Changes read in one go at most: one batch, one broadcast.
const MAX_BATCH: usize = 4096;

/// Starts the feed's task, its single writer, for a test: hdsd itself
/// hands the task to its supervisor ([`start`]). A watcher may fall
/// `buffer` batches behind before it gets RESYNC ([`WATCHER_BUFFER`] in
/// hdsd).
#[cfg(test)]
pub fn spawn(limits: HistoryLimits, buffer: usize) -> FeedHandle {
    let (handle, task) = start(Feed::new(limits), buffer);
    tokio::spawn(task);
    handle
}

/// The handle of a given feed (embedded or clustered) and its task, the
/// feed's single writer, for the caller to run (the server supervises it).
/// The task ends once every handle is dropped.
pub fn start(
    feed: Feed,
    buffer: usize,
) -> (
    FeedHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (events, _) = broadcast::channel(buffer.max(1));
    let (last, broadcast) = tokio::sync::watch::channel(0);
    let task = run(feed, rx, Broadcast { events, last });
    (
        FeedHandle {
            tx,
            drain: None,
            broadcast,
        },
        task,
    )
}

/// Where the feed's batches go: every subscriber, and the revision of the
/// last event sent (set after the batch is sent, so a reader of it finds
/// the batch in its receiver).
struct Broadcast {
    events: broadcast::Sender<Batch>,
    last: tokio::sync::watch::Sender<Revision>,
}

async fn run(mut feed: Feed, mut inputs: mpsc::UnboundedReceiver<Input>, events: Broadcast) {
    let mut buffer = Vec::with_capacity(MAX_BATCH);
    loop {
        if inputs.recv_many(&mut buffer, MAX_BATCH).await == 0 {
            return;
        }
        let mut changes = Vec::new();
        for input in buffer.drain(..) {
            match input {
                Input::Change(c) => changes.push(c),
                Input::Watermark(w) => {
                    // Behind the changes before it: they keep their numbers.
                    publish(&mut feed, std::mem::take(&mut changes), &events);
                    let again = feed.watermark(w, Instant::now());
                    broadcast_batch(again, &events);
                }
                other => {
                    // Changes before a subscription are published first, so
                    // the subscriber's snapshot and its live events meet exactly.
                    publish(&mut feed, std::mem::take(&mut changes), &events);
                    answer(&feed, other, &events);
                }
            }
        }
        publish(&mut feed, changes, &events);
    }
}

fn publish(feed: &mut Feed, changes: Vec<Change>, events: &Broadcast) {
    if changes.is_empty() {
        return;
    }
    let batch = feed.apply(changes, Instant::now());
    broadcast_batch(batch, events);
}

fn broadcast_batch(batch: Vec<Arc<Event>>, events: &Broadcast) {
    if let Some(last) = batch.iter().map(|e| e.revision).max() {
        crate::metrics::feed_changes(batch.len());
        // No receiver is fine: nobody watches.
        let _ = events.events.send(Arc::new(batch));
        events.last.send_if_modified(|l| {
            let moved = last > *l;
            *l = (*l).max(last);
            moved
        });
    }
}

fn answer(feed: &Feed, input: Input, events: &Broadcast) {
    match input {
        Input::Change(_) | Input::Watermark(_) => {}
        Input::Subscribe {
            since,
            filter,
            reply,
        } => {
            let _ = reply.send((feed.subscribe(since, &filter), events.events.subscribe()));
        }
        Input::Index { reply } => {
            let mut index = Index {
                revision: feed.revision,
                ..Index::default()
            };
            for (key, e) in &feed.index {
                match key {
                    Key::Local(id) => {
                        index.dataplanes.insert(id.clone(), e.event.revision);
                    }
                    Key::Remote(zone, id) => {
                        index
                            .remote
                            .insert((zone.clone(), id.clone()), e.event.revision);
                    }
                    Key::Zone(_) => {}
                }
            }
            let _ = reply.send(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;

    fn dp(name: &str, service: &str) -> Arc<Dataplane> {
        let text = format!("type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {{kuma.io/service: {service}}}\n");
        Arc::new(parse_documents(&text).unwrap().remove(0))
    }

    fn changed(d: &Arc<Dataplane>, ready: bool) -> Change {
        Change {
            subject: Subject::Local(d.clone()),
            incarnation: 1,
            kind: ChangeKind::Changed,
            ready,
            at_least: 0,
        }
    }

    fn names(events: &[Arc<Event>]) -> Vec<(String, Revision)> {
        events
            .iter()
            .map(|e| (e.subject.mesh_name().unwrap().1.to_string(), e.revision))
            .collect()
    }

    #[test]
    fn a_burst_to_one_dataplane_becomes_one_event_with_its_last_state() {
        let mut feed = Feed::new(HistoryLimits::default());
        let (a, b) = (dp("a", "web"), dp("b", "web"));
        let t = Instant::now();
        let events = feed.apply(
            vec![
                changed(&a, false),
                changed(&b, false),
                changed(&a, true),
                changed(&a, false),
                changed(&a, true),
            ],
            t,
        );
        assert_eq!(names(&events), [("a".into(), 1), ("b".into(), 2)]);
        assert!(events[0].ready, "the last state of the burst wins");
        assert_eq!(feed.revision(), 2);
        // Nothing is dropped: every dataplane that changed has its event.
        let all = feed.since(0, &Filter::default()).unwrap();
        assert_eq!(names(&all), [("a".into(), 1), ("b".into(), 2)]);
    }

    #[test]
    fn resume_inside_the_history_replays_only_what_came_after() {
        let mut feed = Feed::new(HistoryLimits::default());
        let (a, b, c) = (dp("a", "web"), dp("b", "api"), dp("c", "web"));
        let t = Instant::now();
        feed.apply(vec![changed(&a, false)], t); // 1
        feed.apply(vec![changed(&b, false)], t); // 2
        feed.apply(vec![changed(&c, true)], t); // 3
        feed.apply(vec![changed(&a, true)], t); // 4
        let m = feed.subscribe(Some(2), &Filter::default());
        assert_eq!(
            m,
            vec![
                Message::Event(feed.get(&Key::Local(c.id.clone())).unwrap().clone()),
                Message::Event(feed.get(&Key::Local(a.id.clone())).unwrap().clone()),
                Message::Synced { revision: 4 },
            ]
        );
        // Up to date: nothing to replay, just SYNCED.
        assert_eq!(
            feed.subscribe(Some(4), &Filter::default()),
            vec![Message::Synced { revision: 4 }]
        );
        // A selector narrows the replay.
        let web = Filter {
            selector: [("kuma.io/service".into(), "api".into())].into(),
            ..Default::default()
        };
        assert_eq!(
            feed.subscribe(Some(1), &web),
            vec![
                Message::Event(feed.get(&Key::Local(b.id.clone())).unwrap().clone()),
                Message::Synced { revision: 4 }
            ]
        );
    }

    #[test]
    fn resume_outside_the_history_resyncs_with_a_snapshot() {
        let limits = HistoryLimits {
            changes: 2,
            age: Duration::from_secs(300),
        };
        let mut feed = Feed::new(limits);
        let (a, b, c) = (dp("a", "web"), dp("b", "web"), dp("c", "web"));
        let t = Instant::now();
        for d in [&a, &b, &c] {
            feed.apply(vec![changed(d, true)], t);
        }
        assert_eq!(feed.floor(), 1, "revision 1 fell out of the history");
        assert!(feed.since(1, &Filter::default()).is_ok());
        let m = feed.subscribe(Some(0), &Filter::default());
        assert_eq!(m[0], Message::Resync(ResyncReason::TooOld));
        let Message::Snapshot { revision, items } = &m[1] else {
            panic!("a snapshot follows RESYNC: {m:?}");
        };
        assert_eq!(*revision, 3);
        assert_eq!(
            names(items),
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
        );
        assert_eq!(m[2], Message::Synced { revision: 3 });
        // A revision from before a restart is unknown to this process.
        let m = feed.subscribe(Some(99), &Filter::default());
        assert_eq!(m[0], Message::Resync(ResyncReason::UnknownRevision));
        // History older than its age limit goes too.
        feed.apply(vec![changed(&a, false)], t + Duration::from_secs(301));
        assert_eq!(feed.floor(), 3);
    }

    #[test]
    fn deleted_dataplanes_leave_the_snapshot_and_late_changes_of_old_tasks_are_ignored() {
        let mut feed = Feed::new(HistoryLimits::default());
        let a = dp("a", "web");
        let t = Instant::now();
        feed.apply(vec![changed(&a, true)], t);
        // Removed (task 1) and added again (task 2); task 1's deletion arrives late.
        let again = Change {
            incarnation: 2,
            ..changed(&a, false)
        };
        let late_delete = Change {
            kind: ChangeKind::Deleted,
            ..changed(&a, false)
        };
        feed.apply(vec![again], t);
        assert!(feed.apply(vec![late_delete.clone()], t).is_empty());
        assert_eq!(feed.snapshot(&Filter::default()).len(), 1);
        // Task 2's deletion counts.
        let events = feed.apply(
            vec![Change {
                incarnation: 2,
                ..late_delete
            }],
            t,
        );
        assert_eq!(events[0].kind, ChangeKind::Deleted);
        assert!(!events[0].ready);
        assert!(feed.snapshot(&Filter::default()).is_empty());
    }

    const S: u64 = 1_000_000; // a second in cluster revisions (microseconds)

    fn clustered() -> Feed {
        Feed::clustered(HistoryLimits::default(), Duration::from_secs(10))
    }

    /// The finding of the attack review: watch on A at R, web-02 deleted
    /// through B, a fresh instance C started; `Watch(since = R)` on C must
    /// not replay web-01 alone (C never saw web-02's deletion): RESYNC.
    #[test]
    fn a_fresh_instance_cannot_prove_a_replay_from_before_it_started() {
        let mut c = clustered();
        let t = Instant::now();
        let web01 = dp("default", "web-01");
        // C's first load (web-02 is already gone), then its first read.
        c.apply(vec![changed(&web01, true)], t);
        c.watermark(200 * S, t);
        let r = 150 * S; // A's revision, before C started
        assert_eq!(c.since(r, &Filter::default()), Err(ResyncReason::TooOld));
        let m = c.subscribe(Some(r), &Filter::default());
        assert_eq!(m[0], Message::Resync(ResyncReason::TooOld));
        assert!(matches!(m[1], Message::Snapshot { .. }));
        // From C's own time on (beyond the slack), it replays.
        let e = c.apply(vec![changed(&web01, false)], t);
        let r = e[0].revision;
        assert!(c.since(r + 10 * S, &Filter::default()).is_ok());
        assert_eq!(c.floor(), 200 * S);
    }

    /// An embedded feed's revisions start at its process's start: a revision
    /// of an earlier process (hdsd restarted) is below the floor, never
    /// taken for one of this process.
    #[test]
    fn an_embedded_feed_counts_from_its_start_and_refuses_what_came_before() {
        let start = 1_700_000_000 * S;
        let mut feed = Feed::starting_at(HistoryLimits::default(), start);
        let t = Instant::now();
        let e = feed.apply(vec![changed(&dp("a", "web"), true)], t);
        assert_eq!(e[0].revision, start + 1);
        assert_eq!(feed.since(start, &Filter::default()).unwrap().len(), 1);
        assert_eq!(
            feed.since(start - 1, &Filter::default()),
            Err(ResyncReason::TooOld)
        );
        assert_eq!(feed.since(5, &Filter::default()), Err(ResyncReason::TooOld));
    }

    #[test]
    fn an_embedded_feed_ignores_watermarks_and_has_no_slack() {
        let mut feed = Feed::new(HistoryLimits::default());
        let t = Instant::now();
        assert!(feed.watermark(1_700_000_000 * S, t).is_empty());
        let a = dp("a", "web");
        let events = feed.apply(
            vec![Change {
                at_least: 99 * S,
                ..changed(&a, true)
            }],
            t,
        );
        assert_eq!(names(&events), [("a".into(), 1)]);
        assert_eq!(feed.slack(), 0);
        assert_eq!(
            feed.since(2, &Filter::default()),
            Err(ResyncReason::UnknownRevision)
        );
    }

    #[test]
    fn clustered_revisions_are_the_next_number_or_the_watermark_and_never_go_back() {
        let mut feed = clustered();
        let (a, b) = (dp("a", "web"), dp("b", "web"));
        let t = Instant::now();
        // Before the first watermark the counter counts from 1.
        feed.apply(vec![changed(&a, false)], t);
        assert_eq!(feed.revision(), 1);
        // The first watermark: what was numbered without one is published
        // again, from cluster time on.
        let again = feed.watermark(100 * S, t);
        assert_eq!(names(&again), [("a".into(), 100 * S)]);
        let e = feed.apply(vec![changed(&b, true)], t);
        assert_eq!(names(&e), [("b".into(), 100 * S + 1)]);
        // A watermark behind the revision: still strictly increasing.
        assert!(feed.watermark(50 * S, t).is_empty());
        assert_eq!(feed.revision(), 100 * S + 1);
        let e = feed.apply(vec![changed(&a, true), changed(&b, false)], t);
        assert_eq!(
            names(&e),
            [("a".into(), 100 * S + 2), ("b".into(), 100 * S + 3)]
        );
        // A watermark ahead moves the revision while nothing changes, and
        // the next event comes after it.
        assert!(feed.watermark(103 * S, t).is_empty());
        assert_eq!(feed.revision(), 103 * S);
        assert_eq!(
            feed.subscribe(Some(103 * S), &Filter::default()).last(),
            Some(&Message::Synced { revision: 103 * S })
        );
        let e = feed.apply(vec![changed(&a, false)], t);
        assert_eq!(names(&e), [("a".into(), 103 * S + 1)]);
        // A change read from the store is numbered no lower than its read.
        let e = feed.apply(
            vec![Change {
                at_least: 104 * S,
                ..changed(&b, true)
            }],
            t,
        );
        assert_eq!(names(&e), [("b".into(), 104 * S)]);
        let e = feed.apply(vec![changed(&a, true)], t);
        assert_eq!(names(&e), [("a".into(), 104 * S + 1)]);
        // The index agrees with the events.
        assert_eq!(
            feed.get(&Key::Local(a.id.clone())).unwrap().revision,
            104 * S + 1
        );
    }

    #[test]
    fn clustered_since_replays_within_the_slack_and_accepts_a_revision_slightly_ahead() {
        let mut feed = clustered();
        assert_eq!(feed.slack(), 10 * S);
        let (a, b, c) = (dp("a", "web"), dp("b", "web"), dp("c", "web"));
        let t = Instant::now();
        // Changes read from the store at 100 s, 105 s and 112 s.
        for (d, w) in [(&a, 100), (&b, 105), (&c, 112)] {
            feed.apply(
                vec![Change {
                    at_least: w * S,
                    ..changed(d, true)
                }],
                t,
            );
            feed.watermark(w * S, t);
        }
        assert_eq!(feed.revision(), 112 * S);
        let all = Filter::default();
        // Another instance's 110 s: every dataplane changed after 100 s, once.
        assert_eq!(
            names(&feed.since(110 * S, &all).unwrap()),
            [("b".into(), 105 * S), ("c".into(), 112 * S)]
        );
        // Our own revision: the slack's worth again (harmless: levels).
        assert_eq!(
            names(&feed.since(112 * S, &all).unwrap()),
            [("b".into(), 105 * S), ("c".into(), 112 * S)]
        );
        // Slightly ahead of us (another instance read the clock later):
        // accepted, the last slack replayed, and the watch goes on live.
        let m = feed.subscribe(Some(117 * S), &all);
        assert_eq!(
            m,
            vec![
                Message::Event(feed.get(&Key::Local(c.id.clone())).unwrap().clone()),
                Message::Synced { revision: 112 * S },
            ]
        );
        assert!(feed.since(122 * S, &all).unwrap().is_empty());
        // Further ahead than the slack: unknown here.
        assert_eq!(
            feed.since(122 * S + 1, &all),
            Err(ResyncReason::UnknownRevision)
        );
        let m = feed.subscribe(Some(200 * S), &all);
        assert_eq!(m[0], Message::Resync(ResyncReason::UnknownRevision));
        assert!(matches!(m[1], Message::Snapshot { .. }));
        // Watermarks move the revision on while nothing changes: a revision
        // of another instance a minute later is known here then.
        feed.watermark(172 * S, t);
        assert!(feed.since(180 * S, &all).unwrap().is_empty());
    }

    #[test]
    fn clustered_since_is_too_old_once_its_slack_reaches_below_the_floor() {
        let limits = HistoryLimits {
            changes: 2,
            age: Duration::from_secs(300),
        };
        let mut feed = Feed::clustered(limits, Duration::from_secs(10));
        let t = Instant::now();
        for (i, w) in [100, 120, 140].into_iter().enumerate() {
            feed.watermark(w * S, t);
            feed.apply(vec![changed(&dp(&format!("d{i}"), "web"), true)], t);
        }
        assert_eq!(feed.floor(), 100 * S + 1, "the first event fell out");
        let all = Filter::default();
        assert_eq!(
            names(&feed.since(110 * S + 1, &all).unwrap()),
            [("d1".into(), 120 * S + 1), ("d2".into(), 140 * S + 1)]
        );
        assert_eq!(feed.since(110 * S, &all), Err(ResyncReason::TooOld));
        assert_eq!(feed.since(5, &all), Err(ResyncReason::TooOld));
    }

    #[test]
    fn clustered_changes_numbered_without_a_fresh_watermark_are_published_again_at_the_next() {
        let mut feed = clustered();
        let (a, b, c) = (dp("a", "web"), dp("b", "web"), dp("c", "web"));
        let t = Instant::now();
        feed.watermark(100 * S, t);
        feed.apply(vec![changed(&a, true), changed(&b, true)], t);
        // Within half the slack of the watermark: numbered by it, not again.
        let t1 = t + Duration::from_secs(5);
        feed.apply(vec![changed(&a, false)], t1);
        assert!(feed.watermark(106 * S, t1).is_empty());
        // The store cannot be read for a while: these are numbered blind...
        let t2 = t1 + Duration::from_secs(6);
        feed.apply(vec![changed(&b, false)], t2);
        let deleted = Change {
            kind: ChangeKind::Deleted,
            ..changed(&a, false)
        };
        feed.apply(vec![deleted], t2);
        // ...unless the change came from a store read, numbered by its watermark.
        feed.apply(
            vec![Change {
                at_least: 111 * S,
                ..changed(&c, true)
            }],
            t2,
        );
        // The next watermark publishes the blind ones again with their
        // current state, numbered from it.
        let again = feed.watermark(200 * S, t2 + Duration::from_secs(60));
        assert_eq!(
            names(&again),
            [("a".into(), 200 * S), ("b".into(), 200 * S + 1)]
        );
        assert_eq!(again[0].kind, ChangeKind::Deleted);
        assert!(!again[1].ready);
        assert_eq!(
            feed.get(&Key::Local(b.id.clone())).unwrap().revision,
            200 * S + 1
        );
        assert!(feed.get(&Key::Local(a.id.clone())).is_none());
        // A consumer of another instance at 195 s gets both; c is older.
        assert_eq!(
            names(&feed.since(195 * S, &Filter::default()).unwrap()),
            [("a".into(), 200 * S), ("b".into(), 200 * S + 1)]
        );
        // Once published again, not again.
        assert!(feed
            .watermark(201 * S, t2 + Duration::from_secs(61))
            .is_empty());
    }

    #[test]
    fn filters_match_mesh_names_and_a_selector_on_one_inbound() {
        let a = dp("a", "web");
        let mut f = Filter {
            mesh: Some("default".into()),
            names: ["a".to_string()].into(),
            selector: [("kuma.io/service".into(), "web".into())].into(),
            zones: Zones::Local,
        };
        assert!(f.matches(&a));
        f.selector.insert("version".into(), "v2".into());
        assert!(!f.matches(&a));
        assert!(!Filter {
            mesh: Some("other".into()),
            ..Default::default()
        }
        .matches(&a));
    }

    /// Found by the cluster contract: a clustered feed that has not read the
    /// store yet answered a resume with SYNCED and no replay.
    #[test]
    fn a_clustered_feed_resumes_nothing_before_its_first_watermark() {
        let mut feed = Feed::clustered(HistoryLimits::default(), Duration::from_secs(10));
        let start = feed.subscribe(Some(1), &Filter::default());
        assert!(
            matches!(
                start.first(),
                Some(Message::Resync(ResyncReason::UnknownRevision))
            ),
            "{start:?}"
        );
        // Once it has read the store, a resume after that read replays.
        feed.watermark(5_000_000_000, Instant::now());
        feed.watermark(5_020_000_000, Instant::now());
        let replay = feed.since(5_020_000_000, &Filter::default());
        assert_eq!(replay.map(|e| e.len()), Ok(0));
    }

    fn remote(zone: &str, name: &str, kind: ChangeKind) -> Change {
        Change {
            subject: Subject::Remote {
                zone: Arc::from(zone),
                dataplane: Arc::new(pb::Dataplane {
                    mesh: "default".into(),
                    name: name.into(),
                    ..Default::default()
                }),
            },
            incarnation: 0,
            kind,
            ready: true,
            at_least: 0,
        }
    }

    fn zone(zone: &str, kind: ChangeKind) -> Change {
        Change {
            subject: Subject::Zone {
                zone: Arc::from(zone),
                state: "online",
            },
            incarnation: 0,
            kind,
            ready: false,
            at_least: 0,
        }
    }

    /// What a snapshot holds: (zone or "", name or "") per item.
    fn held(feed: &Feed, filter: &Filter) -> Vec<(String, String)> {
        feed.snapshot(filter)
            .iter()
            .map(|e| {
                (
                    e.subject.zone().map(|z| z.to_string()).unwrap_or_default(),
                    e.subject
                        .mesh_name()
                        .map(|(_, n)| n.to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    fn zones(z: Zones) -> Filter {
        Filter {
            zones: z,
            ..Filter::default()
        }
    }

    fn pair(zone: &str, name: &str) -> (String, String) {
        (zone.into(), name.into())
    }

    /// On a global: the same name in the global and in a zone is two
    /// dataplanes; filters take this hdsd's own by default, every zone's
    /// with `All`, one zone's with `Only`.
    #[test]
    fn zones_dataplanes_are_their_own_keys_and_filters_choose_whose() {
        let mut feed = Feed::new(HistoryLimits::default());
        let t = Instant::now();
        let web = dp("web", "web");
        feed.apply(
            vec![
                changed(&web, true),
                zone("eu-1", ChangeKind::Changed),
                remote("eu-1", "web", ChangeKind::Changed),
                remote("us-1", "api", ChangeKind::Changed),
            ],
            t,
        );
        assert_eq!(held(&feed, &Filter::default()), [pair("", "web")]);
        assert_eq!(
            held(&feed, &zones(Zones::All)),
            [
                pair("", "web"),
                pair("eu-1", "web"),
                pair("us-1", "api"),
                pair("eu-1", "")
            ]
        );
        assert_eq!(
            held(&feed, &zones(Zones::Only("eu-1".into()))),
            [pair("eu-1", "web"), pair("eu-1", "")]
        );
        let mesh = Filter {
            names: ["api".to_string()].into(),
            ..zones(Zones::All)
        };
        assert_eq!(
            held(&feed, &mesh),
            [pair("us-1", "api"), pair("eu-1", "")],
            "a zone's state is not narrowed by names"
        );
    }

    /// A deleted zone is one event; its dataplanes leave the snapshot with
    /// it, and a zone of the same name after it starts empty.
    #[test]
    fn a_deleted_zone_takes_its_dataplanes_in_one_event() {
        let mut feed = Feed::new(HistoryLimits::default());
        let t = Instant::now();
        feed.apply(
            vec![
                zone("eu-1", ChangeKind::Changed),
                remote("eu-1", "a", ChangeKind::Changed),
                remote("eu-1", "b", ChangeKind::Changed),
            ],
            t,
        );
        let before = feed.revision();
        let events = feed.apply(
            vec![
                remote("eu-1", "a", ChangeKind::Changed),
                zone("eu-1", ChangeKind::Deleted),
                zone("eu-1", ChangeKind::Changed),
                remote("eu-1", "c", ChangeKind::Changed),
            ],
            t,
        );
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(
            held(&feed, &zones(Zones::All)),
            [pair("eu-1", "c"), pair("eu-1", "")]
        );
        // A resume from before: the deletion is replayed (the consumer
        // drops a and b), then the zone and c as they are now.
        let replay = feed.since(before, &zones(Zones::All)).unwrap();
        let kinds: Vec<_> = replay.iter().map(|e| (e.kind, e.key())).collect();
        let eu: Arc<str> = Arc::from("eu-1");
        assert_eq!(
            kinds,
            [
                (ChangeKind::Deleted, Key::Zone(eu.clone())),
                (ChangeKind::Changed, Key::Zone(eu.clone())),
                (
                    ChangeKind::Changed,
                    Key::Remote(eu, DataplaneId::new("default", "c"))
                ),
            ]
        );
    }
}
