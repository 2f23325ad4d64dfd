//! The gRPC server of the `HealthDiscoveryService`, in place of the one
//! generated in `envoy-types`, for these reasons:
//!
//! - specifiers go out as the bytes encoded once when they were built
//!   ([`Specifier::encoded`](crate::specifier::Specifier::encoded)): a send
//!   copies them into the stream's buffer instead of copying and encoding the
//!   message again;
//! - the per-stream encode and decode buffers start at [`CODEC_BUFFER`]
//!   instead of tonic's 8 KiB each: an HDS stream carries messages of a few
//!   hundred bytes, and these buffers are a large part of what each connected
//!   Envoy costs in memory. They still grow to the largest message seen;
//! - a `HealthCheckRequest` is decoded for what hdsd reads of it, the
//!   node's id and Envoy version ([`lean`]): Envoy's node also carries its build, metadata and
//!   the list of its extensions (over a hundred in a real Envoy), which
//!   decoding in full would allocate and free again on every stream's
//!   first message;
//! - a report is checked and kept as its bytes, a slice of the stream's
//!   buffer ([`Report`]), and folded in place: decoding it into messages
//!   cost about a dozen allocations per report.
//!
//! On the wire nothing changes: same service, methods, messages and (no)
//! compression as the generated server; the largest message decoded is
//! `hds.limits.max_message_bytes` instead of tonic's 4 MiB.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::ops::Range;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::health::v3::HealthCheckRequest;
use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::Message;
use smallvec::SmallVec;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};

use super::{HdsService, SpecifierStream};
use crate::report::{Report, ReportError};

/// Initial size of a stream's encode buffer and of its decode buffer.
/// Envoy's requests and reports, and hdsd's specifiers, are a few hundred
/// bytes for a dataplane with a few inbounds; a larger message grows the
/// buffer (once per stream) like tonic's default would.
pub const CODEC_BUFFER: usize = 1024;

/// tonic's default: how much an encoder writes before it yields.
const YIELD_THRESHOLD: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(CODEC_BUFFER, YIELD_THRESHOLD)
}

/// Specifiers out as already-encoded bytes; requests and reports in.
#[derive(Debug, Clone, Copy, Default)]
struct HdsCodec;

impl Codec for HdsCodec {
    type Encode = Bytes;
    type Decode = FromEnvoy;
    type Encoder = PreEncoded;
    type Decoder = Decode;

    fn encoder(&mut self) -> PreEncoded {
        PreEncoded
    }

    fn decoder(&mut self) -> Decode {
        Decode
    }
}

#[derive(Debug, Clone, Copy)]
struct PreEncoded;

impl Encoder for PreEncoded {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

#[derive(Debug, Clone, Copy)]
struct Decode;

impl Decoder for Decode {
    type Item = FromEnvoy;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        // One contiguous message (tonic buffers it whole: no copy). A
        // report keeps a slice of it until folded.
        let message = buf.copy_to_bytes(buf.remaining());
        // As tonic-prost reports a message that does not decode.
        FromEnvoy::decode(message)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// The `HealthDiscoveryService` server: add it with
/// `tonic::transport::Server::add_service`.
#[derive(Debug, Clone)]
pub struct HdsServer {
    inner: Arc<HdsService>,
}

impl HdsServer {
    pub fn new(service: HdsService) -> HdsServer {
        HdsServer {
            inner: Arc::new(service),
        }
    }
}

impl NamedService for HdsServer {
    const NAME: &'static str = "envoy.service.health.v3.HealthDiscoveryService";
}

struct StreamHealthCheck(Arc<HdsService>);

impl StreamingService<FromEnvoy> for StreamHealthCheck {
    type Response = Bytes;
    type ResponseStream = SpecifierStream;
    type Future = BoxFuture<Response<SpecifierStream>, Status>;

    fn call(&mut self, request: Request<Streaming<FromEnvoy>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.stream_health_check(request).await })
    }
}

struct FetchHealthCheck(Arc<HdsService>);

impl UnaryService<FromEnvoy> for FetchHealthCheck {
    type Response = Bytes;
    type Future = BoxFuture<Response<Bytes>, Status>;

    fn call(&mut self, request: Request<FromEnvoy>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.fetch_health_check(request).await })
    }
}

impl<B> Service<http::Request<B>> for HdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        // A report of a dataplane with thousands of inbounds is well under
        // the limit (docs/security.md: "Limits and hardening"); a larger message is
        // refused before it is buffered whole.
        let max = inner.settings.limits.max_message_bytes;
        match request.uri().path() {
            "/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck" => {
                Box::pin(async move {
                    let mut grpc = Grpc::new(HdsCodec).max_decoding_message_size(max);
                    Ok(grpc.streaming(StreamHealthCheck(inner), request).await)
                })
            }
            "/envoy.service.health.v3.HealthDiscoveryService/FetchHealthCheck" => {
                Box::pin(async move {
                    let mut grpc = Grpc::new(HdsCodec).max_decoding_message_size(max);
                    Ok(grpc.unary(FetchHealthCheck(inner), request).await)
                })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

/// A message from Envoy (`HealthCheckRequestOrEndpointHealthResponse`), as
/// hdsd reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum FromEnvoy {
    /// A `HealthCheckRequest`, with only its node's id decoded.
    Request(Box<HealthCheckRequest>),
    /// An `EndpointHealthResponse`, checked and kept as its bytes.
    Report(Report),
    /// Neither: the oneof is not set.
    Empty,
}

impl FromEnvoy {
    /// Decodes one message, as prost would decode the oneof (the last
    /// variant wins; a variant that occurs more than once is merged).
    pub fn decode(message: Bytes) -> Result<FromEnvoy, DecodeError> {
        let mut variant = 0;
        let mut parts: SmallVec<[Range<usize>; 1]> = SmallVec::new();
        let mut buf = &message[..];
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag != REQUEST && tag != REPORT {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                continue;
            }
            if wire_type != WireType::LengthDelimited {
                return Err(DecodeError::Malformed(format!(
                    "field {tag} (the request_type oneof) has wire type {wire_type:?}, not LengthDelimited"
                )));
            }
            let len = usize::try_from(decode_varint(&mut buf)?)
                .ok()
                .filter(|&len| len <= buf.len())
                .ok_or_else(|| {
                    DecodeError::Malformed("a field is longer than the message".into())
                })?;
            let start = message.len() - buf.len();
            buf = &buf[len..];
            if tag != variant {
                parts.clear();
                variant = tag;
            }
            parts.push(start..start + len);
        }
        // Occurrences of one variant merge: their bytes, joined, are that merge.
        let joined = match parts.as_slice() {
            [] => return Ok(FromEnvoy::Empty),
            [one] => message.slice(one.clone()),
            many => Bytes::from(
                many.iter()
                    .flat_map(|r| &message[r.clone()])
                    .copied()
                    .collect::<Vec<u8>>(),
            ),
        };
        if variant == REQUEST {
            let lean::Request { node } = lean::Request::decode(joined)?;
            Ok(FromEnvoy::Request(Box::new(HealthCheckRequest {
                node: node.map(|n| Node {
                    id: n.id,
                    user_agent_version_type: n.version.map(Into::into),
                    ..Default::default()
                }),
                capability: None,
            })))
        } else {
            Ok(FromEnvoy::Report(Report::decode(joined)?))
        }
    }
}

/// Why a message from Envoy does not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("malformed HealthCheckRequestOrEndpointHealthResponse: {0}")]
    Malformed(String),
}

/// The oneof's fields: `health_check_request`, `endpoint_health_response`.
const REQUEST: u32 = 1;
const REPORT: u32 = 2;

/// A `HealthCheckRequest` as hdsd reads it: the same field numbers and
/// types as envoy-types', with only the node's id and version kept (prost
/// skips the other fields without decoding them). Envoy's node also carries
/// its build metadata, its metadata and the list of its extensions.
mod lean {
    use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
    use envoy_types::pb::envoy::config::core::v3::BuildVersion;
    use envoy_types::pb::envoy::r#type::v3::SemanticVersion;

    /// `envoy.service.health.v3.HealthCheckRequest`: `node` is field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(message, optional, tag = "1")]
        pub node: Option<LeanNode>,
    }

    /// `envoy.config.core.v3.Node`: `id` is field 1, the oneof
    /// `user_agent_version_type` fields 7 (`user_agent_version`) and 8
    /// (`user_agent_build_version`): a oneof here too, so that, as in
    /// protobuf, the last of its fields wins.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeanNode {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(oneof = "LeanVersion", tags = "7, 8")]
        pub version: Option<LeanVersion>,
    }

    /// The node's `user_agent_version_type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum LeanVersion {
        #[prost(string, tag = "7")]
        Text(String),
        #[prost(message, tag = "8")]
        Build(LeanBuild),
    }

    /// `envoy.config.core.v3.BuildVersion`: `version` is field 1 (its
    /// metadata, field 2, is skipped).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeanBuild {
        #[prost(message, optional, tag = "1")]
        pub version: Option<SemanticVersion>,
    }

    impl From<LeanVersion> for UserAgentVersionType {
        fn from(v: LeanVersion) -> Self {
            match v {
                #[allow(deprecated)]
                LeanVersion::Text(text) => UserAgentVersionType::UserAgentVersion(text),
                LeanVersion::Build(b) => {
                    UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
                        version: b.version,
                        metadata: None,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::BuildVersion;
    use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
    use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
    use envoy_types::pb::envoy::service::health::v3::{
        Capability, ClusterEndpointsHealth, EndpointHealthResponse,
        HealthCheckRequestOrEndpointHealthResponse,
    };

    fn decode(m: &HealthCheckRequestOrEndpointHealthResponse) -> FromEnvoy {
        FromEnvoy::decode(Bytes::from(m.encode_to_vec())).unwrap()
    }

    /// The node's id comes through; the rest of the node (build,
    /// metadata) and the capability are skipped; a report keeps its bytes.
    #[test]
    fn reads_the_node_id_and_whole_reports() {
        let request = HealthCheckRequestOrEndpointHealthResponse {
            request_type: Some(RequestType::HealthCheckRequest(HealthCheckRequest {
                node: Some(Node {
                    id: "default.web-01".into(),
                    cluster: "web".into(),
                    user_agent_name: "envoy".into(),
                    user_agent_version_type: Some(
                        envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
                            version: Some(SemanticVersion { major_number: 1, minor_number: 40, patch: 0 }),
                            metadata: None,
                        }),
                    ),
                    ..Default::default()
                }),
                capability: Some(Capability { health_check_protocols: vec![1] }),
            })),
        };
        let FromEnvoy::Request(r) = decode(&request) else {
            panic!("a request")
        };
        let node = r.node.unwrap();
        assert_eq!(node.id, "default.web-01");
        assert_eq!(
            crate::capability::EnvoyVersion::of_node(&node),
            Some(crate::capability::EnvoyVersion::new(1, 40, 0))
        );
        assert_eq!(node.cluster, "", "the rest of the node is skipped");

        let health = EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: "web".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let report = HealthCheckRequestOrEndpointHealthResponse {
            request_type: Some(RequestType::EndpointHealthResponse(health.clone())),
        };
        assert_eq!(decode(&report), FromEnvoy::Report(Report::from(&health)));

        // Nothing at all: no request type, as before.
        assert_eq!(FromEnvoy::decode(Bytes::new()).unwrap(), FromEnvoy::Empty);
    }

    /// As prost decodes a oneof: the last variant wins, and one variant
    /// that occurs twice is merged.
    #[test]
    fn the_last_variant_wins_and_repeats_merge() {
        let request = |id: &str| {
            HealthCheckRequestOrEndpointHealthResponse {
                request_type: Some(RequestType::HealthCheckRequest(HealthCheckRequest {
                    node: Some(Node {
                        id: id.into(),
                        ..Default::default()
                    }),
                    capability: None,
                })),
            }
            .encode_to_vec()
        };
        let report = |cluster: &str| {
            HealthCheckRequestOrEndpointHealthResponse {
                request_type: Some(RequestType::EndpointHealthResponse(
                    EndpointHealthResponse {
                        cluster_endpoints_health: vec![ClusterEndpointsHealth {
                            cluster_name: cluster.into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )),
            }
            .encode_to_vec()
        };
        let cases = [
            [request("default.a"), report("x")].concat(),
            [report("x"), request("default.a")].concat(),
            [report("x"), report("y")].concat(),
            [request("default.a"), request("default.b")].concat(),
            [report("x"), request("default.a"), report("y")].concat(),
        ];
        for bytes in cases {
            let prost = HealthCheckRequestOrEndpointHealthResponse::decode(&bytes[..]).unwrap();
            let ours = FromEnvoy::decode(Bytes::from(bytes)).unwrap();
            match (prost.request_type, ours) {
                (Some(RequestType::HealthCheckRequest(p)), FromEnvoy::Request(o)) => {
                    assert_eq!(p.node.unwrap().id, o.node.unwrap().id)
                }
                (Some(RequestType::EndpointHealthResponse(p)), FromEnvoy::Report(o)) => {
                    assert_eq!(Report::from(&p).endpoints(), o.endpoints());
                    assert_eq!(Report::from(&p).len(), o.len());
                    assert_eq!(
                        p.cluster_endpoints_health.len(),
                        o.as_bytes().iter().filter(|&&b| b == 0x12).count()
                    );
                }
                (p, o) => panic!("prost read {p:?}, hdsd {o:?}"),
            }
        }
    }

    #[test]
    fn the_last_of_the_nodes_version_fields_wins_as_in_protobuf() {
        // A node with a build version (field 8), then a text version (7):
        // the case the fuzzer found, where hdsd preferred the build.
        let node = [0x42, 0x00, 0x3a, 0x03, b'1', b'.', b'0'];
        let mut message = vec![0x0a, node.len() as u8 + 2, 0x0a, node.len() as u8];
        message.extend_from_slice(&node);
        let theirs = HealthCheckRequestOrEndpointHealthResponse::decode(&message[..]).unwrap();
        let Some(RequestType::HealthCheckRequest(theirs)) = theirs.request_type else {
            panic!("prost reads a request");
        };
        let Ok(FromEnvoy::Request(ours)) = FromEnvoy::decode(Bytes::from(message)) else {
            panic!("hdsd reads a request");
        };
        let (theirs, ours) = (theirs.node.unwrap(), ours.node.unwrap());
        #[allow(deprecated)]
        let text = Some(
            envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType::UserAgentVersion(
                "1.0".into(),
            ),
        );
        assert_eq!(theirs.user_agent_version_type, text);
        assert_eq!(ours.user_agent_version_type, text);
    }

    #[test]
    fn broken_messages_are_refused() {
        // The oneof's field as a varint; a length past the end; a report
        // whose cluster name is not UTF-8.
        for bytes in [
            &[0x10, 0x01][..],
            &[0x12, 0x05, 0x0a][..],
            &[0x12, 0x06, 0x12, 0x04, 0x0a, 0x02, 0xff, 0xfe][..],
        ] {
            assert!(HealthCheckRequestOrEndpointHealthResponse::decode(bytes).is_err());
            assert!(
                FromEnvoy::decode(Bytes::copy_from_slice(bytes)).is_err(),
                "{bytes:?}"
            );
        }
    }
}
