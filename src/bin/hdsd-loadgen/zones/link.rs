//! One simulated zone's link to the global: hdsd's own zone state machine
//! ([`Uplink`]) over a real `Sync` stream, fed by a [`SimZone`] instead of a
//! registry. Between streams the zone keeps changing (its flips go on), and
//! a stream's figures (bytes and time until the global acknowledged the
//! snapshot or the resume) are recorded in [`Shared`].

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdsd::pb;
use hdsd::pb::zone_message::Kind as ZoneKind;
use hdsd::pb::zone_sync_service_client::ZoneSyncServiceClient;
use hdsd::zones::zone::backoff::Backoff;
use hdsd::zones::zone::uplink::{Action, Event, FeedPhase, Uplink, UplinkSettings};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::sim::SimZone;
use crate::consumers::Flips;
use crate::sys;

/// The gRPC frame header each message carries on the wire.
const FRAME_HEADER: u64 = 5;

/// What a zone's link is told to do.
#[derive(Debug, Clone, Copy)]
pub enum Cmd {
    /// End the stream (and its connection) now, stay away for `down`, then
    /// reconnect; `resume`: offer to resume (the "resume" capability), else
    /// the global asks for a snapshot.
    Drop { down: Duration, resume: bool },
    /// End the stream and the task.
    Stop,
}

/// How a stream caught the global up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Snapshot,
    Resume,
}

/// One stream's figures, from the start of its connect.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    pub zone: usize,
    pub kind: Kind,
    pub started: Instant,
    /// Until the global's Accepted.
    pub accepted_after: Duration,
    /// Until the global acknowledged the snapshot or the last replayed
    /// change (at once for a resume with nothing to replay).
    pub caught_up_after: Duration,
    /// Bytes sent on the stream until then (messages and gRPC frame
    /// headers; HTTP/2 and TLS framing not counted).
    pub bytes: u64,
    /// Dataplanes sent until then: the snapshot's items, or the resume's
    /// changes (the replay, and any made before its Ack).
    pub dataplanes: u64,
}

/// What every zone's link adds to.
#[derive(Debug, Default)]
pub struct Shared {
    pub bytes_sent: AtomicU64,
    pub changes_sent: AtomicU64,
    pub heartbeats_sent: AtomicU64,
    pub acks: AtomicU64,
    pub rejected: AtomicU64,
    /// Streams the global accepted.
    pub accepted: AtomicU64,
    /// Zones whose stream is accepted now.
    pub connected: AtomicUsize,
    /// Why streams ended without being told to (code: count).
    pub closes: Mutex<BTreeMap<String, u64>>,
    pub records: Mutex<Vec<StreamRecord>>,
    /// Change -> Ack lags while measuring (seconds).
    ack_lags: Mutex<Vec<f64>>,
    measuring: AtomicBool,
}

impl Shared {
    pub fn set_measuring(&self, on: bool) {
        self.measuring.store(on, Ordering::Release);
    }

    pub fn ack_lags(&self) -> Vec<f64> {
        self.ack_lags.lock().unwrap().clone()
    }

    /// Streams recorded since `since` (by their start), for `zone` or any.
    pub fn records_since(&self, since: Instant, zone: Option<usize>) -> Vec<StreamRecord> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.started >= since && zone.is_none_or(|z| r.zone == z))
            .cloned()
            .collect()
    }
}

/// One simulated zone's link.
pub struct Link {
    pub zone: usize,
    pub name: String,
    pub sim: SimZone,
    pub global: SocketAddr,
    pub token: String,
    /// The zone's lease epoch (one instance: constant across its streams).
    pub epoch: u64,
    /// Time between flips (none: no flips).
    pub flip_every: Option<Duration>,
    /// The first index of this zone's dataplanes in `flips`.
    pub flip_base: usize,
    pub flips: Arc<Flips>,
    pub shared: Arc<Shared>,
    pub cmds: mpsc::Receiver<Cmd>,
    pub connect_timeout: Duration,
}

enum End {
    Stop,
    Dropped { down: Duration, resume: bool },
    Closed { code: String },
}

/// The stream being caught up: what it must get acknowledged.
struct Pending {
    kind: Kind,
    /// The revision the global must acknowledge.
    target: u64,
    accepted_after: Duration,
    dataplanes: u64,
}

fn now_ts() -> prost_types::Timestamp {
    prost_types::Timestamp::from(std::time::SystemTime::now())
}

impl Link {
    /// Runs until told to stop: streams, and between them the backoff (or
    /// the outage it was told to take), the zone changing all along.
    pub async fn run(mut self) {
        let mut ticker =
            tokio::time::interval(self.flip_every.unwrap_or(Duration::from_secs(3600)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut backoff = Backoff::default();
        let mut resume = true;
        let mut down = Duration::ZERO;
        loop {
            let mut until = tokio::time::Instant::now() + down;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => break,
                    _ = ticker.tick() => {
                        if self.flip_every.is_some() {
                            self.sim.flip(now_ts());
                        }
                    }
                    cmd = self.cmds.recv() => match cmd {
                        None | Some(Cmd::Stop) => return,
                        // Already down: a new outage from now.
                        Some(Cmd::Drop { down: d, resume: r }) => {
                            resume = r;
                            until = tokio::time::Instant::now() + d;
                        }
                    },
                }
            }
            match self.stream(resume, &mut ticker, &mut backoff).await {
                End::Stop => return,
                End::Dropped { down: d, resume: r } => {
                    down = d;
                    resume = r;
                }
                End::Closed { code } => {
                    *self.shared.closes.lock().unwrap().entry(code).or_default() += 1;
                    backoff.disconnected(chrono::Utc::now());
                    down = backoff.next_delay_with(&mut rand::thread_rng());
                    resume = true;
                }
            }
        }
    }

    async fn stream(
        &mut self,
        resume: bool,
        ticker: &mut tokio::time::Interval,
        backoff: &mut Backoff,
    ) -> End {
        let started = Instant::now();
        let closed = |code: &str| End::Closed { code: code.into() };
        let channel = match sys::connect(self.global, None, self.connect_timeout).await {
            Ok(c) => c,
            Err(_) => return closed("connect_failed"),
        };
        let mut client = ZoneSyncServiceClient::new(channel)
            .max_decoding_message_size(hdsd::zones::global::server::MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel::<pb::ZoneMessage>(64);
        let mut settings = UplinkSettings::new(&self.name, format!("loadgen/{}", self.name));
        if !resume {
            settings.capabilities.clear();
        }
        let mut machine = Uplink::new(settings, self.epoch);
        let mut bytes = 0u64;
        let mut pending: Option<Pending> = None;
        let mut out = Vec::new();
        machine.handle(Event::Opened, chrono::Utc::now(), &mut out);
        if let Err(end) = self
            .perform(
                &mut machine,
                &mut out,
                &tx,
                &mut bytes,
                &mut pending,
                started,
                backoff,
            )
            .await
        {
            return end;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        match format!("Bearer {}", self.token).parse() {
            Ok(v) => {
                request
                    .metadata_mut()
                    .insert(hdsd::grpc_auth::AUTHORIZATION, v);
            }
            Err(_) => return closed("token_malformed"),
        }
        let mut inbound = match client.sync(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => return closed(&format!("sync_{:?}", s.code()).to_lowercase()),
        };
        let mut was_connected = false;
        let end = loop {
            let sleep = machine
                .deadline()
                .and_then(|d| (d - chrono::Utc::now()).to_std().ok())
                .unwrap_or(Duration::ZERO);
            let event = tokio::select! {
                m = inbound.message() => match m {
                    Ok(Some(m)) => Event::Received(m),
                    Ok(None) => Event::Closed { error: None },
                    Err(s) => Event::Closed { error: Some(s.message().to_string()) },
                },
                _ = ticker.tick() => {
                    if self.flip_every.is_none() {
                        continue;
                    }
                    if machine.feed_phase() != Some(FeedPhase::Live) {
                        // Not subscribed yet: the snapshot or replay covers it.
                        self.sim.flip(now_ts());
                        continue;
                    }
                    let Some((i, dp)) = self.sim.flip(now_ts()) else { continue };
                    // Stamped before it leaves, so a watcher never sees it first.
                    self.flips.record(self.flip_base + i, dp.ready, Instant::now());
                    Event::FeedChange(dp)
                }
                cmd = self.cmds.recv() => match cmd {
                    None | Some(Cmd::Stop) => break End::Stop,
                    Some(Cmd::Drop { down, resume }) => break End::Dropped { down, resume },
                },
                () = tokio::time::sleep(sleep), if machine.deadline().is_some() => Event::Tick,
            };
            machine.handle(event, chrono::Utc::now(), &mut out);
            if let Err(end) = self
                .perform(
                    &mut machine,
                    &mut out,
                    &tx,
                    &mut bytes,
                    &mut pending,
                    started,
                    backoff,
                )
                .await
            {
                break end;
            }
            if machine.is_accepted() && !was_connected {
                was_connected = true;
                self.shared.connected.fetch_add(1, Ordering::AcqRel);
            }
            if let Some(p) = &pending {
                if machine.acked() >= p.target {
                    self.caught_up(pending.take().unwrap(), started, bytes);
                }
            }
        };
        if was_connected {
            self.shared.connected.fetch_sub(1, Ordering::AcqRel);
        }
        end
    }

    fn caught_up(&self, p: Pending, started: Instant, bytes: u64) {
        self.shared.records.lock().unwrap().push(StreamRecord {
            zone: self.zone,
            kind: p.kind,
            started,
            accepted_after: p.accepted_after,
            caught_up_after: started.elapsed(),
            bytes,
            dataplanes: p.dataplanes,
        });
    }

    /// Carries out the machine's actions in order (answering its
    /// subscriptions from the simulated feed); an `End` when the stream is over.
    #[allow(clippy::too_many_arguments)]
    async fn perform(
        &mut self,
        machine: &mut Uplink,
        out: &mut Vec<Action>,
        tx: &mpsc::Sender<pb::ZoneMessage>,
        bytes: &mut u64,
        pending: &mut Option<Pending>,
        started: Instant,
        backoff: &mut Backoff,
    ) -> Result<(), End> {
        let mut queue: VecDeque<Action> = out.drain(..).collect();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send(m) => {
                    let n = m.encoded_len() as u64 + FRAME_HEADER;
                    *bytes += n;
                    self.shared.bytes_sent.fetch_add(n, Ordering::Relaxed);
                    match &m.kind {
                        Some(ZoneKind::Change(_)) => {
                            self.shared.changes_sent.fetch_add(1, Ordering::Relaxed);
                            if let Some(p) = pending.as_mut().filter(|p| p.kind == Kind::Resume) {
                                p.dataplanes += 1;
                            }
                        }
                        Some(ZoneKind::Heartbeat(_)) => {
                            self.shared.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(ZoneKind::Snapshot(chunk)) => {
                            if let Some(p) = pending.as_mut() {
                                p.dataplanes += chunk.dataplanes.len() as u64;
                            }
                        }
                        _ => {}
                    }
                    if tx.send(m).await.is_err() {
                        return Err(End::Closed {
                            code: "stream_closed".into(),
                        });
                    }
                }
                Action::Connected => {
                    self.shared.accepted.fetch_add(1, Ordering::Relaxed);
                    backoff.connected(chrono::Utc::now());
                }
                Action::Subscribe { since } => {
                    let accepted_after = started.elapsed();
                    *pending = Some(Pending {
                        kind: if since.is_some() {
                            Kind::Resume
                        } else {
                            Kind::Snapshot
                        },
                        target: self.sim.revision(),
                        accepted_after,
                        dataplanes: 0,
                    });
                    if since == Some(self.sim.revision()) {
                        // Nothing to replay: caught up as soon as accepted.
                        self.caught_up(pending.take().unwrap(), started, *bytes);
                    }
                    let mut more = Vec::new();
                    for event in self.sim.subscribe(since) {
                        machine.handle(event, chrono::Utc::now(), &mut more);
                    }
                    // The subscription's messages come before what followed it.
                    for a in more.into_iter().rev() {
                        queue.push_front(a);
                    }
                }
                Action::Problem { .. } => {
                    self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Action::Acknowledged { lags } => {
                    self.shared
                        .acks
                        .fetch_add(lags.len() as u64, Ordering::Relaxed);
                    if self.shared.measuring.load(Ordering::Acquire) {
                        self.shared
                            .ack_lags
                            .lock()
                            .unwrap()
                            .extend(lags.iter().map(Duration::as_secs_f64));
                    }
                }
                Action::Close { code, .. } => return Err(End::Closed { code }),
            }
        }
        Ok(())
    }
}
