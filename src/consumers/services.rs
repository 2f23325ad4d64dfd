//! Per-service health: the dataplanes' inbounds grouped by their
//! `kuma.io/service` tag, with Kuma's rules. A pure function of the items.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::view::DataplaneItem;

/// The tag that names an inbound's service.
pub use crate::dataplane::SERVICE_TAG;

/// A service's health, by Kuma's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceStatus {
    /// Every inbound is ready.
    Online,
    /// Some, not all, inbounds are ready.
    PartiallyDegraded,
    /// No inbound is ready, or no dataplane of the service is connected.
    Offline,
}

/// One `kuma.io/service` value in one mesh: over every zone, and (when a
/// global holds zones) zone by zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceItem {
    pub mesh: String,
    pub name: String,
    #[serde(flatten)]
    pub health: ServiceHealth,
    /// The same per zone (`local`: this hdsd's own dataplanes), in zone
    /// order; empty (and left out) when no dataplane of the service is in a
    /// zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ServiceZoneItem>,
}

/// One service in one zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceZoneItem {
    /// The zone's name; `local` for this hdsd's own dataplanes.
    pub zone: String,
    #[serde(flatten)]
    pub health: ServiceHealth,
}

/// A service's inbounds and dataplanes (in all, or in one zone) and its
/// status by Kuma's rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceHealth {
    pub inbounds_ready: u32,
    pub inbounds_total: u32,
    pub dataplanes: u32,
    pub dataplanes_connected: u32,
    pub status: ServiceStatus,
}

/// What is counted of a service (in one zone, or in all).
#[derive(Debug, Default)]
struct Acc {
    ready: u32,
    total: u32,
    dataplanes: u32,
    connected: u32,
}

impl Acc {
    fn health(&self) -> ServiceHealth {
        ServiceHealth {
            inbounds_ready: self.ready,
            inbounds_total: self.total,
            dataplanes: self.dataplanes,
            dataplanes_connected: self.connected,
            status: if self.ready == 0 || self.connected == 0 {
                ServiceStatus::Offline
            } else if self.ready == self.total {
                ServiceStatus::Online
            } else {
                ServiceStatus::PartiallyDegraded
            },
        }
    }
}

/// The zone name of this hdsd's own dataplanes in [`ServiceZoneItem`].
pub const LOCAL_ZONE: &str = crate::names::RESERVED_ZONE;

/// One service's counts: in all, per zone, and whether any is in a zone.
type Counted = (Acc, BTreeMap<String, Acc>, bool);

/// One service's inbounds and dataplanes in one cell of the kept counts
/// ([`super::counts`]), as [`Services`] counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceTally {
    pub ready: u32,
    pub total: u32,
    pub dataplanes: u32,
    pub connected: u32,
}

/// Per-service counts built one item at a time, so a caller walking a
/// large fleet holds one item and the services, never the whole list.
/// Each item must be added once (a dataplane counts once per service).
#[derive(Debug, Default)]
pub struct Services {
    by_service: BTreeMap<(String, String), Counted>,
}

impl Services {
    /// Counts `item`'s inbounds under their `kuma.io/service` tags.
    pub fn add(&mut self, item: &DataplaneItem) {
        let zone = item.zone.as_ref().map(|z| z.name.as_str());
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for inbound in &item.inbounds {
            let Some(service) = inbound.tags.get(SERVICE_TAG) else {
                continue;
            };
            let first = seen.insert(service.as_str());
            let (all, zones, zoned) = self
                .by_service
                .entry((item.mesh.clone(), service.clone()))
                .or_default();
            *zoned |= zone.is_some();
            let in_zone = zones
                .entry(zone.unwrap_or(LOCAL_ZONE).to_string())
                .or_default();
            for acc in [all, in_zone] {
                acc.total += 1;
                acc.ready += u32::from(inbound.health.ready);
                if first {
                    acc.dataplanes += 1;
                    acc.connected += u32::from(item.connection.connected);
                }
            }
        }
    }

    /// Counts what a cell of [`super::counts`] holds of one service in one
    /// zone (`None`: this hdsd's own), as [`Services::add`] would have
    /// counted those dataplanes one by one.
    pub fn add_counted(
        &mut self,
        mesh: &str,
        service: &str,
        zone: Option<&str>,
        counted: &ServiceTally,
    ) {
        let key = (mesh.to_string(), service.to_string());
        let (all, zones, zoned) = self.by_service.entry(key).or_default();
        *zoned |= zone.is_some();
        let in_zone = zones
            .entry(zone.unwrap_or(LOCAL_ZONE).to_string())
            .or_default();
        for acc in [all, in_zone] {
            acc.ready += counted.ready;
            acc.total += counted.total;
            acc.dataplanes += counted.dataplanes;
            acc.connected += counted.connected;
        }
    }

    /// The services, sorted by mesh and name, by Kuma's rules.
    pub fn finish(self) -> Vec<ServiceItem> {
        self.by_service
            .into_iter()
            .map(|((mesh, name), (all, zones, zoned))| ServiceItem {
                mesh,
                name,
                health: all.health(),
                zones: if zoned {
                    zones
                        .into_iter()
                        .map(|(zone, acc)| ServiceZoneItem {
                            zone,
                            health: acc.health(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            })
            .collect()
    }
}

/// The services of `items` (optionally of one mesh), sorted by mesh and
/// name, by Kuma's rules, in total and per zone.
pub fn services(items: &[DataplaneItem], mesh: Option<&str>) -> Vec<ServiceItem> {
    let mut counted = Services::default();
    for item in items.iter().filter(|i| mesh.is_none_or(|m| i.mesh == m)) {
        counted.add(item);
    }
    counted.finish()
}

/// A test dataplane of `mesh` whose inbounds have these (service, status)
/// pairs (ready when the status is one of the ready ones), connected.
#[cfg(test)]
pub(crate) fn test_item(mesh: &str, name: &str, inbounds: &[(&str, &str)]) -> DataplaneItem {
    use crate::view::{ConnectionItem, HealthItem, InboundItem};
    use chrono::{TimeZone, Utc};
    let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    DataplaneItem {
        mesh: mesh.into(),
        name: name.into(),
        address: "127.0.0.1".parse().unwrap(),
        kind: crate::dataplane::DataplaneKind::Sidecar,
        listeners: Vec::new(),
        zone: None,
        connection: ConnectionItem {
            connected: true,
            connected_at: None,
            last_report_at: None,
            held_by: None,
            envoy_version: None,
            problem: None,
            token_expires_at: None,
        },
        inbounds: inbounds
            .iter()
            .enumerate()
            .map(|(i, (service, status))| InboundItem {
                port: 10000 + i as u16,
                service_port: 8000 + i as u16,
                service_address: "127.0.0.1".parse().unwrap(),
                name: None,
                state: crate::dataplane::InboundState::Ready,
                operator_word: None,
                tags: [(SERVICE_TAG.to_string(), service.to_string())].into(),
                health: HealthItem {
                    ready: matches!(*status, "healthy" | "not_probed" | "ignored"),
                    status: status.to_string(),
                    since: t,
                    last_report_at: None,
                    failing_reports: 0,
                    last_healthy_at: None,
                    changes: vec![],
                    reason: None,
                },
                probe: None,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str, connected: bool, inbounds: &[(&str, bool)]) -> DataplaneItem {
        let statuses: Vec<(&str, &str)> = inbounds
            .iter()
            .map(|&(service, ready)| (service, if ready { "healthy" } else { "unhealthy" }))
            .collect();
        let mut item = test_item("default", name, &statuses);
        item.connection.connected = connected;
        item
    }

    #[test]
    fn kuma_rules_online_partially_degraded_offline() {
        let items = [
            item("web-1", true, &[("web", true), ("admin", true)]),
            item("web-2", true, &[("web", false)]),
            item("api-1", true, &[("api", true)]),
            item("db-1", true, &[("db", false)]),
            item("cache-1", false, &[("cache", true)]),
        ];
        let s = services(&items, None);
        let status: Vec<(&str, ServiceStatus, u32, u32, u32)> = s
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.health.status,
                    s.health.inbounds_ready,
                    s.health.inbounds_total,
                    s.health.dataplanes,
                )
            })
            .collect();
        assert_eq!(
            status,
            [
                ("admin", ServiceStatus::Online, 1, 1, 1),
                ("api", ServiceStatus::Online, 1, 1, 1),
                // Ready by its last report, but nobody speaks for it now.
                ("cache", ServiceStatus::Offline, 1, 1, 1),
                ("db", ServiceStatus::Offline, 0, 1, 1),
                ("web", ServiceStatus::PartiallyDegraded, 1, 2, 2),
            ]
        );
        assert!(services(&items, Some("other")).is_empty());
        assert!(
            s.iter().all(|s| s.zones.is_empty()),
            "no zone, no breakdown"
        );
    }

    /// On a global: each service in total and per zone (`local` for the
    /// global's own); the same dataplane name in two zones counts twice.
    #[test]
    fn a_global_counts_each_service_per_zone_and_in_total() {
        let in_zone = |zone: &str, mut item: DataplaneItem| {
            item.zone = Some(crate::view::ZoneOfItem {
                name: zone.into(),
                state: "online".into(),
            });
            item
        };
        let items = [
            item("web-1", true, &[("web", true)]),
            in_zone("eu-1", item("web-1", true, &[("web", true)])),
            in_zone("eu-1", item("web-2", true, &[("web", false)])),
            in_zone("us-1", item("web-1", true, &[("web", false)])),
            item("db-1", true, &[("db", true)]),
        ];
        let all = services(&items, None);
        assert!(all[0].zones.is_empty(), "db has no zone: {:?}", all[0]);
        let web = &all[1];
        assert_eq!(
            (
                web.health.inbounds_ready,
                web.health.inbounds_total,
                web.health.dataplanes,
                web.health.status
            ),
            (2, 4, 4, ServiceStatus::PartiallyDegraded)
        );
        let zones: Vec<(&str, u32, u32, u32, ServiceStatus)> = web
            .zones
            .iter()
            .map(|z| {
                (
                    z.zone.as_str(),
                    z.health.inbounds_ready,
                    z.health.inbounds_total,
                    z.health.dataplanes,
                    z.health.status,
                )
            })
            .collect();
        assert_eq!(
            zones,
            [
                ("eu-1", 1, 2, 2, ServiceStatus::PartiallyDegraded),
                ("local", 1, 1, 1, ServiceStatus::Online),
                ("us-1", 0, 1, 1, ServiceStatus::Offline),
            ]
        );
        let json = serde_json::to_value(web).unwrap();
        assert_eq!(json["zones"][2]["status"], "offline");
        assert!(serde_json::to_value(&all[0])
            .unwrap()
            .get("zones")
            .is_none());
    }
}
