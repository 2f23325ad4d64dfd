//! Building a dataplane's `HealthCheckSpecifier`: a pure function.
//!
//! One `ClusterHealthCheck` per distinct probe target (the serviceProbe's
//! `address:port`, by default serviceAddress:servicePort), each with exactly
//! one check (TCP, TCP payload or HTTP/1.1) whose every field is set
//! explicitly, and exactly one `LocalityEndpoints` holding the one endpoint.
//! The cluster name depends on the target only, so changing a probe's
//! settings never renames its cluster. A check over TLS gets a transport
//! socket match on its cluster and the criteria that select it on its
//! health check ([`TLS_MATCH`]); every other cluster is as it would be
//! without TLS support. With `hds.check_envoy_ready`, one more
//! cluster checks the Envoy's own admin `/ready`. The mapping from (cluster,
//! endpoint) back to inbounds is kept beside the message, so reports never
//! have to parse names.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::core::v3::{
    address, data_source, header_value_option, health_check, socket_address, transport_socket,
    Address, DataSource, HeaderValue, HeaderValueOption, HealthCheck, SocketAddress,
    TransportSocket,
};
use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context, subject_alt_name_matcher, CertificateValidationContext, CommonTlsContext,
    SubjectAltNameMatcher, TlsCertificate, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher, StringMatcher};
use envoy_types::pb::envoy::r#type::v3::{CodecClientType, Int64Range};
use envoy_types::pb::envoy::service::health::v3::{
    ClusterHealthCheck, HealthCheckSpecifier, LocalityEndpoints,
};
use envoy_types::pb::google::protobuf::{
    value, Any, Duration as PbDuration, Struct, UInt32Value, Value,
};
use prost::bytes::Bytes;
use prost::Message;

use crate::capability::{self, EnvoyVersion, Support};
use crate::dataplane::Dataplane;
use crate::probe::{
    Check, HttpCheck, Payload, ProbeSettings, StatusRange, TcpCheck, TlsInForce, ValidationError,
};

/// Server-wide inputs of specifier generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecifierSettings {
    pub defaults: ProbeSettings,
    /// The check of inbounds whose `serviceProbe` sets no kind (`hds.check.kind`).
    pub default_check: Check,
    pub report_interval: Duration,
    /// When false, only inbounds with a `serviceProbe` are probed.
    pub probe_all_inbounds: bool,
    /// Check the Envoy's own admin `/ready` when the dataplane declares
    /// `networking.admin.port`.
    pub check_envoy_ready: bool,
    /// `hds.check.fallback = "tcp"`: an Envoy too old for a target's check
    /// is sent a TCP connect to the same target instead ([`Specifier::for_envoy`]).
    pub tcp_fallback: bool,
}

impl Default for SpecifierSettings {
    /// The defaults of `hdsd config defaults`: 5s reports, every inbound probed.
    fn default() -> Self {
        SpecifierSettings {
            defaults: ProbeSettings::default(),
            default_check: Check::default(),
            report_interval: Duration::from_secs(5),
            probe_all_inbounds: true,
            check_envoy_ready: true,
            tcp_fallback: false,
        }
    }
}

/// One probed application endpoint and the inbounds that share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub cluster: String,
    pub endpoint: SocketAddr,
    pub settings: ProbeSettings,
    pub check: Check,
    /// Indexes into `Dataplane::inbounds` (none for the Envoy's own check).
    pub inbounds: Vec<usize>,
}

/// Up to this many targets, a reported endpoint is found by a scan (cheaper
/// than hashing: the instruction-count guard measures it); above, by lookup.
pub const SCAN_TARGETS: usize = 32;

/// A dataplane's specifier and the map needed to read reports against it.
#[derive(Debug, Clone, Default)]
pub struct Specifier {
    pub message: HealthCheckSpecifier,
    pub targets: Vec<ProbeTarget>,
    /// For every inbound (by index), the target that probes it, if any.
    pub target_of_inbound: Vec<Option<usize>>,
    /// The target checking the Envoy's own admin `/ready`, if any.
    pub envoy_ready: Option<usize>,
    /// Whether an Envoy too old for a target's check gets a TCP connect in
    /// its place (`hds.check.fallback = "tcp"`), see [`Specifier::for_envoy`].
    pub tcp_fallback: bool,
    /// Each endpoint's first target, for specifiers of more than
    /// [`SCAN_TARGETS`] targets: a report's endpoints are then matched by
    /// lookup, not by a scan of the targets (a report may name many). Empty
    /// for smaller ones, where a scan is cheaper than hashing.
    by_endpoint: HashMap<SocketAddr, usize>,
    /// `message` in protobuf encoding, made at the first send and shared by
    /// every later one (reconnects, answers to requests) instead of copying
    /// and encoding the message again. Not made at build time: a file change
    /// rebuilds the specifiers of every dataplane in the file, most of them
    /// unchanged and never sent again.
    encoded: OnceLock<Bytes>,
}

impl PartialEq for Specifier {
    /// The encoding cache is not part of the value.
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
            && self.targets == other.targets
            && self.target_of_inbound == other.target_of_inbound
            && self.envoy_ready == other.envoy_ready
            && self.tcp_fallback == other.tcp_fallback
    }
}

impl Specifier {
    /// The target a reported (cluster, endpoint) pair belongs to.
    pub fn target(&self, cluster: &str, endpoint: SocketAddr) -> Option<usize> {
        if self.by_endpoint.is_empty() {
            return self
                .targets
                .iter()
                .position(|t| t.cluster == cluster && t.endpoint == endpoint);
        }
        let first = *self.by_endpoint.get(&endpoint)?;
        if self.targets[first].cluster == cluster {
            return Some(first);
        }
        // Inbound targets have distinct endpoints; only the Envoy's own
        // `/ready` check may share one with an inbound.
        self.envoy_ready
            .filter(|&e| self.targets[e].endpoint == endpoint && self.targets[e].cluster == cluster)
    }

    /// The target with this endpoint (reports from older Envoys carry no cluster).
    pub fn target_by_endpoint(&self, endpoint: SocketAddr) -> Option<usize> {
        if self.by_endpoint.is_empty() {
            return self.targets.iter().position(|t| t.endpoint == endpoint);
        }
        self.by_endpoint.get(&endpoint).copied()
    }

    /// An empty specifier: Envoy stops every check. Sent to deleted dataplanes.
    pub fn empty(report_interval: Duration) -> Specifier {
        Specifier::new(
            HealthCheckSpecifier {
                cluster_health_checks: Vec::new(),
                interval: Some(pb_duration(report_interval)),
            },
            Vec::new(),
            Vec::new(),
            None,
            false,
        )
    }

    fn new(
        message: HealthCheckSpecifier,
        targets: Vec<ProbeTarget>,
        target_of_inbound: Vec<Option<usize>>,
        envoy_ready: Option<usize>,
        tcp_fallback: bool,
    ) -> Specifier {
        let mut by_endpoint = HashMap::new();
        if targets.len() > SCAN_TARGETS {
            by_endpoint.reserve(targets.len());
            for (i, t) in targets.iter().enumerate() {
                by_endpoint.entry(t.endpoint).or_insert(i);
            }
        }
        Specifier {
            message,
            targets,
            target_of_inbound,
            envoy_ready,
            tcp_fallback,
            by_endpoint,
            encoded: OnceLock::new(),
        }
    }

    /// How an Envoy of `version` (`None`: it reported none) runs each
    /// target, by index, with every TLS check left out when `withhold_tls`
    /// ([`Support::Withheld`]); `None` when it runs every one as built (the
    /// usual case, which allocates nothing).
    pub fn support_for(
        &self,
        version: Option<EnvoyVersion>,
        withhold_tls: bool,
    ) -> Option<Vec<Support>> {
        let of = |t: &ProbeTarget| {
            if withhold_tls && t.check.tls().is_some_and(|tls| tls.enabled) {
                return Support::Withheld;
            }
            capability::support(version, &t.check, self.tcp_fallback)
        };
        if self.targets.iter().all(|t| of(t) == Support::Full) {
            return None;
        }
        Some(self.targets.iter().map(of).collect())
    }

    /// This specifier as an Envoy with `support` (from
    /// [`Specifier::support_for`]) can run it: a target it cannot run is
    /// left out of the message, a fallback is a TCP connect to the same
    /// target (same cluster, so its reports fold as before). The targets
    /// and the inbounds' map are unchanged: readiness reads reports against
    /// either.
    pub fn restricted(&self, support: &[Support]) -> Specifier {
        let cluster_health_checks = self
            .targets
            .iter()
            .zip(support)
            .filter_map(|(t, s)| match s {
                Support::Full => Some(cluster_health_check(t)),
                Support::Unsupported(_) | Support::Withheld => None,
                // Over the check's own TLS (the transport socket the
                // cluster would have anyway): a connect then needs the
                // handshake to pass.
                Support::Fallback(_) => Some(cluster_health_check(&ProbeTarget {
                    check: Check::Tcp(TcpCheck {
                        tls: t.check.tls_in_force().map(|tls| Box::new(tls.into_block())),
                        ..TcpCheck::default()
                    }),
                    ..t.clone()
                })),
            })
            .collect();
        Specifier::new(
            HealthCheckSpecifier {
                cluster_health_checks,
                interval: self.message.interval,
            },
            self.targets.clone(),
            self.target_of_inbound.clone(),
            self.envoy_ready,
            self.tcp_fallback,
        )
    }

    /// Whether the message sends any check over TLS.
    pub fn sends_tls(&self) -> bool {
        self.message
            .cluster_health_checks
            .iter()
            .any(|c| !c.transport_socket_matches.is_empty())
    }

    /// Whether `other` checks its targets over other TLS than this one (a
    /// target's TLS changed, or a TLS target came or went).
    pub fn tls_differs(&self, other: &Specifier) -> bool {
        let tls = |s: &Specifier| -> Vec<(SocketAddr, Option<TlsInForce>)> {
            s.targets
                .iter()
                .map(|t| (t.endpoint, t.check.tls_in_force()))
                .collect()
        };
        tls(self) != tls(other)
    }

    /// The targets whose check the oldest supported Envoy cannot run, with
    /// the table's row that says which release can (`hdsd validate` warns).
    pub fn beyond_oldest_supported(
        &self,
    ) -> impl Iterator<Item = (&ProbeTarget, &'static capability::Requirement)> {
        self.targets.iter().filter_map(|t| {
            let f = capability::needed_by(&t.check)?;
            (!capability::supports(Some(capability::OLDEST_SUPPORTED), f))
                .then(|| (t, f.requirement()))
        })
    }

    /// The specifier an Envoy of `version` is sent (without its TLS checks
    /// when `withhold_tls`), with how it runs each target: `None` when that
    /// is this one, whole.
    pub fn for_envoy(
        &self,
        version: Option<EnvoyVersion>,
        withhold_tls: bool,
    ) -> Option<(Specifier, Vec<Support>)> {
        let support = self.support_for(version, withhold_tls)?;
        Some((self.restricted(&support), support))
    }

    /// The message's protobuf encoding (a shared, reference-counted buffer),
    /// made on the first call. `message` must not change after that.
    pub fn encoded(&self) -> &Bytes {
        self.encoded
            .get_or_init(|| self.message.encode_to_vec().into())
    }
}

/// Why a dataplane's specifier cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecifierError {
    #[error("networking.inbound[{inbound}].serviceProbe: {error}")]
    InvalidProbe {
        inbound: usize,
        error: ValidationError,
    },
    #[error("networking.inbound[{first}] and networking.inbound[{second}] probe the same target {endpoint} with different settings; give them the same serviceProbe")]
    ConflictingProbes {
        first: usize,
        second: usize,
        endpoint: SocketAddr,
    },
}

/// The stable cluster name of a probe target: the target only, never the
/// check's settings, so that editing a probe keeps its cluster (and Envoy's
/// host state) and its inbounds' readiness.
pub fn cluster_name(endpoint: SocketAddr) -> String {
    format!("probe_{endpoint}")
}

/// The cluster name of the Envoy's own `/ready` check.
pub const ENVOY_READY_CLUSTER: &str = "envoy_ready";

/// The check of the Envoy's own readiness: admin `GET /ready` must answer 200
/// (it answers 503 while the Envoy initialises or drains).
pub fn envoy_ready_check() -> Check {
    Check::Http(HttpCheck {
        expected_statuses: vec![StatusRange {
            start: 200,
            end: 200,
        }],
        ..HttpCheck::path("/ready")
    })
}

/// Builds the specifier for `dataplane`. Fails if any effective probe setting
/// breaks a validation rule: nothing invalid ever reaches Envoy.
pub fn build(
    dataplane: &Dataplane,
    settings: &SpecifierSettings,
) -> Result<Specifier, SpecifierError> {
    let mut targets: Vec<ProbeTarget> = Vec::new();
    // Targets by endpoint, kept only for large dataplanes (see SCAN_TARGETS).
    let large = dataplane.inbounds.len() > SCAN_TARGETS;
    let mut target_at: HashMap<SocketAddr, usize> = HashMap::new();
    let mut target_of_inbound = Vec::with_capacity(dataplane.inbounds.len());
    for (index, inbound) in dataplane.inbounds.iter().enumerate() {
        let ignored = inbound.state == crate::dataplane::InboundState::Ignored;
        if ignored || (!settings.probe_all_inbounds && inbound.probe.is_none()) {
            target_of_inbound.push(None);
            continue;
        }
        let overrides = inbound.probe.as_ref();
        let probe = overrides
            .map(|o| o.apply(&settings.defaults))
            .unwrap_or(settings.defaults);
        let check = overrides
            .and_then(|o| o.check.clone())
            .unwrap_or_else(|| settings.default_check.clone());
        if let Some(error) = probe.validate().into_iter().chain(check.validate()).next() {
            return Err(SpecifierError::InvalidProbe {
                inbound: index,
                error,
            });
        }
        let endpoint = SocketAddr::new(
            overrides
                .and_then(|o| o.address)
                .unwrap_or(inbound.service_address),
            overrides
                .and_then(|o| o.port)
                .unwrap_or(inbound.service_port),
        );
        let existing = if large {
            target_at.get(&endpoint).copied()
        } else {
            targets.iter().position(|t| t.endpoint == endpoint)
        };
        match existing {
            Some(t) if targets[t].settings != probe || targets[t].check != check => {
                return Err(SpecifierError::ConflictingProbes {
                    first: targets[t].inbounds[0],
                    second: index,
                    endpoint,
                })
            }
            Some(t) => {
                targets[t].inbounds.push(index);
                target_of_inbound.push(Some(t));
            }
            None => {
                targets.push(ProbeTarget {
                    cluster: cluster_name(endpoint),
                    endpoint,
                    settings: probe,
                    check,
                    inbounds: vec![index],
                });
                if large {
                    target_at.insert(endpoint, targets.len() - 1);
                }
                target_of_inbound.push(Some(targets.len() - 1));
            }
        }
    }
    let envoy_ready = match dataplane.admin_port {
        Some(port) if settings.check_envoy_ready => {
            targets.push(ProbeTarget {
                cluster: ENVOY_READY_CLUSTER.to_string(),
                endpoint: SocketAddr::from(([127, 0, 0, 1], port)),
                settings: settings.defaults,
                check: envoy_ready_check(),
                inbounds: Vec::new(),
            });
            Some(targets.len() - 1)
        }
        _ => None,
    };
    let message = HealthCheckSpecifier {
        cluster_health_checks: targets.iter().map(cluster_health_check).collect(),
        interval: Some(pb_duration(settings.report_interval)),
    };
    Ok(Specifier::new(
        message,
        targets,
        target_of_inbound,
        envoy_ready,
        settings.tcp_fallback,
    ))
}

/// The name of the transport socket match a TLS check's cluster carries.
pub const TLS_MATCH: &str = "hdsd_tls";

/// The key of the criteria (under Envoy's `envoy.transport_socket_match`
/// metadata) with which a TLS health check selects [`TLS_MATCH`]; its value
/// names the TLS settings ([`tls_match_value`]).
pub const TLS_CRITERIA_KEY: &str = "hdsd";

/// The transport socket name of Envoy's TLS.
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

const UPSTREAM_TLS_CONTEXT: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The value both the match and the criteria carry: `tls-` and the FNV-1a
/// hash of the encoded `UpstreamTlsContext` (stable across releases).
///
/// Why the settings are in it: Envoy's HDS recreates a cluster's host when
/// its transport socket matches change, but keys hosts by address, so it
/// never removes the old one from the health checker, which goes on
/// probing it (Envoy 1.40: one more probe per interval for every TLS
/// change). A health check that changes with the settings is a new
/// checker, and the old checker goes away with its sessions.
pub fn tls_match_value(context: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in context {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("tls-{hash:016x}")
}

fn tls_criteria(value: &str) -> Struct {
    Struct {
        fields: [(
            TLS_CRITERIA_KEY.to_string(),
            Value {
                kind: Some(value::Kind::StringValue(value.to_string())),
            },
        )]
        .into(),
    }
}

/// A check's TLS as Envoy gets it: the cluster's transport socket match,
/// and the criteria with which the health check selects it.
fn tls_match(tls: &TlsInForce) -> (TransportSocketMatch, Struct) {
    let context = upstream_tls_context(tls).encode_to_vec();
    let criteria = tls_criteria(&tls_match_value(&context));
    let socket_match = TransportSocketMatch {
        name: TLS_MATCH.to_string(),
        r#match: Some(criteria.clone()),
        transport_socket: Some(TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_string(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(Any {
                type_url: UPSTREAM_TLS_CONTEXT.to_string(),
                value: context,
            })),
        }),
    };
    (socket_match, criteria)
}

/// The prefix of the Envoy stats of a probe's cluster on its admin port
/// (`GET /stats`): Envoy writes the `:` of a stat name as `_`.
pub fn stats_prefix(cluster: &str) -> String {
    format!("cluster.{}.", cluster.replace(':', "_"))
}

/// Envoy's `UpstreamTlsContext` for a check's TLS: the files by name (Envoy
/// reads them), the CA with the SNI as the DNS name the certificate must
/// carry, no validation context at all for `insecureSkipVerify`.
pub fn upstream_tls_context(tls: &TlsInForce) -> UpstreamTlsContext {
    let file = |path: &str| DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_string())),
        ..Default::default()
    };
    let validation = tls.ca_file.as_ref().map(|ca| {
        common_tls_context::ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(file(ca)),
            match_typed_subject_alt_names: tls
                .sni
                .iter()
                .map(|sni| SubjectAltNameMatcher {
                    san_type: subject_alt_name_matcher::SanType::Dns as i32,
                    matcher: Some(StringMatcher {
                        match_pattern: Some(string_matcher::MatchPattern::Exact(sni.clone())),
                        ignore_case: false,
                    }),
                    oid: String::new(),
                })
                .collect(),
            ..Default::default()
        })
    });
    UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: tls
                .client
                .iter()
                .map(|(cert, key)| TlsCertificate {
                    certificate_chain: Some(file(cert)),
                    private_key: Some(file(key)),
                    ..Default::default()
                })
                .collect(),
            alpn_protocols: tls.alpn.clone(),
            validation_context_type: validation,
            ..Default::default()
        }),
        sni: tls.sni.clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn cluster_health_check(target: &ProbeTarget) -> ClusterHealthCheck {
    let s = &target.settings;
    let (socket_match, criteria) = target
        .check
        .tls_in_force()
        .map(|tls| tls_match(&tls))
        .unzip();
    ClusterHealthCheck {
        cluster_name: target.cluster.clone(),
        health_checks: vec![HealthCheck {
            timeout: Some(pb_duration(s.timeout)),
            interval: Some(pb_duration(s.interval)),
            no_traffic_interval: Some(pb_duration(s.no_traffic_interval)),
            no_traffic_healthy_interval: Some(pb_duration(s.no_traffic_interval)),
            healthy_threshold: Some(UInt32Value {
                value: s.healthy_threshold,
            }),
            unhealthy_threshold: Some(UInt32Value {
                value: s.unhealthy_threshold,
            }),
            health_checker: Some(health_checker(&target.check, target.endpoint)),
            transport_socket_match_criteria: criteria,
            ..Default::default()
        }],
        locality_endpoints: vec![LocalityEndpoints {
            locality: None,
            endpoints: vec![endpoint(target.endpoint)],
        }],
        transport_socket_matches: socket_match.into_iter().collect(),
        ..Default::default()
    }
}

/// The Envoy checker of a (validated) check of `endpoint`.
fn health_checker(check: &Check, endpoint: SocketAddr) -> health_check::HealthChecker {
    match check {
        // No payload: connect-only.
        Check::Tcp(tcp) => {
            health_check::HealthChecker::TcpHealthCheck(health_check::TcpHealthCheck {
                send: tcp.send.as_ref().map(payload),
                receive: tcp.receive.iter().map(payload).collect(),
                proxy_protocol_config: None,
            })
        }
        Check::Http(http) => {
            health_check::HealthChecker::HttpHealthCheck(health_check::HttpHealthCheck {
                // Envoy's default Host is the cluster name; the target reads better.
                host: http.host.clone().unwrap_or_else(|| endpoint.to_string()),
                path: http.path.clone(),
                request_headers_to_add: http
                    .headers
                    .iter()
                    .map(|(key, value)| HeaderValueOption {
                        header: Some(HeaderValue {
                            key: key.clone(),
                            value: value.clone(),
                            raw_value: Vec::new(),
                        }),
                        append_action:
                            header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                        ..Default::default()
                    })
                    .collect(),
                // Envoy's ranges are half-open: [start, end).
                expected_statuses: http
                    .statuses()
                    .iter()
                    .map(|r| Int64Range {
                        start: r.start as i64,
                        end: r.end as i64 + 1,
                    })
                    .collect(),
                codec_client_type: if http.http2 {
                    CodecClientType::Http2
                } else {
                    CodecClientType::Http1
                } as i32,
                ..Default::default()
            })
        }
        // Envoy 1.38 and later speak HTTP/2 for this check although the
        // cluster built from a ClusterHealthCheck has no HTTP/2 protocol
        // options; 1.36 and 1.37 abort on it (see `capability`), so an
        // Envoy is sent it only when its version runs it.
        Check::Grpc(grpc) => {
            health_check::HealthChecker::GrpcHealthCheck(health_check::GrpcHealthCheck {
                service_name: grpc.service.clone().unwrap_or_default(),
                authority: grpc
                    .authority
                    .clone()
                    .unwrap_or_else(|| endpoint.to_string()),
                initial_metadata: Vec::new(),
            })
        }
    }
}

/// An Envoy payload, always as hex text (validation has decoded it once):
/// Envoy 1.40 never matches a `binary` `receive` payload sent through HDS
/// (the check times out), while the same bytes as hex text match.
fn payload(p: &Payload) -> health_check::Payload {
    health_check::Payload {
        payload: Some(health_check::payload::Payload::Text(hex::encode(
            p.bytes().unwrap_or_default(),
        ))),
    }
}

/// An Envoy endpoint for an IP literal and port.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint {
        address: Some(socket_address(addr.ip(), addr.port())),
        ..Default::default()
    }
}

fn socket_address(ip: IpAddr, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            protocol: socket_address::Protocol::Tcp as i32,
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// The IP and port of an Envoy endpoint, if it is an IP socket address.
pub fn endpoint_addr(endpoint: &Endpoint) -> Option<SocketAddr> {
    let address::Address::SocketAddress(sa) = endpoint.address.as_ref()?.address.as_ref()? else {
        return None;
    };
    let ip: IpAddr = sa.address.parse().ok()?;
    match sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => {
            Some(SocketAddr::new(ip, u16::try_from(p).ok()?))
        }
        _ => None,
    }
}

pub fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{DataplaneId, Inbound, ProbeOverrides};
    use crate::probe::{GrpcCheck, TcpCheck};
    use std::collections::BTreeMap;

    fn defaults() -> SpecifierSettings {
        SpecifierSettings {
            defaults: ProbeSettings {
                interval: Duration::from_secs(1),
                timeout: Duration::from_millis(500),
                no_traffic_interval: Duration::from_secs(2),
                healthy_threshold: 1,
                unhealthy_threshold: 2,
            },
            report_interval: Duration::from_secs(5),
            ..SpecifierSettings::default()
        }
    }

    fn inbound(port: u16, service_port: u16, probe: Option<ProbeOverrides>) -> Inbound {
        Inbound {
            port,
            address: "10.0.0.1".parse().unwrap(),
            service_address: "127.0.0.1".parse().unwrap(),
            service_port,
            tags: BTreeMap::new(),
            probe,
            name: None,
            state: Default::default(),
        }
    }

    fn dataplane(inbounds: Vec<Inbound>) -> Dataplane {
        Dataplane {
            id: DataplaneId::new("default", "web-01"),
            address: "10.0.0.1".parse().unwrap(),
            inbounds,
            gateway: None,
            listeners: Vec::new(),
            admin_port: None,
        }
    }

    #[test]
    fn every_field_is_set() {
        let spec = build(&dataplane(vec![inbound(10001, 8080, None)]), &defaults()).unwrap();
        let expected = HealthCheckSpecifier {
            cluster_health_checks: vec![ClusterHealthCheck {
                cluster_name: "probe_127.0.0.1:8080".into(),
                health_checks: vec![HealthCheck {
                    timeout: Some(PbDuration {
                        seconds: 0,
                        nanos: 500_000_000,
                    }),
                    interval: Some(PbDuration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    no_traffic_interval: Some(PbDuration {
                        seconds: 2,
                        nanos: 0,
                    }),
                    no_traffic_healthy_interval: Some(PbDuration {
                        seconds: 2,
                        nanos: 0,
                    }),
                    healthy_threshold: Some(UInt32Value { value: 1 }),
                    unhealthy_threshold: Some(UInt32Value { value: 2 }),
                    health_checker: Some(health_check::HealthChecker::TcpHealthCheck(
                        health_check::TcpHealthCheck {
                            send: None,
                            receive: vec![],
                            proxy_protocol_config: None,
                        },
                    )),
                    ..Default::default()
                }],
                locality_endpoints: vec![LocalityEndpoints {
                    locality: None,
                    endpoints: vec![Endpoint {
                        address: Some(Address {
                            address: Some(address::Address::SocketAddress(SocketAddress {
                                protocol: 0,
                                address: "127.0.0.1".into(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    8080,
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            }],
            interval: Some(PbDuration {
                seconds: 5,
                nanos: 0,
            }),
        };
        assert_eq!(spec.message, expected);
        assert_eq!(spec.target_of_inbound, vec![Some(0)]);
        assert_eq!(spec.targets[0].inbounds, vec![0]);
    }

    #[test]
    fn shared_targets_share_a_cluster() {
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 9090, None),
            inbound(10003, 8080, None),
        ]);
        let spec = build(&dp, &defaults()).unwrap();
        assert_eq!(spec.message.cluster_health_checks.len(), 2);
        assert_eq!(spec.targets[0].inbounds, vec![0, 2]);
        assert_eq!(spec.targets[1].cluster, "probe_127.0.0.1:9090");
        assert_eq!(spec.target_of_inbound, vec![Some(0), Some(1), Some(0)]);
        // Names are unique, non-empty and stable across builds.
        let names: std::collections::HashSet<_> = spec
            .message
            .cluster_health_checks
            .iter()
            .map(|c| c.cluster_name.clone())
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!(build(&dp, &defaults()).unwrap(), spec);
    }

    #[test]
    fn ipv6_cluster_name_and_lookup() {
        let mut ib = inbound(10001, 8080, None);
        ib.service_address = "::1".parse().unwrap();
        let spec = build(&dataplane(vec![ib]), &defaults()).unwrap();
        assert_eq!(spec.targets[0].cluster, "probe_[::1]:8080");
        let ep = &spec.message.cluster_health_checks[0].locality_endpoints[0].endpoints[0];
        let addr = endpoint_addr(ep).unwrap();
        assert_eq!(spec.target("probe_[::1]:8080", addr), Some(0));
        assert_eq!(spec.target("probe_[::1]:8081", addr), None);
    }

    #[test]
    fn overrides_and_probe_all_inbounds() {
        let o = ProbeOverrides {
            interval: Some(Duration::from_secs(3)),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, Some(o)),
            inbound(10002, 9090, None),
        ]);
        let spec = build(&dp, &defaults()).unwrap();
        let hc = &spec.message.cluster_health_checks[0].health_checks[0];
        assert_eq!(hc.interval.unwrap().seconds, 3);
        assert_eq!(hc.no_traffic_interval.unwrap().seconds, 3);
        let only_probed = SpecifierSettings {
            probe_all_inbounds: false,
            ..defaults()
        };
        let spec = build(&dp, &only_probed).unwrap();
        assert_eq!(spec.targets.len(), 1);
        assert_eq!(spec.target_of_inbound, vec![Some(0), None]);
    }

    #[test]
    fn invalid_override_is_refused() {
        let o = ProbeOverrides {
            timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 9090, Some(o)),
        ]);
        let e = build(&dp, &defaults()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "networking.inbound[1].serviceProbe: timeout (5s) must be <= interval (1s): a probe may not outlive the gap between probes"
        );
    }

    #[test]
    fn conflicting_settings_on_one_target_are_refused() {
        let o = ProbeOverrides {
            healthy_threshold: Some(3),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 8080, Some(o)),
        ]);
        assert!(matches!(
            build(&dp, &defaults()),
            Err(SpecifierError::ConflictingProbes {
                first: 0,
                second: 1,
                ..
            })
        ));
    }

    fn with_check(check: Check) -> Option<ProbeOverrides> {
        Some(ProbeOverrides {
            check: Some(check),
            ..Default::default()
        })
    }

    fn checker(spec: &Specifier, cluster: usize) -> health_check::HealthChecker {
        spec.message.cluster_health_checks[cluster].health_checks[0]
            .health_checker
            .clone()
            .unwrap()
    }

    #[test]
    #[allow(deprecated)] // HeaderValueOption.append: checked to be unset
    fn every_field_of_an_http_check() {
        let mut headers = BTreeMap::new();
        headers.insert("X-Probe".to_string(), "hdsd".to_string());
        let check = Check::Http(HttpCheck {
            path: "/healthz".into(),
            host: Some("web.internal".into()),
            expected_statuses: vec![
                StatusRange {
                    start: 200,
                    end: 200,
                },
                StatusRange {
                    start: 300,
                    end: 302,
                },
            ],
            headers,
            http2: false,
            tls: None,
        });
        let spec = build(
            &dataplane(vec![inbound(10001, 8080, with_check(check))]),
            &defaults(),
        )
        .unwrap();
        assert_eq!(spec.targets[0].cluster, "probe_127.0.0.1:8080");
        assert_eq!(
            checker(&spec, 0),
            health_check::HealthChecker::HttpHealthCheck(health_check::HttpHealthCheck {
                host: "web.internal".into(),
                path: "/healthz".into(),
                send: None,
                receive: vec![],
                response_buffer_size: None,
                request_headers_to_add: vec![HeaderValueOption {
                    header: Some(HeaderValue {
                        key: "X-Probe".into(),
                        value: "hdsd".into(),
                        raw_value: vec![],
                    }),
                    append: None,
                    append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
                        as i32,
                    keep_empty_value: false,
                }],
                request_headers_to_remove: vec![],
                expected_statuses: vec![
                    Int64Range {
                        start: 200,
                        end: 201
                    },
                    Int64Range {
                        start: 300,
                        end: 303
                    },
                ],
                retriable_statuses: vec![],
                codec_client_type: CodecClientType::Http1 as i32,
                service_name_matcher: None,
                method: 0,
            })
        );
        // The timing fields are the same as for a TCP check.
        let hc = &spec.message.cluster_health_checks[0].health_checks[0];
        assert_eq!(hc.interval, Some(pb_duration(Duration::from_secs(1))));
        assert_eq!(hc.unhealthy_threshold, Some(UInt32Value { value: 2 }));
    }

    #[test]
    fn http_defaults_http2_grpc_and_tcp_payloads() {
        let dp = dataplane(vec![
            inbound(10001, 8080, with_check(Check::Http(HttpCheck::path("/h")))),
            inbound(
                10002,
                8081,
                with_check(Check::Http(HttpCheck {
                    http2: true,
                    ..HttpCheck::path("/h2")
                })),
            ),
            inbound(
                10003,
                8082,
                with_check(Check::Grpc(GrpcCheck {
                    service: Some("shop.Cart".into()),
                    authority: None,
                    tls: None,
                })),
            ),
            inbound(
                10004,
                8083,
                with_check(Check::Tcp(TcpCheck {
                    send: Some(Payload::Text("PING\r\n".into())),
                    receive: vec![Payload::Hex("504f4e47".into()), Payload::Text("!".into())],
                    tls: None,
                })),
            ),
        ]);
        let spec = build(&dp, &defaults()).unwrap();
        let health_check::HealthChecker::HttpHealthCheck(h) = checker(&spec, 0) else {
            panic!("http")
        };
        assert_eq!(h.host, "127.0.0.1:8080", "Host defaults to the target");
        assert_eq!(
            h.expected_statuses,
            vec![Int64Range {
                start: 200,
                end: 300
            }]
        );
        assert_eq!(h.codec_client_type, CodecClientType::Http1 as i32);
        assert!(h.request_headers_to_add.is_empty());
        let health_check::HealthChecker::HttpHealthCheck(h) = checker(&spec, 1) else {
            panic!("http2")
        };
        assert_eq!(h.codec_client_type, CodecClientType::Http2 as i32);
        assert_eq!(
            checker(&spec, 2),
            health_check::HealthChecker::GrpcHealthCheck(health_check::GrpcHealthCheck {
                service_name: "shop.Cart".into(),
                authority: "127.0.0.1:8082".into(),
                initial_metadata: vec![],
            })
        );
        let hex = |h: &str| health_check::Payload {
            payload: Some(health_check::payload::Payload::Text(h.to_string())),
        };
        assert_eq!(
            checker(&spec, 3),
            health_check::HealthChecker::TcpHealthCheck(health_check::TcpHealthCheck {
                send: Some(hex("50494e470d0a")),
                receive: vec![hex("504f4e47"), hex("21")],
                proxy_protocol_config: None,
            })
        );
    }

    #[test]
    fn probe_port_and_address_choose_the_target() {
        let o = ProbeOverrides {
            port: Some(9901),
            address: Some("10.0.0.7".parse().unwrap()),
            ..Default::default()
        };
        let spec = build(&dataplane(vec![inbound(10001, 8080, Some(o))]), &defaults()).unwrap();
        let target: SocketAddr = "10.0.0.7:9901".parse().unwrap();
        assert_eq!(spec.targets[0].endpoint, target);
        assert_eq!(spec.targets[0].cluster, "probe_10.0.0.7:9901");
        let ep = &spec.message.cluster_health_checks[0].locality_endpoints[0].endpoints[0];
        assert_eq!(endpoint_addr(ep), Some(target));
        // Only the port: the address stays serviceAddress.
        let o = ProbeOverrides {
            port: Some(9901),
            ..Default::default()
        };
        let spec = build(&dataplane(vec![inbound(10001, 8080, Some(o))]), &defaults()).unwrap();
        assert_eq!(spec.targets[0].endpoint, "127.0.0.1:9901".parse().unwrap());
    }

    #[test]
    fn changing_only_the_check_keeps_the_cluster_name() {
        let tcp = build(&dataplane(vec![inbound(10001, 8080, None)]), &defaults()).unwrap();
        let http = build(
            &dataplane(vec![inbound(
                10001,
                8080,
                with_check(Check::Http(HttpCheck::path("/healthz"))),
            )]),
            &defaults(),
        )
        .unwrap();
        assert_ne!(tcp.message, http.message);
        assert_eq!(tcp.targets[0].cluster, http.targets[0].cluster);
        assert_eq!(tcp.targets[0].endpoint, http.targets[0].endpoint);
    }

    #[test]
    fn default_check_and_kuma_tcp() {
        let settings = SpecifierSettings {
            default_check: Check::Http(HttpCheck::path("/healthz")),
            ..defaults()
        };
        let timing_only = ProbeOverrides {
            interval: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 8081, Some(timing_only)),
            inbound(10003, 8082, with_check(Check::default())),
        ]);
        let spec = build(&dp, &settings).unwrap();
        let kinds: Vec<&str> = spec.targets.iter().map(|t| t.check.kind()).collect();
        assert_eq!(kinds, vec!["http", "http", "tcp"]);
    }

    #[test]
    fn the_envoy_ready_check() {
        let mut dp = dataplane(vec![inbound(10001, 8080, None)]);
        dp.admin_port = Some(9901);
        let spec = build(&dp, &defaults()).unwrap();
        assert_eq!(spec.envoy_ready, Some(1));
        let t = &spec.targets[1];
        assert_eq!(t.cluster, ENVOY_READY_CLUSTER);
        assert_eq!(t.endpoint, "127.0.0.1:9901".parse().unwrap());
        assert!(t.inbounds.is_empty());
        assert_eq!(spec.target_of_inbound, vec![Some(0)]);
        let health_check::HealthChecker::HttpHealthCheck(h) = checker(&spec, 1) else {
            panic!("http")
        };
        assert_eq!(h.path, "/ready");
        assert_eq!(
            h.expected_statuses,
            vec![Int64Range {
                start: 200,
                end: 201
            }]
        );
        assert_eq!(
            spec.message.cluster_health_checks[1].cluster_name,
            "envoy_ready"
        );
        // Off by configuration, or without an admin port.
        let off = SpecifierSettings {
            check_envoy_ready: false,
            ..defaults()
        };
        assert_eq!(build(&dp, &off).unwrap().envoy_ready, None);
        dp.admin_port = None;
        let spec = build(&dp, &defaults()).unwrap();
        assert_eq!((spec.envoy_ready, spec.targets.len()), (None, 1));
    }

    #[test]
    fn report_endpoints_are_looked_up_by_cluster_and_endpoint() {
        // An inbound whose application is on the admin port's address: two
        // targets share the endpoint, the cluster tells them apart.
        let mut dp = dataplane(vec![inbound(10001, 9901, None), inbound(10002, 8080, None)]);
        dp.admin_port = Some(9901);
        let spec = build(&dp, &defaults()).unwrap();
        let shared: SocketAddr = "127.0.0.1:9901".parse().unwrap();
        let app: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let ready = spec.envoy_ready.unwrap();
        assert_eq!(spec.target(&spec.targets[0].cluster, shared), Some(0));
        assert_eq!(spec.target(ENVOY_READY_CLUSTER, shared), Some(ready));
        assert_eq!(spec.target(&spec.targets[1].cluster, app), Some(1));
        assert_eq!(spec.target("probe_other", app), None);
        assert_eq!(
            spec.target(&spec.targets[1].cluster, "10.0.0.1:1".parse().unwrap()),
            None
        );
        assert_eq!(spec.target_by_endpoint(app), Some(1));
        assert_eq!(spec.target_by_endpoint(shared), Some(0));
    }

    #[test]
    fn a_large_specifier_finds_endpoints_by_lookup_like_a_small_one_by_scan() {
        let inbounds: Vec<_> = (0..100)
            .map(|i| inbound(10000 + i, 20000 + i, None))
            .collect();
        let mut dp = dataplane(inbounds);
        dp.admin_port = Some(20050);
        let spec = build(&dp, &defaults()).unwrap();
        assert!(spec.targets.len() > SCAN_TARGETS && !spec.by_endpoint.is_empty());
        for (i, t) in spec.targets.iter().enumerate() {
            assert_eq!(spec.target(&t.cluster, t.endpoint), Some(i), "{t:?}");
        }
        let shared: SocketAddr = "127.0.0.1:20050".parse().unwrap();
        assert_eq!(spec.target_by_endpoint(shared), Some(50));
        assert_eq!(spec.target("probe_other", shared), None);
        assert_eq!(
            spec.target_by_endpoint("127.0.0.1:1".parse().unwrap()),
            None
        );
    }

    #[test]
    fn invalid_checks_and_different_kinds_on_one_target_are_refused() {
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(
                10002,
                9090,
                with_check(Check::Http(HttpCheck::path("healthz"))),
            ),
        ]);
        assert_eq!(
            build(&dp, &defaults()).unwrap_err().to_string(),
            "networking.inbound[1].serviceProbe: http.path \"healthz\" must start with '/' (e.g. /healthz)"
        );
        // The same target, once by its service port, once by a probe port.
        let o = ProbeOverrides {
            port: Some(8080),
            check: Some(Check::Http(HttpCheck::path("/healthz"))),
            ..Default::default()
        };
        let dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 9090, Some(o)),
        ]);
        assert_eq!(
            build(&dp, &defaults()).unwrap_err().to_string(),
            "networking.inbound[0] and networking.inbound[1] probe the same target 127.0.0.1:8080 with different settings; give them the same serviceProbe"
        );
    }

    /// The reference TLS shapes (`testdata/specifiers/tls-probes.yaml`), one
    /// inbound each; tests/probes_tls.rs has Envoy validate the same file.
    const TLS_SHAPES: &str = include_str!("../testdata/specifiers/tls-probes.yaml");

    /// The transport socket of cluster `i`, decoded, with its match name
    /// and criteria (`None` when the cluster has none).
    fn tls_of(spec: &Specifier, i: usize) -> Option<UpstreamTlsContext> {
        let chc = &spec.message.cluster_health_checks[i];
        let criteria = chc.health_checks[0].transport_socket_match_criteria.clone();
        if chc.transport_socket_matches.is_empty() {
            assert_eq!(criteria, None, "criteria without a match: {chc:?}");
            return None;
        }
        let [m] = &chc.transport_socket_matches[..] else {
            panic!("one match per TLS cluster: {chc:?}")
        };
        assert_eq!(m.name, TLS_MATCH);
        assert_eq!(criteria, m.r#match, "the check selects the match");
        let socket = m.transport_socket.as_ref().unwrap();
        assert_eq!(socket.name, "envoy.transport_sockets.tls");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("typed config: {socket:?}")
        };
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        // The criteria name the settings: `tls-` and the hash of the context.
        assert_eq!(
            m.r#match,
            Some(tls_criteria(&tls_match_value(&any.value))),
            "{chc:?}"
        );
        Some(UpstreamTlsContext::decode(&any.value[..]).unwrap())
    }

    /// The criteria's value: the same settings the same name, other
    /// settings another (so Envoy replaces the health checker), a stable
    /// hash of the encoded context.
    #[test]
    fn the_criteria_name_the_tls_settings() {
        let dp = crate::dataplane::parse_documents(TLS_SHAPES)
            .unwrap()
            .remove(0);
        let spec = build(&dp, &defaults()).unwrap();
        let values: Vec<String> = spec.message.cluster_health_checks[..6]
            .iter()
            .map(|c| {
                let criteria = c.health_checks[0]
                    .transport_socket_match_criteria
                    .as_ref()
                    .unwrap();
                match &criteria.fields[TLS_CRITERIA_KEY].kind {
                    Some(value::Kind::StringValue(v)) => v.clone(),
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        let distinct: std::collections::BTreeSet<&String> = values.iter().collect();
        assert_eq!(distinct.len(), values.len(), "{values:?}");
        assert!(values
            .iter()
            .all(|v| v.len() == 20 && v.starts_with("tls-")));
        let again = build(&dp, &defaults()).unwrap();
        assert_eq!(again.message, spec.message);
        // FNV-1a 64 of nothing and of "a" (the published test vectors).
        assert_eq!(tls_match_value(b""), "tls-cbf29ce484222325");
        assert_eq!(tls_match_value(b"a"), "tls-af63dc4c8601ec8c");
        assert_eq!(
            stats_prefix("probe_127.0.0.1:8443"),
            "cluster.probe_127.0.0.1_8443."
        );
        assert_eq!(
            stats_prefix("probe_[::1]:8443"),
            "cluster.probe_[__1]_8443."
        );
    }

    fn file(path: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.into())),
            ..Default::default()
        })
    }

    fn context(
        sni: &str,
        ca: Option<&str>,
        client: Option<(&str, &str)>,
        alpn: &[&str],
    ) -> UpstreamTlsContext {
        UpstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificates: client
                    .into_iter()
                    .map(|(cert, key)| TlsCertificate {
                        certificate_chain: file(cert),
                        private_key: file(key),
                        ..Default::default()
                    })
                    .collect(),
                alpn_protocols: alpn.iter().map(|a| a.to_string()).collect(),
                validation_context_type: ca.map(|ca| {
                    common_tls_context::ValidationContextType::ValidationContext(
                        CertificateValidationContext {
                            trusted_ca: file(ca),
                            match_typed_subject_alt_names: (!sni.is_empty())
                                .then(|| SubjectAltNameMatcher {
                                    san_type: subject_alt_name_matcher::SanType::Dns as i32,
                                    matcher: Some(StringMatcher {
                                        match_pattern: Some(string_matcher::MatchPattern::Exact(
                                            sni.into(),
                                        )),
                                        ignore_case: false,
                                    }),
                                    oid: String::new(),
                                })
                                .into_iter()
                                .collect(),
                            ..Default::default()
                        },
                    )
                }),
                ..Default::default()
            }),
            sni: sni.into(),
            ..Default::default()
        }
    }

    #[test]
    fn every_tls_shape_of_the_reference_file() {
        let dp = crate::dataplane::parse_documents(TLS_SHAPES)
            .unwrap()
            .remove(0);
        let spec = build(&dp, &defaults()).unwrap();
        let ca = Some("/certs/ca.pem");
        let client = Some(("/certs/client.pem", "/certs/client.key"));
        let expected = [
            Some(context("web.internal", ca, None, &[])),
            Some(context("", None, None, &["h2"])),
            Some(context("", ca, None, &["h2"])),
            Some(context("cart.internal", ca, client, &["h2", "grpc-exp"])),
            Some(context("", ca, None, &[])),
            Some(context("", None, client, &[])),
            None,
            None,
        ];
        assert_eq!(spec.targets.len(), expected.len());
        for (i, want) in expected.into_iter().enumerate() {
            assert_eq!(tls_of(&spec, i), want, "inbound {i}");
        }
        // TLS changes nothing else: the checker is the plaintext one.
        let plain = |yaml: &str| {
            let mut dp = crate::dataplane::parse_documents(yaml).unwrap().remove(0);
            for inbound in &mut dp.inbounds {
                if let Some(Check::Http(h)) = inbound.probe.as_mut().and_then(|p| p.check.as_mut())
                {
                    h.tls = None;
                }
            }
            build(&dp, &defaults()).unwrap()
        };
        let without = plain(TLS_SHAPES);
        assert_eq!(checker(&spec, 0), checker(&without, 0));
        let (mut a, b) = (
            spec.message.cluster_health_checks[0].clone(),
            without.message.cluster_health_checks[0].clone(),
        );
        a.transport_socket_matches.clear();
        a.health_checks[0].transport_socket_match_criteria = None;
        assert_eq!(a, b);
    }

    /// A specifier without TLS is exactly what it was before TLS existed:
    /// no transport socket match, no criteria, on any cluster.
    #[test]
    fn checks_without_tls_carry_no_transport_socket() {
        let mut dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 8081, with_check(Check::Http(HttpCheck::path("/h")))),
            inbound(10003, 8082, with_check(Check::Grpc(GrpcCheck::default()))),
        ]);
        dp.admin_port = Some(9901);
        let spec = build(&dp, &defaults()).unwrap();
        for chc in &spec.message.cluster_health_checks {
            assert!(chc.transport_socket_matches.is_empty(), "{chc:?}");
            assert_eq!(chc.health_checks[0].transport_socket_match_criteria, None);
        }
    }

    /// The default check carries `hds.check.tls` (the Envoy's own `/ready`
    /// check never does), and an Envoy too old for gRPC gets its TCP
    /// fallback over the same transport socket.
    #[test]
    fn default_tls_and_the_fallback_keep_the_transport_socket() {
        let settings = SpecifierSettings {
            default_check: Check::Tcp(TcpCheck {
                tls: Some(Box::new(crate::probe::Tls::with_ca("/ca.pem"))),
                ..TcpCheck::default()
            }),
            tcp_fallback: true,
            ..defaults()
        };
        let grpc = Check::Grpc(GrpcCheck {
            tls: Some(Box::new(crate::probe::Tls::with_ca("/ca.pem"))),
            ..GrpcCheck::default()
        });
        let mut dp = dataplane(vec![
            inbound(10001, 8080, None),
            inbound(10002, 8081, with_check(grpc)),
        ]);
        dp.admin_port = Some(9901);
        let spec = build(&dp, &settings).unwrap();
        assert_eq!(
            tls_of(&spec, 0),
            Some(context("", Some("/ca.pem"), None, &[]))
        );
        let grpc_tls = tls_of(&spec, 1);
        assert_eq!(grpc_tls, Some(context("", Some("/ca.pem"), None, &["h2"])));
        assert_eq!(tls_of(&spec, 2), None, "the Envoy's own /ready");
        let (old, _) = spec
            .for_envoy(Some(EnvoyVersion::new(1, 37, 0)), false)
            .expect("1.37 runs no gRPC check");
        assert!(matches!(
            checker(&old, 1),
            health_check::HealthChecker::TcpHealthCheck(_)
        ));
        assert_eq!(tls_of(&old, 1), grpc_tls, "the same transport socket");
    }

    #[test]
    fn no_inbounds_no_clusters() {
        let spec = build(&dataplane(vec![]), &defaults()).unwrap();
        assert!(spec.message.cluster_health_checks.is_empty());
        assert_eq!(spec.message.interval.unwrap().seconds, 5);
    }

    #[test]
    fn the_encoded_bytes_are_the_message() {
        let empty = Specifier::empty(Duration::from_secs(7));
        let decoded = HealthCheckSpecifier::decode(&empty.encoded()[..]).unwrap();
        assert_eq!(decoded, empty.message);
        assert_eq!(decoded.interval.unwrap().seconds, 7);
        let spec = build(
            &dataplane(vec![inbound(10001, 8080, None), inbound(10002, 8081, None)]),
            &defaults(),
        )
        .unwrap();
        let not_yet_encoded = spec.clone();
        assert_eq!(spec.encoded()[..], spec.message.encode_to_vec()[..]);
        // Encoded once, then shared; the cache is not part of the value.
        assert_eq!(spec.encoded().as_ptr(), spec.encoded().as_ptr());
        assert_eq!(spec, not_yet_encoded);
        let decoded = HealthCheckSpecifier::decode(&spec.encoded()[..]).unwrap();
        assert_eq!(decoded.cluster_health_checks.len(), 2);
        assert_eq!(decoded, spec.message);
    }
}
