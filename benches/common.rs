//! Inputs shared by the micro-benchmarks: a dataplane with `k` inbounds,
//! its specifier, and a report covering every endpoint.

#![allow(dead_code)] // each bench uses a part
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::service::health::v3::{
    ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
};
use hdsd::dataplane::{parse_documents, Dataplane};
use hdsd::probe::ProbeSettings;
use hdsd::specifier::{endpoint, SpecifierSettings};

pub fn settings() -> SpecifierSettings {
    SpecifierSettings {
        defaults: ProbeSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(1),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        },
        report_interval: Duration::from_secs(5),
        ..SpecifierSettings::default()
    }
}

/// A dataplane as `hdsd-loadgen gen-dataplanes` writes it, with `k` inbounds.
pub fn dataplane(k: u16) -> Dataplane {
    let mut yaml = String::from(
        "type: Dataplane\nmesh: default\nname: dp-000001\nnetworking:\n  address: 127.0.0.1\n  inbound:\n",
    );
    for i in 0..k {
        yaml.push_str(&format!(
            "  - port: {}\n    servicePort: {}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: svc-{i}}}\n",
            10001 + i,
            20001 + i
        ));
    }
    parse_documents(&yaml).expect("valid dataplane").remove(0)
}

/// Envoy's report for `k` inbounds (clusters plus the legacy flat list),
/// the first endpoint with `first`.
pub fn report(k: u16, first: HealthStatus) -> EndpointHealthResponse {
    let mut r = EndpointHealthResponse::default();
    for i in 0..k {
        let status = if i == 0 { first } else { HealthStatus::Healthy };
        let eh = EndpointHealth {
            endpoint: Some(endpoint(SocketAddr::from(([127, 0, 0, 1], 20001 + i)))),
            health_status: status as i32,
            health_metadata: None,
        };
        #[allow(deprecated)]
        r.endpoints_health.push(eh.clone());
        r.cluster_endpoints_health.push(ClusterEndpointsHealth {
            cluster_name: format!("probe_127.0.0.1:{}", 20001 + i),
            locality_endpoints_health: vec![LocalityEndpointsHealth {
                locality: Some(Default::default()),
                endpoints_health: vec![eh],
            }],
        });
    }
    r
}
