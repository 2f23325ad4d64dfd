//! The fleet list in pages, its filters and its counts: pure, shared by
//! REST (`GET /api/v1/dataplanes`, `GET /api/v1/fleet/summary`) and gRPC
//! (`ListDataplanes`, `GetFleetSummary`).
//!
//! Paging follows Google AIP-158: a page size with a default and a
//! maximum, an opaque page token, a stable order. The order is the key
//! ([`Key`]: zone, mesh, name; this hdsd's own dataplanes first, then each
//! zone's by zone name). A token holds the last key of its page and a
//! fingerprint of the filters; the next page starts after that key, so a
//! dataplane present from the first page to the last is listed exactly
//! once whatever is added or removed meanwhile, and a page costs the
//! entries it walks (the catalog is a `BTreeMap`, a zone's dataplanes an
//! `imbl::OrdMap`: both are entered at the key with `range`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::dataplane::{DataplaneId, SERVICE_TAG};
use crate::feed::Zones;
use crate::history::Class;
use crate::readiness::Status;
use crate::view::DataplaneItem;

use super::services::{ServiceItem, Services};

/// The page size when a request gives none (or 0).
pub const DEFAULT_PAGE_SIZE: usize = 500;
/// The largest page; a larger `page_size` is lowered to it.
pub const MAX_PAGE_SIZE: usize = 5000;
/// The status word of an inbound declared `state: Ignored`.
pub const IGNORED: &str = "ignored";

/// The words `status` accepts: every inbound status, and `ignored`.
pub fn status_words() -> Vec<&'static str> {
    Status::ALL
        .iter()
        .map(|s| s.as_str())
        .chain([IGNORED])
        .collect()
}

/// What is wrong with a list request's parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("page_size {0:?} is not allowed: give a whole number from 1 to {MAX_PAGE_SIZE} (larger ones are lowered to {MAX_PAGE_SIZE}), or 0 or nothing for the default of {DEFAULT_PAGE_SIZE}")]
    PageSize(String),
    #[error("page_token is not one this server gave: pass the nextPageToken of the previous page unchanged, or leave page_token out to start from the first page")]
    Token,
    #[error("page_token belongs to a list with other filters: send the same mesh, service, zone, ready and status as the request that returned it, or leave page_token out to start from the first page with the new filters")]
    TokenFilters,
    #[error("ready {0:?} is not allowed: give ready=true, ready=false, or leave it out for both")]
    Ready(String),
    #[error("status {0:?} is not an inbound status: give one or more of {words}, separated by commas", words = status_words().join(", "))]
    Status(String),
}

/// Which dataplanes a list or a summary takes in. Empty fields match all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub mesh: Option<String>,
    /// Only dataplanes with an inbound of this `kuma.io/service`.
    pub service: Option<String>,
    /// Only dataplanes with an inbound that carries every one of these tags.
    pub selector: BTreeMap<String, String>,
    /// Whose dataplanes: this hdsd's own, one zone's, or (the default) all.
    pub zones: Zones,
    /// Only ready (true) or not ready (false) dataplanes.
    pub ready: Option<bool>,
    /// Only dataplanes with an inbound in one of these statuses.
    pub status: BTreeSet<String>,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            mesh: None,
            service: None,
            selector: BTreeMap::new(),
            zones: Zones::All,
            ready: None,
            status: BTreeSet::new(),
        }
    }
}

/// An empty parameter is an absent one.
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

impl Query {
    /// A query from the REST parameters (each as the URL spells it).
    pub fn from_params(
        mesh: Option<&str>,
        service: Option<&str>,
        zone: Option<&str>,
        ready: Option<&str>,
        status: Option<&str>,
    ) -> Result<Query, QueryError> {
        let ready = match given(ready) {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(other) => return Err(QueryError::Ready(other.to_string())),
        };
        Ok(Query {
            mesh: given(mesh).map(str::to_string),
            service: given(service).map(str::to_string),
            selector: BTreeMap::new(),
            zones: Zones::from_param(zone),
            ready,
            status: parse_status(given(status).into_iter().flat_map(|s| s.split(',')))?,
        })
    }

    /// Whether `item` (already taken in by its zone) matches.
    pub fn matches(&self, item: &DataplaneItem) -> bool {
        self.mesh.as_ref().is_none_or(|m| &item.mesh == m)
            && self.service.as_ref().is_none_or(|s| {
                item.inbounds
                    .iter()
                    .any(|i| i.tags.get(SERVICE_TAG) == Some(s))
            })
            && (self.selector.is_empty()
                || item
                    .inbounds
                    .iter()
                    .any(|i| self.selector.iter().all(|(k, v)| i.tags.get(k) == Some(v))))
            && self.ready.is_none_or(|r| item.is_ready() == r)
            && (self.status.is_empty()
                || item
                    .inbounds
                    .iter()
                    .any(|i| self.status.contains(&i.health.status)))
    }

    /// Whether this hdsd's own dataplanes are taken in.
    fn takes_local(&self) -> bool {
        matches!(self.zones, Zones::All | Zones::Local)
    }

    /// Whether zone `name`'s dataplanes are taken in.
    fn takes_zone(&self, name: &str) -> bool {
        match &self.zones {
            Zones::All => true,
            Zones::Local => false,
            Zones::Only(z) => z == name,
        }
    }

    /// A fingerprint of the filters (FNV-1a, the same in every process of
    /// every release that keeps this spelling), so a token is refused with
    /// other filters.
    pub fn fingerprint(&self) -> u64 {
        let zone = match &self.zones {
            Zones::All => String::new(),
            Zones::Local => crate::feed::LOCAL_ZONE.to_string(),
            Zones::Only(z) => format!("={z}"),
        };
        let ready = self.ready.map_or("", |r| if r { "true" } else { "false" });
        let mut text = String::new();
        for part in [
            self.mesh.as_deref().unwrap_or(""),
            self.service.as_deref().unwrap_or(""),
            zone.as_str(),
            ready,
        ] {
            text.push_str(part);
            text.push('\u{1f}');
        }
        for (k, v) in &self.selector {
            text.push_str(&format!("{k}\u{1e}{v}\u{1d}"));
        }
        text.push('\u{1f}');
        for s in &self.status {
            text.push_str(s);
            text.push('\u{1d}');
        }
        fnv1a(text.as_bytes())
    }
}

/// Status words from a request (trimmed, empty ones skipped), each known.
pub fn parse_status<'a>(
    words: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeSet<String>, QueryError> {
    let known = status_words();
    words
        .into_iter()
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| match known.contains(&w) {
            true => Ok(w.to_string()),
            false => Err(QueryError::Status(w.to_string())),
        })
        .collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A dataplane's place in the list: its zone (empty for this hdsd's own,
/// which come first), mesh, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub zone: String,
    pub id: DataplaneId,
}

impl Key {
    pub fn local(id: DataplaneId) -> Key {
        Key {
            zone: String::new(),
            id,
        }
    }
}

/// The token format's version: the first field of every token.
const TOKEN_VERSION: &str = "v1";

/// The token that continues after `last` under `query`'s filters:
/// base64url of the version, the key and the filters' fingerprint.
pub fn encode_token(last: &Key, query: &Query) -> String {
    let text = format!(
        "{TOKEN_VERSION}\0{}\0{}\0{}\0{:016x}",
        last.zone,
        last.id.mesh,
        last.id.name,
        query.fingerprint()
    );
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

/// The key a token continues after, when it was given for `query`'s filters.
pub fn decode_token(token: &str, query: &Query) -> Result<Key, QueryError> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim())
        .map_err(|_| QueryError::Token)?;
    let text = String::from_utf8(bytes).map_err(|_| QueryError::Token)?;
    let parts: Vec<&str> = text.split('\0').collect();
    let [TOKEN_VERSION, zone, mesh, name, fingerprint] = parts.as_slice() else {
        return Err(QueryError::Token);
    };
    let fingerprint = u64::from_str_radix(fingerprint, 16).map_err(|_| QueryError::Token)?;
    if mesh.is_empty() || name.is_empty() {
        return Err(QueryError::Token);
    }
    if fingerprint != query.fingerprint() {
        return Err(QueryError::TokenFilters);
    }
    Ok(Key {
        zone: zone.to_string(),
        id: DataplaneId::new(*mesh, *name),
    })
}

/// The page size a request asks for: 0 means the default, a larger one
/// than the maximum is lowered to it, a negative one is refused.
pub fn page_size(asked: i64) -> Result<usize, QueryError> {
    match asked {
        n if n < 0 => Err(QueryError::PageSize(n.to_string())),
        0 => Ok(DEFAULT_PAGE_SIZE),
        n => Ok(usize::try_from(n).map_or(MAX_PAGE_SIZE, |n| n.min(MAX_PAGE_SIZE))),
    }
}

/// The page size as the URL spells it (absent or empty: the default).
pub fn page_size_param(asked: Option<&str>) -> Result<usize, QueryError> {
    match given(asked) {
        None => Ok(DEFAULT_PAGE_SIZE),
        Some(text) => match text.parse::<i64>() {
            Ok(n) => page_size(n),
            // Digits beyond i64: a huge page, lowered to the maximum.
            Err(_) if text.bytes().all(|b| b.is_ascii_digit()) => Ok(MAX_PAGE_SIZE),
            Err(_) => Err(QueryError::PageSize(text.to_string())),
        },
    }
}

/// What one page asks for: its size and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    pub size: usize,
    /// The last key of the previous page; `None`: the first page.
    pub after: Option<Key>,
}

impl PageRequest {
    /// From a request's size and token (empty: the first page).
    pub fn new(size: usize, token: Option<&str>, query: &Query) -> Result<Self, QueryError> {
        let after = match given(token) {
            None => None,
            Some(t) => Some(decode_token(t, query)?),
        };
        Ok(PageRequest { size, after })
    }
}

/// One page: its items with their keys, and the key to continue after
/// when more may follow.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<(Key, T)>,
    pub next: Option<Key>,
}

impl<T> Page<T> {
    /// The token of the next page; `None` on the last.
    pub fn next_token(&self, query: &Query) -> Option<String> {
        self.next.as_ref().map(|k| encode_token(k, query))
    }
}

/// Takes `size` items of `items` (already after the token and filtered);
/// the page has a next one when one more item follows.
pub fn page<T>(mut items: impl Iterator<Item = (Key, T)>, size: usize) -> Page<T> {
    let taken: Vec<(Key, T)> = items.by_ref().take(size.max(1)).collect();
    let next = match items.next() {
        Some(_) => taken.last().map(|(k, _)| k.clone()),
        None => None,
    };
    Page { items: taken, next }
}

/// A zone's dataplanes as the walk reads them (the hub's `ZoneView`, or
/// plain maps in tests).
pub trait ZoneSource {
    type Value;
    fn name(&self) -> &str;
    fn dataplanes(&self) -> &imbl::OrdMap<DataplaneId, Self::Value>;
}

impl ZoneSource for crate::view::zones::ZoneView {
    type Value = std::sync::Arc<crate::pb::Dataplane>;
    fn name(&self) -> &str {
        &self.summary.name
    }
    fn dataplanes(&self) -> &imbl::OrdMap<DataplaneId, Self::Value> {
        &self.dataplanes
    }
}

/// Where a walk over one map of a mesh starts: after `after` when it is
/// in this map, at the mesh's first name with a mesh filter, else at the
/// start.
fn lower(mesh: Option<&str>, after: Option<&DataplaneId>) -> Bound<DataplaneId> {
    let mesh_start = mesh.map(|m| DataplaneId::new(m, ""));
    match (after, mesh_start) {
        (Some(a), Some(m)) if m > *a => Bound::Included(m),
        (Some(a), _) => Bound::Excluded(a.clone()),
        (None, Some(m)) => Bound::Included(m),
        (None, None) => Bound::Unbounded,
    }
}

/// Every item `query` takes in, in key order, after `after`: this hdsd's
/// own (`local`, turned into items by `local_item`), then each zone's
/// (`zones`, sorted by name; `remote_item`). Each map is entered at its
/// key, and a mesh filter stops a map's walk at the mesh's end.
pub fn walk<'a, L, Z, T>(
    local: Option<&'a BTreeMap<DataplaneId, L>>,
    zones: &'a [Z],
    query: &'a Query,
    after: Option<&'a Key>,
    local_item: &'a (impl Fn(&DataplaneId, &L) -> Option<T> + 'a),
    remote_item: &'a (impl Fn(&Z, &Z::Value) -> Option<T> + 'a),
) -> impl Iterator<Item = (Key, T)> + 'a
where
    L: 'a,
    Z: ZoneSource + 'a,
    T: AsItem + 'a,
{
    let mesh = query.mesh.as_deref();
    let in_mesh = move |id: &DataplaneId| mesh.is_none_or(|m| id.mesh == m);
    let local_after = match after {
        None => Some(None),
        Some(k) if k.zone.is_empty() => Some(Some(&k.id)),
        // The token is past this hdsd's own dataplanes.
        Some(_) => None,
    };
    let own = local
        .filter(|_| query.takes_local())
        .zip(local_after)
        .into_iter()
        .flat_map(move |(map, after)| {
            map.range((lower(mesh, after), Bound::Unbounded))
                .take_while(move |(id, _)| in_mesh(id))
                .filter_map(move |(id, value)| {
                    Some((Key::local(id.clone()), local_item(id, value)?))
                })
        });
    let remote = zones
        .iter()
        .filter(move |z| query.takes_zone(z.name()))
        .filter(move |z| after.is_none_or(|k| k.zone.is_empty() || z.name() >= k.zone.as_str()))
        .flat_map(move |z| {
            let after = after.filter(|k| k.zone == z.name()).map(|k| &k.id);
            z.dataplanes()
                .range((lower(mesh, after), Bound::Unbounded))
                .take_while(move |(id, _)| in_mesh(id))
                .filter_map(move |(id, value)| {
                    let key = Key {
                        zone: z.name().to_string(),
                        id: id.clone(),
                    };
                    Some((key, remote_item(z, value)?))
                })
        });
    own.chain(remote)
        .filter(move |(_, item)| query.matches(item.as_item()))
}

/// What the walk's filters read of an item.
pub trait AsItem {
    fn as_item(&self) -> &DataplaneItem;
}

impl AsItem for DataplaneItem {
    fn as_item(&self) -> &DataplaneItem {
        self
    }
}

/// The counts of the dataplanes a query takes in, by status and service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub dataplanes: DataplaneCounts,
    pub inbounds: InboundCounts,
    /// Per `kuma.io/service` of the dataplanes taken in (by Kuma's rules,
    /// as `GET /api/v1/services`), sorted by mesh and name.
    pub services: Vec<ServiceItem>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneCounts {
    pub total: u64,
    pub ready: u64,
    pub not_ready: u64,
    pub connected: u64,
    /// Dataplanes not ready by their worst class (`unhealthy`,
    /// `unsupported`, `zone_withdrawn`, `stale`, `not_ready`, `draining`,
    /// `pending`: as `GET /api/v1/history`).
    pub by_class: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundCounts {
    pub total: u64,
    pub ready: u64,
    pub not_ready: u64,
    /// Inbounds by status word (only the words that occur).
    pub by_status: BTreeMap<String, u64>,
}

/// Counts `items` one at a time (each dataplane once).
pub fn summarize<I: std::borrow::Borrow<DataplaneItem>>(
    items: impl IntoIterator<Item = I>,
) -> Summary {
    let mut counts = Summary::default();
    let mut services = Services::default();
    for item in items {
        counts.add(item.borrow());
        services.add(item.borrow());
    }
    counts.services = services.finish();
    counts
}

impl Summary {
    fn add(&mut self, item: &DataplaneItem) {
        let d = &mut self.dataplanes;
        d.total += 1;
        d.connected += u64::from(item.connection.connected);
        match item.is_ready() {
            true => d.ready += 1,
            false => d.not_ready += 1,
        }
        if let Some(worst) = item.inbounds.iter().filter_map(Class::of).min() {
            *d.by_class.entry(worst.as_str().to_string()).or_default() += 1;
        }
        let i = &mut self.inbounds;
        for inbound in &item.inbounds {
            i.total += 1;
            match inbound.health.ready {
                true => i.ready += 1,
                false => i.not_ready += 1,
            }
            match i.by_status.get_mut(&inbound.health.status) {
                Some(n) => *n += 1,
                None => {
                    i.by_status.insert(inbound.health.status.clone(), 1);
                }
            }
        }
    }
}

/// This hdsd's own dataplane as an item (`None` once deleted).
fn own_item(_: &DataplaneId, handle: &crate::registry::DataplaneHandle) -> Option<DataplaneItem> {
    DataplaneItem::from_state(&handle.state())
}

/// A zone's dataplane as an item, with the zone's state.
fn zone_item(
    zone: &crate::view::zones::ZoneView,
    dp: &std::sync::Arc<crate::pb::Dataplane>,
) -> Option<DataplaneItem> {
    DataplaneItem::from_remote(zone.zone_of(), dp)
}

/// The page of the fleet `request` asks for: the registry's catalog, then
/// (on a global) its zones' dataplanes.
pub fn fleet_page(
    catalog: &crate::registry::Catalog,
    zones: Option<&crate::view::zones::ZonesView>,
    query: &Query,
    request: &PageRequest,
) -> Page<DataplaneItem> {
    let zones = zones.map_or(&[][..], |z| z.zones.as_slice());
    let items = walk(
        Some(catalog),
        zones,
        query,
        request.after.as_ref(),
        &own_item,
        &zone_item,
    );
    page(items, request.size)
}

/// The counts of every dataplane `query` takes in, one item at a time.
pub fn fleet_summary(
    catalog: &crate::registry::Catalog,
    zones: Option<&crate::view::zones::ZonesView>,
    query: &Query,
) -> Summary {
    let zones = zones.map_or(&[][..], |z| z.zones.as_slice());
    let items = walk(Some(catalog), zones, query, None, &own_item, &zone_item);
    summarize(items.map(|(_, item)| item))
}

/// Every service (of `mesh`) of the registry's catalog and (on a global)
/// its zones' dataplanes, one item at a time, as
/// [`super::services::services`] counts them.
pub fn fleet_services(
    catalog: &crate::registry::Catalog,
    zones: Option<&crate::view::zones::ZonesView>,
    mesh: Option<&str>,
) -> Vec<ServiceItem> {
    let mut counted = Services::default();
    let own = catalog
        .values()
        .filter_map(|h| DataplaneItem::from_state(&h.state()));
    let remote = zones.into_iter().flat_map(|z| z.items());
    for item in own
        .chain(remote)
        .filter(|i| mesh.is_none_or(|m| i.mesh == m))
    {
        counted.add(&item);
    }
    counted.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::view::ZoneOfItem;

    /// A dataplane whose inbounds have these (service, status) pairs.
    fn item(
        mesh: &str,
        name: &str,
        zone: Option<&str>,
        inbounds: &[(&str, &str)],
    ) -> DataplaneItem {
        let mut item = crate::consumers::services::test_item(mesh, name, inbounds);
        item.zone = zone.map(|z| ZoneOfItem {
            name: z.into(),
            state: "online".into(),
        });
        item
    }

    /// A zone of a test fleet, as the walk reads it (the kept counts'
    /// tests use it too).
    pub(crate) struct TestZone {
        pub name: String,
        pub dataplanes: imbl::OrdMap<DataplaneId, DataplaneItem>,
    }

    impl ZoneSource for TestZone {
        type Value = DataplaneItem;
        fn name(&self) -> &str {
            &self.name
        }
        fn dataplanes(&self) -> &imbl::OrdMap<DataplaneId, DataplaneItem> {
            &self.dataplanes
        }
    }

    /// A fleet: this hdsd's own dataplanes, and zones sorted by name.
    #[derive(Default)]
    struct Fleet {
        own: BTreeMap<DataplaneId, DataplaneItem>,
        zones: Vec<TestZone>,
    }

    impl Fleet {
        fn add(&mut self, item: DataplaneItem) {
            let id = DataplaneId::new(item.mesh.clone(), item.name.clone());
            match item.zone.clone() {
                None => {
                    self.own.insert(id, item);
                }
                Some(z) => {
                    let at = match self.zones.binary_search_by(|t| t.name.cmp(&z.name)) {
                        Ok(at) => at,
                        Err(at) => {
                            self.zones.insert(
                                at,
                                TestZone {
                                    name: z.name.clone(),
                                    dataplanes: imbl::OrdMap::new(),
                                },
                            );
                            at
                        }
                    };
                    self.zones[at].dataplanes.insert(id, item);
                }
            }
        }

        fn remove(&mut self, zone: &str, mesh: &str, name: &str) {
            let id = DataplaneId::new(mesh, name);
            match zone {
                "" => {
                    self.own.remove(&id);
                }
                z => {
                    for t in self.zones.iter_mut().filter(|t| t.name == z) {
                        t.dataplanes.remove(&id);
                    }
                }
            }
        }

        fn page(
            &self,
            query: &Query,
            size: i64,
            token: Option<&str>,
        ) -> Result<(Vec<String>, Option<String>), QueryError> {
            let request = PageRequest::new(page_size(size)?, token, query)?;
            let own = |_: &DataplaneId, i: &DataplaneItem| Some(i.clone());
            let remote = |_: &TestZone, i: &DataplaneItem| Some(i.clone());
            let items = walk(
                Some(&self.own),
                &self.zones,
                query,
                request.after.as_ref(),
                &own,
                &remote,
            );
            let page = page(items, request.size);
            let names = page
                .items
                .iter()
                .map(|(k, _)| format!("{}:{}/{}", k.zone, k.id.mesh, k.id.name))
                .collect();
            Ok((names, page.next_token(query)))
        }

        /// Every page, in order, with `between` run before each next page.
        fn all(
            &mut self,
            query: &Query,
            size: i64,
            mut between: impl FnMut(&mut Fleet, usize),
        ) -> Vec<String> {
            let mut seen = Vec::new();
            let mut token: Option<String> = None;
            for n in 0.. {
                let (names, next) = self.page(query, size, token.as_deref()).unwrap();
                assert!(names.len() <= page_size(size).unwrap());
                seen.extend(names);
                match next {
                    Some(t) => token = Some(t),
                    None => break,
                }
                between(self, n);
            }
            seen
        }
    }

    fn fleet(own: usize, zones: &[&str], per_zone: usize) -> Fleet {
        let mut f = Fleet::default();
        for i in 0..own {
            let mesh = if i % 2 == 0 { "default" } else { "payments" };
            f.add(item(
                mesh,
                &format!("dp-{i:04}"),
                None,
                &[("web", "healthy")],
            ));
        }
        for z in zones {
            for i in 0..per_zone {
                f.add(item(
                    "default",
                    &format!("dp-{i:04}"),
                    Some(z),
                    &[("web", "unhealthy")],
                ));
            }
        }
        f
    }

    #[test]
    fn every_item_once_in_key_order_local_first() {
        let mut f = fleet(1200, &["east", "west"], 150);
        let seen = f.all(&Query::default(), 500, |_, _| {});
        assert_eq!(seen.len(), 1500);
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "the order is zone (own first), mesh, name");
        assert!(seen[0].starts_with(":default/"));
        assert!(seen[1499].starts_with("west:"));
        sorted.dedup();
        assert_eq!(sorted.len(), 1500);
    }

    #[test]
    fn the_last_page_has_no_token_even_when_full() {
        let f = fleet(1000, &[], 0);
        let (first, next) = f.page(&Query::default(), 500, None).unwrap();
        assert_eq!(first.len(), 500);
        let (second, next) = f.page(&Query::default(), 500, next.as_deref()).unwrap();
        assert_eq!(second.len(), 500);
        assert_eq!(next, None, "nothing follows: no token");
        let (all, next) = f.page(&Query::default(), 5000, None).unwrap();
        assert_eq!((all.len(), next), (1000, None));
        let empty = Fleet::default();
        assert_eq!(
            empty.page(&Query::default(), 10, None).unwrap(),
            (vec![], None)
        );
    }

    #[test]
    fn items_present_throughout_are_seen_once_while_others_come_and_go() {
        let mut f = fleet(1000, &["east"], 300);
        let seen = f.all(&Query::default(), 100, |f, n| {
            // Before and after the cursor, in every source.
            f.remove("", "default", &format!("dp-{:04}", n * 2));
            f.remove("", "payments", &format!("dp-{:04}", 999 - n * 2));
            f.add(item(
                "default",
                &format!("dp-{n:04}x"),
                None,
                &[("web", "healthy")],
            ));
            f.add(item(
                "default",
                &format!("aa-{n:04}"),
                Some("east"),
                &[("web", "healthy")],
            ));
            f.add(item(
                "default",
                &format!("zz-{n:04}"),
                Some("east"),
                &[("web", "healthy")],
            ));
            f.add(item(
                "default",
                "new",
                Some("middle"),
                &[("web", "healthy")],
            ));
        });
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), seen.len(), "no item twice");
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "order kept across pages");
        // Every item there from the first page to the last is listed (the
        // removals took the first even and the last odd numbers).
        for i in 100..900 {
            let mesh = if i % 2 == 0 { "default" } else { "payments" };
            assert!(
                seen.contains(&format!(":{mesh}/dp-{i:04}")),
                "{mesh}/dp-{i:04}"
            );
        }
        for i in (0..300).step_by(7) {
            assert!(seen.contains(&format!("east:default/dp-{i:04}")));
        }
        assert!(
            seen.contains(&"middle:default/new".to_string()),
            "a zone added ahead of the cursor is listed"
        );
    }

    #[test]
    fn a_token_with_other_filters_is_refused_and_a_forged_one_too() {
        let f = fleet(20, &[], 0);
        let mesh = Query {
            mesh: Some("default".into()),
            ..Query::default()
        };
        let (_, token) = f.page(&mesh, 5, None).unwrap();
        let token = token.unwrap();
        assert_eq!(
            f.page(&Query::default(), 5, Some(&token)),
            Err(QueryError::TokenFilters)
        );
        let ready = Query {
            ready: Some(false),
            ..mesh.clone()
        };
        assert_eq!(
            f.page(&ready, 5, Some(&token)),
            Err(QueryError::TokenFilters)
        );
        // Another page size is fine (AIP-158).
        assert!(f.page(&mesh, 7, Some(&token)).is_ok());
        for bad in ["x", "%%%", "djE", &token[1..]] {
            assert_eq!(f.page(&mesh, 5, Some(bad)), Err(QueryError::Token), "{bad}");
        }
        let message = QueryError::TokenFilters.to_string();
        assert!(
            message.contains("same mesh, service, zone, ready and status"),
            "{message}"
        );
    }

    #[test]
    fn a_token_round_trips_its_key() {
        let q = Query {
            service: Some("web".into()),
            status: ["unhealthy".to_string()].into(),
            ..Query::default()
        };
        let key = Key {
            zone: "east".into(),
            id: DataplaneId::new("default", "web-1"),
        };
        let token = encode_token(&key, &q);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "URL-safe: {token}"
        );
        assert_eq!(decode_token(&token, &q), Ok(key));
        assert_eq!(
            Query::default().fingerprint(),
            Query::default().fingerprint()
        );
        assert_ne!(q.fingerprint(), Query::default().fingerprint());
    }

    #[test]
    fn page_size_default_clamp_and_refusal() {
        assert_eq!(page_size(0), Ok(DEFAULT_PAGE_SIZE));
        assert_eq!(page_size(1), Ok(1));
        assert_eq!(page_size(MAX_PAGE_SIZE as i64 + 1), Ok(MAX_PAGE_SIZE));
        assert_eq!(page_size(-1), Err(QueryError::PageSize("-1".into())));
        assert_eq!(page_size_param(None), Ok(DEFAULT_PAGE_SIZE));
        assert_eq!(page_size_param(Some("")), Ok(DEFAULT_PAGE_SIZE));
        assert_eq!(
            page_size_param(Some("99999999999999999999999")),
            Ok(MAX_PAGE_SIZE)
        );
        assert_eq!(
            page_size_param(Some("ten")),
            Err(QueryError::PageSize("ten".into()))
        );
        let message = page_size_param(Some("-5")).unwrap_err().to_string();
        assert!(
            message.contains("1 to 5000") && message.contains("default of 500"),
            "{message}"
        );
    }

    #[test]
    fn filters_mesh_service_zone_ready_status() {
        let mut f = fleet(10, &["east", "west"], 3);
        f.add(item(
            "default",
            "api-1",
            None,
            &[("api", "healthy"), ("admin", "stale")],
        ));
        f.add(item(
            "default",
            "ignored-1",
            Some("east"),
            &[("api", "ignored")],
        ));
        let q = |mesh: Option<&str>,
                 service: Option<&str>,
                 zone: Option<&str>,
                 ready: Option<&str>,
                 status: Option<&str>| {
            Query::from_params(mesh, service, zone, ready, status).unwrap()
        };
        let names = |query: Query| f.page(&query, 100, None).unwrap().0;
        assert_eq!(names(q(Some("payments"), None, None, None, None)).len(), 5);
        assert_eq!(
            names(q(None, Some("api"), None, None, None)),
            [":default/api-1", "east:default/ignored-1"]
        );
        assert_eq!(names(q(None, None, Some("local"), None, None)).len(), 11);
        assert_eq!(names(q(None, None, Some("west"), None, None)).len(), 3);
        assert_eq!(
            names(q(None, None, Some(""), None, None)).len(),
            18,
            "empty: every zone"
        );
        assert_eq!(names(q(None, None, None, Some("false"), None)).len(), 7);
        assert_eq!(names(q(None, None, None, Some("true"), None)).len(), 11);
        assert_eq!(
            names(q(None, None, None, None, Some("stale,ignored"))),
            [":default/api-1", "east:default/ignored-1"]
        );
        assert_eq!(
            names(q(
                Some("default"),
                Some("web"),
                Some("east"),
                Some("false"),
                Some("unhealthy")
            ))
            .len(),
            3
        );
        assert_eq!(
            Query::from_params(None, None, None, Some("yes"), None),
            Err(QueryError::Ready("yes".into()))
        );
        let bad = Query::from_params(None, None, None, None, Some("healthy,sick")).unwrap_err();
        assert_eq!(bad, QueryError::Status("sick".into()));
        assert!(
            bad.to_string()
                .contains("not_probed, stale, unsupported, ignored"),
            "{bad}"
        );
    }

    #[test]
    fn a_mesh_filter_pages_within_its_mesh() {
        let mut f = fleet(1000, &["east"], 10);
        let q = Query {
            mesh: Some("payments".into()),
            ..Query::default()
        };
        let seen = f.all(&q, 120, |_, _| {});
        assert_eq!(seen.len(), 500);
        assert!(seen.iter().all(|s| s.starts_with(":payments/")));
    }

    #[test]
    fn summary_counts_by_readiness_status_class_and_service() {
        let items = [
            item(
                "default",
                "web-1",
                None,
                &[("web", "healthy"), ("web", "unhealthy")],
            ),
            item("default", "web-2", None, &[("web", "healthy")]),
            item("default", "db-1", Some("east"), &[("db", "pending")]),
        ];
        let s = summarize(&items);
        assert_eq!(
            (
                s.dataplanes.total,
                s.dataplanes.ready,
                s.dataplanes.not_ready
            ),
            (3, 1, 2)
        );
        assert_eq!(s.dataplanes.connected, 3);
        assert_eq!(
            s.dataplanes.by_class,
            [("unhealthy".to_string(), 1), ("pending".to_string(), 1)].into()
        );
        assert_eq!(
            (s.inbounds.total, s.inbounds.ready, s.inbounds.not_ready),
            (4, 2, 2)
        );
        assert_eq!(s.inbounds.by_status.get("healthy"), Some(&2));
        let services: Vec<(&str, u32, u32, u32)> = s
            .services
            .iter()
            .map(|x| {
                (
                    x.name.as_str(),
                    x.health.inbounds_ready,
                    x.health.inbounds_total,
                    x.health.dataplanes,
                )
            })
            .collect();
        assert_eq!(services, [("db", 0, 1, 1), ("web", 2, 3, 2)]);
        assert_eq!(
            s.services,
            super::super::services::services(&items, None),
            "the same as /api/v1/services"
        );
    }
}
