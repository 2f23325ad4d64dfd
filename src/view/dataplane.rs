//! The read model every reader shares: a dataplane as REST, gRPC, SSE,
//! EDS's services, `hdsd status`, the client and the page show it, built
//! from the registry's [`DataplaneState`]. The REST layer serialises it; it
//! does not own it (`api` re-exports it for its handlers).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::dataplane::{DataplaneKind, InboundState, Listener};
use crate::operator::OperatorWord;
use crate::readiness::Timestamp;
use crate::registry::DataplaneState;

/// One dataplane as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneItem {
    pub mesh: String,
    pub name: String,
    pub address: IpAddr,
    /// `sidecar`, `gateway` or `zone_proxy` (the last two usually have no
    /// inbounds: nothing to probe, ready once defined).
    #[serde(default = "sidecar")]
    pub kind: DataplaneKind,
    pub connection: ConnectionItem,
    pub inbounds: Vec<InboundItem>,
    /// A zone proxy's `networking.listeners` (not probed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Listener>,
    /// At a global: the zone this dataplane belongs to, and that zone's
    /// state; absent for the instance's own dataplanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneOfItem>,
}

/// The zone of a dataplane a global holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneOfItem {
    /// The zone's name.
    pub name: String,
    /// `online`, `offline`, `disabled` or `never_connected`: an offline
    /// zone's readiness is its last known one.
    pub state: String,
}

/// How a global shows a zone's dataplane ([`DataplaneItem::from_remote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteZoneOf<'a> {
    /// The zone's name.
    pub name: &'a str,
    /// The zone's state word.
    pub state: &'a str,
    /// True when every inbound must read not ready: the zone is disabled,
    /// or has been offline for longer than `global.offline_ttl`.
    pub withdrawn: bool,
}

/// The REST word of a status as the zone sent it (`unknown` for a value
/// this release does not know).
fn status_word(status: i32) -> String {
    crate::pb::Status::try_from(status)
        .ok()
        .and_then(|s| {
            s.as_str_name()
                .strip_prefix("STATUS_")
                .map(str::to_lowercase)
        })
        .filter(|word| crate::readiness::Status::from_name(word).is_some())
        .unwrap_or_else(|| crate::readiness::Status::Unknown.as_str().to_string())
}

impl From<crate::pb::Reason> for ReasonItem {
    fn from(r: crate::pb::Reason) -> Self {
        ReasonItem {
            code: r.code,
            message: r.message,
        }
    }
}

/// Why a withdrawn zone's inbounds read not ready, and what to do.
fn withdrawn_reason(zone: RemoteZoneOf<'_>) -> ReasonItem {
    let message = if zone.state == "disabled" {
        format!(
            "zone {} is disabled (global.disabled): the global withdrew its data; remove it from global.disabled to accept the zone again",
            zone.name
        )
    } else {
        format!(
            "zone {} has been {} for longer than global.offline_ttl: its last readiness is too old to trust, so the inbound reads not ready until the zone reconnects (check the zone's hdsd and its link to the global)",
            zone.name, zone.state
        )
    };
    ReasonItem {
        code: format!("zone_{}", zone.state),
        message,
    }
}

fn time_of(t: &prost_types::Timestamp) -> Option<Timestamp> {
    Timestamp::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)
}

fn sidecar() -> DataplaneKind {
    DataplaneKind::Sidecar
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionItem {
    pub connected: bool,
    pub connected_at: Option<Timestamp>,
    pub last_report_at: Option<Timestamp>,
    /// The other instance (sharing the PostgreSQL store) holding this
    /// dataplane's stream; absent when it is held here or nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The Envoy's version, as its node reported it; absent when it
    /// reported none, or no Envoy connected to this instance yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_version: Option<String>,
    /// What is wrong with the Envoy's streams, if anything (e.g.
    /// `specifier_rejected`: it ends the stream after every specifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<ReasonItem>,
    /// When the token of the Envoy's stream expires (the stream ends then:
    /// renew it before); known on the instance holding the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<Timestamp>,
}

/// A reason: a stable code for programs and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonItem {
    pub code: String,
    pub message: String,
}

impl From<crate::capability::Reason> for ReasonItem {
    fn from(r: crate::capability::Reason) -> Self {
        ReasonItem {
            code: r.code.to_string(),
            message: r.message,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundItem {
    /// Kuma's inbound `name`, when the file gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: u16,
    pub service_port: u16,
    pub service_address: IpAddr,
    pub tags: BTreeMap<String, String>,
    /// The declared `state`: `Ready`, `NotReady` (never ready) or `Ignored`
    /// (not probed, shown as `ignored`, never holds the dataplane back).
    #[serde(default)]
    pub state: InboundState,
    /// The operator's word that holds it not ready whatever its checks say
    /// (`{"kind": "declared_not_ready"}`), beside its health; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_word: Option<OperatorWord>,
    pub health: HealthItem,
    /// How Envoy probes this inbound; absent when nobody probes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeItem>,
}

/// The probe target of an inbound (in the specifier) and its effective settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeItem {
    /// `tcp`, `http` or `grpc`: the check as configured.
    #[serde(default)]
    pub kind: String,
    /// The check the Envoy runs instead, when its version cannot run
    /// `kind` and `hds.check.fallback` names one (`tcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The specifier's cluster name for the target.
    pub cluster: String,
    /// `serviceAddress:servicePort`, what Envoy connects to.
    pub target: std::net::SocketAddr,
    #[serde(with = "humantime_serde")]
    pub interval: std::time::Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: std::time::Duration,
    #[serde(with = "humantime_serde")]
    pub no_traffic_interval: std::time::Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// The TLS Envoy speaks to the application; absent: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsItem>,
}

/// How a probe's TLS is set up (the files are paths on the Envoy's machine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsItem {
    /// `ca` (the certificate must be signed by `caFile`, and name `sni`
    /// when one is set) or `none` (`insecureSkipVerify`).
    pub verify: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// The certificate Envoy presents (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// ALPN protocols offered, defaults resolved (`h2` for gRPC and HTTP/2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn: Vec<String>,
}

impl From<crate::probe::TlsInForce> for TlsItem {
    fn from(t: crate::probe::TlsInForce) -> Self {
        TlsItem {
            verify: if t.ca_file.is_some() { "ca" } else { "none" }.to_string(),
            ca_file: t.ca_file,
            sni: t.sni,
            client_cert_file: t.client.map(|(cert, _)| cert),
            alpn: t.alpn,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthItem {
    pub ready: bool,
    pub status: String,
    pub since: Timestamp,
    pub last_report_at: Option<Timestamp>,
    /// Reports in a row that said the check fails (0: the last one did not).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failing_reports: u32,
    /// The last report that said healthy, since this hdsd started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_healthy_at: Option<Timestamp>,
    /// This inbound's recent status changes, oldest first (a few, since hdsd started).
    #[serde(default)]
    pub changes: Vec<StatusChangeItem>,
    /// Why it is not ready, or what to know about how it is checked
    /// (`envoy_too_old` with status `unsupported`; `probe_fallback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ReasonItem>,
}

/// One status change of an inbound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusChangeItem {
    pub from: String,
    pub to: String,
    pub at: Timestamp,
}

impl DataplaneItem {
    /// The API view of a dataplane's state; `None` for a deleted one.
    pub fn from_state(state: &DataplaneState) -> Option<DataplaneItem> {
        let defined = state.defined.as_ref()?;
        let dp = &defined.dataplane;
        Some(DataplaneItem {
            mesh: dp.id.mesh.clone(),
            name: dp.id.name.clone(),
            address: dp.address,
            kind: dp.kind(),
            listeners: dp.listeners.clone(),
            connection: ConnectionItem {
                // The fleet's answer: connected while any instance holds
                // the stream (here, or the holder another one announced).
                connected: state.connection.stream.is_some() || state.connection.holder.is_some(),
                connected_at: state.connection.connected_at,
                last_report_at: state.health.last_report_at,
                held_by: state
                    .connection
                    .holder
                    .clone()
                    .filter(|_| state.connection.stream.is_none()),
                envoy_version: state.envoy.version.map(|v| v.to_string()),
                problem: state.envoy.problem().map(Into::into),
                token_expires_at: state
                    .connection
                    .token_expires_at
                    .filter(|_| state.connection.stream.is_some()),
            },
            zone: None,
            inbounds: dp
                .inbounds
                .iter()
                .zip(&state.health.inbounds)
                .enumerate()
                .map(|(i, (inbound, health))| {
                    let word = OperatorWord::of_inbound(inbound);
                    InboundItem {
                        name: inbound.name.clone(),
                        port: inbound.port,
                        service_port: inbound.service_port,
                        service_address: inbound.service_address,
                        tags: inbound.tags.clone(),
                        state: inbound.state,
                        health: HealthItem {
                            ready: inbound.state == InboundState::Ignored
                                || crate::operator::ready(word.as_ref(), health.status),
                            status: match inbound.state {
                                InboundState::Ignored => "ignored".to_string(),
                                _ => health.status.as_str().to_string(),
                            },
                            since: health.since,
                            last_report_at: health.last_report_at,
                            failing_reports: health.failing_reports,
                            last_healthy_at: health.last_healthy_at,
                            changes: state
                                .health
                                .recent
                                .iter()
                                .filter(|c| c.inbound == i)
                                .map(|c| StatusChangeItem {
                                    from: c.from.as_str().to_string(),
                                    to: c.to.as_str().to_string(),
                                    at: c.at,
                                })
                                .collect(),
                            reason: reason(state, i, word.as_ref(), health.status),
                        },
                        operator_word: word,
                        probe: defined
                            .specifier
                            .target_of_inbound
                            .get(i)
                            .copied()
                            .flatten()
                            .and_then(|t| defined.specifier.targets.get(t))
                            .map(|t| ProbeItem {
                                kind: t.check.kind().to_string(),
                                fallback: state
                                    .reason_of_inbound(i)
                                    .filter(|r| r.code == "probe_fallback")
                                    .map(|_| "tcp".to_string()),
                                cluster: t.cluster.clone(),
                                target: t.endpoint,
                                interval: t.settings.interval,
                                timeout: t.settings.timeout,
                                no_traffic_interval: t.settings.no_traffic_interval,
                                healthy_threshold: t.settings.healthy_threshold,
                                unhealthy_threshold: t.settings.unhealthy_threshold,
                                tls: t.check.tls_in_force().map(Into::into),
                            }),
                    }
                })
                .collect(),
        })
    }

    pub fn is_ready(&self) -> bool {
        self.inbounds.iter().all(|i| i.health.ready)
    }

    /// A dataplane of another zone, as its zone sent it to the global.
    /// `None` when a field is out of range (an address that is not an IP
    /// literal, a port above 65535): the zone validated it, so only a zone
    /// of another release could send one.
    pub fn from_remote(zone: RemoteZoneOf<'_>, dp: &crate::pb::Dataplane) -> Option<DataplaneItem> {
        let connection = dp.connection.clone().unwrap_or_default();
        let withdrawn = zone.withdrawn.then(|| withdrawn_reason(zone));
        let inbounds = dp
            .inbounds
            .iter()
            .map(|i| {
                let health = i.health.clone().unwrap_or_default();
                let word = OperatorWord::of_remote(i);
                Some(InboundItem {
                    name: None,
                    port: u16::try_from(i.port).ok()?,
                    service_port: u16::try_from(i.service_port).ok()?,
                    service_address: i.service_address.parse().ok()?,
                    tags: i.tags.clone().into_iter().collect(),
                    state: match word {
                        Some(OperatorWord::DeclaredNotReady) => InboundState::NotReady,
                        _ => InboundState::Ready,
                    },
                    health: HealthItem {
                        // The zone's verdict (it applied the word), and
                        // the word again for a zone that did not.
                        ready: health.ready && word.is_none() && withdrawn.is_none(),
                        status: status_word(health.status),
                        since: health.since.as_ref().and_then(time_of).unwrap_or_default(),
                        last_report_at: health.last_report_at.as_ref().and_then(time_of),
                        failing_reports: 0,
                        last_healthy_at: None,
                        changes: Vec::new(),
                        reason: withdrawn
                            .clone()
                            .or(health.reason.map(Into::into))
                            .or_else(|| word.as_ref().map(word_reason)),
                    },
                    operator_word: word,
                    probe: None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(DataplaneItem {
            mesh: dp.mesh.clone(),
            name: dp.name.clone(),
            address: dp.address.parse().ok()?,
            kind: DataplaneKind::Sidecar,
            connection: ConnectionItem {
                connected: connection.connected,
                connected_at: connection.connected_at.as_ref().and_then(time_of),
                last_report_at: connection.last_report_at.as_ref().and_then(time_of),
                held_by: Some(connection.held_by).filter(|h| !h.is_empty()),
                envoy_version: Some(connection.envoy_version).filter(|v| !v.is_empty()),
                problem: connection.problem.map(Into::into),
                token_expires_at: None,
            },
            inbounds,
            listeners: Vec::new(),
            zone: Some(ZoneOfItem {
                name: zone.name.to_string(),
                state: zone.state.to_string(),
            }),
        })
    }
}

/// The reason an operator's word gives.
fn word_reason(word: &OperatorWord) -> ReasonItem {
    ReasonItem {
        code: word.code().into(),
        message: word.message().into(),
    }
}

/// The reason shown for inbound `i`: what this instance knows of its
/// Envoy; for an `unsupported` inbound whose stream another instance holds
/// (it only read the status from the store), where to look for the versions.
fn reason(
    state: &DataplaneState,
    i: usize,
    word: Option<&OperatorWord>,
    status: crate::readiness::Status,
) -> Option<ReasonItem> {
    use crate::readiness::Status as S;
    if let Some(r) = state.reason_of_inbound(i) {
        return Some(r.into());
    }
    if let Some(word) = word {
        return Some(word_reason(word));
    }
    let defined = state.defined.as_ref()?;
    let declared = defined.dataplane.inbounds.get(i).map(|d| d.state);
    if declared == Some(InboundState::Ignored) || status.is_ready() {
        return None;
    }
    let target = defined
        .specifier
        .target_of_inbound
        .get(i)
        .copied()
        .flatten()
        .and_then(|t| defined.specifier.targets.get(t));
    let health = state.health.inbounds.get(i)?;
    let checked = target.map_or_else(|| "its check".to_string(), checked);
    let envoy = defined.dataplane.id.to_string();
    let connected = state.connection.stream.is_some() || state.connection.holder.is_some();
    let healthy_last = match health.last_healthy_at {
        Some(t) => format!("last healthy report at {}", t.to_rfc3339()),
        None => "no healthy report since hdsd started".to_string(),
    };
    let item = |code: &str, message: String| {
        Some(ReasonItem {
            code: code.into(),
            message,
        })
    };
    match status {
        S::Pending if !connected => item(
            "waiting_for_envoy",
            format!(
                "no Envoy is connected as {envoy}: the inbound is pending until that Envoy connects (an HDS bootstrap from `hdsd bootstrap`, node id {envoy}) and reports {checked} healthy"
            ),
        ),
        S::Pending => item(
            "waiting_for_first_report",
            format!(
                "the Envoy {envoy}{version} is connected{at} and has not reported {checked} yet: Envoy reports one report interval after it accepts the specifier, and reads a new endpoint unhealthy until its first successful check",
                version = state.envoy.version.map_or(String::new(), |v| format!(" ({v})")),
                at = state.connection.connected_at.map_or(String::new(), |t| format!(" since {}", t.to_rfc3339())),
            ),
        ),
        S::Unhealthy | S::Timeout => {
            if let Some(t) = target.filter(|t| t.check.tls_in_force().is_some()) {
                return Some(tls_failing(&t.cluster));
            }
            let (code, what) = if status == S::Timeout {
                ("probe_timeout", "timing out")
            } else {
                ("probe_failing", "failing")
            };
            item(
                code,
                format!(
                    "Envoy {envoy} reports {checked} {what}: {n} report{s} in a row, {healthy_last}; check the application from the Envoy's machine{timeout}",
                    n = health.failing_reports.max(1),
                    s = if health.failing_reports > 1 { "s" } else { "" },
                    timeout = target.map_or(String::new(), |t| format!(
                        " (the check allows {} per attempt and needs {} failure{} in a row)",
                        humantime::format_duration(t.settings.timeout),
                        t.settings.unhealthy_threshold,
                        if t.settings.unhealthy_threshold == 1 { "" } else { "s" }
                    )),
                ),
            )
        }
        S::Stale => item(
            "reports_stopped",
            format!(
                "no report from Envoy {envoy} since {last} (older than hds.stale_after): {link}; its last verdict cannot be trusted any more",
                last = health.last_report_at.map_or("hdsd started".to_string(), |t| t.to_rfc3339()),
                link = if connected {
                    "its stream is open but silent (a stopped Envoy process, or a network that drops the reports)"
                } else {
                    "it is disconnected; check that the Envoy runs and reaches hdsd"
                },
            ),
        ),
        S::Draining => item(
            "draining",
            format!(
                "Envoy {envoy} drains this endpoint: {}",
                if state.health.envoy_not_ready() {
                    "the Envoy's own readiness check fails, so every inbound of this dataplane drains"
                } else {
                    "Envoy reported it DRAINING"
                }
            ),
        ),
        S::Degraded => item(
            "degraded",
            format!("Envoy {envoy} reports {checked} DEGRADED ({healthy_last})"),
        ),
        S::Unknown => item(
            "unknown_status",
            format!("Envoy {envoy} reports {checked} with status UNKNOWN: it has no verdict yet"),
        ),
        S::Healthy | S::NotProbed | S::Unsupported => {
            (status == S::Unsupported).then(|| ReasonItem {
                code: "envoy_too_old".into(),
                message: format!(
                    "the probe needs a newer Envoy than the one connected; {} names both versions",
                    match &state.connection.holder {
                        Some(h) => format!("the instance holding the stream ({h})"),
                        None => "the instance that held the stream".to_string(),
                    }
                ),
            })
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a target's check is, in words: `the http check GET /healthz of
/// 10.0.0.1:8080`.
fn checked(t: &crate::specifier::ProbeTarget) -> String {
    use crate::probe::Check;
    let what = match &t.check {
        Check::Tcp(_) => "the tcp check".to_string(),
        Check::Http(h) => format!("the http check GET {}", crate::names::shown(&h.path)),
        Check::Grpc(g) => match g.service.as_deref().filter(|s| !s.is_empty()) {
            Some(service) => format!("the grpc check of service {}", crate::names::shown(service)),
            None => "the grpc check".to_string(),
        },
    };
    format!("{what} of {}", t.endpoint)
}

/// Why a TLS probe that Envoy reports failing may fail, and where to look:
/// hdsd sees only Envoy's verdict, never the handshake.
pub fn tls_failing(cluster: &str) -> ReasonItem {
    ReasonItem {
        code: "tls_probe_failing".into(),
        message: format!(
            "the probe runs over TLS and Envoy reports it failing: the application may be down, or the handshake may fail (a certificate the CA does not sign or that does not name the SNI, a client certificate the application refuses or lacks, a plaintext port); hdsd cannot see the handshake, so read the Envoy's stats on its admin port (GET /stats, the lines that start with {prefix}): ssl.fail_verify_error and ssl.fail_verify_san count certificates Envoy refused, ssl.connection_error handshakes that failed, health_check.network_failure checks that failed before any answer",
            prefix = crate::specifier::stats_prefix(cluster)
        ),
    }
}

/// A list of items, as the API answers it.
#[derive(Debug, Serialize, Deserialize)]
pub struct List<T> {
    pub items: Vec<T>,
}

/// One page of a list (`GET /api/v1/dataplanes`): its items, and the token
/// of the next page, absent on the last.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Paged<T> {
    pub items: Vec<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::readiness::rebase;
    use crate::registry::Connection;
    use crate::source::Defined;
    use crate::specifier::{build, endpoint, SpecifierSettings};
    use chrono::TimeZone;
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
    };
    use std::sync::Arc;

    fn report(status: HealthStatus) -> EndpointHealthResponse {
        EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: "probe_127.0.0.1:8080".into(),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![EndpointHealth {
                        endpoint: Some(endpoint(([127, 0, 0, 1], 8080).into())),
                        health_status: status as i32,
                        health_metadata: None,
                    }],
                }],
            }],
            ..Default::default()
        }
    }

    /// The item carries each inbound's probe target and settings and its
    /// recent status changes; an inbound nobody probes has no probe.
    #[test]
    fn items_show_probe_settings_and_recent_changes() {
        let text = "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe:\n      interval: 2s\n      unhealthyThreshold: 3\n  - port: 10002\n    servicePort: 9090\n";
        let dp = parse_documents(text).unwrap().remove(0);
        let settings = SpecifierSettings {
            probe_all_inbounds: false,
            ..SpecifierSettings::default()
        };
        let specifier = build(&dp, &settings).unwrap();
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let mut health = rebase(None, &dp, &specifier, t(0));
        crate::readiness::fold_report(
            &mut health,
            &specifier,
            &report(HealthStatus::Healthy).into(),
            t(1),
        );
        crate::readiness::fold_report(
            &mut health,
            &specifier,
            &report(HealthStatus::Unhealthy).into(),
            t(2),
        );
        let state = DataplaneState {
            defined: Some(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(specifier),
                file: "web-01.yaml".into(),
            }),
            version: 1,
            health,
            connection: Connection::default(),
            envoy: Default::default(),
        };
        let item = DataplaneItem::from_state(&state).unwrap();
        let json = serde_json::to_value(&item).unwrap();
        let probed = &json["inbounds"][0];
        assert_eq!(
            probed["probe"],
            serde_json::json!({
                "kind": "tcp",
                "cluster": "probe_127.0.0.1:8080",
                "target": "127.0.0.1:8080",
                "interval": "2s",
                "timeout": "1s",
                "noTrafficInterval": "2s",
                "healthyThreshold": 1,
                "unhealthyThreshold": 3,
            })
        );
        let changes: Vec<(&str, &str)> = item.inbounds[0]
            .health
            .changes
            .iter()
            .map(|c| (c.from.as_str(), c.to.as_str()))
            .collect();
        assert_eq!(changes, [("pending", "healthy"), ("healthy", "unhealthy")]);
        assert_eq!(item.inbounds[0].health.changes[1].at, t(2));
        // Not probed: no probe field, no changes.
        assert!(json["inbounds"][1].get("probe").is_none());
        assert_eq!(
            json["inbounds"][1]["health"]["changes"],
            serde_json::json!([])
        );
        // Additive: an item without the new fields (an older hdsd) still reads.
        let mut old = json.clone();
        old["inbounds"][0].as_object_mut().unwrap().remove("probe");
        old["inbounds"][0]["health"]
            .as_object_mut()
            .unwrap()
            .remove("changes");
        let read: DataplaneItem = serde_json::from_value(old).unwrap();
        assert!(read.inbounds[0].probe.is_none() && read.inbounds[0].health.changes.is_empty());
    }

    /// A TLS probe says how its TLS is set up; once Envoy reports it
    /// failing, the reason says a handshake may be why and where to look.
    #[test]
    fn a_tls_probe_shows_its_tls_and_why_it_may_fail() {
        let text = "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe:\n      grpc: {tls: {caFile: /etc/envoy/ca.pem, sni: web.internal, clientCertFile: /etc/envoy/p.pem, clientKeyFile: /etc/envoy/p.key}}\n  - port: 10002\n    servicePort: 9090\n";
        let dp = parse_documents(text).unwrap().remove(0);
        let specifier = build(&dp, &SpecifierSettings::default()).unwrap();
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let mut health = rebase(None, &dp, &specifier, t(0));
        let mut state = |status| {
            health.inbounds[0].status = status;
            health.inbounds[1].status = status;
            DataplaneState {
                defined: Some(Defined {
                    dataplane: Arc::new(dp.clone()),
                    specifier: Arc::new(specifier.clone()),
                    file: "web-01.yaml".into(),
                }),
                version: 1,
                health: health.clone(),
                connection: Connection::default(),
                envoy: Default::default(),
            }
        };
        let item = DataplaneItem::from_state(&state(crate::readiness::Status::Healthy)).unwrap();
        let json = serde_json::to_value(&item).unwrap();
        assert_eq!(
            json["inbounds"][0]["probe"]["tls"],
            serde_json::json!({
                "verify": "ca",
                "caFile": "/etc/envoy/ca.pem",
                "sni": "web.internal",
                "clientCertFile": "/etc/envoy/p.pem",
                "alpn": ["h2"],
            })
        );
        assert!(
            json["inbounds"][1]["probe"].get("tls").is_none(),
            "plaintext"
        );
        assert_eq!(
            item.inbounds[0].health.reason, None,
            "healthy: nothing to say"
        );
        for status in [
            crate::readiness::Status::Unhealthy,
            crate::readiness::Status::Timeout,
        ] {
            let item = DataplaneItem::from_state(&state(status)).unwrap();
            let reason = item.inbounds[0].health.reason.clone().unwrap();
            assert_eq!(reason.code, "tls_probe_failing");
            assert!(
                reason
                    .message
                    .contains("the lines that start with cluster.probe_127.0.0.1_8080.)"),
                "{}",
                reason.message
            );
            let plain = item.inbounds[1].health.reason.clone().unwrap();
            assert!(plain.code.starts_with("probe_"), "not TLS: {plain:?}");
        }
        let item = DataplaneItem::from_state(&state(crate::readiness::Status::Stale)).unwrap();
        assert_eq!(
            item.inbounds[0].health.reason.as_ref().unwrap().code,
            "reports_stopped",
            "stale: not the probe"
        );
    }

    /// Every inbound that is not ready says why, in words a person can act
    /// on: what is checked, by which Envoy, the last reports.
    #[test]
    fn every_not_ready_inbound_says_why() {
        use crate::readiness::Status as S;
        let text = "type: Dataplane\nmesh: shop\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe:\n      http: {path: /healthz}\n      unhealthyThreshold: 3\n  - port: 10002\n    servicePort: 9090\n    state: NotReady\n";
        let dp = parse_documents(text).unwrap().remove(0);
        let specifier = build(&dp, &SpecifierSettings::default()).unwrap();
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let mut health = rebase(None, &dp, &specifier, t(0));
        let state = |health: &crate::readiness::Health, connection: Connection| DataplaneState {
            defined: Some(Defined {
                dataplane: Arc::new(dp.clone()),
                specifier: Arc::new(specifier.clone()),
                file: "web-01.yaml".into(),
            }),
            version: 1,
            health: health.clone(),
            connection,
            envoy: Default::default(),
        };
        let why = |state: &DataplaneState, i: usize| {
            let item = DataplaneItem::from_state(state).unwrap();
            let r = item.inbounds[i].health.reason.clone().expect("a reason");
            (r.code, r.message)
        };
        let connected = || Connection {
            stream: Some(7),
            connected_at: Some(t(1)),
            ..Connection::default()
        };

        let (code, message) = why(&state(&health, Connection::default()), 0);
        assert_eq!(code, "waiting_for_envoy");
        assert!(
            message.contains("no Envoy is connected as shop.web-01"),
            "{message}"
        );
        assert!(
            message.contains("the http check GET \"/healthz\" of 127.0.0.1:8080"),
            "{message}"
        );
        let (code, message) = why(&state(&health, connected()), 0);
        assert_eq!(code, "waiting_for_first_report");
        assert!(message.contains("is connected since"), "{message}");
        let (code, message) = why(&state(&health, connected()), 1);
        assert_eq!(code, "declared_not_ready");
        assert!(message.contains("state: NotReady"), "{message}");

        // Healthy, then failing three reports in a row.
        let fold = |health: &mut crate::readiness::Health, status, at| {
            crate::readiness::fold_report(health, &specifier, &report(status).into(), t(at));
        };
        fold(&mut health, HealthStatus::Healthy, 2);
        let item = DataplaneItem::from_state(&state(&health, connected())).unwrap();
        assert_eq!(
            item.inbounds[0].health.reason, None,
            "ready: nothing to say"
        );
        // The declared NotReady inbound: its checks pass, the word holds it,
        // shown beside its health; and so at a global, from what its zone
        // sends.
        let held = &item.inbounds[1];
        assert!(held.health.status != "unhealthy", "{held:?}");
        assert!(!held.health.ready);
        assert_eq!(held.operator_word, Some(OperatorWord::DeclaredNotReady));
        let json = serde_json::to_value(held).unwrap();
        assert_eq!(json["operatorWord"]["kind"], "declared_not_ready");
        let sent = crate::view::pb::to_pb(&item, 3);
        assert_eq!(
            sent.inbounds[1].operator_word,
            crate::pb::OperatorWord::DeclaredNotReady as i32
        );
        let zone = RemoteZoneOf {
            name: "eu-1",
            state: "online",
            withdrawn: false,
        };
        let at_global = DataplaneItem::from_remote(zone, &sent).unwrap();
        let held = &at_global.inbounds[1];
        assert!(!held.health.ready);
        assert_eq!(held.state, InboundState::NotReady);
        assert_eq!(held.operator_word, Some(OperatorWord::DeclaredNotReady));
        assert_eq!(
            held.health.reason.as_ref().unwrap().code,
            "declared_not_ready"
        );
        assert!(at_global.inbounds[0].health.ready);
        for at in 3..6 {
            fold(&mut health, HealthStatus::Unhealthy, at);
        }
        let (code, message) = why(&state(&health, connected()), 0);
        assert_eq!(code, "probe_failing");
        assert!(message.contains("3 reports in a row"), "{message}");
        assert!(
            message.contains(&format!("last healthy report at {}", t(2).to_rfc3339())),
            "{message}"
        );
        assert!(message.contains("needs 3 failures in a row"), "{message}");
        let item = DataplaneItem::from_state(&state(&health, connected())).unwrap();
        let json = serde_json::to_value(&item.inbounds[0].health).unwrap();
        assert_eq!(json["failingReports"], 3);
        assert_eq!(json["lastHealthyAt"], serde_json::json!(t(2)));

        for (status, code, part) in [
            (S::Timeout, "probe_timeout", "timing out"),
            (S::Stale, "reports_stopped", "its stream is open but silent"),
            (S::Draining, "draining", "Envoy reported it DRAINING"),
            (S::Degraded, "degraded", "DEGRADED"),
            (S::Unknown, "unknown_status", "UNKNOWN"),
        ] {
            let mut h = health.clone();
            h.inbounds[0].status = status;
            let (got, message) = why(&state(&h, connected()), 0);
            assert_eq!(got, code, "{status:?}");
            assert!(message.contains(part), "{status:?}: {message}");
        }
        let mut h = health.clone();
        h.inbounds[0].status = S::Stale;
        let (_, message) = why(&state(&h, Connection::default()), 0);
        assert!(message.contains("it is disconnected"), "{message}");
    }

    /// Any instance answers for the fleet: a stream held by another
    /// instance reads connected, naming the holder.
    #[test]
    fn a_stream_held_elsewhere_reads_connected_with_its_holder() {
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let dp = crate::dataplane::parse_documents(
            "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n",
        )
        .unwrap()
        .remove(0);
        let specifier = build(&dp, &SpecifierSettings::default()).unwrap();
        let mut state = DataplaneState {
            health: crate::readiness::rebase(None, &dp, &specifier, t(0)),
            defined: Some(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(specifier),
                file: "web-01.yaml".into(),
            }),
            version: 1,
            connection: Connection::default(),
            envoy: Default::default(),
        };
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(!item.connection.connected);
        state.connection.holder = Some("b".into());
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(item.connection.connected);
        assert_eq!(item.connection.held_by.as_deref(), Some("b"));
        // An unsupported inbound read from the holder's store rows: the
        // reason says where the versions are.
        state.health.inbounds[0].status = crate::readiness::Status::Unsupported;
        let item = DataplaneItem::from_state(&state).unwrap();
        let reason = item.inbounds[0].health.reason.as_ref().unwrap();
        assert_eq!(reason.code, "envoy_too_old");
        assert!(reason.message.contains("(b)"), "{reason:?}");
        // Held here (a stream of ours): no holder shown.
        state.connection.stream = Some(1);
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(item.connection.connected);
        assert_eq!(item.connection.held_by, None);
    }

    fn remote(ready: bool, status: crate::pb::Status) -> crate::pb::Dataplane {
        use crate::pb;
        pb::Dataplane {
            mesh: "default".into(),
            name: "web-01".into(),
            address: "10.0.0.7".into(),
            connection: Some(pb::Connection {
                connected: true,
                held_by: "zone-b".into(),
                ..Default::default()
            }),
            inbounds: vec![pb::Inbound {
                port: 10001,
                service_port: 8080,
                service_address: "127.0.0.1".into(),
                tags: [("kuma.io/service".to_string(), "web".to_string())].into(),
                health: Some(pb::Health {
                    ready,
                    status: status as i32,
                    since: Some(prost_types::Timestamp {
                        seconds: 1_735_689_600,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
                address: String::new(),
                operator_word: 0,
            }],
            revision: 7,
            ready,
            zone: None,
        }
    }

    #[test]
    fn a_remote_dataplane_keeps_its_readiness_and_names_its_zone() {
        let zone = RemoteZoneOf {
            name: "eu-1",
            state: "offline",
            withdrawn: false,
        };
        let item =
            DataplaneItem::from_remote(zone, &remote(true, crate::pb::Status::Healthy)).unwrap();
        assert_eq!(
            item.zone,
            Some(ZoneOfItem {
                name: "eu-1".into(),
                state: "offline".into()
            })
        );
        assert!(item.is_ready());
        assert_eq!(item.inbounds[0].health.status, "healthy");
        assert_eq!(item.inbounds[0].health.since.timestamp(), 1_735_689_600);
        assert_eq!(item.connection.held_by.as_deref(), Some("zone-b"));
        assert_eq!(item.address.to_string(), "10.0.0.7");
        // The zone is shown beside the dataplane in the API's JSON.
        let json = serde_json::to_value(&item).unwrap();
        assert_eq!(json["zone"]["state"], "offline");
    }

    #[test]
    fn a_withdrawn_zone_reads_not_ready_with_a_reason() {
        let zone = RemoteZoneOf {
            name: "eu-1",
            state: "offline",
            withdrawn: true,
        };
        let item =
            DataplaneItem::from_remote(zone, &remote(true, crate::pb::Status::Healthy)).unwrap();
        assert!(!item.is_ready());
        let reason = item.inbounds[0].health.reason.clone().unwrap();
        assert_eq!(reason.code, "zone_offline");
        assert!(
            reason.message.contains("global.offline_ttl"),
            "{}",
            reason.message
        );
        let disabled = RemoteZoneOf {
            state: "disabled",
            ..zone
        };
        let item = DataplaneItem::from_remote(disabled, &remote(true, crate::pb::Status::Healthy))
            .unwrap();
        let reason = item.inbounds[0].health.reason.clone().unwrap();
        assert_eq!(reason.code, "zone_disabled");
        assert!(
            reason.message.contains("remove it from global.disabled"),
            "{}",
            reason.message
        );
    }

    #[test]
    fn every_status_word_survives_the_trip_through_a_zone() {
        for status in crate::readiness::Status::ALL {
            let value = crate::pb::Status::from_str_name(&format!(
                "STATUS_{}",
                status.as_str().to_uppercase()
            ))
            .unwrap();
            assert_eq!(status_word(value as i32), status.as_str());
        }
        // A value from a newer release reads unknown.
        assert_eq!(status_word(99), "unknown");
        // An address that is not an IP literal is left out.
        let mut bad = remote(true, crate::pb::Status::Healthy);
        bad.address = "web.example".into();
        let zone = RemoteZoneOf {
            name: "eu-1",
            state: "online",
            withdrawn: false,
        };
        assert_eq!(DataplaneItem::from_remote(zone, &bad), None);
    }
}
