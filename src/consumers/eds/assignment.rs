//! One service's endpoints, from readiness: a pure function of the
//! dataplanes' definitions and health.
//!
//! The resource name is `<mesh>/<service>`, where service is the inbound tag
//! `kuma.io/service`. Every inbound with that tag, on any dataplane of the
//! mesh, is one endpoint: its `address` (which defaults to the dataplane's
//! `networking.address`) and its `port`, the port other proxies reach it on.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthStatus, Locality, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    cluster_load_assignment, lb_endpoint, ClusterLoadAssignment, Endpoint as PbEndpoint,
    LbEndpoint, LocalityLbEndpoints,
};

use crate::consumers::services::SERVICE_TAG;
use crate::dataplane::Dataplane;
use crate::operator::{self, OperatorWord};
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

/// How an offline zone's endpoints are served (`eds.offline_zone`).
pub use crate::config::OfflineZone;

/// How readiness becomes endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdsOptions {
    pub stale_as: StaleAs,
    /// Leave not-ready endpoints out instead of marking them (Kuma's behaviour).
    pub omit_not_ready: bool,
    /// What an offline zone's endpoints become.
    pub offline_zone: OfflineZone,
}

impl From<&crate::config::EdsConfig> for EdsOptions {
    fn from(c: &crate::config::EdsConfig) -> Self {
        EdsOptions {
            stale_as: c.stale_as,
            omit_not_ready: c.omit_not_ready,
            offline_zone: c.offline_zone,
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
/// An operator's word comes first: the inbound is DRAINING whatever its
/// checks say. Envoy (1.30+) then leaves it out of load balancing and out
/// of its priority's health and panic arithmetic, so the others of its
/// priority take its share rather than another zone (UNHEALTHY would count
/// against the priority and spill traffic), and no request reaches it
/// unless the priority is in panic mode.
pub fn health_of(word: Option<&OperatorWord>, status: Status, stale_as: StaleAs) -> EdsHealth {
    if word.is_some() {
        return EdsHealth::Draining;
    }
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

/// One endpoint of a service. Sorted by zone first: an assignment lists
/// its localities zone by zone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The zone it is in, on a global (`None`: this hdsd's own).
    pub zone: Option<Arc<str>>,
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
        .filter_map(|(inbound, h)| {
            let service = inbound.tags.get(SERVICE_TAG)?;
            let word = OperatorWord::of_inbound(inbound);
            if options.omit_not_ready && !operator::ready(word.as_ref(), h.status) {
                return None;
            }
            Some((
                ServiceKey::new(&dataplane.id.mesh, service),
                Endpoint {
                    zone: None,
                    address: inbound.address,
                    port: inbound.port,
                    health: health_of(word.as_ref(), h.status, options.stale_as),
                },
            ))
        })
        .collect()
}

/// The state of the zone a remote dataplane is in, as EDS needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneLink {
    /// The zone is online: its readiness is current.
    Online,
    /// The zone is offline (its last readiness is held): `eds.offline_zone` applies.
    Offline,
    /// The zone is disabled (or deleted): its endpoints leave every assignment.
    Withdrawn,
}

/// The endpoints a dataplane of another zone gives each of its services,
/// from what its zone sent ([`crate::pb::Dataplane`]): the same tiers as a
/// local dataplane's (the operator's word first, as its zone sent it:
/// [`OperatorWord::of_remote`]), then the offline policy while its zone is
/// offline.
pub fn remote_contributions(
    zone: &Arc<str>,
    link: ZoneLink,
    dataplane: &crate::pb::Dataplane,
    options: EdsOptions,
) -> Vec<(ServiceKey, Endpoint)> {
    if link == ZoneLink::Withdrawn
        || (link == ZoneLink::Offline && options.offline_zone == OfflineZone::Withdraw)
    {
        return Vec::new();
    }
    let Ok(dataplane_address) = dataplane.address.parse::<IpAddr>() else {
        return Vec::new();
    };
    dataplane
        .inbounds
        .iter()
        .filter_map(|inbound| {
            let service = inbound.tags.get(SERVICE_TAG)?;
            let status = inbound
                .health
                .as_ref()
                .map_or(Status::Unknown, |h| status_of(h.status));
            let word = OperatorWord::of_remote(inbound);
            if options.omit_not_ready && !operator::ready(word.as_ref(), status) {
                return None;
            }
            let mut health = health_of(word.as_ref(), status, options.stale_as);
            if link == ZoneLink::Offline {
                health = match options.offline_zone {
                    OfflineZone::Degraded if health == EdsHealth::Healthy => EdsHealth::Degraded,
                    OfflineZone::Unhealthy => EdsHealth::Unhealthy,
                    _ => health,
                };
            }
            let address = match inbound.address.parse::<IpAddr>() {
                Ok(a) => a,
                Err(_) => dataplane_address,
            };
            Some((
                ServiceKey::new(&dataplane.mesh, service),
                Endpoint {
                    zone: Some(zone.clone()),
                    address,
                    port: u16::try_from(inbound.port).ok()?,
                    health,
                },
            ))
        })
        .collect()
}

/// The readiness status of a protobuf status (an unknown value is `unknown`).
fn status_of(status: i32) -> Status {
    use crate::pb::Status as P;
    match P::try_from(status).unwrap_or(P::Unspecified) {
        P::Healthy => Status::Healthy,
        P::NotProbed => Status::NotProbed,
        P::Unhealthy => Status::Unhealthy,
        P::Timeout => Status::Timeout,
        P::Draining => Status::Draining,
        P::Degraded => Status::Degraded,
        P::Pending => Status::Pending,
        P::Stale => Status::Stale,
        P::Unsupported => Status::Unsupported,
        P::Unknown | P::Unspecified => Status::Unknown,
    }
}

/// Envoy's own default overprovisioning factor (percent), which hdsd keeps:
/// a priority takes all of its load while at least 1/1.4 = ~71 % of its
/// endpoints are healthy, and spills the rest to the next priority (the
/// next zone) below that, in proportion. Degraded (stale) endpoints get
/// the load that no priority's healthy endpoints can take.
pub const DEFAULT_OVERPROVISIONING_FACTOR: u32 = 140;

/// How every assignment is shaped (`eds.*`): shared by every published
/// service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `eds.overprovisioning_factor`.
    pub factor: u32,
    /// `eds.endpoint_stale_after`, set in every assignment when set.
    pub stale_after: Option<Duration>,
    /// `eds.zone_priorities`: per front zone, the zones that take over in order.
    pub zone_order: BTreeMap<String, Vec<String>>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            factor: DEFAULT_OVERPROVISIONING_FACTOR,
            stale_after: None,
            zone_order: BTreeMap::new(),
        }
    }
}

impl From<&crate::config::EdsConfig> for Policy {
    fn from(c: &crate::config::EdsConfig) -> Self {
        Policy {
            factor: c.overprovisioning_factor,
            stale_after: c.endpoint_stale_after,
            zone_order: c.zone_priorities.clone(),
        }
    }
}

/// An address and port announced in more than one zone.
pub type HostPort = (IpAddr, u16);

/// How one front is served: the priorities follow its zone.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub policy: &'a Policy,
    /// The front's `node.locality.zone` (`None`: every zone at priority 0).
    pub front_zone: Option<&'a str>,
    /// The service's addresses that more than one zone announces (see
    /// [`keeps`]).
    pub duplicates: &'a BTreeSet<HostPort>,
}

/// Whether a front in `front_zone` is served `e`, whose address more than
/// one zone announces when `duplicate`. Envoy keeps only the first of
/// equal addresses in an assignment, and overlapping private ranges are
/// routable only inside their own zone: a front gets its own zone's copy
/// and no other; a front whose zone has no copy (or that has no zone)
/// gets none, as it cannot know which of the hosts it would reach.
pub fn keeps(e: &Endpoint, front_zone: Option<&str>, duplicate: bool) -> bool {
    !duplicate || (front_zone.is_some() && e.zone.as_deref() == front_zone)
}

/// A service's endpoints as Envoy's `ClusterLoadAssignment`: one locality
/// per zone (`locality.zone` the zone's name; this hdsd's own endpoints in
/// a locality without a zone). The front's own zone is priority 0, then
/// the zones `eds.zone_priorities` lists for it in order, then every other
/// zone; the numbers are dense from 0 over the zones present (Envoy wants
/// no gap), so a front whose zone has no endpoint of the service starts
/// with the next zone, and a front with no zone (or no order and no own
/// endpoint) gets every zone at priority 0. An address more than one zone
/// announces follows [`keeps`]. No endpoint (an unknown service) is an
/// assignment without endpoints.
pub fn cluster_load_assignment(
    name: &str,
    endpoints: &[Endpoint],
    shape: Shape<'_>,
) -> ClusterLoadAssignment {
    let ranks = zone_ranks(endpoints, shape);
    let mut localities: Vec<LocalityLbEndpoints> = Vec::new();
    let mut current: Option<&Option<Arc<str>>> = None;
    for e in endpoints {
        let duplicate =
            !shape.duplicates.is_empty() && shape.duplicates.contains(&(e.address, e.port));
        if !keeps(e, shape.front_zone, duplicate) {
            continue;
        }
        if current != Some(&e.zone) {
            current = Some(&e.zone);
            let priority = ranks
                .iter()
                .find(|(z, _)| *z == e.zone.as_deref())
                .map_or(0, |(_, p)| *p);
            localities.push(LocalityLbEndpoints {
                locality: e.zone.as_ref().map(|z| Locality {
                    zone: z.to_string(),
                    ..Default::default()
                }),
                priority,
                ..Default::default()
            });
        }
        if let Some(locality) = localities.last_mut() {
            locality.lb_endpoints.push(lb_endpoint(e));
        }
    }
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: localities,
        policy: Some(cluster_load_assignment::Policy {
            overprovisioning_factor: Some(envoy_types::pb::google::protobuf::UInt32Value {
                value: shape.policy.factor,
            }),
            endpoint_stale_after: shape.policy.stale_after.map(crate::specifier::pb_duration),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The priority of each zone present in `endpoints` for `shape`'s front:
/// rank 0 its own zone, 1 + position for the zones its order lists, then
/// every other zone; renumbered densely from 0 over the zones present.
fn zone_ranks<'e>(endpoints: &'e [Endpoint], shape: Shape<'_>) -> Vec<(Option<&'e str>, u32)> {
    let mut zones: Vec<Option<&str>> = endpoints.iter().map(|e| e.zone.as_deref()).collect();
    zones.dedup();
    let Some(front) = shape.front_zone else {
        return zones.into_iter().map(|z| (z, 0)).collect();
    };
    let order = shape
        .policy
        .zone_order
        .get(front)
        .map_or(&[][..], Vec::as_slice);
    let rank = |zone: Option<&str>| -> usize {
        match zone {
            Some(z) if z == front => 0,
            Some(z) => order
                .iter()
                .position(|o| o == z)
                .map_or(order.len() + 1, |i| i + 1),
            None => order.len() + 1,
        }
    };
    let mut present: Vec<usize> = zones.iter().map(|z| rank(*z)).collect();
    present.sort_unstable();
    present.dedup();
    zones
        .into_iter()
        .map(|z| {
            let r = rank(z);
            let dense = present.iter().position(|p| *p == r).unwrap_or(0);
            (z, u32::try_from(dense).unwrap_or(u32::MAX))
        })
        .collect()
}

fn lb_endpoint(e: &Endpoint) -> LbEndpoint {
    LbEndpoint {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::readiness::InboundHealth;
    use chrono::{TimeZone, Utc};

    fn shape<'a>(
        policy: &'a Policy,
        front_zone: Option<&'a str>,
        duplicates: &'a BTreeSet<HostPort>,
    ) -> Shape<'a> {
        Shape {
            policy,
            front_zone,
            duplicates,
        }
    }

    fn remote(
        mesh: &str,
        name: &str,
        inbounds: &[(u32, &str, crate::pb::Status)],
    ) -> crate::pb::Dataplane {
        crate::pb::Dataplane {
            mesh: mesh.into(),
            name: name.into(),
            address: "10.1.0.1".into(),
            inbounds: inbounds
                .iter()
                .map(|(port, service, status)| crate::pb::Inbound {
                    port: *port,
                    service_port: 8080,
                    service_address: "127.0.0.1".into(),
                    tags: [(SERVICE_TAG.to_string(), service.to_string())].into(),
                    health: Some(crate::pb::Health {
                        ready: *status == crate::pb::Status::Healthy,
                        status: *status as i32,
                        ..Default::default()
                    }),
                    address: String::new(),
                    operator_word: 0,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn zone_endpoint(zone: &str, last: u8, health: EdsHealth) -> Endpoint {
        Endpoint {
            zone: Some(Arc::from(zone)),
            address: format!("10.0.0.{last}").parse().unwrap(),
            port: 10001,
            health,
        }
    }

    /// (zone, priority, healths) of each locality.
    fn localities(cla: &ClusterLoadAssignment) -> Vec<(String, u32, Vec<i32>)> {
        cla.endpoints
            .iter()
            .map(|l| {
                (
                    l.locality
                        .as_ref()
                        .map(|l| l.zone.clone())
                        .unwrap_or_default(),
                    l.priority,
                    l.lb_endpoints.iter().map(|e| e.health_status).collect(),
                )
            })
            .collect()
    }

    /// One locality per zone; the front's zone at priority 0, the others
    /// at 1; no front zone (or a front zone without endpoints): all at 0.
    #[test]
    fn each_zone_is_a_locality_and_the_fronts_zone_comes_first() {
        let endpoints = [
            zone_endpoint("eu-1", 1, EdsHealth::Healthy),
            zone_endpoint("eu-1", 2, EdsHealth::Unhealthy),
            zone_endpoint("us-1", 3, EdsHealth::Healthy),
        ];
        let (h, u) = (HealthStatus::Healthy as i32, HealthStatus::Unhealthy as i32);
        let (policy, none) = (Policy::default(), BTreeSet::new());
        let front = |zone| shape(&policy, zone, &none);
        let eu = cluster_load_assignment("default/web", &endpoints, front(Some("eu-1")));
        assert_eq!(
            localities(&eu),
            [("eu-1".into(), 0, vec![h, u]), ("us-1".into(), 1, vec![h])]
        );
        let policy = eu.policy.as_ref().unwrap();
        assert_eq!(policy.overprovisioning_factor.as_ref().unwrap().value, 140);
        let us = cluster_load_assignment("default/web", &endpoints, front(Some("us-1")));
        assert_eq!(
            localities(&us),
            [("eu-1".into(), 1, vec![h, u]), ("us-1".into(), 0, vec![h])]
        );
        for zone in [None, Some("ap-1")] {
            let all = cluster_load_assignment("default/web", &endpoints, front(zone));
            assert!(localities(&all).iter().all(|(_, p, _)| *p == 0), "{zone:?}");
        }
    }

    /// `eds.zone_priorities` orders the other zones for a front: its own
    /// zone 0, the listed ones next, the rest last; the numbers are dense
    /// over the zones present (a front whose zone has none starts at the
    /// next one).
    #[test]
    fn the_zone_order_numbers_priorities_densely_over_the_zones_present() {
        let h = EdsHealth::Healthy;
        let policy = Policy {
            zone_order: [(
                "eu-1".to_string(),
                vec!["eu-2".to_string(), "us-1".to_string()],
            )]
            .into(),
            ..Policy::default()
        };
        let none = BTreeSet::new();
        let priorities = |endpoints: &[Endpoint], front| -> Vec<(String, u32)> {
            localities(&cluster_load_assignment(
                "default/web",
                endpoints,
                shape(&policy, front, &none),
            ))
            .into_iter()
            .map(|(z, p, _)| (z, p))
            .collect()
        };
        let all = [
            zone_endpoint("ap-1", 1, h),
            zone_endpoint("eu-1", 2, h),
            zone_endpoint("eu-2", 3, h),
            zone_endpoint("us-1", 4, h),
        ];
        let p = |pairs: &[(&str, u32)]| -> Vec<(String, u32)> {
            pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect()
        };
        assert_eq!(
            priorities(&all, Some("eu-1")),
            p(&[("ap-1", 3), ("eu-1", 0), ("eu-2", 1), ("us-1", 2)])
        );
        // eu-2 has no endpoint of the service: no gap.
        let no_eu2 = [all[0].clone(), all[1].clone(), all[3].clone()];
        assert_eq!(
            priorities(&no_eu2, Some("eu-1")),
            p(&[("ap-1", 2), ("eu-1", 0), ("us-1", 1)])
        );
        // The front's own zone has none: the first listed zone leads.
        let no_eu1 = [all[0].clone(), all[2].clone(), all[3].clone()];
        assert_eq!(
            priorities(&no_eu1, Some("eu-1")),
            p(&[("ap-1", 2), ("eu-2", 0), ("us-1", 1)])
        );
        // A front without an order: its zone 0, every other zone 1.
        assert_eq!(
            priorities(&all, Some("us-1")),
            p(&[("ap-1", 1), ("eu-1", 1), ("eu-2", 1), ("us-1", 0)])
        );
        // No front zone: all 0.
        assert!(priorities(&all, None).iter().all(|(_, n)| *n == 0));
    }

    /// The same address in two zones: a front gets its own zone's copy and
    /// no other; a front whose zone has none, or without a zone, gets none
    /// of them; every other address is served as usual.
    #[test]
    fn an_address_in_two_zones_goes_only_to_a_front_of_one_of_them() {
        let h = EdsHealth::Healthy;
        let same: IpAddr = "10.0.0.9".parse().unwrap();
        let at = |zone: &str, address: IpAddr| Endpoint {
            zone: Some(Arc::from(zone)),
            address,
            port: 10001,
            health: h,
        };
        let endpoints = [
            at("eu-1", same),
            at("eu-1", "10.0.0.1".parse().unwrap()),
            at("us-1", same),
        ];
        let policy = Policy::default();
        let duplicates: BTreeSet<HostPort> = [(same, 10001)].into();
        let served = |front| -> Vec<(String, String)> {
            cluster_load_assignment(
                "default/web",
                &endpoints,
                shape(&policy, front, &duplicates),
            )
            .endpoints
            .iter()
            .flat_map(|l| {
                let zone = l
                    .locality
                    .as_ref()
                    .map(|l| l.zone.clone())
                    .unwrap_or_default();
                l.lb_endpoints.iter().map(move |e| {
                    let Some(lb_endpoint::HostIdentifier::Endpoint(pe)) = &e.host_identifier else {
                        unreachable!()
                    };
                    let Some(address::Address::SocketAddress(sa)) =
                        pe.address.as_ref().and_then(|a| a.address.as_ref())
                    else {
                        unreachable!()
                    };
                    (zone.clone(), sa.address.clone())
                })
            })
            .collect()
        };
        let pair = |z: &str, a: &str| (z.to_string(), a.to_string());
        assert_eq!(
            served(Some("eu-1")),
            [pair("eu-1", "10.0.0.9"), pair("eu-1", "10.0.0.1")]
        );
        assert_eq!(
            served(Some("us-1")),
            [pair("eu-1", "10.0.0.1"), pair("us-1", "10.0.0.9")]
        );
        assert_eq!(served(Some("ap-1")), [pair("eu-1", "10.0.0.1")]);
        assert_eq!(served(None), [pair("eu-1", "10.0.0.1")]);
    }

    /// `eds.endpoint_stale_after` is set in every assignment when set, and
    /// absent otherwise.
    #[test]
    fn endpoint_stale_after_is_sent_only_when_set() {
        let none = BTreeSet::new();
        let off =
            cluster_load_assignment("default/web", &[], shape(&Policy::default(), None, &none));
        assert_eq!(off.policy.unwrap().endpoint_stale_after, None);
        let policy = Policy {
            stale_after: Some(std::time::Duration::from_millis(4500)),
            ..Policy::default()
        };
        let on = cluster_load_assignment("default/web", &[], shape(&policy, None, &none));
        let after = on.policy.unwrap().endpoint_stale_after.unwrap();
        assert_eq!((after.seconds, after.nanos), (4, 500_000_000));
    }

    /// A zone's readiness keeps its tiers; an offline zone's endpoints
    /// follow `eds.offline_zone`; a disabled zone gives none.
    #[test]
    fn an_offline_zone_follows_the_offline_policy_and_a_disabled_one_gives_nothing() {
        use crate::pb::Status as P;
        let zone: Arc<str> = Arc::from("eu-1");
        let dp = remote(
            "default",
            "web-1",
            &[(10001, "web", P::Healthy), (10002, "api", P::Unhealthy)],
        );
        let healths = |link, offline_zone| {
            let options = EdsOptions {
                offline_zone,
                ..EdsOptions::default()
            };
            remote_contributions(&zone, link, &dp, options)
                .into_iter()
                .map(|(key, e)| (key.service, e.health))
                .collect::<Vec<_>>()
        };
        let online = healths(ZoneLink::Online, OfflineZone::Degraded);
        assert_eq!(
            online,
            [
                ("web".into(), EdsHealth::Healthy),
                ("api".into(), EdsHealth::Unhealthy)
            ]
        );
        let c = remote_contributions(&zone, ZoneLink::Online, &dp, EdsOptions::default());
        assert_eq!(c[0].1.zone.as_deref(), Some("eu-1"));
        assert_eq!(
            c[0].1.address.to_string(),
            "10.1.0.1",
            "the dataplane's address by default"
        );
        for (policy, web, api) in [
            (
                OfflineZone::Degraded,
                EdsHealth::Degraded,
                EdsHealth::Unhealthy,
            ),
            (
                OfflineZone::Unhealthy,
                EdsHealth::Unhealthy,
                EdsHealth::Unhealthy,
            ),
            (OfflineZone::Keep, EdsHealth::Healthy, EdsHealth::Unhealthy),
        ] {
            assert_eq!(
                healths(ZoneLink::Offline, policy),
                [("web".into(), web), ("api".into(), api)],
                "{policy:?}"
            );
        }
        assert!(healths(ZoneLink::Offline, OfflineZone::Withdraw).is_empty());
        assert!(healths(ZoneLink::Withdrawn, OfflineZone::Keep).is_empty());
        // An inbound's own address wins over the dataplane's.
        let mut own = dp.clone();
        own.inbounds[0].address = "10.9.9.9".into();
        let c = remote_contributions(&zone, ZoneLink::Online, &own, EdsOptions::default());
        assert_eq!(c[0].1.address.to_string(), "10.9.9.9");
    }

    fn dp() -> Dataplane {
        let text = "type: Dataplane\nmesh: prod\nname: web-1\nnetworking:\n  address: 10.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n  - port: 10002\n    address: 10.0.0.9\n    servicePort: 8081\n    tags: {kuma.io/service: admin}\n  - port: 10003\n    servicePort: 8082\n    tags: {other: x}\n";
        parse_documents(text).unwrap().remove(0)
    }

    fn health(statuses: &[Status]) -> Health {
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        Health {
            inbounds: statuses
                .iter()
                .map(|&status| InboundHealth::new(status, t))
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
                health_of(None, status, StaleAs::Degraded),
                by_default,
                "{status:?}"
            );
            assert_eq!(
                health_of(None, status, StaleAs::Unhealthy),
                strict,
                "{status:?}"
            );
        }
    }

    #[test]
    fn an_operator_s_word_is_draining_whatever_the_status() {
        for word in [OperatorWord::DeclaredNotReady, OperatorWord::Unknown] {
            for status in Status::ALL {
                for stale_as in [StaleAs::Degraded, StaleAs::Unhealthy] {
                    assert_eq!(
                        health_of(Some(&word), status, stale_as),
                        EdsHealth::Draining,
                        "{word:?} {status:?} {stale_as:?}"
                    );
                }
            }
        }
    }

    /// The bug of a declared `state: NotReady` inbound whose checks pass:
    /// the API read it not ready, EDS served it HEALTHY.
    #[test]
    fn a_declared_not_ready_inbound_whose_checks_pass_is_draining() {
        let text = "type: Dataplane\nmesh: prod\nname: web-1\nnetworking:\n  address: 10.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n  - port: 10002\n    servicePort: 8081\n    state: NotReady\n    tags: {kuma.io/service: web}\n";
        let dp = parse_documents(text).unwrap().remove(0);
        let healthy = health(&[Status::Healthy, Status::Healthy]);
        let c = contributions(&dp, &healthy, EdsOptions::default());
        let got: Vec<_> = c.iter().map(|(_, e)| (e.port, e.health)).collect();
        assert_eq!(
            got,
            [(10001, EdsHealth::Healthy), (10002, EdsHealth::Draining)]
        );
        // Failing checks: still the operator's word.
        let failing = health(&[Status::Healthy, Status::Unhealthy]);
        let c = contributions(&dp, &failing, EdsOptions::default());
        assert_eq!(c[1].1.health, EdsHealth::Draining);
        // `eds.omit_not_ready`: left out, as the API reads it not ready.
        let options = EdsOptions {
            omit_not_ready: true,
            ..Default::default()
        };
        let c = contributions(&dp, &healthy, options);
        let ports: Vec<_> = c.iter().map(|(_, e)| e.port).collect();
        assert_eq!(ports, [10001]);
    }

    /// At a global: the word as the zone sent it, and as a zone of an older
    /// release says it (no word; `ready: false`, reason
    /// `declared_not_ready`), online or offline.
    #[test]
    fn a_remote_inbound_held_by_its_zone_is_draining() {
        use crate::pb::Status as P;
        let zone: Arc<str> = Arc::from("eu-1");
        let mut dp = remote(
            "default",
            "web-1",
            &[(10001, "web", P::Healthy), (10002, "web", P::Healthy)],
        );
        let held = &mut dp.inbounds[1];
        held.operator_word = crate::pb::OperatorWord::DeclaredNotReady as i32;
        held.health.as_mut().unwrap().ready = false;
        let mut older = dp.clone();
        let held = &mut older.inbounds[1];
        held.operator_word = 0;
        held.health.as_mut().unwrap().reason = Some(crate::pb::Reason {
            code: crate::operator::DECLARED_NOT_READY.into(),
            message: String::new(),
        });
        for dp in [&dp, &older] {
            let healths = |link, options| {
                remote_contributions(&zone, link, dp, options)
                    .into_iter()
                    .map(|(_, e)| (e.port, e.health))
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                healths(ZoneLink::Online, EdsOptions::default()),
                [(10001, EdsHealth::Healthy), (10002, EdsHealth::Draining)]
            );
            assert_eq!(
                healths(ZoneLink::Offline, EdsOptions::default()),
                [(10001, EdsHealth::Degraded), (10002, EdsHealth::Draining)],
                "offline_zone = degraded leaves a held inbound draining"
            );
            let omit = EdsOptions {
                omit_not_ready: true,
                ..Default::default()
            };
            assert_eq!(
                healths(ZoneLink::Online, omit),
                [(10001, EdsHealth::Healthy)]
            );
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
                        zone: None,
                        address: "10.0.0.1".parse().unwrap(),
                        port: 10001,
                        health: EdsHealth::Healthy
                    }
                ),
                (
                    ServiceKey::new("prod", "admin"),
                    Endpoint {
                        zone: None,
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
        let empty = cluster_load_assignment(
            "default/nothing",
            &[],
            shape(&Policy::default(), None, &BTreeSet::new()),
        );
        assert_eq!(empty.cluster_name, "default/nothing");
        assert!(empty.endpoints.is_empty());
        let one = cluster_load_assignment(
            "default/web",
            &[Endpoint {
                zone: None,
                address: "127.0.0.1".parse().unwrap(),
                port: 8080,
                health: EdsHealth::Degraded,
            }],
            shape(&Policy::default(), None, &BTreeSet::new()),
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
