//! Per-service health: the dataplanes' inbounds grouped by their
//! `kuma.io/service` tag, with Kuma's rules. A pure function of the items.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::view::DataplaneItem;

/// The tag that names an inbound's service.
pub const SERVICE_TAG: &str = "kuma.io/service";

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

/// One `kuma.io/service` value in one mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceItem {
    pub mesh: String,
    pub name: String,
    pub inbounds_ready: u32,
    pub inbounds_total: u32,
    pub dataplanes: u32,
    pub dataplanes_connected: u32,
    pub status: ServiceStatus,
}

/// The services of `items` (optionally of one mesh), sorted by mesh and name.
pub fn services(items: &[DataplaneItem], mesh: Option<&str>) -> Vec<ServiceItem> {
    #[derive(Default)]
    struct Acc<'a> {
        ready: u32,
        total: u32,
        dataplanes: BTreeSet<&'a str>,
        connected: BTreeSet<&'a str>,
    }
    let mut by_service: BTreeMap<(&str, &str), Acc<'_>> = BTreeMap::new();
    for item in items.iter().filter(|i| mesh.is_none_or(|m| i.mesh == m)) {
        for inbound in &item.inbounds {
            let Some(service) = inbound.tags.get(SERVICE_TAG) else {
                continue;
            };
            let acc = by_service.entry((&item.mesh, service)).or_default();
            acc.total += 1;
            acc.ready += u32::from(inbound.health.ready);
            acc.dataplanes.insert(&item.name);
            if item.connection.connected {
                acc.connected.insert(&item.name);
            }
        }
    }
    by_service
        .into_iter()
        .map(|((mesh, name), acc)| ServiceItem {
            mesh: mesh.to_string(),
            name: name.to_string(),
            inbounds_ready: acc.ready,
            inbounds_total: acc.total,
            dataplanes: acc.dataplanes.len() as u32,
            dataplanes_connected: acc.connected.len() as u32,
            status: if acc.ready == 0 || acc.connected.is_empty() {
                ServiceStatus::Offline
            } else if acc.ready == acc.total {
                ServiceStatus::Online
            } else {
                ServiceStatus::PartiallyDegraded
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{ConnectionItem, HealthItem, InboundItem};
    use chrono::{TimeZone, Utc};

    fn item(name: &str, connected: bool, inbounds: &[(&str, bool)]) -> DataplaneItem {
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        DataplaneItem {
            mesh: "default".into(),
            name: name.into(),
            address: "127.0.0.1".parse().unwrap(),
            kind: crate::dataplane::DataplaneKind::Sidecar,
            listeners: Vec::new(),
            zone: None,
            connection: ConnectionItem {
                connected,
                connected_at: None,
                last_report_at: None,
                held_by: None,
                envoy_version: None,
                problem: None,
            },
            inbounds: inbounds
                .iter()
                .enumerate()
                .map(|(i, (service, ready))| InboundItem {
                    port: 10000 + i as u16,
                    service_port: 8000 + i as u16,
                    service_address: "127.0.0.1".parse().unwrap(),
                    name: None,
                    state: crate::dataplane::InboundState::Ready,
                    tags: [(SERVICE_TAG.to_string(), service.to_string())].into(),
                    health: HealthItem {
                        ready: *ready,
                        status: if *ready { "healthy" } else { "unhealthy" }.into(),
                        since: t,
                        last_report_at: None,
                        changes: vec![],
                        reason: None,
                    },
                    probe: None,
                })
                .collect(),
        }
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
                    s.status,
                    s.inbounds_ready,
                    s.inbounds_total,
                    s.dataplanes,
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
    }
}
