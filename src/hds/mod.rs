//! The gRPC `HealthDiscoveryService`: a thin pump between an Envoy's stream
//! and its dataplane's task.
//!
//! The protocol lives in [`stream::Stream`], a state machine with no I/O.
//! This module authenticates a stream when it opens, then runs one loop per
//! stream that turns network messages, the dataplane's state changes, the
//! token's validity, timers and shutdown into events for the machine, and
//! carries out its actions (send a specifier, forward a report, attach,
//! detach, end with a status).

pub mod stream;
mod transport;

pub use transport::{DecodeError, FromEnvoy, HdsServer, CODEC_BUFFER};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::{check_identity, Claims, Gate, Rejection};
use crate::capability::EnvoyVersion;
use crate::clock::Clock;
use crate::dataplane::DataplaneId;
use crate::grpc_auth;
use crate::metrics::{self as m, ActiveStream, CloseReason};
use crate::net::{SharedLogLimiter, REFUSAL_LOG};
use crate::registry::{Command, DataplaneHandle, DataplaneState, Registry, StreamId};

pub use stream::{node_id, HdsSettings};
use stream::{not_found, Action, Awaiting, End, Event, Stream};

impl From<&crate::config::Config> for HdsSettings {
    fn from(config: &crate::config::Config) -> Self {
        HdsSettings {
            unknown_dataplane_grace: config.hds.unknown_dataplane_grace,
            report_interval: config.hds.report_interval,
            stale_after: config.hds.stale_after(),
            limits: config.hds.limits.clone(),
            definitions_from_api: config.dataplanes.source == crate::config::DataplanesSource::Api,
        }
    }
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
    /// Streams per node id and streams waiting, against `hds.limits`.
    counts: Arc<StreamCounts>,
    /// Refusals and stream ends logged per peer at a bounded rate.
    log: Arc<SharedLogLimiter>,
}

/// The streams bound to each node id, and the streams waiting for an
/// unknown dataplane. Touched when a stream binds, starts or stops waiting,
/// and ends: never per report.
#[derive(Debug)]
pub struct StreamCounts {
    per_node: Mutex<HashMap<DataplaneId, usize>>,
    waiting: AtomicUsize,
    max_per_node: usize,
    max_waiting: usize,
}

impl StreamCounts {
    pub fn new(max_per_node: usize, max_waiting: usize) -> Arc<StreamCounts> {
        Arc::new(StreamCounts {
            per_node: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            max_per_node,
            max_waiting,
        })
    }

    /// A place for one more stream of `id`, unless `max_per_node` are open.
    pub fn bind(self: &Arc<Self>, id: &DataplaneId) -> Option<NodeSlot> {
        let mut per_node = self.per_node.lock().unwrap_or_else(|e| e.into_inner());
        let n = per_node.entry(id.clone()).or_insert(0);
        if *n >= self.max_per_node {
            return None;
        }
        *n += 1;
        Some(NodeSlot {
            counts: self.clone(),
            id: id.clone(),
        })
    }

    /// A place among the streams waiting for unknown dataplanes.
    pub fn wait(self: &Arc<Self>) -> Option<WaitSlot> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_waiting).then_some(n + 1)
            })
            .ok()?;
        Some(WaitSlot {
            counts: self.clone(),
            _gauge: m::WaitingStream::new(),
        })
    }

    /// Streams bound to `id` now.
    pub fn bound(&self, id: &DataplaneId) -> usize {
        let per_node = self.per_node.lock().unwrap_or_else(|e| e.into_inner());
        per_node.get(id).copied().unwrap_or(0)
    }
}

/// One stream's place among its node id's streams; released on drop.
#[derive(Debug)]
pub struct NodeSlot {
    counts: Arc<StreamCounts>,
    id: DataplaneId,
}

impl Drop for NodeSlot {
    fn drop(&mut self) {
        let mut per_node = self
            .counts
            .per_node
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_node.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                per_node.remove(&self.id);
            }
        }
    }
}

/// One stream's place among the waiting ones; released on drop.
#[derive(Debug)]
pub struct WaitSlot {
    counts: Arc<StreamCounts>,
    _gauge: m::WaitingStream,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.counts.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl HdsService {
    pub fn new(
        registry: Registry,
        settings: HdsSettings,
        gate: Arc<Gate>,
        clock: Arc<dyn Clock>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        let counts = StreamCounts::new(
            settings.limits.max_streams_per_dataplane,
            settings.limits.max_waiting_streams,
        );
        HdsService {
            registry,
            settings: Arc::new(settings),
            gate,
            clock,
            next_stream: AtomicU64::new(1),
            drain,
            counts,
            log: Arc::new(SharedLogLimiter::new(REFUSAL_LOG)),
        }
    }

    /// Checks the token a request carries, before any message is trusted.
    /// The returned watch follows the token's validity from this moment on.
    fn admit<T>(&self, request: &Request<T>) -> Result<Option<Box<TokenWatch>>, Status> {
        if self.gate.mode() == crate::config::AuthMode::None {
            return Ok(None);
        }
        // Subscribe first: a reload that lands after the check is still seen.
        let reloads = self.gate.subscribe();
        let peer = request.remote_addr();
        let token = grpc_auth::token_from_metadata(request.metadata())
            .map(zeroize::Zeroizing::new)
            .map_err(|r| refuse(&r, peer, None, &self.log))?;
        let claims = (self.gate.verify(&token, self.clock.now()))
            .map_err(|r| refuse(&r, peer, None, &self.log))?;
        Ok(Some(Box::new(TokenWatch::new(
            token,
            claims,
            self.gate.clone(),
            reloads,
            self.clock.clone(),
        ))))
    }

    pub fn into_server(self) -> HdsServer {
        HdsServer::new(self)
    }
}

/// Specifiers (or the final status) waiting for tonic to take them. The
/// driver waits for each send, so a few places suffice.
///
/// The queue is a `futures-channel` one: it allocates per queued message
/// (one here and there), not up front. A tokio channel allocates its slots 32
/// at a time and pads its halves to cache lines: about 1.5 KiB for every
/// connected Envoy, nearly all of it never used.
const OUT_QUEUE: usize = 4;

/// The sending half of a stream's outbound queue.
type Outbound = futures_channel::mpsc::Sender<Result<Bytes, Status>>;

/// A stream's outbound queue of [`OUT_QUEUE`] places (the channel adds one
/// place per sender to its buffer).
fn outbound() -> (
    Outbound,
    futures_channel::mpsc::Receiver<Result<Bytes, Status>>,
) {
    futures_channel::mpsc::channel(OUT_QUEUE - 1)
}

/// Specifiers to one Envoy, already encoded.
type SpecifierStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Bytes, Status>> + Send>>;

impl HdsService {
    async fn stream_health_check(
        &self,
        request: Request<Streaming<FromEnvoy>>,
    ) -> Result<Response<SpecifierStream>, Status> {
        let token = match self.admit(&request) {
            Ok(token) => token,
            Err(status) => {
                m::stream_closed(CloseReason::Unauthenticated);
                return Err(status);
            }
        };
        let peer = request.remote_addr();
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = outbound();
        let claims = token.as_ref().map(|t| t.claims.clone());
        let driver = Driver {
            id,
            peer,
            machine: Stream::new(id, self.settings.clone(), claims, Instant::now()),
            registry: self.registry.clone(),
            settings: self.settings.clone(),
            token,
            drain: self.drain.clone(),
            out: tx,
            attached: None,
            resolved: None,
            waiting: None,
            deleted_wait: None,
            node_slot: None,
            counts: self.counts.clone(),
            log: self.log.clone(),
        };
        let span = tracing::info_span!(
            "stream",
            mesh = tracing::field::Empty,
            name = tracing::field::Empty,
            peer = %Peer(peer),
            stream = id
        );
        let inbound = request.into_inner();
        tokio::spawn(
            async move {
                let _active = ActiveStream::new();
                driver.run(inbound).await;
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(rx)))
    }

    async fn fetch_health_check(
        &self,
        request: Request<FromEnvoy>,
    ) -> Result<Response<Bytes>, Status> {
        let token = self.admit(&request)?;
        let peer = request.remote_addr();
        let (id, envoy) = match request.into_inner() {
            FromEnvoy::Request(r) => (
                node_id(&r)?,
                r.node.as_ref().and_then(EnvoyVersion::of_node),
            ),
            _ => {
                return Err(Status::invalid_argument(
                    "FetchHealthCheck needs a HealthCheckRequest with node.id set",
                ))
            }
        };
        // The token's identity first: a token holder learns nothing of other dataplanes.
        if let Some(t) = &token {
            check_identity(&t.claims, &id.mesh, &id.name)
                .map_err(|r| refuse(&r, peer, Some(&id), &self.log))?;
        }
        let handle = self
            .registry
            .get_defined(&id)
            .ok_or_else(|| not_found(&id, &self.settings))?;
        if let Some(t) = &token {
            stream::authorize_for(&t.claims, &id, &handle.state())
                .map_err(|r| refuse(&r, peer, Some(&id), &self.log))?;
        }
        Ok(Response::new(
            stream::current_specifier(&handle.state(), &self.settings, envoy)
                .encoded()
                .clone(),
        ))
    }
}

/// The validity of one stream's token, followed for the stream's life: it
/// expires at `exp`, and every reload of the gate (keys, revocations)
/// verifies the token again, as a new stream's would be (its key still
/// trusted, not revoked, not expired, validity within the maximum). One
/// receiver for the whole stream, so no reload is missed, whatever the stream
/// was busy with when it landed.
struct TokenWatch {
    token: zeroize::Zeroizing<String>,
    claims: Claims,
    gate: Arc<Gate>,
    reloads: watch::Receiver<u64>,
    clock: Arc<dyn Clock>,
    /// Fires when the token expires. Kept here (not made by each wait) so
    /// that a stream task holds no timer of its own while it waits.
    expiry: Pin<Box<tokio::time::Sleep>>,
}

impl std::fmt::Debug for TokenWatch {
    /// Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenWatch")
            .field("claims", &self.claims)
            .field("expiry", &self.expiry.deadline())
            .finish_non_exhaustive()
    }
}

impl TokenWatch {
    fn new(
        token: zeroize::Zeroizing<String>,
        claims: Claims,
        gate: Arc<Gate>,
        reloads: watch::Receiver<u64>,
        clock: Arc<dyn Clock>,
    ) -> TokenWatch {
        let left = (claims.exp - clock.now().timestamp()).max(0);
        TokenWatch {
            expiry: Box::pin(tokio::time::sleep(Duration::from_secs(left.unsigned_abs()))),
            token,
            claims,
            gate,
            reloads,
            clock,
        }
    }

    /// Completes when the token stops being valid. Cancel-safe.
    async fn invalidated(&mut self) -> Rejection {
        loop {
            tokio::select! {
                () = self.expiry.as_mut() => {
                    return Rejection::Expired { at: self.claims.expires_at().unwrap_or_default() };
                }
                changed = self.reloads.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                    if let Err(rejection) = self.gate.verify(&self.token, self.clock.now()) {
                        return rejection;
                    }
                }
            }
        }
    }
}

/// Completes when the token (if any) stops being valid.
async fn token_invalidated(token: &mut Option<Box<TokenWatch>>) -> Rejection {
    match token {
        Some(t) => t.invalidated().await,
        None => std::future::pending().await,
    }
}

type Waiting = Pin<Box<dyn std::future::Future<Output = Option<DataplaneHandle>> + Send>>;

/// The attached dataplane: its task and its state.
struct Attachment {
    handle: DataplaneHandle,
    state: watch::Receiver<DataplaneState>,
}

/// Runs one stream: pumps events into its [`Stream`] machine and carries out
/// the machine's actions.
struct Driver {
    id: StreamId,
    peer: Option<SocketAddr>,
    machine: Stream,
    registry: Registry,
    settings: Arc<HdsSettings>,
    /// Boxed: most of its size is rarely touched, and the stream's task
    /// should stay small (it lives as long as the stream).
    token: Option<Box<TokenWatch>>,
    drain: watch::Receiver<bool>,
    out: Outbound,
    /// The dataplane being served, once resolved.
    attached: Option<Attachment>,
    /// The dataplane just resolved, until the machine attaches to it.
    resolved: Option<DataplaneHandle>,
    /// This stream's place among the waiting ones (and in
    /// `hdsd_streams_waiting`) while it waits for an unknown dataplane.
    waiting: Option<WaitSlot>,
    /// Counts a stream whose dataplane was deleted in `hdsd_streams_waiting`
    /// while it waits out the grace (not capped: the dataplane was known).
    deleted_wait: Option<m::WaitingStream>,
    /// This stream's place among its node id's streams, once bound.
    node_slot: Option<NodeSlot>,
    counts: Arc<StreamCounts>,
    log: Arc<SharedLogLimiter>,
}

/// How long a stream that is ending may wait for Envoy to take its status.
const END_SEND_TIMEOUT: Duration = Duration::from_secs(5);

impl Driver {
    async fn run(mut self, mut inbound: Streaming<FromEnvoy>) {
        let mut actions = Vec::with_capacity(4);
        let mut pending: Option<Event> = None;
        let mut resolve: Option<Waiting> = None;
        // One timer for the whole stream, re-armed lazily: a report only moves
        // the machine's deadline; the timer catches up when it fires early.
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        let timer = tokio::time::sleep_until(far);
        tokio::pin!(timer);
        let mut armed = far;
        loop {
            let event = match pending.take() {
                Some(event) => event,
                None => {
                    let deadline = self.machine.deadline().unwrap_or(far);
                    if deadline < armed || timer.is_elapsed() {
                        timer.as_mut().reset(deadline);
                        armed = deadline;
                    }
                    tokio::select! {
                        rejection = token_invalidated(&mut self.token) => Event::TokenInvalid(rejection),
                        () = drained(&mut self.drain) => Event::Drain,
                        found = wait_opt(&mut resolve) => {
                            resolve = None;
                            self.waiting = None;
                            self.deleted_wait = None;
                            match found {
                                Some(handle) => self.resolved(handle),
                                None => Event::Tick,
                            }
                        }
                        changed = state_changed(&mut self.attached) => match changed {
                            Some(state) => Event::StateChanged(Box::new(state)),
                            None => Event::DataplaneGone,
                        },
                        () = &mut timer => {
                            armed = far;
                            Event::Tick
                        }
                        msg = inbound.message() => match msg {
                            Ok(Some(msg)) => match msg {
                                FromEnvoy::Request(r) => {
                                    m::hot().health_check_requests.increment(1);
                                    Event::Request(r)
                                }
                                FromEnvoy::Report(r) => {
                                    m::hot().reports.increment(1);
                                    Event::Report(r)
                                }
                                FromEnvoy::Empty => Event::EmptyMessage,
                            },
                            Ok(None) => Event::ClientClosed,
                            Err(status) if status.code() == tonic::Code::OutOfRange => Event::LimitReached {
                                limit: "max_message_bytes",
                                status: Status::resource_exhausted(format!(
                                    "a message larger than hds.limits.max_message_bytes ({} bytes) was refused: {}",
                                    self.settings.limits.max_message_bytes,
                                    status.message()
                                )),
                            },
                            Err(status) => Event::ClientError(status),
                        },
                    }
                }
            };
            self.machine.handle(event, Instant::now(), &mut actions);
            for action in actions.drain(..) {
                if let Some(next) = self.execute(action, &mut resolve).await {
                    // A follow-up (the dataplane is already defined, its task
                    // is gone, the token became invalid while sending...).
                    pending = Some(next);
                    break;
                }
            }
            // Actions after an interruption are dropped: the machine decides again.
            actions.clear();
            if self.machine.is_ended() && pending.is_none() {
                break;
            }
        }
        // An action cut short may have left the dataplane attached.
        if let Some(a) = self.attached.take() {
            a.handle
                .send_now(Command::Detach {
                    stream: self.id,
                    rejected: false,
                })
                .await;
        }
    }

    /// A dataplane was found: the machine gets its current state.
    fn resolved(&mut self, handle: DataplaneHandle) -> Event {
        let state = Box::new(handle.state());
        self.resolved = Some(handle);
        Event::Resolved(state)
    }

    /// Carries out one action; returns an event to handle before anything else.
    async fn execute(&mut self, action: Action, resolve: &mut Option<Waiting>) -> Option<Event> {
        match action {
            Action::Resolve { id, why } => {
                let span = tracing::Span::current();
                // Escaped: a node id is the client's text (a newline must not forge a log line).
                span.record("mesh", tracing::field::display(&id.mesh));
                span.record("name", tracing::field::display(id.name.escape_debug()));
                if why == Awaiting::FirstRequest {
                    match self.counts.bind(&id) {
                        Some(slot) => self.node_slot = Some(slot),
                        None => {
                            return Some(Event::LimitReached {
                                limit: "max_streams_per_dataplane",
                                status: Status::resource_exhausted(format!(
                                    "{} streams are already open for dataplane {}.{} (hds.limits.max_streams_per_dataplane); close them, or wait for the older ones to end",
                                    self.counts.max_per_node,
                                    id.mesh,
                                    id.name.escape_debug()
                                )),
                            })
                        }
                    }
                }
                if let Some(handle) = self.registry.get_defined(&id) {
                    return Some(self.resolved(handle));
                }
                let grace = humantime::format_duration(self.settings.unknown_dataplane_grace);
                match why {
                    Awaiting::FirstRequest => {
                        let define = if self.settings.definitions_from_api {
                            "define it (hdsd apply or PUT /api/v1/dataplanes/<mesh>/<name>)"
                        } else {
                            "add its file to the dataplanes directory"
                        };
                        let Some(slot) = self.counts.wait() else {
                            return Some(Event::LimitReached {
                                limit: "max_waiting_streams",
                                status: Status::unavailable(format!(
                                    "dataplane {}.{} is not registered, and {} streams already wait for unknown dataplanes (hds.limits.max_waiting_streams); {define}, then reconnect",
                                    id.mesh,
                                    id.name.escape_debug(),
                                    self.counts.max_waiting
                                )),
                            });
                        };
                        self.waiting = Some(slot);
                        if let Some(suppressed) =
                            self.log.allow(self.peer.map(|p| p.ip()), Instant::now())
                        {
                            if self.settings.definitions_from_api {
                                tracing::warn!(
                                    suppressed,
                                    "unknown dataplane; waiting up to {grace} for its definition (PUT /api/v1/dataplanes/{}/{})",
                                    id.mesh,
                                    id.name.escape_debug()
                                );
                            } else {
                                tracing::warn!(
                                    suppressed,
                                    "unknown dataplane; waiting up to {grace} for {}.yaml in the dataplanes directory",
                                    id.name.escape_debug()
                                );
                            }
                        }
                    }
                    Awaiting::Deleted => {
                        tracing::info!(
                            "dataplane deleted; sent an empty specifier, waiting {grace} for it to come back"
                        );
                        self.waiting = None;
                        self.deleted_wait = Some(m::WaitingStream::new());
                    }
                }
                let registry = self.registry.clone();
                let deadline = Instant::now() + self.settings.unknown_dataplane_grace;
                *resolve = Some(Box::pin(
                    async move { registry.wait_for(&id, deadline).await },
                ));
                None
            }
            Action::Attach { envoy } => {
                let handle = self.resolved.take()?;
                let state = handle.subscribe();
                let ok = handle
                    .send_now(Command::Attach {
                        stream: self.id,
                        peer: self.peer,
                        envoy,
                        token_expires: self.token.as_ref().and_then(|t| t.claims.expires_at()),
                    })
                    .await;
                self.attached = Some(Attachment { handle, state });
                if !ok {
                    return Some(Event::DataplaneGone);
                }
                tracing::debug!("stream attached");
                None
            }
            Action::Detach { rejected } => {
                if let Some(a) = self.attached.take() {
                    a.handle
                        .send_now(Command::Detach {
                            stream: self.id,
                            rejected,
                        })
                        .await;
                }
                None
            }
            Action::Send(specifier) => {
                tracing::debug!(
                    clusters = specifier.message.cluster_health_checks.len(),
                    "sending specifier"
                );
                let bytes = specifier.encoded().clone();
                // A place in the queue is almost always free: only a full
                // queue waits, in a future of its own (see `send_waiting`).
                let sent = match self.out.try_send(Ok(bytes)) {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_full() => Box::pin(self.send_waiting(e.into_inner())).await,
                    Err(_) => Err(Event::ClientClosed),
                };
                match sent {
                    Ok(()) => {
                        m::hot().specifiers_sent.increment(1);
                        None
                    }
                    Err(event) => Some(event),
                }
            }
            Action::Forward(report) => {
                let Some(a) = &self.attached else { return None };
                let command = Command::Report {
                    stream: self.id,
                    report,
                    received: std::time::Instant::now(),
                };
                match a.handle.try_send(command) {
                    Ok(()) => None,
                    Err(mpsc::error::TrySendError::Closed(_)) => Some(Event::DataplaneGone),
                    // The dataplane's queue is full: wait (backpressure on
                    // this stream), in a future of its own.
                    Err(mpsc::error::TrySendError::Full(command)) => {
                        Box::pin(self.forward_waiting(command)).await
                    }
                }
            }
            Action::End(end) => {
                // Once per stream: its future (a timer, a send) is boxed
                // rather than kept in the stream's task for its whole life.
                Box::pin(self.finish(end)).await;
                None
            }
        }
    }

    /// Sends to Envoy once the outbound queue has room. Envoy may hold its
    /// flow-control window shut: the token and shutdown are still watched
    /// while the send waits.
    async fn send_waiting(&mut self, item: Result<Bytes, Status>) -> Result<(), Event> {
        let ready = tokio::select! {
            ready = std::future::poll_fn(|cx| self.out.poll_ready(cx)) => ready,
            rejection = token_invalidated(&mut self.token) => return Err(Event::TokenInvalid(rejection)),
            () = drained(&mut self.drain) => return Err(Event::Drain),
        };
        ready
            .and_then(|()| self.out.start_send(item))
            .map_err(|_| Event::ClientClosed)
    }

    /// Hands a report to the dataplane's task once its queue has room.
    async fn forward_waiting(&mut self, command: Command) -> Option<Event> {
        let a = self.attached.as_ref()?;
        tokio::select! {
            ok = a.handle.send(command) => (!ok).then_some(Event::DataplaneGone),
            rejection = token_invalidated(&mut self.token) => Some(Event::TokenInvalid(rejection)),
            () = drained(&mut self.drain) => Some(Event::Drain),
        }
    }

    async fn finish(&mut self, end: End) {
        // Formatted only into a line that is written.
        let peer = Peer(self.peer);
        let status = match end {
            End::Closed => {
                m::stream_closed(CloseReason::Ok);
                tracing::debug!(%peer, "stream closed by the client");
                return;
            }
            End::Shutdown => {
                m::stream_closed(CloseReason::Shutdown);
                Status::unavailable("hdsd is shutting down; reconnect")
            }
            End::Stale(status) => {
                m::stream_closed(CloseReason::Stale);
                tracing::warn!(%peer, code = ?status.code(), "ending stream: {}", status.message().escape_debug());
                status
            }
            End::Refused { rejection, node } => {
                let status = refuse(&rejection, self.peer, node.as_ref(), &self.log);
                m::stream_closed(close_reason(status.code()));
                status
            }
            End::Limit { limit, status } => {
                m::limit_hit(limit);
                m::stream_closed(close_reason(status.code()));
                if let Some(suppressed) = self.log.allow(self.peer.map(|p| p.ip()), Instant::now())
                {
                    tracing::warn!(%peer, limit, suppressed, code = ?status.code(), "ending stream: {}", status.message().escape_debug());
                }
                status
            }
            End::Status(status) => {
                m::stream_closed(close_reason(status.code()));
                if let Some(suppressed) = self.log.allow(self.peer.map(|p| p.ip()), Instant::now())
                {
                    tracing::warn!(%peer, suppressed, code = ?status.code(), "ending stream: {}", status.message().escape_debug());
                }
                status
            }
        };
        // A client that stopped reading must not keep this task alive.
        let out = &mut self.out;
        let _ = tokio::time::timeout(END_SEND_TIMEOUT, async move {
            std::future::poll_fn(|cx| out.poll_ready(cx)).await?;
            out.start_send(Err(status))
        })
        .await;
    }
}

/// A peer address in a log line: the address, or nothing when unknown.
/// Formatted when (and only when) a line or span that shows it is written.
#[derive(Debug, Clone, Copy)]
struct Peer(Option<SocketAddr>);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(p) => p.fmt(f),
            None => Ok(()),
        }
    }
}

/// Completes with the pending lookup's result; never when there is none.
async fn wait_opt(resolve: &mut Option<Waiting>) -> Option<DataplaneHandle> {
    match resolve {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The attached dataplane's next state; `None` when its task is gone. Never
/// completes while nothing is attached.
async fn state_changed(attached: &mut Option<Attachment>) -> Option<DataplaneState> {
    match attached {
        Some(a) => match a.state.changed().await {
            Ok(()) => Some(a.state.borrow_and_update().clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// Completes when the drain flag becomes true (or its sender is gone).
async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

/// Counts an authentication or authorization failure (every one) and logs
/// it (a few per peer per minute: one client retrying in a loop must not
/// flood the log); the status carries the short message only, the detail
/// goes to the log. The node id is escaped: it is the client's text.
fn refuse(
    r: &Rejection,
    peer: Option<SocketAddr>,
    node: Option<&DataplaneId>,
    log: &SharedLogLimiter,
) -> Status {
    metrics::counter!(m::AUTH_FAILURES, "reason" => r.reason()).increment(1);
    if let Some(suppressed) = log.allow(peer.map(|p| p.ip()), Instant::now()) {
        tracing::warn!(
            peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
            node = %node.map(|n| n.to_string().escape_debug().to_string()).unwrap_or_default(),
            reason = r.reason(),
            suppressed,
            "stream refused: {}",
            r.detail().escape_debug()
        );
    }
    grpc_auth::status(r)
}

/// The `reason` label of a stream ended with this gRPC status.
fn close_reason(code: tonic::Code) -> CloseReason {
    use tonic::Code;
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

#[cfg(test)]
mod counts_tests {
    use super::*;

    #[test]
    fn streams_per_node_and_waiting_streams_are_capped_and_released() {
        let counts = StreamCounts::new(2, 1);
        let web: DataplaneId = "default.web".parse().unwrap();
        let db: DataplaneId = "default.db".parse().unwrap();
        let a = counts.bind(&web).unwrap();
        let b = counts.bind(&web).unwrap();
        assert!(counts.bind(&web).is_none());
        let c = counts.bind(&db).unwrap();
        assert_eq!(counts.bound(&web), 2);
        drop(a);
        assert_eq!(counts.bound(&web), 1);
        drop((b, c));
        assert!(counts.per_node.lock().unwrap().is_empty());

        let w = counts.wait().unwrap();
        assert!(counts.wait().is_none());
        drop(w);
        assert!(counts.wait().is_some());
    }
}
