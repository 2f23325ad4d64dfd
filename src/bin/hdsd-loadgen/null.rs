//! `null-server`: an HDS server that decodes every message, answers each
//! `HealthCheckRequest` with one fixed valid specifier and does nothing
//! else. Same tonic transport settings as hdsd: the ceiling of the transport
//! on this machine.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
use envoy_types::pb::envoy::service::health::v3::health_discovery_service_server::{
    HealthDiscoveryService, HealthDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::health::v3::{
    HealthCheckRequestOrEndpointHealthResponse, HealthCheckSpecifier,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Where to listen (loopback).
    #[arg(long, default_value = "127.0.0.1:5679")]
    pub listen: SocketAddr,
    /// The specifier's report interval.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub report_interval: Duration,
    /// Clusters (probed endpoints) in the specifier.
    #[arg(long, default_value_t = 2)]
    pub clusters: u16,
    /// Print the counters to stderr this often (0s: never).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub stats_every: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    streams: AtomicU64,
    requests: AtomicU64,
    reports: AtomicU64,
}

struct NullService {
    specifier: Arc<HealthCheckSpecifier>,
    counters: Arc<Counters>,
}

type SpecifierStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<HealthCheckSpecifier, Status>> + Send>>;

#[tonic::async_trait]
impl HealthDiscoveryService for NullService {
    type StreamHealthCheckStream = SpecifierStream;

    async fn stream_health_check(
        &self,
        request: Request<Streaming<HealthCheckRequestOrEndpointHealthResponse>>,
    ) -> Result<Response<Self::StreamHealthCheckStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let spec = self.specifier.clone();
        let counters = self.counters.clone();
        counters.streams.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                match msg.request_type {
                    Some(RequestType::HealthCheckRequest(_)) => {
                        counters.requests.fetch_add(1, Ordering::Relaxed);
                        if tx.send(Ok((*spec).clone())).await.is_err() {
                            break;
                        }
                    }
                    Some(RequestType::EndpointHealthResponse(_)) => {
                        counters.reports.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_health_check(
        &self,
        _request: Request<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Result<Response<HealthCheckSpecifier>, Status> {
        Ok(Response::new((*self.specifier).clone()))
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.listen.ip().is_loopback(),
        "the null server listens on loopback only"
    );
    let limit = crate::sys::raise_nofile();
    let counters = Arc::new(Counters::default());
    let service = NullService {
        specifier: Arc::new(crate::envoy::fixed_specifier(
            args.clusters,
            args.report_interval,
        )),
        counters: counters.clone(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    // The same server settings as hdsd's HDS listener.
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(HealthDiscoveryServiceServer::new(service))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)));
    println!("null-server listening on {addr} (RLIMIT_NOFILE {limit})");
    if !args.stats_every.is_zero() {
        let every = args.stats_every;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "null-server: streams {} requests {} reports {}",
                    counters.streams.load(Ordering::Relaxed),
                    counters.requests.load(Ordering::Relaxed),
                    counters.reports.load(Ordering::Relaxed)
                );
            }
        });
    }
    tokio::select! {
        r = server => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
