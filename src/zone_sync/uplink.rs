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
//! - How the link stands ([`UplinkStatus`]) is published on a watch channel
//!   for `/readyz`, the API and the metrics.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::clock::{Clock, Timestamp};
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

/// How the zone's link to the global stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UplinkStatus {
    /// The zone's name.
    pub zone: String,
    /// True while the global has accepted this instance's stream.
    pub connected: bool,
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
        match (&self.connected, &self.global, &self.problem) {
            (true, Some(global), _) => format!(
                "zone {}: connected to the global at {global} since {}",
                self.zone,
                self.since
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            (_, _, Some(problem)) => format!(
                "zone {}: not connected to the global since {}: {problem}",
                self.zone,
                self.since
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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
    /// `zone.token_file`.
    pub token_file: std::path::PathBuf,
    /// `zone.ca`, for `https://` URLs.
    pub ca: Option<std::path::PathBuf>,
    /// The lease epoch this instance dials with (higher for a newer holder).
    pub epoch: u64,
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

/// Starts the uplink task; it ends when `drain` turns true.
pub fn spawn(
    options: UplinkOptions,
    registry: Registry,
    feed: FeedHandle,
    clock: Arc<dyn Clock>,
    drain: watch::Receiver<bool>,
) -> UplinkHandle {
    let (tx, status) = watch::channel(UplinkStatus {
        zone: options.settings.zone.clone(),
        connected: false,
        global: None,
        since: clock.now(),
        problem: None,
        code: None,
        accepted: 0,
    });
    crate::metrics::uplink_connected(false);
    let driver = Driver {
        options,
        registry,
        feed,
        clock,
        status: tx,
    };
    tokio::spawn(driver.run(drain));
    UplinkHandle { status }
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
    async fn run(mut self, mut drain: watch::Receiver<bool>) {
        let mut backoff = self.options.backoff.clone();
        let mut attempt = 0usize;
        // The last failure logged, and how many streams were accepted then.
        let mut last: Option<(String, u64)> = None;
        while !*drain.borrow() {
            let url = self.options.globals[attempt % self.options.globals.len()].clone();
            attempt += 1;
            self.status.send_modify(|s| s.global = Some(url.clone()));
            let ended = tokio::select! {
                ended = self.stream(&url, &mut backoff) => ended,
                () = super::drained(&mut drain) => return,
            };
            backoff.disconnected(self.clock.now());
            crate::metrics::uplink_connected(false);
            crate::metrics::uplink_ended(&ended.code);
            let delay = if ended.retry {
                backoff.next_delay_with(&mut rand::thread_rng())
            } else {
                backoff.cap()
            };
            let zone = &self.options.settings.zone;
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
            let now = self.clock.now();
            self.status.send_modify(|s| {
                if s.connected || s.problem.is_none() {
                    s.since = now;
                }
                s.connected = false;
                s.problem = Some(ended.reason.clone());
                s.code = Some(ended.code.clone());
            });
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = super::drained(&mut drain) => return,
            }
        }
    }

    /// One stream to `url`, until it ends.
    async fn stream(&mut self, url: &str, backoff: &mut Backoff) -> Ended {
        let zone = self.options.settings.zone.clone();
        let token = match std::fs::read_to_string(&self.options.token_file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => {
                return Ended::retry(
                    "token_missing",
                    format!(
                        "zone.token_file {} is empty; on the global, run `hdsd token issue --zone {zone} --mesh MESH` and write the token there",
                        self.options.token_file.display()
                    ),
                )
            }
            Err(e) => {
                return Ended::retry(
                    "token_missing",
                    format!(
                        "cannot read zone.token_file {}: {e}; on the global, run `hdsd token issue --zone {zone} --mesh MESH` and write the token there",
                        self.options.token_file.display()
                    ),
                )
            }
        };
        let channel = match self.connect(url).await {
            Ok(channel) => channel,
            Err(reason) => return Ended::retry("connect_failed", reason),
        };
        let mut client = pb::zone_sync_service_client::ZoneSyncServiceClient::new(channel)
            .max_decoding_message_size(super::global::MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel(SEND_BUFFER);
        let mut machine = Uplink::new(self.options.settings.clone(), self.options.epoch);
        let mut feed: Option<mpsc::Receiver<Message>> = None;
        let mut actions = Vec::new();
        machine.handle(Event::Opened, self.clock.now(), &mut actions);
        if let Some(ended) = self.perform(&mut actions, &tx, &mut feed, backoff).await {
            return ended;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        match format!("Bearer {token}").parse() {
            Ok(value) => {
                request
                    .metadata_mut()
                    .insert(crate::grpc_auth::AUTHORIZATION, value);
            }
            Err(_) => {
                return Ended::retry(
                    "token_malformed",
                    format!(
                        "zone.token_file {} holds characters a token cannot have; issue a new one with `hdsd token issue --zone {zone}`",
                        self.options.token_file.display()
                    ),
                )
            }
        }
        let mut inbound = match client.sync(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return refused_by_transport(&zone, &status),
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
                            return refused_by_transport(&zone, &status);
                        }
                        Event::Closed { error: Some(status.message().to_string()) }
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
                    crate::metrics::uplink_connected(true);
                    tracing::info!(
                        zone = self.options.settings.zone,
                        "zone uplink accepted by the global"
                    );
                    self.status.send_modify(|s| {
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

async fn next(feed: &mut Option<mpsc::Receiver<Message>>) -> Option<Message> {
    match feed {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// A stream the global's gRPC layer refused (before any message): a bad
/// token cannot be fixed by retrying soon.
fn refused_by_transport(zone: &str, status: &tonic::Status) -> Ended {
    match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => Ended {
            code: "unauthenticated".to_string(),
            reason: format!(
                "the global refused the zone token: {}; issue a new one on the global with `hdsd token issue --zone {zone} --mesh MESH` and write it to zone.token_file",
                status.message()
            ),
            retry: false,
        },
        tonic::Code::Unimplemented => Ended {
            code: "not_a_global".to_string(),
            reason: "the peer does not serve zone sync; point zone.global at a global's global.listen (an hdsd with [global] enabled)".to_string(),
            retry: false,
        },
        _ => Ended::retry(
            "stream_failed",
            format!("the stream to the global failed: {}", status.message()),
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
