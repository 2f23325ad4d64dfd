//! What a simulated Envoy 1.40 sends, and how it checks what it receives.
//!
//! Mirrors Envoy's `HdsDelegate`: the first message is a `HealthCheckRequest`
//! with the node (id, cluster, user agent, build version) and the
//! capabilities Envoy announces (HTTP and TCP); reports list every cluster,
//! locality and endpoint of the last accepted specifier in
//! `cluster_endpoints_health`, with a copy of each endpoint in the legacy flat
//! `endpoints_health` list, as Envoy still sends it.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::health_check::HealthChecker;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{BuildVersion, HealthStatus, Locality, Node};
use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
use envoy_types::pb::envoy::service::health::v3::capability::Protocol;
use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
use envoy_types::pb::envoy::service::health::v3::{
    Capability, ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, HealthCheckRequest,
    HealthCheckRequestOrEndpointHealthResponse, HealthCheckSpecifier, LocalityEndpointsHealth,
};
use envoy_types::pb::google::protobuf::{value::Kind, Duration as PbDuration, Struct, Value};

pub type Message = HealthCheckRequestOrEndpointHealthResponse;

/// The version a simulated Envoy claims.
pub const ENVOY_VERSION: (u32, u32, u32) = (1, 40, 0);

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// The node Envoy 1.40 sends: id, cluster (hdsd's bootstrap sets it to the
/// mesh), user agent name and build version with Envoy's build metadata.
pub fn node(node_id: &str, cluster: &str) -> Node {
    let (major, minor, patch) = ENVOY_VERSION;
    let metadata = Struct {
        fields: [
            ("revision.sha", "0000000000000000000000000000000000000000"),
            ("revision.status", "Clean"),
            ("build.type", "RELEASE"),
            ("ssl.version", "BoringSSL"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), string_value(v)))
        .collect(),
    };
    #[allow(deprecated)]
    Node {
        id: node_id.to_string(),
        cluster: cluster.to_string(),
        user_agent_name: "envoy".to_string(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
            version: Some(SemanticVersion {
                major_number: major,
                minor_number: minor,
                patch,
            }),
            metadata: Some(metadata),
        })),
        ..Default::default()
    }
}

/// The first message of every stream.
pub fn health_check_request(node_id: &str, cluster: &str) -> Message {
    Message {
        request_type: Some(RequestType::HealthCheckRequest(HealthCheckRequest {
            node: Some(node(node_id, cluster)),
            capability: Some(Capability {
                health_check_protocols: vec![Protocol::Http as i32, Protocol::Tcp as i32],
            }),
        })),
    }
}

/// Everything Envoy requires of a specifier before it builds clusters from
/// it. `Err` names the first problem.
pub fn validate(spec: &HealthCheckSpecifier, expect_clusters: Option<usize>) -> Result<(), String> {
    positive("interval", spec.interval.as_ref())?;
    if let Some(n) = expect_clusters {
        if spec.cluster_health_checks.len() != n {
            return Err(format!(
                "{} clusters, expected {n} (one per inbound)",
                spec.cluster_health_checks.len()
            ));
        }
    }
    let mut names = HashSet::new();
    for (i, c) in spec.cluster_health_checks.iter().enumerate() {
        let at = |what: String| format!("cluster_health_checks[{i}] ({}): {what}", c.cluster_name);
        if c.cluster_name.is_empty() {
            return Err(at("empty cluster_name".into()));
        }
        if !names.insert(c.cluster_name.as_str()) {
            return Err(at("duplicate cluster_name".into()));
        }
        if c.health_checks.len() != 1 {
            return Err(at(format!(
                "{} health checks, expected exactly one",
                c.health_checks.len()
            )));
        }
        let hc = &c.health_checks[0];
        for (field, d) in [
            ("timeout", hc.timeout.as_ref()),
            ("interval", hc.interval.as_ref()),
            ("no_traffic_interval", hc.no_traffic_interval.as_ref()),
            (
                "no_traffic_healthy_interval",
                hc.no_traffic_healthy_interval.as_ref(),
            ),
        ] {
            positive(field, d).map_err(at)?;
        }
        for (field, v) in [
            ("healthy_threshold", hc.healthy_threshold.as_ref()),
            ("unhealthy_threshold", hc.unhealthy_threshold.as_ref()),
        ] {
            match v {
                Some(v) if v.value > 0 => {}
                Some(_) => return Err(at(format!("{field} is 0"))),
                None => return Err(at(format!("{field} is not set"))),
            }
        }
        if !matches!(hc.health_checker, Some(HealthChecker::TcpHealthCheck(_))) {
            return Err(at("health_checker is not a TCP health check".into()));
        }
        if c.locality_endpoints.is_empty() {
            return Err(at("no locality_endpoints".into()));
        }
        for le in &c.locality_endpoints {
            if le.endpoints.is_empty() {
                return Err(at("a locality_endpoints entry with no endpoints".into()));
            }
            for ep in &le.endpoints {
                endpoint_ip_port(ep.address.as_ref().and_then(|a| a.address.as_ref()))
                    .map_err(at)?;
            }
        }
    }
    Ok(())
}

fn positive(field: &str, d: Option<&PbDuration>) -> Result<(), String> {
    match d {
        None => Err(format!("{field} is not set")),
        Some(d) if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) => {
            Err(format!("{field} is not > 0"))
        }
        Some(_) => Ok(()),
    }
}

fn endpoint_ip_port(address: Option<&AddressKind>) -> Result<SocketAddr, String> {
    let Some(AddressKind::SocketAddress(sa)) = address else {
        return Err("endpoint without a socket address".into());
    };
    let ip: IpAddr = sa
        .address
        .parse()
        .map_err(|_| format!("endpoint address {:?} is not an IP literal", sa.address))?;
    match sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) if (1..=65535).contains(&p) => {
            Ok(SocketAddr::new(ip, p as u16))
        }
        _ => Err(format!("endpoint {ip} has no port_value in 1..=65535")),
    }
}

/// A report for the current specifier: built once per specifier, its first
/// endpoint's status set per report.
#[derive(Debug, Clone)]
pub struct ReportPlan {
    report: EndpointHealthResponse,
    /// The first endpoint (the one that flips), if any.
    pub first: Option<SocketAddr>,
    pub interval: std::time::Duration,
}

impl ReportPlan {
    pub fn new(spec: &HealthCheckSpecifier) -> ReportPlan {
        let mut report = EndpointHealthResponse::default();
        let mut first = None;
        for c in &spec.cluster_health_checks {
            let mut cluster = ClusterEndpointsHealth {
                cluster_name: c.cluster_name.clone(),
                locality_endpoints_health: Vec::new(),
            };
            for le in &c.locality_endpoints {
                let mut locality = LocalityEndpointsHealth {
                    locality: Some(le.locality.clone().unwrap_or_else(Locality::default)),
                    endpoints_health: Vec::new(),
                };
                for ep in &le.endpoints {
                    if first.is_none() {
                        first =
                            endpoint_ip_port(ep.address.as_ref().and_then(|a| a.address.as_ref()))
                                .ok();
                    }
                    let health = EndpointHealth {
                        endpoint: Some(envoy_types::pb::envoy::config::endpoint::v3::Endpoint {
                            address: ep.address.clone(),
                            ..Default::default()
                        }),
                        health_status: HealthStatus::Healthy as i32,
                        health_metadata: None,
                    };
                    #[allow(deprecated)]
                    report.endpoints_health.push(health.clone());
                    locality.endpoints_health.push(health);
                }
                cluster.locality_endpoints_health.push(locality);
            }
            report.cluster_endpoints_health.push(cluster);
        }
        let interval = spec
            .interval
            .map(|d| std::time::Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
            .unwrap_or(std::time::Duration::from_secs(1));
        ReportPlan {
            report,
            first,
            interval,
        }
    }

    /// The report with the first endpoint `healthy` or not; all others healthy.
    pub fn message(&self, first_healthy: bool) -> Message {
        let mut report = self.report.clone();
        if !first_healthy {
            let status = HealthStatus::Unhealthy as i32;
            if let Some(eh) = report
                .cluster_endpoints_health
                .first_mut()
                .and_then(|c| c.locality_endpoints_health.first_mut())
                .and_then(|l| l.endpoints_health.first_mut())
            {
                eh.health_status = status;
            }
            #[allow(deprecated)]
            if let Some(eh) = report.endpoints_health.first_mut() {
                eh.health_status = status;
            }
        }
        Message {
            request_type: Some(RequestType::EndpointHealthResponse(report)),
        }
    }
}

/// The specifier the null server gives everyone: `clusters` TCP checks of
/// 127.0.0.1:20001.., every field Envoy requires.
pub fn fixed_specifier(clusters: u16, interval: std::time::Duration) -> HealthCheckSpecifier {
    let mut dp = hdsd::dataplane::Dataplane {
        id: hdsd::dataplane::DataplaneId::new("null", "server"),
        address: [127, 0, 0, 1].into(),
        inbounds: Vec::new(),
        gateway: None,
        listeners: Vec::new(),
        admin_port: None,
    };
    for k in 0..clusters {
        dp.inbounds.push(hdsd::dataplane::Inbound {
            port: 10001 + k,
            address: [127, 0, 0, 1].into(),
            service_address: [127, 0, 0, 1].into(),
            service_port: crate::gen::SERVICE_PORT_BASE + k,
            tags: Default::default(),
            probe: None,
            name: None,
            state: Default::default(),
        });
    }
    let settings = hdsd::specifier::SpecifierSettings {
        defaults: hdsd::probe::ProbeSettings {
            interval: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
            no_traffic_interval: std::time::Duration::from_secs(1),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        },
        report_interval: interval,
        ..Default::default()
    };
    hdsd::specifier::build(&dp, &settings)
        .expect("fixed settings are valid")
        .message
}

/// The status name hdsd's API shows for a reported status.
pub fn api_status(healthy: bool) -> &'static str {
    if healthy {
        "healthy"
    } else {
        "unhealthy"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_specifier_is_valid_and_reports_cover_it() {
        let spec = fixed_specifier(2, std::time::Duration::from_secs(5));
        validate(&spec, Some(2)).unwrap();
        assert!(validate(&spec, Some(3)).is_err());
        let plan = ReportPlan::new(&spec);
        assert_eq!(plan.interval, std::time::Duration::from_secs(5));
        assert_eq!(plan.first.unwrap().port(), crate::gen::SERVICE_PORT_BASE);
        let Some(RequestType::EndpointHealthResponse(r)) = plan.message(false).request_type else {
            panic!()
        };
        assert_eq!(r.cluster_endpoints_health.len(), 2);
        #[allow(deprecated)]
        let flat = &r.endpoints_health;
        assert_eq!(flat.len(), 2);
        assert_eq!(flat[0].health_status, HealthStatus::Unhealthy as i32);
        assert_eq!(
            r.cluster_endpoints_health[1].locality_endpoints_health[0].endpoints_health[0]
                .health_status,
            HealthStatus::Healthy as i32
        );
    }

    #[test]
    fn invalid_specifiers_are_named() {
        let good = fixed_specifier(2, std::time::Duration::from_secs(5));
        let mut s = good.clone();
        s.interval = None;
        assert!(validate(&s, None).unwrap_err().contains("interval"));
        let mut s = good.clone();
        s.cluster_health_checks[1].cluster_name = s.cluster_health_checks[0].cluster_name.clone();
        assert!(validate(&s, None).unwrap_err().contains("duplicate"));
        let mut s = good.clone();
        s.cluster_health_checks[0].health_checks[0].unhealthy_threshold = None;
        assert!(validate(&s, None)
            .unwrap_err()
            .contains("unhealthy_threshold"));
        let mut s = good.clone();
        s.cluster_health_checks[0].health_checks[0].no_traffic_healthy_interval = None;
        assert!(validate(&s, None)
            .unwrap_err()
            .contains("no_traffic_healthy"));
        let mut s = good.clone();
        s.cluster_health_checks[0].locality_endpoints[0]
            .endpoints
            .clear();
        assert!(validate(&s, None).unwrap_err().contains("no endpoints"));
        let mut s = good;
        s.cluster_health_checks[0].health_checks[0].health_checker = None;
        assert!(validate(&s, None).unwrap_err().contains("TCP"));
    }
}
