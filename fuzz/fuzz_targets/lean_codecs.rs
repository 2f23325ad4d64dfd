//! hdsd's own readers of Envoy's messages, against prost's: the HDS
//! stream's `HealthCheckRequestOrEndpointHealthResponse` (only the node's
//! id and version decoded, a report kept as its bytes) and a sequence of
//! EDS `DiscoveryRequest`s (names compared in place with the previous
//! request's). Nothing panics; whatever prost decodes, hdsd reads alike:
//! the same node id and version, the same report, the same names (or
//! "the same names as before" exactly when they are).
#![no_main]

use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::BuildVersion;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
use envoy_types::pb::envoy::service::health::v3::HealthCheckRequestOrEndpointHealthResponse;
use hdsd::consumers::eds::transport::RequestReader;
use hdsd::hds::FromEnvoy;
use hdsd::report::Report;
use libfuzzer_sys::fuzz_target;
use prost::bytes::Bytes;
use prost::Message;

/// Messages of one EDS stream: the input split at each 0xFF 0x00 pair.
fn messages(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < data.len() {
        if data[i] == 0xFF && data[i + 1] == 0x00 {
            out.push(&data[start..i]);
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    out.push(&data[start..]);
    out
}

fn hds(data: &[u8]) {
    let ours = FromEnvoy::decode(Bytes::copy_from_slice(data));
    let Ok(theirs) = HealthCheckRequestOrEndpointHealthResponse::decode(data) else {
        // hdsd does not check the fields it skips (prost does).
        return;
    };
    let ours = match ours {
        Ok(ours) => ours,
        Err(e) => panic!("prost decodes {theirs:?}, hdsd refuses it: {e}"),
    };
    match (theirs.request_type, ours) {
        (None, FromEnvoy::Empty) => {}
        (Some(RequestType::HealthCheckRequest(theirs)), FromEnvoy::Request(ours)) => {
            let (t, o) = (theirs.node.unwrap_or_default(), ours.node.unwrap_or_default());
            assert_eq!(t.id, o.id);
            // hdsd keeps a build version's version, not its metadata.
            let version = |v: Option<UserAgentVersionType>| match v {
                Some(UserAgentVersionType::UserAgentBuildVersion(b)) => {
                    Some(UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
                        metadata: None,
                        ..b
                    }))
                }
                other => other,
            };
            assert_eq!(
                version(t.user_agent_version_type),
                version(o.user_agent_version_type)
            );
        }
        (Some(RequestType::EndpointHealthResponse(theirs)), FromEnvoy::Report(ours)) => {
            let expected = Report::from(&theirs);
            assert_eq!(ours.len(), expected.len());
            assert_eq!(ours.endpoints(), expected.endpoints());
        }
        (theirs, ours) => panic!("prost read {theirs:?}, hdsd {ours:?}"),
    }
}

fn eds(data: &[u8]) {
    let mut reader = RequestReader::new(64);
    let mut previous: Option<Vec<String>> = None;
    for message in messages(data) {
        let ours = reader.read(message);
        let Ok(theirs) = DiscoveryRequest::decode(message) else {
            // A refused request ends the stream.
            return;
        };
        let ours = match ours {
            Ok(ours) => ours,
            Err(e) if theirs.resource_names.len() > 64 => {
                assert!(e.contains("resource names"), "{e}");
                return;
            }
            Err(e) => panic!("prost decodes {theirs:?}, hdsd refuses it: {e}"),
        };
        let names = match ours.same_names {
            true => previous.clone().expect("the same names as a previous request"),
            false => ours.request.resource_names.clone(),
        };
        assert_eq!(names, theirs.resource_names);
        if ours.same_names {
            assert!(ours.request.resource_names.is_empty());
        }
        assert_eq!(ours.request.version_info, theirs.version_info);
        assert_eq!(ours.request.type_url, theirs.type_url);
        assert_eq!(ours.request.response_nonce, theirs.response_nonce);
        assert_eq!(ours.request.error_detail, theirs.error_detail);
        let (t, o) = (theirs.node.unwrap_or_default(), ours.request.node.unwrap_or_default());
        assert_eq!(t.id, o.id);
        assert_eq!(
            t.locality.map(|l| l.zone),
            o.locality.map(|l| l.zone)
        );
        previous = Some(names);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector & 1 {
        0 => hds(rest),
        _ => eds(rest),
    }
});
