//! The report fold: a health report from Envoy (any protobuf bytes, or one
//! built from the input around the specifier's own targets) folded into a
//! dataplane's readiness, then expired. Nothing panics, the inbounds stay
//! the dataplane's, and the outcome's counts match what changed. Bytes
//! that prost decodes are read alike by hdsd's in-place reading of a
//! report: it accepts them, and folds them as it folds prost's message.
#![no_main]

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use envoy_types::pb::envoy::config::core::v3::{address, socket_address, Address, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
use envoy_types::pb::envoy::service::health::v3::{
    ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
};
use hdsd::dataplane::{parse_documents, Dataplane};
use hdsd::readiness::{expire, fold_report, rebase};
use hdsd::report::Report;
use hdsd::specifier::{build, Specifier, SpecifierSettings};
use libfuzzer_sys::fuzz_target;
use prost::bytes::Bytes;
use prost::Message;

const DATAPLANE: &str = "type: Dataplane
mesh: default
name: web-01
networking:
  address: 127.0.0.1
  admin:
    port: 9901
  inbound:
  - port: 10001
    servicePort: 8080
    tags: {kuma.io/service: web}
  - port: 10002
    servicePort: 8080
    tags: {kuma.io/service: web-alias}
  - port: 10003
    servicePort: 8081
    state: Ignored
    tags: {kuma.io/service: metrics}
  - port: 10004
    serviceAddress: ::1
    servicePort: 8082
    tags: {kuma.io/service: v6}
";

fn fixture() -> &'static (Dataplane, Specifier) {
    static FIXTURE: OnceLock<(Dataplane, Specifier)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dp = parse_documents(DATAPLANE).expect("valid").remove(0);
        let spec = build(&dp, &SpecifierSettings::default()).expect("a specifier");
        (dp, spec)
    })
}

/// A report from the input: each 4-byte chunk is one endpoint (which target
/// or a foreign one, its port if foreign, a status), grouped into clusters
/// named after the specifier's targets or not.
fn structured(spec: &Specifier, data: &[u8]) -> EndpointHealthResponse {
    let targets: Vec<_> = spec.targets.iter().map(|t| t.endpoint).collect();
    let mut clusters: Vec<ClusterEndpointsHealth> = Vec::new();
    for chunk in data.chunks(4) {
        let [which, port, status, cluster] = [0, 1, 2, 3].map(|i| *chunk.get(i).unwrap_or(&0));
        let addr = match targets.get(usize::from(which) % (targets.len() + 1)) {
            Some(t) => *t,
            None => std::net::SocketAddr::from(([127, 0, 0, 1], u16::from(port))),
        };
        let endpoint = EndpointHealth {
            endpoint: Some(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: addr.ip().to_string(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            addr.port(),
                        ))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            }),
            health_status: i32::from(status % 8),
            ..Default::default()
        };
        let name = if cluster & 1 == 0 {
            format!("probe_{addr}")
        } else {
            format!("other_{cluster}")
        };
        match clusters.iter_mut().find(|c| c.cluster_name == name) {
            Some(c) => c.locality_endpoints_health[0]
                .endpoints_health
                .push(endpoint),
            None => clusters.push(ClusterEndpointsHealth {
                cluster_name: name,
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![endpoint],
                }],
            }),
        }
    }
    EndpointHealthResponse {
        cluster_endpoints_health: clusters,
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (dp, spec) = fixture();
    let (report, with_prost) = if selector & 1 == 0 {
        let lean = Report::decode(Bytes::copy_from_slice(rest));
        match (EndpointHealthResponse::decode(rest), lean) {
            (Ok(message), Ok(lean)) => (lean, Some(Report::from(&message))),
            (Ok(message), Err(e)) => panic!("prost decodes {message:?}, hdsd refuses it: {e}"),
            // hdsd does not check the fields it skips (prost does).
            (Err(_), Ok(lean)) => (lean, None),
            (Err(_), Err(_)) => return,
        }
    } else {
        (Report::from(structured(spec, rest)), None)
    };
    let start = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("a valid time");
    let mut health = rebase(None, dp, spec, start);
    for step in 0..3i64 {
        let before = health.clone();
        let now = start + chrono::Duration::seconds(step);
        if let Some(expected) = &with_prost {
            let (mut theirs, mut ours) = (health.clone(), health.clone());
            let expected_outcome = fold_report(&mut theirs, spec, expected, now);
            assert_eq!(fold_report(&mut ours, spec, &report, now), expected_outcome);
            assert_eq!(ours, theirs);
            assert_eq!(report.len(), expected.len());
        }
        let outcome = fold_report(&mut health, spec, &report, now);
        assert_eq!(health.inbounds.len(), dp.inbounds.len());
        let ready = |h: &hdsd::readiness::Health| {
            h.inbounds.iter().filter(|i| i.status.is_ready()).count() as i64
        };
        assert_eq!(
            ready(&health) - ready(&before),
            i64::from(outcome.became_ready) - i64::from(outcome.became_not_ready)
        );
    }
    let later = start + chrono::Duration::seconds(60);
    expire(&mut health, later, chrono::Duration::seconds(15));
    assert_eq!(health.inbounds.len(), dp.inbounds.len());
});
