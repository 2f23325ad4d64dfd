//! Readiness: reports folded into per-inbound health. Pure functions over
//! plain data; the caller passes the time.
//!
//! - An inbound whose probe target first appears in a specifier is `pending`
//!   (NOT ready) until a report contains it.
//! - HEALTHY -> `healthy`, UNHEALTHY -> `unhealthy`, TIMEOUT -> `timeout`;
//!   DRAINING, DEGRADED and UNKNOWN keep their own names and are not ready.
//! - An inbound whose last report is older than `stale_after` is `stale`
//!   (not ready): the report can no longer be trusted ([`expire`]).
//! - An inbound nobody probes (`hds.probe_all_inbounds = false` and no
//!   `serviceProbe`) is `not_probed` and ready: nothing says it is not.
//! - While the Envoy's own `/ready` check (`hds.check_envoy_ready`) reports
//!   anything but HEALTHY, every inbound of the dataplane is `draining` (not
//!   ready): a proxy being shut down takes its inbounds out before its
//!   application goes away. When it is HEALTHY again, inbounds read their own
//!   probes' results again.
//! - A definition that changes only how a target is checked keeps its
//!   inbounds' state. When the change is to the check's TLS (the cluster's
//!   transport socket), Envoy recreates the target's host, and a new host
//!   reads UNHEALTHY until its first check: for a healthy inbound, that
//!   UNHEALTHY is not news, so it is held for [`hold_window`] (a TIMEOUT,
//!   the result of a check that ran, never is).

use std::collections::VecDeque;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use serde::Serialize;
use smallvec::SmallVec;

use crate::capability::Support;
use crate::dataplane::Dataplane;
use crate::report::Report;
use crate::specifier::Specifier;

pub use crate::clock::Timestamp;

/// The health of one inbound, as its Envoy last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Healthy,
    Unhealthy,
    Timeout,
    Draining,
    Degraded,
    Unknown,
    NotProbed,
    /// The last report is older than `hds.stale_after`.
    Stale,
    /// The inbound's check needs a newer Envoy than the one connected
    /// (`capability`): it is not sent, so nothing can say the app works.
    Unsupported,
}

impl Status {
    pub const ALL: [Status; 10] = [
        Status::Pending,
        Status::Healthy,
        Status::Unhealthy,
        Status::Timeout,
        Status::Draining,
        Status::Degraded,
        Status::Unknown,
        Status::NotProbed,
        Status::Stale,
        Status::Unsupported,
    ];

    pub fn is_ready(self) -> bool {
        matches!(self, Status::Healthy | Status::NotProbed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Healthy => "healthy",
            Status::Unhealthy => "unhealthy",
            Status::Timeout => "timeout",
            Status::Draining => "draining",
            Status::Degraded => "degraded",
            Status::Unknown => "unknown",
            Status::NotProbed => "not_probed",
            Status::Stale => "stale",
            Status::Unsupported => "unsupported",
        }
    }

    /// Parses [`Status::as_str`]'s output.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Envoy's reported status (the raw enum value) as an inbound status.
    pub fn from_envoy(value: i32) -> Status {
        match HealthStatus::try_from(value) {
            Ok(HealthStatus::Healthy) => Status::Healthy,
            Ok(HealthStatus::Unhealthy) => Status::Unhealthy,
            Ok(HealthStatus::Timeout) => Status::Timeout,
            Ok(HealthStatus::Draining) => Status::Draining,
            Ok(HealthStatus::Degraded) => Status::Degraded,
            Ok(HealthStatus::Unknown) | Err(_) => Status::Unknown,
        }
    }
}

/// One inbound's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboundHealth {
    pub status: Status,
    /// When `status` last changed.
    pub since: Timestamp,
    /// The last report that covered this inbound.
    pub last_report_at: Option<Timestamp>,
    /// When a definition changed the TLS of this healthy inbound's check:
    /// Envoy then recreates its host, which reports UNHEALTHY until its
    /// first check, so an UNHEALTHY within [`hold_window`] of this moment
    /// (or of the first attach after it) is held. Kept in memory only.
    pub recreated_at: Option<Timestamp>,
    /// Reports in a row that said the check fails (unhealthy or timeout);
    /// 0 after a healthy one. Kept in memory only (why-not-ready).
    pub failing_reports: u32,
    /// The last report that said healthy, since this process started.
    pub last_healthy_at: Option<Timestamp>,
}

impl InboundHealth {
    /// An inbound with `status` since `since`, never reported, nothing held.
    pub fn new(status: Status, since: Timestamp) -> Self {
        InboundHealth {
            status,
            since,
            last_report_at: None,
            recreated_at: None,
            failing_reports: 0,
            last_healthy_at: None,
        }
    }
}

/// How long after its host is recreated an UNHEALTHY report of a healthy
/// inbound is held (see [`InboundHealth::recreated_at`]): the probe's
/// timeout (the new host's first check ends within it) plus the longer of
/// the probe interval and the report interval (the specifier's way to the
/// Envoy, and the report's way back).
pub fn hold_window(specifier: &Specifier, target: usize) -> chrono::Duration {
    let settings = &specifier.targets[target].settings;
    let report = specifier
        .message
        .interval
        .as_ref()
        .map(|d| std::time::Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
        .unwrap_or_default();
    let window = settings.timeout + settings.interval.max(report);
    chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX)
}

/// Whether an UNHEALTHY report of `inbound` at `now` is the recreated host
/// not yet checked: within `window` of its recreation, or of the first
/// attach after it (an Envoy that was away gets the change then).
fn held(
    inbound: &InboundHealth,
    reattached_at: Option<Timestamp>,
    window: chrono::Duration,
    now: Timestamp,
) -> bool {
    let Some(recreated) = inbound.recreated_at else {
        return false;
    };
    let from = reattached_at.map_or(recreated, |at| at.max(recreated));
    inbound.status == Status::Healthy && now < from + window
}

/// The health of every inbound of one dataplane, in definition order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    pub inbounds: Vec<InboundHealth>,
    /// The last report of any kind from this dataplane.
    pub last_report_at: Option<Timestamp>,
    /// When a stream first attached after the last report (see
    /// [`reattached`]): an Envoy that has just (re)connected reports only
    /// one report interval after it gets its specifier, so the stale window
    /// of a report that was not stale yet restarts from this moment, once.
    pub reattached_at: Option<Timestamp>,
    /// The last reported status of the Envoy's own `/ready` check, if checked.
    pub envoy_ready: Option<Status>,
    /// The last [`RECENT_CHANGES`] status changes of its inbounds, oldest
    /// first. Kept in memory only (a restart starts an empty log).
    pub recent: VecDeque<StatusChange>,
    /// Status changes recorded since the process started: the last
    /// `recorded - before` of `recent` are the ones since `before`.
    pub recorded: u64,
}

/// How many status changes [`Health::recent`] keeps per dataplane.
pub const RECENT_CHANGES: usize = 16;

/// One inbound's status changing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusChange {
    /// Index into the dataplane's inbounds.
    pub inbound: usize,
    pub from: Status,
    pub to: Status,
    pub at: Timestamp,
}

impl Health {
    fn record(&mut self, change: StatusChange) {
        if self.recent.len() == RECENT_CHANGES {
            self.recent.pop_front();
        }
        self.recent.push_back(change);
        self.recorded += 1;
    }

    /// The changes recorded since [`Health::recorded`] read `before` (those
    /// still kept in [`Health::recent`]), oldest first.
    pub fn recorded_since(&self, before: u64) -> impl Iterator<Item = &StatusChange> {
        let n = usize::try_from(self.recorded.saturating_sub(before)).unwrap_or(usize::MAX);
        self.recent.iter().skip(self.recent.len().saturating_sub(n))
    }

    /// The Envoy's own `/ready` check has reported a failure.
    pub fn envoy_not_ready(&self) -> bool {
        matches!(self.envoy_ready, Some(s) if s != Status::Healthy)
    }
}

/// What a fold did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FoldOutcome {
    /// Some inbound's status changed (watchers should wake).
    pub changed: bool,
    /// Inbounds that became ready / stopped being ready.
    pub became_ready: u32,
    pub became_not_ready: u32,
    /// Endpoints the current specifier does not have (left from an older one).
    pub unknown_endpoints: u32,
    /// UNHEALTHY results of recreated hosts not applied ([`hold_window`]).
    pub held: u32,
}

/// The health of a (re)defined dataplane. An inbound keeps its state when it
/// existed before (same address and port) and is probed at the same target;
/// an inbound whose probe target is new is `pending`.
pub fn rebase(
    previous: Option<(&Dataplane, &Specifier, &Health)>,
    dataplane: &Dataplane,
    specifier: &Specifier,
    now: Timestamp,
) -> Health {
    // For every new inbound, the index of the old one it keeps the state of.
    let mut kept_from: Vec<Option<usize>> = Vec::with_capacity(dataplane.inbounds.len());
    let inbounds = dataplane
        .inbounds
        .iter()
        .enumerate()
        .map(|(i, inbound)| {
            let target = specifier.target_of_inbound[i].map(|t| specifier.targets[t].endpoint);
            let before = previous.and_then(|(dp, spec, health)| {
                let j = dp
                    .inbounds
                    .iter()
                    .position(|o| o.address == inbound.address && o.port == inbound.port)?;
                let old_target = spec.target_of_inbound[j].map(|t| spec.targets[t].endpoint);
                (old_target == target).then_some((j, health.inbounds[j]))
            });
            kept_from.push(before.map(|(j, _)| j));
            match (before, target) {
                (Some((j, mut kept)), _) => {
                    let recreated = previous.is_some_and(|(_, spec, _)| {
                        kept.status == Status::Healthy && tls_changed(spec, j, specifier, i)
                    });
                    if recreated {
                        kept.recreated_at = Some(now);
                    }
                    kept
                }
                (None, Some(_)) => InboundHealth::new(Status::Pending, now),
                (None, None) => InboundHealth::new(Status::NotProbed, now),
            }
        })
        .collect();
    // The log keeps the changes of kept inbounds, under their new index.
    let recent = previous
        .map(|(_, _, h)| {
            h.recent
                .iter()
                .filter_map(|c| {
                    let i = kept_from.iter().position(|&j| j == Some(c.inbound))?;
                    Some(StatusChange { inbound: i, ..*c })
                })
                .collect()
        })
        .unwrap_or_default();
    let envoy_target = |spec: &Specifier| spec.envoy_ready.map(|t| spec.targets[t].endpoint);
    let envoy_ready = previous.and_then(|(_, spec, health)| {
        (envoy_target(spec).is_some() && envoy_target(spec) == envoy_target(specifier))
            .then_some(health.envoy_ready)
            .flatten()
    });
    Health {
        inbounds,
        last_report_at: previous.and_then(|(_, _, h)| h.last_report_at),
        reattached_at: previous.and_then(|(_, _, h)| h.reattached_at),
        envoy_ready,
        recent,
        recorded: previous.map_or(0, |(_, _, h)| h.recorded),
    }
}

/// Whether inbound `j` of `before` and inbound `i` of `after` are checked
/// over different TLS (the cluster's transport socket changes).
fn tls_changed(before: &Specifier, j: usize, after: &Specifier, i: usize) -> bool {
    let tls = |spec: &Specifier, k: usize| {
        spec.target_of_inbound[k].map(|t| spec.targets[t].check.tls_in_force())
    };
    tls(before, j) != tls(after, i)
}

/// Sets inbound `index`'s status, counting the change in `outcome` and
/// noting it in `changes` (for [`Health::recent`]).
fn set_status(
    (index, inbound): (usize, &mut InboundHealth),
    status: Status,
    now: Timestamp,
    reported: bool,
    outcome: &mut FoldOutcome,
    changes: &mut Vec<StatusChange>,
) {
    if reported {
        inbound.last_report_at = Some(now);
        match status {
            Status::Healthy => {
                inbound.failing_reports = 0;
                inbound.last_healthy_at = Some(now);
            }
            Status::Unhealthy | Status::Timeout => {
                inbound.failing_reports = inbound.failing_reports.saturating_add(1);
            }
            _ => {}
        }
    }
    if inbound.status != status {
        match (inbound.status.is_ready(), status.is_ready()) {
            (false, true) => outcome.became_ready += 1,
            (true, false) => outcome.became_not_ready += 1,
            _ => {}
        }
        changes.push(StatusChange {
            inbound: index,
            from: inbound.status,
            to: status,
            at: now,
        });
        inbound.status = status;
        inbound.since = now;
        outcome.changed = true;
    }
}

/// Folds one report into `health`. Reads `cluster_endpoints_health`; only when
/// it is empty falls back to the deprecated flat `endpoints_health`, matching
/// by address. Allocates nothing unless a status changes (or a report
/// carries more endpoints or the dataplane more inbounds than fit inline).
pub fn fold_report(
    health: &mut Health,
    specifier: &Specifier,
    report: &Report,
    now: Timestamp,
) -> FoldOutcome {
    let mut outcome = FoldOutcome::default();
    health.last_report_at = Some(now);
    // (target, Envoy's status) of every reported endpoint, in report order.
    let mut entries: SmallVec<[(Option<usize>, i32); 8]> = SmallVec::new();
    report.for_each(|e| {
        let target = e.endpoint().and_then(|addr| match e.cluster {
            Some(cluster) => specifier.target(cluster, addr),
            None => specifier.target_by_endpoint(addr),
        });
        entries.push((target, e.status));
    });
    // The Envoy's own readiness first: while it fails, every inbound drains.
    let was_not_ready = health.envoy_not_ready();
    if let Some(e) = specifier.envoy_ready {
        if let Some(&(_, status)) = entries.iter().rev().find(|(t, _)| *t == Some(e)) {
            health.envoy_ready = Some(Status::from_envoy(status));
        }
    }
    let not_ready = health.envoy_not_ready();
    let mut covered: SmallVec<[bool; 16]> = smallvec::smallvec![false; health.inbounds.len()];
    let mut changes = Vec::new();
    for (target, status) in entries {
        let Some(t) = target else {
            outcome.unknown_endpoints += 1;
            continue;
        };
        let status = if not_ready {
            Status::Draining
        } else {
            Status::from_envoy(status)
        };
        for &i in &specifier.targets[t].inbounds {
            covered[i] = true;
            let inbound = &mut health.inbounds[i];
            if inbound.recreated_at.is_some() {
                let window = hold_window(specifier, t);
                if status == Status::Unhealthy && held(inbound, health.reattached_at, window, now) {
                    inbound.last_report_at = Some(now);
                    outcome.held += 1;
                    continue;
                }
                if !held(inbound, health.reattached_at, window, now) {
                    inbound.recreated_at = None;
                }
            }
            set_status(
                (i, &mut health.inbounds[i]),
                status,
                now,
                true,
                &mut outcome,
                &mut changes,
            );
        }
    }
    if not_ready || was_not_ready {
        // Inbounds this report does not cover (not probed, or not reported yet).
        for (i, inbound) in health.inbounds.iter_mut().enumerate() {
            if covered[i] {
                continue;
            }
            if not_ready {
                set_status(
                    (i, inbound),
                    Status::Draining,
                    now,
                    true,
                    &mut outcome,
                    &mut changes,
                );
            } else if inbound.status == Status::Draining {
                let own = match specifier.target_of_inbound[i] {
                    Some(_) => Status::Pending,
                    None => Status::NotProbed,
                };
                set_status((i, inbound), own, now, false, &mut outcome, &mut changes);
            }
        }
    }
    for change in changes {
        health.record(change);
    }
    outcome
}

/// Makes each inbound's status agree with how its Envoy runs its target
/// (`support`, by target index, from `Specifier::support_for`; `None`: every
/// target as built): an inbound of a target the Envoy cannot run is
/// `unsupported`; one that was, and whose target it now runs (a newer Envoy,
/// a fallback configured, another probe kind), is `pending` until reported.
pub fn apply_support(
    health: &mut Health,
    specifier: &Specifier,
    support: Option<&[Support]>,
    now: Timestamp,
) -> FoldOutcome {
    let mut outcome = FoldOutcome::default();
    let mut changes = Vec::new();
    for (i, inbound) in health.inbounds.iter_mut().enumerate() {
        let Some(t) = specifier.target_of_inbound.get(i).copied().flatten() else {
            continue;
        };
        let unsupported = support
            .and_then(|s| s.get(t))
            .is_some_and(|s| matches!(s, Support::Unsupported(_) | Support::Withheld));
        let status = match (unsupported, inbound.status) {
            (true, _) => Status::Unsupported,
            (false, Status::Unsupported) => Status::Pending,
            (false, _) => continue,
        };
        set_status((i, inbound), status, now, false, &mut outcome, &mut changes);
    }
    for change in changes {
        health.record(change);
    }
    outcome
}

/// A stream attached at `now`. The first attach after the last report is
/// remembered: the reports of a dataplane whose Envoy moved to another
/// stream (an hdsd restart, another instance of a cluster taking over) have
/// not stopped, the Envoy just reports again only after a report interval.
/// Later attaches before the next report change nothing, so an Envoy that
/// reconnects over and over without reporting still goes stale, at most
/// `stale_after` later than it would have. Returns whether anything changed.
pub fn reattached(health: &mut Health, now: Timestamp) -> bool {
    let first_since_report = match (health.reattached_at, health.last_report_at) {
        (None, _) => true,
        (Some(at), Some(report)) => at <= report,
        (Some(_), None) => false,
    };
    if first_since_report {
        health.reattached_at = Some(now);
    }
    first_since_report
}

/// How long a report counts: `stale_after`, from the report or from the
/// first attach since it ([`reattached`]); and `lag`, how far the report
/// times held may trail the last report itself: none for reports folded
/// here, `stale_after` for times read from the store (their writer moves
/// them only once they trail by that much), which a report's window is
/// stretched by, not an attach's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub stale_after: chrono::Duration,
    pub lag: chrono::Duration,
}

impl From<chrono::Duration> for Window {
    /// Reports folded here: no lag.
    fn from(stale_after: chrono::Duration) -> Window {
        Window {
            stale_after,
            lag: chrono::Duration::zero(),
        }
    }
}

/// When an inbound last reported at `last` goes stale: `stale_after` (and
/// the lag) after that report, or `stale_after` after the first attach
/// that came since it while the report was still fresh ([`reattached`]).
fn stale_at(last: Timestamp, reattached_at: Option<Timestamp>, window: Window) -> Timestamp {
    let from_report = last + window.stale_after + window.lag;
    match reattached_at {
        Some(at) if at > last && at < from_report => at + window.stale_after,
        _ => from_report,
    }
}

/// Marks every inbound whose last report is older than `stale_after` as
/// `stale` (counted from a later attach, see [`reattached`]). Pending and
/// not-probed inbounds are left alone (they have no report to distrust).
/// `since` is the moment the report went stale.
pub fn expire(health: &mut Health, now: Timestamp, window: impl Into<Window>) -> FoldOutcome {
    let window = window.into();
    let mut outcome = FoldOutcome::default();
    let mut changes = Vec::new();
    let reattached_at = health.reattached_at;
    for (i, inbound) in health.inbounds.iter_mut().enumerate() {
        let Some(last) = inbound.last_report_at else {
            continue;
        };
        if matches!(
            inbound.status,
            Status::Stale | Status::Pending | Status::NotProbed | Status::Unsupported
        ) {
            continue;
        }
        let stale_at = stale_at(last, reattached_at, window);
        if stale_at <= now {
            if inbound.status.is_ready() {
                outcome.became_not_ready += 1;
            }
            changes.push(StatusChange {
                inbound: i,
                from: inbound.status,
                to: Status::Stale,
                at: stale_at,
            });
            inbound.status = Status::Stale;
            inbound.since = stale_at;
            outcome.changed = true;
        }
    }
    for change in changes {
        health.record(change);
    }
    outcome
}

/// Nothing folds this dataplane's reports any more (its task failed):
/// every inbound reads [`Status::Unknown`] from `now`, so that no reader
/// routes to what nothing checks.
pub fn abandon(health: &mut Health, now: Timestamp) -> FoldOutcome {
    let mut outcome = FoldOutcome::default();
    let mut changes = Vec::new();
    for (i, inbound) in health.inbounds.iter_mut().enumerate() {
        if inbound.status == Status::Unknown {
            continue;
        }
        if inbound.status.is_ready() {
            outcome.became_not_ready += 1;
        }
        changes.push(StatusChange {
            inbound: i,
            from: inbound.status,
            to: Status::Unknown,
            at: now,
        });
        inbound.status = Status::Unknown;
        inbound.since = now;
        outcome.changed = true;
    }
    for change in changes {
        health.record(change);
    }
    outcome
}

/// When [`expire`] next has something to do, if ever.
pub fn next_expiry(health: &Health, window: impl Into<Window>) -> Option<Timestamp> {
    let window = window.into();
    health
        .inbounds
        .iter()
        .filter(|i| {
            !matches!(
                i.status,
                Status::Stale | Status::Pending | Status::NotProbed
            )
        })
        .filter_map(|i| i.last_report_at)
        .map(|last| stale_at(last, health.reattached_at, window))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::health::v3::EndpointHealthResponse;

    /// [`fold_report`] of the report Envoy would send as `report`.
    fn fold(
        health: &mut Health,
        specifier: &Specifier,
        report: &EndpointHealthResponse,
        now: Timestamp,
    ) -> FoldOutcome {
        fold_report(health, specifier, &Report::from(report), now)
    }
    use crate::dataplane::{DataplaneId, Inbound};
    use crate::specifier::{build, endpoint, SpecifierSettings};
    use chrono::{TimeZone, Utc};
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, LocalityEndpointsHealth,
    };
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    const H: i32 = HealthStatus::Healthy as i32;
    const U: i32 = HealthStatus::Unhealthy as i32;
    const T: i32 = HealthStatus::Timeout as i32;

    fn t(s: i64) -> Timestamp {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn settings(probe_all_inbounds: bool) -> SpecifierSettings {
        SpecifierSettings {
            probe_all_inbounds,
            ..SpecifierSettings::default()
        }
    }

    /// Inbounds given as (port, servicePort).
    fn dataplane(inbounds: &[(u16, u16)]) -> Dataplane {
        Dataplane {
            id: DataplaneId::new("default", "web-01"),
            address: "127.0.0.1".parse().unwrap(),
            inbounds: inbounds
                .iter()
                .map(|&(port, service_port)| Inbound {
                    port,
                    address: "127.0.0.1".parse().unwrap(),
                    service_address: "127.0.0.1".parse().unwrap(),
                    service_port,
                    tags: BTreeMap::new(),
                    probe: None,
                    name: None,
                    state: Default::default(),
                })
                .collect(),
            gateway: None,
            listeners: Vec::new(),
            admin_port: None,
        }
    }

    /// A report in Envoy 1.40's shape: (cluster, servicePort, status).
    fn report(entries: &[(&str, u16, i32)]) -> EndpointHealthResponse {
        EndpointHealthResponse {
            cluster_endpoints_health: entries
                .iter()
                .map(|&(cluster, port, status)| ClusterEndpointsHealth {
                    cluster_name: cluster.to_string(),
                    locality_endpoints_health: vec![LocalityEndpointsHealth {
                        locality: None,
                        endpoints_health: vec![EndpointHealth {
                            endpoint: Some(endpoint(SocketAddr::from(([127, 0, 0, 1], port)))),
                            health_status: status,
                            health_metadata: None,
                        }],
                    }],
                })
                .collect(),
            ..Default::default()
        }
    }

    fn statuses(h: &Health) -> Vec<Status> {
        h.inbounds.iter().map(|i| i.status).collect()
    }

    #[test]
    fn report_sequences_to_states() {
        use Status::*;
        let dp = dataplane(&[(10001, 8080), (10002, 9090)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let a = "probe_127.0.0.1:8080";
        let b = "probe_127.0.0.1:9090";
        // (reports in order, expected statuses after the last one)
        type Reports<'a> = Vec<Vec<(&'a str, u16, i32)>>;
        let table: Vec<(Reports<'_>, Vec<Status>)> = vec![
            (vec![], vec![Pending, Pending]),
            (vec![vec![]], vec![Pending, Pending]),
            (vec![vec![(a, 8080, H)]], vec![Healthy, Pending]),
            (
                vec![vec![(a, 8080, H), (b, 9090, U)]],
                vec![Healthy, Unhealthy],
            ),
            (
                vec![vec![(a, 8080, U)], vec![(a, 8080, H)]],
                vec![Healthy, Pending],
            ),
            (
                vec![vec![(a, 8080, H)], vec![(a, 8080, T)]],
                vec![Timeout, Pending],
            ),
            (
                vec![vec![(a, 8080, HealthStatus::Draining as i32)]],
                vec![Draining, Pending],
            ),
            (
                vec![vec![(a, 8080, HealthStatus::Degraded as i32)]],
                vec![Degraded, Pending],
            ),
            (
                vec![vec![(a, 8080, HealthStatus::Unknown as i32)]],
                vec![Unknown, Pending],
            ),
            (vec![vec![(a, 8080, 99)]], vec![Unknown, Pending]),
            // An endpoint under the wrong cluster name is not this target.
            (vec![vec![(b, 8080, H)]], vec![Pending, Pending]),
        ];
        for (reports, expected) in table {
            let mut h = rebase(None, &dp, &spec, t(0));
            for (n, r) in reports.iter().enumerate() {
                fold(&mut h, &spec, &report(r), t(n as i64 + 1));
            }
            assert_eq!(statuses(&h), expected, "after {reports:?}");
            let ready: Vec<bool> = h.inbounds.iter().map(|i| i.status.is_ready()).collect();
            let expected_ready: Vec<bool> = expected.iter().map(|s| s.is_ready()).collect();
            assert_eq!(ready, expected_ready);
        }
    }

    #[test]
    fn since_moves_only_on_change_and_outcome_counts() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        assert_eq!(h.inbounds[0].since, t(0));
        assert_eq!(h.inbounds[0].last_report_at, None);
        let a = "probe_127.0.0.1:8080";
        let o = fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(5));
        assert_eq!(
            (o.changed, o.became_ready, o.became_not_ready),
            (true, 1, 0)
        );
        let o = fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(10));
        assert_eq!(o, FoldOutcome::default());
        assert_eq!(h.inbounds[0].since, t(5));
        assert_eq!(h.inbounds[0].last_report_at, Some(t(10)));
        assert_eq!(h.last_report_at, Some(t(10)));
        let o = fold(&mut h, &spec, &report(&[(a, 8080, U)]), t(15));
        assert_eq!(
            (o.changed, o.became_ready, o.became_not_ready),
            (true, 0, 1)
        );
        assert_eq!(h.inbounds[0].since, t(15));
    }

    #[test]
    fn status_changes_are_logged_bounded_and_follow_kept_inbounds() {
        use Status::*;
        let dp = dataplane(&[(10001, 8080), (10002, 9090)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let (a, b) = ("probe_127.0.0.1:8080", "probe_127.0.0.1:9090");
        let mut h = rebase(None, &dp, &spec, t(0));
        assert!(h.recent.is_empty());
        fold(&mut h, &spec, &report(&[(a, 8080, H), (b, 9090, H)]), t(1));
        // A report that changes nothing logs nothing.
        fold(&mut h, &spec, &report(&[(a, 8080, H), (b, 9090, H)]), t(2));
        fold(&mut h, &spec, &report(&[(b, 9090, U)]), t(3));
        expire(&mut h, t(100), chrono::Duration::seconds(10));
        let log: Vec<(usize, Status, Status, Timestamp)> = h
            .recent
            .iter()
            .map(|c| (c.inbound, c.from, c.to, c.at))
            .collect();
        assert_eq!(
            log,
            [
                (0, Pending, Healthy, t(1)),
                (1, Pending, Healthy, t(1)),
                (1, Healthy, Unhealthy, t(3)),
                // Stale from the moment its last report expired.
                (0, Healthy, Stale, t(12)),
                (1, Unhealthy, Stale, t(13)),
            ]
        );
        // Redefined without the first inbound: the second keeps its log, re-indexed.
        let dp2 = dataplane(&[(10002, 9090)]);
        let spec2 = build(&dp2, &settings(true)).unwrap();
        let h2 = rebase(Some((&dp, &spec, &h)), &dp2, &spec2, t(101));
        let kept: Vec<(usize, Status)> = h2.recent.iter().map(|c| (c.inbound, c.to)).collect();
        assert_eq!(kept, [(0, Healthy), (0, Unhealthy), (0, Stale)]);
        // Bounded: flapping keeps only the newest changes.
        for n in 0..(RECENT_CHANGES as i64 + 5) {
            let status = if n % 2 == 0 { H } else { U };
            fold(&mut h, &spec, &report(&[(a, 8080, status)]), t(200 + n));
        }
        assert_eq!(h.recent.len(), RECENT_CHANGES);
        assert_eq!(
            h.recent.back().map(|c| c.at),
            Some(t(200 + RECENT_CHANGES as i64 + 4))
        );
    }

    #[test]
    fn shared_target_updates_every_inbound() {
        let dp = dataplane(&[(10001, 8080), (10002, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(1),
        );
        assert_eq!(statuses(&h), vec![Status::Healthy, Status::Healthy]);
    }

    #[test]
    fn unknown_clusters_and_endpoints_are_counted() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        let o = fold(
            &mut h,
            &spec,
            &report(&[
                ("probe_127.0.0.1:7070", 7070, H),
                ("probe_127.0.0.1:8080", 8081, H),
            ]),
            t(1),
        );
        assert_eq!(o.unknown_endpoints, 2);
        assert!(!o.changed);
        assert_eq!(statuses(&h), vec![Status::Pending]);
    }

    #[test]
    #[allow(deprecated)]
    fn flat_endpoints_health_only_when_clusters_are_empty() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let flat = EndpointHealth {
            endpoint: Some(endpoint(SocketAddr::from(([127, 0, 0, 1], 8080)))),
            health_status: U,
            health_metadata: None,
        };
        let mut h = rebase(None, &dp, &spec, t(0));
        let old_envoy = EndpointHealthResponse {
            endpoints_health: vec![flat.clone()],
            cluster_endpoints_health: vec![],
        };
        fold(&mut h, &spec, &old_envoy, t(1));
        assert_eq!(statuses(&h), vec![Status::Unhealthy]);
        let mut both = report(&[("probe_127.0.0.1:8080", 8080, H)]);
        both.endpoints_health = vec![flat];
        fold(&mut h, &spec, &both, t(2));
        assert_eq!(statuses(&h), vec![Status::Healthy]);
    }

    #[test]
    fn rebase_keeps_unchanged_inbounds_and_resets_changed_targets() {
        let before = dataplane(&[(10001, 8080), (10002, 9090)]);
        let spec_before = build(&before, &settings(true)).unwrap();
        let mut h = rebase(None, &before, &spec_before, t(0));
        fold(
            &mut h,
            &spec_before,
            &report(&[
                ("probe_127.0.0.1:8080", 8080, H),
                ("probe_127.0.0.1:9090", 9090, H),
            ]),
            t(1),
        );
        // Inbound 10002 changes its servicePort; 10003 is new; 10001 is unchanged.
        let after = dataplane(&[(10001, 8080), (10002, 9191), (10003, 7070)]);
        let spec_after = build(&after, &settings(true)).unwrap();
        let h2 = rebase(Some((&before, &spec_before, &h)), &after, &spec_after, t(9));
        assert_eq!(
            statuses(&h2),
            vec![Status::Healthy, Status::Pending, Status::Pending]
        );
        assert_eq!(h2.inbounds[0].since, t(1));
        assert_eq!(h2.inbounds[1].since, t(9));
        assert_eq!(h2.last_report_at, Some(t(1)));
    }

    #[test]
    fn reports_go_stale_after_the_window_and_recover_on_the_next_report() {
        let dp = dataplane(&[(10001, 8080), (10002, 9090)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let window = chrono::Duration::seconds(15);
        let mut h = rebase(None, &dp, &spec, t(0));
        assert_eq!(
            next_expiry(&h, window),
            None,
            "pending inbounds never go stale"
        );
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(1),
        );
        assert_eq!(next_expiry(&h, window), Some(t(16)));
        // Not before the window...
        let o = expire(&mut h, t(15), window);
        assert!(!o.changed);
        assert_eq!(statuses(&h), vec![Status::Healthy, Status::Pending]);
        // ...but at it: stale, not ready, since the moment it went stale.
        let o = expire(&mut h, t(20), window);
        assert_eq!((o.changed, o.became_not_ready), (true, 1));
        assert_eq!(statuses(&h), vec![Status::Stale, Status::Pending]);
        assert!(!h.inbounds[0].status.is_ready());
        assert_eq!(h.inbounds[0].since, t(16));
        assert_eq!(next_expiry(&h, window), None);
        assert!(!expire(&mut h, t(30), window).changed, "stale stays stale");
        // The next report is the truth again.
        let o = fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(31),
        );
        assert_eq!(o.became_ready, 1);
        assert_eq!(statuses(&h), vec![Status::Healthy, Status::Pending]);
    }

    #[test]
    fn an_abandoned_dataplane_reads_unknown_from_then_and_counts_who_stopped_being_ready() {
        let dp = dataplane(&[(10001, 8080), (10002, 9090)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(1),
        );
        let before = h.recorded;
        let o = abandon(&mut h, t(5));
        assert_eq!((o.changed, o.became_not_ready), (true, 1));
        assert_eq!(statuses(&h), vec![Status::Unknown, Status::Unknown]);
        assert!(h.inbounds.iter().all(|i| i.since == t(5)));
        assert_eq!(h.recorded_since(before).count(), 2, "both changes recorded");
        assert!(!abandon(&mut h, t(9)).changed, "unknown stays unknown");
    }

    /// Report times read from the store trail the last report by up to the
    /// lag: they count for `stale_after` + lag, and an attach since gives
    /// the Envoy `stale_after` from the attach, as with a report of its own.
    #[test]
    fn stored_report_times_count_for_their_lag_more_and_an_attach_restarts_the_window() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let window = Window {
            stale_after: chrono::Duration::seconds(15),
            lag: chrono::Duration::seconds(15),
        };
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(0),
        );
        assert_eq!(next_expiry(&h, window), Some(t(30)));
        let mut attached = h.clone();
        assert!(!expire(&mut h, t(29), window).changed);
        assert!(expire(&mut h, t(30), window).changed);
        assert_eq!(h.inbounds[0].since, t(30));
        // Its Envoy attaches to a new holder at 20 s: 15 s from then.
        assert!(reattached(&mut attached, t(20)));
        assert_eq!(next_expiry(&attached, window), Some(t(35)));
        assert!(!expire(&mut attached, t(34), window).changed);
        assert!(expire(&mut attached, t(35), window).changed);
        assert_eq!(attached.inbounds[0].since, t(35));
    }

    #[test]
    fn the_first_attach_after_a_report_restarts_the_stale_window_once() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let window = chrono::Duration::seconds(15);
        let mut h = rebase(None, &dp, &spec, t(0));
        let healthy = report(&[("probe_127.0.0.1:8080", 8080, H)]);
        fold(&mut h, &spec, &healthy, t(1));
        assert_eq!(next_expiry(&h, window), Some(t(16)));
        // The Envoy moves to another stream at 10 s (an instance died): the
        // window now runs from the attach, since it reports only after a
        // report interval.
        assert!(reattached(&mut h, t(10)));
        assert_eq!(next_expiry(&h, window), Some(t(25)));
        assert!(!expire(&mut h, t(20), window).changed, "not stale at 20 s");
        // Attaching again before a report changes nothing: an Envoy that
        // keeps reconnecting without reporting still goes stale.
        assert!(!reattached(&mut h, t(14)));
        assert_eq!(next_expiry(&h, window), Some(t(25)));
        let o = expire(&mut h, t(25), window);
        assert_eq!((o.changed, o.became_not_ready), (true, 1));
        assert_eq!(h.inbounds[0].since, t(25));
        // A report ends the extension: the next attach may extend again.
        fold(&mut h, &spec, &healthy, t(30));
        assert_eq!(next_expiry(&h, window), Some(t(45)));
        assert!(reattached(&mut h, t(31)));
        assert_eq!(next_expiry(&h, window), Some(t(46)));
    }

    #[test]
    fn an_attach_after_the_reports_went_stale_extends_nothing() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let window = chrono::Duration::seconds(15);
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H)]),
            t(1),
        );
        // Attached at 16 s, when the report was already stale (the task had
        // not looked yet): the report's own window decides.
        reattached(&mut h, t(16));
        assert_eq!(next_expiry(&h, window), Some(t(16)));
        assert!(expire(&mut h, t(16), window).changed);
        assert_eq!(statuses(&h), vec![Status::Stale]);
    }

    #[test]
    fn unhealthy_reports_go_stale_too() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, U)]),
            t(1),
        );
        let o = expire(&mut h, t(100), chrono::Duration::seconds(15));
        assert_eq!((o.changed, o.became_not_ready), (true, 0));
        assert_eq!(statuses(&h), vec![Status::Stale]);
    }

    #[test]
    fn a_failing_envoy_ready_check_drains_every_inbound() {
        use Status::*;
        // Inbound 0 probed, inbound 1 not probed (it has no serviceProbe).
        let mut dp = dataplane(&[(10001, 8080), (10002, 9090)]);
        dp.admin_port = Some(9901);
        dp.inbounds[0].probe = Some(Default::default());
        let spec = build(&dp, &settings(false)).unwrap();
        let e = spec.envoy_ready.unwrap();
        assert_eq!(spec.targets[e].cluster, "envoy_ready");
        let a = "probe_127.0.0.1:8080";
        let envoy = "envoy_ready";
        let mut h = rebase(None, &dp, &spec, t(0));
        assert_eq!(statuses(&h), vec![Pending, NotProbed]);

        fold(
            &mut h,
            &spec,
            &report(&[(a, 8080, H), (envoy, 9901, H)]),
            t(1),
        );
        assert_eq!(statuses(&h), vec![Healthy, NotProbed]);
        assert_eq!(h.envoy_ready, Some(Healthy));

        // The Envoy drains: every inbound is draining, even a healthy or unprobed one.
        let o = fold(
            &mut h,
            &spec,
            &report(&[(a, 8080, H), (envoy, 9901, U)]),
            t(2),
        );
        assert_eq!(statuses(&h), vec![Draining, Draining]);
        assert_eq!((o.changed, o.became_not_ready), (true, 2));
        assert!(h
            .inbounds
            .iter()
            .all(|i| !i.status.is_ready() && i.since == t(2)));
        // A report without the Envoy's check keeps the last known state.
        fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(3));
        assert_eq!(statuses(&h), vec![Draining, Draining]);
        // A timeout of /ready drains too.
        fold(
            &mut h,
            &spec,
            &report(&[(a, 8080, H), (envoy, 9901, T)]),
            t(4),
        );
        assert_eq!(statuses(&h), vec![Draining, Draining]);
        assert_eq!(h.inbounds[0].since, t(2));

        // Ready again: each inbound reads its own probe again.
        let o = fold(
            &mut h,
            &spec,
            &report(&[(a, 8080, U), (envoy, 9901, H)]),
            t(5),
        );
        assert_eq!(statuses(&h), vec![Unhealthy, NotProbed]);
        assert_eq!(o.became_ready, 1);
        assert_eq!(h.inbounds[1].last_report_at, Some(t(4)));
    }

    /// `dataplane(&[(10001, 8080)])` whose one inbound is checked with `check`.
    fn checked(check: crate::probe::Check) -> Dataplane {
        let mut dp = dataplane(&[(10001, 8080)]);
        dp.inbounds[0].probe = Some(crate::dataplane::ProbeOverrides {
            check: Some(check),
            ..Default::default()
        });
        dp
    }

    fn https(sni: Option<&str>) -> crate::probe::Check {
        crate::probe::Check::Http(crate::probe::HttpCheck {
            tls: Some(Box::new(crate::probe::Tls {
                sni: sni.map(str::to_string),
                ..crate::probe::Tls::with_ca("/ca.pem")
            })),
            ..crate::probe::HttpCheck::path("/healthz")
        })
    }

    fn ms(n: i64) -> chrono::Duration {
        chrono::Duration::milliseconds(n)
    }

    /// A change of a healthy inbound's TLS makes Envoy recreate its host,
    /// which reads UNHEALTHY until its first check: held for the window,
    /// then believed. A TIMEOUT (a check that ran) is never held.
    #[test]
    fn a_tls_change_holds_the_recreated_hosts_unhealthy() {
        let a = "probe_127.0.0.1:8080";
        let plain = checked(https(None));
        let spec = build(&plain, &settings(true)).unwrap();
        // Defaults: timeout 1s, interval 1s, reports every 5s.
        assert_eq!(hold_window(&spec, 0), chrono::Duration::seconds(6));
        let mut h = rebase(None, &plain, &spec, t(0));
        fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(1));
        let sni = checked(https(Some("web.internal")));
        let spec2 = build(&sni, &settings(true)).unwrap();
        let mut h2 = rebase(Some((&plain, &spec, &h)), &sni, &spec2, t(10));
        assert_eq!(h2.inbounds[0].recreated_at, Some(t(10)));
        let o = fold(&mut h2, &spec2, &report(&[(a, 8080, U)]), t(10) + ms(300));
        assert_eq!(statuses(&h2), [Status::Healthy], "held");
        assert!(!o.changed && h2.recent.len() == 1, "{:?}", h2.recent);
        assert_eq!(o.held, 1);
        assert_eq!(h2.inbounds[0].last_report_at, Some(t(10) + ms(300)));
        assert_eq!(h2.inbounds[0].since, t(1));
        // The first check passed: healthy, still within the window.
        fold(&mut h2, &spec2, &report(&[(a, 8080, H)]), t(11));
        fold(&mut h2, &spec2, &report(&[(a, 8080, U)]), t(15) + ms(999));
        assert_eq!(statuses(&h2), [Status::Healthy], "held to the end");
        // Past the window, UNHEALTHY is news again, and nothing is held.
        fold(&mut h2, &spec2, &report(&[(a, 8080, U)]), t(16));
        assert_eq!(statuses(&h2), [Status::Unhealthy]);
        assert_eq!(h2.inbounds[0].recreated_at, None);

        // A TIMEOUT within the window is a check that ran: believed.
        let mut h3 = rebase(Some((&plain, &spec, &h)), &sni, &spec2, t(10));
        fold(&mut h3, &spec2, &report(&[(a, 8080, T)]), t(10) + ms(300));
        assert_eq!(statuses(&h3), [Status::Timeout]);
    }

    #[test]
    fn only_a_tls_change_of_a_healthy_inbound_holds() {
        let a = "probe_127.0.0.1:8080";
        let plain = checked(https(None));
        let spec = build(&plain, &settings(true)).unwrap();
        let mut h = rebase(None, &plain, &spec, t(0));
        fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(1));
        // Another path, same TLS: Envoy keeps the host, nothing is held.
        let mut other_path = plain.clone();
        other_path.inbounds[0].probe.as_mut().unwrap().check =
            Some(crate::probe::Check::Http(crate::probe::HttpCheck {
                path: "/ready".into(),
                ..match https(None) {
                    crate::probe::Check::Http(h) => h,
                    _ => unreachable!(),
                }
            }));
        let spec2 = build(&other_path, &settings(true)).unwrap();
        let h2 = rebase(Some((&plain, &spec, &h)), &other_path, &spec2, t(10));
        assert_eq!(h2.inbounds[0].recreated_at, None);
        // TLS switched off or on is a change too.
        for to in [
            checked(crate::probe::Check::Http(crate::probe::HttpCheck::path(
                "/healthz",
            ))),
            checked(https(Some("web.internal"))),
        ] {
            let spec3 = build(&to, &settings(true)).unwrap();
            let h3 = rebase(Some((&plain, &spec, &h)), &to, &spec3, t(10));
            assert_eq!(h3.inbounds[0].recreated_at, Some(t(10)), "{to:?}");
        }
        // An inbound that was not healthy has nothing to lose.
        let mut down = h.clone();
        fold(&mut down, &spec, &report(&[(a, 8080, U)]), t(2));
        let sni = checked(https(Some("web.internal")));
        let spec4 = build(&sni, &settings(true)).unwrap();
        let h4 = rebase(Some((&plain, &spec, &down)), &sni, &spec4, t(10));
        assert_eq!(h4.inbounds[0].recreated_at, None);
    }

    /// An Envoy away at the change gets it when it attaches again: the
    /// window counts from that attach.
    #[test]
    fn the_hold_counts_from_the_first_attach_after_the_change() {
        let a = "probe_127.0.0.1:8080";
        let plain = checked(https(None));
        let spec = build(&plain, &settings(true)).unwrap();
        let mut h = rebase(None, &plain, &spec, t(0));
        fold(&mut h, &spec, &report(&[(a, 8080, H)]), t(1));
        let sni = checked(https(Some("web.internal")));
        let spec2 = build(&sni, &settings(true)).unwrap();
        let mut h2 = rebase(Some((&plain, &spec, &h)), &sni, &spec2, t(2));
        reattached(&mut h2, t(7));
        fold(&mut h2, &spec2, &report(&[(a, 8080, U)]), t(12));
        assert_eq!(statuses(&h2), [Status::Healthy], "6s from the attach");
        fold(&mut h2, &spec2, &report(&[(a, 8080, U)]), t(13));
        assert_eq!(statuses(&h2), [Status::Unhealthy]);
    }

    #[test]
    fn rebase_keeps_the_envoy_state_for_the_same_admin_port() {
        let mut dp = dataplane(&[(10001, 8080)]);
        dp.admin_port = Some(9901);
        let spec = build(&dp, &settings(true)).unwrap();
        let mut h = rebase(None, &dp, &spec, t(0));
        fold(
            &mut h,
            &spec,
            &report(&[("probe_127.0.0.1:8080", 8080, H), ("envoy_ready", 9901, U)]),
            t(1),
        );
        assert!(h.envoy_not_ready());
        let h2 = rebase(Some((&dp, &spec, &h)), &dp, &spec, t(2));
        assert_eq!(h2.envoy_ready, Some(Status::Unhealthy));
        let mut moved = dp.clone();
        moved.admin_port = Some(9902);
        let spec2 = build(&moved, &settings(true)).unwrap();
        let h3 = rebase(Some((&dp, &spec, &h)), &moved, &spec2, t(2));
        assert_eq!(h3.envoy_ready, None);
        assert_eq!(
            statuses(&h3),
            vec![Status::Draining],
            "the inbound keeps its state"
        );
    }

    #[test]
    fn not_probed_inbounds_are_ready() {
        let dp = dataplane(&[(10001, 8080)]);
        let spec = build(&dp, &settings(false)).unwrap();
        let h = rebase(None, &dp, &spec, t(0));
        assert_eq!(statuses(&h), vec![Status::NotProbed]);
        assert!(h.inbounds[0].status.is_ready());
    }
}
