//! Building a dataplane's `HealthCheckSpecifier`: a pure function.
//!
//! One `ClusterHealthCheck` per distinct probe target (serviceAddress:servicePort),
//! each with exactly one TCP connect check whose every field is set explicitly,
//! and exactly one `LocalityEndpoints` holding the one endpoint. The mapping
//! from (cluster, endpoint) back to inbounds is kept beside the message, so
//! reports never have to parse names.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    address, health_check, socket_address, Address, HealthCheck, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
use envoy_types::pb::envoy::service::health::v3::{
    ClusterHealthCheck, HealthCheckSpecifier, LocalityEndpoints,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use prost::bytes::Bytes;
use prost::Message;

use crate::dataplane::Dataplane;
use crate::probe::{ProbeSettings, ValidationError};

/// Server-wide inputs of specifier generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecifierSettings {
    pub defaults: ProbeSettings,
    pub report_interval: Duration,
    /// When false, only inbounds with a `serviceProbe` are probed.
    pub probe_all_inbounds: bool,
}

impl Default for SpecifierSettings {
    /// The defaults of `hdsd config defaults`: 5s reports, every inbound probed.
    fn default() -> Self {
        SpecifierSettings {
            defaults: ProbeSettings::default(),
            report_interval: Duration::from_secs(5),
            probe_all_inbounds: true,
        }
    }
}

/// One probed application endpoint and the inbounds that share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub cluster: String,
    pub endpoint: SocketAddr,
    pub settings: ProbeSettings,
    /// Indexes into `Dataplane::inbounds`.
    pub inbounds: Vec<usize>,
}

/// A dataplane's specifier and the map needed to read reports against it.
#[derive(Debug, Clone, Default)]
pub struct Specifier {
    pub message: HealthCheckSpecifier,
    pub targets: Vec<ProbeTarget>,
    /// For every inbound (by index), the target that probes it, if any.
    pub target_of_inbound: Vec<Option<usize>>,
    /// `message` in protobuf encoding, made at the first send and shared by
    /// every later one (reconnects, answers to requests) instead of copying
    /// and encoding the message again. Not made at build time: a file change
    /// rebuilds the specifiers of every dataplane in the file, most of them
    /// unchanged and never sent again.
    encoded: OnceLock<Bytes>,
}

impl PartialEq for Specifier {
    /// The encoding cache is not part of the value.
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
            && self.targets == other.targets
            && self.target_of_inbound == other.target_of_inbound
    }
}

impl Specifier {
    /// The target a reported (cluster, endpoint) pair belongs to.
    pub fn target(&self, cluster: &str, endpoint: SocketAddr) -> Option<usize> {
        self.targets
            .iter()
            .position(|t| t.cluster == cluster && t.endpoint == endpoint)
    }

    /// The target with this endpoint (reports from older Envoys carry no cluster).
    pub fn target_by_endpoint(&self, endpoint: SocketAddr) -> Option<usize> {
        self.targets.iter().position(|t| t.endpoint == endpoint)
    }

    /// An empty specifier: Envoy stops every check. Sent to deleted dataplanes.
    pub fn empty(report_interval: Duration) -> Specifier {
        Specifier::new(
            HealthCheckSpecifier {
                cluster_health_checks: Vec::new(),
                interval: Some(pb_duration(report_interval)),
            },
            Vec::new(),
            Vec::new(),
        )
    }

    fn new(
        message: HealthCheckSpecifier,
        targets: Vec<ProbeTarget>,
        target_of_inbound: Vec<Option<usize>>,
    ) -> Specifier {
        Specifier {
            message,
            targets,
            target_of_inbound,
            encoded: OnceLock::new(),
        }
    }

    /// The message's protobuf encoding (a shared, reference-counted buffer),
    /// made on the first call. `message` must not change after that.
    pub fn encoded(&self) -> &Bytes {
        self.encoded
            .get_or_init(|| self.message.encode_to_vec().into())
    }
}

/// Why a dataplane's specifier cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecifierError {
    #[error("networking.inbound[{inbound}].serviceProbe: {error}")]
    InvalidProbe {
        inbound: usize,
        error: ValidationError,
    },
    #[error("networking.inbound[{first}] and networking.inbound[{second}] probe the same target {endpoint} with different settings; give them the same serviceProbe")]
    ConflictingProbes {
        first: usize,
        second: usize,
        endpoint: SocketAddr,
    },
}

/// The stable cluster name of a probe target.
pub fn cluster_name(endpoint: SocketAddr) -> String {
    format!("probe_{endpoint}")
}

/// Builds the specifier for `dataplane`. Fails if any effective probe setting
/// breaks a validation rule: nothing invalid ever reaches Envoy.
pub fn build(
    dataplane: &Dataplane,
    settings: &SpecifierSettings,
) -> Result<Specifier, SpecifierError> {
    let mut targets: Vec<ProbeTarget> = Vec::new();
    let mut target_of_inbound = Vec::with_capacity(dataplane.inbounds.len());
    for (index, inbound) in dataplane.inbounds.iter().enumerate() {
        let ignored = inbound.state == crate::dataplane::InboundState::Ignored;
        if ignored || (!settings.probe_all_inbounds && inbound.probe.is_none()) {
            target_of_inbound.push(None);
            continue;
        }
        let probe = inbound
            .probe
            .map(|o| o.apply(&settings.defaults))
            .unwrap_or(settings.defaults);
        if let Some(error) = probe.validate().into_iter().next() {
            return Err(SpecifierError::InvalidProbe {
                inbound: index,
                error,
            });
        }
        let endpoint = SocketAddr::new(inbound.service_address, inbound.service_port);
        match targets.iter().position(|t| t.endpoint == endpoint) {
            Some(t) if targets[t].settings != probe => {
                return Err(SpecifierError::ConflictingProbes {
                    first: targets[t].inbounds[0],
                    second: index,
                    endpoint,
                })
            }
            Some(t) => {
                targets[t].inbounds.push(index);
                target_of_inbound.push(Some(t));
            }
            None => {
                targets.push(ProbeTarget {
                    cluster: cluster_name(endpoint),
                    endpoint,
                    settings: probe,
                    inbounds: vec![index],
                });
                target_of_inbound.push(Some(targets.len() - 1));
            }
        }
    }
    let message = HealthCheckSpecifier {
        cluster_health_checks: targets.iter().map(cluster_health_check).collect(),
        interval: Some(pb_duration(settings.report_interval)),
    };
    Ok(Specifier::new(message, targets, target_of_inbound))
}

fn cluster_health_check(target: &ProbeTarget) -> ClusterHealthCheck {
    let s = &target.settings;
    ClusterHealthCheck {
        cluster_name: target.cluster.clone(),
        health_checks: vec![HealthCheck {
            timeout: Some(pb_duration(s.timeout)),
            interval: Some(pb_duration(s.interval)),
            no_traffic_interval: Some(pb_duration(s.no_traffic_interval)),
            no_traffic_healthy_interval: Some(pb_duration(s.no_traffic_interval)),
            healthy_threshold: Some(UInt32Value {
                value: s.healthy_threshold,
            }),
            unhealthy_threshold: Some(UInt32Value {
                value: s.unhealthy_threshold,
            }),
            // Connect-only: no payload to send, nothing to expect.
            health_checker: Some(health_check::HealthChecker::TcpHealthCheck(
                health_check::TcpHealthCheck::default(),
            )),
            ..Default::default()
        }],
        locality_endpoints: vec![LocalityEndpoints {
            locality: None,
            endpoints: vec![endpoint(target.endpoint)],
        }],
        ..Default::default()
    }
}

/// An Envoy endpoint for an IP literal and port.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint {
        address: Some(socket_address(addr.ip(), addr.port())),
        ..Default::default()
    }
}

fn socket_address(ip: IpAddr, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            protocol: socket_address::Protocol::Tcp as i32,
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// The IP and port of an Envoy endpoint, if it is an IP socket address.
pub fn endpoint_addr(endpoint: &Endpoint) -> Option<SocketAddr> {
    let address::Address::SocketAddress(sa) = endpoint.address.as_ref()?.address.as_ref()? else {
        return None;
    };
    let ip: IpAddr = sa.address.parse().ok()?;
    match sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => {
            Some(SocketAddr::new(ip, u16::try_from(p).ok()?))
        }
        _ => None,
    }
}

pub fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{DataplaneId, Inbound, ProbeOverrides};
    use std::collections::BTreeMap;

    fn defaults() -> SpecifierSettings {
        SpecifierSettings {
            defaults: ProbeSettings {
                interval: Duration::from_secs(1),
                timeout: Duration::from_millis(500),
                no_traffic_interval: Duration::from_secs(2),
                healthy_threshold: 1,
                unhealthy_threshold: 2,
            },
            report_interval: Duration::from_secs(5),
            probe_all_inbounds: true,
        }
    }

    fn inbound(port: u16, service_port: u16, probe: Option<ProbeOverrides>) -> Inbound {
        Inbound {
            port,
            address: "10.0.0.1".parse().unwrap(),
            service_address: "127.0.0.1".parse().unwrap(),
            service_port,
            tags: BTreeMap::new(),
            probe,
            name: None,
            state: Default::default(),
        }
    }

    fn dataplane(inbounds: Vec<Inbound>) -> Dataplane {
        Dataplane {
            id: DataplaneId::new("default", "web-01"),
            address: "10.0.0.1".parse().unwrap(),
            inbounds,
            gateway: None,
            listeners: Vec::new(),
        }
    }

    #[test]
    fn every_field_is_set() {
        let spec = build(&dataplane(vec![inbound(10001, 8080, None)]), &defaults()).unwrap();
        let expected = HealthCheckSpecifier {
            cluster_health_checks: vec![ClusterHealthCheck {
                cluster_name: "probe_127.0.0.1:8080".into(),
                health_checks: vec![HealthCheck {
                    timeout: Some(PbDuration {
                        seconds: 0,
                        nanos: 500_000_000,
                    }),
                    interval: Some(PbDuration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    no_traffic_interval: Some(PbDuration {
                        seconds: 2,
                        nanos: 0,
                    }),
                    no_traffic_healthy_interval: Some(PbDuration {
                        seconds: 2,
                        nanos: 0,
                    }),
                    healthy_threshold: Some(UInt32Value { value: 1 }),
                    unhealthy_threshold: Some(UInt32Value { value: 2 }),
                    health_checker: Some(health_check::HealthChecker::TcpHealthCheck(
                        health_check::TcpHealthCheck {
                            send: None,
                            receive: vec![],
                            proxy_protocol_config: None,
                        },
                    )),
                    ..Default::default()
                }],
                locality_endpoints: vec![LocalityEndpoints {
                    locality: None,
                    endpoints: vec![Endpoint {
                        address: Some(Address {
                            address: Some(address::Address::SocketAddress(SocketAddress {
                                protocol: 0,
                                address: "127.0.0.1".into(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    8080,
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            }],
            interval: Some(PbDuration {
                seconds: 5,
                nanos: 0,
            }),
        };
        assert_eq!(spec.message, expected);
        assert_eq!(spec.target_of_inbound, vec![Some(0)]);
        assert_eq!(spec.targets[0].inbounds, vec![0]);
    }

    #[test]
    fn shared_targets_share_a_cluster() {
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 9090, None),
            inbound(10003, 8080, None),
        ]);
        let spec = build(&dp, &defaults()).unwrap();
        assert_eq!(spec.message.cluster_health_checks.len(), 2);
        assert_eq!(spec.targets[0].inbounds, vec![0, 2]);
        assert_eq!(spec.targets[1].cluster, "probe_127.0.0.1:9090");
        assert_eq!(spec.target_of_inbound, vec![Some(0), Some(1), Some(0)]);
        // Names are unique, non-empty and stable across builds.
        let names: std::collections::HashSet<_> = spec
            .message
            .cluster_health_checks
            .iter()
            .map(|c| c.cluster_name.clone())
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!(build(&dp, &defaults()).unwrap(), spec);
    }

    #[test]
    fn ipv6_cluster_name_and_lookup() {
        let mut ib = inbound(10001, 8080, None);
        ib.service_address = "::1".parse().unwrap();
        let spec = build(&dataplane(vec![ib]), &defaults()).unwrap();
        assert_eq!(spec.targets[0].cluster, "probe_[::1]:8080");
        let ep = &spec.message.cluster_health_checks[0].locality_endpoints[0].endpoints[0];
        let addr = endpoint_addr(ep).unwrap();
        assert_eq!(spec.target("probe_[::1]:8080", addr), Some(0));
        assert_eq!(spec.target("probe_[::1]:8081", addr), None);
    }

    #[test]
    fn overrides_and_probe_all_inbounds() {
        let o = ProbeOverrides {
            interval: Some(Duration::from_secs(3)),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, Some(o)),
            inbound(10002, 9090, None),
        ]);
        let spec = build(&dp, &defaults()).unwrap();
        let hc = &spec.message.cluster_health_checks[0].health_checks[0];
        assert_eq!(hc.interval.unwrap().seconds, 3);
        assert_eq!(hc.no_traffic_interval.unwrap().seconds, 3);
        let only_probed = SpecifierSettings {
            probe_all_inbounds: false,
            ..defaults()
        };
        let spec = build(&dp, &only_probed).unwrap();
        assert_eq!(spec.targets.len(), 1);
        assert_eq!(spec.target_of_inbound, vec![Some(0), None]);
    }

    #[test]
    fn invalid_override_is_refused() {
        let o = ProbeOverrides {
            timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 9090, Some(o)),
        ]);
        let e = build(&dp, &defaults()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "networking.inbound[1].serviceProbe: timeout (5s) must be <= interval (1s): a probe may not outlive the gap between probes"
        );
    }

    #[test]
    fn conflicting_settings_on_one_target_are_refused() {
        let o = ProbeOverrides {
            healthy_threshold: Some(3),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 8080, Some(o)),
        ]);
        assert!(matches!(
            build(&dp, &defaults()),
            Err(SpecifierError::ConflictingProbes {
                first: 0,
                second: 1,
                ..
            })
        ));
    }

    #[test]
    fn no_inbounds_no_clusters() {
        let spec = build(&dataplane(vec![]), &defaults()).unwrap();
        assert!(spec.message.cluster_health_checks.is_empty());
        assert_eq!(spec.message.interval.unwrap().seconds, 5);
    }

    #[test]
    fn the_encoded_bytes_are_the_message() {
        let empty = Specifier::empty(Duration::from_secs(7));
        let decoded = HealthCheckSpecifier::decode(&empty.encoded()[..]).unwrap();
        assert_eq!(decoded, empty.message);
        assert_eq!(decoded.interval.unwrap().seconds, 7);
        let spec = build(
            &dataplane(vec![inbound(10001, 8080, None), inbound(10002, 8081, None)]),
            &defaults(),
        )
        .unwrap();
        let not_yet_encoded = spec.clone();
        assert_eq!(spec.encoded()[..], spec.message.encode_to_vec()[..]);
        // Encoded once, then shared; the cache is not part of the value.
        assert_eq!(spec.encoded().as_ptr(), spec.encoded().as_ptr());
        assert_eq!(spec, not_yet_encoded);
        let decoded = HealthCheckSpecifier::decode(&spec.encoded()[..]).unwrap();
        assert_eq!(decoded.cluster_health_checks.len(), 2);
        assert_eq!(decoded, spec.message);
    }
}
