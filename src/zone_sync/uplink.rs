//! The zone's side of zone sync: one task dials the global and keeps one
//! stream to it, driving an [`Uplink`] with the change feed.
//!
//! - The URLs of `zone.global` are tried in turn, the next one after each
//!   failure, with exponential backoff and full jitter between attempts
//!   ([`Backoff`]); a refusal the zone cannot fix by retrying (an
//!   unregistered or disabled zone, a version the global does not accept)
//!   waits the backoff's longest delay.
//! - The zone token is read from `zone.token_file` at every connect (so a
//!   renewed token is used without a restart) and sent as gRPC metadata
//!   `authorization: Bearer <token>`.
//! - The feed's messages become [`Event`]s: each dataplane is read from the
//!   registry when its change arrives and sent as `hdsd.v1.Dataplane`, its
//!   revision the change's.
//! - It dials only while this instance holds the zone's uplink lease
//!   ([`crate::cluster::lease`], [`crate::cluster::lease::UPLINK`]), with the lease's epoch, and
//!   ends its stream at once when the lease goes (another instance took it
//!   over, or it could not be confirmed): with several instances of a zone
//!   on PostgreSQL, exactly one dials. The others stand by ([`State::Standby`])
//!   and name the holder. Alone, an instance always holds the lease. At a
//!   graceful shutdown the stream ends first, then the lease is given up, so
//!   another instance takes it over at once.
//! - How the link stands ([`UplinkStatus`]) is published on a watch channel
//!   for `/readyz`, the API and the metrics.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::clock::{Clock, Timestamp};
use crate::cluster::lease::{LeaseHandle, LeaseStatus};
use crate::consumers::grpc::to_pb;
use crate::feed::{ChangeKind, Event as FeedEvent, FeedHandle, Filter, Message};
use crate::pb;
use crate::registry::Registry;
use crate::view::DataplaneItem;
use crate::zones::backoff::Backoff;
use crate::zones::uplink::{Action, Event, Uplink, UplinkSettings};

/// How long a connection attempt to the global may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Feed messages buffered for the stream before the feed's watch falls
/// behind (and starts over with a snapshot).
const FEED_BUFFER: usize = 1024;

/// Messages buffered for the transport.
const SEND_BUFFER: usize = 64;

/// Where this instance's uplink stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Dialing (this instance holds the uplink lease), nothing failed yet.
    Connecting,
    /// The global accepted this instance's stream.
    Connected,
    /// Not connected: the last stream ended or could not open, or the
    /// uplink lease cannot be confirmed (`problem` says why).
    Disconnected,
    /// Another instance of the zone holds the uplink lease (`holder`): this
    /// one stands by and takes it over if that one stops. Healthy.
    Standby,
}

impl State {
    /// Every state, as the metrics name them.
    pub const ALL: [State; 4] = [
        State::Connecting,
        State::Connected,
        State::Disconnected,
        State::Standby,
    ];

    /// The state as the API and the metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Connected => "connected",
            State::Disconnected => "disconnected",
            State::Standby => "standby",
        }
    }
}

/// How the zone's link to the global stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UplinkStatus {
    /// The zone's name.
    pub zone: String,
    /// Where this instance's uplink stands.
    pub state: State,
    /// True while the global has accepted this instance's stream.
    pub connected: bool,
    /// The instance holding the zone's uplink lease (`<host>/<pid>`): this
    /// one while it holds it, another on a standby; absent while unknown.
    pub holder: Option<String>,
    /// The holder's lease epoch (this instance dials with it while it holds
    /// the lease).
    pub epoch: Option<u64>,
    /// The global's URL, while connected or connecting.
    pub global: Option<String>,
    /// Since when `connected` has been what it is.
    pub since: Timestamp,
    /// Why the last stream ended or could not open, and what to do.
    pub problem: Option<String>,
    /// The last stable code of a refusal or close (`zone_unregistered`, ...).
    pub code: Option<String>,
    /// Streams the global accepted since this instance started.
    pub accepted: u64,
}

impl UplinkStatus {
    /// The line `/readyz` shows (the zone serves its Envoys either way).
    pub fn readyz_line(&self) -> String {
        let since = self
            .since
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        match (&self.state, &self.global, &self.problem, &self.holder) {
            (State::Standby, _, _, Some(holder)) => format!(
                "zone {}: standby since {since}: instance {holder} holds the zone's uplink to the global (lease epoch {}); this instance takes it over if that one stops",
                self.zone,
                self.epoch.unwrap_or_default()
            ),
            (State::Connected, Some(global), _, _) => format!(
                "zone {}: connected to the global at {global} since {since}",
                self.zone,
            ),
            (_, _, Some(problem), _) => format!(
                "zone {}: not connected to the global since {since}: {problem}",
                self.zone,
            ),
            _ => format!("zone {}: connecting to the global", self.zone),
        }
    }
}

/// What the uplink task needs.
#[derive(Debug, Clone)]
pub struct UplinkOptions {
    /// The zone's name and this instance's, for the Hello.
    pub settings: UplinkSettings,
    /// The global's URLs, tried in turn.
    pub globals: Vec<String>,
    /// `zone.token_file`: `None` for a zone known by its certificate only.
    pub token_file: Option<std::path::PathBuf>,
    /// `zone.ca`, for `https://` URLs.
    pub ca: Option<std::path::PathBuf>,
    /// `zone.cert` and `zone.key`: the client certificate shown over TLS.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Reconnect delays.
    pub backoff: Backoff,
}

/// The uplink task's status, for readers.
#[derive(Debug, Clone)]
pub struct UplinkHandle {
    status: watch::Receiver<UplinkStatus>,
}

impl UplinkHandle {
    /// How the link stands now.
    pub fn status(&self) -> UplinkStatus {
        self.status.borrow().clone()
    }
}

/// Starts the uplink task: it dials while `lease` (this instance's hold on
/// the zone's uplink lease) is held, and ends when `drain` turns true,
/// giving the lease up once its stream has ended.
pub fn spawn(
    options: UplinkOptions,
    lease: LeaseHandle,
    registry: Registry,
    feed: FeedHandle,
    clock: Arc<dyn Clock>,
    drain: watch::Receiver<bool>,
) -> UplinkHandle {
    let (tx, status) = watch::channel(UplinkStatus {
        zone: options.settings.zone.clone(),
        state: State::Connecting,
        connected: false,
        holder: None,
        epoch: None,
        global: None,
        since: clock.now(),
        problem: None,
        code: None,
        accepted: 0,
    });
    publish_metrics(&status.borrow());
    let driver = Driver {
        options,
        registry,
        feed,
        clock,
        status: tx,
    };
    tokio::spawn(driver.run(drain, lease));
    UplinkHandle { status }
}

/// `hdsd_uplink_connected` and `hdsd_uplink_state` from the status.
fn publish_metrics(status: &UplinkStatus) {
    crate::metrics::uplink_connected(status.connected);
    for state in State::ALL {
        crate::metrics::uplink_state(state.as_str(), state == status.state);
    }
}

/// How one stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ended {
    code: String,
    reason: String,
    retry: bool,
}

impl Ended {
    fn retry(code: &str, reason: String) -> Ended {
        Ended {
            code: code.to_string(),
            reason,
            retry: true,
        }
    }
}

struct Driver {
    options: UplinkOptions,
    registry: Registry,
    feed: FeedHandle,
    clock: Arc<dyn Clock>,
    status: watch::Sender<UplinkStatus>,
}

impl Driver {
    async fn run(mut self, mut drain: watch::Receiver<bool>, lease: LeaseHandle) {
        let mut leases = lease.status();
        let mut backoff = self.options.backoff.clone();
        let mut attempt = 0usize;
        // The last failure logged, and how many streams were accepted then.
        let mut last: Option<(String, u64)> = None;
        loop {
            if *drain.borrow() {
                break;
            }
            let held = leases.borrow_and_update().clone();
            let Some(epoch) = held.held() else {
                self.not_holding(&held);
                tokio::select! {
                    changed = leases.changed() => {
                        if changed.is_err() {
                            // The keeper is gone: nothing will change.
                            super::drained(&mut drain).await;
                            break;
                        }
                        continue;
                    }
                    () = super::drained(&mut drain) => break,
                }
            };
            let url = self.options.globals[attempt % self.options.globals.len()].clone();
            attempt += 1;
            let instance = self.options.settings.instance.clone();
            self.update(|s| {
                if s.state == State::Standby || (s.epoch != Some(epoch) && !s.connected) {
                    s.state = State::Connecting;
                    s.problem = None;
                    s.code = None;
                }
                s.holder = Some(instance);
                s.epoch = Some(epoch);
                s.global = Some(url.clone());
            });
            let ended = tokio::select! {
                ended = self.stream(&url, epoch, &mut backoff) => ended,
                () = crate::cluster::lease::moved(&mut leases, epoch) => Ended::retry(
                    LEASE_LOST,
                    format!(
                        "this instance no longer holds the zone's uplink lease (epoch {epoch}); it ended its stream"
                    ),
                ),
                () = super::drained(&mut drain) => break,
            };
            backoff.disconnected(self.clock.now());
            crate::metrics::uplink_ended(&ended.code);
            let zone = &self.options.settings.zone;
            let now = self.clock.now();
            if ended.code == LEASE_LOST {
                // Not a failure: the instance holding the lease now dials.
                tracing::info!(zone, global = url, epoch, "zone uplink: {}", ended.reason);
                self.update(|s| {
                    s.connected = false;
                    s.since = now;
                });
                continue;
            }
            let delay = if ended.retry {
                backoff.next_delay_with(&mut rand::thread_rng())
            } else {
                backoff.cap()
            };
            let wait = humantime::format_duration(Duration::from_millis(delay.as_millis() as u64));
            // One line per change: the same failure again is debug only.
            let accepted = self.status.borrow().accepted;
            let again = last.as_ref() == Some(&(ended.code.clone(), accepted));
            last = Some((ended.code.clone(), accepted));
            if again {
                tracing::debug!(
                    zone,
                    global = url,
                    code = ended.code,
                    "zone uplink: {}; retrying in {wait}",
                    ended.reason
                );
            } else if ended.retry {
                tracing::warn!(
                    zone,
                    global = url,
                    code = ended.code,
                    "zone uplink: {}; retrying in {wait}",
                    ended.reason
                );
            } else {
                tracing::error!(
                    zone,
                    global = url,
                    code = ended.code,
                    "zone uplink refused: {}; retrying in {wait}",
                    ended.reason
                );
            }
            self.update(|s| {
                if s.connected || s.problem.is_none() {
                    s.since = now;
                }
                s.state = State::Disconnected;
                s.connected = false;
                s.problem = Some(ended.reason.clone());
                s.code = Some(ended.code.clone());
            });
            // A change of the lease ends the wait: one lost stands by at
            // once, a new epoch dials at once.
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = crate::cluster::lease::moved(&mut leases, epoch) => {}
                () = super::drained(&mut drain) => break,
            }
        }
        // The stream (if any) has ended: hand the uplink over.
        lease.release().await;
    }

    /// Applies `change` to the status and publishes the metrics.
    fn update(&self, change: impl FnOnce(&mut UplinkStatus)) {
        self.status.send_modify(change);
        publish_metrics(&self.status.borrow());
    }

    /// This instance does not hold the uplink lease: stand by while another
    /// instance holds it, or say why nobody can tell. One log line per change.
    fn not_holding(&self, lease: &LeaseStatus) {
        let zone = &self.options.settings.zone;
        let now = self.clock.now();
        let before = self.status.borrow().clone();
        match lease {
            // Held, but past its confirmed end (the process was stopped, or
            // the store is slow): another instance may hold it by now.
            LeaseStatus::Held { epoch, .. } => self.lease_unconfirmed(
                &before,
                &format!(
                    "the uplink lease (epoch {epoch}) reached its end before this instance could confirm it (was the process stopped, or is the store slow?); it does not dial until the store says it still holds it"
                ),
                now,
            ),
            LeaseStatus::Unknown => self.update(|s| {
                if s.state != State::Connecting {
                    s.state = State::Connecting;
                    s.since = now;
                }
                s.connected = false;
                s.global = None;
            }),
            LeaseStatus::Elsewhere { holder, epoch } => {
                if before.state != State::Standby || before.holder.as_ref() != Some(holder) {
                    tracing::info!(
                        zone,
                        holder,
                        epoch,
                        "zone uplink: standing by: instance {holder} holds the zone's uplink to the global; this instance takes it over if that one stops"
                    );
                }
                self.update(|s| {
                    if s.state != State::Standby {
                        s.since = now;
                    }
                    s.state = State::Standby;
                    s.connected = false;
                    s.holder = Some(holder.clone());
                    s.epoch = Some(*epoch);
                    s.global = None;
                    s.problem = None;
                    s.code = None;
                });
            }
            LeaseStatus::Unconfirmed { problem } => self.lease_unconfirmed(&before, problem, now),
        }
    }

    /// The lease cannot be confirmed (`problem` says why): disconnected,
    /// nobody known to hold the uplink; one log line per problem.
    fn lease_unconfirmed(&self, before: &UplinkStatus, problem: &str, now: Timestamp) {
        let zone = &self.options.settings.zone;
        if before.problem.as_deref() != Some(problem) {
            tracing::warn!(zone, code = LEASE_UNCONFIRMED, "zone uplink: {problem}");
        }
        self.update(|s| {
            if s.state != State::Disconnected || s.connected {
                s.since = now;
            }
            s.state = State::Disconnected;
            s.connected = false;
            s.holder = None;
            s.epoch = None;
            s.global = None;
            s.problem = Some(problem.to_string());
            s.code = Some(LEASE_UNCONFIRMED.to_string());
        });
    }

    /// One stream to `url`, until it ends.
    async fn stream(&mut self, url: &str, epoch: u64, backoff: &mut Backoff) -> Ended {
        let zone = self.options.settings.zone.clone();
        let token = match self.token() {
            Ok(token) => token,
            Err(ended) => return ended,
        };
        let channel = match self.connect(url).await {
            Ok(channel) => channel,
            Err(mut reason) => {
                if self.options.identity.is_some() {
                    reason.push_str(CERTIFICATE_HINT);
                }
                return Ended::retry("connect_failed", reason);
            }
        };
        let mut client = pb::zone_sync_service_client::ZoneSyncServiceClient::new(channel)
            .max_decoding_message_size(super::global::MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel(SEND_BUFFER);
        let mut machine = Uplink::new(self.options.settings.clone(), epoch);
        let mut feed: Option<mpsc::Receiver<Message>> = None;
        let mut actions = Vec::new();
        machine.handle(Event::Opened, self.clock.now(), &mut actions);
        if let Some(ended) = self.perform(&mut actions, &tx, &mut feed, backoff).await {
            return ended;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert(crate::grpc_auth::AUTHORIZATION, token);
        }
        let mut inbound = match client.sync(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                let mut ended =
                    refused_by_transport(&zone, self.options.token_file.is_some(), &status);
                if self.options.identity.is_some() && ended.code == "stream_failed" {
                    // TLS 1.3: a refused client certificate shows here, after
                    // the handshake seemed to complete.
                    ended.reason.push_str(CERTIFICATE_HINT);
                }
                return ended;
            }
        };
        loop {
            let sleep = machine
                .deadline()
                .map(|d| super::until(d, self.clock.now()))
                .unwrap_or(Duration::from_secs(3600));
            let event = tokio::select! {
                m = inbound.message() => match m {
                    Ok(Some(m)) => Event::Received(m),
                    Ok(None) => Event::Closed { error: None },
                    Err(status) => {
                        if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) {
                            return refused_by_transport(&zone, self.options.token_file.is_some(), &status);
                        }
                        Event::Closed { error: Some(crate::names::message(status.message())) }
                    }
                },
                Some(message) = next(&mut feed) => match self.feed_event(message) {
                    Some(event) => event,
                    None => continue,
                },
                () = tokio::time::sleep(sleep) => Event::Tick,
            };
            machine.handle(event, self.clock.now(), &mut actions);
            if let Some(ended) = self.perform(&mut actions, &tx, &mut feed, backoff).await {
                return ended;
            }
        }
    }

    /// The zone token as metadata, read from `zone.token_file` now (so a
    /// replaced token is used at the next connect); `None` without a file
    /// (the zone is known by its certificate).
    fn token(&self) -> Result<Option<tonic::metadata::AsciiMetadataValue>, Ended> {
        let zone = &self.options.settings.zone;
        let Some(file) = &self.options.token_file else {
            return Ok(None);
        };
        let missing = |what: String| {
            Ended::retry(
                "token_missing",
                format!("{what}; on the global, run `hdsd token issue --zone {zone} --mesh MESH` and write the token there"),
            )
        };
        let token = match std::fs::read_to_string(file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => {
                return Err(missing(format!(
                    "zone.token_file {} is empty",
                    file.display()
                )))
            }
            Err(e) => {
                return Err(missing(format!(
                    "cannot read zone.token_file {}: {e}",
                    file.display()
                )))
            }
        };
        format!("Bearer {token}").parse().map(Some).map_err(|_| {
            Ended::retry(
                "token_malformed",
                format!(
                    "zone.token_file {} holds characters a token cannot have; issue a new one with `hdsd token issue --zone {zone}`",
                    file.display()
                ),
            )
        })
    }

    async fn connect(&self, url: &str) -> Result<tonic::transport::Channel, String> {
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("zone.global {url:?} is not a URL ({e}); write it as http://HOST:PORT or https://HOST:PORT"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &self.options.ca {
                let pem = std::fs::read(ca).map_err(|e| {
                    format!("cannot read zone.ca {}: {e}; point it at the PEM file of the CA that signed the global's certificate", ca.display())
                })?;
                tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            }
            if let Some((cert, key)) = &self.options.identity {
                let read = |setting: &str, path: &std::path::Path| {
                    std::fs::read(path).map_err(|e| {
                        format!("cannot read {setting} {}: {e}; point it at the zone's client certificate and key (PEM, URI SAN hdsd://zone/NAME)", path.display())
                    })
                };
                tls = tls.identity(Identity::from_pem(
                    read("zone.cert", cert)?,
                    read("zone.key", key)?,
                ));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("cannot set up TLS for {url}: {e}"))?;
        }
        endpoint.connect().await.map_err(|e| {
            format!(
                "cannot connect to the global at {url}: {}; check that the global runs with [global] enabled and that global.listen is reachable from this zone",
                error_chain(&e)
            )
        })
    }

    /// Does what the machine asked; `Some` when the stream ends.
    async fn perform(
        &mut self,
        actions: &mut Vec<Action>,
        tx: &mpsc::Sender<pb::ZoneMessage>,
        feed: &mut Option<mpsc::Receiver<Message>>,
        backoff: &mut Backoff,
    ) -> Option<Ended> {
        for action in actions.drain(..) {
            match action {
                Action::Send(message) => {
                    if tx.send(message).await.is_err() {
                        return Some(Ended::retry(
                            "stream_closed",
                            "the stream to the global closed".to_string(),
                        ));
                    }
                }
                Action::Connected => {
                    let now = self.clock.now();
                    backoff.connected(now);
                    tracing::info!(
                        zone = self.options.settings.zone,
                        epoch = self.status.borrow().epoch,
                        "zone uplink accepted by the global"
                    );
                    self.update(|s| {
                        s.state = State::Connected;
                        s.connected = true;
                        s.since = now;
                        s.problem = None;
                        s.code = None;
                        s.accepted += 1;
                    });
                }
                Action::Subscribe { since } => {
                    *feed = Some(crate::consumers::watch::watch(
                        self.feed.clone(),
                        Filter::default(),
                        since,
                        FEED_BUFFER,
                    ));
                }
                Action::Acknowledged { lags } => crate::metrics::uplink_sync_lags(&lags),
                Action::Problem { code, message } => {
                    tracing::warn!(
                        zone = self.options.settings.zone,
                        code,
                        "the global left part of this zone out: {message}"
                    );
                }
                Action::Close {
                    code,
                    reason,
                    retry,
                } => {
                    return Some(Ended {
                        code,
                        reason,
                        retry,
                    })
                }
            }
        }
        None
    }

    /// One feed message as the machine's event (`None`: nothing to send).
    fn feed_event(&self, message: Message) -> Option<Event> {
        Some(match message {
            Message::Snapshot { revision, items } => Event::FeedSnapshot {
                revision,
                items: items.iter().filter_map(|e| self.dataplane(e)).collect(),
            },
            Message::Synced { revision } => Event::FeedSynced { revision },
            Message::Event(e) => match e.kind {
                ChangeKind::Changed => Event::FeedChange(self.dataplane(&e)?),
                ChangeKind::Deleted => {
                    // Its watch takes this hdsd's own dataplanes only.
                    let id = &e.local()?.id;
                    Event::FeedDeleted {
                        mesh: id.mesh.clone(),
                        name: id.name.clone(),
                        revision: e.revision,
                    }
                }
            },
            Message::Resync(reason) => Event::FeedResync {
                reason: reason.as_str().to_string(),
            },
        })
    }

    /// The dataplane of a feed event as the zone sends it, read from the
    /// registry now (`None` when it is gone: its deletion follows).
    fn dataplane(&self, e: &FeedEvent) -> Option<pb::Dataplane> {
        let state = self.registry.get(&e.local()?.id)?.state();
        let item = DataplaneItem::from_state(&state)?;
        let mut dp = to_pb(&item, e.revision);
        // Where other proxies reach each inbound: the global serves it over EDS.
        if let Some(defined) = &state.defined {
            for inbound in &mut dp.inbounds {
                if let Some(d) = defined
                    .dataplane
                    .inbounds
                    .iter()
                    .find(|d| u32::from(d.port) == inbound.port)
                {
                    inbound.address = d.address.to_string();
                }
            }
        }
        Some(dp)
    }
}

/// Added to a failed connect or stream of a zone with `zone.cert`.
const CERTIFICATE_HINT: &str = "; zone.cert is set: a global that does not trust the certificate (not signed by the CA in its global.tls.client_ca) ends the connection this way, and its log says `TLS handshake failed`";

/// The code of a stream this instance ended because it lost the uplink lease.
pub const LEASE_LOST: &str = "lease_lost";

/// The code of an uplink that waits because the lease cannot be confirmed.
pub const LEASE_UNCONFIRMED: &str = "lease_unconfirmed";

async fn next(feed: &mut Option<mpsc::Receiver<Message>>) -> Option<Message> {
    match feed {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// A stream the global's gRPC layer refused (before any message): a bad
/// token cannot be fixed by retrying soon.
fn refused_by_transport(zone: &str, by_token: bool, status: &tonic::Status) -> Ended {
    // The global's text: escaped and cut before it reaches a line.
    let message = crate::names::message(status.message());
    match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => Ended {
            code: "unauthenticated".to_string(),
            reason: if by_token {
                format!(
                    "the global refused the zone token: {message}; issue a new one on the global with `hdsd token issue --zone {zone} --mesh MESH` and write it to zone.token_file"
                )
            } else {
                format!(
                    "the global refused the zone's client certificate (zone.cert): {message}"
                )
            },
            retry: false,
        },
        tonic::Code::Unimplemented => Ended {
            code: "not_a_global".to_string(),
            reason: "the peer does not serve zone sync; point zone.global at a global's global.listen (an hdsd with [global] enabled)".to_string(),
            retry: false,
        },
        _ => Ended::retry(
            "stream_failed",
            format!("the stream to the global failed: {message}"),
        ),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
