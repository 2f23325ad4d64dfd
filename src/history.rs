//! The last hour of the fleet, as the page draws it: how many inbounds were
//! not ready (and why, by class) in every bucket of [`Limits::bucket`], the
//! zones by state (on a global), and each dataplane's and zone's status
//! changes with their exact times.
//!
//! [`History`] is plain data with fixed memory: one hour of buckets
//! (360 of 10 s), at most [`Limits::per_subject`] changes per dataplane or
//! zone and [`Limits::total`] in all (past a cap the oldest change goes and
//! the subject says from when its band is exact: `droppedUntil`). A bucket
//! keeps the counts at its end and the lowest ready / highest not ready
//! count within it, so a flap shorter than a bucket still shows.
//!
//! One task writes it ([`spawn`]): it follows the change feed (this hdsd's
//! own dataplanes, read from the registry as the API shows them) and, on a
//! global, the hub's [`ZonesView`] (the zones and their dataplanes); it rolls
//! the buckets on a timer. Readers ask it through a [`HistoryHandle`] and get
//! a snapshot of the fleet or of one subject.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::clock::{Clock, Timestamp};
use crate::feed::{ChangeKind, FeedHandle, Filter, Key, Subject};
use crate::registry::{catalog_changes, Catalog, Registry};
use crate::view::{DataplaneItem, InboundItem};
use crate::zones::hub::ZonesView;

/// The bounds of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// One sample per bucket of this length.
    pub bucket: Duration,
    /// How far back the history goes.
    pub span: Duration,
    /// Status changes kept per dataplane (and per zone).
    pub per_subject: usize,
    /// Status changes kept over all dataplanes (zones have their own
    /// budget of the same size).
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bucket: Duration::from_secs(10),
            span: Duration::from_secs(3600),
            per_subject: 64,
            total: 50_000,
        }
    }
}

/// Why an inbound is not ready, in the classes the timeline stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// The check fails (`unhealthy`, `timeout`).
    Unhealthy,
    /// Its check needs a newer Envoy.
    Unsupported,
    /// Its zone is disabled or offline past `global.offline_ttl`.
    ZoneWithdrawn,
    /// No report for `hds.stale_after`.
    Stale,
    /// `unknown`, `degraded`, or declared `NotReady` in its file.
    NotReady,
    /// The Envoy is draining.
    Draining,
    /// No report yet.
    Pending,
}

impl Class {
    /// Every class, worst first (a dataplane's status is its worst class).
    pub const ALL: [Class; 7] = [
        Class::Unhealthy,
        Class::Unsupported,
        Class::ZoneWithdrawn,
        Class::Stale,
        Class::NotReady,
        Class::Draining,
        Class::Pending,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Class::Unhealthy => "unhealthy",
            Class::Unsupported => "unsupported",
            Class::ZoneWithdrawn => "zone_withdrawn",
            Class::Stale => "stale",
            Class::NotReady => "not_ready",
            Class::Draining => "draining",
            Class::Pending => "pending",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The class of an inbound as the API shows it; `None` when ready.
    pub fn of(inbound: &InboundItem) -> Option<Class> {
        let health = &inbound.health;
        if health.ready {
            return None;
        }
        if health
            .reason
            .as_ref()
            .is_some_and(|r| r.code.starts_with("zone_"))
        {
            return Some(Class::ZoneWithdrawn);
        }
        Some(match health.status.as_str() {
            "unhealthy" | "timeout" => Class::Unhealthy,
            "unsupported" => Class::Unsupported,
            "stale" => Class::Stale,
            "draining" => Class::Draining,
            "pending" => Class::Pending,
            _ => Class::NotReady,
        })
    }
}

const CLASSES: usize = Class::ALL.len();

/// A zone's states, in the order of [`ZONE_STATES`].
const ZONE_STATES: [&str; 4] = ["online", "offline", "disabled", "never_connected"];

fn zone_index(state: &str) -> Option<usize> {
    ZONE_STATES.iter().position(|s| *s == state)
}

/// The status word of a dataplane that is ready.
pub const READY: &str = "ready";
/// The status word of a dataplane or zone that is gone.
pub const DELETED: &str = "deleted";

/// The fleet's counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    inbounds: u32,
    not_ready: [u32; CLASSES],
    zones: [u32; ZONE_STATES.len()],
}

impl Counts {
    fn not_ready(&self) -> u32 {
        self.not_ready.iter().sum()
    }
}

/// One bucket: the counts at its end, and their extremes within it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bucket {
    start: Timestamp,
    last: Counts,
    ready_min: u32,
    not_ready_max: u32,
    not_ready_max_by_class: [u32; CLASSES],
    zones_max: [u32; ZONE_STATES.len()],
}

impl Bucket {
    fn new(start: Timestamp, counts: Counts) -> Bucket {
        Bucket {
            start,
            last: counts,
            ready_min: counts.inbounds - counts.not_ready(),
            not_ready_max: counts.not_ready(),
            not_ready_max_by_class: counts.not_ready,
            zones_max: counts.zones,
        }
    }

    fn fold(&mut self, counts: Counts) {
        self.last = counts;
        self.ready_min = self.ready_min.min(counts.inbounds - counts.not_ready());
        self.not_ready_max = self.not_ready_max.max(counts.not_ready());
        for (max, n) in self.not_ready_max_by_class.iter_mut().zip(counts.not_ready) {
            *max = (*max).max(n);
        }
        for (max, n) in self.zones_max.iter_mut().zip(counts.zones) {
            *max = (*max).max(n);
        }
    }
}

/// One status change of a dataplane or a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    pub at: Timestamp,
    /// A dataplane: `ready`, its worst [`Class`], or `deleted`; a zone:
    /// its state or `deleted`.
    pub status: &'static str,
    /// A dataplane's inbounds not ready, and in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbounds: Option<u32>,
}

/// The changes kept of one subject.
#[derive(Debug, Default)]
struct Track {
    /// The status before the first change kept (`None`: not seen before it).
    before: Option<&'static str>,
    /// A cap dropped changes up to this time: the band is exact after it.
    dropped_until: Option<Timestamp>,
    changes: VecDeque<(u64, Transition)>,
}

impl Track {
    fn last(&self) -> Option<&'static str> {
        self.changes.back().map(|(_, t)| t.status).or(self.before)
    }

    fn gone(&self) -> bool {
        self.changes.is_empty() && self.before.is_none_or(|b| b == DELETED)
    }
}

/// The changes of many subjects within a per-subject and a total cap, the
/// oldest (fleet-wide) dropped first.
#[derive(Debug)]
struct Tracks {
    per_subject: usize,
    total: usize,
    seq: u64,
    /// Every change kept, oldest first (an entry whose change a
    /// per-subject cap already dropped is skipped when reached).
    order: VecDeque<(u64, Arc<Key>)>,
    by_key: HashMap<Arc<Key>, Track>,
}

impl Tracks {
    fn new(per_subject: usize, total: usize) -> Tracks {
        Tracks {
            per_subject: per_subject.max(1),
            total: total.max(1),
            seq: 0,
            order: VecDeque::new(),
            by_key: HashMap::new(),
        }
    }

    fn last(&self, key: &Key) -> Option<Transition> {
        self.by_key
            .get(key)
            .and_then(|t| t.changes.back().map(|(_, t)| *t))
    }

    /// Keeps a change; room is made first, so no buffer grows past its cap.
    fn push(&mut self, key: &Key, transition: Transition) {
        while self.order.len() >= self.total && self.pop_order(None) {}
        let key = match self.by_key.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => Arc::new(key.clone()),
        };
        self.seq += 1;
        let track = self.by_key.entry(key.clone()).or_default();
        if track.changes.len() >= self.per_subject {
            drop_front(track, true);
        }
        track.changes.push_back((self.seq, transition));
        self.order.push_back((self.seq, key));
    }

    /// Pops the oldest entry of `order`; with `cutoff`, only if its change
    /// is older (expiry), else always (the total cap). False when nothing
    /// was popped.
    fn pop_order(&mut self, cutoff: Option<Timestamp>) -> bool {
        let Some((seq, key)) = self.order.front().cloned() else {
            return false;
        };
        let Some(track) = self.by_key.get_mut(&key) else {
            self.order.pop_front();
            return true;
        };
        match track.changes.front() {
            Some((s, t)) if *s == seq => {
                if cutoff.is_some_and(|c| t.at >= c) {
                    return false;
                }
                drop_front(track, cutoff.is_none());
            }
            // Already dropped by the per-subject cap.
            _ => {}
        }
        self.order.pop_front();
        if track.gone() {
            self.by_key.remove(&key);
        }
        true
    }

    fn expire(&mut self, cutoff: Timestamp) {
        while self.pop_order(Some(cutoff)) {}
    }

    fn history(&self, key: &Key, from: Timestamp, to: Timestamp) -> Option<SubjectHistory> {
        let track = self.by_key.get(key)?;
        Some(SubjectHistory {
            from,
            to,
            before: track.before,
            dropped_until: track.dropped_until.filter(|d| *d > from),
            changes: track.changes.iter().map(|(_, t)| *t).collect(),
        })
    }
}

/// Drops a track's oldest change; `capped`: a cap dropped it before its time.
fn drop_front(track: &mut Track, capped: bool) {
    if let Some((_, t)) = track.changes.pop_front() {
        track.before = Some(t.status);
        if capped {
            track.dropped_until = Some(t.at);
        }
    }
}

/// The last hour of the fleet (see the module's documentation).
#[derive(Debug)]
pub struct History {
    limits: Limits,
    started_at: Timestamp,
    buckets: VecDeque<Bucket>,
    counts: Counts,
    /// Each dataplane's inbounds now: `None` ready, else why not.
    inbounds: HashMap<Key, Vec<Option<Class>>>,
    /// Each zone's state now.
    zones: HashMap<Arc<str>, usize>,
    dataplanes: Tracks,
    zone_tracks: Tracks,
}

fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl History {
    pub fn new(limits: Limits, now: Timestamp) -> History {
        let limits = Limits {
            bucket: limits.bucket.max(Duration::from_secs(1)),
            span: limits.span.max(limits.bucket),
            ..limits
        };
        History {
            limits,
            started_at: now,
            buckets: VecDeque::new(),
            counts: Counts::default(),
            inbounds: HashMap::new(),
            zones: HashMap::new(),
            dataplanes: Tracks::new(limits.per_subject, limits.total),
            zone_tracks: Tracks::new(limits.per_subject, limits.total),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The most buckets kept: the span, and the bucket it starts in.
    fn capacity(&self) -> usize {
        (self.limits.span.as_secs() / self.limits.bucket.as_secs()) as usize + 1
    }

    fn align(&self, t: Timestamp) -> Timestamp {
        let step = self.limits.bucket.as_secs() as i64;
        let secs = t.timestamp().div_euclid(step) * step;
        Timestamp::from_timestamp(secs, 0).unwrap_or(t)
    }

    /// Moves time on to `now`: new buckets (carrying the counts on), and
    /// what is older than the span goes.
    pub fn tick(&mut self, now: Timestamp) {
        let start = self.align(now);
        let step = chrono(self.limits.bucket);
        match self.buckets.back().map(|b| b.start) {
            None => self.buckets.push_back(Bucket::new(start, self.counts)),
            Some(last) if last >= start => {}
            Some(last) => {
                let steps = (start - last).num_seconds() / step.num_seconds();
                if steps as usize > self.capacity() {
                    self.buckets.clear();
                    self.buckets.push_back(Bucket::new(start, self.counts));
                } else {
                    let mut at = last;
                    for _ in 0..steps {
                        at += step;
                        self.buckets.push_back(Bucket::new(at, self.counts));
                    }
                }
            }
        }
        while self.buckets.len() > self.capacity() {
            self.buckets.pop_front();
        }
        let cutoff = now - chrono(self.limits.span);
        while self
            .buckets
            .front()
            .is_some_and(|b| b.start + step <= cutoff)
        {
            self.buckets.pop_front();
        }
        self.dataplanes.expire(cutoff);
        self.zone_tracks.expire(cutoff);
    }

    fn fold(&mut self, at: Timestamp) {
        self.tick(at);
        if let Some(b) = self.buckets.back_mut() {
            b.fold(self.counts);
        }
    }

    /// A dataplane as the API shows it now (`None`: deleted), at `at`.
    pub fn dataplane(&mut self, key: &Key, item: Option<&DataplaneItem>, at: Timestamp) {
        let classes: Option<Vec<Option<Class>>> =
            item.map(|item| item.inbounds.iter().map(Class::of).collect());
        let old = match &classes {
            Some(c) => self.inbounds.insert(key.clone(), c.clone()),
            None => self.inbounds.remove(key),
        };
        if old.as_ref() == classes.as_ref() {
            return;
        }
        self.tick(at);
        for (list, sign) in [(&old, -1i64), (&classes, 1)] {
            for class in list.iter().flatten() {
                let n = &mut self.counts.inbounds;
                *n = (i64::from(*n) + sign).max(0) as u32;
                if let Some(c) = class {
                    let n = &mut self.counts.not_ready[c.index()];
                    *n = (i64::from(*n) + sign).max(0) as u32;
                }
            }
        }
        self.fold(at);
        let transition = match &classes {
            None => Transition {
                at,
                status: DELETED,
                not_ready: None,
                inbounds: None,
            },
            Some(c) => Transition {
                at,
                status: c
                    .iter()
                    .flatten()
                    .min()
                    .map_or(READY, |worst| worst.as_str()),
                not_ready: Some(c.iter().flatten().count() as u32),
                inbounds: Some(c.len() as u32),
            },
        };
        let same = self.dataplanes.last(key).is_some_and(|t| {
            (t.status, t.not_ready, t.inbounds)
                == (transition.status, transition.not_ready, transition.inbounds)
        });
        let unseen_deletion = transition.status == DELETED
            && self
                .dataplanes
                .by_key
                .get(key)
                .is_none_or(|t| t.last().is_none());
        if !same && !unseen_deletion {
            self.dataplanes.push(key, transition);
        }
    }

    /// A zone's state now (`None`: deleted), at `at`.
    pub fn zone(&mut self, zone: &Arc<str>, state: Option<&'static str>, at: Timestamp) {
        let new = state.and_then(zone_index);
        let old = match new {
            Some(i) => self.zones.insert(zone.clone(), i),
            None => self.zones.remove(zone),
        };
        if old == new {
            return;
        }
        self.tick(at);
        if let Some(i) = old {
            self.counts.zones[i] = self.counts.zones[i].saturating_sub(1);
        }
        if let Some(i) = new {
            self.counts.zones[i] += 1;
        }
        self.fold(at);
        let key = Key::Zone(zone.clone());
        let status = new.map_or(DELETED, |i| ZONE_STATES[i]);
        if status == DELETED && old.is_none() {
            return;
        }
        self.zone_tracks.push(
            &key,
            Transition {
                at,
                status,
                not_ready: None,
                inbounds: None,
            },
        );
    }

    /// The dataplanes whose inbounds are known now (for a resync).
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.inbounds.keys()
    }

    /// Where the window starts at `now`: an hour ago, or when it started.
    fn from(&self, now: Timestamp) -> Timestamp {
        (now - chrono(self.limits.span)).max(self.started_at)
    }

    /// The fleet's timeline and the zones' changes, as of `now`.
    pub fn fleet(&self, now: Timestamp) -> FleetHistory {
        let from = self.from(now);
        let step = chrono(self.limits.bucket);
        let mut zones: Vec<ZoneHistory> = self
            .zone_tracks
            .by_key
            .keys()
            .filter_map(|k| match &**k {
                Key::Zone(name) => Some(ZoneHistory {
                    zone: name.to_string(),
                    history: self.zone_tracks.history(k, from, now)?,
                }),
                _ => None,
            })
            .collect();
        zones.sort_by(|a, b| a.zone.cmp(&b.zone));
        FleetHistory {
            bucket_seconds: self.limits.bucket.as_secs(),
            span_seconds: self.limits.span.as_secs(),
            started_at: self.started_at,
            from,
            to: now,
            samples: self
                .buckets
                .iter()
                .filter(|b| b.start + step > from)
                .map(|b| Sample {
                    at: b.start,
                    inbounds: b.last.inbounds,
                    ready: b.last.inbounds - b.last.not_ready(),
                    not_ready: b.last.not_ready(),
                    ready_min: b.ready_min,
                    not_ready_max: b.not_ready_max,
                    not_ready_max_by_class: Class::ALL
                        .iter()
                        .map(|c| (c.as_str(), b.not_ready_max_by_class[c.index()]))
                        .filter(|(_, n)| *n > 0)
                        .collect(),
                    zones: words(&b.last.zones),
                    zones_max: words(&b.zones_max),
                })
                .collect(),
            zones,
        }
    }

    /// One dataplane's changes, as of `now`; `None` when it is not known
    /// (never seen, or deleted longer ago than the span).
    pub fn of(&self, key: &Key, now: Timestamp) -> Option<SubjectHistory> {
        self.dataplanes.history(key, self.from(now), now)
    }
}

fn words(counts: &[u32; ZONE_STATES.len()]) -> BTreeMap<&'static str, u32> {
    ZONE_STATES
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| (*s, *n))
        .collect()
}

/// `GET /api/v1/history`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetHistory {
    pub bucket_seconds: u64,
    pub span_seconds: u64,
    /// When this hdsd started keeping history (it is not stored).
    pub started_at: Timestamp,
    /// The window: the span back from `to`, or from `startedAt`.
    pub from: Timestamp,
    pub to: Timestamp,
    /// One per bucket, oldest first.
    pub samples: Vec<Sample>,
    /// On a global: each zone's state changes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneHistory>,
}

/// One bucket of the fleet's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// The bucket's start; it lasts `bucketSeconds`.
    pub at: Timestamp,
    /// Inbounds in all, ready and not ready at the bucket's end (or now).
    pub inbounds: u32,
    pub ready: u32,
    pub not_ready: u32,
    /// The fewest ready and the most not ready at any moment of the bucket.
    pub ready_min: u32,
    pub not_ready_max: u32,
    /// The most not ready of each class at any moment of the bucket.
    pub not_ready_max_by_class: BTreeMap<&'static str, u32>,
    /// Zones by state at the bucket's end, and the most in each state
    /// within it (on a global).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub zones: BTreeMap<&'static str, u32>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub zones_max: BTreeMap<&'static str, u32>,
}

/// A zone's changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZoneHistory {
    pub zone: String,
    #[serde(flatten)]
    pub history: SubjectHistory,
}

/// One dataplane's or zone's status changes within the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubjectHistory {
    pub from: Timestamp,
    pub to: Timestamp,
    /// The status before the first change listed (`null`: it was not seen
    /// before that change).
    pub before: Option<&'static str>,
    /// A cap dropped older changes up to this time: before it, `before` is
    /// the status only from this time back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_until: Option<Timestamp>,
    pub changes: Vec<Transition>,
}

// ------------------------------------------------------------ the writer task

enum Request {
    Fleet(oneshot::Sender<FleetHistory>),
    Of(Key, oneshot::Sender<Option<SubjectHistory>>),
}

/// Asks the history's task for snapshots. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HistoryHandle {
    tx: mpsc::Sender<Request>,
}

/// The history's task has stopped (hdsd is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the history has stopped (hdsd is shutting down)")]
pub struct HistoryClosed;

impl HistoryHandle {
    /// The fleet's timeline now.
    pub async fn fleet(&self) -> Result<FleetHistory, HistoryClosed> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Fleet(reply))
            .await
            .map_err(|_| HistoryClosed)?;
        rx.await.map_err(|_| HistoryClosed)
    }

    /// One dataplane's changes now (`Key::Local` or `Key::Remote`).
    pub async fn of(&self, key: Key) -> Result<Option<SubjectHistory>, HistoryClosed> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Of(key, reply))
            .await
            .map_err(|_| HistoryClosed)?;
        rx.await.map_err(|_| HistoryClosed)
    }
}

/// The history's handle and its task, its one writer, for the caller to
/// run (the server supervises it): it follows the feed (this hdsd's
/// dataplanes) and, on a global, the hub's view.
pub fn start(
    registry: Registry,
    feed: FeedHandle,
    zones: Option<watch::Receiver<Arc<ZonesView>>>,
    clock: Arc<dyn Clock>,
    limits: Limits,
) -> (
    HistoryHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel(64);
    let history = History::new(limits, clock.now());
    let task = run(registry, feed, zones, clock, history, rx);
    (HistoryHandle { tx }, task)
}

fn local(
    registry: &Registry,
    history: &mut History,
    id: &crate::dataplane::DataplaneId,
    at: Timestamp,
) {
    let item = registry
        .get(id)
        .and_then(|h| DataplaneItem::from_state(&h.state()));
    history.dataplane(&Key::Local(id.clone()), item.as_ref(), at);
}

/// What moved between two catalogs ([`catalog_changes`]): the dataplanes
/// defined since are taken in as they are now, the ones deleted dropped.
fn apply_catalog(history: &mut History, prev: &Catalog, next: &Catalog, at: Timestamp) {
    for (id, handle) in catalog_changes(prev, next) {
        let item = handle.and_then(|h| DataplaneItem::from_state(&h.state()));
        history.dataplane(&Key::Local(id.clone()), item.as_ref(), at);
    }
}

/// Every local dataplane again (at start, and after falling behind the feed).
fn resync(catalog: &Catalog, history: &mut History, at: Timestamp) {
    let gone: Vec<Key> = history
        .keys()
        .filter(|k| matches!(k, Key::Local(id) if !catalog.contains_key(id)))
        .cloned()
        .collect();
    for key in gone {
        history.dataplane(&key, None, at);
    }
    for (id, h) in catalog.iter() {
        let item = DataplaneItem::from_state(&h.state());
        history.dataplane(&Key::Local(id.clone()), item.as_ref(), at);
    }
}

/// What moved between two views of the zones.
pub fn apply_zones(history: &mut History, prev: &ZonesView, next: &ZonesView, at: Timestamp) {
    for change in crate::zones::changes::changes(prev, next) {
        let deleted = change.kind == ChangeKind::Deleted;
        match &change.subject {
            Subject::Zone { zone, state } => {
                history.zone(zone, (!deleted).then_some(*state), at);
                if deleted {
                    // Its dataplanes go with it.
                    for id in prev.get(zone).iter().flat_map(|z| z.dataplanes.keys()) {
                        history.dataplane(&Key::Remote(zone.clone(), id.clone()), None, at);
                    }
                }
            }
            Subject::Remote { zone, dataplane } => {
                let key = change.subject.key();
                let item = next
                    .get(zone)
                    .filter(|_| !deleted)
                    .and_then(|z| DataplaneItem::from_remote(z.zone_of(), dataplane));
                history.dataplane(&key, item.as_ref(), at);
            }
            Subject::Local(_) => {}
        }
    }
}

async fn run(
    registry: Registry,
    feed: FeedHandle,
    mut zones: Option<watch::Receiver<Arc<ZonesView>>>,
    clock: Arc<dyn Clock>,
    mut history: History,
    mut requests: mpsc::Receiver<Request>,
) {
    // Subscribed first: whatever changes after the catalog is read comes
    // as an event, and is read again.
    let Ok((_, mut live)) = feed.subscribe(None, Filter::default()).await else {
        return;
    };
    let mut catalogs = registry.watch_catalog();
    let mut catalog = catalogs.borrow_and_update().clone();
    resync(&catalog, &mut history, clock.now());
    let mut seen = Arc::new(ZonesView::default());
    if let Some(rx) = &mut zones {
        let view = rx.borrow_and_update().clone();
        apply_zones(&mut history, &seen, &view, clock.now());
        seen = view;
    }
    let mut tick = tokio::time::interval(history.limits().bucket);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = live.recv() => match received {
                Ok(batch) => {
                    let now = clock.now();
                    for d in batch.iter().filter_map(|e| e.local()) {
                        local(&registry, &mut history, &d.id, now);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    catalog = catalogs.borrow_and_update().clone();
                    resync(&catalog, &mut history, clock.now());
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            changed = catalogs.changed() => {
                if changed.is_err() {
                    return;
                }
                let next = catalogs.borrow_and_update().clone();
                apply_catalog(&mut history, &catalog, &next, clock.now());
                catalog = next;
            }
            Some(view) = next_view(&mut zones) => {
                apply_zones(&mut history, &seen, &view, clock.now());
                seen = view;
            }
            _ = tick.tick() => history.tick(clock.now()),
            request = requests.recv() => match request {
                Some(Request::Fleet(reply)) => {
                    let now = clock.now();
                    history.tick(now);
                    let _ = reply.send(history.fleet(now));
                }
                Some(Request::Of(key, reply)) => {
                    let now = clock.now();
                    history.tick(now);
                    let _ = reply.send(history.of(&key, now));
                }
                None => return,
            },
        }
    }
}

/// The next view of the zones (pending forever without a hub, or once its
/// sender is gone).
pub(crate) async fn next_view(
    zones: &mut Option<watch::Receiver<Arc<ZonesView>>>,
) -> Option<Arc<ZonesView>> {
    let Some(rx) = zones else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *zones = None;
        return None;
    }
    Some(rx.borrow_and_update().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t0() -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2025, 1, 1, 12, 0, 0).unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        t0() + chrono::Duration::seconds(secs)
    }

    /// A dataplane whose inbounds have these statuses (`healthy` is ready).
    fn item(name: &str, statuses: &[&str]) -> DataplaneItem {
        let inbounds: Vec<serde_json::Value> = statuses
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({
                    "port": 10000 + i,
                    "servicePort": 20000 + i,
                    "serviceAddress": "127.0.0.1",
                    "tags": {},
                    "health": {"ready": *s == "healthy", "status": s, "since": t0(), "lastReportAt": null},
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "mesh": "default",
            "name": name,
            "address": "127.0.0.1",
            "connection": {"connected": true, "connectedAt": null, "lastReportAt": null},
            "inbounds": inbounds,
        }))
        .unwrap()
    }

    fn key(name: &str) -> Key {
        Key::Local(crate::dataplane::DataplaneId::new("default", name))
    }

    fn history() -> History {
        History::new(Limits::default(), t0())
    }

    #[test]
    fn each_bucket_carries_the_counts_at_its_end_and_gaps_are_filled() {
        let mut h = history();
        h.dataplane(
            &key("web"),
            Some(&item("web", &["healthy", "healthy"])),
            at(1),
        );
        h.dataplane(
            &key("web"),
            Some(&item("web", &["unhealthy", "healthy"])),
            at(25),
        );
        h.tick(at(35));
        let fleet = h.fleet(at(35));
        let shape: Vec<(i64, u32, u32, u32)> = fleet
            .samples
            .iter()
            .map(|s| {
                (
                    (s.at - t0()).num_seconds(),
                    s.inbounds,
                    s.ready,
                    s.not_ready,
                )
            })
            .collect();
        assert_eq!(
            shape,
            [(0, 2, 2, 0), (10, 2, 2, 0), (20, 2, 1, 1), (30, 2, 1, 1)]
        );
        assert_eq!(fleet.samples[2].not_ready_max_by_class["unhealthy"], 1);
        assert_eq!(fleet.bucket_seconds, 10);
        assert_eq!(fleet.from, t0());
    }

    #[test]
    fn a_flap_shorter_than_a_bucket_still_shows() {
        let mut h = history();
        h.dataplane(&key("web"), Some(&item("web", &["healthy"])), at(0));
        h.dataplane(&key("web"), Some(&item("web", &["stale"])), at(12));
        h.dataplane(&key("web"), Some(&item("web", &["healthy"])), at(14));
        h.tick(at(25));
        let fleet = h.fleet(at(25));
        let flap = &fleet.samples[1];
        assert_eq!((flap.ready, flap.not_ready), (1, 0), "over by its end");
        assert_eq!((flap.ready_min, flap.not_ready_max), (0, 1));
        assert_eq!(flap.not_ready_max_by_class["stale"], 1);
        assert_eq!(
            fleet.samples[2].not_ready_max, 0,
            "the next bucket is clear"
        );
        // And its exact times are in the dataplane's changes.
        let changes = h.of(&key("web"), at(25)).unwrap().changes;
        let seen: Vec<(i64, &str)> = changes
            .iter()
            .map(|c| ((c.at - t0()).num_seconds(), c.status))
            .collect();
        assert_eq!(seen, [(0, "ready"), (12, "stale"), (14, "ready")]);
    }

    #[test]
    fn a_dataplane_reads_as_its_worst_inbound_and_only_real_changes_count() {
        let mut h = history();
        h.dataplane(
            &key("api"),
            Some(&item("api", &["pending", "pending"])),
            at(0),
        );
        h.dataplane(
            &key("api"),
            Some(&item("api", &["pending", "unhealthy"])),
            at(1),
        );
        // The same status and counts: no new change.
        h.dataplane(
            &key("api"),
            Some(&item("api", &["pending", "timeout"])),
            at(2),
        );
        h.dataplane(&key("api"), None, at(3));
        let changes = h.of(&key("api"), at(4)).unwrap().changes;
        let seen: Vec<(&str, Option<u32>)> =
            changes.iter().map(|c| (c.status, c.not_ready)).collect();
        assert_eq!(
            seen,
            [
                ("pending", Some(2)),
                ("unhealthy", Some(2)),
                ("deleted", None)
            ]
        );
        let last = h.fleet(at(4)).samples.pop().unwrap();
        assert_eq!(
            (last.inbounds, last.not_ready, last.not_ready_max),
            (0, 0, 2)
        );
    }

    #[test]
    fn after_an_hour_samples_and_changes_expire() {
        let mut h = history();
        h.dataplane(&key("web"), Some(&item("web", &["healthy"])), at(0));
        h.dataplane(&key("web"), Some(&item("web", &["unhealthy"])), at(60));
        h.dataplane(&key("gone"), Some(&item("gone", &["healthy"])), at(0));
        h.dataplane(&key("gone"), None, at(30));
        let now = at(3600 + 65);
        h.tick(now);
        let fleet = h.fleet(now);
        assert_eq!(fleet.samples.len(), 361, "one hour of 10 s buckets");
        assert!(
            fleet.samples[0].at + chrono::Duration::seconds(10) > now - chrono::Duration::hours(1)
        );
        assert_eq!(fleet.from, now - chrono::Duration::hours(1));
        assert!(fleet.samples.iter().all(|s| s.not_ready == 1));
        let web = h.of(&key("web"), now).unwrap();
        assert!(web.changes.is_empty(), "{web:?}");
        assert_eq!(
            web.before,
            Some("unhealthy"),
            "the status the hour starts with"
        );
        assert_eq!(web.dropped_until, None, "expired, not capped");
        assert_eq!(
            h.of(&key("gone"), now),
            None,
            "deleted over an hour ago: forgotten"
        );
        // Much later (hdsd's clock jumped): no more than an hour of buckets.
        h.tick(at(5 * 3600));
        assert_eq!(h.fleet(at(5 * 3600)).samples.len(), 1);
    }

    #[test]
    fn the_caps_drop_the_oldest_changes_and_say_so() {
        let limits = Limits {
            per_subject: 3,
            total: 5,
            ..Limits::default()
        };
        let mut h = History::new(limits, t0());
        let flip = ["healthy", "unhealthy"];
        for i in 0..5 {
            h.dataplane(&key("a"), Some(&item("a", &[flip[i % 2]])), at(i as i64));
        }
        let a = h.of(&key("a"), at(10)).unwrap();
        assert_eq!(a.changes.len(), 3, "per dataplane");
        assert_eq!(a.before, Some("unhealthy"));
        assert_eq!(a.dropped_until, Some(at(1)));
        for i in 0..3 {
            h.dataplane(
                &key("b"),
                Some(&item("b", &[flip[i % 2]])),
                at(10 + i as i64),
            );
        }
        // 6 kept > 5 in all: the fleet's oldest (a's at 2 s) goes.
        let a = h.of(&key("a"), at(20)).unwrap();
        let b = h.of(&key("b"), at(20)).unwrap();
        assert_eq!((a.changes.len(), b.changes.len()), (2, 3));
        assert_eq!(a.dropped_until, Some(at(2)));
        assert_eq!(a.changes[0].at, at(3));
    }

    #[test]
    fn zones_are_counted_by_state_and_their_changes_kept() {
        let mut h = history();
        let eu: Arc<str> = Arc::from("eu-1");
        let us: Arc<str> = Arc::from("us-1");
        h.zone(&eu, Some("online"), at(0));
        h.zone(&us, Some("online"), at(0));
        h.zone(&us, Some("offline"), at(13));
        h.zone(&us, Some("online"), at(16));
        h.zone(&eu, None, at(25));
        let fleet = h.fleet(at(25));
        let middle = &fleet.samples[1];
        assert_eq!(middle.zones["online"], 2);
        assert_eq!(middle.zones_max["offline"], 1, "a short outage shows");
        assert_eq!(fleet.samples[2].zones.get("online"), Some(&1));
        let zones: Vec<(&str, Vec<&str>)> = fleet
            .zones
            .iter()
            .map(|z| {
                (
                    z.zone.as_str(),
                    z.history.changes.iter().map(|c| c.status).collect(),
                )
            })
            .collect();
        assert_eq!(
            zones,
            [
                ("eu-1", vec!["online", "deleted"]),
                ("us-1", vec!["online", "offline", "online"])
            ]
        );
    }

    #[test]
    fn a_withdrawn_zone_reads_as_its_own_class() {
        let mut withdrawn = item("web", &["healthy"]);
        withdrawn.inbounds[0].health.ready = false;
        withdrawn.inbounds[0].health.reason = Some(crate::view::ReasonItem {
            code: "zone_offline".to_string(),
            message: String::new(),
        });
        assert_eq!(
            Class::of(&withdrawn.inbounds[0]),
            Some(Class::ZoneWithdrawn)
        );
        assert_eq!(Class::of(&item("web", &["healthy"]).inbounds[0]), None);
        assert_eq!(
            Class::of(&item("web", &["degraded"]).inbounds[0]),
            Some(Class::NotReady)
        );
    }
}
