//! `envoy.service.endpoint.v3.EndpointDiscoveryService` on the HDS listener:
//! authenticate, then pump requests and assignment changes through one
//! [`EdsStream`] per stream.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryService;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::index::AssignmentsRx;
use super::protocol::{Action, EdsRequest, EdsStream, Push};
use crate::metrics as m;

/// Who may subscribe.
#[derive(Debug, Clone)]
pub enum EdsAuth {
    /// `auth.mode = "none"`: anyone who reaches the port.
    Open,
    /// `auth.mode = "token"`: one of `api.tokens` or `eds.tokens` as
    /// `authorization: Bearer <token>`.
    Tokens(Arc<Vec<String>>),
}

/// Why a subscriber was refused: the message it gets and the metric reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: &'static str,
}

/// Checks the `authorization` metadata of an EDS stream.
pub fn check(auth: &EdsAuth, metadata: &MetadataMap) -> Result<(), Refusal> {
    let EdsAuth::Tokens(tokens) = auth else {
        return Ok(());
    };
    if tokens.is_empty() {
        return Err(Refusal {
            reason: "no_api_tokens",
            message: "EDS needs a token with auth.mode = \"token\", but api.tokens and eds.tokens are empty; add one to eds.tokens (or api.tokens) and send it as `authorization: Bearer <token>`",
        });
    }
    // The one bearer rule (auth::bearer), the one API-token comparison.
    let presented = metadata.get("authorization").map(|v| {
        v.to_str()
            .map_err(|_| crate::auth::BearerError::NotAscii)
            .and_then(crate::auth::bearer::parse)
    });
    match presented {
        None => Err(Refusal {
            reason: "missing",
            message: "EDS clients must send `authorization: Bearer <token>` (gRPC initial_metadata) with one of api.tokens or eds.tokens",
        }),
        Some(Ok(t)) if crate::auth::bearer::is_api_token(tokens, t) => Ok(()),
        Some(_) => Err(Refusal {
            reason: "invalid_api_token",
            message: "invalid EDS token: it is not one of api.tokens or eds.tokens",
        }),
    }
}

/// The EDS service.
#[derive(Debug, Clone)]
pub struct EdsService {
    assignments: AssignmentsRx,
    auth: EdsAuth,
    drain: watch::Receiver<bool>,
    /// Re-send every assignment this often (a third of
    /// `eds.endpoint_stale_after`), if set.
    refresh: Option<Duration>,
    /// Resource names one request may name (`eds.max_resource_names`).
    max_names: usize,
}

/// `eds.max_resource_names`'s default.
pub const MAX_RESOURCE_NAMES: usize = 4096;

impl EdsService {
    pub fn new(assignments: AssignmentsRx, auth: EdsAuth, drain: watch::Receiver<bool>) -> Self {
        EdsService {
            assignments,
            auth,
            drain,
            refresh: None,
            max_names: MAX_RESOURCE_NAMES,
        }
    }

    /// At most `max` resource names per request (`eds.max_resource_names`).
    pub fn max_resource_names(mut self, max: usize) -> Self {
        self.max_names = max;
        self
    }

    /// Resource names one request may name.
    pub fn max_names(&self) -> usize {
        self.max_names
    }

    /// Re-sends every assignment on every stream a third of `stale_after`
    /// after the last time (`eds.endpoint_stale_after`).
    pub fn refreshing(mut self, stale_after: Option<Duration>) -> Self {
        self.refresh = stale_after.map(|d| d / 3);
        self
    }

    /// A `StreamEndpoints` stream: authenticate, then pump requests and
    /// changes in a task of its own.
    pub(super) fn stream<S>(&self, request: Request<S>) -> Result<Response<ResponseStream>, Status>
    where
        S: tokio_stream::Stream<Item = Result<EdsRequest, Status>> + Send + Unpin + 'static,
    {
        let peer = request.remote_addr();
        if let Err(r) = check(&self.auth, request.metadata()) {
            return Err(refuse(&r, peer));
        }
        let (tx, rx) = mpsc::channel(1);
        let assignments = self.assignments.clone();
        let mut drain = self.drain.clone();
        let refresh = self.refresh;
        let inbound = request.into_inner();
        tokio::spawn(async move {
            let _active = m::ActiveEdsStream::new();
            let out = tx.clone();
            tokio::select! {
                end = pump(inbound, assignments, refresh, &tx, peer) => {
                    if let Err(status) = end {
                        let _ = out.send(Err(status)).await;
                    }
                }
                () = drained(&mut drain) => {
                    let _ = out.send(Err(Status::unavailable("hdsd is shutting down; reconnect"))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type Out<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

/// The responses of a `StreamEndpoints` stream.
pub type ResponseStream = Out<Push>;

#[tonic::async_trait]
impl EndpointDiscoveryService for EdsService {
    type StreamEndpointsStream = Out<DiscoveryResponse>;

    /// Served by [`super::transport::EdsServer`]'s lean decoder; here for the generated
    /// server's trait (and the same behaviour).
    async fn stream_endpoints(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamEndpointsStream>, Status> {
        let pushes =
            self.stream(request.map(|inbound| inbound.map(|r| r.map(EdsRequest::from))))?;
        Ok(pushes.map(|p| -> Self::StreamEndpointsStream {
            Box::pin(p.map(|r| r.map(|push| push.message())))
        }))
    }

    async fn fetch_endpoints(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        if let Err(r) = check(&self.auth, request.metadata()) {
            return Err(refuse(&r, request.remote_addr()));
        }
        let mut assignments = self.assignments.clone();
        let synced = assignments.wait_for(|a| a.synced).await.is_ok();
        if !synced {
            return Err(Status::unavailable("hdsd is shutting down; retry"));
        }
        if request.get_ref().resource_names.len() > self.max_names {
            return Err(too_many_names(
                request.get_ref().resource_names.len(),
                self.max_names,
                request.remote_addr(),
            ));
        }
        let current = assignments.borrow().clone();
        let actions = EdsStream::new()
            .on_request(&request.into_inner(), &current)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        actions
            .into_iter()
            .find_map(|a| match a {
                Action::Send { response, .. } => Some(Response::new(response.message())),
                _ => None,
            })
            .ok_or_else(|| Status::invalid_argument("FetchEndpoints needs resource_names"))
    }

    type DeltaEndpointsStream = Out<DeltaDiscoveryResponse>;

    async fn delta_endpoints(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaEndpointsStream>, Status> {
        Err(Status::unimplemented(
            "hdsd serves state-of-the-world EDS only: set api_config_source.api_type to GRPC (not DELTA_GRPC)",
        ))
    }
}

/// The status of a request naming `count` resources, more than `max`.
pub(super) fn too_many_names_status(count: usize, max: usize) -> Status {
    Status::resource_exhausted(format!(
        "the request names {count} resources, more than eds.max_resource_names ({max}); split the clusters over several EDS streams or raise the limit"
    ))
}

/// Counts and logs a request with too many names (a fetch; a stream's is
/// counted when it ends).
fn too_many_names(count: usize, max: usize, peer: Option<SocketAddr>) -> Status {
    let status = too_many_names_status(count, max);
    m::limit_hit(MAX_NAMES_LIMIT);
    tracing::warn!(
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        "EDS request refused: {}",
        status.message()
    );
    status
}

/// The `limit` label of `hdsd_limit_hits_total` for `eds.max_resource_names`.
pub const MAX_NAMES_LIMIT: &str = "max_eds_resource_names";

/// How a stream whose request went past a limit ends: the limit counted,
/// one log line, `RESOURCE_EXHAUSTED` naming the setting. `None` for any
/// other error (the client went away).
fn over_limit(status: &Status, peer: &str, node: &str) -> Option<Status> {
    let (limit, status) = match status.code() {
        // tonic's answer to a message past max_decoding_message_size.
        tonic::Code::OutOfRange => (
            "max_message_bytes",
            Status::resource_exhausted(format!(
                "{}; an EDS request may have at most hds.limits.max_message_bytes: raise it, or split the clusters over several EDS streams",
                status.message()
            )),
        ),
        // The decoder's refusal of too many names.
        tonic::Code::ResourceExhausted => (MAX_NAMES_LIMIT, status.clone()),
        _ => return None,
    };
    m::limit_hit(limit);
    tracing::warn!(peer, node, limit, "EDS stream ended: {}", status.message());
    Some(status)
}

/// Logs and counts a refused subscriber.
fn refuse(r: &Refusal, peer: Option<SocketAddr>) -> Status {
    metrics::counter!(m::AUTH_FAILURES, "reason" => r.reason).increment(1);
    tracing::warn!(
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        reason = r.reason,
        "EDS stream refused: {}",
        r.message
    );
    Status::unauthenticated(r.message)
}

async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

/// Moves one stream: requests and assignment changes in, responses out.
/// Ends with `Ok` when the client closes, `Err` to end it with a status.
async fn pump(
    mut inbound: impl tokio_stream::Stream<Item = Result<EdsRequest, Status>> + Unpin,
    mut assignments: AssignmentsRx,
    refresh: Option<Duration>,
    out: &mpsc::Sender<Result<Push, Status>>,
    peer: Option<SocketAddr>,
) -> Result<(), Status> {
    let peer = peer.map(|p| p.to_string()).unwrap_or_default();
    let mut stream = EdsStream::new();
    let mut node = String::new();
    // Never answer from an index that does not hold every dataplane yet.
    let synced = assignments.wait_for(|a| a.synced).await.is_ok();
    if !synced {
        return Err(Status::unavailable("hdsd is shutting down; reconnect"));
    }
    // With `eds.endpoint_stale_after`: every assignment again, a third of
    // it after the last time (only a received assignment resets a front's
    // stale timer, and hdsd otherwise sends on change only).
    let mut refresh = refresh.map(|every| {
        let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer
    });
    loop {
        tokio::select! {
            _ = tick(&mut refresh) => {
                let current = assignments.borrow().clone();
                if let Some(response) = stream.refresh(&current) {
                    m::eds_refresh();
                    send(out, response).await?;
                }
            }
            message = inbound.next() => {
                let EdsRequest { request, same_names } = match message {
                    Some(Ok(r)) => r,
                    None => return Ok(()),
                    Some(Err(status)) => {
                        if let Some(status) = over_limit(&status, &peer, &node) {
                            return Err(status);
                        }
                        tracing::debug!(peer, node, "EDS stream ended by the client: {}", status.message());
                        return Ok(());
                    }
                };
                if let Some(n) = request.node.as_ref().filter(|n| !n.id.is_empty()) {
                    // The client's text: escaped and cut in every line.
                    node = crate::names::shown(&n.id);
                }
                // Not `borrow_and_update`: a change published since the
                // last push must still wake the branch below. A request
                // that changes nothing (Envoy's ACKs repeat the names)
                // would otherwise swallow it until the next change.
                let current = assignments.borrow().clone();
                let actions = stream.on_request_with(&request, same_names, &current).map_err(|e| {
                    tracing::warn!(peer, node, "EDS stream refused: {e}");
                    Status::invalid_argument(e.to_string())
                })?;
                for action in actions {
                    match action {
                        Action::Send { response, unknown } => {
                            for name in unknown {
                                tracing::debug!(peer, node, resource = crate::names::shown(&name), "EDS resource matches no service: served empty");
                            }
                            send(out, response).await?;
                        }
                        Action::Ack { version } => {
                            tracing::trace!(peer, node, version, "EDS ACK");
                        }
                        Action::Nack { version, nonce, message } => {
                            m::eds_nack();
                            // Every part is the client's text: escaped and
                            // cut, so a NACK cannot forge or flood a line.
                            tracing::warn!(
                                peer,
                                node,
                                version = crate::names::shown(&version),
                                nonce = crate::names::shown(&nonce),
                                "EDS response rejected by the client (NACK): {}",
                                crate::names::shown(&message)
                            );
                        }
                    }
                }
            }
            changed = assignments.changed() => {
                if changed.is_err() {
                    return Err(Status::unavailable("hdsd is shutting down; reconnect"));
                }
                let current = assignments.borrow_and_update().clone();
                if let Some(response) = stream.on_change(&current) {
                    send(out, response).await?;
                }
            }
        }
    }
}

/// The refresh timer's next tick; never without one.
async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn send(out: &mpsc::Sender<Result<Push, Status>>, response: Push) -> Result<(), Status> {
    // Waits while the client does not read; changes meanwhile coalesce in
    // the assignments' watch channel.
    out.send(Ok(response))
        .await
        .map_err(|_| Status::cancelled("the client went away"))?;
    m::eds_push();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(value: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(v) = value {
            m.insert("authorization", v.parse().unwrap());
        }
        m
    }

    /// Envoy ACKs every response with the same resource names; a change
    /// published while such an ACK is handled must still be pushed at once,
    /// not when the next change comes (it waited for the next burst of
    /// flips, seconds later, in the eds10k benchmark).
    #[tokio::test(start_paused = true)]
    async fn a_change_published_while_an_ack_is_handled_is_pushed_at_once() {
        use crate::consumers::eds::protocol::tests::{assignments, request};
        // Both branches of the pump are ready at once each round; tokio
        // picks one at random, so 32 rounds try both orders.
        for round in 0..32 {
            let (changes, rx) = watch::channel(Arc::new(assignments(1, &[("web", 1, 1)])));
            let (requests, inbound) = mpsc::channel(4);
            let (out, mut pushed) = mpsc::channel(16);
            let pump = tokio::spawn(async move {
                pump(ReceiverStream::new(inbound), rx, None, &out, None).await
            });
            requests
                .send(Ok(request(&["default/web"], "", "").into()))
                .await
                .unwrap();
            let first = pushed.recv().await.unwrap().unwrap();
            changes.send_replace(Arc::new(assignments(2, &[("web", 2, 2)])));
            requests
                .send(Ok(request(
                    &["default/web"],
                    &first.version_info,
                    &first.nonce,
                )
                .into()))
                .await
                .unwrap();
            let second = tokio::time::timeout(std::time::Duration::from_secs(5), pushed.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the change was not pushed"))
                .unwrap()
                .unwrap();
            assert_eq!(second.version_info, "42.2", "round {round}");
            pump.abort();
        }
    }

    #[test]
    fn api_tokens_guard_eds_with_token_auth() {
        let auth = EdsAuth::Tokens(Arc::new(vec!["s3cret".into()]));
        assert_eq!(check(&auth, &metadata(Some("Bearer s3cret"))), Ok(()));
        assert_eq!(check(&auth, &metadata(None)).unwrap_err().reason, "missing");
        assert_eq!(
            check(&auth, &metadata(Some("Bearer nope")))
                .unwrap_err()
                .reason,
            "invalid_api_token"
        );
        let none = EdsAuth::Tokens(Arc::new(vec![]));
        let r = check(&none, &metadata(Some("Bearer s3cret"))).unwrap_err();
        assert_eq!(r.reason, "no_api_tokens");
        assert!(r.message.contains("api.tokens"));
        assert_eq!(check(&EdsAuth::Open, &metadata(None)), Ok(()));
    }
}
