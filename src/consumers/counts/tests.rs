//! The counts against the walk they replace: random sequences of changes,
//! applied to the counts and to a fleet the walk reads, compared after
//! every change under every query the counts answer.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;
use crate::clock::{Clock as _, SystemClock};
use crate::consumers::paging::{self, summarize, walk};
use crate::consumers::services::{services, test_item};
use crate::pb;
use crate::view::zones::ZoneSummary;
use crate::view::zones::{Liveness, ZoneState};
use crate::view::{ReasonItem, ZoneOfItem};

const MESHES: [&str; 2] = ["default", "payments"];
const SERVICES: [&str; 3] = ["web", "api", "db"];
const ZONES: [&str; 3] = ["east", "west", "north"];

use crate::consumers::paging::tests::TestZone;

/// What the walk reads: own dataplanes, and each zone's.
#[derive(Default)]
struct Fleet {
    own: BTreeMap<DataplaneId, DataplaneItem>,
    zones: BTreeMap<String, imbl::OrdMap<DataplaneId, DataplaneItem>>,
}

impl Fleet {
    fn zones(&self) -> Vec<TestZone> {
        self.zones
            .iter()
            .map(|(name, dataplanes)| TestZone {
                name: name.clone(),
                dataplanes: dataplanes.clone(),
            })
            .collect()
    }

    /// The walk's summary: today's answer.
    fn summary(&self, query: &Query) -> Summary {
        let zones = self.zones();
        let own = |_: &DataplaneId, i: &DataplaneItem| Some(i.clone());
        let remote = |_: &TestZone, i: &DataplaneItem| Some(i.clone());
        let items = walk(Some(&self.own), &zones[..], query, None, &own, &remote);
        summarize(items.map(|(_, i)| i))
    }

    /// `GET /api/v1/services` as today: every item, then the mesh.
    fn services(&self, mesh: Option<&str>) -> Vec<ServiceItem> {
        let items: Vec<DataplaneItem> = self
            .own
            .values()
            .chain(self.zones.values().flat_map(|z| z.values()))
            .cloned()
            .collect();
        services(&items, mesh)
    }
}

/// Every query the counts answer, over the meshes and zones in play.
fn queries() -> Vec<Query> {
    let meshes = [None, Some("default"), Some("payments"), Some("other")];
    let zones = [
        Zones::All,
        Zones::Local,
        Zones::Only("east".into()),
        Zones::Only("west".into()),
        Zones::Only("nowhere".into()),
    ];
    let mut out = Vec::new();
    for mesh in meshes {
        for zone in &zones {
            for ready in [None, Some(true), Some(false)] {
                out.push(Query {
                    mesh: mesh.map(str::to_string),
                    zones: zone.clone(),
                    ready,
                    ..Query::default()
                });
            }
        }
    }
    out
}

/// A dataplane with 0-3 inbounds of random services (some with none) and
/// statuses, readiness not always what the status says (the counts must
/// not assume it), some reasons of a withdrawn zone, connected or not.
fn random_item(rng: &mut StdRng, id: &DataplaneId, zone: Option<&str>) -> DataplaneItem {
    let statuses = paging::status_words();
    let inbounds: Vec<(&str, &str)> = (0..rng.gen_range(0..4))
        .map(|_| {
            (
                *SERVICES.choose(rng).unwrap(),
                *statuses.choose(rng).unwrap(),
            )
        })
        .collect();
    let mut item = test_item(&id.mesh, &id.name, &inbounds);
    for inbound in &mut item.inbounds {
        if rng.gen_bool(0.15) {
            inbound.tags.clear();
        }
        if rng.gen_bool(0.15) {
            inbound.health.ready = !inbound.health.ready;
        }
        if rng.gen_bool(0.1) {
            inbound.health.reason = Some(ReasonItem {
                code: "zone_offline".into(),
                message: "withdrawn".into(),
            });
        }
    }
    item.connection.connected = rng.gen_bool(0.7);
    item.zone = zone.map(|z| ZoneOfItem {
        name: z.into(),
        state: "online".into(),
    });
    item
}

fn random_id(rng: &mut StdRng) -> DataplaneId {
    DataplaneId::new(
        *MESHES.choose(rng).unwrap(),
        format!("dp-{}", rng.gen_range(0..12)),
    )
}

fn assert_same(fleet: &Fleet, counts: &Counts, step: &str) {
    for query in queries() {
        assert_eq!(
            counts.summary(&query).as_ref(),
            Some(&fleet.summary(&query)),
            "{step}: {query:?}"
        );
    }
    for mesh in [None, Some("default"), Some("payments"), Some("other")] {
        assert_eq!(
            counts.services(mesh),
            fleet.services(mesh),
            "{step}: services of {mesh:?}"
        );
    }
}

#[test]
fn random_changes_count_as_the_walk_does() {
    for seed in 0..24 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut fleet = Fleet::default();
        let mut aggregate = Aggregate::default();
        for step in 0..250 {
            let label = format!("seed {seed}, step {step}");
            match rng.gen_range(0..10) {
                // One of this hdsd's own: defined, changed or deleted.
                0..=4 => {
                    let id = random_id(&mut rng);
                    let item = rng.gen_bool(0.8).then(|| random_item(&mut rng, &id, None));
                    aggregate.apply(Change::Own(&id, item.as_ref()));
                    match item {
                        Some(item) => fleet.own.insert(id, item),
                        None => fleet.own.remove(&id),
                    };
                }
                // A zone's dataplane.
                5..=8 => {
                    let zone = *ZONES.choose(&mut rng).unwrap();
                    let id = random_id(&mut rng);
                    let item = rng
                        .gen_bool(0.8)
                        .then(|| random_item(&mut rng, &id, Some(zone)));
                    aggregate.apply(Change::Remote(zone, &id, item.as_ref()));
                    let map = fleet.zones.entry(zone.to_string()).or_default();
                    match item {
                        Some(item) => map.insert(id, item),
                        None => map.remove(&id),
                    };
                }
                // A zone gone, with its dataplanes.
                _ => {
                    let zone = *ZONES.choose(&mut rng).unwrap();
                    aggregate.apply(Change::ZoneGone(zone));
                    fleet.zones.remove(zone);
                }
            }
            assert_same(&fleet, &aggregate.counts(), &label);
        }
        // Everything gone: nothing counted, nothing left behind.
        let own: Vec<DataplaneId> = fleet.own.keys().cloned().collect();
        for id in own {
            aggregate.apply(Change::Own(&id, None));
        }
        for zone in ZONES {
            aggregate.apply(Change::ZoneGone(zone));
        }
        assert!(
            aggregate.cells.is_empty(),
            "seed {seed}: {:?}",
            aggregate.cells
        );
    }
}

#[test]
fn filters_the_counts_do_not_keep_are_left_to_the_walk() {
    let counts = Aggregate::default().counts();
    let service = Query {
        service: Some("web".into()),
        ..Query::default()
    };
    let status = Query {
        status: BTreeSet::from(["healthy".to_string()]),
        ..Query::default()
    };
    let selector = Query {
        selector: [("version".to_string(), "2".to_string())].into(),
        ..Query::default()
    };
    for query in [service, status, selector] {
        assert!(!covers(&query));
        assert_eq!(counts.summary(&query), None, "{query:?}");
    }
    assert!(covers(&Query::default()));
}

#[test]
fn a_report_that_moves_no_count_leaves_the_counts_shared() {
    let mut aggregate = Aggregate::default();
    let id = DataplaneId::new("default", "web-1");
    let item = test_item("default", "web-1", &[("web", "healthy")]);
    aggregate.apply(Change::Own(&id, Some(&item)));
    let before = aggregate.counts();
    let mut later = item.clone();
    later.connection.last_report_at = Some(SystemClock.now());
    aggregate.apply(Change::Own(&id, Some(&later)));
    assert!(before.cells.ptr_eq(&aggregate.counts().cells));
}

// The hub's views, as a global's counts follow them.

fn pb_dataplane(rng: &mut StdRng, id: &DataplaneId) -> Arc<pb::Dataplane> {
    let statuses = [
        pb::Status::Healthy,
        pb::Status::Unhealthy,
        pb::Status::Pending,
        pb::Status::Stale,
        pb::Status::Unsupported,
    ];
    Arc::new(pb::Dataplane {
        mesh: id.mesh.clone(),
        name: id.name.clone(),
        // Now and then one the view cannot show: left out by both.
        address: match rng.gen_bool(0.05) {
            true => "not-an-address".into(),
            false => "10.0.0.1".into(),
        },
        connection: Some(pb::Connection {
            connected: rng.gen_bool(0.7),
            ..Default::default()
        }),
        inbounds: (0..rng.gen_range(0..3))
            .map(|i| {
                let status = *statuses.choose(rng).unwrap();
                pb::Inbound {
                    port: 10000 + i,
                    service_port: 8080,
                    service_address: "127.0.0.1".into(),
                    tags: match rng.gen_bool(0.85) {
                        true => [(
                            SERVICE_TAG.to_string(),
                            SERVICES.choose(rng).unwrap().to_string(),
                        )]
                        .into(),
                        false => Default::default(),
                    },
                    health: Some(pb::Health {
                        ready: status == pb::Status::Healthy,
                        status: status as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    })
}

fn zone_view(name: &str) -> ZoneView {
    ZoneView {
        summary: ZoneSummary {
            name: name.into(),
            liveness: Liveness {
                state: ZoneState::Online,
                since: None,
                last_seen: None,
                offline_at: None,
            },
            registered: true,
            registered_by: Some("config"),
            instance: None,
            held_by: None,
            held: None,
            dataplanes: 0,
            inbounds_ready: 0,
            inbounds_total: 0,
            withdrawn: false,
            counters: Default::default(),
        },
        dataplanes: Default::default(),
    }
}

/// The walk over a global's zones (it has no dataplane of its own), as
/// [`paging::fleet_summary`] reads the hub's view.
fn walked(view: &ZonesView, query: &Query) -> Summary {
    let own: Option<&BTreeMap<DataplaneId, ()>> = None;
    let own_item = |_: &DataplaneId, _: &()| None::<DataplaneItem>;
    let zone_item =
        |z: &ZoneView, dp: &Arc<pb::Dataplane>| DataplaneItem::from_remote(z.zone_of(), dp);
    let items = walk(
        own,
        view.zones.as_slice(),
        query,
        None,
        &own_item,
        &zone_item,
    );
    summarize(items.map(|(_, i)| i))
}

#[test]
fn a_global_counts_its_zones_views_as_the_walk_does() {
    let states = [
        ZoneState::Online,
        ZoneState::Offline,
        ZoneState::Disabled,
        ZoneState::NeverConnected,
    ];
    for seed in 0..16 {
        let mut rng = StdRng::seed_from_u64(1000 + seed);
        let mut aggregate = Aggregate::default();
        let mut prev = Arc::new(ZonesView::default());
        for step in 0..150 {
            let mut next = ZonesView::clone(&prev);
            // A few moves per view, as the hub batches them.
            for _ in 0..rng.gen_range(1..4) {
                let name = *ZONES.choose(&mut rng).unwrap();
                let at = next
                    .zones
                    .binary_search_by(|z| z.summary.name.as_str().cmp(name));
                match (rng.gen_range(0..10), at) {
                    (_, Err(at)) => next.zones.insert(at, zone_view(name)),
                    (0..=5, Ok(at)) => {
                        let id = random_id(&mut rng);
                        let map = &mut next.zones[at].dataplanes;
                        match rng.gen_bool(0.8) {
                            true => map.insert(id.clone(), pb_dataplane(&mut rng, &id)),
                            false => map.remove(&id),
                        };
                    }
                    (6, Ok(at)) => {
                        let s = &mut next.zones[at].summary;
                        s.withdrawn = !s.withdrawn;
                    }
                    (7 | 8, Ok(at)) => {
                        next.zones[at].summary.liveness.state = *states.choose(&mut rng).unwrap();
                    }
                    (_, Ok(at)) => {
                        next.zones.remove(at);
                    }
                }
            }
            let next = Arc::new(next);
            apply_zones(&mut aggregate, &prev, &next);
            let counts = aggregate.counts();
            for query in queries() {
                assert_eq!(
                    counts.summary(&query),
                    Some(walked(&next, &query)),
                    "seed {seed}, step {step}: {query:?}"
                );
            }
            let items: Vec<DataplaneItem> = next.items().collect();
            assert_eq!(
                counts.services(None),
                services(&items, None),
                "seed {seed}, step {step}"
            );
            prev = next;
        }
    }
}
