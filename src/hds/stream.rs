//! One HDS stream as a state machine: events in, actions out.
//!
//! The machine knows the protocol (the first message must be a
//! `HealthCheckRequest` naming the node, a specifier answers every request and
//! follows every change, reports go to the dataplane's task, a stream silent
//! for `stale_after` ends, a newer stream wins, a deleted dataplane gets an
//! empty specifier and a grace period) and nothing of tonic's transport, the
//! registry's tasks or the clock: the driver in [`super`] turns network
//! messages, watch notifications and timers into [`Event`]s, passes the time
//! in, and carries out the [`Action`]s. Unit-tested without a network below.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::health::v3::HealthCheckRequest;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::auth::{authorize, check_identity, Claims, Rejection};
use crate::capability::EnvoyVersion;
use crate::dataplane::DataplaneId;
use crate::registry::{DataplaneState, StreamId, REJECTION_WINDOW};
use crate::report::Report;
use crate::specifier::Specifier;

/// What the service needs to know besides the registry.
#[derive(Debug, Clone)]
pub struct HdsSettings {
    pub unknown_dataplane_grace: Duration,
    pub report_interval: Duration,
    /// A stream with no report for this long is ended (`hds.stale_after`).
    pub stale_after: Duration,
    /// `hds.limits`.
    pub limits: crate::config::HdsLimits,
    /// Definitions come from the store (`dataplanes.source = "api"`), not files.
    pub definitions_from_api: bool,
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

/// The dataplane is not defined. The message says how to define it, never
/// where the server keeps its files (a client learns nothing of the host).
pub(crate) fn not_found(id: &DataplaneId, settings: &HdsSettings) -> Status {
    if settings.definitions_from_api {
        return Status::not_found(format!(
            "dataplane {mesh}.{name} is not registered; define it with `hdsd apply -f <file>` or PUT /api/v1/dataplanes/{mesh}/{name} (a Kuma Dataplane document); hdsd picks it up without a restart",
            mesh = id.mesh,
            name = id.name.escape_debug(),
        ));
    }
    Status::not_found(format!(
        "dataplane {mesh}.{name} is not registered; add {name}.yaml to the dataplanes directory of hdsd (dataplanes.dir) containing\n\
         type: Dataplane\nmesh: {mesh}\nname: {name}\nnetworking:\n  address: <this machine's IP>\n  inbound:\n  - port: <Envoy's port for the app>\n    servicePort: <the app's port>\n    serviceAddress: 127.0.0.1\n\
         (hdsd picks it up without a restart)",
        mesh = id.mesh,
        name = id.name.escape_debug(),
    ))
}

/// Something that happened to the stream.
#[derive(Debug)]
pub enum Event {
    /// Envoy sent a `HealthCheckRequest` (boxed: it is rare and large).
    Request(Box<HealthCheckRequest>),
    /// Envoy sent a health report.
    Report(Report),
    /// Envoy sent a message with neither a request nor a report.
    EmptyMessage,
    /// Envoy closed its side of the stream (or went away).
    ClientClosed,
    /// Reading from Envoy failed with this status.
    ClientError(Status),
    /// After [`Action::Resolve`]: the dataplane is defined; this is its state
    /// (boxed, as the next one: it is rare, and an event is kept in every
    /// stream's task while it waits).
    Resolved(Box<DataplaneState>),
    /// The attached dataplane's state changed (specifier, status or connection).
    StateChanged(Box<DataplaneState>),
    /// The attached dataplane's task is gone (it was removed).
    DataplaneGone,
    /// Time passed: the driver's timer for [`Stream::deadline`] fired.
    Tick,
    /// The stream's token is no longer valid (expired, revoked, key removed).
    TokenInvalid(Rejection),
    /// hdsd is shutting down.
    Drain,
    /// The driver found a limit of `hds.limits` reached (streams per
    /// dataplane, streams waiting): the stream ends with this status.
    LimitReached { limit: &'static str, status: Status },
}

/// Why the machine waits for a dataplane to be defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaiting {
    /// The node of the first request.
    FirstRequest,
    /// The attached dataplane was deleted: it may come back within the grace.
    Deleted,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Deliver [`Event::Resolved`] once the dataplane is defined (now or later);
    /// the machine ends the stream itself at its deadline.
    Resolve { id: DataplaneId, why: Awaiting },
    /// Follow the resolved dataplane's state and tell its task that this
    /// stream now speaks for it, and for an Envoy of which version.
    Attach { envoy: Option<EnvoyVersion> },
    /// Send this specifier to Envoy (its encoded bytes, shared).
    Send(Arc<Specifier>),
    /// Give this report to the dataplane's task.
    Forward(Report),
    /// Tell the dataplane's task this stream no longer speaks for it;
    /// `rejected`: the Envoy ended it within [`REJECTION_WINDOW`] of a
    /// specifier push, with no report since.
    Detach { rejected: bool },
    /// End the stream.
    End(End),
}

/// How a stream ends.
#[derive(Debug)]
pub enum End {
    /// The client closed its side: nothing to send.
    Closed,
    /// End with this status.
    Status(Status),
    /// A stream that stopped reporting (counted as `stale`).
    Stale(Status),
    /// The token does not (or no longer) allow this stream.
    Refused {
        rejection: Rejection,
        node: Option<DataplaneId>,
    },
    /// hdsd is shutting down.
    Shutdown,
    /// A limit of `hds.limits` (its name, as in `hdsd_limit_hits_total`).
    Limit { limit: &'static str, status: Status },
}

#[derive(Debug)]
enum Phase {
    /// Waiting (until `deadline`) for the first `HealthCheckRequest`.
    AwaitingRequest {
        deadline: Instant,
    },
    /// The node is known; waiting (until `deadline`) for its dataplane.
    Resolving {
        id: DataplaneId,
        deadline: Instant,
    },
    /// Serving a defined dataplane.
    Attached(Box<Attached>),
    Ended,
}

#[derive(Debug)]
struct Attached {
    id: DataplaneId,
    /// The latest state of the dataplane the driver delivered.
    state: DataplaneState,
    /// The specifier version last sent (0: none yet).
    sent_version: u64,
    last_report: Instant,
    /// When a specifier with checks was last sent, if no report came since.
    unanswered_send: Option<Instant>,
}

/// The protocol state of one HDS stream.
#[derive(Debug)]
pub struct Stream {
    id: StreamId,
    settings: Arc<HdsSettings>,
    /// The verified token, when auth is on.
    claims: Option<Claims>,
    /// The Envoy's version, from its first request's node.
    envoy: Option<EnvoyVersion>,
    phase: Phase,
}

impl Stream {
    /// A stream opened at `now`: its first request is due within
    /// `hds.limits.first_request_timeout`.
    pub fn new(
        id: StreamId,
        settings: Arc<HdsSettings>,
        claims: Option<Claims>,
        now: Instant,
    ) -> Stream {
        let deadline = now + settings.limits.first_request_timeout;
        Stream {
            id,
            settings,
            claims,
            envoy: None,
            phase: Phase::AwaitingRequest { deadline },
        }
    }

    /// When the driver must deliver [`Event::Tick`] next, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Resolving { deadline, .. } => Some(*deadline),
            Phase::Attached(a) => Some(a.last_report + self.settings.stale_after),
            Phase::AwaitingRequest { deadline } => Some(*deadline),
            Phase::Ended => None,
        }
    }

    /// The dataplane this stream is for, once its first request named it.
    pub fn node(&self) -> Option<&DataplaneId> {
        match &self.phase {
            Phase::Resolving { id, .. } => Some(id),
            Phase::Attached(a) => Some(&a.id),
            Phase::AwaitingRequest { .. } | Phase::Ended => None,
        }
    }

    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
    }

    /// Applies one event at `now`, appending what to do to `actions`.
    pub fn handle(&mut self, event: Event, now: Instant, actions: &mut Vec<Action>) {
        if self.is_ended() {
            return;
        }
        match event {
            Event::ClientClosed => {
                let rejected = self.rejected(now);
                self.end_as(End::Closed, rejected, actions)
            }
            Event::ClientError(status) => {
                let rejected = self.rejected(now);
                self.end_as(End::Status(status), rejected, actions)
            }
            Event::Drain => self.end(End::Shutdown, actions),
            Event::LimitReached { limit, status } => {
                self.end(End::Limit { limit, status }, actions)
            }
            Event::TokenInvalid(rejection) => {
                let node = self.node().cloned();
                self.end(End::Refused { rejection, node }, actions)
            }
            Event::Request(request) => self.request(request, now, actions),
            Event::Report(report) => self.report(report, now, actions),
            Event::EmptyMessage => {
                let message = match self.phase {
                    Phase::AwaitingRequest { .. } => "the first message has neither a HealthCheckRequest nor a report; send a HealthCheckRequest with node.id",
                    // Ignored while the dataplane is unknown: nothing to serve yet.
                    Phase::Resolving { .. } => return,
                    _ => "a message with neither a HealthCheckRequest nor a report",
                };
                self.end(End::Status(Status::invalid_argument(message)), actions)
            }
            Event::Resolved(state) => self.resolved(state, now, actions),
            Event::StateChanged(state) => {
                if let Phase::Attached(a) = &mut self.phase {
                    a.state = *state;
                    self.react(false, now, actions);
                }
            }
            Event::DataplaneGone => {
                if let Phase::Attached(a) = &self.phase {
                    let id = a.id.clone();
                    actions.push(Action::Detach { rejected: false });
                    self.await_dataplane(id, Awaiting::Deleted, now, actions);
                }
            }
            Event::Tick => self.tick(now, actions),
        }
    }

    fn request(
        &mut self,
        request: Box<HealthCheckRequest>,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        match &self.phase {
            Phase::AwaitingRequest { .. } => {
                let id = match node_id(&request) {
                    Ok(id) => id,
                    Err(status) => return self.end(End::Status(status), actions),
                };
                self.envoy = request.node.as_ref().and_then(EnvoyVersion::of_node);
                // Bind the token to the node id before anything else happens.
                if let Some(claims) = &self.claims {
                    if let Err(rejection) = check_identity(claims, &id.mesh, &id.name) {
                        let node = Some(id);
                        return self.end(End::Refused { rejection, node }, actions);
                    }
                }
                self.await_dataplane(id, Awaiting::FirstRequest, now, actions);
            }
            Phase::Resolving { id, .. } => {
                if let Err(status) = check_same_node(id, &request) {
                    self.end(End::Status(status), actions);
                }
            }
            Phase::Attached(a) => {
                if let Err(status) = check_same_node(&a.id, &request) {
                    return self.end(End::Status(status), actions);
                }
                // Envoy forgets its specifier on reconnect: always answer.
                self.react(true, now, actions);
            }
            Phase::Ended => {}
        }
    }

    fn report(&mut self, report: Report, now: Instant, actions: &mut Vec<Action>) {
        match &mut self.phase {
            Phase::AwaitingRequest { .. } => self.end(
                End::Status(Status::failed_precondition(
                    "a health report arrived before any HealthCheckRequest; the first message of a stream must be a HealthCheckRequest with node.id",
                )),
                actions,
            ),
            Phase::Attached(a) => {
                let entries = report.len();
                let targets = a.state.defined.as_ref().map_or(0, |d| d.specifier.targets.len());
                let max = max_report_endpoints(targets);
                if entries > max {
                    let status = Status::invalid_argument(format!(
                        "a health report with {entries} endpoints, more than the {max} this dataplane's specifier allows (2 per probed target + {REPORT_SLACK}); report only the clusters hdsd sent"
                    ));
                    let limit = "max_report_endpoints";
                    return self.end(End::Limit { limit, status }, actions);
                }
                a.last_report = now;
                a.unanswered_send = None;
                actions.push(Action::Forward(report));
            }
            // Reports without a specifier have nothing to match; drop them.
            Phase::Resolving { .. } | Phase::Ended => {}
        }
    }

    fn resolved(&mut self, state: Box<DataplaneState>, now: Instant, actions: &mut Vec<Action>) {
        let Phase::Resolving { id, .. } = &self.phase else {
            return;
        };
        let id = id.clone();
        if let Some(claims) = &self.claims {
            if let Err(rejection) = authorize_for(claims, &id, &state) {
                let node = Some(id);
                return self.end(End::Refused { rejection, node }, actions);
            }
        }
        self.phase = Phase::Attached(Box::new(Attached {
            id,
            state: *state,
            sent_version: 0,
            last_report: now,
            unanswered_send: None,
        }));
        actions.push(Action::Attach { envoy: self.envoy });
        // The request that named the node (or the one before a deletion) is answered now.
        self.react(true, now, actions);
    }

    /// Acts on the attached dataplane's latest state: ends a replaced stream,
    /// sends the specifier when it changed (or always, to `answer` a request),
    /// and waits for a deleted dataplane once its empty specifier is sent.
    fn react(&mut self, answer: bool, now: Instant, actions: &mut Vec<Action>) {
        let Phase::Attached(a) = &mut self.phase else {
            return;
        };
        // Stream ids grow: a larger owner is a newer stream, which wins. A
        // smaller one is an older stream whose Attach ours has not overtaken yet.
        if a.state
            .connection
            .stream
            .is_some_and(|owner| owner > self.id)
        {
            let by = a
                .state
                .connection
                .peer
                .map(|p| format!(" from {p}"))
                .unwrap_or_default();
            let status = Status::new(
                Code::Aborted,
                format!("replaced by a newer stream for dataplane {}{by}", a.id),
            );
            return self.end(End::Status(status), actions);
        }
        // A newer stream attached on another instance sharing the store.
        if let Some(instance) = &a.state.connection.replaced_on {
            let status = Status::new(
                Code::Aborted,
                format!(
                    "replaced by a newer stream for dataplane {} on {instance}",
                    a.id
                ),
            );
            return self.end(End::Status(status), actions);
        }
        if answer || a.state.version != a.sent_version {
            let specifier = current_specifier(&a.state, &self.settings, self.envoy);
            // An Envoy reports nothing on an empty specifier: only a push
            // with checks is one it should answer.
            if !specifier.message.cluster_health_checks.is_empty() {
                a.unanswered_send = Some(now);
            }
            actions.push(Action::Send(specifier));
            a.sent_version = a.state.version;
        }
        if a.state.defined.is_none() {
            let id = a.id.clone();
            actions.push(Action::Detach { rejected: false });
            self.await_dataplane(id, Awaiting::Deleted, now, actions);
        }
    }

    fn tick(&mut self, now: Instant, actions: &mut Vec<Action>) {
        match &self.phase {
            Phase::AwaitingRequest { deadline } if now >= *deadline => {
                let status = Status::deadline_exceeded(format!(
                    "no HealthCheckRequest within {} of opening the stream (hds.limits.first_request_timeout); send one with node.id first",
                    humantime::format_duration(self.settings.limits.first_request_timeout)
                ));
                let limit = "first_request_timeout";
                self.end(End::Limit { limit, status }, actions)
            }
            Phase::Resolving { id, deadline } if now >= *deadline => {
                let status = not_found(id, &self.settings);
                self.end(End::Status(status), actions)
            }
            Phase::Attached(a) if now >= a.last_report + self.settings.stale_after => {
                let status = Status::unavailable(format!(
                    "no health report for {}; reconnect and send a HealthCheckRequest",
                    humantime::format_duration(self.settings.stale_after)
                ));
                self.end(End::Stale(status), actions)
            }
            _ => {}
        }
    }

    fn await_dataplane(
        &mut self,
        id: DataplaneId,
        why: Awaiting,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let deadline = now + self.settings.unknown_dataplane_grace;
        self.phase = Phase::Resolving {
            id: id.clone(),
            deadline,
        };
        actions.push(Action::Resolve { id, why });
    }

    /// Whether the Envoy, ending the stream at `now`, was sent a specifier
    /// within [`REJECTION_WINDOW`] and has not reported since.
    fn rejected(&self, now: Instant) -> bool {
        match &self.phase {
            Phase::Attached(a) => a
                .unanswered_send
                .is_some_and(|at| now.saturating_duration_since(at) <= REJECTION_WINDOW),
            _ => false,
        }
    }

    /// Ends the stream, detaching first when attached.
    fn end(&mut self, end: End, actions: &mut Vec<Action>) {
        self.end_as(end, false, actions)
    }

    fn end_as(&mut self, end: End, rejected: bool, actions: &mut Vec<Action>) {
        if matches!(self.phase, Phase::Attached(_)) {
            actions.push(Action::Detach { rejected });
        }
        self.phase = Phase::Ended;
        actions.push(Action::End(end));
    }
}

/// Endpoints a report may carry beyond two per probed target (Envoy may
/// still report the previous specifier's targets beside the current ones).
pub const REPORT_SLACK: usize = 64;

/// The most endpoints a report against a specifier of `targets` targets may carry.
pub fn max_report_endpoints(targets: usize) -> usize {
    targets * 2 + REPORT_SLACK
}

/// The token must name this dataplane, and its tags must be on its inbounds.
pub(super) fn authorize_for(
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

/// The specifier to send for `state` to an Envoy of `envoy`: the part of
/// the dataplane's own that this version runs (shared, not copied: the
/// dataplane's task keeps the one for the Envoy attached last), or an empty
/// one once it was deleted. Never a check the Envoy cannot run, even before
/// its task has heard of this stream.
pub(super) fn current_specifier(
    state: &DataplaneState,
    settings: &HdsSettings,
    envoy: Option<EnvoyVersion>,
) -> Arc<Specifier> {
    let Some(d) = &state.defined else {
        return Arc::new(Specifier::empty(settings.report_interval));
    };
    // The dataplane's task has worked it out for this version already.
    if state.envoy.seen && state.envoy.version == envoy {
        return match &state.envoy.restricted {
            Some(r) => r.specifier.clone(),
            None => d.specifier.clone(),
        };
    }
    match d.specifier.for_envoy(envoy, state.envoy.tls_withheld) {
        None => d.specifier.clone(),
        Some((restricted, _)) => Arc::new(restricted),
    }
}

fn check_same_node(id: &DataplaneId, request: &HealthCheckRequest) -> Result<(), Status> {
    // The same text as the stream's node id is the same, valid id: no need
    // to parse and check it again on every request.
    let raw = request.node.as_ref().map_or("", |n| n.id.as_str());
    if raw.len() == id.mesh.len() + 1 + id.name.len()
        && raw.starts_with(id.mesh.as_str())
        && raw[id.mesh.len()..].starts_with('.')
        && raw.ends_with(id.name.as_str())
    {
        return Ok(());
    }
    let other = node_id(request)?;
    if &other != id {
        return Err(Status::invalid_argument(format!(
            "this stream belongs to {id}; a HealthCheckRequest for {other} must use its own stream"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::clock::{Clock as _, SystemClock};
    use std::collections::BTreeMap;
    use std::time::Duration;

    use envoy_types::pb::envoy::config::core::v3::Node;

    use super::*;
    use crate::dataplane::parse_documents;
    use crate::registry::Connection;
    use crate::sources::Defined;
    use crate::specifier::{build, SpecifierSettings};

    const WEB: &str = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web, team: a}\n";
    const GRACE: Duration = Duration::from_secs(30);

    fn settings(grace: Duration, stale_after: Duration) -> Arc<HdsSettings> {
        Arc::new(HdsSettings {
            unknown_dataplane_grace: grace,
            report_interval: Duration::from_millis(200),
            stale_after,
            limits: crate::config::HdsLimits::default(),
            definitions_from_api: false,
        })
    }
    const STALE: Duration = Duration::from_secs(15);

    fn request(node: &str) -> Box<HealthCheckRequest> {
        Box::new(HealthCheckRequest {
            node: Some(Node {
                id: node.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn defined(yaml: &str) -> Defined {
        let dataplane = parse_documents(yaml).unwrap().remove(0);
        let specifier = build(&dataplane, &SpecifierSettings::default()).unwrap();
        Defined {
            dataplane: Arc::new(dataplane),
            specifier: Arc::new(specifier),
            file: "web.yaml".into(),
        }
    }

    fn state(version: u64, owner: Option<StreamId>) -> Box<DataplaneState> {
        state_of(WEB, version, owner)
    }

    /// The state of the dataplane of `yaml`, freshly defined.
    fn state_of(yaml: &str, version: u64, owner: Option<StreamId>) -> Box<DataplaneState> {
        let defined = defined(yaml);
        Box::new(DataplaneState {
            health: crate::readiness::rebase(
                None,
                &defined.dataplane,
                &defined.specifier,
                SystemClock.now(),
            ),
            defined: Some(defined),
            version,
            connection: Connection {
                stream: owner,
                ..Default::default()
            },
            envoy: Default::default(),
        })
    }

    fn claims(name: &str, tags: &[(&str, &str)]) -> Claims {
        Claims {
            mesh: "default".into(),
            name: name.into(),
            iat: 0,
            exp: i64::MAX,
            jti: "j".into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            ..Claims::default()
        }
    }

    /// A machine for stream 5 and a clock at `t0`.
    struct Harness {
        stream: Stream,
        now: Instant,
    }

    impl Harness {
        fn new(claims: Option<Claims>) -> Harness {
            let now = Instant::now();
            Harness {
                stream: Stream::new(5, settings(GRACE, STALE), claims, now),
                now,
            }
        }

        fn on(&mut self, event: Event) -> Vec<Action> {
            let mut actions = Vec::new();
            self.stream.handle(event, self.now, &mut actions);
            actions
        }

        fn advance(&mut self, by: Duration) -> Vec<Action> {
            self.now += by;
            self.on(Event::Tick)
        }

        /// First request, then the dataplane resolves at version `v`.
        fn attached(claims: Option<Claims>) -> Harness {
            let mut h = Harness::new(claims);
            h.on(Event::Request(request("default.web")));
            h.on(Event::Resolved(state(1, None)));
            h
        }
    }

    fn names(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .map(|a| match a {
                Action::Resolve { .. } => "resolve",
                Action::Attach { .. } => "attach",
                Action::Send(_) => "send",
                Action::Forward(_) => "forward",
                Action::Detach { .. } => "detach",
                Action::End(_) => "end",
            })
            .collect()
    }

    fn ended_with(actions: &[Action]) -> (Code, String) {
        match actions.last() {
            Some(Action::End(End::Status(s) | End::Stale(s) | End::Limit { status: s, .. })) => {
                (s.code(), s.message().into())
            }
            Some(Action::End(End::Refused { rejection, .. })) => {
                (Code::PermissionDenied, rejection.to_string())
            }
            other => panic!("not ended with a status: {other:?}"),
        }
    }

    #[test]
    fn first_request_resolves_then_attaches_and_answers() {
        let mut h = Harness::new(None);
        let a = h.on(Event::Request(request("default.web")));
        assert!(matches!(
            &a[..],
            [Action::Resolve { id, why: Awaiting::FirstRequest }] if id.to_string() == "default.web"
        ));
        assert_eq!(h.stream.deadline(), Some(h.now + GRACE));
        let a = h.on(Event::Resolved(state(1, None)));
        assert_eq!(names(&a), ["attach", "send"]);
        let Action::Send(spec) = &a[1] else {
            unreachable!()
        };
        assert_eq!(spec.message.cluster_health_checks.len(), 1);
        assert_eq!(h.stream.deadline(), Some(h.now + STALE));
    }

    #[test]
    fn the_first_message_must_be_a_request_with_a_node_id() {
        let mut h = Harness::new(None);
        let a = h.on(Event::Report(Report::default()));
        assert_eq!(ended_with(&a).0, Code::FailedPrecondition);
        assert!(h.stream.is_ended());

        let mut h = Harness::new(None);
        let a = h.on(Event::EmptyMessage);
        assert_eq!(ended_with(&a).0, Code::InvalidArgument);

        let mut h = Harness::new(None);
        let a = h.on(Event::Request(Box::default()));
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::InvalidArgument);
        assert!(message.contains("node.id"), "{message}");

        let mut h = Harness::new(None);
        let a = h.on(Event::Request(request("nodot")));
        assert!(ended_with(&a).1.contains("<mesh>.<name>"));
    }

    #[test]
    fn a_stream_that_sends_no_request_ends_at_the_first_request_deadline() {
        let mut h = Harness::new(None);
        let timeout = crate::config::HdsLimits::default().first_request_timeout;
        assert_eq!(h.stream.deadline(), Some(h.now + timeout));
        assert!(h.advance(timeout - Duration::from_millis(1)).is_empty());
        let a = h.advance(Duration::from_millis(1));
        assert!(matches!(
            a.last(),
            Some(Action::End(End::Limit {
                limit: "first_request_timeout",
                ..
            }))
        ));
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::DeadlineExceeded);
        assert!(message.contains("first_request_timeout"), "{message}");
        // Once the request came, that deadline no longer applies.
        let mut h = Harness::new(None);
        h.on(Event::Request(request("default.web")));
        assert_eq!(h.stream.deadline(), Some(h.now + GRACE));
    }

    #[test]
    fn a_report_with_far_more_endpoints_than_targets_ends_the_stream() {
        use envoy_types::pb::envoy::service::health::v3::{
            ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
        };
        let mut h = Harness::attached(None);
        let report = |n: usize| {
            Report::from(EndpointHealthResponse {
                cluster_endpoints_health: vec![ClusterEndpointsHealth {
                    cluster_name: "x".into(),
                    locality_endpoints_health: vec![LocalityEndpointsHealth {
                        endpoints_health: vec![EndpointHealth::default(); n],
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            })
        };
        // One target: 2 + slack endpoints are accepted, one more is not.
        let max = 2 + REPORT_SLACK;
        assert_eq!(names(&h.on(Event::Report(report(max)))), ["forward"]);
        let a = h.on(Event::Report(report(max + 1)));
        assert_eq!(names(&a), ["detach", "end"]);
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::InvalidArgument);
        assert!(
            message.contains(&format!("{} endpoints", max + 1)),
            "{message}"
        );
    }

    /// The arithmetic behind `max_message_bytes` (docs/security.md, "Limits
    /// and hardening"): the worst-case size of one reported endpoint.
    #[test]
    fn the_default_message_limit_holds_a_report_of_two_thousand_inbounds() {
        use envoy_types::pb::envoy::config::core::v3::Locality;
        use envoy_types::pb::envoy::service::health::v3::{
            ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
        };
        use prost::Message;
        let entry = |addr: std::net::SocketAddr| ClusterEndpointsHealth {
            cluster_name: crate::specifier::cluster_name(addr),
            locality_endpoints_health: vec![LocalityEndpointsHealth {
                locality: Some(Locality::default()),
                endpoints_health: vec![EndpointHealth {
                    endpoint: Some(crate::specifier::endpoint(addr)),
                    health_status: 2,
                    health_metadata: None,
                }],
            }],
        };
        let v6: std::net::SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
            .parse()
            .unwrap();
        let v4: std::net::SocketAddr = "255.255.255.255:65535".parse().unwrap();
        let report = |addr, n| EndpointHealthResponse {
            cluster_endpoints_health: vec![entry(addr); n],
            ..Default::default()
        };
        let per_v6 = report(v6, 1000).encoded_len() / 1000;
        let per_v4 = report(v4, 1000).encoded_len() / 1000;
        eprintln!("{per_v6} bytes per IPv6 endpoint, {per_v4} per IPv4 endpoint");
        assert!(
            per_v6 <= 120 && per_v4 <= 70,
            "{per_v6} and {per_v4} bytes per endpoint"
        );
        let max = crate::config::HdsLimits::default().max_message_bytes;
        assert!(report(v6, 4000).encoded_len() < max);
    }

    #[test]
    fn a_limit_reached_ends_the_stream_with_its_status() {
        let mut h = Harness::new(None);
        h.on(Event::Request(request("default.web")));
        let a = h.on(Event::LimitReached {
            limit: "max_waiting_streams",
            status: Status::resource_exhausted("busy"),
        });
        assert_eq!(ended_with(&a).0, Code::ResourceExhausted);
        assert!(h.stream.is_ended());
    }

    #[test]
    fn events_after_the_end_do_nothing() {
        let mut h = Harness::new(None);
        h.on(Event::ClientClosed);
        assert!(h.on(Event::Request(request("default.web"))).is_empty());
        assert!(h.advance(GRACE * 2).is_empty());
    }

    #[test]
    fn an_unknown_dataplane_ends_not_found_at_the_grace_deadline() {
        let mut h = Harness::new(None);
        h.on(Event::Request(request("default.web")));
        // Reports and requests while waiting: dropped, and the node must stay the same.
        assert!(h.on(Event::Report(Report::default())).is_empty());
        assert!(h.on(Event::Request(request("default.web"))).is_empty());
        assert!(h.advance(GRACE - Duration::from_millis(1)).is_empty());
        let a = h.advance(Duration::from_millis(1));
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::NotFound);
        // It says which file to add, never where the server keeps them.
        assert!(message.contains("web.yaml"), "{message}");
        assert!(!message.contains('/'), "no path: {message}");
    }

    #[test]
    fn a_request_for_another_node_ends_the_stream() {
        let mut h = Harness::new(None);
        h.on(Event::Request(request("default.web")));
        let a = h.on(Event::Request(request("default.other")));
        assert!(ended_with(&a).1.contains("default.other"));

        let mut h = Harness::attached(None);
        let a = h.on(Event::Request(request("default.other")));
        assert_eq!(names(&a), ["detach", "end"]);
    }

    #[test]
    fn reports_are_forwarded_and_push_back_the_silence_deadline() {
        let mut h = Harness::attached(None);
        h.now += Duration::from_secs(10);
        let a = h.on(Event::Report(Report::default()));
        assert_eq!(names(&a), ["forward"]);
        // Not stale 15 s after attaching: the report moved the deadline.
        assert!(h.advance(Duration::from_secs(5)).is_empty());
        assert!(h.advance(Duration::from_secs(9)).is_empty());
        let a = h.advance(Duration::from_secs(1));
        assert_eq!(names(&a), ["detach", "end"]);
        assert!(
            matches!(&a[1], Action::End(End::Stale(s)) if s.message().contains("no health report for 15s"))
        );
    }

    #[test]
    fn the_specifier_is_sent_on_change_and_on_every_request_only() {
        let mut h = Harness::attached(None);
        // Same version (a status or connection change): nothing to send.
        assert!(h.on(Event::StateChanged(state(1, Some(5)))).is_empty());
        assert_eq!(
            names(&h.on(Event::StateChanged(state(2, Some(5))))),
            ["send"]
        );
        // Envoy reconnected its stream state: a request is always answered.
        assert_eq!(
            names(&h.on(Event::Request(request("default.web")))),
            ["send"]
        );
    }

    #[test]
    fn a_newer_stream_replaces_this_one_an_older_one_does_not() {
        let mut h = Harness::attached(None);
        assert!(h.on(Event::StateChanged(state(1, Some(4)))).is_empty());
        let a = h.on(Event::StateChanged(state(1, Some(6))));
        assert_eq!(names(&a), ["detach", "end"]);
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::Aborted);
        assert!(message.contains("replaced by a newer stream"), "{message}");
    }

    #[test]
    fn a_newer_stream_on_another_instance_replaces_this_one() {
        let mut h = Harness::attached(None);
        let mut replaced = state(1, Some(5));
        replaced.connection.replaced_on = Some("host-b/42".into());
        let a = h.on(Event::StateChanged(replaced));
        assert_eq!(names(&a), ["detach", "end"]);
        let (code, message) = ended_with(&a);
        assert_eq!(code, Code::Aborted);
        assert!(message.ends_with("on host-b/42"), "{message}");
    }

    #[test]
    fn a_deleted_dataplane_gets_an_empty_specifier_then_the_grace() {
        let mut h = Harness::attached(None);
        let mut deleted = state(2, Some(5));
        deleted.defined = None;
        let a = h.on(Event::StateChanged(deleted));
        assert_eq!(names(&a), ["send", "detach", "resolve"]);
        let Action::Send(spec) = &a[0] else {
            unreachable!()
        };
        assert!(spec.message.cluster_health_checks.is_empty());
        assert!(matches!(
            &a[2],
            Action::Resolve {
                why: Awaiting::Deleted,
                ..
            }
        ));
        // It comes back: attached again and answered.
        let a = h.on(Event::Resolved(state(3, None)));
        assert_eq!(names(&a), ["attach", "send"]);
    }

    #[test]
    fn a_vanished_dataplane_task_detaches_and_waits() {
        let mut h = Harness::attached(None);
        let a = h.on(Event::DataplaneGone);
        assert_eq!(names(&a), ["detach", "resolve"]);
        let a = h.advance(GRACE);
        assert_eq!(ended_with(&a).0, Code::NotFound);
    }

    #[test]
    fn the_token_must_name_the_node_and_carry_its_tags() {
        let mut h = Harness::new(Some(claims("other", &[])));
        let a = h.on(Event::Request(request("default.web")));
        assert!(matches!(
            &a[..],
            [Action::End(End::Refused {
                rejection: Rejection::WrongIdentity { .. },
                node: Some(_)
            })]
        ));

        let mut h = Harness::new(Some(claims("web", &[("team", "b")])));
        h.on(Event::Request(request("default.web")));
        let a = h.on(Event::Resolved(state(1, None)));
        assert!(matches!(
            &a[..],
            [Action::End(End::Refused {
                rejection: Rejection::TagsMismatch { .. },
                ..
            })]
        ));

        let mut h = Harness::attached(Some(claims("web", &[("team", "a")])));
        assert!(!h.stream.is_ended());
        let a = h.on(Event::TokenInvalid(Rejection::Revoked { jti: "j".into() }));
        assert_eq!(names(&a), ["detach", "end"]);
    }

    #[test]
    fn a_token_invalidated_before_the_first_request_ends_the_stream() {
        let mut h = Harness::new(Some(claims("web", &[])));
        let a = h.on(Event::TokenInvalid(Rejection::Revoked { jti: "j".into() }));
        assert!(matches!(
            &a[..],
            [Action::End(End::Refused { node: None, .. })]
        ));
    }

    #[test]
    fn drain_and_client_close_end_the_stream() {
        let mut h = Harness::attached(None);
        let a = h.on(Event::Drain);
        assert!(matches!(
            &a[..],
            [
                Action::Detach { rejected: false },
                Action::End(End::Shutdown)
            ]
        ));
        let mut h = Harness::attached(None);
        h.now += REJECTION_WINDOW + Duration::from_millis(1);
        let a = h.on(Event::ClientClosed);
        // Closed long after the push: no sign of a rejected specifier.
        assert!(matches!(
            &a[..],
            [Action::Detach { rejected: false }, Action::End(End::Closed)]
        ));
        let mut h = Harness::new(None);
        let a = h.on(Event::ClientError(Status::cancelled("gone")));
        assert!(matches!(&a[..], [Action::End(End::Status(_))]));
    }

    /// An Envoy that ends the stream soon after a push, without reporting,
    /// may be crashing on the specifier; one that reported, or ended long
    /// after the push, or was ended by hdsd, is not.
    #[test]
    fn an_envoy_closing_right_after_a_push_without_a_report_is_flagged() {
        let closed = |h: &mut Harness, event: Event| -> bool {
            let a = h.on(event);
            match &a[..] {
                [Action::Detach { rejected }, Action::End(_)] => *rejected,
                other => panic!("{:?}", names(other)),
            }
        };
        let mut h = Harness::attached(None);
        h.now += Duration::from_secs(2);
        assert!(closed(&mut h, Event::ClientClosed));
        let mut h = Harness::attached(None);
        h.now += REJECTION_WINDOW;
        assert!(closed(&mut h, Event::ClientError(Status::unknown("reset"))));

        // A report answered the push.
        let mut h = Harness::attached(None);
        h.on(Event::Report(Report::from(
            envoy_types::pb::envoy::service::health::v3::EndpointHealthResponse::default(),
        )));
        assert!(!closed(&mut h, Event::ClientClosed));
        // A new push after the report counts again.
        let mut h = Harness::attached(None);
        h.on(Event::Report(Report::from(
            envoy_types::pb::envoy::service::health::v3::EndpointHealthResponse::default(),
        )));
        h.on(Event::StateChanged(state(2, Some(5))));
        assert!(closed(&mut h, Event::ClientClosed));
        // hdsd ended it: not the Envoy's doing.
        let mut h = Harness::attached(None);
        assert_eq!(
            h.on(Event::Drain)
                .iter()
                .filter(|a| matches!(a, Action::Detach { rejected: true }))
                .count(),
            0
        );
    }

    /// The node's version goes with the attach, and the first push already
    /// holds only what that version runs (the dataplane's task has not
    /// heard of this stream yet).
    #[test]
    fn the_first_push_holds_only_what_the_envoy_version_runs() {
        use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
        use envoy_types::pb::envoy::config::core::v3::BuildVersion;
        use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
        let grpc = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n    serviceProbe: {grpc: {}}\n  - port: 10002\n    servicePort: 8081\n    tags: {kuma.io/service: web}\n";
        let resolved = || state_of(grpc, 1, None);
        for (minor, clusters) in [(37, 1), (38, 2)] {
            let mut h = Harness::new(None);
            let mut first = request("default.web");
            first.node.as_mut().unwrap().user_agent_version_type =
                Some(UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
                    version: Some(SemanticVersion {
                        major_number: 1,
                        minor_number: minor,
                        patch: 0,
                    }),
                    metadata: None,
                }));
            h.on(Event::Request(first));
            let a = h.on(Event::Resolved(resolved()));
            let Action::Attach { envoy } = &a[0] else {
                panic!("{:?}", names(&a))
            };
            assert_eq!(*envoy, Some(EnvoyVersion::new(1, minor, 0)));
            let Action::Send(sent) = &a[1] else {
                panic!("{:?}", names(&a))
            };
            assert_eq!(
                sent.message.cluster_health_checks.len(),
                clusters,
                "Envoy 1.{minor}"
            );
        }
        // No version reported: the conservative set.
        let mut h = Harness::new(None);
        h.on(Event::Request(request("default.web")));
        let a = h.on(Event::Resolved(resolved()));
        let Action::Send(sent) = &a[1] else {
            panic!("{:?}", names(&a))
        };
        assert_eq!(sent.message.cluster_health_checks.len(), 1);
    }

    /// TLS checks withheld from a dataplane's Envoy (it aborted on them)
    /// stay out of every stream's first push, whatever its version.
    #[test]
    fn withheld_tls_checks_stay_out_of_the_first_push() {
        let https = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8443\n    serviceProbe: {http: {path: /h, tls: {caFile: /missing/ca.pem}}}\n  - port: 10002\n    servicePort: 8081\n";
        let mut state = state_of(https, 1, None);
        let all = current_specifier(&state, &settings(GRACE, STALE), None);
        assert!(all.sends_tls());
        assert_eq!(all.message.cluster_health_checks.len(), 2);
        state.envoy.tls_withheld = true;
        for version in [None, Some(EnvoyVersion::new(1, 40, 0))] {
            let sent = current_specifier(&state, &settings(GRACE, STALE), version);
            assert!(!sent.sends_tls(), "{version:?}");
            assert_eq!(sent.message.cluster_health_checks.len(), 1);
        }
    }
}
