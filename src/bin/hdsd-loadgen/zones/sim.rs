//! One simulated zone's dataplanes and change feed, as plain data: what a
//! zone hdsd's registry and feed would hand its uplink. The protocol itself
//! is hdsd's own zone state machine ([`hdsd::zones::zone::uplink::Uplink`]); this
//! answers its `Subscribe` actions with feed events and makes the flips.

use std::collections::HashMap;

use hdsd::pb;
use hdsd::zones::zone::uplink::Event;

/// The first inbound port of every simulated dataplane.
const INBOUND_PORT: u32 = 10_001;

/// A zone's name: `<prefix><index + 1>`, two digits at least.
pub fn zone_name(prefix: &str, index: usize) -> String {
    format!("{prefix}{:02}", index + 1)
}

/// The zone index a [`zone_name`] names.
pub fn zone_index(prefix: &str, name: &str) -> Option<usize> {
    let n: usize = name.strip_prefix(prefix)?.parse().ok()?;
    n.checked_sub(1)
}

/// A dataplane's name in its zone.
pub fn dataplane_name(index: usize) -> String {
    format!("dp-{index:06}")
}

/// The dataplane index a [`dataplane_name`] names.
pub fn dataplane_index(name: &str) -> Option<usize> {
    name.strip_prefix("dp-")?.parse().ok()
}

/// How big a zone is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Dataplanes in the zone.
    pub dataplanes: usize,
    /// Inbounds per dataplane (at least 1).
    pub inbounds: usize,
    /// Services the dataplanes are spread over (at least 1).
    pub services: usize,
    /// Changes the feed can replay (older ones need a snapshot), like
    /// hdsd's change history.
    pub history: u64,
}

/// One simulated zone: its dataplanes, each with the revision of its last
/// change, and the zone's revision.
#[derive(Debug, Clone)]
pub struct SimZone {
    shape: Shape,
    dataplanes: Vec<pb::Dataplane>,
    revision: u64,
    /// Changes made so far, so the next flip's dataplane.
    flips: u64,
}

impl SimZone {
    /// `shape.dataplanes` dataplanes of mesh `mesh`, every inbound ready,
    /// created at revisions 1..=n (the zone's revision is n), at `now`.
    pub fn new(zone: usize, mesh: &str, shape: Shape, now: prost_types::Timestamp) -> SimZone {
        let inbounds = shape.inbounds.max(1);
        let services = shape.services.max(1);
        let dataplanes = (0..shape.dataplanes)
            .map(|i| pb::Dataplane {
                mesh: mesh.to_string(),
                name: dataplane_name(i),
                address: address(zone, i),
                connection: Some(pb::Connection {
                    connected: true,
                    connected_at: Some(now),
                    last_report_at: Some(now),
                    envoy_version: "1.40.0".into(),
                    ..Default::default()
                }),
                inbounds: (0..inbounds)
                    .map(|k| pb::Inbound {
                        port: INBOUND_PORT + k as u32,
                        service_port: 20_001 + k as u32,
                        service_address: "127.0.0.1".into(),
                        tags: HashMap::from([
                            (
                                "kuma.io/service".to_string(),
                                format!("svc-{:04}-{k}", i % services),
                            ),
                            ("kuma.io/protocol".to_string(), "http".to_string()),
                        ]),
                        health: Some(health(true, now)),
                        address: String::new(),
                        operator_word: 0,
                    })
                    .collect(),
                revision: i as u64 + 1,
                ready: true,
                zone: None,
            })
            .collect();
        SimZone {
            shape,
            dataplanes,
            revision: shape.dataplanes as u64,
            flips: 0,
        }
    }

    /// The zone's revision: its last change's.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision a resume may start after: the creations and the
    /// last `history` changes can be replayed, nothing older.
    pub fn floor(&self) -> u64 {
        let created = self.shape.dataplanes as u64;
        created.max(self.revision.saturating_sub(self.shape.history))
    }

    /// Flips the next dataplane (in turn) at `now`: its first inbound goes
    /// ready <-> not ready, and so does the dataplane (its other inbounds
    /// stay ready). Returns its index and the dataplane as the feed hands it
    /// over; `None` for an empty zone.
    pub fn flip(&mut self, now: prost_types::Timestamp) -> Option<(usize, pb::Dataplane)> {
        if self.dataplanes.is_empty() {
            return None;
        }
        let i = (self.flips % self.dataplanes.len() as u64) as usize;
        self.flips += 1;
        self.revision += 1;
        let dp = &mut self.dataplanes[i];
        let ready = !dp.ready;
        if let Some(inbound) = dp.inbounds.first_mut() {
            inbound.health = Some(health(ready, now));
        }
        if let Some(c) = dp.connection.as_mut() {
            c.last_report_at = Some(now);
        }
        dp.ready = ready;
        dp.revision = self.revision;
        Some((i, dp.clone()))
    }

    /// What the feed delivers when subscribed after `since` (`None`: from a
    /// snapshot): a snapshot and SYNCED; or the dataplanes changed after
    /// `since`, each once with its latest state, in revision order, then
    /// SYNCED; or a RESYNC when `since` is outside what can be replayed
    /// (the uplink then subscribes for a snapshot).
    pub fn subscribe(&self, since: Option<u64>) -> Vec<Event> {
        let Some(since) = since else {
            return vec![
                Event::FeedSnapshot {
                    revision: self.revision,
                    items: self.dataplanes.clone(),
                },
                Event::FeedSynced {
                    revision: self.revision,
                },
            ];
        };
        if since < self.floor() {
            return vec![Event::FeedResync {
                reason: "too_old".into(),
            }];
        }
        if since > self.revision {
            return vec![Event::FeedResync {
                reason: "unknown_revision".into(),
            }];
        }
        let mut changed: Vec<&pb::Dataplane> = self
            .dataplanes
            .iter()
            .filter(|d| d.revision > since)
            .collect();
        changed.sort_by_key(|d| d.revision);
        changed
            .into_iter()
            .map(|d| Event::FeedChange(d.clone()))
            .chain([Event::FeedSynced {
                revision: self.revision,
            }])
            .collect()
    }
}

/// Dataplane `i` of zone `zone`: 10.<zone>.<i / 256>.<i % 256> (unique
/// across zones of up to 65,536 dataplanes).
fn address(zone: usize, i: usize) -> String {
    format!("10.{}.{}.{}", zone % 256, (i / 256) % 256, i % 256)
}

fn health(ready: bool, now: prost_types::Timestamp) -> pb::Health {
    let status = if ready {
        pb::Status::Healthy
    } else {
        pb::Status::Unhealthy
    };
    pb::Health {
        ready,
        status: status as i32,
        since: Some(now),
        last_report_at: Some(now),
        reason: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize, history: u64) -> Shape {
        Shape {
            dataplanes: n,
            inbounds: 2,
            services: 3,
            history,
        }
    }

    fn zone(n: usize, history: u64) -> SimZone {
        SimZone::new(
            0,
            "default",
            shape(n, history),
            prost_types::Timestamp::default(),
        )
    }

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::FeedChange(d) => format!("{}@{}", d.name, d.revision),
                Event::FeedSynced { revision } => format!("synced@{revision}"),
                Event::FeedSnapshot { revision, items } => {
                    format!("snapshot@{revision}x{}", items.len())
                }
                Event::FeedResync { reason } => format!("resync:{reason}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(zone_name("lz-", 0), "lz-01");
        assert_eq!(zone_name("lz-", 11), "lz-12");
        assert_eq!(zone_index("lz-", "lz-12"), Some(11));
        assert_eq!(zone_index("lz-", "eu-1"), None);
        assert_eq!(zone_index("lz-", "lz-00"), None);
        assert_eq!(dataplane_name(42), "dp-000042");
        assert_eq!(dataplane_index("dp-000042"), Some(42));
        assert_eq!(dataplane_index("web-1"), None);
    }

    #[test]
    fn a_new_zone_is_ready_and_snapshots_everything() {
        let z = zone(3, 100);
        assert_eq!(z.revision(), 3);
        let events = z.subscribe(None);
        assert_eq!(names(&events), ["snapshot@3x3", "synced@3"]);
        let Event::FeedSnapshot { items, .. } = &events[0] else {
            unreachable!()
        };
        assert!(items.iter().all(|d| d.ready && d.inbounds.len() == 2));
        assert_eq!(items[1].address, "10.0.0.1");
        assert_eq!(
            items[2].inbounds[1].tags["kuma.io/service"], "svc-0002-1",
            "services spread the dataplanes"
        );
    }

    #[test]
    fn flips_take_the_dataplanes_in_turn_and_toggle_readiness() {
        let mut z = zone(2, 100);
        let (i, d) = z.flip(prost_types::Timestamp::default()).unwrap();
        assert_eq!((i, d.revision, d.ready), (0, 3, false));
        assert_eq!(
            d.inbounds[0].health.as_ref().unwrap().status,
            pb::Status::Unhealthy as i32
        );
        assert!(d.inbounds[1].health.as_ref().unwrap().ready);
        let (i, d) = z.flip(prost_types::Timestamp::default()).unwrap();
        assert_eq!((i, d.revision, d.ready), (1, 4, false));
        let (i, d) = z.flip(prost_types::Timestamp::default()).unwrap();
        assert_eq!((i, d.revision, d.ready), (0, 5, true));
        assert_eq!(z.revision(), 5);
        assert!(zone(0, 10)
            .flip(prost_types::Timestamp::default())
            .is_none());
    }

    #[test]
    fn a_resume_replays_each_changed_dataplane_once_in_revision_order() {
        let mut z = zone(3, 100);
        let now = prost_types::Timestamp::default();
        z.flip(now); // dp 0 @4
        z.flip(now); // dp 1 @5
        z.flip(now); // dp 2 @6
        z.flip(now); // dp 0 @7
        assert_eq!(
            names(&z.subscribe(Some(4))),
            ["dp-000001@5", "dp-000002@6", "dp-000000@7", "synced@7"]
        );
        assert_eq!(names(&z.subscribe(Some(7))), ["synced@7"]);
        assert_eq!(names(&z.subscribe(Some(8))), ["resync:unknown_revision"]);
    }

    #[test]
    fn a_resume_older_than_the_history_asks_for_a_snapshot() {
        let mut z = zone(2, 3);
        assert_eq!(z.floor(), 2, "the creations can be replayed");
        assert_eq!(names(&z.subscribe(Some(1))), ["resync:too_old"]);
        for _ in 0..5 {
            z.flip(prost_types::Timestamp::default());
        }
        assert_eq!(z.revision(), 7);
        assert_eq!(z.floor(), 4);
        assert_eq!(names(&z.subscribe(Some(3))), ["resync:too_old"]);
        assert_eq!(
            names(&z.subscribe(Some(4))),
            ["dp-000001@6", "dp-000000@7", "synced@7"]
        );
    }
}
