//! Consumers of hdsd's readiness during a run, timed against the flips the
//! simulated Envoys report:
//!
//! - watchers: gRPC `hdsd.v1.ReadinessService/Watch` clients on the API
//!   listener; a flip is seen when a CHANGED event for its dataplane carries
//!   the dataplane-level `ready` the flip made;
//! - EDS subscribers: `StreamEndpoints` clients on the HDS listener subscribed
//!   to every service of the generated dataplanes, ACKing each response as
//!   Envoy does; a flip is seen when a push shows the flipped endpoint
//!   (the dataplane's address, inbound 0's port) with the new health status.
//!
//! Each consumer uses its own connection and records, per flip, the time
//! from the simulated Envoy handing the report to its stream until the event
//! or push arrived: one sample per flip per consumer.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
use hdsd::consumers::pb::readiness_service_client::ReadinessServiceClient;
use hdsd::consumers::pb::watch_event::Type as EventType;
use hdsd::consumers::pb::WatchRequest;
use prost::Message as _;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::gen::{Manifest, INBOUND_PORT_BASE};
use crate::stats::summary;

/// The type of every EDS resource.
pub const CLA_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// A flip a simulated Envoy reported: its first endpoint's new status.
#[derive(Debug, Clone, Copy)]
pub struct Flip {
    /// Increases with every recorded flip (over all dataplanes).
    pub seq: u64,
    /// The first endpoint is healthy now (so is the dataplane, the others being healthy).
    pub ready: bool,
    /// When the report was handed to the stream.
    pub sent: Instant,
}

/// The latest flip of each dataplane, while recording.
#[derive(Debug, Default)]
pub struct Flips {
    recording: AtomicBool,
    next: AtomicU64,
    recorded: AtomicU64,
    latest: Mutex<HashMap<usize, Flip>>,
}

impl Flips {
    pub fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::Release);
    }

    /// Called before the report leaves, so a consumer never sees the event first.
    pub fn record(&self, index: usize, ready: bool, sent: Instant) {
        if !self.recording.load(Ordering::Acquire) {
            return;
        }
        let seq = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.recorded.fetch_add(1, Ordering::Relaxed);
        self.latest
            .lock()
            .unwrap()
            .insert(index, Flip { seq, ready, sent });
    }

    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    pub fn latest(&self, index: usize) -> Option<Flip> {
        self.latest.lock().unwrap().get(&index).copied()
    }

    /// Flips newer than what `seen` (one entry per dataplane) holds.
    fn unseen(&self, seen: &[u64]) -> Vec<(usize, Flip)> {
        self.latest
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, f)| seen.get(**i).is_some_and(|s| f.seq > *s))
            .map(|(i, f)| (*i, *f))
            .collect()
    }
}

/// What the consumers of one kind saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Consumers that got their first full state (SYNCED; a first EDS response).
    pub synced: AtomicUsize,
    /// Watch events, or EDS responses.
    pub messages: AtomicU64,
    /// CHANGED events (watchers).
    pub changed: AtomicU64,
    /// RESYNC events (watchers).
    pub resyncs: AtomicU64,
    /// Resources in EDS responses.
    pub resources: AtomicU64,
    /// Consumers whose stream ended or failed.
    failures: Mutex<BTreeMap<String, u64>>,
    latencies: Mutex<Vec<f64>>,
    measuring: AtomicBool,
}

impl Tally {
    pub fn set_measuring(&self, on: bool) {
        self.measuring.store(on, Ordering::Release);
    }

    pub fn failure(&self, reason: String) {
        *self.failures.lock().unwrap().entry(reason).or_default() += 1;
    }

    pub fn seen(&self, flip: &Flip, at: Instant) {
        if self.measuring.load(Ordering::Acquire) {
            self.latencies
                .lock()
                .unwrap()
                .push(at.duration_since(flip.sent).as_secs_f64());
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "synced": self.synced.load(Ordering::Relaxed),
            "messages_received": self.messages.load(Ordering::Relaxed),
            "changed_events": self.changed.load(Ordering::Relaxed),
            "resyncs": self.resyncs.load(Ordering::Relaxed),
            "resources_received": self.resources.load(Ordering::Relaxed),
            "failures": self.failures.lock().unwrap().clone(),
            "latency": summary(&self.latencies.lock().unwrap()),
        })
    }
}

/// One `Watch` client on its own connection to `api` (http://host:port),
/// until `stop`.
pub async fn watcher(
    api: String,
    manifest: Arc<Manifest>,
    flips: Arc<Flips>,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let channel = match tonic::transport::Endpoint::from_shared(api) {
        Ok(e) => match e.tcp_nodelay(true).connect().await {
            Ok(c) => c,
            Err(e) => return tally.failure(format!("connect: {e}")),
        },
        Err(e) => return tally.failure(format!("api address: {e}")),
    };
    let mut client = ReadinessServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let request = WatchRequest {
        mesh: manifest.mesh.clone(),
        ..Default::default()
    };
    follow(
        &mut client,
        request,
        manifest.count,
        |d| manifest.index_of_name(&d.name),
        &flips,
        &tally,
        &mut stop,
    )
    .await
}

/// Follows one `Watch` until `stop`: counts its events and times each flip
/// (`index` says which of the `count` flipping dataplanes an event names)
/// when a CHANGED event carries the readiness the flip made.
pub async fn follow(
    client: &mut ReadinessServiceClient<tonic::transport::Channel>,
    request: WatchRequest,
    count: usize,
    index: impl Fn(&hdsd::pb::DataplaneRevision) -> Option<usize>,
    flips: &Flips,
    tally: &Tally,
    stop: &mut watch::Receiver<bool>,
) {
    let mut stream = match client.watch(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return tally.failure(format!("watch: {:?}", s.code())),
    };
    let mut seen = vec![0u64; count];
    let mut synced = false;
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            m = stream.message() => m,
        };
        let event = match msg {
            Ok(Some(e)) => e,
            Ok(None) => return tally.failure("watch ended by the server".into()),
            Err(s) => return tally.failure(format!("watch: {:?}", s.code())),
        };
        let at = Instant::now();
        tally.messages.fetch_add(1, Ordering::Relaxed);
        match event.r#type() {
            EventType::Synced if !synced => {
                synced = true;
                tally.synced.fetch_add(1, Ordering::AcqRel);
            }
            EventType::Changed => {
                tally.changed.fetch_add(1, Ordering::Relaxed);
                let Some(d) = event.dataplane else { continue };
                let Some(i) = index(&d) else {
                    continue;
                };
                if let Some(f) = flips.latest(i) {
                    if f.ready == d.ready && f.seq > seen[i] {
                        seen[i] = f.seq;
                        tally.seen(&f, at);
                    }
                }
            }
            EventType::Resync => {
                tally.resyncs.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// Only the name of a `ClusterLoadAssignment`: decoding skips the endpoints.
#[derive(Clone, PartialEq, prost::Message)]
struct ClaName {
    #[prost(string, tag = "1")]
    cluster_name: String,
}

/// The health status of the endpoint at `address` in `cla`.
fn endpoint_health(cla: &ClusterLoadAssignment, address: SocketAddr) -> Option<i32> {
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .find_map(|lb| {
            let Some(HostIdentifier::Endpoint(ep)) = &lb.host_identifier else {
                return None;
            };
            let Some(AddressKind::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                return None;
            };
            let ip: IpAddr = sa.address.parse().ok()?;
            let port = match sa.port_specifier {
                Some(PortSpecifier::PortValue(p)) => p,
                _ => return None,
            };
            (ip == address.ip() && port == u32::from(address.port())).then_some(lb.health_status)
        })
}

/// One EDS subscriber (a front Envoy) on its own connection to the HDS
/// listener, subscribed to every service of `manifest`, until `stop`.
pub async fn eds_subscriber(
    channel: tonic::transport::Channel,
    node_id: String,
    manifest: Arc<Manifest>,
    flips: Arc<Flips>,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let names = manifest.eds_resource_names();
    let request = |version_info: String, response_nonce: String, first: bool| DiscoveryRequest {
        node: first.then(|| crate::envoy::node(&node_id, &manifest.mesh)),
        version_info,
        response_nonce,
        resource_names: names.clone(),
        type_url: CLA_TYPE_URL.to_string(),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let _ = tx.try_send(request(String::new(), String::new(), true));
    let mut client =
        EndpointDiscoveryServiceClient::new(channel).max_decoding_message_size(1 << 30);
    let mut inbound = match client.stream_endpoints(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return tally.failure(format!("stream_endpoints: {:?}", s.code())),
    };
    let mut seen = vec![0u64; manifest.count];
    let mut synced = false;
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            m = inbound.message() => m,
        };
        let response = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return tally.failure("EDS stream ended by the server".into()),
            Err(s) => return tally.failure(format!("EDS: {:?}: {}", s.code(), s.message())),
        };
        let at = Instant::now();
        tally.messages.fetch_add(1, Ordering::Relaxed);
        tally
            .resources
            .fetch_add(response.resources.len() as u64, Ordering::Relaxed);
        if !synced {
            synced = true;
            tally.synced.fetch_add(1, Ordering::AcqRel);
        }
        let unseen = flips.unseen(&seen);
        if !unseen.is_empty() {
            let by_name: HashMap<String, &[u8]> = response
                .resources
                .iter()
                .filter_map(|any| {
                    let name = ClaName::decode(any.value.as_slice()).ok()?.cluster_name;
                    Some((name, any.value.as_slice()))
                })
                .collect();
            let mut decoded: HashMap<String, Option<ClusterLoadAssignment>> = HashMap::new();
            for (i, f) in unseen {
                let name = format!("{}/{}", manifest.mesh, manifest.service(i, 0));
                let cla = decoded.entry(name).or_insert_with_key(|name| {
                    by_name
                        .get(name)
                        .and_then(|bytes| ClusterLoadAssignment::decode(*bytes).ok())
                });
                let Some(cla) = cla else { continue };
                let address = SocketAddr::new(manifest.address(i).into(), INBOUND_PORT_BASE);
                let want = if f.ready {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32;
                if endpoint_health(cla, address) == Some(want) {
                    seen[i] = f.seq;
                    tally.seen(&f, at);
                }
            }
        }
        // ACK, as Envoy does once it applied the response.
        if tx
            .send(request(response.version_info, response.nonce, false))
            .await
            .is_err()
        {
            return tally.failure("EDS request stream closed".into());
        }
    }
}

/// Waits until `n` consumers synced, at most `timeout`; returns the time taken.
pub async fn wait_synced(tally: &Tally, n: usize, timeout: Duration) -> Option<f64> {
    let start = Instant::now();
    loop {
        if tally.synced.load(Ordering::Acquire) >= n {
            return Some(start.elapsed().as_secs_f64());
        }
        if start.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress};
    use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, LocalityLbEndpoints};

    #[test]
    fn flips_are_unseen_until_a_consumer_saw_them() {
        let flips = Flips::default();
        flips.record(1, false, Instant::now());
        assert!(
            flips.latest(1).is_none(),
            "nothing is recorded before recording starts"
        );
        flips.set_recording(true);
        flips.record(1, false, Instant::now());
        flips.record(2, true, Instant::now());
        let mut seen = vec![0u64; 3];
        assert_eq!(flips.unseen(&seen).len(), 2);
        seen[1] = flips.latest(1).unwrap().seq;
        let unseen = flips.unseen(&seen);
        assert_eq!(unseen.len(), 1);
        assert_eq!(unseen[0].0, 2);
        assert!(unseen[0].1.ready);
        assert_eq!(flips.recorded(), 2);
    }

    #[test]
    fn name_only_decoding_and_endpoint_lookup() {
        let ep = |ip: &str, port: u32, health: HealthStatus| LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(AddressKind::SocketAddress(SocketAddress {
                        address: ip.into(),
                        port_specifier: Some(PortSpecifier::PortValue(port)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            health_status: health as i32,
            ..Default::default()
        };
        let cla = ClusterLoadAssignment {
            cluster_name: "default/svc-0001".into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![
                    ep("10.0.0.1", 10001, HealthStatus::Healthy),
                    ep("10.0.0.2", 10001, HealthStatus::Unhealthy),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let bytes = cla.encode_to_vec();
        assert_eq!(
            ClaName::decode(bytes.as_slice()).unwrap().cluster_name,
            "default/svc-0001"
        );
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            endpoint_health(&cla, at("10.0.0.2:10001")),
            Some(HealthStatus::Unhealthy as i32)
        );
        assert_eq!(endpoint_health(&cla, at("10.0.0.2:10002")), None);
    }
}
