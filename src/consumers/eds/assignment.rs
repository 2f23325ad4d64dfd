//! One service's endpoints, from readiness: a pure function of the
//! dataplanes' definitions and health.
//!
//! The resource name is `<mesh>/<service>`, where service is the inbound tag
//! `kuma.io/service`. Every inbound with that tag, on any dataplane of the
//! mesh, is one endpoint: its `address` (which defaults to the dataplane's
//! `networking.address`) and its `port`, the port other proxies reach it on.

use std::fmt;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthStatus, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    cluster_load_assignment, lb_endpoint, ClusterLoadAssignment, Endpoint as PbEndpoint,
    LbEndpoint, LocalityLbEndpoints,
};

use crate::consumers::services::SERVICE_TAG;
use crate::dataplane::Dataplane;
use crate::readiness::{Health, Status};

/// `<mesh>/<service>`: one `ClusterLoadAssignment`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub mesh: String,
    pub service: String,
}

impl ServiceKey {
    pub fn new(mesh: impl Into<String>, service: impl Into<String>) -> Self {
        ServiceKey {
            mesh: mesh.into(),
            service: service.into(),
        }
    }

    /// Parses a resource name; `None` when it is not `<mesh>/<service>`.
    pub fn parse(name: &str) -> Option<ServiceKey> {
        let (mesh, service) = name.split_once('/')?;
        (!mesh.is_empty() && !service.is_empty()).then(|| ServiceKey::new(mesh, service))
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.mesh, self.service)
    }
}

/// How a `stale` inbound is served (`eds.stale_as`): a setting, defined
/// with the others in `config`.
pub use crate::config::StaleAs;

/// The type of every resource EDS serves.
pub const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// How readiness becomes endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdsOptions {
    pub stale_as: StaleAs,
    /// Leave not-ready endpoints out instead of marking them (Kuma's behaviour).
    pub omit_not_ready: bool,
}

impl From<&crate::config::EdsConfig> for EdsOptions {
    fn from(c: &crate::config::EdsConfig) -> Self {
        EdsOptions {
            stale_as: c.stale_as,
            omit_not_ready: c.omit_not_ready,
        }
    }
}

/// The `health_status` an endpoint is served with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EdsHealth {
    Healthy,
    Degraded,
    Draining,
    Unhealthy,
}

impl EdsHealth {
    pub const ALL: [EdsHealth; 4] = [
        EdsHealth::Healthy,
        EdsHealth::Degraded,
        EdsHealth::Draining,
        EdsHealth::Unhealthy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EdsHealth::Healthy => "healthy",
            EdsHealth::Degraded => "degraded",
            EdsHealth::Draining => "draining",
            EdsHealth::Unhealthy => "unhealthy",
        }
    }

    fn to_envoy(self) -> HealthStatus {
        match self {
            EdsHealth::Healthy => HealthStatus::Healthy,
            EdsHealth::Degraded => HealthStatus::Degraded,
            EdsHealth::Draining => HealthStatus::Draining,
            EdsHealth::Unhealthy => HealthStatus::Unhealthy,
        }
    }
}

/// The tiers: traffic is not disrupted when only the *checking* is in doubt
/// (`stale`, by default), and never sent where nothing says the app works.
pub fn health_of(status: Status, stale_as: StaleAs) -> EdsHealth {
    match status {
        Status::Healthy | Status::NotProbed => EdsHealth::Healthy,
        Status::Unhealthy | Status::Timeout => EdsHealth::Unhealthy,
        Status::Draining => EdsHealth::Draining,
        Status::Degraded => EdsHealth::Degraded,
        // Never reported, or Envoy could not tell: no evidence it works.
        // (UNKNOWN must not be passed through: Envoy treats it as healthy.)
        // Or not checked at all: the Envoy cannot run the probe.
        Status::Pending | Status::Unknown | Status::Unsupported => EdsHealth::Unhealthy,
        Status::Stale => match stale_as {
            StaleAs::Degraded => EdsHealth::Degraded,
            StaleAs::Unhealthy => EdsHealth::Unhealthy,
        },
    }
}

/// One endpoint of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: IpAddr,
    pub port: u16,
    pub health: EdsHealth,
}

/// The endpoints one dataplane gives each of its services, in inbound order.
pub fn contributions(
    dataplane: &Dataplane,
    health: &Health,
    options: EdsOptions,
) -> Vec<(ServiceKey, Endpoint)> {
    dataplane
        .inbounds
        .iter()
        .zip(&health.inbounds)
        .filter(|(_, h)| !options.omit_not_ready || h.status.is_ready())
        .filter_map(|(inbound, h)| {
            let service = inbound.tags.get(SERVICE_TAG)?;
            Some((
                ServiceKey::new(&dataplane.id.mesh, service),
                Endpoint {
                    address: inbound.address,
                    port: inbound.port,
                    health: health_of(h.status, options.stale_as),
                },
            ))
        })
        .collect()
}

/// Envoy's overprovisioning factor for hdsd's assignments (percent): 100x.
/// Envoy sends degraded endpoints the share of load that the healthy ones
/// cannot take, `100% - healthy% x factor`; at the default (1.4x) a service
/// with 2 of 3 endpoints healthy would send 7% of its requests to the
/// degraded one. At 100x, degraded (stale) endpoints are a fallback only:
/// they get traffic when less than 1% of the endpoints are healthy.
pub const OVERPROVISIONING_FACTOR: u32 = 10_000;

/// A service's endpoints as Envoy's `ClusterLoadAssignment`, in one locality.
/// No endpoint (an unknown service) is an assignment without endpoints.
pub fn cluster_load_assignment(name: &str, endpoints: &[Endpoint]) -> ClusterLoadAssignment {
    let lb_endpoints: Vec<LbEndpoint> = endpoints
        .iter()
        .map(|e| LbEndpoint {
            health_status: e.health.to_envoy() as i32,
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(PbEndpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        protocol: socket_address::Protocol::Tcp as i32,
                        address: e.address.to_string(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            e.port,
                        ))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: if lb_endpoints.is_empty() {
            Vec::new()
        } else {
            vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }]
        },
        policy: Some(cluster_load_assignment::Policy {
            overprovisioning_factor: Some(envoy_types::pb::google::protobuf::UInt32Value {
                value: OVERPROVISIONING_FACTOR,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::readiness::InboundHealth;
    use chrono::{TimeZone, Utc};

    fn dp() -> Dataplane {
        let text = "type: Dataplane\nmesh: prod\nname: web-1\nnetworking:\n  address: 10.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n  - port: 10002\n    address: 10.0.0.9\n    servicePort: 8081\n    tags: {kuma.io/service: admin}\n  - port: 10003\n    servicePort: 8082\n    tags: {other: x}\n";
        parse_documents(text).unwrap().remove(0)
    }

    fn health(statuses: &[Status]) -> Health {
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        Health {
            inbounds: statuses
                .iter()
                .map(|&status| InboundHealth {
                    status,
                    since: t,
                    last_report_at: None,
                })
                .collect(),
            last_report_at: None,
            ..Default::default()
        }
    }

    #[test]
    fn every_status_has_its_tier() {
        use EdsHealth as E;
        let expected = [
            (Status::Healthy, E::Healthy, E::Healthy),
            (Status::NotProbed, E::Healthy, E::Healthy),
            (Status::Unhealthy, E::Unhealthy, E::Unhealthy),
            (Status::Timeout, E::Unhealthy, E::Unhealthy),
            (Status::Draining, E::Draining, E::Draining),
            (Status::Degraded, E::Degraded, E::Degraded),
            (Status::Pending, E::Unhealthy, E::Unhealthy),
            (Status::Unknown, E::Unhealthy, E::Unhealthy),
            (Status::Stale, E::Degraded, E::Unhealthy),
            (Status::Unsupported, E::Unhealthy, E::Unhealthy),
        ];
        assert_eq!(expected.len(), Status::ALL.len());
        for (status, by_default, strict) in expected {
            assert_eq!(
                health_of(status, StaleAs::Degraded),
                by_default,
                "{status:?}"
            );
            assert_eq!(health_of(status, StaleAs::Unhealthy), strict, "{status:?}");
        }
    }

    #[test]
    fn inbounds_with_a_service_tag_are_endpoints_at_their_address_and_port() {
        let c = contributions(
            &dp(),
            &health(&[Status::Healthy, Status::Stale, Status::Healthy]),
            EdsOptions::default(),
        );
        assert_eq!(
            c,
            vec![
                (
                    ServiceKey::new("prod", "web"),
                    Endpoint {
                        address: "10.0.0.1".parse().unwrap(),
                        port: 10001,
                        health: EdsHealth::Healthy
                    }
                ),
                (
                    ServiceKey::new("prod", "admin"),
                    Endpoint {
                        address: "10.0.0.9".parse().unwrap(),
                        port: 10002,
                        health: EdsHealth::Degraded
                    }
                ),
            ]
        );
    }

    #[test]
    fn omit_not_ready_leaves_them_out() {
        let options = EdsOptions {
            omit_not_ready: true,
            ..Default::default()
        };
        let c = contributions(
            &dp(),
            &health(&[Status::Unhealthy, Status::NotProbed, Status::Healthy]),
            options,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0.to_string(), "prod/admin");
    }

    #[test]
    fn resource_names_and_assignments() {
        assert_eq!(
            ServiceKey::parse("default/web"),
            Some(ServiceKey::new("default", "web"))
        );
        // The service may contain a slash; the mesh may not.
        assert_eq!(
            ServiceKey::parse("default/a/b").unwrap().service,
            "a/b".to_string()
        );
        for bad in ["web", "/web", "default/", ""] {
            assert_eq!(ServiceKey::parse(bad), None, "{bad}");
        }
        let empty = cluster_load_assignment("default/nothing", &[]);
        assert_eq!(empty.cluster_name, "default/nothing");
        assert!(empty.endpoints.is_empty());
        let one = cluster_load_assignment(
            "default/web",
            &[Endpoint {
                address: "127.0.0.1".parse().unwrap(),
                port: 8080,
                health: EdsHealth::Degraded,
            }],
        );
        let lb = &one.endpoints[0].lb_endpoints[0];
        assert_eq!(lb.health_status, HealthStatus::Degraded as i32);
        let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
            panic!("{lb:?}");
        };
        let Some(address::Address::SocketAddress(sa)) =
            e.address.as_ref().and_then(|a| a.address.as_ref())
        else {
            panic!("{e:?}");
        };
        assert_eq!(sa.address, "127.0.0.1");
        assert_eq!(
            sa.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(8080))
        );
    }
}
