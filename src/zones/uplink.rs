//! The zone's side of one sync stream as a state machine: events in,
//! actions out.
//!
//! The flow: once the stream is [`Event::Opened`], send a Hello and wait
//! (at most `hello_timeout`) for the global's answer. `Refused` closes the
//! stream with the global's code and message, retrying only when the global
//! did not say the refusal is permanent. `Accepted` is checked against the
//! skew rule ([`check_versions`]); then the machine asks the driver to
//! subscribe the change feed: from `resume_from` when the global named one
//! (only the changes after it are sent), from nothing otherwise (a snapshot,
//! in chunks of at most `chunk_size` dataplanes, then `SnapshotComplete`).
//! A feed RESYNC, while resuming or live, falls back to a fresh snapshot:
//! the machine subscribes anew and drops what the old subscription still
//! delivers until the snapshot comes. Changes follow as they happen, a
//! heartbeat every `heartbeat_interval` the global asked for, and the
//! stream closes (to be retried) when nothing came from the global for its
//! `zone_timeout` (the global answers every heartbeat).
//!
//! Nothing here knows the network, the feed's task or the clock: the driver
//! turns the stream, feed messages (with the view's items converted to
//! [`pb::Dataplane`]) and one timer at [`Uplink::deadline`] into events,
//! passes the time in, and carries out the [`Action`]s in order. One
//! machine serves one stream; the driver keeps the [`Backoff`] across them.
//!
//! [`Backoff`]: super::backoff::Backoff

use std::collections::VecDeque;
use std::time::Duration;

use super::{check_versions, elapsed, from_proto_duration, human, plus, Code, PeerVersion};
use crate::clock::Timestamp;
use crate::names;
use crate::pb;
use crate::pb::global_message::{self, Accepted};
use crate::pb::zone_message::{self, change};

/// Dataplanes per snapshot chunk, by default.
pub const CHUNK_SIZE: usize = 500;

/// How long a zone waits for the global's answer to its Hello, by default.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest heartbeat interval a zone follows: a global asking for less
/// gets one heartbeat per this.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest heartbeat interval a zone follows (`global.heartbeat_interval`
/// may not be longer): an `Accepted` asking for more is a protocol
/// violation, not a number to compute with.
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3600);

/// The longest zone timeout a zone follows (`global.zone_timeout` may not be
/// longer): past it, a silent global would hold the zone's uplink unseen.
pub const MAX_ZONE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// What a zone says of itself, and how it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UplinkSettings {
    /// The zone's name (`[zone] name`), sent in the Hello: the global takes
    /// the name from the credential and refuses a Hello that names another.
    pub zone: String,
    /// This instance's name, sent in the Hello.
    pub instance: String,
    /// This hdsd's protocol version and release.
    pub version: PeerVersion,
    /// The capabilities named in the Hello.
    pub capabilities: Vec<String>,
    /// The most dataplanes per snapshot chunk (0 counts as 1).
    pub chunk_size: usize,
    /// How long to wait for the global's answer to the Hello.
    pub hello_timeout: Duration,
}

impl UplinkSettings {
    /// This hdsd's version and capabilities, [`CHUNK_SIZE`], [`HELLO_TIMEOUT`].
    pub fn new(zone: impl Into<String>, instance: impl Into<String>) -> UplinkSettings {
        UplinkSettings {
            zone: zone.into(),
            instance: instance.into(),
            version: PeerVersion::ours(),
            capabilities: super::CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            chunk_size: CHUNK_SIZE,
            hello_timeout: HELLO_TIMEOUT,
        }
    }

    fn resumes(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| c == super::CAPABILITY_RESUME)
    }
}

/// Something that happened to the stream or the feed.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The stream to the global is open: say hello.
    Opened,
    /// A message from the global.
    Received(pb::GlobalMessage),
    /// The feed's snapshot (after [`Action::Subscribe`] without `since`, or
    /// after a RESYNC): every dataplane now, at `revision`.
    FeedSnapshot {
        /// The revision the snapshot was taken at.
        revision: u64,
        /// Every dataplane, each with its own revision.
        items: Vec<pb::Dataplane>,
    },
    /// One dataplane was created or changed; its `revision` is the change's.
    FeedChange(pb::Dataplane),
    /// One dataplane was deleted at `revision`.
    FeedDeleted {
        /// The dataplane's mesh.
        mesh: String,
        /// The dataplane's name.
        name: String,
        /// The revision of the deletion.
        revision: u64,
    },
    /// The feed is up to date as of `revision` (after a snapshot or replay).
    FeedSynced {
        /// Every change up to it was delivered.
        revision: u64,
    },
    /// The feed cannot continue from where it was (its reason, for logs).
    FeedResync {
        /// `too_old`, `unknown_revision`, `overflow`.
        reason: String,
    },
    /// Time passed: the driver's timer for [`Uplink::deadline`] fired.
    Tick,
    /// The transport ended the stream (with its error, if any).
    Closed {
        /// What the transport said.
        error: Option<String>,
    },
}

/// What the driver must do, in order.
// Nearly every action is a Send: boxing it would cost an allocation per
// message to shrink the rare ones.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this message to the global.
    Send(pb::ZoneMessage),
    /// The global accepted the stream: tell the backoff
    /// ([`Backoff::connected`](super::backoff::Backoff::connected)).
    Connected,
    /// Subscribe the change feed, replacing any earlier subscription (and
    /// dropping what it still holds): after `since`, or from a snapshot
    /// (`None`).
    Subscribe {
        /// The revision to continue after.
        since: Option<u64>,
    },
    /// The global did not accept part of what was sent (the stream goes
    /// on): log it for the operator.
    Problem {
        /// The global's stable code (`mesh_not_allowed`, ...).
        code: String,
        /// The global's message: what is wrong and what to do.
        message: String,
    },
    /// The global acknowledged changes: each one's time from being sent
    /// to its acknowledgement, on this zone's clock (the sync lag; the
    /// global acknowledges a batch once its hub has it).
    Acknowledged {
        /// One per change acknowledged, oldest first.
        lags: Vec<Duration>,
    },
    /// Close the stream. `retry`: reconnect after the backoff's next delay;
    /// otherwise the refusal is permanent and the driver waits the backoff's
    /// longest delay ([`Backoff::cap`](super::backoff::Backoff::cap)) before
    /// trying again (an operator has to change something first).
    Close {
        /// A stable code: the global's, or the zone's own ([`Code`]).
        code: String,
        /// What is wrong and what to do.
        reason: String,
        /// Whether reconnecting soon can succeed.
        retry: bool,
    },
}

/// Where the feed stands once the stream is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedPhase {
    /// Waiting for a feed snapshot; changes are dropped until it comes.
    AwaitingSnapshot,
    /// Sending the replay after `resume_from`, until the feed is synced.
    Resuming,
    /// Sending changes as they happen.
    Live,
}

/// Sent changes whose acknowledgement is awaited for the sync lag; past
/// it the oldest go unmeasured.
const MAX_IN_FLIGHT: usize = 4096;

#[derive(Debug, Clone)]
struct Live {
    global: PeerVersion,
    global_capabilities: Vec<String>,
    heartbeat_interval: Duration,
    zone_timeout: Duration,
    feed: FeedPhase,
    /// Every change up to this revision was sent.
    sent: u64,
    /// The highest revision the global acknowledged.
    acked: u64,
    /// Changes sent and not yet acknowledged, with when they were sent
    /// (the sync lag; at most [`MAX_IN_FLIGHT`]).
    in_flight: VecDeque<(u64, Timestamp)>,
    /// When the last heartbeat was sent (or the stream accepted).
    last_heartbeat: Timestamp,
    /// When the last message from the global arrived.
    last_received: Timestamp,
}

#[derive(Debug, Clone)]
enum Phase {
    /// Before [`Event::Opened`].
    Idle,
    /// The Hello is sent at `since`.
    AwaitingAccepted {
        since: Timestamp,
    },
    Accepted(Box<Live>),
    Closed,
}

/// The zone's side of one stream.
#[derive(Debug, Clone)]
pub struct Uplink {
    settings: UplinkSettings,
    epoch: u64,
    phase: Phase,
}

impl Uplink {
    /// A machine for one stream of the instance holding the uplink lease
    /// with `epoch`.
    pub fn new(settings: UplinkSettings, epoch: u64) -> Uplink {
        Uplink {
            settings,
            epoch,
            phase: Phase::Idle,
        }
    }

    /// When the driver must deliver [`Event::Tick`] next, if ever.
    pub fn deadline(&self) -> Option<Timestamp> {
        match &self.phase {
            Phase::AwaitingAccepted { since } => Some(plus(*since, self.settings.hello_timeout)),
            Phase::Accepted(l) => Some(plus(l.last_heartbeat, l.heartbeat_interval).min(plus(
                l.last_received,
                l.zone_timeout.saturating_add(Duration::from_nanos(1)),
            ))),
            Phase::Idle | Phase::Closed => None,
        }
    }

    /// True once the machine closed the stream.
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// True once the global accepted the stream (and until it closes).
    pub fn is_accepted(&self) -> bool {
        matches!(self.phase, Phase::Accepted(_))
    }

    /// Where the feed stands, once accepted.
    pub fn feed_phase(&self) -> Option<FeedPhase> {
        match &self.phase {
            Phase::Accepted(l) => Some(l.feed),
            _ => None,
        }
    }

    /// The highest revision the global acknowledged on this stream (0: none).
    pub fn acked(&self) -> u64 {
        match &self.phase {
            Phase::Accepted(l) => l.acked,
            _ => 0,
        }
    }

    /// Every change up to this revision was sent on this stream (0: none).
    pub fn sent(&self) -> u64 {
        match &self.phase {
            Phase::Accepted(l) => l.sent,
            _ => 0,
        }
    }

    /// The global's version, once accepted.
    pub fn global_version(&self) -> Option<&PeerVersion> {
        match &self.phase {
            Phase::Accepted(l) => Some(&l.global),
            _ => None,
        }
    }

    /// The global's capabilities, once accepted.
    pub fn global_capabilities(&self) -> &[String] {
        match &self.phase {
            Phase::Accepted(l) => &l.global_capabilities,
            _ => &[],
        }
    }

    /// The heartbeat interval followed, once accepted.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        match &self.phase {
            Phase::Accepted(l) => Some(l.heartbeat_interval),
            _ => None,
        }
    }

    /// Applies one event at `now` (the zone's clock), appending what to do
    /// to `actions`.
    pub fn handle(&mut self, event: Event, now: Timestamp, actions: &mut Vec<Action>) {
        if self.is_closed() {
            return;
        }
        match event {
            Event::Opened => {
                if matches!(self.phase, Phase::Idle) {
                    actions.push(Action::Send(self.hello()));
                    self.phase = Phase::AwaitingAccepted { since: now };
                }
            }
            Event::Closed { error } => {
                let reason = match error {
                    Some(e) => format!("the stream to the global ended: {e}; reconnecting"),
                    None => "the global ended the stream; reconnecting".to_string(),
                };
                self.close(Code::StreamClosed.as_str(), reason, true, actions)
            }
            Event::Received(message) => self.received(message, now, actions),
            Event::Tick => self.tick(now, actions),
            Event::FeedSnapshot { revision, items } => self.snapshot(revision, items, actions),
            Event::FeedChange(dataplane) => {
                let revision = dataplane.revision;
                self.change(revision, change::Kind::Upsert(dataplane), now, actions)
            }
            Event::FeedDeleted {
                mesh,
                name,
                revision,
            } => self.change(
                revision,
                change::Kind::Deleted(change::Deleted { mesh, name }),
                now,
                actions,
            ),
            Event::FeedSynced { revision } => {
                if let Phase::Accepted(l) = &mut self.phase {
                    if l.feed != FeedPhase::AwaitingSnapshot {
                        l.sent = l.sent.max(revision);
                        l.feed = FeedPhase::Live;
                    }
                }
            }
            Event::FeedResync { .. } => {
                if let Phase::Accepted(l) = &mut self.phase {
                    l.feed = FeedPhase::AwaitingSnapshot;
                    actions.push(Action::Subscribe { since: None });
                }
            }
        }
    }

    fn hello(&self) -> pb::ZoneMessage {
        zone(zone_message::Kind::Hello(zone_message::Hello {
            protocol_version: self.settings.version.protocol,
            capabilities: self.settings.capabilities.clone(),
            hdsd_version: self.settings.version.hdsd.clone(),
            epoch: self.epoch,
            instance: self.settings.instance.clone(),
            zone: self.settings.zone.clone(),
        }))
    }

    fn received(&mut self, message: pb::GlobalMessage, now: Timestamp, actions: &mut Vec<Action>) {
        use global_message::Kind;
        let Some(kind) = message.kind else {
            // Proto3 decodes a kind this release does not know as none; a
            // global speaks the zone's version, so this is not expected, but
            // it is no reason to drop the stream.
            return actions.push(Action::Problem {
                code: Code::ProtocolViolation.as_str().to_string(),
                message: "the global sent a message of a kind this zone does not know; ignored (upgrade the zone to the global's hdsd release)".to_string(),
            });
        };
        if let Kind::Refused(r) = kind {
            let (code, message) = peer_code(&r.code, &r.message);
            return self.close(code, message, !r.permanent, actions);
        }
        match &mut self.phase {
            Phase::Idle | Phase::Closed => {}
            Phase::AwaitingAccepted { .. } => match kind {
                Kind::Accepted(accepted) => self.accepted(accepted, now, actions),
                other => self.violation(
                    format!(
                        "the global answered the Hello with {} instead of Accepted or Refused",
                        global_kind(&other)
                    ),
                    actions,
                ),
            },
            Phase::Accepted(l) => {
                l.last_received = now;
                match kind {
                    Kind::Ack(ack) if ack.revision > l.sent => {
                        let what = format!(
                            "the global acknowledged revision {}, but this stream sent changes up to {} only",
                            ack.revision, l.sent
                        );
                        self.violation(what, actions)
                    }
                    Kind::Ack(ack) => {
                        l.acked = l.acked.max(ack.revision);
                        let mut lags = Vec::new();
                        while let Some(&(revision, sent)) = l.in_flight.front() {
                            if revision > l.acked {
                                break;
                            }
                            l.in_flight.pop_front();
                            lags.push(elapsed(sent, now).unwrap_or_default());
                        }
                        if !lags.is_empty() {
                            actions.push(Action::Acknowledged { lags });
                        }
                    }
                    Kind::Rejected(r) => {
                        let (code, message) = peer_code(&r.code, &r.message);
                        actions.push(Action::Problem {
                            code: code.to_string(),
                            message,
                        })
                    }
                    Kind::Accepted(_) => self.violation(
                        "the global sent a second Accepted on one stream".to_string(),
                        actions,
                    ),
                    Kind::Refused(_) => unreachable!("handled above"),
                }
            }
        }
    }

    fn accepted(&mut self, a: Accepted, now: Timestamp, actions: &mut Vec<Action>) {
        let timings = timings(&a);
        let global = PeerVersion {
            protocol: a.protocol_version,
            hdsd: a.hdsd_version,
        };
        if let Err(skew) = check_versions(&self.settings.zone, &self.settings.version, &global) {
            return self.close(
                Code::VersionIncompatible.as_str(),
                skew.to_string(),
                false,
                actions,
            );
        }
        if !a.zone.is_empty() && a.zone != self.settings.zone {
            return self.close(
                Code::ZoneNameMismatch.as_str(),
                format!(
                    "the global knows this zone as {:?}, the zone its token (or client certificate) names, but zone.name is {:?}: issue a token for {:?} on the global (`hdsd token issue --zone {} --mesh MESH`) and put it in zone.token_file (or a certificate with the URI SAN hdsd://zone/{}), or set zone.name = {:?}",
                    a.zone, self.settings.zone, self.settings.zone, self.settings.zone, self.settings.zone, a.zone
                ),
                false,
                actions,
            );
        }
        let (interval, zone_timeout) = match timings {
            Ok(timings) => timings,
            Err(what) => return self.violation(what, actions),
        };
        let resume = a.resume_from.filter(|_| self.settings.resumes());
        let (feed, sent) = match resume {
            Some(r) => (FeedPhase::Resuming, r),
            None => (FeedPhase::AwaitingSnapshot, 0),
        };
        self.phase = Phase::Accepted(Box::new(Live {
            global,
            global_capabilities: a.capabilities,
            heartbeat_interval: interval,
            zone_timeout,
            feed,
            sent,
            acked: 0,
            in_flight: VecDeque::new(),
            last_heartbeat: now,
            last_received: now,
        }));
        actions.push(Action::Connected);
        actions.push(Action::Subscribe { since: resume });
    }

    fn snapshot(&mut self, revision: u64, items: Vec<pb::Dataplane>, actions: &mut Vec<Action>) {
        let Phase::Accepted(l) = &mut self.phase else {
            return;
        };
        let size = self.settings.chunk_size.max(1);
        let mut items = items.into_iter().peekable();
        let mut begin = true;
        while begin || items.peek().is_some() {
            let dataplanes: Vec<pb::Dataplane> = items.by_ref().take(size).collect();
            actions.push(Action::Send(zone(zone_message::Kind::Snapshot(
                zone_message::SnapshotChunk { begin, dataplanes },
            ))));
            begin = false;
        }
        actions.push(Action::Send(zone(zone_message::Kind::SnapshotComplete(
            zone_message::SnapshotComplete { revision },
        ))));
        l.sent = revision;
        l.feed = FeedPhase::Live;
    }

    fn change(
        &mut self,
        revision: u64,
        kind: change::Kind,
        now: Timestamp,
        actions: &mut Vec<Action>,
    ) {
        let Phase::Accepted(l) = &mut self.phase else {
            return;
        };
        if l.feed == FeedPhase::AwaitingSnapshot {
            // The old subscription's leftovers: the snapshot covers them.
            return;
        }
        actions.push(Action::Send(zone(zone_message::Kind::Change(
            zone_message::Change {
                revision,
                kind: Some(kind),
            },
        ))));
        l.sent = l.sent.max(revision);
        if l.in_flight.len() == MAX_IN_FLIGHT {
            l.in_flight.pop_front(); // unmeasured, never unsent
        }
        l.in_flight.push_back((revision, now));
    }

    fn tick(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        match &mut self.phase {
            Phase::AwaitingAccepted { since } => {
                match elapsed(*since, now) {
                    // The clock stepped back: count from now.
                    None => *since = now,
                    Some(waited) if waited >= self.settings.hello_timeout => {
                        let reason = format!(
                            "the global did not answer the Hello within {}; reconnecting (check that the global's address points at an hdsd global)",
                            human(self.settings.hello_timeout)
                        );
                        self.close(Code::HelloTimeout.as_str(), reason, true, actions)
                    }
                    Some(_) => {}
                }
            }
            Phase::Accepted(l) => {
                if elapsed(l.last_received, now).is_none() {
                    l.last_received = now;
                }
                if elapsed(l.last_received, now).is_some_and(|quiet| quiet > l.zone_timeout) {
                    let reason = format!(
                        "nothing from the global for {} (its zone_timeout); reconnecting",
                        human(l.zone_timeout)
                    );
                    return self.close(Code::ZoneTimeout.as_str(), reason, true, actions);
                }
                let due = elapsed(l.last_heartbeat, now).is_none_or(|e| e >= l.heartbeat_interval);
                if due {
                    actions.push(Action::Send(zone(zone_message::Kind::Heartbeat(
                        zone_message::Heartbeat { revision: l.sent },
                    ))));
                    l.last_heartbeat = now;
                }
            }
            Phase::Idle | Phase::Closed => {}
        }
    }

    fn violation(&mut self, what: String, actions: &mut Vec<Action>) {
        let reason = format!(
            "{what}: the zone ends the stream and reconnects (if it happens again, check that zone and global run compatible hdsd releases)"
        );
        self.close(Code::ProtocolViolation.as_str(), reason, true, actions)
    }

    fn close(&mut self, code: &str, reason: String, retry: bool, actions: &mut Vec<Action>) {
        self.phase = Phase::Closed;
        actions.push(Action::Close {
            code: code.to_string(),
            reason,
            retry,
        });
    }
}

/// The heartbeat interval and zone timeout an `Accepted` asks for, checked
/// against the bounds: a peer's number is validated before anything is
/// computed with it. A missing or too short zone timeout is three
/// heartbeats; a too short interval is raised to [`MIN_HEARTBEAT_INTERVAL`].
fn timings(a: &Accepted) -> Result<(Duration, Duration), String> {
    let interval = match a.heartbeat_interval.as_ref().map(from_proto_duration) {
        Some(Some(d)) if !d.is_zero() => d,
        Some(_) => {
            return Err(format!(
                "the global's Accepted has an invalid heartbeat_interval ({}s, {}ns: negative, zero or out of range)",
                a.heartbeat_interval.as_ref().map_or(0, |d| d.seconds),
                a.heartbeat_interval.as_ref().map_or(0, |d| d.nanos)
            ))
        }
        None => return Err("the global's Accepted has no heartbeat_interval".to_string()),
    };
    if interval > MAX_HEARTBEAT_INTERVAL {
        return Err(format!(
            "the global's Accepted asks for a heartbeat_interval of {}, longer than the most a zone follows ({})",
            human(interval),
            human(MAX_HEARTBEAT_INTERVAL)
        ));
    }
    let interval = interval.max(MIN_HEARTBEAT_INTERVAL);
    let zone_timeout = a.zone_timeout.as_ref().and_then(from_proto_duration);
    if let Some(t) = zone_timeout.filter(|t| *t > MAX_ZONE_TIMEOUT) {
        return Err(format!(
            "the global's Accepted has a zone_timeout of {}, longer than the most a zone follows ({})",
            human(t),
            human(MAX_ZONE_TIMEOUT)
        ));
    }
    let zone_timeout = zone_timeout
        .filter(|t| *t > interval)
        .unwrap_or(interval.saturating_mul(3));
    Ok((interval, zone_timeout))
}

/// A global's code and message as the zone keeps them (a metric label, a
/// log line, the uplink's status): a code this zone does not know counts
/// as `protocol_violation` and is named, escaped and cut, in the message;
/// the message is escaped and cut ([`names::message`]).
fn peer_code(code: &str, message: &str) -> (&'static str, String) {
    let message = names::message(message);
    match Code::parse(code) {
        Some(code) => (code.as_str(), message),
        None if code.is_empty() => (Code::ProtocolViolation.as_str(), message),
        None => (
            Code::ProtocolViolation.as_str(),
            format!(
                "{message} (code {}, which this zone does not know)",
                names::shown(code)
            ),
        ),
    }
}

fn zone(kind: zone_message::Kind) -> pb::ZoneMessage {
    pb::ZoneMessage { kind: Some(kind) }
}

fn global_kind(kind: &global_message::Kind) -> &'static str {
    match kind {
        global_message::Kind::Accepted(_) => "Accepted",
        global_message::Kind::Ack(_) => "Ack",
        global_message::Kind::Refused(_) => "Refused",
        global_message::Kind::Rejected(_) => "Rejected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zones::to_proto_duration;

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn dp(name: &str, revision: u64) -> pb::Dataplane {
        pb::Dataplane {
            mesh: "default".into(),
            name: name.into(),
            revision,
            ready: true,
            ..Default::default()
        }
    }

    fn accepted(resume_from: Option<u64>, interval: u64, timeout: u64) -> pb::GlobalMessage {
        pb::GlobalMessage {
            kind: Some(global_message::Kind::Accepted(Accepted {
                protocol_version: super::super::PROTOCOL_VERSION,
                capabilities: vec!["resume".into()],
                hdsd_version: "9.9.9".into(),
                heartbeat_interval: Some(to_proto_duration(Duration::from_secs(interval))),
                zone_timeout: Some(to_proto_duration(Duration::from_secs(timeout))),
                resume_from,
                zone: "eu-1".into(),
            })),
        }
    }

    fn global(kind: global_message::Kind) -> pb::GlobalMessage {
        pb::GlobalMessage { kind: Some(kind) }
    }

    fn refused(code: &str, message: &str, permanent: bool) -> pb::GlobalMessage {
        global(global_message::Kind::Refused(global_message::Refused {
            code: code.into(),
            message: message.into(),
            permanent,
        }))
    }

    struct Harness {
        uplink: Uplink,
        now: Timestamp,
    }

    impl Harness {
        fn new() -> Harness {
            Harness::with(UplinkSettings::new("eu-1", "zone-a"))
        }

        fn with(settings: UplinkSettings) -> Harness {
            Harness {
                uplink: Uplink::new(settings, 7),
                now: t0(),
            }
        }

        fn on(&mut self, event: Event) -> Vec<Action> {
            let mut actions = Vec::new();
            self.uplink.handle(event, self.now, &mut actions);
            actions
        }

        fn advance(&mut self, secs: u64) -> Vec<Action> {
            self.now = plus(self.now, Duration::from_secs(secs));
            self.on(Event::Tick)
        }

        /// Opened, then accepted (heartbeat 5 s, timeout 15 s).
        fn accepted(resume_from: Option<u64>) -> Harness {
            let mut h = Harness::new();
            h.on(Event::Opened);
            h.on(Event::Received(accepted(resume_from, 5, 15)));
            h
        }
    }

    fn sent(actions: &[Action]) -> Vec<&zone_message::Kind> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(pb::ZoneMessage { kind: Some(k) }) => Some(k),
                _ => None,
            })
            .collect()
    }

    fn closed(actions: &[Action]) -> (&str, &str, bool) {
        match actions.last() {
            Some(Action::Close {
                code,
                reason,
                retry,
            }) => (code, reason, *retry),
            other => panic!("not closed: {other:?}"),
        }
    }

    #[test]
    fn opened_sends_a_hello_with_version_capabilities_epoch_and_instance() {
        let mut h = Harness::new();
        assert_eq!(h.uplink.deadline(), None);
        let a = h.on(Event::Opened);
        let [zone_message::Kind::Hello(hello)] = &sent(&a)[..] else {
            panic!("{a:?}")
        };
        assert_eq!(hello.protocol_version, super::super::PROTOCOL_VERSION);
        assert_eq!(hello.capabilities, ["resume"]);
        assert_eq!(hello.hdsd_version, super::super::HDSD_VERSION);
        assert_eq!((hello.epoch, hello.instance.as_str()), (7, "zone-a"));
        assert_eq!(h.uplink.deadline(), Some(plus(t0(), HELLO_TIMEOUT)));
        // A second Opened says nothing more.
        assert!(h.on(Event::Opened).is_empty());
    }

    /// A global that knows the zone (by its token) under another name:
    /// the zone closes for good and says which token or setting to fix; an
    /// older global that names no zone is taken at its word.
    #[test]
    fn a_global_that_names_the_zone_otherwise_is_left_with_the_fix() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let mut other = accepted(None, 5, 15);
        if let Some(global_message::Kind::Accepted(a)) = &mut other.kind {
            a.zone = "us-1".into();
        }
        let a = h.on(Event::Received(other));
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("zone_name_mismatch", false));
        for part in [
            "\"us-1\"",
            "zone.name is \"eu-1\"",
            "hdsd token issue --zone eu-1",
            "zone.name = \"us-1\"",
        ] {
            assert!(reason.contains(part), "{part}: {reason}");
        }
        let mut h = Harness::new();
        h.on(Event::Opened);
        let mut older = accepted(None, 5, 15);
        if let Some(global_message::Kind::Accepted(a)) = &mut older.kind {
            a.zone.clear();
        }
        let a = h.on(Event::Received(older));
        assert_eq!(a, [Action::Connected, Action::Subscribe { since: None }]);
    }

    #[test]
    fn accepted_without_resume_subscribes_for_a_snapshot_sent_in_chunks() {
        let mut settings = UplinkSettings::new("eu-1", "zone-a");
        settings.chunk_size = 2;
        let mut h = Harness::with(settings);
        h.on(Event::Opened);
        let a = h.on(Event::Received(accepted(None, 5, 15)));
        assert_eq!(a, [Action::Connected, Action::Subscribe { since: None }]);
        assert_eq!(h.uplink.feed_phase(), Some(FeedPhase::AwaitingSnapshot));
        // Changes of an earlier subscription are dropped until the snapshot.
        assert!(h.on(Event::FeedChange(dp("old", 3))).is_empty());
        let items = (1..=5).map(|i| dp(&format!("web-{i}"), i)).collect();
        let a = h.on(Event::FeedSnapshot { revision: 9, items });
        let kinds = sent(&a);
        assert_eq!(
            kinds.len(),
            4,
            "three chunks of at most 2, then complete: {a:?}"
        );
        let chunks: Vec<(bool, usize)> = kinds[..3]
            .iter()
            .map(|k| match k {
                zone_message::Kind::Snapshot(c) => (c.begin, c.dataplanes.len()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(chunks, [(true, 2), (false, 2), (false, 1)]);
        assert!(matches!(
            kinds[3],
            zone_message::Kind::SnapshotComplete(zone_message::SnapshotComplete { revision: 9 })
        ));
        assert_eq!(
            (h.uplink.sent(), h.uplink.feed_phase()),
            (9, Some(FeedPhase::Live))
        );
    }

    #[test]
    fn an_empty_zone_sends_one_empty_chunk_that_begins_the_snapshot() {
        let mut h = Harness::accepted(None);
        let a = h.on(Event::FeedSnapshot {
            revision: 4,
            items: vec![],
        });
        let kinds = sent(&a);
        assert!(
            matches!(
                kinds[..],
                [
                    zone_message::Kind::Snapshot(zone_message::SnapshotChunk { begin: true, ref dataplanes }),
                    zone_message::Kind::SnapshotComplete(_)
                ] if dataplanes.is_empty()
            ),
            "{a:?}"
        );
    }

    #[test]
    fn resume_without_snapshot_sends_only_the_changes_after_it() {
        let mut h = Harness::accepted(Some(40));
        assert_eq!(h.uplink.feed_phase(), Some(FeedPhase::Resuming));
        assert_eq!(h.uplink.sent(), 40);
        let a = h.on(Event::FeedChange(dp("web", 41)));
        assert!(
            matches!(
                sent(&a)[..],
                [zone_message::Kind::Change(zone_message::Change {
                    revision: 41,
                    kind: Some(change::Kind::Upsert(_))
                })]
            ),
            "{a:?}"
        );
        let a = h.on(Event::FeedDeleted {
            mesh: "default".into(),
            name: "gone".into(),
            revision: 42,
        });
        assert!(
            matches!(
                sent(&a)[..],
                [zone_message::Kind::Change(zone_message::Change { revision: 42, kind: Some(change::Kind::Deleted(d)) })]
                    if d.name == "gone" && d.mesh == "default"
            ),
            "{a:?}"
        );
        h.on(Event::FeedSynced { revision: 45 });
        assert_eq!(
            (h.uplink.sent(), h.uplink.feed_phase()),
            (45, Some(FeedPhase::Live))
        );
    }

    #[test]
    fn the_subscription_resumes_from_the_globals_revision() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let a = h.on(Event::Received(accepted(Some(40), 5, 15)));
        assert_eq!(
            a,
            [Action::Connected, Action::Subscribe { since: Some(40) }]
        );
        // A zone that cannot resume asks for a snapshot whatever the global offers.
        let mut settings = UplinkSettings::new("eu-1", "zone-a");
        settings.capabilities.clear();
        let mut h = Harness::with(settings);
        h.on(Event::Opened);
        let a = h.on(Event::Received(accepted(Some(40), 5, 15)));
        assert_eq!(a, [Action::Connected, Action::Subscribe { since: None }]);
    }

    #[test]
    fn resync_falls_back_to_a_snapshot_while_resuming_or_live() {
        for live in [false, true] {
            let mut h = Harness::accepted(Some(40));
            if live {
                h.on(Event::FeedSynced { revision: 41 });
            }
            let a = h.on(Event::FeedResync {
                reason: "too_old".into(),
            });
            assert_eq!(a, [Action::Subscribe { since: None }]);
            assert_eq!(h.uplink.feed_phase(), Some(FeedPhase::AwaitingSnapshot));
            // The old subscription's stragglers are not sent.
            assert!(h.on(Event::FeedChange(dp("web", 50))).is_empty());
            assert!(h
                .on(Event::FeedDeleted {
                    mesh: "default".into(),
                    name: "web".into(),
                    revision: 51
                })
                .is_empty());
            h.on(Event::FeedSynced { revision: 52 });
            assert_eq!(h.uplink.sent(), if live { 41 } else { 40 });
            let a = h.on(Event::FeedSnapshot {
                revision: 60,
                items: vec![dp("web", 50)],
            });
            assert!(matches!(
                sent(&a)[0],
                zone_message::Kind::Snapshot(zone_message::SnapshotChunk { begin: true, .. })
            ));
            assert_eq!(
                (h.uplink.sent(), h.uplink.feed_phase()),
                (60, Some(FeedPhase::Live))
            );
        }
    }

    #[test]
    fn refused_names_the_reason_and_says_whether_to_retry() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let message = "zone \"eu-1\" is not registered at the global: add it to global.zones";
        let a = h.on(Event::Received(refused("zone_unregistered", message, true)));
        assert_eq!(closed(&a), ("zone_unregistered", message, false));
        assert!(h.uplink.is_closed());
        assert!(
            h.on(Event::Tick).is_empty(),
            "a closed machine does nothing"
        );

        // A retryable refusal, live.
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(refused(
            "shutting_down",
            "the global is shutting down",
            false,
        )));
        assert_eq!(
            closed(&a),
            ("shutting_down", "the global is shutting down", true)
        );
    }

    #[test]
    fn a_global_too_old_or_too_new_is_refused_naming_both_versions() {
        let mut settings = UplinkSettings::new("eu-1", "zone-a");
        settings.version = PeerVersion {
            protocol: 3,
            hdsd: "0.3.0".into(),
        };
        for (global, upgrade) in [(2, "upgrade the global first"), (5, "upgrade the zone")] {
            let mut h = Harness::with(settings.clone());
            h.on(Event::Opened);
            let mut message = accepted(None, 5, 15);
            if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
                a.protocol_version = global;
            }
            let a = h.on(Event::Received(message));
            let (code, reason, retry) = closed(&a);
            assert_eq!((code, retry), ("version_incompatible", false));
            assert!(
                reason.contains("version 3") && reason.contains(&format!("version {global}")),
                "{reason}"
            );
            assert!(
                reason.contains("\"9.9.9\"") && reason.contains(upgrade),
                "{reason}"
            );
        }
        // One version behind the global is fine.
        let mut h = Harness::with(settings);
        h.on(Event::Opened);
        let mut message = accepted(None, 5, 15);
        if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
            a.protocol_version = 4;
        }
        assert_eq!(h.on(Event::Received(message))[0], Action::Connected);
        assert_eq!(h.uplink.global_version().map(|v| v.protocol), Some(4));
    }

    #[test]
    fn heartbeat_cadence_follows_the_globals_interval() {
        for interval in [5u64, 10] {
            let mut h = Harness::new();
            h.on(Event::Opened);
            h.on(Event::Received(accepted(None, interval, 1000)));
            assert_eq!(
                h.uplink.heartbeat_interval(),
                Some(Duration::from_secs(interval))
            );
            assert_eq!(
                h.uplink.deadline(),
                Some(plus(t0(), Duration::from_secs(interval)))
            );
            let mut beats = Vec::new();
            for second in 1..=30 {
                let a = h.advance(1);
                if !sent(&a).is_empty() {
                    beats.push(second);
                }
                // The global answers, so the stream stays up.
                h.on(Event::Received(global(global_message::Kind::Ack(
                    global_message::Ack { revision: 0 },
                ))));
            }
            let expected: Vec<u64> = (1..=30).filter(|s| s % interval == 0).collect();
            assert_eq!(beats, expected, "interval {interval}");
        }
    }

    #[test]
    fn a_heartbeat_carries_the_revision_sent_and_acks_are_tracked() {
        let mut h = Harness::accepted(None);
        h.on(Event::FeedSnapshot {
            revision: 9,
            items: vec![dp("web", 9)],
        });
        h.on(Event::FeedChange(dp("web", 12)));
        let a = h.advance(5);
        assert!(
            matches!(
                sent(&a)[..],
                [zone_message::Kind::Heartbeat(zone_message::Heartbeat {
                    revision: 12
                })]
            ),
            "{a:?}"
        );
        let acked = h.on(Event::Received(global(global_message::Kind::Ack(
            global_message::Ack { revision: 12 },
        ))));
        assert_eq!(
            acked,
            [Action::Acknowledged {
                lags: vec![Duration::from_secs(5)]
            }],
            "the change sent at 0 s, acknowledged at 5 s"
        );
        let again = h.on(Event::Received(global(global_message::Kind::Ack(
            global_message::Ack { revision: 9 },
        ))));
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(h.uplink.acked(), 12, "an older ack never moves it back");
    }

    #[test]
    fn too_short_an_interval_is_raised_and_a_missing_timeout_is_three_beats() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let mut message = accepted(None, 0, 0);
        if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
            a.heartbeat_interval = Some(to_proto_duration(Duration::from_millis(10)));
            a.zone_timeout = None;
        }
        h.on(Event::Received(message));
        assert_eq!(h.uplink.heartbeat_interval(), Some(MIN_HEARTBEAT_INTERVAL));
        // Silent global: closed once more than 3 s passed.
        assert!(!h
            .advance(3)
            .iter()
            .any(|a| matches!(a, Action::Close { .. })));
        let a = h.advance(1);
        assert_eq!(closed(&a).0, "zone_timeout");
    }

    #[test]
    fn an_accepted_without_heartbeat_interval_is_a_protocol_violation() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let mut message = accepted(None, 5, 15);
        if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
            a.heartbeat_interval = None;
        }
        let a = h.on(Event::Received(message));
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("protocol_violation", true));
        assert!(reason.contains("heartbeat_interval"), "{reason}");
    }

    /// A rogue (or impersonated) global's numbers: each one out of bounds
    /// ends the stream to be retried with what was wrong, and nothing
    /// overflows (a heartbeat every i64::MAX seconds overflowed
    /// `interval * 3` and killed the uplink's task for good).
    #[test]
    fn a_globals_durations_out_of_bounds_are_protocol_violations_not_panics() {
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        };
        let beyond = |d: Duration| to_proto_duration(d + Duration::from_secs(1));
        let cases: Vec<(
            &str,
            Option<prost_types::Duration>,
            Option<prost_types::Duration>,
        )> = vec![
            ("heartbeat_interval", Some(huge), None),
            ("heartbeat_interval", Some(huge), Some(huge)),
            (
                "heartbeat_interval",
                Some(beyond(MAX_HEARTBEAT_INTERVAL)),
                None,
            ),
            (
                "zone_timeout",
                Some(to_proto_duration(Duration::from_secs(5))),
                Some(huge),
            ),
            (
                "zone_timeout",
                Some(to_proto_duration(Duration::from_secs(5))),
                Some(beyond(MAX_ZONE_TIMEOUT)),
            ),
            (
                "heartbeat_interval",
                Some(prost_types::Duration {
                    seconds: 5,
                    nanos: -1,
                }),
                None,
            ),
            (
                "heartbeat_interval",
                Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                }),
                None,
            ),
        ];
        for (what, interval, timeout) in cases {
            let mut h = Harness::new();
            h.on(Event::Opened);
            let mut message = accepted(None, 5, 15);
            if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
                a.heartbeat_interval = interval;
                a.zone_timeout = timeout;
            }
            let a = h.on(Event::Received(message));
            let (code, reason, retry) = closed(&a);
            assert_eq!(
                (code, retry),
                ("protocol_violation", true),
                "{what}: {reason}"
            );
            assert!(reason.contains(what), "{what}: {reason}");
            assert!(h.uplink.deadline().is_none());
        }
        // The longest interval and timeout allowed are followed, and their
        // deadlines are computed without overflow.
        let mut h = Harness::new();
        h.on(Event::Opened);
        let mut message = accepted(None, 5, 15);
        if let Some(global_message::Kind::Accepted(a)) = &mut message.kind {
            a.heartbeat_interval = Some(to_proto_duration(MAX_HEARTBEAT_INTERVAL));
            a.zone_timeout = None;
        }
        h.on(Event::Received(message));
        assert_eq!(h.uplink.heartbeat_interval(), Some(MAX_HEARTBEAT_INTERVAL));
        assert_eq!(
            h.uplink.deadline(),
            Some(plus(t0(), MAX_HEARTBEAT_INTERVAL))
        );
        let mut h = Harness::new();
        h.on(Event::Opened);
        h.on(Event::Received(accepted(
            None,
            5,
            MAX_ZONE_TIMEOUT.as_secs(),
        )));
        assert!(h.uplink.is_accepted());
    }

    /// A global's text is escaped and cut, and a code this zone does not
    /// know never becomes a metric label.
    #[test]
    fn a_globals_codes_and_messages_are_kept_escaped_cut_and_known() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        let forged = format!(
            "no\n2026-01-01T00:00:00Z ERROR hdsd: forged{}",
            "x".repeat(100_000)
        );
        let a = h.on(Event::Received(refused(
            &"evil".repeat(10_000),
            &forged,
            false,
        )));
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("protocol_violation", true));
        assert!(
            !reason.contains('\n') && reason.len() < 2 * 1024,
            "{} bytes",
            reason.len()
        );
        assert!(reason.contains("which this zone does not know"), "{reason}");
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(global(global_message::Kind::Rejected(
            global_message::Rejected {
                code: "mesh_not_allowed".into(),
                message: forged.clone(),
                ..Default::default()
            },
        ))));
        match &a[..] {
            [Action::Problem { code, message }] => {
                assert_eq!(code, "mesh_not_allowed");
                assert!(!message.contains('\n') && message.len() < 2 * 1024);
            }
            other => panic!("{other:?}"),
        }
    }

    /// An Ack of a revision the zone never sent is a protocol violation.
    #[test]
    fn an_ack_beyond_what_was_sent_is_a_protocol_violation() {
        let mut h = Harness::accepted(None);
        h.on(Event::FeedSnapshot {
            revision: 12,
            items: vec![dp("web", 12)],
        });
        let ack = |revision| global(global_message::Kind::Ack(global_message::Ack { revision }));
        assert!(h
            .on(Event::Received(ack(12)))
            .iter()
            .all(|a| !matches!(a, Action::Close { .. })));
        assert_eq!(h.uplink.acked(), 12);
        let a = h.on(Event::Received(ack(u64::MAX)));
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("protocol_violation", true));
        assert!(
            reason.contains("18446744073709551615") && reason.contains("12"),
            "{reason}"
        );
    }

    #[test]
    fn no_answer_to_the_hello_closes_to_retry() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        assert!(h.advance(9).is_empty());
        let a = h.advance(1);
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("hello_timeout", true));
        assert!(reason.contains("10s"), "{reason}");
    }

    #[test]
    fn a_silent_global_closes_the_stream_after_its_zone_timeout() {
        let mut h = Harness::accepted(None);
        // Heartbeats at 5 and 10 s; nothing back.
        assert_eq!(sent(&h.advance(5)).len(), 1);
        assert_eq!(sent(&h.advance(5)).len(), 1);
        assert!(
            h.advance(5)
                .iter()
                .all(|a| !matches!(a, Action::Close { .. })),
            "exactly 15 s is not yet too long"
        );
        let a = h.advance(1);
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("zone_timeout", true));
        assert!(reason.contains("15s"), "{reason}");
    }

    #[test]
    fn the_deadline_is_the_next_heartbeat_or_the_silence_limit() {
        let mut h = Harness::accepted(None);
        assert_eq!(
            h.uplink.deadline(),
            Some(plus(t0(), Duration::from_secs(5)))
        );
        h.advance(5);
        assert_eq!(
            h.uplink.deadline(),
            Some(plus(t0(), Duration::from_secs(10)))
        );
        h.advance(5);
        // Next heartbeat at 15 s; the silence limit just after 15 s.
        assert_eq!(
            h.uplink.deadline(),
            Some(plus(t0(), Duration::from_secs(15)))
        );
    }

    #[test]
    fn a_clock_stepping_back_sends_a_heartbeat_and_counts_again() {
        let mut h = Harness::accepted(None);
        h.now = plus(t0(), Duration::from_secs(3));
        h.on(Event::Tick);
        h.now = t0() - chrono::Duration::seconds(3600);
        let a = h.on(Event::Tick);
        assert_eq!(
            sent(&a).len(),
            1,
            "a heartbeat rather than an hour of silence"
        );
        assert!(!h.uplink.is_closed());
        // Hello deadline too.
        let mut h = Harness::new();
        h.on(Event::Opened);
        h.now = t0() - chrono::Duration::seconds(3600);
        assert!(h.on(Event::Tick).is_empty());
        assert_eq!(h.uplink.deadline(), Some(plus(h.now, HELLO_TIMEOUT)));
    }

    #[test]
    fn rejections_are_reported_and_the_stream_goes_on() {
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(global(global_message::Kind::Rejected(
            global_message::Rejected {
                code: "mesh_not_allowed".into(),
                message: "zone \"eu-1\" may not sync mesh \"payments\"".into(),
                mesh: "payments".into(),
                name: "web".into(),
            },
        ))));
        assert!(matches!(&a[..], [Action::Problem { code, .. }] if code == "mesh_not_allowed"));
        assert!(h.uplink.is_accepted());
    }

    #[test]
    fn out_of_order_messages_are_protocol_violations() {
        // An Ack instead of Accepted.
        let mut h = Harness::new();
        h.on(Event::Opened);
        let a = h.on(Event::Received(global(global_message::Kind::Ack(
            global_message::Ack { revision: 1 },
        ))));
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("protocol_violation", true));
        assert!(reason.contains("Ack"), "{reason}");
        // A second Accepted.
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(accepted(None, 5, 15)));
        assert_eq!(closed(&a).0, "protocol_violation");
        // A refusal without a code still closes, with a code.
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(refused("", "no", false)));
        assert_eq!(closed(&a).0, "protocol_violation");
        // A message of a kind this release does not know is reported, not fatal.
        let mut h = Harness::accepted(None);
        let a = h.on(Event::Received(pb::GlobalMessage { kind: None }));
        assert!(matches!(&a[..], [Action::Problem { .. }]));
        assert!(h.uplink.is_accepted());
    }

    #[test]
    fn feed_events_before_acceptance_are_ignored_and_a_closed_transport_retries() {
        let mut h = Harness::new();
        h.on(Event::Opened);
        assert!(h.on(Event::FeedChange(dp("web", 1))).is_empty());
        assert!(h
            .on(Event::FeedSnapshot {
                revision: 1,
                items: vec![]
            })
            .is_empty());
        assert!(h
            .on(Event::FeedResync {
                reason: "overflow".into()
            })
            .is_empty());
        let a = h.on(Event::Closed {
            error: Some("connection reset".into()),
        });
        let (code, reason, retry) = closed(&a);
        assert_eq!((code, retry), ("stream_closed", true));
        assert!(reason.contains("connection reset"), "{reason}");
    }
}
