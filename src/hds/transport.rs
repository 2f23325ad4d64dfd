//! The gRPC server of the `HealthDiscoveryService`, in place of the one
//! generated in `envoy-types`, for two reasons:
//!
//! - specifiers go out as the bytes encoded once when they were built
//!   ([`Specifier::encoded`](crate::specifier::Specifier::encoded)): a send
//!   copies them into the stream's buffer instead of copying and encoding the
//!   message again;
//! - the per-stream encode and decode buffers start at [`CODEC_BUFFER`]
//!   instead of tonic's 8 KiB each: an HDS stream carries messages of a few
//!   hundred bytes, and these buffers are a large part of what each connected
//!   Envoy costs in memory. They still grow to the largest message seen.
//!
//! - a `HealthCheckRequest` is decoded for what hdsd reads of it, the
//!   node's id ([`lean`]): Envoy's node also carries its build, metadata and
//!   the list of its extensions (over a hundred in a real Envoy), which
//!   decoding in full would allocate and free again on every stream's
//!   first message. Reports are decoded in full.
//!
//! On the wire nothing changes: same service, methods, messages and (no)
//! compression as the generated server; the largest message decoded is
//! `hds.limits.max_message_bytes` instead of tonic's 4 MiB.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::health::v3::HealthCheckRequestOrEndpointHealthResponse;
use prost::bytes::{BufMut, Bytes};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};

use super::{HdsService, SpecifierStream};

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
    type Decode = HealthCheckRequestOrEndpointHealthResponse;
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
    type Item = HealthCheckRequestOrEndpointHealthResponse;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        // As tonic-prost reports a message that does not decode.
        lean::Message::decode(buf)
            .map(|m| Some(m.into()))
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

impl StreamingService<HealthCheckRequestOrEndpointHealthResponse> for StreamHealthCheck {
    type Response = Bytes;
    type ResponseStream = SpecifierStream;
    type Future = BoxFuture<Response<SpecifierStream>, Status>;

    fn call(
        &mut self,
        request: Request<Streaming<HealthCheckRequestOrEndpointHealthResponse>>,
    ) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.stream_health_check(request).await })
    }
}

struct FetchHealthCheck(Arc<HdsService>);

impl UnaryService<HealthCheckRequestOrEndpointHealthResponse> for FetchHealthCheck {
    type Response = Bytes;
    type Future = BoxFuture<Response<Bytes>, Status>;

    fn call(
        &mut self,
        request: Request<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Self::Future {
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
        // the limit (README: "Limits and hardening"); a larger message is
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

/// The messages from Envoy, as hdsd reads them: the same field numbers and
/// types as envoy-types' `HealthCheckRequestOrEndpointHealthResponse`, with
/// only the node's id kept of a `HealthCheckRequest` (prost skips the other
/// fields without decoding them).
mod lean {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
    use envoy_types::pb::envoy::service::health::v3::{
        EndpointHealthResponse, HealthCheckRequest, HealthCheckRequestOrEndpointHealthResponse,
    };

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Message {
        #[prost(oneof = "Type", tags = "1, 2")]
        pub request_type: Option<Type>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        HealthCheckRequest(Request),
        #[prost(message, tag = "2")]
        EndpointHealthResponse(EndpointHealthResponse),
    }

    /// `envoy.service.health.v3.HealthCheckRequest`: `node` is field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(message, optional, tag = "1")]
        pub node: Option<LeanNode>,
    }

    /// `envoy.config.core.v3.Node`: `id` is field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeanNode {
        #[prost(string, tag = "1")]
        pub id: String,
    }

    impl From<Message> for HealthCheckRequestOrEndpointHealthResponse {
        fn from(m: Message) -> Self {
            HealthCheckRequestOrEndpointHealthResponse {
                request_type: m.request_type.map(|t| match t {
                    Type::HealthCheckRequest(r) => {
                        RequestType::HealthCheckRequest(HealthCheckRequest {
                            node: r.node.map(|n| Node {
                                id: n.id,
                                ..Default::default()
                            }),
                            capability: None,
                        })
                    }
                    Type::EndpointHealthResponse(r) => RequestType::EndpointHealthResponse(r),
                }),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use envoy_types::pb::envoy::config::core::v3::BuildVersion;
        use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
        use envoy_types::pb::envoy::service::health::v3::Capability;
        use prost::Message as _;

        /// The node's id comes through; the rest of the node (build,
        /// metadata) and the capability are skipped; a report is the same
        /// message either way.
        #[test]
        fn reads_the_node_id_and_whole_reports() {
            #[allow(deprecated)]
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
            let decoded: HealthCheckRequestOrEndpointHealthResponse =
                Message::decode(&request.encode_to_vec()[..])
                    .unwrap()
                    .into();
            let Some(RequestType::HealthCheckRequest(r)) = decoded.request_type else {
                panic!("a request: {decoded:?}")
            };
            assert_eq!(r.node.unwrap().id, "default.web-01");

            let report = HealthCheckRequestOrEndpointHealthResponse {
                request_type: Some(RequestType::EndpointHealthResponse(
                    EndpointHealthResponse {
                        cluster_endpoints_health: vec![Default::default()],
                        ..Default::default()
                    },
                )),
            };
            let decoded: HealthCheckRequestOrEndpointHealthResponse =
                Message::decode(&report.encode_to_vec()[..]).unwrap().into();
            assert_eq!(decoded, report);

            // Nothing at all: no request type, as before.
            let empty: HealthCheckRequestOrEndpointHealthResponse =
                Message::decode(&[][..]).unwrap().into();
            assert_eq!(empty.request_type, None);
        }
    }
}
