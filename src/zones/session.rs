//! The global's side of one zone's sync stream as a state machine: events
//! in, actions out.
//!
//! The zone is who its credential says ([`ZoneCredential`], verified by the
//! driver before the machine exists): no message can name another zone, or
//! a mesh the credential does not allow. The rules:
//!
//! - The first message must be a Hello, within `hello_timeout`; anything
//!   else is refused (`protocol_violation`, `hello_timeout`).
//! - The Hello's protocol version must fit the skew rule
//!   ([`check_versions`]: the global's own version or the one before),
//!   else `version_incompatible`, naming both versions.
//! - A disabled zone is refused (`zone_disabled`); an unknown one too
//!   (`zone_unregistered`) unless the global registers zones itself
//!   (`auto_register`), in which case [`Action::Register`] comes first.
//!   Each message names the fix that fits who disabled it, or how to
//!   register it (`hdsd zone add`, the configuration).
//! - A zone token issued at or before the zone's last deletion is refused
//!   (`unauthenticated`): deleting a zone stops its tokens, also once the
//!   zone is registered again ([`Admission::tokens_not_before`]).
//! - A zone disabled or deleted while its stream is open ends it
//!   ([`Event::Disabled`], [`Event::Deleted`]); tokens retired while it is
//!   open end it when its own token is among them ([`Event::TokensRetired`]).
//! - Then [`Action::Claim`]: the driver asks the zone's
//!   [`RemoteZone`](super::remote::RemoteZone) for the uplink with the
//!   Hello's epoch and answers [`Event::Claimed`] (with the revision it
//!   holds) or [`Event::ClaimLost`] (`stale_epoch`). The stream is accepted
//!   only then: `Accepted` names the heartbeat interval, the zone timeout
//!   and, to a zone that can resume, `resume_from`. A stream superseded
//!   later by one with a higher epoch ends (`superseded`).
//! - A snapshot begins with a chunk marked `begin`; its dataplanes are
//!   upserted as they come, and deletions wait: only `SnapshotComplete`
//!   tells the driver what to keep ([`Action::SnapshotComplete`]), so a
//!   dataplane not sent again *yet* is never deleted. An explicit deletion
//!   during a snapshot is folded into it (the dataplane is left out of
//!   `keep`).
//! - Changes before the first snapshot of a stream that was not resumed are
//!   refused (`protocol_violation`): the global would hold a partial zone.
//! - A dataplane of a mesh the credential does not allow, or with an
//!   invalid mesh or name, is left out and reported with a `Rejected`
//!   message once per code and mesh on the stream; the stream goes on (one
//!   misplaced dataplane must not take a zone's sync down).
//! - Each received batch is acknowledged at most once: an `Ack` when the
//!   revision held moved or the batch had a heartbeat (so the zone hears
//!   from the global at least once per heartbeat interval).
//! - Every message of an accepted stream is a sign of life
//!   ([`Action::Heartbeat`], once per batch, at the global's `now`); a
//!   stream silent for longer than `zone_timeout` (the [`liveness`] rule)
//!   ends (`zone_timeout`).
//!
//! [`liveness`]: super::liveness

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::liveness::{self, LivenessInputs, ZoneState};
use super::{check_versions, elapsed, human, plus, to_proto_duration, Code, Meshes, PeerVersion};
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::pb;
use crate::pb::global_message;
use crate::pb::zone_message::{self, change};

/// How long a global waits for a zone's Hello, by default.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The most capabilities a Hello may name.
pub const MAX_CAPABILITIES: usize = 64;
/// The most `Rejected` messages one stream gets (one per code and mesh);
/// further dataplanes left out are only counted ([`Session::rejected`]).
pub const MAX_REJECTED_MESSAGES: usize = 64;
/// The longest capability, instance name or hdsd release a Hello may carry.
pub const MAX_HELLO_TEXT: usize = 253;

/// The global's side of the protocol: what it says of itself and asks of zones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// The global's protocol version and release.
    pub version: PeerVersion,
    /// The capabilities named in `Accepted`.
    pub capabilities: Vec<String>,
    /// How often zones send a heartbeat.
    pub heartbeat_interval: Duration,
    /// After this long without a message, a zone is offline and its stream ends.
    pub zone_timeout: Duration,
    /// How long a new stream may take to send its Hello.
    pub hello_timeout: Duration,
    /// `global.auto_register`: a zone the global does not know is
    /// registered when it first connects, instead of refused.
    pub auto_register: bool,
}

impl SessionSettings {
    /// This hdsd's version and capabilities, [`HELLO_TIMEOUT`], no auto-registration.
    pub fn new(heartbeat_interval: Duration, zone_timeout: Duration) -> SessionSettings {
        SessionSettings {
            version: PeerVersion::ours(),
            capabilities: super::CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            heartbeat_interval,
            zone_timeout,
            hello_timeout: HELLO_TIMEOUT,
            auto_register: false,
        }
    }
}

/// Who is on the other end, from the verified credential (never from a message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneCredential {
    /// The zone's name (checked by `names::check_zone` where the credential is read).
    pub zone: String,
    /// The meshes the zone may sync.
    pub meshes: Meshes,
    /// When the credential was issued (a zone token's `iat`), if known.
    pub issued_at: Option<Timestamp>,
}

/// Where an operator disabled a zone: the fix differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisabledBy {
    /// `global.disabled` in the global's configuration.
    Config,
    /// The API (`hdsd zone disable`).
    Api,
}

/// What the global's registry says of the zone when its stream opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Registered and enabled.
    Registered,
    /// Registered, and disabled by an operator.
    Disabled(DisabledBy),
    /// Not registered.
    Unknown,
}

/// What the hub says of a zone when its stream opens: its registration,
/// and the time at or before which its tokens were issued in vain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub registration: Registration,
    /// The zone's last deletion: a token issued at or before it is refused.
    pub tokens_not_before: Option<Timestamp>,
}

impl From<Registration> for Admission {
    fn from(registration: Registration) -> Admission {
        Admission {
            registration,
            tokens_not_before: None,
        }
    }
}

/// Why a token of `zone` issued at `issued_at` is refused when the zone's
/// tokens were retired at `not_before` (a deletion), if it is. Token times
/// are whole seconds: a token issued in the second of the deletion counts
/// as issued before it.
pub fn retired_token(
    zone: &str,
    issued_at: Option<Timestamp>,
    not_before: Option<Timestamp>,
) -> Option<String> {
    let not_before = not_before?;
    let fix = format!(
        "issue a new one on the global with `hdsd token issue --zone {zone} --mesh MESH` and write it to zone.token_file"
    );
    match issued_at {
        Some(iat) if iat > not_before => None,
        Some(iat) => Some(format!(
            "the zone token was issued at {} and zone {zone:?} was deleted at the global at {}: a zone's tokens issued before its deletion stay refused, also once it is registered again; {fix}",
            iat.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            not_before.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )),
        None => Some(format!(
            "the zone token names no issue time and zone {zone:?} was deleted at the global at {}; {fix}",
            not_before.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )),
    }
}

/// What the zone reads when the global refuses it as `registration` (`None`:
/// accepted as far as registration goes).
fn registration_refusal(
    zone: &str,
    registration: Registration,
    auto_register: bool,
) -> Option<(Code, String)> {
    match registration {
        Registration::Disabled(DisabledBy::Config) => Some((
            Code::ZoneDisabled,
            format!(
                "zone {zone:?} is disabled at the global: remove it from global.disabled in the global's configuration and restart the global; until then the global refuses its streams"
            ),
        )),
        Registration::Disabled(DisabledBy::Api) => Some((
            Code::ZoneDisabled,
            format!(
                "zone {zone:?} is disabled at the global: run `hdsd zone enable {zone}` against the global's API (POST /api/v1/zones/{zone}/enable); until then the global refuses its streams"
            ),
        )),
        Registration::Unknown if !auto_register => Some((
            Code::ZoneUnregistered,
            format!(
                "zone {zone:?} is not registered at the global: run `hdsd zone add {zone}` against the global's API (PUT /api/v1/zones/{zone}), or add it to global.zones in the global's configuration and restart the global (or set global.auto_register = true)"
            ),
        )),
        Registration::Unknown | Registration::Registered => None,
    }
}

/// Something that happened to the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Messages from the zone: every one the driver could read without
    /// waiting (at most one `Ack` answers them all).
    Received(Vec<pb::ZoneMessage>),
    /// After [`Action::Claim`]: this stream holds the zone's uplink; the
    /// global holds the zone's dataplanes up to `resume_from` (`None`: it
    /// holds no complete state, a snapshot is needed).
    Claimed {
        /// [`RemoteZone::resume_from`](super::remote::RemoteZone::resume_from).
        resume_from: Option<u64>,
    },
    /// After [`Action::Claim`]: a stream with a higher epoch holds the uplink.
    ClaimLost {
        /// The epoch held.
        epoch: u64,
        /// The instance that holds it.
        instance: String,
    },
    /// After [`Action::Claim`]: a supersede storm, another source holds the
    /// uplink and keeps it ([`Claim::Contested`](super::remote::Claim::Contested)).
    Contested {
        /// The holder (`instance ... at address`).
        holder: String,
        /// This stream's source, named the same way.
        claimant: String,
        /// Contests within the storm window, this one included.
        contests: usize,
    },
    /// A newer stream of the zone (`epoch`, from `instance`) took the uplink over.
    Superseded {
        /// The newer stream's epoch.
        epoch: u64,
        /// The newer stream's instance.
        instance: String,
    },
    /// An operator disabled the zone while the stream is open.
    Disabled(DisabledBy),
    /// An operator deleted the zone while the stream is open.
    Deleted,
    /// The zone's tokens issued at or before this time were retired (the
    /// zone was deleted elsewhere, but the configuration here names it).
    TokensRetired(Timestamp),
    /// The global is shutting down.
    Drain,
    /// The zone closed the stream, or the transport failed.
    Closed {
        /// What the transport said.
        error: Option<String>,
    },
    /// Time passed: the driver's timer for [`Session::deadline`] fired.
    Tick,
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this message to the zone.
    Send(pb::GlobalMessage),
    /// Register the zone (`auto_register`; it was unknown).
    Register,
    /// Claim the zone's uplink for this stream with the Hello's `epoch`
    /// ([`RemoteZone::claim`](super::remote::RemoteZone::claim)), then
    /// deliver [`Event::Claimed`] or [`Event::ClaimLost`].
    Claim {
        /// The Hello's lease epoch.
        epoch: u64,
        /// The Hello's instance.
        instance: String,
    },
    /// The stream is accepted at this time (liveness: the stream opened).
    Connected(Timestamp),
    /// A dataplane of the zone, created or changed, at the zone's `revision`.
    Upsert {
        /// Its validated identity.
        id: DataplaneId,
        /// The dataplane as the zone sent it (`revision` set to `revision`),
        /// boxed: the other actions are small.
        dataplane: Box<pb::Dataplane>,
        /// The zone revision of this state.
        revision: u64,
    },
    /// A dataplane of the zone was deleted at the zone's `revision`.
    Delete {
        /// Its validated identity.
        id: DataplaneId,
        /// The zone revision of the deletion.
        revision: u64,
    },
    /// A snapshot begins: the zone's dataplanes are being sent again.
    SnapshotBegun,
    /// The snapshot is complete: delete every dataplane of the zone not in
    /// `keep`; the global holds the zone as of `revision`.
    SnapshotComplete {
        /// Every dataplane the snapshot named (and did not delete since).
        keep: BTreeSet<DataplaneId>,
        /// The zone revision the snapshot was taken at.
        revision: u64,
    },
    /// A heartbeat says the zone is up to date as of `revision`, beyond the
    /// last change: the global holds it as of there.
    Synced {
        /// The zone's revision.
        revision: u64,
    },
    /// A sign of life at this time (the global's clock): liveness's last heartbeat.
    Heartbeat(Timestamp),
    /// End the stream (after the `Refused` sent just before, if any).
    End {
        /// Why, as a stable code.
        code: Code,
        /// What happened, for the log.
        reason: String,
    },
}

/// What the Hello said.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hello {
    version: PeerVersion,
    capabilities: Vec<String>,
    epoch: u64,
    instance: String,
}

#[derive(Debug, Clone)]
struct Live {
    /// The zone is held complete as of this revision (`None`: not yet).
    held: Option<u64>,
    /// The last revision acknowledged on this stream.
    acked: Option<u64>,
    /// While a snapshot is in progress: the dataplanes it named.
    snapshot: Option<BTreeSet<DataplaneId>>,
    /// The session's own liveness inputs (the global's clock).
    liveness: LivenessInputs,
}

#[derive(Debug, Clone)]
enum Phase {
    AwaitingHello { since: Timestamp },
    Claiming,
    Accepted(Box<Live>),
    Ended,
}

/// The global's side of one zone stream.
#[derive(Debug, Clone)]
pub struct Session {
    settings: Arc<SessionSettings>,
    credential: ZoneCredential,
    admission: Admission,
    hello: Option<Hello>,
    /// The (code, mesh) pairs already reported with `Rejected`.
    reported: BTreeSet<(Code, String)>,
    /// Dataplanes left out on this stream.
    rejected: u64,
    phase: Phase,
}

impl Session {
    /// A stream of the zone `credential` names, opened at `now`.
    pub fn new(
        settings: Arc<SessionSettings>,
        credential: ZoneCredential,
        admission: impl Into<Admission>,
        now: Timestamp,
    ) -> Session {
        Session {
            settings,
            credential,
            admission: admission.into(),
            hello: None,
            reported: BTreeSet::new(),
            rejected: 0,
            phase: Phase::AwaitingHello { since: now },
        }
    }

    /// The zone's name, from its credential.
    pub fn zone(&self) -> &str {
        &self.credential.zone
    }

    /// When the driver must deliver [`Event::Tick`] next, if ever.
    pub fn deadline(&self) -> Option<Timestamp> {
        match &self.phase {
            Phase::AwaitingHello { since } => Some(plus(*since, self.settings.hello_timeout)),
            // The first moment the liveness rule says offline.
            Phase::Accepted(l) => l
                .liveness
                .last_seen()
                .map(|seen| plus(seen, self.settings.zone_timeout + Duration::from_nanos(1))),
            Phase::Claiming | Phase::Ended => None,
        }
    }

    /// True once the stream ended.
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
    }

    /// True while the stream is accepted.
    pub fn is_accepted(&self) -> bool {
        matches!(self.phase, Phase::Accepted(_))
    }

    /// The zone revision held complete on this stream, once accepted.
    pub fn held(&self) -> Option<u64> {
        match &self.phase {
            Phase::Accepted(l) => l.held,
            _ => None,
        }
    }

    /// True while a snapshot is in progress.
    pub fn in_snapshot(&self) -> bool {
        matches!(&self.phase, Phase::Accepted(l) if l.snapshot.is_some())
    }

    /// The zone's version, once its Hello came.
    pub fn zone_version(&self) -> Option<&PeerVersion> {
        self.hello.as_ref().map(|h| &h.version)
    }

    /// The zone's capabilities, once its Hello came.
    pub fn zone_capabilities(&self) -> &[String] {
        self.hello.as_ref().map_or(&[], |h| &h.capabilities)
    }

    /// The Hello's lease epoch and instance, once it came.
    pub fn uplink(&self) -> Option<(u64, &str)> {
        self.hello.as_ref().map(|h| (h.epoch, h.instance.as_str()))
    }

    /// Dataplanes left out on this stream (mesh not allowed, invalid).
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Applies one event at `now` (the global's clock), appending what to
    /// do to `actions`.
    pub fn handle(&mut self, event: Event, now: Timestamp, actions: &mut Vec<Action>) {
        if self.is_ended() {
            return;
        }
        match event {
            Event::Received(batch) => self.received(batch, now, actions),
            Event::Claimed { resume_from } => self.claimed(resume_from, now, actions),
            Event::ClaimLost { epoch, instance } => {
                if matches!(self.phase, Phase::Claiming) {
                    let (own, own_instance) = self.uplink().map_or((0, ""), |(e, i)| (e, i));
                    let message = format!(
                        "zone {:?}: instance {own_instance:?} dialed with uplink lease epoch {own}, but the global already accepted epoch {epoch} from instance {instance:?}: only the instance holding the zone's uplink lease syncs; this one waits until it wins the lease with a higher epoch",
                        self.credential.zone
                    );
                    self.refuse(Code::StaleEpoch, message, actions)
                }
            }
            Event::Contested {
                holder,
                claimant,
                contests,
            } => {
                if matches!(self.phase, Phase::Claiming) {
                    let zone = &self.credential.zone;
                    let message = format!(
                        "zone {zone:?}: two holders of its credential dial in turn (a supersede storm: {contests} claims within {} contested an online holder): {holder} holds the uplink and keeps it, {claimant} is refused; one zone token (or certificate) belongs to one zone: stop the copy, or revoke the token (`hdsd token revoke JTI`) and issue one per zone (`hdsd token issue --zone NAME --mesh MESH`)",
                        human(super::remote::STORM_WINDOW)
                    );
                    self.refuse(Code::UplinkContested, message, actions)
                }
            }
            Event::Superseded { epoch, instance } => {
                let (own, own_instance) = self.uplink().map_or((0, ""), |(e, i)| (e, i));
                let message = format!(
                    "zone {:?}: a newer uplink (epoch {epoch} from instance {instance:?}) took over the zone's sync; this stream (epoch {own} from instance {own_instance:?}) ends",
                    self.credential.zone
                );
                self.refuse(Code::Superseded, message, actions)
            }
            Event::Disabled(by) => {
                let zone = self.credential.zone.clone();
                if let Some((code, message)) =
                    registration_refusal(&zone, Registration::Disabled(by), false)
                {
                    self.refuse(code, message, actions)
                }
            }
            Event::Deleted => {
                let zone = &self.credential.zone;
                let message = format!(
                    "zone {zone:?} was deleted at the global: its stream ends and the global refuses it until it is registered again (run `hdsd zone add {zone}` against the global's API); the zone tokens issued until now stay refused, so then also issue a new one (`hdsd token issue --zone {zone} --mesh MESH`)"
                );
                self.refuse(Code::ZoneUnregistered, message, actions)
            }
            Event::TokensRetired(not_before) => {
                if let Some(message) = retired_token(
                    &self.credential.zone,
                    self.credential.issued_at,
                    Some(not_before),
                ) {
                    self.refuse(Code::Unauthenticated, message, actions)
                }
            }
            Event::Drain => self.refuse(
                Code::ShuttingDown,
                "the global is shutting down; the zone reconnects (to another instance of the global, or to this one once it is back)".to_string(),
                actions,
            ),
            Event::Closed { error } => {
                let reason = match error {
                    Some(e) => format!("the stream of zone {:?} failed: {e}", self.credential.zone),
                    None => format!("zone {:?} closed its stream", self.credential.zone),
                };
                self.phase = Phase::Ended;
                actions.push(Action::End {
                    code: Code::StreamClosed,
                    reason,
                });
            }
            Event::Tick => self.tick(now, actions),
        }
    }

    fn received(&mut self, batch: Vec<pb::ZoneMessage>, now: Timestamp, actions: &mut Vec<Action>) {
        let accepted_before = self.is_accepted();
        let mut heartbeat = false;
        let mut any = false;
        for message in batch {
            if self.is_ended() {
                return;
            }
            any = true;
            let Some(kind) = message.kind else {
                return self.violation(
                    "a message of no kind this global knows (is the zone newer than the global?)",
                    actions,
                );
            };
            match &self.phase {
                Phase::AwaitingHello { .. } => match kind {
                    zone_message::Kind::Hello(hello) => self.hello(hello, now, actions),
                    other => {
                        let what = format!(
                            "the first message of a stream must be a Hello, not {}",
                            zone_kind(&other)
                        );
                        return self.violation(&what, actions);
                    }
                },
                Phase::Claiming => {
                    let what = format!("{} before the global answered the Hello", zone_kind(&kind));
                    return self.violation(&what, actions);
                }
                Phase::Accepted(_) => {
                    if matches!(kind, zone_message::Kind::Heartbeat(_)) {
                        heartbeat = true;
                    }
                    self.message(kind, actions);
                }
                Phase::Ended => return,
            }
        }
        // Only messages of a stream already accepted count as signs of life.
        let Phase::Accepted(l) = &mut self.phase else {
            return;
        };
        if !(any && accepted_before) {
            return;
        }
        l.liveness.heartbeat(now, self.settings.zone_timeout);
        actions.push(Action::Heartbeat(now));
        let revision = l.held.unwrap_or(0);
        if heartbeat || (l.held.is_some() && l.acked != l.held) {
            l.acked = Some(revision);
            actions.push(Action::Send(global(global_message::Kind::Ack(
                global_message::Ack { revision },
            ))));
        }
    }

    fn hello(&mut self, hello: zone_message::Hello, now: Timestamp, actions: &mut Vec<Action>) {
        let zone = self.credential.zone.clone();
        if let Some(what) = hello_problem(&hello) {
            return self.violation(&what, actions);
        }
        // Before anything is claimed or superseded: a zone configured as
        // another zone than its credential names (a copied token) must not
        // knock the credential's zone out.
        if !hello.zone.is_empty() && hello.zone != zone {
            let named = crate::names::shown(&hello.zone);
            let message = format!(
                "the zone's zone.name is {named}, but its token (or client certificate) names zone {zone:?}: a zone dials with a credential for its own name; issue a token for it on the global (`hdsd token issue --zone NAME --mesh MESH`) and put it in zone.token_file (or a certificate with the URI SAN hdsd://zone/NAME), or set zone.name = {zone:?}"
            );
            return self.refuse(Code::ZoneNameMismatch, message, actions);
        }
        if let Some(ahead) = epoch_ahead(hello.epoch, now) {
            return self.refuse(Code::EpochAhead, ahead, actions);
        }
        let version = PeerVersion {
            protocol: hello.protocol_version,
            hdsd: hello.hdsd_version,
        };
        if let Err(skew) = check_versions(&zone, &version, &self.settings.version) {
            return self.refuse(Code::VersionIncompatible, skew.to_string(), actions);
        }
        self.hello = Some(Hello {
            version,
            capabilities: hello.capabilities,
            epoch: hello.epoch,
            instance: hello.instance.clone(),
        });
        let Admission {
            registration,
            tokens_not_before,
        } = self.admission;
        if let Some((code, message)) =
            registration_refusal(&zone, registration, self.settings.auto_register)
        {
            return self.refuse(code, message, actions);
        }
        if let Some(message) = retired_token(&zone, self.credential.issued_at, tokens_not_before) {
            return self.refuse(Code::Unauthenticated, message, actions);
        }
        if registration == Registration::Unknown {
            actions.push(Action::Register);
        }
        self.phase = Phase::Claiming;
        actions.push(Action::Claim {
            epoch: hello.epoch,
            instance: hello.instance,
        });
    }

    fn claimed(&mut self, resume_from: Option<u64>, now: Timestamp, actions: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Claiming) {
            return;
        }
        let resumes = self
            .zone_capabilities()
            .iter()
            .any(|c| c == super::CAPABILITY_RESUME);
        let held = resume_from.filter(|_| resumes);
        let mut liveness = LivenessInputs::default();
        liveness.opened(now, self.settings.zone_timeout);
        self.phase = Phase::Accepted(Box::new(Live {
            held,
            acked: None,
            snapshot: None,
            liveness,
        }));
        let s = &self.settings;
        actions.push(Action::Send(global(global_message::Kind::Accepted(
            global_message::Accepted {
                protocol_version: s.version.protocol,
                capabilities: s.capabilities.clone(),
                hdsd_version: s.version.hdsd.clone(),
                heartbeat_interval: Some(to_proto_duration(s.heartbeat_interval)),
                zone_timeout: Some(to_proto_duration(s.zone_timeout)),
                resume_from: held,
                zone: self.credential.zone.clone(),
            },
        ))));
        actions.push(Action::Connected(now));
    }

    /// One message of an accepted stream.
    fn message(&mut self, kind: zone_message::Kind, actions: &mut Vec<Action>) {
        match kind {
            zone_message::Kind::Hello(_) => self.violation("a second Hello on one stream", actions),
            zone_message::Kind::Snapshot(chunk) => {
                let Phase::Accepted(l) = &mut self.phase else {
                    return;
                };
                if chunk.begin {
                    l.snapshot = Some(BTreeSet::new());
                    l.held = None;
                    actions.push(Action::SnapshotBegun);
                } else if l.snapshot.is_none() {
                    return self.violation(
                        "a snapshot chunk without `begin` while no snapshot is in progress",
                        actions,
                    );
                }
                for dataplane in chunk.dataplanes {
                    let Some(id) = self.admit(&dataplane.mesh, &dataplane.name, actions) else {
                        continue;
                    };
                    let revision = dataplane.revision;
                    if let Phase::Accepted(l) = &mut self.phase {
                        if let Some(seen) = &mut l.snapshot {
                            seen.insert(id.clone());
                        }
                    }
                    actions.push(Action::Upsert {
                        id,
                        dataplane: Box::new(dataplane),
                        revision,
                    });
                }
            }
            zone_message::Kind::SnapshotComplete(complete) => {
                let Phase::Accepted(l) = &mut self.phase else {
                    return;
                };
                let Some(keep) = l.snapshot.take() else {
                    return self
                        .violation("SnapshotComplete while no snapshot is in progress", actions);
                };
                l.held = Some(complete.revision);
                actions.push(Action::SnapshotComplete {
                    keep,
                    revision: complete.revision,
                });
            }
            zone_message::Kind::Change(c) => self.change(c, actions),
            zone_message::Kind::Heartbeat(beat) => {
                let Phase::Accepted(l) = &mut self.phase else {
                    return;
                };
                if l.snapshot.is_none() && l.held.is_some_and(|h| beat.revision > h) {
                    l.held = Some(beat.revision);
                    actions.push(Action::Synced {
                        revision: beat.revision,
                    });
                }
            }
        }
    }

    fn change(&mut self, c: zone_message::Change, actions: &mut Vec<Action>) {
        let Some(kind) = c.kind else {
            return self.violation("a Change with neither an upsert nor a deletion", actions);
        };
        if let Phase::Accepted(l) = &self.phase {
            if l.held.is_none() && l.snapshot.is_none() {
                return self.violation(
                    "a Change before the snapshot the global asked for (Accepted without resume_from)",
                    actions,
                );
            }
        }
        let (mesh, name) = match &kind {
            change::Kind::Upsert(d) => (d.mesh.as_str(), d.name.as_str()),
            change::Kind::Deleted(d) => (d.mesh.as_str(), d.name.as_str()),
        };
        let Some(id) = self.admit(mesh, name, actions) else {
            return;
        };
        let Phase::Accepted(l) = &mut self.phase else {
            return;
        };
        let revision = c.revision;
        match (kind, &mut l.snapshot) {
            (change::Kind::Upsert(mut dataplane), snapshot) => {
                if let Some(seen) = snapshot {
                    seen.insert(id.clone());
                }
                dataplane.revision = revision;
                actions.push(Action::Upsert {
                    id,
                    dataplane: Box::new(dataplane),
                    revision,
                });
            }
            // Folded into the snapshot: left out of what it keeps.
            (change::Kind::Deleted(_), Some(seen)) => {
                seen.remove(&id);
            }
            (change::Kind::Deleted(_), None) => actions.push(Action::Delete { id, revision }),
        }
        if l.snapshot.is_none() {
            l.held = l.held.map(|h| h.max(revision));
        }
    }

    /// The dataplane's identity, when it is valid and its mesh allowed;
    /// otherwise `None`, reported once per code and mesh.
    fn admit(&mut self, mesh: &str, name: &str, actions: &mut Vec<Action>) -> Option<DataplaneId> {
        let zone = &self.credential.zone;
        let (code, message) = match DataplaneId::try_new(mesh, name) {
            Err(e) => (
                Code::InvalidDataplane,
                format!(
                    "zone {zone:?} sent a dataplane the global cannot take (mesh {mesh:?}, name {name:?}): {e}; it is left out (rename it in the zone); others with this problem in mesh {mesh:?} are left out too, without another message"
                ),
            ),
            Ok(id) if self.credential.meshes.allows(&id.mesh) => return Some(id),
            Ok(_) => (
                Code::MeshNotAllowed,
                format!(
                    "zone {zone:?} may not sync mesh {mesh:?} (its credential allows: {}): dataplane {name:?} and every other of that mesh are left out; give the zone a credential that allows mesh {mesh:?}, or move the dataplanes to an allowed mesh",
                    self.credential.meshes
                ),
            ),
        };
        self.rejected += 1;
        if self.reported.len() < MAX_REJECTED_MESSAGES
            && self.reported.insert((code, mesh.to_string()))
        {
            actions.push(Action::Send(global(global_message::Kind::Rejected(
                global_message::Rejected {
                    code: code.as_str().to_string(),
                    message,
                    mesh: mesh.to_string(),
                    name: name.to_string(),
                },
            ))));
        }
        None
    }

    fn tick(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        let zone = self.credential.zone.clone();
        let timeout = self.settings.zone_timeout;
        match &mut self.phase {
            Phase::AwaitingHello { since } => match elapsed(*since, now) {
                // The clock stepped back: count from now.
                None => *since = now,
                Some(waited) if waited >= self.settings.hello_timeout => {
                    let message = format!(
                        "zone {zone:?} sent no Hello within {} of opening the stream: the first message must be a Hello; the zone reconnects",
                        human(self.settings.hello_timeout)
                    );
                    self.refuse(Code::HelloTimeout, message, actions)
                }
                Some(_) => {}
            },
            Phase::Accepted(l) => {
                // The clock stepped back behind the last sign of life: count from now.
                if l.liveness.last_seen().is_some_and(|seen| now < seen) {
                    l.liveness.stream_opened = Some(now);
                    l.liveness.last_heartbeat = Some(now);
                }
                if liveness::state(&l.liveness, now, timeout).state == ZoneState::Offline {
                    let message = format!(
                        "nothing from zone {zone:?} for more than {} (zone_timeout): the global shows it offline and ends the stream; the zone reconnects",
                        human(timeout)
                    );
                    self.refuse(Code::ZoneTimeout, message, actions)
                }
            }
            Phase::Claiming | Phase::Ended => {}
        }
    }

    fn violation(&mut self, what: &str, actions: &mut Vec<Action>) {
        let message = format!(
            "zone {:?}: {what}; the global ends the stream (the zone reconnects; if it happens again, run releases of hdsd that fit the skew rule: the global's, or the one before, at the zone)",
            self.credential.zone
        );
        self.refuse(Code::ProtocolViolation, message, actions)
    }

    /// Sends `Refused` and ends the stream.
    fn refuse(&mut self, code: Code, message: String, actions: &mut Vec<Action>) {
        actions.push(Action::Send(global(global_message::Kind::Refused(
            global_message::Refused {
                code: code.as_str().to_string(),
                message: message.clone(),
                permanent: code.permanent(),
            },
        ))));
        self.phase = Phase::Ended;
        actions.push(Action::End {
            code,
            reason: message,
        });
    }
}

/// How far ahead of the global's clock a Hello's lease epoch may be: an
/// epoch is the lease's time in microseconds when it was taken (or one
/// above the last), so more than this is a clock a day off, or a made-up
/// number that would hold the zone against every real holder.
pub const MAX_EPOCH_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// Why `epoch` is too far ahead of `now`, if it is.
fn epoch_ahead(epoch: u64, now: Timestamp) -> Option<String> {
    let now_micros = u64::try_from(now.timestamp_micros()).unwrap_or(0);
    let limit = now_micros.saturating_add(MAX_EPOCH_AHEAD.as_micros() as u64);
    (epoch > limit).then(|| {
        format!(
            "the Hello's uplink lease epoch {epoch} is more than {} ahead of the global's clock ({now_micros} microseconds): check the zone's clock (an epoch is the lease's time in microseconds); the zone reconnects",
            human(MAX_EPOCH_AHEAD)
        )
    })
}

/// What is wrong with a Hello's free text, if anything.
fn hello_problem(hello: &zone_message::Hello) -> Option<String> {
    let bad =
        |text: &str| text.chars().count() > MAX_HELLO_TEXT || text.chars().any(char::is_control);
    if bad(&hello.instance) {
        return Some(format!(
            "the Hello's instance is longer than {MAX_HELLO_TEXT} characters or has control characters"
        ));
    }
    if bad(&hello.hdsd_version) {
        return Some(format!(
            "the Hello's hdsd_version is longer than {MAX_HELLO_TEXT} characters or has control characters"
        ));
    }
    if hello.capabilities.len() > MAX_CAPABILITIES || hello.capabilities.iter().any(|c| bad(c)) {
        return Some(format!(
            "the Hello names more than {MAX_CAPABILITIES} capabilities, or one longer than {MAX_HELLO_TEXT} characters or with control characters"
        ));
    }
    None
}

fn global(kind: global_message::Kind) -> pb::GlobalMessage {
    pb::GlobalMessage { kind: Some(kind) }
}

fn zone_kind(kind: &zone_message::Kind) -> &'static str {
    match kind {
        zone_message::Kind::Hello(_) => "a Hello",
        zone_message::Kind::Snapshot(_) => "a SnapshotChunk",
        zone_message::Kind::SnapshotComplete(_) => "a SnapshotComplete",
        zone_message::Kind::Change(_) => "a Change",
        zone_message::Kind::Heartbeat(_) => "a Heartbeat",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zones::{from_proto_duration, PROTOCOL_VERSION};

    const INTERVAL: Duration = Duration::from_secs(5);
    const TIMEOUT: Duration = Duration::from_secs(15);

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn at(secs: u64) -> Timestamp {
        plus(t0(), Duration::from_secs(secs))
    }

    fn credential() -> ZoneCredential {
        ZoneCredential {
            zone: "eu-1".into(),
            meshes: Meshes::Only(["default".to_string(), "shop".to_string()].into()),
            issued_at: Some(t0() - chrono::Duration::hours(1)),
        }
    }

    fn zone(kind: zone_message::Kind) -> pb::ZoneMessage {
        pb::ZoneMessage { kind: Some(kind) }
    }

    fn hello_with(protocol_version: u32, capabilities: &[&str]) -> pb::ZoneMessage {
        zone(zone_message::Kind::Hello(zone_message::Hello {
            protocol_version,
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            hdsd_version: "0.1.0".into(),
            epoch: 3,
            instance: "zone-a".into(),
            zone: "eu-1".into(),
        }))
    }

    fn hello() -> pb::ZoneMessage {
        hello_with(PROTOCOL_VERSION, &["resume"])
    }

    fn dp(mesh: &str, name: &str, revision: u64) -> pb::Dataplane {
        pb::Dataplane {
            mesh: mesh.into(),
            name: name.into(),
            revision,
            ..Default::default()
        }
    }

    fn chunk(begin: bool, dataplanes: Vec<pb::Dataplane>) -> pb::ZoneMessage {
        zone(zone_message::Kind::Snapshot(zone_message::SnapshotChunk {
            begin,
            dataplanes,
        }))
    }

    fn complete(revision: u64) -> pb::ZoneMessage {
        zone(zone_message::Kind::SnapshotComplete(
            zone_message::SnapshotComplete { revision },
        ))
    }

    fn upsert(mesh: &str, name: &str, revision: u64) -> pb::ZoneMessage {
        zone(zone_message::Kind::Change(zone_message::Change {
            revision,
            kind: Some(change::Kind::Upsert(dp(mesh, name, 0))),
        }))
    }

    fn delete(mesh: &str, name: &str, revision: u64) -> pb::ZoneMessage {
        zone(zone_message::Kind::Change(zone_message::Change {
            revision,
            kind: Some(change::Kind::Deleted(change::Deleted {
                mesh: mesh.into(),
                name: name.into(),
            })),
        }))
    }

    fn heartbeat(revision: u64) -> pb::ZoneMessage {
        zone(zone_message::Kind::Heartbeat(zone_message::Heartbeat {
            revision,
        }))
    }

    fn id(mesh: &str, name: &str) -> DataplaneId {
        DataplaneId::new(mesh, name)
    }

    struct Harness {
        session: Session,
        now: Timestamp,
    }

    impl Harness {
        fn new(admission: impl Into<Admission>, auto_register: bool) -> Harness {
            let mut settings = SessionSettings::new(INTERVAL, TIMEOUT);
            settings.auto_register = auto_register;
            Harness {
                session: Session::new(Arc::new(settings), credential(), admission, t0()),
                now: t0(),
            }
        }

        fn on(&mut self, event: Event) -> Vec<Action> {
            let mut actions = Vec::new();
            self.session.handle(event, self.now, &mut actions);
            actions
        }

        fn receive(&mut self, messages: Vec<pb::ZoneMessage>) -> Vec<Action> {
            self.on(Event::Received(messages))
        }

        fn advance(&mut self, secs: u64) -> Vec<Action> {
            self.now = plus(self.now, Duration::from_secs(secs));
            self.on(Event::Tick)
        }

        /// Hello, claimed with `resume_from`.
        fn accepted(resume_from: Option<u64>) -> Harness {
            let mut h = Harness::new(Registration::Registered, false);
            h.receive(vec![hello()]);
            h.on(Event::Claimed { resume_from });
            h
        }

        /// Accepted without resume, one snapshot of `default/web` complete at 10.
        fn synced() -> Harness {
            let mut h = Harness::accepted(None);
            h.receive(vec![
                chunk(true, vec![dp("default", "web", 10)]),
                complete(10),
            ]);
            h
        }
    }

    fn refused(actions: &[Action]) -> &global_message::Refused {
        let refusal = actions.iter().find_map(|a| match a {
            Action::Send(pb::GlobalMessage {
                kind: Some(global_message::Kind::Refused(r)),
            }) => Some(r),
            _ => None,
        });
        let refusal = refusal.unwrap_or_else(|| panic!("no Refused: {actions:?}"));
        assert!(
            matches!(actions.last(), Some(Action::End { code, .. }) if code.as_str() == refusal.code),
            "a refusal ends the stream: {actions:?}"
        );
        refusal
    }

    fn acks(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(pb::GlobalMessage {
                    kind: Some(global_message::Kind::Ack(ack)),
                }) => Some(ack.revision),
                _ => None,
            })
            .collect()
    }

    fn rejections(actions: &[Action]) -> Vec<&global_message::Rejected> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(pb::GlobalMessage {
                    kind: Some(global_message::Kind::Rejected(r)),
                }) => Some(r),
                _ => None,
            })
            .collect()
    }

    fn upserts(actions: &[Action]) -> Vec<(String, u64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Upsert { id, revision, .. } => Some((id.to_string(), *revision)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_hello_is_claimed_then_accepted_with_the_globals_terms() {
        let mut h = Harness::new(Registration::Registered, false);
        let a = h.receive(vec![hello()]);
        assert_eq!(
            a,
            [Action::Claim {
                epoch: 3,
                instance: "zone-a".into()
            }]
        );
        assert_eq!(h.session.deadline(), None, "claims are answered at once");
        assert_eq!(h.session.uplink(), Some((3, "zone-a")));
        h.now = at(1);
        let a = h.on(Event::Claimed {
            resume_from: Some(40),
        });
        let [Action::Send(pb::GlobalMessage {
            kind: Some(global_message::Kind::Accepted(accepted)),
        }), Action::Connected(when)] = &a[..]
        else {
            panic!("{a:?}")
        };
        assert_eq!(*when, at(1));
        assert_eq!(accepted.protocol_version, PROTOCOL_VERSION);
        assert_eq!(accepted.capabilities, ["resume"]);
        assert_eq!(
            accepted
                .heartbeat_interval
                .as_ref()
                .and_then(from_proto_duration),
            Some(INTERVAL)
        );
        assert_eq!(
            accepted.zone_timeout.as_ref().and_then(from_proto_duration),
            Some(TIMEOUT)
        );
        assert_eq!(accepted.resume_from, Some(40));
        assert!(h.session.is_accepted());
        assert_eq!(h.session.held(), Some(40));
    }

    #[test]
    fn resume_from_is_offered_only_to_a_zone_that_can_resume() {
        let mut h = Harness::new(Registration::Registered, false);
        h.receive(vec![hello_with(PROTOCOL_VERSION, &[])]);
        let a = h.on(Event::Claimed {
            resume_from: Some(40),
        });
        assert!(matches!(
            &a[0],
            Action::Send(pb::GlobalMessage { kind: Some(global_message::Kind::Accepted(acc)) }) if acc.resume_from.is_none()
        ));
        assert_eq!(h.session.held(), None);
    }

    #[test]
    fn the_first_message_must_be_a_hello() {
        let mut h = Harness::new(Registration::Registered, false);
        let a = h.receive(vec![heartbeat(1)]);
        let r = refused(&a);
        assert_eq!(
            (r.code.as_str(), r.permanent),
            ("protocol_violation", false)
        );
        assert!(
            r.message.contains("\"eu-1\"")
                && r.message.contains("must be a Hello, not a Heartbeat"),
            "{}",
            r.message
        );
        assert!(h.session.is_ended());
        assert!(
            h.receive(vec![hello()]).is_empty(),
            "an ended session does nothing"
        );

        let mut h = Harness::new(Registration::Registered, false);
        let r = refused(&h.receive(vec![pb::ZoneMessage { kind: None }])).clone();
        assert_eq!(r.code, "protocol_violation");
    }

    #[test]
    fn no_hello_in_time_is_refused_to_retry() {
        let mut h = Harness::new(Registration::Registered, false);
        assert_eq!(h.session.deadline(), Some(at(10)));
        assert!(h.advance(9).is_empty());
        let a = h.advance(1);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("hello_timeout", false));
        assert!(r.message.contains("10s"), "{}", r.message);
    }

    #[test]
    fn an_unregistered_zone_is_refused_with_how_to_register_it() {
        let mut h = Harness::new(Registration::Unknown, false);
        let a = h.receive(vec![hello()]);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_unregistered", true));
        assert_eq!(
            r.message,
            "zone \"eu-1\" is not registered at the global: run `hdsd zone add eu-1` against the global's API (PUT /api/v1/zones/eu-1), or add it to global.zones in the global's configuration and restart the global (or set global.auto_register = true)"
        );
        // With auto_register, the global registers it, then claims.
        let mut h = Harness::new(Registration::Unknown, true);
        let a = h.receive(vec![hello()]);
        assert_eq!(
            a,
            [
                Action::Register,
                Action::Claim {
                    epoch: 3,
                    instance: "zone-a".into()
                }
            ]
        );
    }

    #[test]
    fn a_disabled_zone_is_refused_even_with_auto_register() {
        let mut h = Harness::new(Registration::Disabled(DisabledBy::Config), true);
        let a = h.receive(vec![hello()]);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_disabled", true));
        assert!(
            r.message.contains("zone \"eu-1\" is disabled")
                && r.message.contains("remove it from global.disabled"),
            "{}",
            r.message
        );
        assert!(!a.contains(&Action::Register));
    }

    /// Disabled through the API: the message names `hdsd zone enable`.
    #[test]
    fn a_zone_disabled_through_the_api_is_told_how_to_enable_it() {
        let mut h = Harness::new(Registration::Disabled(DisabledBy::Api), false);
        let a = h.receive(vec![hello()]);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_disabled", true));
        assert!(
            r.message.contains("run `hdsd zone enable eu-1`"),
            "{}",
            r.message
        );
    }

    /// A token issued at or before the zone's last deletion is refused,
    /// registered or not (with auto_register it registers nothing); a token
    /// issued after it is accepted.
    #[test]
    fn a_token_issued_before_the_zones_deletion_is_refused() {
        let issued = t0() - chrono::Duration::hours(1);
        for (registration, auto) in [
            (Registration::Registered, false),
            (Registration::Unknown, true),
        ] {
            let mut h = Harness::new(
                Admission {
                    registration,
                    tokens_not_before: Some(issued),
                },
                auto,
            );
            let a = h.receive(vec![hello()]);
            let r = refused(&a);
            assert_eq!((r.code.as_str(), r.permanent), ("unauthenticated", true));
            for part in [
                "was deleted at the global",
                "hdsd token issue --zone eu-1",
                "stay refused",
            ] {
                assert!(r.message.contains(part), "{part}: {}", r.message);
            }
            assert!(!a.contains(&Action::Register));
        }
        let mut h = Harness::new(
            Admission {
                registration: Registration::Registered,
                tokens_not_before: Some(issued - chrono::Duration::seconds(1)),
            },
            false,
        );
        assert!(matches!(
            h.receive(vec![hello()])[..],
            [Action::Claim { .. }]
        ));
    }

    /// A zone disabled or deleted while its stream is open: the stream
    /// ends, saying why and what brings it back; retired tokens end only
    /// the streams that carry one.
    #[test]
    fn a_zone_disabled_or_deleted_while_connected_ends_its_stream() {
        let mut h = Harness::accepted(Some(4));
        let a = h.on(Event::Disabled(DisabledBy::Api));
        let r = refused(&a);
        assert_eq!(r.code, "zone_disabled");
        assert!(h.session.is_ended());
        let mut h = Harness::accepted(Some(4));
        let a = h.on(Event::Deleted);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_unregistered", true));
        assert!(
            r.message.contains("was deleted at the global")
                && r.message.contains("hdsd zone add eu-1"),
            "{}",
            r.message
        );
        assert!(a.iter().any(|a| matches!(
            a,
            Action::End {
                code: Code::ZoneUnregistered,
                ..
            }
        )));
        // Retired before this token was issued: nothing happens.
        let mut h = Harness::accepted(Some(4));
        let a = h.on(Event::TokensRetired(t0() - chrono::Duration::hours(2)));
        assert!(a.is_empty(), "{a:?}");
        assert!(!h.session.is_ended());
        let a = h.on(Event::TokensRetired(t0()));
        let r = refused(&a);
        assert_eq!(r.code, "unauthenticated");
    }

    #[test]
    fn version_skew_accepts_one_older_and_refuses_the_rest_naming_both() {
        let mut h = Harness::new(Registration::Registered, false);
        let a = h.receive(vec![hello_with(PROTOCOL_VERSION + 1, &[])]);
        let r = refused(&a);
        assert_eq!(
            (r.code.as_str(), r.permanent),
            ("version_incompatible", true)
        );
        assert!(
            r.message
                .contains(&format!("version {}", PROTOCOL_VERSION + 1)),
            "{}",
            r.message
        );
        assert!(
            r.message.contains(&format!("version {PROTOCOL_VERSION}")),
            "{}",
            r.message
        );
        assert!(
            r.message.contains("upgrade the global first"),
            "{}",
            r.message
        );

        // A global of version 3 takes zones of 3 and 2, not 1.
        let mut settings = SessionSettings::new(INTERVAL, TIMEOUT);
        settings.version = PeerVersion {
            protocol: 3,
            hdsd: "0.3.0".into(),
        };
        let settings = Arc::new(settings);
        for (zone_version, ok) in [(3, true), (2, true), (1, false), (0, false)] {
            let mut s = Session::new(
                settings.clone(),
                credential(),
                Registration::Registered,
                t0(),
            );
            let mut a = Vec::new();
            s.handle(
                Event::Received(vec![hello_with(zone_version, &[])]),
                t0(),
                &mut a,
            );
            assert_eq!(
                matches!(a[..], [Action::Claim { .. }]),
                ok,
                "zone {zone_version}: {a:?}"
            );
            if !ok {
                let r = refused(&a);
                assert_eq!(r.code, "version_incompatible");
                assert!(
                    r.message.contains("\"0.3.0\"") && r.message.contains("upgrade the zone"),
                    "{}",
                    r.message
                );
            }
        }
    }

    #[test]
    fn a_lower_epoch_is_refused_and_a_newer_stream_supersedes() {
        let mut h = Harness::new(Registration::Registered, false);
        h.receive(vec![hello()]);
        let a = h.on(Event::ClaimLost {
            epoch: 5,
            instance: "zone-b".into(),
        });
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("stale_epoch", true));
        for part in ["\"eu-1\"", "epoch 3", "\"zone-a\"", "epoch 5", "\"zone-b\""] {
            assert!(r.message.contains(part), "{part}: {}", r.message);
        }

        let mut h = Harness::synced();
        let a = h.on(Event::Superseded {
            epoch: 4,
            instance: "zone-b".into(),
        });
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("superseded", true));
        assert!(
            r.message.contains("epoch 4") && r.message.contains("epoch 3"),
            "{}",
            r.message
        );
    }

    /// Issue 56, item 6: a zone configured as eu-1 holding a copy of
    /// us-1's token superseded the real us-1 before anyone compared names.
    /// The Hello's zone is compared first: a mismatch is refused with no
    /// Claim (nothing is taken over); an empty one (a zone released before
    /// the field) and the credential's own name go on to claim.
    #[test]
    fn a_hello_naming_another_zone_is_refused_before_it_claims_anything() {
        let mut h = Harness::new(Registration::Registered, false);
        let mut message = hello();
        if let Some(zone_message::Kind::Hello(hello)) = &mut message.kind {
            hello.zone = "us-1".into();
        }
        let a = h.receive(vec![message]);
        assert!(
            !a.iter().any(|a| matches!(a, Action::Claim { .. })),
            "claimed: {a:?}"
        );
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_name_mismatch", true));
        for part in [
            "zone.name is \"us-1\"",
            "names zone \"eu-1\"",
            "hdsd token issue --zone",
        ] {
            assert!(r.message.contains(part), "{part}: {}", r.message);
        }
        assert!(h.session.is_ended());

        for zone in ["eu-1", ""] {
            let mut h = Harness::new(Registration::Registered, false);
            let mut message = hello();
            if let Some(zone_message::Kind::Hello(hello)) = &mut message.kind {
                hello.zone = zone.into();
            }
            let a = h.receive(vec![message]);
            assert!(
                matches!(a[..], [Action::Claim { epoch: 3, .. }]),
                "{zone:?}: {a:?}"
            );
        }
    }

    /// An epoch is the lease's time in microseconds (or a counter below
    /// it): one more than a day ahead of the global's clock (u64::MAX held
    /// a zone against every real holder) is refused before the claim.
    #[test]
    fn an_epoch_far_ahead_of_the_clock_is_refused_before_it_claims() {
        let now_micros = t0().timestamp_micros() as u64;
        let day = MAX_EPOCH_AHEAD.as_micros() as u64;
        for (epoch, claims) in [
            (u64::MAX, false),
            (now_micros + day + 1, false),
            (now_micros + day, true),
            (now_micros, true),
            (3, true),
        ] {
            let mut h = Harness::new(Registration::Registered, false);
            let mut message = hello();
            if let Some(zone_message::Kind::Hello(hello)) = &mut message.kind {
                hello.epoch = epoch;
            }
            let a = h.receive(vec![message]);
            let claimed = a.iter().any(|a| matches!(a, Action::Claim { .. }));
            assert_eq!(claimed, claims, "epoch {epoch}: {a:?}");
            if !claims {
                let r = refused(&a);
                assert_eq!((r.code.as_str(), r.permanent), ("epoch_ahead", false));
                assert!(r.message.contains(&epoch.to_string()), "{}", r.message);
            }
        }
    }

    /// A supersede storm's claim is refused naming both sources; the
    /// holder keeps the uplink (its session is not told anything).
    #[test]
    fn a_contested_claim_is_refused_naming_both_holders() {
        let mut h = Harness::new(Registration::Registered, false);
        h.receive(vec![hello()]);
        let a = h.on(Event::Contested {
            holder: "instance \"zone-b\" at 10.0.0.2".into(),
            claimant: "instance \"zone-a\" at 10.0.0.1".into(),
            contests: 3,
        });
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("uplink_contested", true));
        for part in [
            "\"eu-1\"",
            "10.0.0.2",
            "10.0.0.1",
            "supersede storm",
            "hdsd token revoke",
        ] {
            assert!(r.message.contains(part), "{part}: {}", r.message);
        }
        // Only a claiming stream is refused so.
        let mut h = Harness::synced();
        assert!(h
            .on(Event::Contested {
                holder: "x".into(),
                claimant: "y".into(),
                contests: 3,
            })
            .is_empty());
    }

    #[test]
    fn messages_before_the_answer_to_the_hello_or_a_second_hello_are_violations() {
        let mut h = Harness::new(Registration::Registered, false);
        let a = h.receive(vec![hello(), heartbeat(0)]);
        assert!(matches!(a[0], Action::Claim { .. }));
        assert!(refused(&a)
            .message
            .contains("a Heartbeat before the global answered the Hello"));

        let mut h = Harness::synced();
        let a = h.receive(vec![hello()]);
        assert!(refused(&a).message.contains("a second Hello"));
    }

    #[test]
    fn a_hello_with_control_characters_is_a_violation() {
        let mut h = Harness::new(Registration::Registered, false);
        let mut message = hello();
        if let Some(zone_message::Kind::Hello(hello)) = &mut message.kind {
            hello.instance = "zone\n-a".into();
        }
        let a = h.receive(vec![message]);
        assert!(refused(&a).message.contains("instance"));
    }

    #[test]
    fn a_snapshot_upserts_as_it_comes_and_keeps_only_what_it_named() {
        let mut h = Harness::accepted(None);
        let a = h.receive(vec![chunk(
            true,
            vec![dp("default", "web", 7), dp("shop", "cart", 8)],
        )]);
        assert_eq!(a[0], Action::SnapshotBegun);
        assert_eq!(
            upserts(&a),
            [("default.web".to_string(), 7), ("shop.cart".to_string(), 8)]
        );
        assert!(!a
            .iter()
            .any(|a| matches!(a, Action::SnapshotComplete { .. } | Action::Delete { .. })));
        assert!(acks(&a).is_empty(), "nothing complete to acknowledge yet");
        assert!(h.session.in_snapshot());
        let a = h.receive(vec![
            chunk(false, vec![dp("default", "db", 9)]),
            complete(12),
        ]);
        let keep = a.iter().find_map(|a| match a {
            Action::SnapshotComplete { keep, revision: 12 } => Some(keep.clone()),
            _ => None,
        });
        assert_eq!(
            keep,
            Some(
                [
                    id("default", "web"),
                    id("shop", "cart"),
                    id("default", "db")
                ]
                .into()
            )
        );
        assert_eq!(acks(&a), [12], "one Ack for the batch");
        assert_eq!(h.session.held(), Some(12));
    }

    #[test]
    fn a_deletion_during_a_snapshot_waits_for_its_completion() {
        let mut h = Harness::accepted(None);
        h.receive(vec![chunk(
            true,
            vec![dp("default", "web", 7), dp("default", "db", 7)],
        )]);
        let a = h.receive(vec![delete("default", "db", 8)]);
        assert!(
            !a.iter().any(|a| matches!(a, Action::Delete { .. })),
            "{a:?}"
        );
        let a = h.receive(vec![upsert("default", "api", 9), complete(9)]);
        assert_eq!(upserts(&a), [("default.api".to_string(), 9)]);
        let keep = a.iter().find_map(|a| match a {
            Action::SnapshotComplete { keep, .. } => Some(keep.clone()),
            _ => None,
        });
        assert_eq!(
            keep,
            Some([id("default", "web"), id("default", "api")].into())
        );
    }

    #[test]
    fn a_new_snapshot_forgets_an_unfinished_one() {
        let mut h = Harness::accepted(None);
        h.receive(vec![chunk(true, vec![dp("default", "old", 7)])]);
        let a = h.receive(vec![
            chunk(true, vec![dp("default", "web", 9)]),
            complete(9),
        ]);
        assert_eq!(a[0], Action::SnapshotBegun);
        assert!(a.iter().any(|a| matches!(a, Action::SnapshotComplete { keep, .. } if *keep == [id("default", "web")].into())));
    }

    #[test]
    fn snapshot_messages_out_of_place_are_violations() {
        let mut h = Harness::synced();
        let a = h.receive(vec![chunk(false, vec![dp("default", "web", 11)])]);
        assert!(refused(&a).message.contains("without `begin`"));
        let mut h = Harness::synced();
        let a = h.receive(vec![complete(11)]);
        assert!(refused(&a)
            .message
            .contains("SnapshotComplete while no snapshot"));
    }

    #[test]
    fn a_change_before_the_requested_snapshot_is_a_violation() {
        let mut h = Harness::accepted(None);
        let a = h.receive(vec![upsert("default", "web", 3)]);
        let r = refused(&a);
        assert_eq!(r.code, "protocol_violation");
        assert!(r.message.contains("before the snapshot"), "{}", r.message);
        // Resumed: changes come at once.
        let mut h = Harness::accepted(Some(40));
        let a = h.receive(vec![upsert("default", "web", 41)]);
        assert_eq!(upserts(&a), [("default.web".to_string(), 41)]);
    }

    #[test]
    fn live_changes_upsert_and_delete_and_one_ack_answers_a_batch() {
        let mut h = Harness::synced();
        h.now = at(3);
        let a = h.receive(vec![
            upsert("default", "api", 11),
            delete("default", "web", 12),
            upsert("shop", "cart", 13),
        ]);
        assert_eq!(
            upserts(&a),
            [
                ("default.api".to_string(), 11),
                ("shop.cart".to_string(), 13)
            ]
        );
        assert!(a.contains(&Action::Delete {
            id: id("default", "web"),
            revision: 12
        }));
        assert_eq!(acks(&a), [13]);
        assert!(
            a.contains(&Action::Heartbeat(at(3))),
            "a sign of life, once per batch"
        );
        assert_eq!(
            a.iter()
                .filter(|a| matches!(a, Action::Heartbeat(_)))
                .count(),
            1
        );
        // An older revision (a replay within the zone's slack) applies, and never moves the revision back.
        let a = h.receive(vec![upsert("default", "api", 11)]);
        assert_eq!(upserts(&a).len(), 1);
        assert!(
            acks(&a).is_empty(),
            "nothing new to acknowledge, no heartbeat"
        );
        assert_eq!(h.session.held(), Some(13));
        // A change carries its revision into the dataplane.
        let a = h.receive(vec![upsert("default", "api", 20)]);
        assert!(a
            .iter()
            .any(|a| matches!(a, Action::Upsert { dataplane, .. } if dataplane.revision == 20)));
    }

    #[test]
    fn heartbeats_are_acknowledged_and_may_move_the_revision() {
        let mut h = Harness::synced();
        h.now = at(5);
        let a = h.receive(vec![heartbeat(10)]);
        assert_eq!(
            a,
            [
                Action::Heartbeat(at(5)),
                Action::Send(global(global_message::Kind::Ack(global_message::Ack {
                    revision: 10
                })))
            ]
        );
        let a = h.receive(vec![heartbeat(14)]);
        assert_eq!(a[0], Action::Synced { revision: 14 });
        assert_eq!(acks(&a), [14]);
        // During a snapshot a heartbeat moves nothing; the Ack says 0.
        let mut h = Harness::accepted(None);
        let a = h.receive(vec![heartbeat(99)]);
        assert_eq!(acks(&a), [0]);
        assert!(!a.iter().any(|a| matches!(a, Action::Synced { .. })));
    }

    /// Only the global's clock counts: the time of a sign of life is the
    /// `now` the driver passes, and no message carries a zone time.
    #[test]
    fn signs_of_life_are_stamped_with_the_globals_clock() {
        let mut h = Harness::synced();
        h.now = at(7);
        let a = h.receive(vec![heartbeat(10)]);
        assert_eq!(a[0], Action::Heartbeat(at(7)));
        // Nothing before acceptance counts: the Hello's batch has no heartbeat.
        let mut h = Harness::new(Registration::Registered, false);
        assert!(!h
            .receive(vec![hello()])
            .iter()
            .any(|a| matches!(a, Action::Heartbeat(_))));
    }

    #[test]
    fn dataplanes_of_meshes_not_allowed_are_rejected_once_per_mesh_and_the_stream_goes_on() {
        let mut h = Harness::accepted(None);
        let a = h.receive(vec![chunk(
            true,
            vec![
                dp("payments", "web", 1),
                dp("payments", "db", 1),
                dp("default", "web", 1),
            ],
        )]);
        assert_eq!(upserts(&a), [("default.web".to_string(), 1)]);
        let r = rejections(&a);
        assert_eq!(r.len(), 1, "{a:?}");
        assert_eq!(
            (r[0].code.as_str(), r[0].mesh.as_str(), r[0].name.as_str()),
            ("mesh_not_allowed", "payments", "web")
        );
        for part in [
            "zone \"eu-1\"",
            "mesh \"payments\"",
            "default, shop",
            "credential",
        ] {
            assert!(r[0].message.contains(part), "{part}: {}", r[0].message);
        }
        let a = h.receive(vec![
            complete(1),
            upsert("payments", "api", 2),
            delete("payments", "web", 3),
        ]);
        assert!(
            rejections(&a).is_empty(),
            "reported once per mesh on a stream"
        );
        assert!(upserts(&a).is_empty() && !a.iter().any(|a| matches!(a, Action::Delete { .. })));
        assert_eq!(h.session.rejected(), 4);
        assert!(h.session.is_accepted());
        // Keep never names a refused dataplane.
        assert!(a.iter().any(|a| matches!(a, Action::SnapshotComplete { keep, .. } if *keep == [id("default", "web")].into())));
    }

    #[test]
    fn invalid_dataplanes_are_rejected_with_the_naming_rule() {
        let mut h = Harness::accepted(Some(1));
        let a = h.receive(vec![
            upsert("default", "Web!", 2),
            upsert("Bad.Mesh", "web", 3),
        ]);
        let r = rejections(&a);
        assert_eq!(r.len(), 2, "one per mesh: {a:?}");
        assert!(r.iter().all(|r| r.code == "invalid_dataplane"));
        assert!(
            r[0].message.contains("zone \"eu-1\"") && r[0].message.contains("name"),
            "{}",
            r[0].message
        );
        assert!(upserts(&a).is_empty());
        assert!(h.session.is_accepted());
    }

    #[test]
    fn rejected_messages_are_bounded_per_stream() {
        let mut h = Harness::accepted(Some(1));
        let batch = (0..200)
            .map(|i| upsert(&format!("mesh-{i}"), "web", 2))
            .collect();
        let a = h.receive(batch);
        assert_eq!(rejections(&a).len(), MAX_REJECTED_MESSAGES);
        assert_eq!(h.session.rejected(), 200);
    }

    #[test]
    fn a_silent_zone_is_ended_once_the_liveness_rule_says_offline() {
        let mut h = Harness::synced();
        h.now = at(10);
        h.receive(vec![heartbeat(10)]);
        assert_eq!(
            h.session.deadline(),
            Some(plus(at(25), Duration::from_nanos(1)))
        );
        h.now = at(25);
        assert!(
            h.on(Event::Tick).is_empty(),
            "exactly at the timeout: still online"
        );
        h.now = plus(at(25), Duration::from_nanos(1));
        let a = h.on(Event::Tick);
        let r = refused(&a);
        assert_eq!((r.code.as_str(), r.permanent), ("zone_timeout", false));
        assert!(
            r.message.contains("\"eu-1\"") && r.message.contains("15s"),
            "{}",
            r.message
        );
    }

    #[test]
    fn a_clock_stepping_back_does_not_end_a_stream() {
        let mut h = Harness::synced();
        h.now = t0() - chrono::Duration::seconds(3600);
        assert!(h.on(Event::Tick).is_empty());
        // Counted from the step: 15 s of silence later it ends.
        h.now = plus(h.now, Duration::from_secs(16));
        assert_eq!(refused(&h.on(Event::Tick)).code, "zone_timeout");
    }

    #[test]
    fn draining_refuses_to_retry_and_a_closed_stream_just_ends() {
        let mut h = Harness::synced();
        let r = refused(&h.on(Event::Drain)).clone();
        assert_eq!((r.code.as_str(), r.permanent), ("shutting_down", false));
        let mut h = Harness::synced();
        let a = h.on(Event::Closed {
            error: Some("reset".into()),
        });
        assert!(
            matches!(&a[..], [Action::End { code: Code::StreamClosed, reason }] if reason.contains("reset"))
        );
        assert!(h.session.is_ended());
        assert_eq!(h.session.deadline(), None);
    }
}
