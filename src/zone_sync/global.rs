//! The global's side of zone sync: the `hdsd.v1.ZoneSyncService` listener,
//! one task per zone stream, and the hub task.
//!
//! Who owns what:
//! - the hub task is the only writer of the [`Hub`]: every stream's task
//!   sends it commands (open, claim, the session's actions) and it
//!   publishes a [`ZonesView`] on a watch channel after each batch of
//!   commands, and whenever a zone's summary changes with time alone (a
//!   zone goes offline when nothing arrives: the hub looks every
//!   [`VIEW_TICK`]);
//! - each stream's task owns its [`Session`]; the hub tells it when a newer
//!   stream of its zone took the uplink over.
//!
//! Zones registered, disabled or deleted through the API reach the hub as
//! [`ZoneRecord`]s: from this instance's API at once ([`HubHandle::record`],
//! after the write to the cluster), and from the other instances' through
//! the shared store's ledger. The hub tells the streams of a zone disabled
//! or deleted to end ([`Notice::Ending`]).
//!
//! A zone is known by its credential only: a zone token (the stream's
//! `authorization` metadata, verified by the [`Gate`] like a dataplane's;
//! only a token with a zone opens a stream) or, with `global.tls.client_ca`,
//! the client certificate of its TLS connection, whose one URI names it
//! ([`crate::zones::certificate`]). When keys or revocations change, every
//! stream's token is verified again, and a stream whose token no longer
//! verifies ends with `UNAUTHENTICATED`; a stream ends when its token or
//! certificate expires.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::shared::{self, Outgoing, Report};
use crate::auth::Gate;
use crate::clock::{Clock, Timestamp};
use crate::cluster::Cluster;
use crate::dataplane::DataplaneId;
use crate::feed::FeedSender;
use crate::net::{SharedLogLimiter, REFUSAL_LOG};
use crate::pb;
use crate::zones::certificate::{self, zone_of};
use crate::zones::hub::{Ending, Hub, HubSettings, ZoneRecord, ZoneSummary, ZonesView};
use crate::zones::remote::{Applied, Claim, OwnLink, StreamId};
use crate::zones::session::{Action, Admission, Event, Session, SessionSettings, ZoneCredential};
use crate::zones::{Code, Meshes};

/// How often the hub looks whether a zone's summary changed with time
/// alone (online to offline, offline to withdrawn).
pub const VIEW_TICK: Duration = Duration::from_millis(250);

/// Commands a stream's task sends the hub task at most before it waits.
const HUB_QUEUE: usize = 1024;

/// Messages to one zone buffered before its task waits for the transport.
const STREAM_BUFFER: usize = 64;

/// The largest message a zone may send (a snapshot chunk of
/// [`CHUNK_SIZE`](crate::zones::uplink::CHUNK_SIZE) dataplanes fits many
/// times over).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// What a stream's task tells the hub.
#[derive(Debug)]
enum Command {
    /// A stream of `zone` opened: its number and the zone's registration.
    Open {
        zone: String,
        notices: mpsc::UnboundedSender<Notice>,
        reply: oneshot::Sender<(StreamId, Admission)>,
    },
    /// A zone registered, disabled or deleted through this instance's API:
    /// the zone as readers see it once the record is applied (`None`: gone).
    Record {
        record: ZoneRecord,
        reply: oneshot::Sender<Option<ZoneSummary>>,
    },
    /// The session asks for the uplink.
    Claim {
        zone: String,
        stream: StreamId,
        epoch: u64,
        instance: String,
        /// The address the stream came from (a source is an instance and
        /// an address: two holders of one credential are told apart).
        peer: Option<std::net::IpAddr>,
        meshes: Meshes,
        reply: oneshot::Sender<Claim>,
    },
    /// The session's actions, in order.
    Apply {
        zone: String,
        stream: StreamId,
        actions: Vec<Action>,
    },
    /// The stream's task ended.
    Gone { stream: StreamId },
}

/// What the hub tells a stream's task.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Notice {
    /// A newer stream of the zone holds the uplink.
    Superseded { epoch: u64, instance: String },
    /// The zone was disabled or deleted (or its tokens retired).
    Ending(Ending),
}

impl Notice {
    fn event(self) -> Event {
        match self {
            Notice::Superseded { epoch, instance } => Event::Superseded { epoch, instance },
            Notice::Ending(Ending::Disabled(by)) => Event::Disabled(by),
            Notice::Ending(Ending::Deleted) => Event::Deleted,
            Notice::Ending(Ending::TokensRetired(t)) => Event::TokensRetired(t),
        }
    }
}

/// The hub task's address, and what it publishes.
#[derive(Debug, Clone)]
pub struct HubHandle {
    commands: mpsc::Sender<Command>,
    view: watch::Receiver<Arc<ZonesView>>,
}

impl HubHandle {
    /// Every zone now.
    pub fn view(&self) -> Arc<ZonesView> {
        self.view.borrow().clone()
    }

    /// Follows the view as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ZonesView>> {
        self.view.clone()
    }

    /// Applies a registration through this instance's API (already written
    /// to the cluster) and answers with the zone as readers now see it
    /// (`None`: gone, or the hub is stopping).
    pub async fn record(&self, record: ZoneRecord) -> Option<ZoneSummary> {
        self.ask(|reply| Command::Record { record, reply })
            .await
            .flatten()
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).await.ok()?;
        answer.await.ok()
    }
}

/// Starts the hub task: the zones of the configuration and those `records`
/// registered through the API, judged by `settings`. With a `cluster`
/// shared by several instances, the zones are shared through it too
/// ([`super::shared`]).
pub fn spawn_hub(
    settings: HubSettings,
    registered: &[String],
    disabled: &[String],
    records: Vec<ZoneRecord>,
    cluster: Option<Arc<dyn Cluster>>,
    clock: Arc<dyn Clock>,
) -> HubHandle {
    let mut hub = Hub::new(settings, registered, disabled, clock.now());
    for record in records {
        hub.record(record);
    }
    let first = hub.view(clock.now());
    let (view_tx, view) = watch::channel(Arc::new(first));
    let (commands, rx) = mpsc::channel(HUB_QUEUE);
    let (reports_tx, reports) = mpsc::unbounded_channel();
    let ledger = cluster.filter(|c| c.shared()).map(|cluster| {
        let (tx, outgoing) = mpsc::unbounded_channel();
        shared::spawn(
            cluster,
            settings.zone_timeout,
            clock.clone(),
            outgoing,
            reports_tx,
        );
        tx
    });
    tokio::spawn(run_hub(hub, rx, reports, ledger, view_tx, clock));
    HubHandle { commands, view }
}

/// Follows the hub's views into the change feed, so the global's watches
/// (gRPC `Watch`, SSE) carry every zone's dataplanes and the zones' states
/// ([`crate::zones::changes`]).
pub fn feed_zones(hub: &HubHandle, feed: FeedSender) {
    let mut views = hub.subscribe();
    tokio::spawn(async move {
        let mut prev = Arc::new(ZonesView::default());
        loop {
            let next = views.borrow_and_update().clone();
            for change in crate::zones::changes::changes(&prev, &next) {
                feed.publish(change);
            }
            prev = next;
            if views.changed().await.is_err() {
                return;
            }
        }
    });
}

/// What a batch of commands did to one zone that the other instances of
/// the global must hear.
#[derive(Debug, Default)]
struct Pending {
    /// The stream that won the zone in this batch.
    claimed: Option<StreamId>,
    /// Dataplanes that changed.
    changed: BTreeSet<DataplaneId>,
    /// The holder's link just before its stream ended, and that stream.
    ended: Option<OwnLink>,
    /// The holder's news (heartbeats) moved the link.
    touched: bool,
}

async fn run_hub(
    mut hub: Hub,
    mut rx: mpsc::Receiver<Command>,
    mut reports: mpsc::UnboundedReceiver<Report>,
    ledger: Option<mpsc::UnboundedSender<Vec<Outgoing>>>,
    view: watch::Sender<Arc<ZonesView>>,
    clock: Arc<dyn Clock>,
) {
    let mut streams: HashMap<StreamId, mpsc::UnboundedSender<Notice>> = HashMap::new();
    let mut tick = tokio::time::interval(VIEW_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::new();
    loop {
        let mut changed = BTreeSet::new();
        let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
        let mut step = Step::default();
        tokio::select! {
            n = rx.recv_many(&mut batch, HUB_QUEUE) => {
                if n == 0 {
                    return;
                }
                for command in batch.drain(..) {
                    handle(&mut hub, &mut streams, &mut changed, &mut pending, &mut step, command, clock.as_ref());
                }
            }
            Some(report) = reports.recv() => {
                observe(&mut hub, &streams, &mut changed, &mut step, report);
            }
            _ = tick.tick() => {}
        }
        let now = clock.now();
        if let Some(ledger) = &ledger {
            let mut outgoing = outgoing(&hub, pending, now);
            // The link of a deleted zone whose stream was held here: gone
            // with the zone's rows; the release only tells the ledger.
            outgoing.extend(step.released.drain(..).map(|(zone, stream)| Outgoing {
                zone,
                stream,
                change: shared::Change::Release,
                dataplanes: Vec::new(),
                at: now,
            }));
            if !outgoing.is_empty() {
                let _ = ledger.send(outgoing);
            }
        }
        let current = view.borrow().clone();
        let next = hub.view(now);
        let summaries_moved = next.zones.len() != current.zones.len()
            || next
                .zones
                .iter()
                .zip(&current.zones)
                .any(|(a, b)| a.summary != b.summary);
        if !changed.is_empty() || summaries_moved {
            view.send_replace(Arc::new(next));
        }
        // Answered once readers see what the record did.
        for (zone, reply) in step.replies.drain(..) {
            let _ = reply.send(hub.summary(&zone, now));
        }
    }
}

/// What one turn of the hub task owes once its view is published.
#[derive(Default)]
struct Step {
    /// API writes waiting for their answer.
    replies: Vec<(String, oneshot::Sender<Option<ZoneSummary>>)>,
    /// Deleted zones whose stream this instance held.
    released: Vec<(String, StreamId)>,
}

/// Applies a registration through the API and tells the zone's streams
/// what it means for them.
fn record(
    hub: &mut Hub,
    streams: &HashMap<StreamId, mpsc::UnboundedSender<Notice>>,
    changed: &mut BTreeSet<String>,
    step: &mut Step,
    record: ZoneRecord,
) {
    let zone = record.zone.clone();
    let state = record.state;
    let recorded = hub.record(record);
    if !recorded.applied {
        return;
    }
    tracing::info!(zone, state = ?state, "zone registration changed through the API");
    changed.insert(zone.clone());
    if let Some((ending, ids)) = recorded.ending {
        for id in ids {
            if let Some(notices) = streams.get(&id) {
                let _ = notices.send(Notice::Ending(ending));
            }
        }
    }
    if let Some(stream) = recorded.released {
        step.released.push((zone, stream));
    }
}

/// What the other instances must hear of `pending`, from the hub as it
/// stands after the batch.
fn outgoing(hub: &Hub, pending: BTreeMap<String, Pending>, at: Timestamp) -> Vec<Outgoing> {
    let mut out = Vec::new();
    for (zone, p) in pending {
        let Some(remote) = hub.remote(&zone) else {
            continue;
        };
        let shared = remote.shared();
        let dataplanes = |ids: &BTreeSet<DataplaneId>| {
            ids.iter()
                .map(|id| (id.clone(), shared.get(id).cloned()))
                .collect::<Vec<_>>()
        };
        if let Some(last) = p.ended {
            let stream = last.stream;
            out.push(Outgoing {
                zone: zone.clone(),
                stream,
                change: if p.claimed == Some(stream) {
                    shared::Change::Claim(last)
                } else {
                    shared::Change::Update(last)
                },
                dataplanes: dataplanes(&p.changed),
                at,
            });
            out.push(Outgoing {
                zone: zone.clone(),
                stream,
                change: shared::Change::Release,
                dataplanes: Vec::new(),
                at,
            });
        }
        if let Some(link) = remote.own_link() {
            if p.touched || p.claimed.is_some() || !p.changed.is_empty() {
                let stream = link.stream;
                out.push(Outgoing {
                    zone,
                    stream,
                    change: if p.claimed == Some(stream) {
                        shared::Change::Claim(link)
                    } else {
                        shared::Change::Update(link)
                    },
                    dataplanes: dataplanes(&p.changed),
                    at,
                });
            }
        }
    }
    out
}

/// Applies what the ledger read or found.
fn observe(
    hub: &mut Hub,
    streams: &HashMap<StreamId, mpsc::UnboundedSender<Notice>>,
    changed: &mut BTreeSet<String>,
    step: &mut Step,
    report: Report,
) {
    match report {
        Report::Registrations(records) => {
            for r in records {
                record(hub, streams, changed, step, r);
            }
        }
        Report::Observed { zones, all } => {
            for z in zones {
                let (_, moved) = hub.observe(&z.zone, z.link, z.dataplanes, all);
                if moved {
                    changed.insert(z.zone);
                }
            }
        }
        Report::Lost {
            zone,
            stream,
            holder,
        } => {
            if hub.lost(&zone, stream) {
                changed.insert(zone.clone());
                if let Some(notices) = streams.get(&stream) {
                    let (epoch, instance) =
                        holder.unwrap_or((0, "another instance of the global".to_string()));
                    let _ = notices.send(Notice::Superseded { epoch, instance });
                }
            }
        }
    }
}

fn handle(
    hub: &mut Hub,
    streams: &mut HashMap<StreamId, mpsc::UnboundedSender<Notice>>,
    changed: &mut BTreeSet<String>,
    pending: &mut BTreeMap<String, Pending>,
    step: &mut Step,
    command: Command,
    clock: &dyn Clock,
) {
    match command {
        Command::Open {
            zone,
            notices,
            reply,
        } => {
            let stream = hub.open_stream(&zone);
            streams.insert(stream, notices);
            let _ = reply.send((stream, hub.registration(&zone)));
        }
        Command::Record { record: r, reply } => {
            let zone = r.zone.clone();
            record(hub, streams, changed, step, r);
            step.replies.push((zone, reply));
        }
        Command::Claim {
            zone,
            stream,
            epoch,
            instance,
            peer,
            meshes,
            reply,
        } => {
            let claim = hub.claim_from(&zone, stream, epoch, &instance, peer, &meshes, clock.now());
            if let Claim::Won {
                replaced, pruned, ..
            } = &claim
            {
                let p = pending.entry(zone.clone()).or_default();
                p.claimed = Some(stream);
                p.changed.extend(pruned.iter().map(applied_id));
                if let Some(old) = replaced.and_then(|old| streams.get(&old)) {
                    let _ = old.send(Notice::Superseded {
                        epoch,
                        instance: instance.clone(),
                    });
                }
                if !pruned.is_empty() {
                    changed.insert(zone.clone());
                }
            }
            let _ = reply.send(claim);
        }
        Command::Apply {
            zone,
            stream,
            actions,
        } => {
            if hub.is_revoked(stream) {
                // Its zone was deleted: nothing it says counts.
                return;
            }
            let mut moved = false;
            let p = pending.entry(zone.clone()).or_default();
            for action in &actions {
                let holder = hub.remote(&zone).and_then(|r| r.own_link());
                if matches!(action, Action::End { .. }) {
                    if let Some(link) = holder.filter(|l| l.stream == stream) {
                        p.ended = Some(link);
                    }
                } else if holder.is_some_and(|l| l.stream == stream) {
                    p.touched = true;
                }
                let applied: Vec<Applied> = hub.apply(&zone, stream, action);
                moved |= !applied.is_empty();
                p.changed.extend(applied.iter().map(applied_id));
            }
            if moved {
                changed.insert(zone);
            }
        }
        Command::Gone { stream } => {
            streams.remove(&stream);
            hub.close_stream(stream);
        }
    }
}

fn applied_id(a: &Applied) -> DataplaneId {
    match a {
        Applied::Changed(id) | Applied::Deleted(id) => id.clone(),
    }
}

/// The `ZoneSyncService` of the global's zone listener.
#[derive(Debug, Clone)]
pub struct ZoneSyncServer {
    hub: HubHandle,
    gate: Arc<Gate>,
    /// `global.certificate_meshes`: zones known by their certificate, and
    /// the meshes each may sync.
    certificate_meshes: Arc<BTreeMap<String, Vec<String>>>,
    settings: Arc<SessionSettings>,
    clock: Arc<dyn Clock>,
    drain: watch::Receiver<bool>,
    /// Refusals are logged at most [`REFUSAL_LOG`] lines per address (the
    /// counter counts every one), as on the HDS listener.
    log: Arc<SharedLogLimiter>,
}

impl ZoneSyncServer {
    /// Streams judged by `settings`, their tokens verified by `gate`, until `drain`.
    pub fn new(
        hub: HubHandle,
        gate: Arc<Gate>,
        settings: SessionSettings,
        clock: Arc<dyn Clock>,
        drain: watch::Receiver<bool>,
    ) -> ZoneSyncServer {
        ZoneSyncServer {
            hub,
            gate,
            certificate_meshes: Arc::default(),
            settings: Arc::new(settings),
            clock,
            drain,
            log: Arc::new(SharedLogLimiter::new(REFUSAL_LOG)),
        }
    }

    /// Counts a refused stream (every one, by `reason`) and says whether to
    /// log it: `Some(suppressed)`, the lines left out for `peer` since its
    /// last one, at most [`REFUSAL_LOG`] lines per address.
    fn refused(&self, peer: Option<SocketAddr>, reason: &'static str) -> Option<u64> {
        crate::metrics::zone_refused(reason);
        self.log
            .allow(peer.map(|p| p.ip()), tokio::time::Instant::now())
    }

    /// Accepts zones known by their client certificate, each syncing the
    /// meshes `certificate_meshes` gives it (`global.certificate_meshes`).
    pub fn with_certificate_meshes(
        mut self,
        certificate_meshes: BTreeMap<String, Vec<String>>,
    ) -> ZoneSyncServer {
        self.certificate_meshes = Arc::new(certificate_meshes);
        self
    }

    /// The zone a verified client certificate names, or the status that
    /// refuses it.
    fn certificate_credential(
        &self,
        der: &[u8],
        peer: Option<SocketAddr>,
    ) -> Result<(ZoneCredential, Option<Timestamp>), Status> {
        let named = zone_of(der).map_err(|problem| {
            if let Some(suppressed) = self.refused(peer, "bad_certificate") {
                tracing::warn!(peer = %shown_peer(peer), suppressed, "zone stream refused: {problem}");
            }
            Status::permission_denied(problem.to_string())
        })?;
        let zone = named.zone;
        let Some(meshes) = certificate::meshes_for(&self.certificate_meshes, &zone) else {
            if let Some(suppressed) = self.refused(peer, "no_certificate_meshes") {
                tracing::warn!(peer = %shown_peer(peer), suppressed, zone, "zone stream refused: its certificate names it, but global.certificate_meshes has no entry for it");
            }
            return Err(Status::permission_denied(format!(
                "the client certificate names zone {zone:?}, but the global's global.certificate_meshes lists no meshes for it: add {zone} = [\"MESH\"] to [global.certificate_meshes] in the global's configuration and restart the global"
            )));
        };
        Ok((
            ZoneCredential {
                zone,
                meshes: Meshes::Only(meshes.iter().cloned().collect()),
                issued_at: Some(named.not_before),
            },
            Some(named.not_after),
        ))
    }

    /// The tonic service, with the message size limit.
    pub fn into_server(self) -> pb::zone_sync_service_server::ZoneSyncServiceServer<Self> {
        pb::zone_sync_service_server::ZoneSyncServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The zone a stream's token names, or the status that refuses it.
    fn credential(
        &self,
        token: &str,
        peer: Option<SocketAddr>,
    ) -> Result<(ZoneCredential, Option<Timestamp>), Status> {
        let claims = self
            .gate
            .verify(token, self.clock.now())
            .map_err(|rejection| {
                if let Some(suppressed) = self.refused(peer, "unauthenticated") {
                    tracing::warn!(peer = %shown_peer(peer), suppressed, %rejection, detail = %rejection.detail(), "zone stream refused");
                }
                crate::grpc_auth::status(&rejection)
            })?;
        let expires = claims.expires_at();
        let issued_at = claims.issued_at();
        let Some(zone) = claims.zone else {
            if let Some(suppressed) = self.refused(peer, "not_a_zone_token") {
                tracing::warn!(peer = %shown_peer(peer), suppressed, token = %claims.identity(), "zone stream refused: a dataplane token, not a zone token");
            }
            return Err(Status::permission_denied(format!(
                "the token is a dataplane token (for {}); a zone dials with a zone token: run `hdsd token issue --zone NAME --mesh MESH` on the global and put it in the zone's zone.token_file",
                claims.identity()
            )));
        };
        if let Err(problem) = crate::names::check_zone(&zone) {
            if let Some(suppressed) = self.refused(peer, "invalid_zone") {
                tracing::warn!(peer = %shown_peer(peer), suppressed, zone = crate::names::shown(&zone), "zone stream refused: {problem}");
            }
            return Err(Status::permission_denied(format!(
                "the zone token names zone {}, which breaks the zone naming rule ({problem}); issue a new one",
                crate::names::shown(&zone)
            )));
        }
        Ok((
            ZoneCredential {
                zone,
                meshes: Meshes::Only(claims.meshes.into_iter().collect()),
                issued_at,
            },
            expires,
        ))
    }
}

/// A peer's address as the log shows it (empty when unknown).
fn shown_peer(peer: Option<SocketAddr>) -> String {
    peer.map(|p| p.to_string()).unwrap_or_default()
}

type SyncStream = Pin<Box<dyn Stream<Item = Result<pb::GlobalMessage, Status>> + Send>>;

#[tonic::async_trait]
impl pb::zone_sync_service_server::ZoneSyncService for ZoneSyncServer {
    type SyncStream = SyncStream;

    async fn sync(
        &self,
        request: Request<Streaming<pb::ZoneMessage>>,
    ) -> Result<Response<SyncStream>, Status> {
        // The TLS handshake verified the chain against global.tls.client_ca.
        let certificate = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.to_vec()));
        let peer = request.remote_addr();
        let (credential, expires, token) = match crate::grpc_auth::token_from_metadata(
            request.metadata(),
        ) {
            Ok(token) => {
                let (credential, expires) = self.credential(&token, peer)?;
                if let Some(Ok(named)) = certificate.as_deref().map(zone_of) {
                    if named.zone != credential.zone {
                        if let Some(suppressed) = self.refused(peer, "credentials_disagree") {
                            tracing::warn!(peer = %shown_peer(peer), suppressed, zone = credential.zone, certificate = named.zone, "zone stream refused: its token and its certificate name different zones");
                        }
                        return Err(Status::permission_denied(format!(
                                "the zone token names zone {:?} but the client certificate names zone {:?}: a zone shows one identity; fix zone.token_file or zone.cert",
                                credential.zone, named.zone
                            )));
                    }
                }
                (credential, expires, Some(token))
            }
            Err(crate::auth::Rejection::Missing) if certificate.is_some() => {
                let der = certificate.as_deref().unwrap_or_default();
                let (credential, expires) = self.certificate_credential(der, peer)?;
                (credential, expires, None)
            }
            Err(r) => {
                if let Some(suppressed) = self.refused(peer, "unauthenticated") {
                    tracing::warn!(peer = %shown_peer(peer), suppressed, reason = r.reason(), "zone stream refused: {}", r.detail());
                }
                return Err(crate::grpc_auth::status(&r));
            }
        };
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let task = StreamTask {
            server: self.clone(),
            peer,
            token,
            credential,
            expires,
            inbound: request.into_inner(),
            out,
        };
        tokio::spawn(task.run());
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One zone stream: its session, the transport, the hub.
struct StreamTask {
    server: ZoneSyncServer,
    /// The zone's address, when the transport knows it.
    peer: Option<SocketAddr>,
    /// The zone token; `None` for a zone known by its certificate.
    token: Option<String>,
    credential: ZoneCredential,
    /// When the zone token (or certificate) expires: the stream ends then.
    expires: Option<Timestamp>,
    inbound: Streaming<pb::ZoneMessage>,
    out: mpsc::Sender<Result<pb::GlobalMessage, Status>>,
}

impl StreamTask {
    async fn run(mut self) {
        let zone = self.credential.zone.clone();
        let hub = self.server.hub.clone();
        let clock = self.server.clock.clone();
        let (notices_tx, mut notices) = mpsc::unbounded_channel();
        let Some((stream, admission)) = hub
            .ask(|reply| Command::Open {
                zone: zone.clone(),
                notices: notices_tx,
                reply,
            })
            .await
        else {
            let _ = self
                .out
                .send(Err(Status::unavailable("the global is shutting down")))
                .await;
            return;
        };
        let mut session = Session::new(
            self.server.settings.clone(),
            self.credential.clone(),
            admission,
            clock.now(),
        );
        let mut drain = self.server.drain.clone();
        let mut keys = self.server.gate.subscribe();
        let mut pending: VecDeque<Event> = VecDeque::new();
        while !session.is_ended() {
            let event = match pending.pop_front() {
                Some(event) => event,
                None => {
                    let sleep = session
                        .deadline()
                        .map(|d| super::until(d, clock.now()))
                        .unwrap_or(Duration::from_secs(3600));
                    tokio::select! {
                        m = self.inbound.message() => match m {
                            Ok(Some(m)) => Event::Received(vec![m]),
                            Ok(None) => Event::Closed { error: None },
                            Err(status) => Event::Closed { error: Some(status.message().to_string()) },
                        },
                        Some(notice) = notices.recv() => notice.event(),
                        () = tokio::time::sleep(sleep) => Event::Tick,
                        () = super::drained(&mut drain) => Event::Drain,
                        () = tokio::time::sleep(self.expires.map_or(Duration::from_secs(86_400 * 365), |e| super::until(e, clock.now()))) => {
                            let message = match self.token {
                                Some(_) => format!("the zone token expired; issue a new one on the global with `hdsd token issue --zone {zone} --mesh MESH` and write it to zone.token_file (the zone reads it at every connect)"),
                                None => format!("the zone's client certificate expired; issue a new one (URI SAN {}{zone}) and write it to zone.cert and zone.key (the zone reads them at every connect)", certificate::URI_PREFIX),
                            };
                            tracing::warn!(zone, "{message}; ending its stream");
                            crate::metrics::zone_refused(if self.token.is_some() { "token_expired" } else { "certificate_expired" });
                            let _ = self.out.send(Err(Status::unauthenticated(message))).await;
                            self.expires = None;
                            pending.push_back(Event::Closed { error: Some("token expired".into()) });
                            continue;
                        }
                        Ok(()) = keys.changed() => {
                            let Some(token) = &self.token else { continue };
                            if let Err(status) = self.server.credential(token, self.peer) {
                                tracing::warn!(zone, "zone token no longer verifies; ending its stream");
                                let _ = self.out.send(Err(status)).await;
                                pending.push_back(Event::Closed { error: Some("token revoked".into()) });
                            }
                            continue;
                        }
                    }
                }
            };
            let mut actions = Vec::new();
            session.handle(event, clock.now(), &mut actions);
            let mut to_hub = Vec::new();
            for action in actions {
                match action {
                    Action::Send(message) => {
                        if let Some(pb::global_message::Kind::Refused(r)) = &message.kind {
                            crate::metrics::zone_refused(&r.code);
                            tracing::warn!(zone, code = %r.code, "{}", r.message);
                        }
                        // A transport that is gone shows as Closed next.
                        let _ = self.out.send(Ok(message)).await;
                    }
                    Action::Claim { epoch, instance } => {
                        if !to_hub.is_empty() {
                            self.apply(&hub, stream, std::mem::take(&mut to_hub)).await;
                        }
                        let claim = hub
                            .ask(|reply| Command::Claim {
                                zone: zone.clone(),
                                stream,
                                epoch,
                                instance,
                                peer: self.peer.map(|p| p.ip()),
                                meshes: self.credential.meshes.clone(),
                                reply,
                            })
                            .await;
                        // What the hub told this stream before it answered
                        // (its zone disabled or deleted) comes first.
                        while let Ok(notice) = notices.try_recv() {
                            pending.push_back(notice.event());
                        }
                        pending.push_back(match claim {
                            Some(Claim::Won { resume_from, .. }) => Event::Claimed { resume_from },
                            Some(Claim::Lost { epoch, instance }) => {
                                Event::ClaimLost { epoch, instance }
                            }
                            Some(Claim::Contested {
                                holder,
                                claimant,
                                contests,
                            }) => Event::Contested {
                                holder,
                                claimant,
                                contests,
                            },
                            None => Event::Drain,
                        });
                    }
                    Action::End { code, reason } => {
                        log_end(&zone, code, &reason);
                        to_hub.push(Action::End { code, reason });
                    }
                    Action::Connected(at) => {
                        if let Some((epoch, instance)) = session.uplink() {
                            tracing::info!(zone, epoch, instance, "zone connected");
                        }
                        to_hub.push(Action::Connected(at));
                    }
                    other => to_hub.push(other),
                }
            }
            if !to_hub.is_empty() {
                self.apply(&hub, stream, to_hub).await;
            }
        }
        let _ = hub.commands.send(Command::Gone { stream }).await;
    }

    async fn apply(&self, hub: &HubHandle, stream: StreamId, actions: Vec<Action>) {
        let _ = hub
            .commands
            .send(Command::Apply {
                zone: self.credential.zone.clone(),
                stream,
                actions,
            })
            .await;
    }
}

/// One line per ended stream: a warning when the zone must do something.
fn log_end(zone: &str, code: Code, reason: &str) {
    match code {
        Code::StreamClosed | Code::ShuttingDown | Code::Superseded => {
            tracing::info!(zone, code = code.as_str(), "zone stream ended: {reason}")
        }
        _ => tracing::warn!(zone, code = code.as_str(), "zone stream ended: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::zones::hub::RecordState;
    use crate::zones::session::{DisabledBy, Registration};

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn record(state: RecordState, seq: i64) -> ZoneRecord {
        ZoneRecord {
            zone: "eu-1".into(),
            state,
            tokens_not_before: (state == RecordState::Deleted).then(t0),
            changed_at: t0(),
            seq,
        }
    }

    /// The hub task answers an API write once readers see it, tells the
    /// zone's open streams to end when it is disabled or deleted, and a
    /// deleted zone leaves the published view (time paused: no real wait).
    #[tokio::test(start_paused = true)]
    async fn the_hub_task_applies_api_records_and_tells_the_zones_streams() {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(t0()));
        let hub = spawn_hub(
            HubSettings {
                zone_timeout: Duration::from_secs(15),
                offline_ttl: Duration::from_secs(300),
                auto_register: false,
            },
            &[],
            &[],
            Vec::new(),
            None,
            clock,
        );
        assert!(hub.view().get("eu-1").is_none());
        let added = hub
            .record(record(RecordState::Registered, 1))
            .await
            .expect("registered");
        assert_eq!(added.registered_by, Some("api"));
        assert!(
            hub.view().get("eu-1").is_some(),
            "published before the answer"
        );
        let (notices_tx, mut notices) = mpsc::unbounded_channel();
        let (_stream, admission) = hub
            .ask(|reply| Command::Open {
                zone: "eu-1".into(),
                notices: notices_tx,
                reply,
            })
            .await
            .expect("opened");
        assert_eq!(admission.registration, Registration::Registered);
        let disabled = hub
            .record(record(RecordState::Disabled, 2))
            .await
            .expect("still there");
        assert_eq!(disabled.liveness.state.as_str(), "disabled");
        assert_eq!(
            notices.recv().await,
            Some(Notice::Ending(Ending::Disabled(DisabledBy::Api)))
        );
        assert_eq!(hub.record(record(RecordState::Deleted, 3)).await, None);
        assert_eq!(notices.recv().await, Some(Notice::Ending(Ending::Deleted)));
        assert!(hub.view().get("eu-1").is_none());
        // Older news (a late read of the store) changes nothing.
        assert_eq!(hub.record(record(RecordState::Registered, 1)).await, None);
        assert!(hub.view().get("eu-1").is_none());
    }
}
