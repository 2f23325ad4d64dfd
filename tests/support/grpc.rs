//! A hand-driven HDS client for protocol tests: it sends exactly the messages
//! a test asks for, including ones a real Envoy never sends. Blocking API over
//! a small tokio runtime, every wait bounded by a deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Node};
use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
use envoy_types::pb::envoy::service::health::v3::health_discovery_service_client::HealthDiscoveryServiceClient;
use envoy_types::pb::envoy::service::health::v3::{
    ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, HealthCheckRequest,
    HealthCheckRequestOrEndpointHealthResponse, HealthCheckSpecifier, LocalityEndpointsHealth,
};
use hdsd::specifier::endpoint;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

pub type Message = HealthCheckRequestOrEndpointHealthResponse;

/// How long connecting and opening a stream may take.
const CONNECT: Duration = Duration::from_secs(10);

/// A gRPC connection to hdsd's HDS listener.
pub struct GrpcClient {
    rt: Arc<Runtime>,
    client: HealthDiscoveryServiceClient<Channel>,
}

impl GrpcClient {
    pub fn connect(addr: SocketAddr) -> GrpcClient {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let client = rt
            .block_on(async {
                tokio::time::timeout(
                    CONNECT,
                    HealthDiscoveryServiceClient::connect(format!("http://{addr}")),
                )
                .await
            })
            .expect("connecting to hdsd timed out")
            .expect("connect to hdsd");
        GrpcClient {
            rt: Arc::new(rt),
            client,
        }
    }

    /// Opens a StreamHealthCheck stream; nothing is sent yet.
    pub fn open(&self) -> HdsStream {
        self.open_with_token(None)
    }

    /// Opens a StreamHealthCheck stream carrying `token` as `authorization`
    /// metadata (as Envoy's bootstrap sends it); nothing is sent yet.
    pub fn open_with_token(&self, token: Option<&str>) -> HdsStream {
        self.try_open_with_token(token)
            .expect("open StreamHealthCheck")
    }

    /// As [`GrpcClient::open_with_token`], or the status that refused the stream.
    pub fn try_open_with_token(&self, token: Option<&str>) -> Result<HdsStream, Status> {
        let (tx, rx) = mpsc::channel::<Message>(16);
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII token"),
            );
        }
        let inbound = self
            .rt
            .block_on(async {
                tokio::time::timeout(CONNECT, client.stream_health_check(request)).await
            })
            .expect("opening the stream timed out")?
            .into_inner();
        Ok(HdsStream {
            rt: self.rt.clone(),
            tx: Some(tx),
            inbound: Some(inbound),
        })
    }

    /// Opens a stream and sends a HealthCheckRequest for `node_id`.
    pub fn open_as(&self, node_id: &str) -> HdsStream {
        let mut s = self.open();
        s.send(hc_request(Some(node_id)));
        s
    }

    /// FetchHealthCheck with `message`.
    pub fn fetch(&self, message: Message) -> Result<HealthCheckSpecifier, Status> {
        self.fetch_with_token(message, None)
    }

    /// FetchHealthCheck with `message`, carrying `token` as `authorization`.
    pub fn fetch_with_token(
        &self,
        message: Message,
        token: Option<&str>,
    ) -> Result<HealthCheckSpecifier, Status> {
        let mut client = self.client.clone();
        let mut message = tonic::Request::new(message);
        if let Some(token) = token {
            message.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII token"),
            );
        }
        self.rt
            .block_on(async {
                tokio::time::timeout(CONNECT, client.fetch_health_check(message)).await
            })
            .expect("FetchHealthCheck timed out")
            .map(tonic::Response::into_inner)
    }
}

/// What the server did next on a stream.
#[derive(Debug)]
pub enum Next {
    Specifier(HealthCheckSpecifier),
    /// The stream ended with this non-OK status.
    Status(Status),
    /// The stream ended with OK (or was already over).
    Closed,
    /// Nothing within the deadline.
    Timeout,
}

/// One StreamHealthCheck stream, driven by hand.
pub struct HdsStream {
    rt: Arc<Runtime>,
    tx: Option<mpsc::Sender<Message>>,
    inbound: Option<Streaming<HealthCheckSpecifier>>,
}

impl HdsStream {
    /// Queues a message; false if the request side is already gone.
    pub fn try_send(&mut self, message: Message) -> bool {
        let Some(tx) = &self.tx else { return false };
        self.rt
            .block_on(async { tokio::time::timeout(CONNECT, tx.send(message)).await })
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    pub fn send(&mut self, message: Message) {
        assert!(
            self.try_send(message),
            "the stream's request side is closed"
        );
    }

    /// The next specifier or end of the stream, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Next {
        let Some(inbound) = self.inbound.as_mut() else {
            return Next::Closed;
        };
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, inbound.message()).await });
        match got {
            Err(_) => Next::Timeout,
            Ok(Ok(Some(spec))) => Next::Specifier(spec),
            Ok(Ok(None)) => Next::Closed,
            Ok(Err(status)) => Next::Status(status),
        }
    }

    /// The next message, which must be a specifier.
    pub fn expect_specifier(&mut self, timeout: Duration) -> HealthCheckSpecifier {
        match self.next(timeout) {
            Next::Specifier(s) => s,
            other => panic!("expected a specifier within {timeout:?}, got {other:?}"),
        }
    }

    /// The end of the stream, which must be a non-OK status with `code`.
    pub fn expect_status(&mut self, code: Code, timeout: Duration) -> Status {
        match self.next(timeout) {
            Next::Status(s) if s.code() == code => s,
            other => panic!("expected status {code:?} within {timeout:?}, got {other:?}"),
        }
    }

    /// Asserts that the server sends nothing (and does not end the stream) for `quiet`.
    pub fn expect_nothing(&mut self, quiet: Duration) {
        match self.next(quiet) {
            Next::Timeout => {}
            other => panic!("expected nothing for {quiet:?}, got {other:?}"),
        }
    }

    /// Ends the request side (a clean half-close), keeping the response side open.
    pub fn half_close(&mut self) {
        self.tx = None;
    }
}

impl Drop for HdsStream {
    fn drop(&mut self) {
        // Drop the streaming body inside the runtime: it may cancel the HTTP/2 stream.
        let _guard = self.rt.enter();
        self.tx = None;
        self.inbound = None;
    }
}

/// A HealthCheckRequest; `None` leaves out the node entirely.
pub fn hc_request(node_id: Option<&str>) -> Message {
    Message {
        request_type: Some(RequestType::HealthCheckRequest(HealthCheckRequest {
            node: node_id.map(|id| Node {
                id: id.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })),
    }
}

/// A report in Envoy's current shape: (cluster name, endpoint port on
/// 127.0.0.1, status), one cluster entry each.
pub fn report(entries: &[(&str, u16, HealthStatus)]) -> Message {
    report_message(health_response(entries))
}

/// The `EndpointHealthResponse` inside [`report`].
pub fn health_response(entries: &[(&str, u16, HealthStatus)]) -> EndpointHealthResponse {
    EndpointHealthResponse {
        cluster_endpoints_health: entries
            .iter()
            .map(|&(cluster, port, status)| ClusterEndpointsHealth {
                cluster_name: cluster.to_string(),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![endpoint_health(port, status)],
                }],
            })
            .collect(),
        ..Default::default()
    }
}

/// A report in the deprecated flat shape only: (endpoint port on 127.0.0.1, status).
pub fn flat_report(entries: &[(u16, HealthStatus)]) -> Message {
    #[allow(deprecated)]
    report_message(EndpointHealthResponse {
        endpoints_health: entries
            .iter()
            .map(|&(port, status)| endpoint_health(port, status))
            .collect(),
        cluster_endpoints_health: Vec::new(),
    })
}

pub fn report_message(report: EndpointHealthResponse) -> Message {
    Message {
        request_type: Some(RequestType::EndpointHealthResponse(report)),
    }
}

pub fn endpoint_health(port: u16, status: HealthStatus) -> EndpointHealth {
    EndpointHealth {
        endpoint: Some(endpoint(SocketAddr::from(([127, 0, 0, 1], port)))),
        health_status: status as i32,
        health_metadata: None,
    }
}

/// The cluster name hdsd gives the probe of 127.0.0.1:`port`.
pub fn probe_cluster(port: u16) -> String {
    format!("probe_127.0.0.1:{port}")
}

/// The cluster names of a specifier, in order.
pub fn cluster_names(spec: &HealthCheckSpecifier) -> Vec<String> {
    spec.cluster_health_checks
        .iter()
        .map(|c| c.cluster_name.clone())
        .collect()
}
