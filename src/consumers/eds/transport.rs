//! The gRPC server of the `EndpointDiscoveryService`: envoy-types' generated
//! server, except for `StreamEndpoints`, whose requests are decoded for what
//! hdsd reads of them ([`lean`]):
//!
//! - Envoy repeats every subscribed resource name in each request, ACKs
//!   included (hundreds for a front proxy following many services). The
//!   stream's decoder keeps the names of the last request as slices of the
//!   received bytes (no copy) and compares the next request's with them:
//!   when they are the same, the request reaches the protocol without them
//!   ([`EdsRequest::same_names`]) and no string is allocated for them.
//! - Envoy sends its whole node in every request unless
//!   `set_node_on_first_message_only` is set: its build, metadata and the
//!   list of its extensions (over a hundred). Only the node's id is kept.
//!
//! On the wire nothing changes: same service, methods and messages, the
//! same message size limit (`hds.limits.max_message_bytes`).

use std::convert::Infallible;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use prost::bytes::Bytes;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::server::{EdsService, ResponseStream};

/// One `DiscoveryRequest` of a `StreamEndpoints` stream.
#[derive(Debug, Clone, PartialEq)]
pub struct EdsRequest {
    /// The request; `resource_names` is left empty when `same_names`.
    pub request: DiscoveryRequest,
    /// The request named exactly the resources of the stream's previous
    /// request, in the same order.
    pub same_names: bool,
}

impl From<DiscoveryRequest> for EdsRequest {
    fn from(request: DiscoveryRequest) -> Self {
        EdsRequest {
            request,
            same_names: false,
        }
    }
}

/// The codec of one `StreamEndpoints` stream.
#[derive(Debug, Default)]
struct EdsCodec;

impl Codec for EdsCodec {
    type Encode = DiscoveryResponse;
    type Decode = EdsRequest;
    type Encoder = Encode;
    type Decoder = Decode;

    fn encoder(&mut self) -> Encode {
        Encode
    }

    fn decoder(&mut self) -> Decode {
        Decode::default()
    }
}

#[derive(Debug)]
struct Encode;

impl Encoder for Encode {
    type Item = DiscoveryResponse;
    type Error = Status;

    fn encode(&mut self, item: DiscoveryResponse, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// Decodes a stream's requests, remembering the last names it saw.
#[derive(Debug, Default)]
struct Decode {
    names: Names,
}

impl Decoder for Decode {
    type Item = EdsRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<EdsRequest>, Status> {
        // As tonic-prost reports a message that does not decode.
        let message = lean::Request::decode(buf).map_err(|e| Status::internal(e.to_string()))?;
        self.names.next(message).map(Some)
    }
}

/// The resource names of a stream's last request, as received.
#[derive(Debug, Default)]
struct Names {
    last: Option<Vec<Bytes>>,
}

impl Names {
    fn next(&mut self, message: lean::Request) -> Result<EdsRequest, Status> {
        let lean::Request {
            version_info,
            node,
            resource_names,
            type_url,
            response_nonce,
            error_detail,
        } = message;
        let same_names = self.last.as_ref() == Some(&resource_names);
        let names = if same_names {
            Vec::new()
        } else {
            let names = resource_names
                .iter()
                .map(|n| {
                    std::str::from_utf8(n).map(str::to_owned).map_err(|_| {
                        // As prost refuses a string field that is not UTF-8.
                        Status::internal("failed to decode Protobuf message: DiscoveryRequest.resource_names: invalid string value: data is not UTF-8 encoded")
                    })
                })
                .collect::<Result<Vec<String>, Status>>()?;
            // Owned copies, so the stream does not keep the whole received
            // buffer alive for the names' sake.
            self.last = Some(
                resource_names
                    .iter()
                    .map(|n| Bytes::copy_from_slice(n))
                    .collect(),
            );
            names
        };
        Ok(EdsRequest {
            request: DiscoveryRequest {
                version_info,
                node: node.map(|n| envoy_types::pb::envoy::config::core::v3::Node {
                    id: n.id,
                    ..Default::default()
                }),
                resource_names: names,
                type_url,
                response_nonce,
                error_detail,
                ..Default::default()
            },
            same_names,
        })
    }
}

/// The EDS server: add it with `tonic::transport::Server::add_service`.
#[derive(Debug, Clone)]
pub struct EdsServer {
    service: EdsService,
    generated: EndpointDiscoveryServiceServer<EdsService>,
    max_message_bytes: usize,
}

impl EdsServer {
    pub fn new(service: EdsService, max_message_bytes: usize) -> EdsServer {
        EdsServer {
            generated: EndpointDiscoveryServiceServer::new(service.clone())
                .max_decoding_message_size(max_message_bytes),
            service,
            max_message_bytes,
        }
    }
}

impl NamedService for EdsServer {
    const NAME: &'static str = "envoy.service.endpoint.v3.EndpointDiscoveryService";
}

struct StreamEndpoints(EdsService);

impl StreamingService<EdsRequest> for StreamEndpoints {
    type Response = DiscoveryResponse;
    type ResponseStream = ResponseStream;
    type Future = BoxFuture<Response<ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<EdsRequest>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.stream(request) })
    }
}

impl<B> Service<http::Request<B>> for EdsServer
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
        if request.uri().path()
            == "/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints"
        {
            let service = self.service.clone();
            let max = self.max_message_bytes;
            return Box::pin(async move {
                let mut grpc = Grpc::new(EdsCodec).max_decoding_message_size(max);
                Ok(grpc.streaming(StreamEndpoints(service), request).await)
            });
        }
        // FetchEndpoints, DeltaEndpoints and unknown methods.
        self.generated.call(request)
    }
}

/// `envoy.service.discovery.v3.DiscoveryRequest` as hdsd reads it: the same
/// field numbers, the names as byte slices of the received message, only the
/// node's id (prost skips the other fields without decoding them).
mod lean {
    use envoy_types::pb::google::rpc::Status;
    use prost::bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(string, tag = "1")]
        pub version_info: String,
        #[prost(message, optional, tag = "2")]
        pub node: Option<Node>,
        #[prost(bytes = "bytes", repeated, tag = "3")]
        pub resource_names: Vec<Bytes>,
        #[prost(string, tag = "4")]
        pub type_url: String,
        #[prost(string, tag = "5")]
        pub response_nonce: String,
        #[prost(message, optional, tag = "6")]
        pub error_detail: Option<Status>,
    }

    /// `envoy.config.core.v3.Node`: `id` is field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Node {
        #[prost(string, tag = "1")]
        pub id: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    fn decode(names: &mut Names, request: &DiscoveryRequest) -> EdsRequest {
        let message = lean::Request::decode(&request.encode_to_vec()[..]).unwrap();
        names.next(message).unwrap()
    }

    fn request(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: "1.2".into(),
            node: Some(Node {
                id: "front-1".into(),
                cluster: "front".into(),
                user_agent_name: "envoy".into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: super::super::protocol::TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    /// The fields hdsd reads come through; names repeated as they were are
    /// left out and flagged; a change of order or content is a new list.
    #[test]
    fn repeated_names_are_flagged_not_decoded_again() {
        let mut names = Names::default();
        let first = decode(&mut names, &request(&["default/web", "default/api"], ""));
        assert!(!first.same_names);
        assert_eq!(first.request.resource_names, ["default/web", "default/api"]);
        assert_eq!(first.request.node.as_ref().unwrap().id, "front-1");
        assert_eq!(
            first.request.node.as_ref().unwrap().cluster,
            "",
            "only the id is kept"
        );
        assert_eq!(first.request.version_info, "1.2");

        let ack = decode(&mut names, &request(&["default/web", "default/api"], "1"));
        assert!(ack.same_names);
        assert!(ack.request.resource_names.is_empty());
        assert_eq!(ack.request.response_nonce, "1");

        let reordered = decode(&mut names, &request(&["default/api", "default/web"], "2"));
        assert!(!reordered.same_names, "another order is another list");
        assert_eq!(
            reordered.request.resource_names,
            ["default/api", "default/web"]
        );

        let fewer = decode(&mut names, &request(&["default/api"], "3"));
        assert!(!fewer.same_names);
        assert_eq!(fewer.request.resource_names, ["default/api"]);

        let nack = DiscoveryRequest {
            error_detail: Some(RpcStatus {
                code: 3,
                message: "bad".into(),
                details: vec![],
            }),
            ..request(&["default/api"], "4")
        };
        let decoded = decode(&mut names, &nack);
        assert!(decoded.same_names);
        assert_eq!(decoded.request.error_detail.unwrap().message, "bad");
    }

    /// A first request naming nothing is not "the same names" (it is the
    /// wildcard, which the protocol refuses).
    #[test]
    fn a_first_empty_list_is_not_the_same_names() {
        let mut names = Names::default();
        assert!(!decode(&mut names, &request(&[], "")).same_names);
        assert!(decode(&mut names, &request(&[], "1")).same_names);
    }

    /// A name that is not UTF-8 is refused, as the generated server would.
    #[test]
    fn a_name_that_is_not_utf8_is_refused() {
        let mut raw = Vec::new();
        prost::encoding::bytes::encode(3, &vec![0xff_u8, 0xfe], &mut raw);
        let message = lean::Request::decode(&raw[..]).unwrap();
        let e = Names::default().next(message).unwrap_err();
        assert!(e.message().contains("UTF-8"), "{}", e.message());
    }
}
