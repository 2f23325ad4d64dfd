//! The fleet's counts kept as the fleet changes, so the summary
//! (`GET /api/v1/fleet/summary`, gRPC `GetFleetSummary`) and the services
//! (`GET /api/v1/services`, gRPC `ListServices`) cost the services they
//! answer, not a walk over every dataplane.
//!
//! [`Aggregate`] is plain data: what each dataplane adds to the counts
//! (its [`Contribution`]: its cell, whether it is connected, its worst
//! class, its inbounds' statuses and services) and the counts of each
//! [`Cell`] (whose the dataplane is, its mesh, whether it is ready).
//! [`Aggregate::apply`] takes one [`Change`] (a dataplane as the API shows
//! it now, or gone; a zone gone) and moves the counts by the difference.
//! [`Counts`] is what readers get: the cells in a persistent map, shared
//! with the writer's, so publishing after each batch costs nothing. An
//! answer sums the cells a query takes in: the summary without filters or
//! with `mesh`, `zone` and `ready`; `service`, `status` and selectors are
//! not kept per cell, and the caller walks the fleet for them
//! ([`paging::fleet_summary`], the reference these counts are tested
//! against).
//!
//! One task writes it ([`spawn`]): it follows the change feed (this hdsd's
//! own dataplanes, read from the registry as the API shows them) and, on a
//! global, the hub's [`ZonesView`] (each zone's dataplanes, diffed view to
//! view), and publishes [`Counts`] on a watch channel. A reader
//! ([`CountsHandle::fresh`]) waits until the counts have taken in every
//! batch the feed had sent and the hub's view at the time of its call, so
//! an answer is never older than the change feed a watcher sees.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use imbl::OrdMap;
use tokio::sync::{broadcast, watch};

use crate::dataplane::{DataplaneId, SERVICE_TAG};
use crate::feed::{FeedHandle, Filter, Revision, Zones};
use crate::history::Class;
use crate::registry::{catalog_changes, Catalog, Registry};
use crate::view::DataplaneItem;
use crate::zones::hub::{ZoneView, ZonesView};

use super::paging::{DataplaneCounts, InboundCounts, Query, Summary};
use super::services::{ServiceItem, ServiceTally, Services};

/// Where a dataplane is counted: whose it is (`None`: this hdsd's own; a
/// zone's name), its mesh, and whether every inbound is ready.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cell {
    pub zone: Option<Arc<str>>,
    pub mesh: Arc<str>,
    pub ready: bool,
}

/// The counts of one cell's dataplanes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub dataplanes: u64,
    pub connected: u64,
    /// Not-ready dataplanes by their worst class ([`Class::ALL`]'s order).
    pub by_class: [u64; Class::ALL.len()],
    pub inbounds: u64,
    pub inbounds_ready: u64,
    /// Inbounds by status word (only the words that occur).
    pub by_status: BTreeMap<Arc<str>, u64>,
    /// Per `kuma.io/service` (only the services that occur).
    pub services: OrdMap<Arc<str>, ServiceTally>,
}

/// What one dataplane adds to the counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contribution {
    cell: Cell,
    connected: bool,
    /// The worst class of its inbounds; `None` when all are ready.
    class: Option<Class>,
    /// Each inbound's status word and readiness.
    inbounds: Vec<(Arc<str>, bool)>,
    /// Each service it has an inbound of: (name, ready inbounds, inbounds).
    services: Vec<(Arc<str>, u32, u32)>,
}

/// One thing that moved the counts.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// One of this hdsd's own dataplanes as the API shows it now (`None`:
    /// deleted).
    Own(&'a DataplaneId, Option<&'a DataplaneItem>),
    /// A zone's dataplane as the API shows it now (`None`: gone, or a
    /// field out of range: the walk leaves those out too).
    Remote(&'a str, &'a DataplaneId, Option<&'a DataplaneItem>),
    /// A zone left the view, and its dataplanes with it.
    ZoneGone(&'a str),
}

/// Strings shared by the contributions (status words, services, meshes,
/// zones): each distinct one is held once.
#[derive(Debug, Default)]
struct Words {
    set: HashSet<Arc<str>>,
    /// The size after the last sweep: the next one comes at twice it.
    swept_at: usize,
}

impl Words {
    fn get(&mut self, word: &str) -> Arc<str> {
        if let Some(w) = self.set.get(word) {
            return w.clone();
        }
        if self.set.len() >= 2 * self.swept_at.max(64) {
            // Words no contribution holds any more (a service renamed).
            self.set.retain(|w| Arc::strong_count(w) > 1);
            self.swept_at = self.set.len();
        }
        let w: Arc<str> = Arc::from(word);
        self.set.insert(w.clone());
        w
    }
}

/// The writer's state: every dataplane's contribution and the counts.
#[derive(Debug, Default)]
pub struct Aggregate {
    own: HashMap<DataplaneId, Contribution>,
    zones: HashMap<Arc<str>, HashMap<DataplaneId, Contribution>>,
    cells: OrdMap<Cell, Tally>,
    words: Words,
}

impl Aggregate {
    /// Moves the counts by one change.
    pub fn apply(&mut self, change: Change<'_>) {
        match change {
            Change::Own(id, item) => {
                let new = item.map(|i| self.contribution(None, i));
                let old = match &new {
                    Some(c) => self.own.insert(id.clone(), c.clone()),
                    None => self.own.remove(id),
                };
                self.replace(old, new);
            }
            Change::Remote(zone, id, item) => {
                let zone = self.words.get(zone);
                let new = item.map(|i| self.contribution(Some(zone.clone()), i));
                let old = match &new {
                    Some(c) => self
                        .zones
                        .entry(zone)
                        .or_default()
                        .insert(id.clone(), c.clone()),
                    None => {
                        let dataplanes = self.zones.get_mut(&zone);
                        let old = dataplanes.and_then(|d| d.remove(id));
                        if self.zones.get(&zone).is_some_and(HashMap::is_empty) {
                            self.zones.remove(&zone);
                        }
                        old
                    }
                };
                self.replace(old, new);
            }
            Change::ZoneGone(zone) => {
                for (_, old) in self.zones.remove(zone).into_iter().flatten() {
                    count(&mut self.cells, &old, false);
                }
            }
        }
    }

    fn replace(&mut self, old: Option<Contribution>, new: Option<Contribution>) {
        if old == new {
            return;
        }
        if let Some(old) = &old {
            count(&mut self.cells, old, false);
        }
        if let Some(new) = &new {
            count(&mut self.cells, new, true);
        }
    }

    /// What `item` adds to the counts (`zone`: whose it is).
    fn contribution(&mut self, zone: Option<Arc<str>>, item: &DataplaneItem) -> Contribution {
        let mut services: Vec<(Arc<str>, u32, u32)> = Vec::new();
        for inbound in &item.inbounds {
            let Some(service) = inbound.tags.get(SERVICE_TAG) else {
                continue;
            };
            let ready = u32::from(inbound.health.ready);
            match services.iter_mut().find(|(s, _, _)| **s == **service) {
                Some((_, r, t)) => {
                    *r += ready;
                    *t += 1;
                }
                None => services.push((self.words.get(service), ready, 1)),
            }
        }
        Contribution {
            cell: Cell {
                zone,
                mesh: self.words.get(&item.mesh),
                ready: item.is_ready(),
            },
            connected: item.connection.connected,
            class: item.inbounds.iter().filter_map(Class::of).min(),
            inbounds: item
                .inbounds
                .iter()
                .map(|i| (self.words.get(&i.health.status), i.health.ready))
                .collect(),
            services,
        }
    }

    /// The counts as readers see them (shares the writer's maps).
    pub fn counts(&self) -> Counts {
        Counts {
            cells: self.cells.clone(),
            ..Counts::default()
        }
    }

    /// This hdsd's own dataplanes counted now.
    fn own_ids(&self) -> impl Iterator<Item = &DataplaneId> {
        self.own.keys()
    }
}

fn less(n: &mut u64, by: u64) {
    debug_assert!(*n >= by, "a count below zero: a contribution removed twice");
    *n = n.saturating_sub(by);
}

fn less32(n: &mut u32, by: u32) {
    debug_assert!(*n >= by, "a count below zero: a contribution removed twice");
    *n = n.saturating_sub(by);
}

/// Adds (`add`) or takes away one contribution.
fn count(cells: &mut OrdMap<Cell, Tally>, c: &Contribution, add: bool) {
    if !cells.contains_key(&c.cell) {
        cells.insert(c.cell.clone(), Tally::default());
    }
    let Some(t) = cells.get_mut(&c.cell) else {
        return;
    };
    let step = |n: &mut u64, by: u64| match add {
        true => *n += by,
        false => less(n, by),
    };
    step(&mut t.dataplanes, 1);
    step(&mut t.connected, u64::from(c.connected));
    if let Some(class) = c.class {
        step(&mut t.by_class[class.index()], 1);
    }
    for (status, ready) in &c.inbounds {
        step(&mut t.inbounds, 1);
        step(&mut t.inbounds_ready, u64::from(*ready));
        match add {
            true => *t.by_status.entry(status.clone()).or_default() += 1,
            false => {
                if let Some(n) = t.by_status.get_mut(status) {
                    less(n, 1);
                    if *n == 0 {
                        t.by_status.remove(status);
                    }
                }
            }
        }
    }
    for (service, ready, total) in &c.services {
        if !t.services.contains_key(service) {
            t.services.insert(service.clone(), ServiceTally::default());
        }
        let Some(s) = t.services.get_mut(service) else {
            continue;
        };
        let connected = u32::from(c.connected);
        match add {
            true => {
                s.ready += ready;
                s.total += total;
                s.dataplanes += 1;
                s.connected += connected;
            }
            false => {
                less32(&mut s.ready, *ready);
                less32(&mut s.total, *total);
                less32(&mut s.dataplanes, 1);
                less32(&mut s.connected, connected);
            }
        }
        if s.dataplanes == 0 {
            t.services.remove(service);
        }
    }
    if t.dataplanes == 0 {
        cells.remove(&c.cell);
    }
}

/// The counts as readers get them, and what they reflect.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    cells: OrdMap<Cell, Tally>,
    /// The last feed batch taken in (its highest revision).
    revision: Revision,
    /// The hub's view taken in (on a global).
    view: Option<Arc<ZonesView>>,
    /// The registry's catalog taken in: a dataplane's first event may come
    /// before the catalog that holds it is published, so the dataplanes
    /// defined and deleted are taken from the catalog too.
    catalog: Option<Arc<Catalog>>,
    /// False until every dataplane known at the start is counted.
    synced: bool,
}

/// Whether the counts answer `query` (else the caller walks the fleet).
pub fn covers(query: &Query) -> bool {
    query.service.is_none() && query.selector.is_empty() && query.status.is_empty()
}

impl Counts {
    fn takes(query: &Query, cell: &Cell) -> bool {
        let zone = match (&query.zones, &cell.zone) {
            (Zones::All, _) | (Zones::Local, None) => true,
            (Zones::Only(want), Some(z)) => want.as_str() == &**z,
            _ => false,
        };
        zone && query.mesh.as_deref().is_none_or(|m| m == &*cell.mesh)
            && query.ready.is_none_or(|r| r == cell.ready)
    }

    /// The summary of `query`, as [`super::paging::fleet_summary`] counts
    /// it; `None` for a filter the counts do not keep ([`covers`]).
    pub fn summary(&self, query: &Query) -> Option<Summary> {
        if !covers(query) {
            return None;
        }
        let mut d = DataplaneCounts::default();
        let mut i = InboundCounts::default();
        let mut services = Services::default();
        for (cell, t) in self.cells.iter().filter(|(c, _)| Self::takes(query, c)) {
            d.total += t.dataplanes;
            d.connected += t.connected;
            match cell.ready {
                true => d.ready += t.dataplanes,
                false => d.not_ready += t.dataplanes,
            }
            for (class, n) in Class::ALL.iter().zip(t.by_class).filter(|(_, n)| *n > 0) {
                *d.by_class.entry(class.as_str().to_string()).or_default() += n;
            }
            i.total += t.inbounds;
            i.ready += t.inbounds_ready;
            i.not_ready += t.inbounds - t.inbounds_ready;
            for (status, n) in &t.by_status {
                *i.by_status.entry(status.to_string()).or_default() += n;
            }
            for (service, s) in &t.services {
                services.add_counted(&cell.mesh, service, cell.zone.as_deref(), s);
            }
        }
        Some(Summary {
            dataplanes: d,
            inbounds: i,
            services: services.finish(),
        })
    }

    /// Every service (of `mesh`), over every zone and per zone, as
    /// [`super::services::services`] counts the fleet's items.
    pub fn services(&self, mesh: Option<&str>) -> Vec<ServiceItem> {
        let mut services = Services::default();
        let cells = self
            .cells
            .iter()
            .filter(|(c, _)| mesh.is_none_or(|m| m == &*c.mesh));
        for (cell, t) in cells {
            for (service, s) in &t.services {
                services.add_counted(&cell.mesh, service, cell.zone.as_deref(), s);
            }
        }
        services.finish()
    }
}

/// How long a reader waits for the counts to take in what the feed and
/// the hub had sent when it asked; past it, it walks the fleet.
pub const FRESH_WITHIN: Duration = Duration::from_secs(1);

/// Reads the counts. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CountsHandle {
    counts: watch::Receiver<Arc<Counts>>,
    feed: FeedHandle,
    zones: Option<watch::Receiver<Arc<ZonesView>>>,
    catalogs: watch::Receiver<Arc<Catalog>>,
}

impl CountsHandle {
    /// The counts once they reflect every batch the feed had sent and
    /// (on a global) the hub's view now; `None` when they do not within
    /// [`FRESH_WITHIN`] (the task is behind, or gone).
    pub async fn fresh(&self) -> Option<Arc<Counts>> {
        let target = self.feed.broadcast_revision();
        let zones = self.zones.clone();
        let catalog = self.catalogs.borrow().clone();
        let caught_up = move |c: &Arc<Counts>| {
            c.synced
                && c.revision >= target
                && c.catalog
                    .as_ref()
                    .is_some_and(|seen| Arc::ptr_eq(seen, &catalog))
                && match (&zones, &c.view) {
                    (None, _) => true,
                    (Some(rx), Some(seen)) => Arc::ptr_eq(&rx.borrow(), seen),
                    (Some(_), None) => false,
                }
        };
        let mut rx = self.counts.clone();
        let waited = tokio::time::timeout(FRESH_WITHIN, rx.wait_for(caught_up)).await;
        match waited {
            Ok(Ok(counts)) => Some(counts.clone()),
            _ => {
                tracing::debug!("the fleet counts are behind the feed; walking the fleet");
                None
            }
        }
    }

    /// [`Counts::summary`] of fresh counts; `None`: walk the fleet.
    pub async fn summary(&self, query: &Query) -> Option<Summary> {
        match covers(query) {
            true => self.fresh().await?.summary(query),
            false => None,
        }
    }

    /// [`Counts::services`] of fresh counts; `None`: walk the fleet.
    pub async fn services(&self, mesh: Option<&str>) -> Option<Vec<ServiceItem>> {
        Some(self.fresh().await?.services(mesh))
    }
}

/// The counts' handle and their task, their one writer, for the caller to
/// run (the server supervises it): it follows the feed (this hdsd's
/// dataplanes) and, on a global, the hub's view.
pub fn start(
    registry: Registry,
    feed: FeedHandle,
    zones: Option<watch::Receiver<Arc<ZonesView>>>,
) -> (
    CountsHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(Arc::new(Counts::default()));
    let catalogs = registry.watch_catalog();
    let task = run(registry, feed.clone(), zones.clone(), tx);
    (
        CountsHandle {
            counts: rx,
            feed,
            zones,
            catalogs,
        },
        task,
    )
}

fn own(registry: &Registry, aggregate: &mut Aggregate, id: &DataplaneId) {
    let item = registry
        .get(id)
        .and_then(|h| DataplaneItem::from_state(&h.state()));
    aggregate.apply(Change::Own(id, item.as_ref()));
}

/// What moved between two catalogs ([`catalog_changes`]): the dataplanes
/// defined since are counted as they are now, the ones deleted dropped.
fn apply_catalog(aggregate: &mut Aggregate, prev: &Catalog, next: &Catalog) {
    for (id, handle) in catalog_changes(prev, next) {
        let item = handle.and_then(|h| DataplaneItem::from_state(&h.state()));
        aggregate.apply(Change::Own(id, item.as_ref()));
    }
}

/// Every own dataplane again (at start, and after falling behind the feed).
fn resync(catalog: &Catalog, aggregate: &mut Aggregate) {
    let gone: Vec<DataplaneId> = aggregate
        .own_ids()
        .filter(|id| !catalog.contains_key(id))
        .cloned()
        .collect();
    for id in gone {
        aggregate.apply(Change::Own(&id, None));
    }
    for (id, h) in catalog.iter() {
        let item = DataplaneItem::from_state(&h.state());
        aggregate.apply(Change::Own(id, item.as_ref()));
    }
}

fn remote(aggregate: &mut Aggregate, zone: &ZoneView, id: &DataplaneId) {
    let item = zone
        .dataplanes
        .get(id)
        .and_then(|dp| DataplaneItem::from_remote(zone.zone_of(), dp));
    aggregate.apply(Change::Remote(&zone.summary.name, id, item.as_ref()));
}

/// What moved between two views of the zones: a zone gone takes its
/// dataplanes; a zone whose data was withdrawn or came back moves every
/// one of its dataplanes; otherwise only the dataplanes that differ (the
/// views share their maps, so the diff costs what changed).
pub fn apply_zones(aggregate: &mut Aggregate, prev: &ZonesView, next: &ZonesView) {
    for gone in prev
        .zones
        .iter()
        .filter(|z| next.get(&z.summary.name).is_none())
    {
        aggregate.apply(Change::ZoneGone(&gone.summary.name));
    }
    for zone in &next.zones {
        let name = zone.summary.name.as_str();
        let before = prev.get(name);
        match before {
            Some(p) if p.summary.withdrawn == zone.summary.withdrawn => {
                for d in p.dataplanes.diff(&zone.dataplanes) {
                    let id = match d {
                        imbl::ordmap::DiffItem::Add(id, _)
                        | imbl::ordmap::DiffItem::Update { new: (id, _), .. }
                        | imbl::ordmap::DiffItem::Remove(id, _) => id,
                    };
                    remote(aggregate, zone, id);
                }
            }
            _ => {
                for id in before.iter().flat_map(|p| p.dataplanes.keys()) {
                    if !zone.dataplanes.contains_key(id) {
                        aggregate.apply(Change::Remote(name, id, None));
                    }
                }
                for id in zone.dataplanes.keys() {
                    remote(aggregate, zone, id);
                }
            }
        }
    }
}

async fn run(
    registry: Registry,
    feed: FeedHandle,
    mut zones: Option<watch::Receiver<Arc<ZonesView>>>,
    tx: watch::Sender<Arc<Counts>>,
) {
    // Subscribed first: whatever changes after the catalog is read comes
    // as an event, and is read again.
    let Ok((_, mut live)) = feed.subscribe(None, Filter::default()).await else {
        return;
    };
    let mut aggregate = Aggregate::default();
    // Every batch up to here changed the registry before it was sent.
    let mut revision = feed.broadcast_revision();
    let mut catalogs = registry.watch_catalog();
    let mut catalog = catalogs.borrow_and_update().clone();
    resync(&catalog, &mut aggregate);
    let mut seen = Arc::new(ZonesView::default());
    if let Some(rx) = &mut zones {
        let view = rx.borrow_and_update().clone();
        apply_zones(&mut aggregate, &seen, &view);
        seen = view;
    }
    let hub = zones.is_some();
    let publish = |aggregate: &Aggregate,
                   revision: Revision,
                   seen: &Arc<ZonesView>,
                   catalog: &Arc<Catalog>| {
        tx.send_replace(Arc::new(Counts {
            revision,
            view: hub.then(|| seen.clone()),
            catalog: Some(catalog.clone()),
            synced: true,
            ..aggregate.counts()
        }));
    };
    publish(&aggregate, revision, &seen, &catalog);
    loop {
        tokio::select! {
            received = live.recv() => match received {
                Ok(batch) => {
                    for d in batch.iter().filter_map(|e| e.local()) {
                        own(&registry, &mut aggregate, &d.id);
                    }
                    let last = batch.iter().map(|e| e.revision).max().unwrap_or(0);
                    revision = revision.max(last);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let sent = feed.broadcast_revision();
                    catalog = catalogs.borrow_and_update().clone();
                    resync(&catalog, &mut aggregate);
                    revision = revision.max(sent);
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            changed = catalogs.changed() => {
                if changed.is_err() {
                    return;
                }
                let next = catalogs.borrow_and_update().clone();
                apply_catalog(&mut aggregate, &catalog, &next);
                catalog = next;
            }
            Some(view) = crate::history::next_view(&mut zones) => {
                apply_zones(&mut aggregate, &seen, &view);
                seen = view;
            }
        }
        publish(&aggregate, revision, &seen, &catalog);
    }
}

#[cfg(test)]
mod tests;
