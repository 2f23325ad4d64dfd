//! The assignments of every service, kept by one task from the change feed.
//!
//! [`Index`] is plain data: each dataplane's contributions (its endpoints by
//! service) and each service's published assignment. A change to one
//! dataplane recomputes only the services it had or has. [`spawn`] runs its
//! single writer: it follows the feed, reads the changed dataplanes' states
//! from the registry, and publishes an [`Assignments`] snapshot (a watch
//! channel) once per batch of changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use prost::bytes::Bytes;
use prost::Message as _;
use tokio::sync::{broadcast, watch};

use super::assignment::TYPE_URL;
use super::assignment::{
    cluster_load_assignment, contributions, remote_contributions, EdsHealth, EdsOptions, Endpoint,
    HostPort, Policy, ServiceKey, Shape, ZoneLink,
};
use crate::clock::{Clock as _, SystemClock};
use crate::dataplane::DataplaneId;
use crate::feed::{FeedHandle, Filter};
use crate::registry::{DataplaneState, Registry};
use crate::sources::Loaded;
use crate::view::zones::Dataplanes;

/// One service's assignment as served. It is encoded when a stream first
/// serves it, once for every stream: a service nobody subscribes to costs
/// its endpoints' list only, whatever its size and however often it changes.
#[derive(Debug)]
pub struct Published {
    /// The revision at which it last changed.
    pub version: u64,
    /// Its distinct endpoints, in order: a persistent set, shared with the
    /// index (publishing a service of 10,000 endpoints copies none).
    pub endpoints: imbl::OrdSet<Endpoint>,
    /// The resource name, `<mesh>/<service>`.
    name: String,
    /// `eds.*`: the factor, `endpoint_stale_after`, the zones' order.
    policy: Arc<Policy>,
    /// Its addresses that more than one zone announces.
    duplicates: BTreeSet<HostPort>,
    /// True when an endpoint is in a zone: the priorities then depend on
    /// the front's zone.
    zoned: bool,
    /// The encoded `ClusterLoadAssignment` and its encoding, as every push
    /// writes it (for a front without a zone, or any front when no endpoint
    /// is in a zone).
    encoded: std::sync::OnceLock<(Any, Bytes)>,
    /// The same for each front zone that asked, when `zoned`.
    by_front: std::sync::Mutex<HashMap<Arc<str>, (Any, Bytes)>>,
}

impl Clone for Published {
    /// The same assignment; its encodings are made again on first use.
    fn clone(&self) -> Self {
        Published::of(
            self.version,
            &self.name,
            self.endpoints.clone(),
            self.policy.clone(),
            self.duplicates.clone(),
        )
    }
}

impl PartialEq for Published {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version
            && self.name == other.name
            && self.endpoints == other.endpoints
    }
}

impl Published {
    /// The assignment `name` (`<mesh>/<service>`) with `endpoints`.
    pub fn new(
        version: u64,
        name: &str,
        endpoints: impl IntoIterator<Item = Endpoint>,
    ) -> Published {
        Published::of(
            version,
            name,
            endpoints.into_iter().collect(),
            Arc::new(Policy::default()),
            BTreeSet::new(),
        )
    }

    fn of(
        version: u64,
        name: &str,
        endpoints: imbl::OrdSet<Endpoint>,
        policy: Arc<Policy>,
        duplicates: BTreeSet<HostPort>,
    ) -> Published {
        // Sorted by zone: the last endpoint has a zone when any has.
        let zoned = endpoints.get_max().is_some_and(|e| e.zone.is_some());
        Published {
            version,
            endpoints,
            name: name.to_string(),
            policy,
            duplicates,
            zoned,
            encoded: std::sync::OnceLock::new(),
            by_front: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn encode_for(&self, front_zone: Option<&str>) -> (Any, Bytes) {
        let endpoints: Vec<Endpoint> = self.endpoints.iter().cloned().collect();
        let shape = Shape {
            policy: &self.policy,
            front_zone,
            duplicates: &self.duplicates,
        };
        let resource = encode(&self.name, &endpoints, shape);
        let bytes = resource.encode_to_vec().into();
        (resource, bytes)
    }

    fn encoded_pair(&self) -> &(Any, Bytes) {
        self.encoded.get_or_init(|| self.encode_for(None))
    }

    /// The response resource for a front without a zone (encoded on first use).
    pub fn resource(&self) -> &Any {
        &self.encoded_pair().0
    }

    /// [`Published::resource`] encoded (on first use).
    pub fn encoded(&self) -> &Bytes {
        &self.encoded_pair().1
    }

    /// The resource and its encoding for a front in `front_zone`: its zone
    /// first (encoded once per front zone, on first use).
    pub fn for_front(&self, front_zone: Option<&Arc<str>>) -> (Any, Bytes) {
        match front_zone {
            Some(zone) if self.zoned => {
                let mut cache = self
                    .by_front
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                cache
                    .entry(zone.clone())
                    .or_insert_with(|| self.encode_for(Some(zone)))
                    .clone()
            }
            _ => self.encoded_pair().clone(),
        }
    }

    /// [`Published::for_front`]'s encoding only, without copying the
    /// resource when every front gets the same.
    pub fn encoded_for(&self, front_zone: Option<&Arc<str>>) -> Bytes {
        match front_zone {
            Some(_) if self.zoned => self.for_front(front_zone).1,
            _ => self.encoded().clone(),
        }
    }
}

/// How many recent changes (revision, service) the index keeps for streams
/// that are behind: a stream that missed more reads every service it follows.
pub const RECENT_CHANGES: usize = 4096;

/// Every service's assignment at one revision. Services without endpoints
/// are absent (served as empty assignments).
#[derive(Debug, Clone, Default)]
pub struct Assignments {
    /// Tells this process's versions from another's (hdsd restarted).
    pub epoch: u64,
    pub revision: u64,
    /// False until the catalog hdsd started with is in: no stream is
    /// answered from a half-built index.
    pub synced: bool,
    /// A persistent map: a snapshot shares it with the index (taking one
    /// costs no copy of every service's entry).
    pub services: imbl::OrdMap<ServiceKey, Arc<Published>>,
    /// The services that changed, by revision (ascending), for every
    /// revision after `recent_floor`: a stream that has every subscribed
    /// resource at some revision >= `recent_floor` finds what changed since
    /// here, without looking at each service it follows.
    pub recent: imbl::Vector<(u64, ServiceKey)>,
    pub recent_floor: u64,
}

impl Assignments {
    /// The version of a resource name: 0 for an unknown service.
    pub fn version_of(&self, key: Option<&ServiceKey>) -> u64 {
        key.and_then(|k| self.services.get(k))
            .map_or(0, |p| p.version)
    }

    /// The services that changed after revision `seen` (a service may come
    /// more than once), or `None` when that is older than the changes kept.
    pub fn changed_since(&self, seen: u64) -> Option<impl Iterator<Item = &ServiceKey>> {
        (seen >= self.recent_floor).then(|| {
            self.recent
                .iter()
                .rev()
                .take_while(move |(revision, _)| *revision > seen)
                .map(|(_, key)| key)
        })
    }
}

/// Encodes an assignment as a response resource.
pub fn encode(name: &str, endpoints: &[Endpoint], shape: Shape<'_>) -> Any {
    Any {
        type_url: TYPE_URL.to_string(),
        value: cluster_load_assignment(name, endpoints, shape).encode_to_vec(),
    }
}

/// Where a dataplane's endpoints come from: this hdsd's registry, or a zone
/// (on a global).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Origin {
    Local(DataplaneId),
    Remote(Arc<str>, DataplaneId),
}

/// The index's state. Plain data.
#[derive(Debug, Default)]
pub struct Index {
    options: EdsOptions,
    policy: Arc<Policy>,
    /// Whether each service's addresses are counted by zone (to find the
    /// same address in two zones): from the first zone on.
    track_hosts: bool,
    /// Addresses more than one zone announces, over every service.
    duplicate_count: u64,
    revision: u64,
    by_dataplane: HashMap<Origin, Vec<(ServiceKey, Endpoint)>>,
    /// Each zone's dataplanes as last applied, and how its link stood.
    zones: HashMap<Arc<str>, (Dataplanes, ZoneLink)>,
    by_service: HashMap<ServiceKey, Members>,
    published: imbl::OrdMap<ServiceKey, Arc<Published>>,
    /// Services whose endpoints changed since the last commit.
    touched: BTreeSet<ServiceKey>,
    /// What changed in the last [`RECENT_CHANGES`] changes (see [`Assignments::recent`]).
    recent: imbl::Vector<(u64, ServiceKey)>,
    recent_floor: u64,
    /// Published endpoints by health, in [`EdsHealth::ALL`] order.
    counts: [u64; 4],
}

/// A service's endpoints: how many inbounds give each one (two dataplanes
/// may name the same address and port), and the distinct ones, kept as the
/// set a [`Published`] shares. A change costs the endpoints it adds or
/// removes, not the service's size.
#[derive(Debug, Default)]
struct Members {
    given: BTreeMap<Endpoint, u32>,
    distinct: imbl::OrdSet<Endpoint>,
    /// With `track_hosts`: how many distinct endpoints each zone gives at
    /// each address (`None`: this hdsd's own).
    hosts: HashMap<HostPort, BTreeMap<Option<Arc<str>>, u32>>,
    /// The addresses of `hosts` that more than one zone gives.
    duplicates: BTreeSet<HostPort>,
}

impl Members {
    /// One more (`up`) or one fewer distinct endpoint `e`: the change in
    /// the count of duplicated addresses (-1, 0 or 1).
    fn count_host(&mut self, e: &Endpoint, up: bool) -> i64 {
        let host = (e.address, e.port);
        let zones = self.hosts.entry(host).or_default();
        if up {
            *zones.entry(e.zone.clone()).or_insert(0) += 1;
        } else if let Some(n) = zones.get_mut(&e.zone) {
            *n -= 1;
            if *n == 0 {
                zones.remove(&e.zone);
            }
        }
        let duplicate = zones.len() > 1;
        if zones.is_empty() {
            self.hosts.remove(&host);
        }
        match (duplicate, self.duplicates.contains(&host)) {
            (true, false) => {
                self.duplicates.insert(host);
                1
            }
            (false, true) => {
                self.duplicates.remove(&host);
                -1
            }
            _ => 0,
        }
    }
}

impl Index {
    pub fn new(options: EdsOptions) -> Index {
        Index::shaped(options, Policy::default())
    }

    /// An index whose assignments follow `policy`.
    pub fn shaped(options: EdsOptions, policy: Policy) -> Index {
        Index {
            options,
            policy: Arc::new(policy),
            ..Default::default()
        }
    }

    /// Addresses more than one zone announces, over every service.
    pub fn duplicate_count(&self) -> u64 {
        self.duplicate_count
    }

    /// Counts every service's addresses by zone from now on.
    fn start_tracking_hosts(&mut self) {
        if self.track_hosts {
            return;
        }
        self.track_hosts = true;
        let mut added = 0;
        for members in self.by_service.values_mut() {
            let endpoints: Vec<Endpoint> = members.given.keys().cloned().collect();
            for e in &endpoints {
                added += members.count_host(e, true);
            }
        }
        self.duplicate_count = self.duplicate_count.saturating_add_signed(added);
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Published endpoints by health status.
    pub fn counts(&self) -> impl Iterator<Item = (EdsHealth, u64)> + '_ {
        EdsHealth::ALL.into_iter().zip(self.counts)
    }

    /// A dataplane's current state (or its absence: deleted).
    pub fn set(&mut self, id: &DataplaneId, state: Option<&DataplaneState>) {
        let new = state
            .and_then(|s| {
                let d = s.defined.as_ref()?;
                Some(contributions(&d.dataplane, &s.health, self.options))
            })
            .unwrap_or_default();
        self.contribute(Origin::Local(id.clone()), new);
    }

    /// A zone's dataplanes as the global holds them now, with the zone's
    /// link: every dataplane of the zone not in `dataplanes` leaves. Costs
    /// what changed since the zone was last applied: the two maps are
    /// diffed without visiting what they share (nothing, when they are the
    /// same map under the same link). A new link works out every dataplane
    /// of the zone again.
    pub fn set_zone(&mut self, zone: &Arc<str>, link: ZoneLink, dataplanes: &Dataplanes) {
        let (held, was) = match self.zones.get(zone) {
            Some((held, was)) if held.ptr_eq(dataplanes) && *was == link => return,
            Some((held, was)) => (held.clone(), Some(*was)),
            None => (Dataplanes::new(), None),
        };
        self.start_tracking_hosts();
        let origin = |id: &DataplaneId| Origin::Remote(zone.clone(), id.clone());
        if was == Some(link) {
            for change in held.diff(dataplanes) {
                match change {
                    imbl::ordmap::DiffItem::Add(id, dp)
                    | imbl::ordmap::DiffItem::Update { new: (id, dp), .. } => {
                        let contributions = remote_contributions(zone, link, dp, self.options);
                        self.contribute(origin(id), contributions);
                    }
                    imbl::ordmap::DiffItem::Remove(id, _) => {
                        self.contribute(origin(id), Vec::new());
                    }
                }
            }
        } else {
            for id in held.keys().filter(|id| !dataplanes.contains_key(*id)) {
                self.contribute(origin(id), Vec::new());
            }
            for (id, dp) in dataplanes {
                let contributions = remote_contributions(zone, link, dp, self.options);
                self.contribute(origin(id), contributions);
            }
        }
        self.zones.insert(zone.clone(), (dataplanes.clone(), link));
    }

    /// A zone the global no longer knows: its endpoints leave.
    pub fn remove_zone(&mut self, zone: &Arc<str>) {
        self.set_zone(zone, ZoneLink::Withdrawn, &Dataplanes::new());
        self.zones.remove(zone);
    }

    /// The zones applied, by name.
    pub fn zone_names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.zones.keys()
    }

    /// What one dataplane gives now, replacing what it gave.
    fn contribute(&mut self, origin: Origin, new: Vec<(ServiceKey, Endpoint)>) {
        let old = if new.is_empty() {
            self.by_dataplane.remove(&origin).unwrap_or_default()
        } else {
            self.by_dataplane
                .insert(origin, new.clone())
                .unwrap_or_default()
        };
        if old == new {
            return;
        }
        // What the dataplane stopped and started giving (sorted, so that an
        // endpoint it gives before and after is neither).
        let (mut gone, mut came) = (old, new);
        gone.sort_unstable();
        came.sort_unstable();
        let (mut g, mut c) = (0, 0);
        loop {
            match (gone.get(g), came.get(c)) {
                (None, None) => break,
                (Some(a), Some(b)) if a == b => {
                    g += 1;
                    c += 1;
                }
                (Some((key, endpoint)), None) => {
                    self.withdraw(key, endpoint.clone());
                    g += 1;
                }
                (Some(a), Some(b)) if a < b => {
                    self.withdraw(&a.0, a.1.clone());
                    g += 1;
                }
                (_, Some((key, endpoint))) => {
                    self.give(key, endpoint.clone());
                    c += 1;
                }
            }
        }
    }

    /// One inbound no longer gives `endpoint` to `key`.
    fn withdraw(&mut self, key: &ServiceKey, endpoint: Endpoint) {
        let Some(members) = self.by_service.get_mut(key) else {
            return;
        };
        let Some(n) = members.given.get_mut(&endpoint) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        members.given.remove(&endpoint);
        members.distinct.remove(&endpoint);
        if self.track_hosts {
            let d = members.count_host(&endpoint, false);
            self.duplicate_count = self.duplicate_count.saturating_add_signed(d);
        }
        if members.given.is_empty() {
            self.by_service.remove(key);
        }
        let slot = &mut self.counts[health_slot(endpoint.health)];
        *slot = slot.saturating_sub(1);
        self.touched.insert(key.clone());
    }

    /// One more inbound gives `endpoint` to `key`.
    fn give(&mut self, key: &ServiceKey, endpoint: Endpoint) {
        let members = match self.by_service.get_mut(key) {
            Some(members) => members,
            None => self.by_service.entry(key.clone()).or_default(),
        };
        let n = members.given.entry(endpoint.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            return;
        }
        let health = endpoint.health;
        if self.track_hosts {
            let d = members.count_host(&endpoint, true);
            self.duplicate_count = self.duplicate_count.saturating_add_signed(d);
        }
        members.distinct.insert(endpoint);
        self.counts[health_slot(health)] += 1;
        self.touched.insert(key.clone());
    }

    /// Every dataplane that exists now: the others are removed.
    pub fn replace_all(&mut self, states: &BTreeMap<DataplaneId, DataplaneState>) {
        let gone: Vec<DataplaneId> = self
            .by_dataplane
            .keys()
            .filter_map(|origin| match origin {
                Origin::Local(id) if !states.contains_key(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        for id in gone {
            self.set(&id, None);
        }
        for (id, state) in states {
            self.set(id, Some(state));
        }
    }

    /// Publishes each touched service whose endpoints differ from what it
    /// published (an endpoint gone and back within one batch publishes
    /// nothing); true when an assignment changed (the revision moved on).
    /// Nothing is listed, sorted or encoded here; the comparison walks the
    /// two sets up to their first difference.
    pub fn commit(&mut self) -> bool {
        let mut changed = false;
        for key in std::mem::take(&mut self.touched) {
            let members = self.by_service.get(&key);
            let endpoints = members.map(|m| m.distinct.clone());
            let before = self.published.get(&key);
            if before.map(|p| &p.endpoints) == endpoints.as_ref() {
                continue;
            }
            let duplicates = members.map(|m| m.duplicates.clone()).unwrap_or_default();
            report_duplicates(&key, before.map(|p| &p.duplicates), members);
            if !changed {
                self.revision += 1;
                changed = true;
            }
            self.recent.push_back((self.revision, key.clone()));
            if self.recent.len() > RECENT_CHANGES {
                if let Some((revision, _)) = self.recent.pop_front() {
                    self.recent_floor = revision;
                }
            }
            match endpoints {
                Some(endpoints) => {
                    let published = Published::of(
                        self.revision,
                        &key.to_string(),
                        endpoints,
                        self.policy.clone(),
                        duplicates,
                    );
                    self.published.insert(key, Arc::new(published));
                }
                None => {
                    self.published.remove(&key);
                }
            }
        }
        changed
    }

    pub fn snapshot(&self, epoch: u64, synced: bool) -> Assignments {
        Assignments {
            epoch,
            revision: self.revision,
            synced,
            services: self.published.clone(),
            recent: self.recent.clone(),
            recent_floor: self.recent_floor,
        }
    }
}

/// Logs each address of `key` that more than one zone announces now and
/// did not when it was last published: a problem of the zones' sources.
fn report_duplicates(
    key: &ServiceKey,
    before: Option<&BTreeSet<HostPort>>,
    members: Option<&Members>,
) {
    let Some(members) = members else { return };
    for host in &members.duplicates {
        if before.is_some_and(|b| b.contains(host)) {
            continue;
        }
        let zones: Vec<String> = members.hosts.get(host).map_or_else(Vec::new, |z| {
            z.keys()
                .map(|z| z.as_deref().unwrap_or("this hdsd").to_string())
                .collect()
        });
        tracing::warn!(
            service = %key,
            address = %host.0,
            port = host.1,
            "EDS: {}:{} of {key} is announced by more than one zone ({}), e.g. overlapping private address ranges: a front in one of these zones is sent its own zone's endpoint at that address, any other front none of them; give the inbounds addresses that are unique across zones (or their own inbound address)",
            host.0,
            host.1,
            zones.join(", ")
        );
    }
}

/// Where an endpoint of `health` is counted in [`Index::counts`].
fn health_slot(health: EdsHealth) -> usize {
    EdsHealth::ALL
        .iter()
        .position(|h| *h == health)
        .unwrap_or(0)
}

/// Reads the assignments. Cheap to clone.
pub type AssignmentsRx = watch::Receiver<Arc<Assignments>>;

/// Starts the index's task; the receiver sees `synced` once the dataplanes
/// hdsd loaded at start are all in.
pub fn spawn(
    registry: Registry,
    feed: FeedHandle,
    sources: watch::Receiver<Arc<Loaded>>,
    zones: Option<ZonesRx>,
    options: EdsOptions,
    policy: Policy,
) -> AssignmentsRx {
    // Milliseconds since the Unix epoch: a new process numbers versions anew.
    let epoch = u64::try_from(SystemClock.now().timestamp_millis()).unwrap_or(0);
    let (tx, rx) = watch::channel(Arc::new(Assignments {
        epoch,
        ..Default::default()
    }));
    tokio::spawn(run(
        registry,
        feed,
        sources,
        zones,
        Index::shaped(options, policy),
        epoch,
        tx,
    ));
    rx
}

/// What a global publishes of its zones.
pub type ZonesRx = watch::Receiver<Arc<crate::view::zones::ZonesView>>;

/// How EDS treats a zone in its current state.
fn link_of(zone: &crate::view::zones::ZoneView) -> ZoneLink {
    use crate::view::zones::ZoneState;
    match zone.summary.liveness.state {
        ZoneState::Disabled => ZoneLink::Withdrawn,
        ZoneState::Offline => ZoneLink::Offline,
        ZoneState::Online | ZoneState::NeverConnected => ZoneLink::Online,
    }
}

/// Applies a global's view of its zones; true when it is synced (every
/// zone heard from, see [`ZonesView::synced`](crate::view::zones::ZonesView::synced)).
pub fn apply_zones(index: &mut Index, view: &crate::view::zones::ZonesView) -> bool {
    let mut seen = std::collections::HashSet::new();
    for zone in &view.zones {
        let name: Arc<str> = index
            .zone_names()
            .find(|n| ***n == *zone.summary.name)
            .cloned()
            .unwrap_or_else(|| Arc::from(zone.summary.name.as_str()));
        index.set_zone(&name, link_of(zone), &zone.dataplanes);
        seen.insert(name);
    }
    let gone: Vec<Arc<str>> = index
        .zone_names()
        .filter(|n| !seen.contains(*n))
        .cloned()
        .collect();
    for name in gone {
        index.remove_zone(&name);
    }
    view.synced
}

fn states(registry: &Registry) -> BTreeMap<DataplaneId, DataplaneState> {
    registry
        .catalog()
        .iter()
        .map(|(id, h)| (id.clone(), h.state()))
        .collect()
}

async fn run(
    registry: Registry,
    feed: FeedHandle,
    mut sources: watch::Receiver<Arc<Loaded>>,
    mut zones: Option<ZonesRx>,
    mut index: Index,
    epoch: u64,
    tx: watch::Sender<Arc<Assignments>>,
) {
    // Subscribed first: whatever changes after the catalog is read below
    // comes as an event, and is read again.
    let Ok((_, mut live)) = feed.subscribe(None, Filter::default()).await else {
        return;
    };
    let mut catalog = registry.watch_catalog();
    loop {
        let loaded = sources.borrow_and_update().clone();
        let in_catalog = {
            let c = catalog.borrow_and_update();
            loaded.dataplanes.keys().all(|id| c.contains_key(id))
        };
        if in_catalog {
            break;
        }
        tokio::select! {
            r = catalog.changed() => if r.is_err() { return },
            r = sources.changed() => if r.is_err() { return },
        }
    }
    index.replace_all(&states(&registry));
    // A global answers no front before it has heard from its zones.
    let mut synced = match &mut zones {
        Some(rx) => {
            let view = rx.borrow_and_update().clone();
            apply_zones(&mut index, &view)
        }
        None => true,
    };
    index.commit();
    publish(&index, epoch, synced, &tx);
    tracing::debug!(
        services = tx.borrow().services.len(),
        synced,
        "EDS assignments ready"
    );
    loop {
        tokio::select! {
            received = live.recv() => match received {
                Ok(batch) => {
                    // This hdsd's own dataplanes: zones come with the view.
                    for d in batch.iter().filter_map(|e| e.local()) {
                        let id = &d.id;
                        let state = registry.get(id).map(|h| h.state());
                        index.set(id, state.as_ref());
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Fell behind the feed: start over from the catalog.
                    index.replace_all(&states(&registry));
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(view) = next_view(&mut zones) => {
                let now_synced = apply_zones(&mut index, &view);
                if now_synced && !synced {
                    synced = true;
                    // Streams waiting for the first answer wake on this.
                    index.commit();
                    publish(&index, epoch, synced, &tx);
                    continue;
                }
            }
        }
        if index.commit() {
            publish(&index, epoch, synced, &tx);
        }
    }
}

/// The next view of the zones (pending forever without a hub, or once its
/// sender is gone).
async fn next_view(zones: &mut Option<ZonesRx>) -> Option<Arc<crate::view::zones::ZonesView>> {
    let Some(rx) = zones else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *zones = None;
        return None;
    }
    Some(rx.borrow_and_update().clone())
}

fn publish(index: &Index, epoch: u64, synced: bool, tx: &watch::Sender<Arc<Assignments>>) {
    for (health, n) in index.counts() {
        crate::metrics::eds_endpoints(health.as_str(), n);
    }
    crate::metrics::eds_duplicate_addresses(index.duplicate_count());
    tx.send_replace(Arc::new(index.snapshot(epoch, synced)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::eds::protocol::Push;
    use crate::consumers::services::SERVICE_TAG;
    use crate::dataplane::parse_documents;
    use crate::readiness::{rebase, Status};
    use crate::registry::Connection;
    use crate::sources::Defined;
    use crate::specifier::{build, SpecifierSettings};
    use chrono::{TimeZone, Utc};
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use std::net::IpAddr;

    fn state(
        name: &str,
        services: &[(&str, u16)],
        status: Status,
    ) -> (DataplaneId, DataplaneState) {
        let mut text = format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n"
        );
        for (service, port) in services {
            text.push_str(&format!(
                "  - port: {port}\n    servicePort: {port}\n    tags: {{kuma.io/service: {service}}}\n"
            ));
        }
        let dp = Arc::new(parse_documents(&text).unwrap().remove(0));
        let specifier = Arc::new(build(&dp, &SpecifierSettings::default()).unwrap());
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut health = rebase(None, &dp, &specifier, t);
        for h in &mut health.inbounds {
            h.status = status;
        }
        (
            dp.id.clone(),
            DataplaneState {
                defined: Some(Defined {
                    dataplane: dp,
                    specifier,
                    file: "x.yaml".into(),
                }),
                version: 1,
                health,
                connection: Connection::default(),
                envoy: Default::default(),
            },
        )
    }

    fn endpoints(index: &Index, service: &str) -> Vec<(u16, EdsHealth)> {
        index
            .published
            .get(&ServiceKey::new("default", service))
            .map(|p| p.endpoints.iter().map(|e| (e.port, e.health)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_change_recomputes_only_the_services_it_touches() {
        let mut index = Index::new(EdsOptions::default());
        let (a, sa) = state("a", &[("web", 1001)], Status::Healthy);
        let (b, sb) = state("b", &[("web", 1002), ("api", 2001)], Status::Healthy);
        let (c, sc) = state("c", &[("db", 3001)], Status::Healthy);
        index.set(&a, Some(&sa));
        index.set(&b, Some(&sb));
        index.set(&c, Some(&sc));
        assert!(index.commit());
        assert_eq!(index.revision(), 1);
        assert_eq!(
            endpoints(&index, "web"),
            [(1001, EdsHealth::Healthy), (1002, EdsHealth::Healthy)]
        );
        let db_before = index.published[&ServiceKey::new("default", "db")].clone();

        // b's inbounds turn unhealthy: web and api change, db does not.
        let (_, sb2) = state("b", &[("web", 1002), ("api", 2001)], Status::Unhealthy);
        index.set(&b, Some(&sb2));
        assert_eq!(
            index.touched,
            [
                ServiceKey::new("default", "api"),
                ServiceKey::new("default", "web")
            ]
            .into()
        );
        assert!(index.commit());
        assert_eq!(index.revision(), 2);
        assert_eq!(
            endpoints(&index, "web"),
            [(1001, EdsHealth::Healthy), (1002, EdsHealth::Unhealthy)]
        );
        assert_eq!(
            index.published[&ServiceKey::new("default", "web")].version,
            2
        );
        assert!(Arc::ptr_eq(
            &db_before,
            &index.published[&ServiceKey::new("default", "db")]
        ));
        let counts: Vec<_> = index.counts().collect();
        assert_eq!(
            counts,
            [
                (EdsHealth::Healthy, 2),
                (EdsHealth::Degraded, 0),
                (EdsHealth::Draining, 0),
                (EdsHealth::Unhealthy, 2)
            ]
        );

        // The same state again changes nothing: no new revision.
        index.set(&b, Some(&sb2));
        assert!(!index.commit());
        assert_eq!(index.revision(), 2);

        // Deleted: its services lose its endpoints; api has none left.
        index.set(&b, None);
        assert!(index.commit());
        assert_eq!(endpoints(&index, "web"), [(1001, EdsHealth::Healthy)]);
        assert!(!index
            .published
            .contains_key(&ServiceKey::new("default", "api")));
        assert_eq!(index.counts().map(|(_, n)| n).sum::<u64>(), 2);
    }

    #[test]
    fn an_endpoint_two_dataplanes_give_stays_until_both_are_gone() {
        let mut index = Index::new(EdsOptions::default());
        // Both name 127.0.0.1:1001 in web.
        let (a, sa) = state("a", &[("web", 1001)], Status::Healthy);
        let (b, sb) = state("b", &[("web", 1001), ("web", 1002)], Status::Healthy);
        index.set(&a, Some(&sa));
        index.set(&b, Some(&sb));
        assert!(index.commit());
        let web = |index: &Index| endpoints(index, "web");
        assert_eq!(
            web(&index),
            [(1001, EdsHealth::Healthy), (1002, EdsHealth::Healthy)]
        );
        assert_eq!(index.counts().map(|(_, n)| n).sum::<u64>(), 2);
        index.set(&b, None);
        assert!(index.commit());
        assert_eq!(web(&index), [(1001, EdsHealth::Healthy)]);
        assert_eq!(index.counts().map(|(_, n)| n).sum::<u64>(), 1);
        // Gone and back within one commit: the same assignment, no new revision.
        let revision = index.revision();
        index.set(&a, None);
        index.set(&a, Some(&sa));
        assert!(!index.commit());
        assert_eq!(index.revision(), revision);
        index.set(&a, None);
        assert!(index.commit());
        assert!(web(&index).is_empty());
        assert!(index.by_service.is_empty());
        assert_eq!(index.counts().map(|(_, n)| n).sum::<u64>(), 0);
    }

    /// A zone's dataplane as the global holds it: one healthy `web` inbound
    /// at `address:10001`.
    fn remote_web(name: &str, address: &str) -> crate::pb::Dataplane {
        crate::pb::Dataplane {
            mesh: "default".into(),
            name: name.into(),
            address: address.into(),
            inbounds: vec![crate::pb::Inbound {
                port: 10001,
                tags: [(SERVICE_TAG.to_string(), "web".to_string())].into(),
                health: Some(crate::pb::Health {
                    ready: true,
                    status: crate::pb::Status::Healthy as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A zone's dataplanes as the hub holds them.
    fn zone_of<const N: usize>(dataplanes: [crate::pb::Dataplane; N]) -> Dataplanes {
        dataplanes
            .into_iter()
            .map(|dp| (DataplaneId::new(&dp.mesh, &dp.name), Arc::new(dp)))
            .collect()
    }

    /// The same address in two zones is found as it comes and goes, one
    /// change at a time, and the published assignment carries it.
    #[test]
    fn an_address_two_zones_announce_is_counted_while_both_do() {
        let mut index = Index::new(EdsOptions::default());
        let (eu, us): (Arc<str>, Arc<str>) = (Arc::from("eu-1"), Arc::from("us-1"));
        let web = ServiceKey::new("default", "web");
        let duplicates = |index: &Index| index.published[&web].duplicates.clone();
        index.set_zone(
            &eu,
            ZoneLink::Online,
            &zone_of([remote_web("a", "10.0.0.9")]),
        );
        index.set_zone(
            &us,
            ZoneLink::Online,
            &zone_of([remote_web("b", "10.0.0.8")]),
        );
        assert!(index.commit());
        assert_eq!(index.duplicate_count(), 0);
        assert!(duplicates(&index).is_empty());

        // us-1 renumbers into eu-1's range: one address, two zones.
        index.set_zone(
            &us,
            ZoneLink::Online,
            &zone_of([remote_web("b", "10.0.0.9")]),
        );
        assert!(index.commit());
        assert_eq!(index.duplicate_count(), 1);
        let nine: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(duplicates(&index), [(nine, 10001)].into());
        // Both stay in the set: the encoding decides per front.
        assert_eq!(index.published[&web].endpoints.len(), 2);

        // Its health changes (withdrawn and given again): still one.
        index.set_zone(
            &us,
            ZoneLink::Offline,
            &zone_of([remote_web("b", "10.0.0.9")]),
        );
        assert!(index.commit());
        assert_eq!(index.duplicate_count(), 1);

        // The zone leaves: no duplicate.
        index.remove_zone(&us);
        assert!(index.commit());
        assert_eq!(index.duplicate_count(), 0);
        assert!(duplicates(&index).is_empty());
    }

    /// A local dataplane's address is counted from the first zone on, so a
    /// zone announcing it is found even when the local one came first.
    #[test]
    fn a_local_address_a_zone_also_announces_is_found() {
        let mut index = Index::new(EdsOptions::default());
        let (a, sa) = state("a", &[("web", 10001)], Status::Healthy);
        index.set(&a, Some(&sa));
        index.commit();
        let address = index.published[&ServiceKey::new("default", "web")]
            .endpoints
            .get_min()
            .unwrap()
            .address;
        let eu: Arc<str> = Arc::from("eu-1");
        index.set_zone(
            &eu,
            ZoneLink::Online,
            &zone_of([remote_web("r", &address.to_string())]),
        );
        index.commit();
        assert_eq!(index.duplicate_count(), 1);
        index.set(&a, None);
        index.commit();
        assert_eq!(index.duplicate_count(), 0);
    }

    #[test]
    fn replace_all_removes_dataplanes_that_are_gone() {
        let mut index = Index::new(EdsOptions::default());
        let (a, sa) = state("a", &[("web", 1001)], Status::Healthy);
        let (b, sb) = state("b", &[("web", 1002)], Status::Stale);
        index.set(&a, Some(&sa));
        index.set(&b, Some(&sb));
        index.commit();
        index.replace_all(&[(b.clone(), sb)].into());
        index.commit();
        assert_eq!(endpoints(&index, "web"), [(1002, EdsHealth::Degraded)]);
        let snap = index.snapshot(7, true);
        assert_eq!(snap.version_of(Some(&ServiceKey::new("default", "web"))), 2);
        assert_eq!(
            snap.version_of(Some(&ServiceKey::new("default", "nope"))),
            0
        );
        assert_eq!(snap.version_of(None), 0);
    }

    /// A stream in step reads only what changed (the recent changes); one
    /// that fell further behind than they reach reads every service; both
    /// end with every change and nothing sent twice.
    #[test]
    fn streams_find_what_changed_from_recent_changes_or_by_looking_at_each() {
        use crate::consumers::eds::protocol::EdsStream;
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

        let services: Vec<String> = (0..20).map(|i| format!("svc-{i:02}")).collect();
        let mut index = Index::new(EdsOptions::default());
        let mut states = Vec::new();
        for (i, service) in services.iter().enumerate() {
            let port = 1000 + i as u16;
            let healthy = state(&format!("dp-{i:02}"), &[(service, port)], Status::Healthy);
            let (_, down) = state(&format!("dp-{i:02}"), &[(service, port)], Status::Unhealthy);
            index.set(&healthy.0, Some(&healthy.1));
            states.push((healthy.0, healthy.1, down));
        }
        index.commit();
        let request = DiscoveryRequest {
            resource_names: services.iter().map(|s| format!("default/{s}")).collect(),
            ..Default::default()
        };
        let mut in_step = EdsStream::new();
        let mut behind = EdsStream::new();
        for s in [&mut in_step, &mut behind] {
            s.on_request(&request, &index.snapshot(1, true)).unwrap();
        }
        let names = |r: &Push| -> Vec<String> {
            r.message()
                .resources
                .iter()
                .map(|any| {
                    ClusterLoadAssignment::decode(any.value.as_slice())
                        .unwrap()
                        .cluster_name
                })
                .collect()
        };

        // Flip service 3, then 3 and 11 in one commit: the stream in step
        // gets exactly those.
        let (id3, _, down3) = &states[3];
        index.set(id3, Some(down3));
        index.commit();
        let r = in_step.on_change(&index.snapshot(1, true)).unwrap();
        assert_eq!(names(&r), ["default/svc-03"]);
        let (id11, _, down11) = &states[11];
        index.set(id3, Some(&states[3].1));
        index.set(id11, Some(down11));
        index.commit();
        let snap = index.snapshot(1, true);
        assert!(snap.changed_since(snap.revision - 1).is_some());
        let mut got = names(&in_step.on_change(&snap).unwrap());
        got.sort();
        assert_eq!(got, ["default/svc-03", "default/svc-11"]);
        assert!(in_step.on_change(&snap).is_none(), "nothing sent twice");

        // More flips than the recent changes hold (services 0 and 5, back
        // and forth), then service 5 down: the stream that missed them all
        // reads each service and gets every one whose version moved since it
        // was sent (0 ended as it began, at a newer version), no other.
        for n in 0..RECENT_CHANGES {
            let (id, up, down) = &states[n % 2 * 5];
            index.set(id, Some(if n % 4 < 2 { down } else { up }));
            index.commit();
        }
        let (id5, _, down5) = &states[5];
        index.set(id5, Some(down5));
        index.commit();
        let snap = index.snapshot(1, true);
        assert!(snap.changed_since(1).is_none(), "revision 1 is forgotten");
        let mut got = names(&behind.on_change(&snap).unwrap());
        got.sort();
        assert_eq!(
            got,
            [
                "default/svc-00",
                "default/svc-03",
                "default/svc-05",
                "default/svc-11"
            ]
        );
        // The stream in step is behind too now; both agree from here on.
        let mut got = names(&in_step.on_change(&snap).unwrap());
        got.sort();
        assert_eq!(got, ["default/svc-00", "default/svc-05"]);
    }
}
