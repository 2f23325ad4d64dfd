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
//!   list of its extensions (over a hundred). Only the node's id and its
//!   locality's zone are kept.
//!
//! - A response goes out as [`Push::encode`] writes it: the assignments'
//!   bytes as the index encoded them once, for every subscriber.
//!
//! On the wire nothing changes: same service, methods and messages, the
//! same message size limit (`hds.limits.max_message_bytes`).

use std::convert::Infallible;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use std::ops::Range;

use prost::bytes::Buf;
use prost::encoding::{decode_key, skip_field, DecodeContext, WireType};
use prost::{DecodeError, Message};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::protocol::{EdsRequest, Push};
use super::server::{EdsService, ResponseStream};

/// The codec of one `StreamEndpoints` stream: at most `max_names`
/// resource names per request.
#[derive(Debug)]
struct EdsCodec {
    max_names: usize,
}

impl Codec for EdsCodec {
    type Encode = Push;
    type Decode = EdsRequest;
    type Encoder = Encode;
    type Decoder = Decode;

    fn encoder(&mut self) -> Encode {
        Encode
    }

    fn decoder(&mut self) -> Decode {
        Decode {
            names: Names {
                last: None,
                max: self.max_names,
            },
        }
    }
}

#[derive(Debug)]
struct Encode;

impl Encoder for Encode {
    type Item = Push;
    type Error = Status;

    fn encode(&mut self, item: Push, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf);
        Ok(())
    }
}

/// Decodes a stream's requests, remembering the last names it saw.
#[derive(Debug)]
struct Decode {
    names: Names,
}

impl Decoder for Decode {
    type Item = EdsRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<EdsRequest>, Status> {
        // One contiguous message (tonic buffers it whole: no copy).
        let message = buf.copy_to_bytes(buf.remaining());
        self.names.next(&message).map(Some).map_err(|e| match e {
            NamesError::TooMany(count) => {
                super::server::too_many_names_status(count, self.names.max)
            }
            // As tonic-prost reports a message that does not decode.
            NamesError::Decode(e) => Status::internal(e.to_string()),
        })
    }
}

/// `DiscoveryRequest.resource_names` is field 3.
const RESOURCE_NAMES: u32 = 3;

/// The resource names of a stream's last request, as received: each name's
/// whole field (key, length, bytes), in order, one after the other.
#[derive(Debug)]
struct Names {
    last: Option<Vec<u8>>,
    /// Names a request may have (`eds.max_resource_names`).
    max: usize,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            last: None,
            max: super::server::MAX_RESOURCE_NAMES,
        }
    }
}

impl std::fmt::Display for NamesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamesError::TooMany(n) => write!(f, "{n} resource names"),
            NamesError::Decode(e) => e.fmt(f),
        }
    }
}

/// Why a request was not read.
#[derive(Debug)]
enum NamesError {
    /// It names more resources than the limit (how many it names).
    TooMany(usize),
    Decode(DecodeError),
}

impl From<DecodeError> for NamesError {
    fn from(e: DecodeError) -> Self {
        NamesError::Decode(e)
    }
}

impl Names {
    /// Decodes one request. Its name fields are compared in place with the
    /// last request's, and decoded only when they differ.
    fn next(&mut self, message: &[u8]) -> Result<EdsRequest, NamesError> {
        let (same_names, fields) = self.compare(message)?;
        let mut names = Vec::new();
        if !same_names {
            let mut last = Vec::with_capacity(fields.iter().map(|f| f.len()).sum());
            for field in &fields {
                let mut field: &[u8] = &message[field.clone()];
                last.extend_from_slice(field);
                decode_key(&mut field)?;
                let mut name = String::new();
                prost::encoding::string::merge(
                    WireType::LengthDelimited,
                    &mut name,
                    &mut field,
                    DecodeContext::default(),
                )?;
                names.push(name);
            }
            self.last = Some(last);
        }
        // prost skips the name fields, unknown to the lean message.
        let lean::Request {
            version_info,
            node,
            type_url,
            response_nonce,
            error_detail,
        } = lean::Request::decode(message)?;
        Ok(EdsRequest {
            request: DiscoveryRequest {
                version_info,
                node: node.map(|n| envoy_types::pb::envoy::config::core::v3::Node {
                    id: n.id,
                    locality: n.locality.map(|l| {
                        envoy_types::pb::envoy::config::core::v3::Locality {
                            zone: l.zone,
                            ..Default::default()
                        }
                    }),
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

    /// Whether `message`'s name fields are the last request's, byte for
    /// byte and in order; and, when they are not, where they are.
    /// More names than the limit: counted, not kept.
    fn compare(&self, message: &[u8]) -> Result<(bool, Vec<Range<usize>>), NamesError> {
        let mut fields = Vec::new();
        let mut count = 0usize;
        let mut same = self.last.is_some();
        let last = self.last.as_deref().unwrap_or_default();
        let mut at = 0;
        let mut rest = message;
        while !rest.is_empty() {
            let start = message.len() - rest.len();
            let (tag, wire_type) = decode_key(&mut rest)?;
            skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
            if tag != RESOURCE_NAMES {
                continue;
            }
            count += 1;
            if count > self.max {
                continue;
            }
            let field = start..message.len() - rest.len();
            if same {
                let n = field.len();
                same = last.get(at..at + n) == Some(&message[field.clone()]);
                at += n;
            }
            fields.push(field);
        }
        if count > self.max {
            return Err(NamesError::TooMany(count));
        }
        if same && at == last.len() {
            return Ok((true, Vec::new()));
        }
        Ok((false, fields))
    }
}

/// A stream's requests as the server reads them, one after the other, for
/// tests and fuzzing outside this module: at most `max_names` names each.
#[derive(Debug)]
pub struct RequestReader(Names);

impl RequestReader {
    pub fn new(max_names: usize) -> RequestReader {
        RequestReader(Names {
            last: None,
            max: max_names,
        })
    }

    /// Reads the stream's next request; `Err` says why it is refused.
    pub fn read(&mut self, message: &[u8]) -> Result<EdsRequest, String> {
        self.0.next(message).map_err(|e| e.to_string())
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
    type Response = Push;
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
            let max_names = service.max_names();
            return Box::pin(async move {
                let mut grpc = Grpc::new(EdsCodec { max_names }).max_decoding_message_size(max);
                Ok(grpc.streaming(StreamEndpoints(service), request).await)
            });
        }
        // FetchEndpoints, DeltaEndpoints and unknown methods.
        self.generated.call(request)
    }
}

/// `envoy.service.discovery.v3.DiscoveryRequest` as hdsd reads it: the same
/// field numbers, without the names ([`Names`] reads them), only the node's
/// id (prost skips the other fields without decoding them).
mod lean {
    use envoy_types::pb::google::rpc::Status;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(string, tag = "1")]
        pub version_info: String,
        #[prost(message, optional, tag = "2")]
        pub node: Option<Node>,
        // resource_names (3): read by `Names`, skipped here.
        #[prost(string, tag = "4")]
        pub type_url: String,
        #[prost(string, tag = "5")]
        pub response_nonce: String,
        #[prost(message, optional, tag = "6")]
        pub error_detail: Option<Status>,
    }

    /// `envoy.config.core.v3.Node`: `id` is field 1, `locality` field 4.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Node {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(message, optional, tag = "4")]
        pub locality: Option<Locality>,
    }

    /// `envoy.config.core.v3.Locality`: `zone` is field 2 (the front's zone
    /// decides the priorities of its assignments).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Locality {
        #[prost(string, tag = "2")]
        pub zone: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    fn decode(names: &mut Names, request: &DiscoveryRequest) -> EdsRequest {
        names.next(&request.encode_to_vec()).unwrap()
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

    /// The names are compared as fields wherever they stand in the message
    /// (protobuf does not fix the order of fields), and a broken message is
    /// an error, not a panic.
    #[test]
    fn names_between_other_fields_and_broken_messages() {
        let mut names = Names::default();
        decode(&mut names, &request(&["default/web", "default/api"], ""));
        // Same names, one of them after the nonce.
        let mut raw = Vec::new();
        prost::encoding::string::encode(3, &"default/web".to_string(), &mut raw);
        prost::encoding::string::encode(5, &"7".to_string(), &mut raw);
        prost::encoding::string::encode(3, &"default/api".to_string(), &mut raw);
        let r = names.next(&raw).unwrap();
        assert!(r.same_names);
        assert_eq!(r.request.response_nonce, "7");
        // A name cut short.
        let full = request(&["default/web"], "").encode_to_vec();
        assert!(names.next(&full[..full.len() - 3]).is_err());
        assert!(
            names.next(&[0x1a, 0x80]).is_err(),
            "a length that never ends"
        );
    }

    /// A request with more names than `eds.max_resource_names` is refused
    /// before its names are decoded; one at the limit is read.
    #[test]
    fn too_many_names_are_refused() {
        let mut names = Names { last: None, max: 3 };
        let at_limit = decode(&mut names, &request(&["a/1", "a/2", "a/3"], ""));
        assert_eq!(at_limit.request.resource_names.len(), 3);
        let over = request(&["a/1", "a/2", "a/3", "a/4"], "");
        match names.next(&over.encode_to_vec()) {
            Err(NamesError::TooMany(4)) => {}
            other => panic!("{other:?}"),
        }
        let status = super::super::server::too_many_names_status(4, 3);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("eds.max_resource_names (3)"));
    }

    /// A name that is not UTF-8 is refused, as the generated server would.
    #[test]
    fn a_name_that_is_not_utf8_is_refused() {
        let mut raw = Vec::new();
        prost::encoding::bytes::encode(3, &vec![0xff_u8, 0xfe], &mut raw);
        let e = Names::default().next(&raw).unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
    }
}
