//! The gRPC `HealthDiscoveryService`: a thin pump between an Envoy's stream
//! and its dataplane's task. It checks the protocol, resolves the node id,
//! sends specifiers when they change, and forwards reports.

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
    HealthCheckRequest, HealthCheckRequestOrEndpointHealthResponse, HealthCheckSpecifier,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::{authorize, check_identity, Claims, Gate, Rejection};
use crate::clock::Clock;
use crate::dataplane::DataplaneId;
use crate::grpc_auth;
use crate::metrics::{self as m, ActiveStream, CloseReason};
use crate::registry::{Command, DataplaneHandle, DataplaneState, Registry, StreamId};
use crate::specifier::Specifier;

/// What the service needs to know besides the registry.
#[derive(Debug, Clone)]
pub struct HdsSettings {
    pub unknown_dataplane_grace: Duration,
    pub report_interval: Duration,
    /// A stream with no report for this long is ended (`hds.stale_after`).
    pub stale_after: Duration,
    /// Shown in NOT_FOUND messages: where dataplane files go.
    pub dataplanes_dir: String,
}

#[derive(Debug)]
pub struct HdsService {
    registry: Registry,
    settings: Arc<HdsSettings>,
    gate: Arc<Gate>,
    clock: Arc<dyn Clock>,
    next_stream: AtomicU64,
    /// Becomes true when hdsd shuts down: every stream ends.
    drain: watch::Receiver<bool>,
}

impl HdsService {
    pub fn new(
        registry: Registry,
        settings: HdsSettings,
        gate: Arc<Gate>,
        clock: Arc<dyn Clock>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        HdsService {
            registry,
            settings: Arc::new(settings),
            gate,
            clock,
            next_stream: AtomicU64::new(1),
            drain,
        }
    }

    /// Checks the token a request carries, before any message is trusted.
    fn admit<T>(&self, request: &Request<T>) -> Result<Option<Claims>, Status> {
        grpc_auth::authenticate(&self.gate, request.metadata(), self.clock.now())
            .map_err(|r| refuse(&r, request.remote_addr(), None))
    }

    pub fn into_server(self) -> HealthDiscoveryServiceServer<Self> {
        HealthDiscoveryServiceServer::new(self)
    }
}

type SpecifierStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<HealthCheckSpecifier, Status>> + Send>>;

#[tonic::async_trait]
impl HealthDiscoveryService for HdsService {
    type StreamHealthCheckStream = SpecifierStream;

    async fn stream_health_check(
        &self,
        request: Request<Streaming<HealthCheckRequestOrEndpointHealthResponse>>,
    ) -> Result<Response<Self::StreamHealthCheckStream>, Status> {
        let claims = match self.admit(&request) {
            Ok(claims) => claims,
            Err(status) => {
                m::stream_closed(CloseReason::Unauthenticated);
                return Err(status);
            }
        };
        let peer = request.remote_addr();
        let stream_id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(4);
        let session = Session {
            id: stream_id,
            peer,
            registry: self.registry.clone(),
            settings: self.settings.clone(),
            gate: self.gate.clone(),
            clock: self.clock.clone(),
            claims,
            out: tx,
        };
        let mut drain = self.drain.clone();
        let out = session.out.clone();
        let inbound = request.into_inner();
        tokio::spawn(async move {
            let _active = ActiveStream::new();
            tokio::select! {
                () = session.run(inbound) => {}
                () = drained(&mut drain) => {
                    m::stream_closed(CloseReason::Shutdown);
                    let _ = out.send(Err(Status::unavailable("hdsd is shutting down; reconnect"))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_health_check(
        &self,
        request: Request<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Result<Response<HealthCheckSpecifier>, Status> {
        let claims = self.admit(&request)?;
        let peer = request.remote_addr();
        let id = match request.into_inner().request_type {
            Some(RequestType::HealthCheckRequest(r)) => node_id(&r)?,
            _ => {
                return Err(Status::invalid_argument(
                    "FetchHealthCheck needs a HealthCheckRequest with node.id set",
                ))
            }
        };
        let handle = self
            .registry
            .get_defined(&id)
            .ok_or_else(|| not_found(&id, &self.settings))?;
        if let Some(claims) = &claims {
            authorize_for(claims, &id, &handle.state()).map_err(|r| refuse(&r, peer, Some(&id)))?;
        }
        Ok(Response::new(
            current_specifier(&handle.state(), &self.settings).message,
        ))
    }
}

/// Logs and counts an authentication or authorization failure; the status
/// carries the short message only, the detail goes to the log.
fn refuse(r: &Rejection, peer: Option<SocketAddr>, node: Option<&DataplaneId>) -> Status {
    metrics::counter!(m::AUTH_FAILURES, "reason" => r.reason()).increment(1);
    tracing::warn!(
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        node = %node.map(|n| n.to_string()).unwrap_or_default(),
        reason = r.reason(),
        "stream refused: {}",
        r.detail()
    );
    grpc_auth::status(r)
}

/// The token must name this dataplane, and its tags must be on its inbounds.
fn authorize_for(
    claims: &Claims,
    id: &DataplaneId,
    state: &DataplaneState,
) -> Result<(), Rejection> {
    let tags: Vec<_> = state
        .defined
        .iter()
        .flat_map(|d| d.dataplane.inbounds.iter().map(|i| &i.tags))
        .collect();
    authorize(claims, &id.mesh, &id.name, &tags)
}

/// The dataplane id in a `HealthCheckRequest`, or INVALID_ARGUMENT saying what is missing.
pub fn node_id(request: &HealthCheckRequest) -> Result<DataplaneId, Status> {
    let id = request.node.as_ref().map(|n| n.id.as_str()).unwrap_or("");
    if id.is_empty() {
        return Err(Status::invalid_argument(
            "HealthCheckRequest has no node.id; set node.id to <mesh>.<name> (e.g. default.web-01) in the Envoy bootstrap",
        ));
    }
    id.parse()
        .map_err(|e: crate::dataplane::BadNodeId| Status::invalid_argument(e.to_string()))
}

fn not_found(id: &DataplaneId, settings: &HdsSettings) -> Status {
    Status::not_found(format!(
        "dataplane {id} is not registered; create {dir}/{name}.yaml containing\n\
         type: Dataplane\nmesh: {mesh}\nname: {name}\nnetworking:\n  address: <this machine's IP>\n  inbound:\n  - port: <Envoy's port for the app>\n    servicePort: <the app's port>\n    serviceAddress: 127.0.0.1\n\
         (hdsd picks it up without a restart)",
        dir = settings.dataplanes_dir,
        mesh = id.mesh,
        name = id.name,
    ))
}

fn current_specifier(state: &DataplaneState, settings: &HdsSettings) -> Specifier {
    match &state.defined {
        Some(d) => (*d.specifier).clone(),
        None => Specifier::empty(settings.report_interval),
    }
}

/// Why a stream ended.
#[derive(Debug)]
enum End {
    /// The client closed its side (or went away).
    Closed,
    /// End the stream with this status.
    Status(Status),
    /// End a stream that stopped reporting (counted as `stale`).
    Stale(Status),
}

impl From<Status> for End {
    fn from(s: Status) -> Self {
        End::Status(s)
    }
}

/// One HDS stream.
struct Session {
    id: StreamId,
    peer: Option<SocketAddr>,
    registry: Registry,
    settings: Arc<HdsSettings>,
    gate: Arc<Gate>,
    clock: Arc<dyn Clock>,
    /// The verified token, when auth is on.
    claims: Option<Claims>,
    out: mpsc::Sender<Result<HealthCheckSpecifier, Status>>,
}

impl Session {
    async fn run(self, mut inbound: Streaming<HealthCheckRequestOrEndpointHealthResponse>) {
        let peer = self.peer.map(|p| p.to_string()).unwrap_or_default();
        let id = match self.first_request(&mut inbound).await {
            Ok(id) => id,
            Err(end) => return self.finish(end, &peer).await,
        };
        let span = tracing::info_span!("stream", mesh = %id.mesh, name = %id.name, peer = %peer, stream = self.id);
        async {
            let end = self.serve(&id, &mut inbound).await;
            self.finish(end, &peer).await;
        }
        .instrument(span)
        .await;
    }

    async fn first_request(
        &self,
        inbound: &mut Streaming<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Result<DataplaneId, End> {
        match inbound.message().await {
            Ok(Some(msg)) => match msg.request_type {
                Some(RequestType::HealthCheckRequest(r)) => {
                    m::hot().health_check_requests.increment(1);
                    let id = node_id(&r)?;
                    // Bind the token to the node id before anything else happens.
                    if let Some(c) = &self.claims {
                        check_identity(c, &id.mesh, &id.name)
                            .map_err(|r| refuse(&r, self.peer, Some(&id)))?;
                    }
                    Ok(id)
                }
                Some(RequestType::EndpointHealthResponse(_)) => Err(Status::failed_precondition(
                    "a health report arrived before any HealthCheckRequest; the first message of a stream must be a HealthCheckRequest with node.id",
                )
                .into()),
                None => Err(Status::invalid_argument(
                    "the first message has neither a HealthCheckRequest nor a report; send a HealthCheckRequest with node.id",
                )
                .into()),
            },
            Ok(None) => Err(End::Closed),
            Err(status) => Err(End::Status(status)),
        }
    }

    /// Serves a resolved dataplane until the stream ends.
    async fn serve(
        &self,
        id: &DataplaneId,
        inbound: &mut Streaming<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> End {
        let grace = self.settings.unknown_dataplane_grace;
        let mut handle = match self.resolve(id, grace, inbound).await {
            Ok(h) => h,
            Err(end) => return end,
        };
        loop {
            if let Some(c) = &self.claims {
                if let Err(r) = authorize_for(c, id, &handle.state()) {
                    return refuse(&r, self.peer, Some(id)).into();
                }
            }
            match self.pump(id, &handle, inbound).await {
                Pump::End(end) => return end,
                Pump::Removed => {
                    tracing::info!("dataplane deleted; sent an empty specifier, waiting {} for it to come back", humantime::format_duration(grace));
                    handle = match self.resolve(id, grace, inbound).await {
                        Ok(h) => h,
                        Err(end) => return end,
                    };
                }
            }
        }
    }

    /// Waits (at most `grace`) for the dataplane to be defined.
    async fn resolve(
        &self,
        id: &DataplaneId,
        grace: Duration,
        inbound: &mut Streaming<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Result<DataplaneHandle, End> {
        if let Some(h) = self.registry.get_defined(id) {
            return Ok(h);
        }
        tracing::warn!(
            "unknown dataplane; waiting up to {} for {}/{}.yaml",
            humantime::format_duration(grace),
            self.settings.dataplanes_dir,
            id.name
        );
        let deadline = Instant::now() + grace;
        let found = self.registry.wait_for(id, deadline);
        tokio::pin!(found);
        loop {
            tokio::select! {
                found = &mut found => {
                    return found.ok_or_else(|| not_found(id, &self.settings).into());
                }
                end = self.token_invalidated() => return Err(end),
                msg = inbound.message() => match msg {
                    Ok(Some(msg)) => {
                        if let Some(RequestType::HealthCheckRequest(r)) = &msg.request_type {
                            m::hot().health_check_requests.increment(1);
                            check_same_node(id, r)?;
                        }
                        // Reports without a specifier have nothing to match; drop them.
                    }
                    Ok(None) => return Err(End::Closed),
                    Err(status) => return Err(End::Status(status)),
                }
            }
        }
    }

    /// Pumps messages for one incarnation of the dataplane, then detaches.
    async fn pump(
        &self,
        id: &DataplaneId,
        handle: &DataplaneHandle,
        inbound: &mut Streaming<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Pump {
        let result = self.pump_attached(id, handle, inbound).await;
        handle.send(Command::Detach { stream: self.id }).await;
        result
    }

    async fn pump_attached(
        &self,
        id: &DataplaneId,
        handle: &DataplaneHandle,
        inbound: &mut Streaming<HealthCheckRequestOrEndpointHealthResponse>,
    ) -> Pump {
        let mut state = handle.subscribe();
        if !handle
            .send(Command::Attach {
                stream: self.id,
                peer: self.peer,
            })
            .await
        {
            return Pump::Removed;
        }
        tracing::debug!("stream attached");
        let mut sent_version = 0;
        let stale_after = self.settings.stale_after;
        // One timer for the whole stream, re-armed lazily: a report only
        // records its time, the timer moves when it fires early.
        let mut last_report = Instant::now();
        let silence = tokio::time::sleep_until(last_report + stale_after);
        tokio::pin!(silence);
        // The first request was already read: answer it.
        let snapshot = state.borrow_and_update().clone();
        if let Err(pump) = self.react(id, &snapshot, &mut sent_version, true).await {
            return pump;
        }
        loop {
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        return Pump::Removed;
                    }
                    let snapshot = state.borrow_and_update().clone();
                    if let Err(pump) = self.react(id, &snapshot, &mut sent_version, false).await {
                        return pump;
                    }
                }
                end = self.token_invalidated() => return Pump::End(end),
                () = &mut silence => {
                    let due = last_report + stale_after;
                    if due > Instant::now() {
                        silence.as_mut().reset(due);
                        continue;
                    }
                    return Pump::End(End::Stale(Status::unavailable(format!(
                        "no health report for {}; reconnect and send a HealthCheckRequest",
                        humantime::format_duration(stale_after)
                    ))));
                }
                msg = inbound.message() => match msg {
                    Ok(Some(msg)) => match msg.request_type {
                        Some(RequestType::HealthCheckRequest(r)) => {
                            m::hot().health_check_requests.increment(1);
                            if let Err(s) = check_same_node(id, &r) {
                                return Pump::End(s.into());
                            }
                            // Envoy forgets its specifier on reconnect: always answer.
                            let snapshot = state.borrow_and_update().clone();
                            if let Err(pump) = self.react(id, &snapshot, &mut sent_version, true).await {
                                return pump;
                            }
                        }
                        Some(RequestType::EndpointHealthResponse(report)) => {
                            m::hot().reports.increment(1);
                            last_report = Instant::now();
                            if !handle.send(Command::Report { stream: self.id, report: Box::new(report) }).await {
                                return Pump::Removed;
                            }
                        }
                        None => {
                            return Pump::End(Status::invalid_argument("a message with neither a HealthCheckRequest nor a report").into());
                        }
                    },
                    Ok(None) => return Pump::End(End::Closed),
                    Err(status) => return Pump::End(End::Status(status)),
                }
            }
        }
    }

    /// Acts on a state snapshot: ends a replaced stream, sends the specifier
    /// when it changed (or always, when `answer` a request), and reports a
    /// deleted dataplane once its empty specifier is sent.
    async fn react(
        &self,
        id: &DataplaneId,
        snapshot: &DataplaneState,
        sent_version: &mut u64,
        answer: bool,
    ) -> Result<(), Pump> {
        // Stream ids grow: a larger owner is a newer stream, which wins. A
        // smaller one is an older stream whose Attach ours has not overtaken yet.
        if snapshot
            .connection
            .stream
            .is_some_and(|owner| owner > self.id)
        {
            let by = snapshot
                .connection
                .peer
                .map(|p| format!(" from {p}"))
                .unwrap_or_default();
            return Err(Pump::End(End::Status(Status::new(
                Code::Aborted,
                format!("replaced by a newer stream for dataplane {id}{by}"),
            ))));
        }
        if answer || snapshot.version != *sent_version {
            self.send_specifier(snapshot).await.map_err(Pump::End)?;
            *sent_version = snapshot.version;
        }
        if snapshot.defined.is_none() {
            return Err(Pump::Removed);
        }
        Ok(())
    }

    async fn send_specifier(&self, state: &DataplaneState) -> Result<(), End> {
        let spec = current_specifier(state, &self.settings);
        tracing::debug!(
            clusters = spec.targets.len(),
            version = state.version,
            "sending specifier"
        );
        self.out
            .send(Ok(spec.message))
            .await
            .map_err(|_| End::Closed)?;
        m::hot().specifiers_sent.increment(1);
        Ok(())
    }

    /// Completes when the stream's token expires or is revoked; never when
    /// auth is off.
    async fn token_invalidated(&self) -> End {
        let Some(claims) = &self.claims else {
            return std::future::pending().await;
        };
        let left = (claims.exp - self.clock.now().timestamp()).max(0);
        let expiry = Instant::now() + Duration::from_secs(left.unsigned_abs());
        let mut reloads = self.gate.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(expiry) => {
                    let r = Rejection::Expired { at: claims.expires_at().unwrap_or_default() };
                    return refuse(&r, self.peer, None).into();
                }
                changed = reloads.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                    if self.gate.is_revoked(&claims.jti) {
                        let r = Rejection::Revoked { jti: claims.jti.clone() };
                        return refuse(&r, self.peer, None).into();
                    }
                }
            }
        }
    }

    async fn finish(&self, end: End, peer: &str) {
        let stale = matches!(end, End::Stale(_));
        match end {
            End::Closed => {
                m::stream_closed(CloseReason::Ok);
                tracing::debug!(peer, "stream closed by the client");
            }
            End::Status(status) | End::Stale(status) => {
                m::stream_closed(if stale {
                    CloseReason::Stale
                } else {
                    close_reason(status.code())
                });
                tracing::warn!(peer, code = ?status.code(), "ending stream: {}", status.message());
                let _ = self.out.send(Err(status)).await;
            }
        }
    }
}

enum Pump {
    End(End),
    /// The dataplane was deleted; an empty specifier was sent.
    Removed,
}

fn check_same_node(id: &DataplaneId, request: &HealthCheckRequest) -> Result<(), Status> {
    let other = node_id(request)?;
    if &other != id {
        return Err(Status::invalid_argument(format!(
            "this stream belongs to {id}; a HealthCheckRequest for {other} must use its own stream"
        )));
    }
    Ok(())
}

/// The `reason` label of a stream ended with this gRPC status.
fn close_reason(code: Code) -> CloseReason {
    match code {
        Code::Ok | Code::Cancelled => CloseReason::Ok,
        Code::Unauthenticated => CloseReason::Unauthenticated,
        Code::PermissionDenied => CloseReason::PermissionDenied,
        Code::NotFound => CloseReason::NotFound,
        Code::InvalidArgument | Code::FailedPrecondition => CloseReason::Invalid,
        Code::Aborted => CloseReason::Replaced,
        _ => CloseReason::Error,
    }
}

/// Completes when the drain flag becomes true (or its sender is gone).
async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}
