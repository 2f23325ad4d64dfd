//! Kuma's `Dataplane` resource as serde reads it: the document shapes, with
//! Kuma's field names, turned into the model.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::de::{Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer};

use super::model::{
    Dataplane, DataplaneId, GatewayType, Inbound, InboundState, Listener, ProbeOverrides,
};
use crate::probe::{one_kind, Check, GrpcCheck, HttpCheck, Payload, StatusRange, TcpCheck, Tls};

// Followed: Kuma's `api/mesh/v1alpha1/dataplane.proto` (main branch; see
// docs/configuration.md, "Dataplane files", for the version). Kuma reads a resource with protojson, which also
// takes a field's proto name: the snake_case aliases below are those names.

/// The fields every resource has, read before deciding what a document is.
#[derive(Deserialize)]
#[serde(expecting = "a Kuma resource: a mapping with `type`, `mesh` and `name`")]
pub(super) struct Header {
    #[serde(rename = "type", default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) name: Option<serde_json::Value>,
    /// Kubernetes manifests have `kind` instead of `type`.
    #[serde(rename = "kind", default)]
    pub(super) k8s_kind: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
pub(super) struct DataplaneDoc {
    #[serde(rename = "type")]
    kind: String,
    mesh: String,
    name: String,
    networking: NetworkingDoc,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    labels: Option<IgnoredAny>,
    #[serde(default)]
    creation_time: Option<IgnoredAny>,
    #[serde(default)]
    modification_time: Option<IgnoredAny>,
    /// Kuma's resource identifier (`kri_...`), set by the control plane.
    #[serde(default)]
    kri: Option<IgnoredAny>,
    #[serde(default)]
    metrics: Option<IgnoredAny>,
    #[serde(default)]
    probes: Option<IgnoredAny>,
    #[serde(default)]
    envoy: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct NetworkingDoc {
    address: IpLiteral,
    #[serde(default)]
    inbound: Vec<InboundDoc>,
    #[serde(default)]
    gateway: Option<GatewayDoc>,
    #[serde(default)]
    listeners: Vec<ListenerDoc>,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    advertised_address: Option<IgnoredAny>,
    #[serde(default)]
    outbound: Vec<OutboundDoc>,
    #[serde(default, alias = "transparent_proxying")]
    transparent_proxying: Option<TransparentProxyingDoc>,
    #[serde(default)]
    admin: Option<AdminDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct InboundDoc {
    port: Port,
    #[serde(default)]
    service_port: Option<Port>,
    #[serde(default)]
    service_address: Option<IpLiteral>,
    #[serde(default)]
    address: Option<IpLiteral>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    service_probe: Option<ServiceProbeDoc>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    state: InboundState,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    health: Option<HealthDoc>,
    /// The application protocol (`http`, `grpc`, `tcp`...).
    #[serde(default)]
    protocol: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ServiceProbeDoc {
    #[serde(default, with = "humantime_serde")]
    interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    no_traffic_interval: Option<Duration>,
    #[serde(default)]
    healthy_threshold: Option<u32>,
    #[serde(default)]
    unhealthy_threshold: Option<u32>,
    /// Kuma's `tcp: {}` (a connect), or hdsd's payload check.
    #[serde(default)]
    tcp: Option<TcpDoc>,
    /// hdsd's extension: an HTTP check.
    #[serde(default)]
    http: Option<HttpDoc>,
    /// hdsd's extension: a grpc.health.v1 check.
    #[serde(default)]
    grpc: Option<GrpcDoc>,
    /// hdsd's extension: probe this port instead of `servicePort`.
    #[serde(default)]
    port: Option<Port>,
    /// hdsd's extension: probe this address instead of `serviceAddress`.
    #[serde(default)]
    address: Option<IpLiteral>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TcpDoc {
    #[serde(default)]
    send: Option<String>,
    #[serde(default)]
    send_hex: Option<String>,
    #[serde(default)]
    receive: Vec<String>,
    #[serde(default)]
    receive_hex: Vec<String>,
    #[serde(default)]
    tls: Option<TlsDoc>,
}

/// hdsd's extension: `tls:` in `http`, `grpc` or `tcp`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TlsDoc {
    /// On unless written `false`: the block's presence turns TLS on.
    #[serde(default = "enabled")]
    enabled: bool,
    #[serde(default)]
    sni: Option<String>,
    #[serde(default)]
    ca_file: Option<String>,
    /// A boolean only (`true`), never a string: skipping verification is
    /// spelled out.
    #[serde(default)]
    insecure_skip_verify: bool,
    #[serde(default)]
    client_cert_file: Option<String>,
    #[serde(default)]
    client_key_file: Option<String>,
    #[serde(default)]
    alpn: Vec<String>,
}

fn enabled() -> bool {
    true
}

impl From<TlsDoc> for Tls {
    fn from(d: TlsDoc) -> Tls {
        Tls {
            enabled: d.enabled,
            sni: d.sni,
            ca_file: d.ca_file,
            insecure_skip_verify: d.insecure_skip_verify,
            client_cert_file: d.client_cert_file,
            client_key_file: d.client_key_file,
            alpn: d.alpn,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HttpDoc {
    path: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    expected_statuses: Vec<StatusDoc>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    http2: bool,
    #[serde(default)]
    tls: Option<TlsDoc>,
}

/// `200` or `"200-299"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum StatusDoc {
    Code(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcDoc {
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default)]
    tls: Option<TlsDoc>,
}

impl StatusDoc {
    fn range(self) -> Result<StatusRange, String> {
        let text = match self {
            StatusDoc::Code(n) => return Ok(StatusRange { start: n, end: n }),
            StatusDoc::Text(t) => t,
        };
        let bad = || {
            format!("http.expectedStatuses: {text:?} is neither a status (200) nor a range (\"200-299\")")
        };
        let (start, end) = text.split_once('-').unwrap_or((&text, &text));
        let start = start.trim().parse::<u64>().map_err(|_| bad())?;
        let end = end.trim().parse::<u64>().map_err(|_| bad())?;
        Ok(StatusRange { start, end })
    }
}

impl TcpDoc {
    fn check(self) -> Result<TcpCheck, String> {
        let send = match (self.send, self.send_hex) {
            (Some(_), Some(_)) => {
                return Err("tcp: set send or sendHex, not both".into());
            }
            (Some(t), None) => Some(Payload::Text(t)),
            (None, Some(h)) => Some(Payload::Hex(h)),
            (None, None) => None,
        };
        if !self.receive.is_empty() && !self.receive_hex.is_empty() {
            return Err("tcp: set receive or receiveHex, not both".into());
        }
        let receive = if self.receive_hex.is_empty() {
            self.receive.into_iter().map(Payload::Text).collect()
        } else {
            self.receive_hex.into_iter().map(Payload::Hex).collect()
        };
        Ok(TcpCheck {
            send,
            receive,
            tls: self.tls.map(|t| Box::new(Tls::from(t))),
        })
    }
}

impl ServiceProbeDoc {
    fn into_overrides(self) -> Result<ProbeOverrides, String> {
        let kinds: Vec<&str> = [
            ("http", self.http.is_some()),
            ("grpc", self.grpc.is_some()),
            ("tcp", self.tcp.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        one_kind(&kinds).map_err(|e| e.to_string())?;
        let check = if let Some(http) = self.http {
            Some(Check::Http(HttpCheck {
                path: http.path,
                host: http.host,
                expected_statuses: http
                    .expected_statuses
                    .into_iter()
                    .map(StatusDoc::range)
                    .collect::<Result<_, _>>()?,
                headers: http.headers,
                http2: http.http2,
                tls: http.tls.map(|t| Box::new(Tls::from(t))),
            }))
        } else if let Some(grpc) = self.grpc {
            Some(Check::Grpc(GrpcCheck {
                service: grpc.service,
                authority: grpc.authority,
                tls: grpc.tls.map(|t| Box::new(Tls::from(t))),
            }))
        } else if let Some(tcp) = self.tcp {
            Some(Check::Tcp(tcp.check()?))
        } else {
            None
        };
        Ok(ProbeOverrides {
            interval: self.interval,
            timeout: self.timeout,
            no_traffic_interval: self.no_traffic_interval,
            healthy_threshold: self.healthy_threshold,
            unhealthy_threshold: self.unhealthy_threshold,
            check,
            port: self.port.map(|p| p.0),
            address: self.address.map(|a| a.0),
        })
    }
}

/// An IP address literal; a hostname is refused with the reason.
struct IpLiteral(IpAddr);

impl<'de> Deserialize<'de> for IpLiteral {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<IpAddr>().map(IpLiteral).map_err(|_| {
            D::Error::custom(format!(
                "address {s:?} is not an IP literal; hdsd sends only IP addresses to Envoy (a hostname can crash Envoy's HDS), so write the IPv4 or IPv6 address"
            ))
        })
    }
}

/// A TCP port, 1..=65535.
struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        match u16::try_from(n) {
            Ok(p) if p != 0 => Ok(Port(p)),
            _ => Err(D::Error::custom(format!(
                "port {n} is out of range; use 1-65535"
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct HealthDoc {
    #[serde(default)]
    ready: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct GatewayDoc {
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(rename = "type", default)]
    kind: Option<GatewayType>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ListenerDoc {
    #[serde(rename = "type")]
    kind: String,
    port: Port,
    #[serde(default)]
    address: Option<IgnoredAny>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    state: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct OutboundDoc {
    #[serde(default)]
    address: Option<IgnoredAny>,
    #[serde(default)]
    port: Option<IgnoredAny>,
    #[serde(default)]
    tags: Option<IgnoredAny>,
    /// Deprecated by Kuma in favour of `tags`.
    #[serde(default)]
    service: Option<IgnoredAny>,
    #[serde(default, alias = "backend_ref")]
    backend_ref: Option<BackendRefDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct BackendRefDoc {
    #[serde(default)]
    kind: Option<IgnoredAny>,
    #[serde(default)]
    name: Option<IgnoredAny>,
    #[serde(default)]
    namespace: Option<IgnoredAny>,
    #[serde(default)]
    port: Option<IgnoredAny>,
    #[serde(default)]
    labels: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct TransparentProxyingDoc {
    #[serde(default, alias = "redirect_port_inbound")]
    redirect_port_inbound: Option<IgnoredAny>,
    #[serde(default, alias = "redirect_port_outbound")]
    redirect_port_outbound: Option<IgnoredAny>,
    /// Removed by Kuma (one port for IPv4 and IPv6); older files still have it.
    #[serde(default, alias = "redirect_port_inbound_v6")]
    redirect_port_inbound_v6: Option<IgnoredAny>,
    #[serde(default, alias = "direct_access_services")]
    direct_access_services: Option<IgnoredAny>,
    #[serde(default, alias = "reachable_services")]
    reachable_services: Option<IgnoredAny>,
    #[serde(default, alias = "ip_family_mode")]
    ip_family_mode: Option<IgnoredAny>,
    #[serde(default, alias = "reachable_backends")]
    reachable_backends: Option<ReachableBackendsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ReachableBackendsDoc {
    #[serde(default)]
    refs: Vec<BackendRefDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct AdminDoc {
    #[serde(default)]
    port: Option<Port>,
}

impl DataplaneDoc {
    pub(super) fn into_dataplane(self) -> Result<Dataplane, String> {
        if self.kind != "Dataplane" {
            return Err(format!(
                "type is {:?}; only `type: Dataplane` documents belong in the dataplanes directory",
                self.kind
            ));
        }
        let id = DataplaneId::try_new(self.mesh, self.name).map_err(|e| e.0)?;
        let address = self.networking.address.0;
        let mut inbounds: Vec<Inbound> = Vec::with_capacity(self.networking.inbound.len());
        for (i, doc) in self.networking.inbound.into_iter().enumerate() {
            let inbound_address = doc.address.map(|a| a.0).unwrap_or(address);
            if let Some(other) = inbounds
                .iter()
                .position(|o| o.address == inbound_address && o.port == doc.port.0)
            {
                return Err(format!(
                    "{id}: networking.inbound[{i}] repeats address {inbound_address} port {} of networking.inbound[{other}]; each inbound needs its own port",
                    doc.port.0
                ));
            }
            inbounds.push(Inbound {
                port: doc.port.0,
                address: inbound_address,
                service_address: doc.service_address.map(|a| a.0).unwrap_or(inbound_address),
                service_port: doc.service_port.map(|p| p.0).unwrap_or(doc.port.0),
                tags: doc.tags,
                probe: doc
                    .service_probe
                    .map(ServiceProbeDoc::into_overrides)
                    .transpose()
                    .map_err(|e| format!("{id}: networking.inbound[{i}].serviceProbe: {e}"))?,
                name: doc.name.filter(|n| !n.is_empty()),
                state: doc.state,
            });
        }
        let listeners = self
            .networking
            .listeners
            .into_iter()
            .map(|l| Listener {
                kind: l.kind,
                port: l.port.0,
                name: l.name.filter(|n| !n.is_empty()),
            })
            .collect();
        Ok(Dataplane {
            id,
            address,
            inbounds,
            gateway: self
                .networking
                .gateway
                .map(|g| g.kind.unwrap_or(GatewayType::Delegated)),
            listeners,
            admin_port: self.networking.admin.and_then(|a| a.port).map(|p| p.0),
        })
    }
}

// The model's enums, read by name or by number as Kuma reads a proto enum.

impl<'de> Deserialize<'de> for InboundState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match proto_enum(d, "state", &InboundState::NAMES)? {
            0 => Ok(InboundState::Ready),
            1 => Ok(InboundState::NotReady),
            _ => Ok(InboundState::Ignored),
        }
    }
}

impl<'de> Deserialize<'de> for GatewayType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match proto_enum(d, "gateway type", &["DELEGATED", "BUILTIN"])? {
            0 => Ok(GatewayType::Delegated),
            _ => Ok(GatewayType::Builtin),
        }
    }
}

/// A protobuf enum as Kuma reads it: by name, or by number.
fn proto_enum<'de, D: Deserializer<'de>>(
    d: D,
    what: &'static str,
    names: &'static [&'static str],
) -> Result<usize, D::Error> {
    struct Visitor {
        what: &'static str,
        names: &'static [&'static str],
    }
    impl Visitor {
        fn bad<E: serde::de::Error>(&self, value: &dyn fmt::Display) -> E {
            E::custom(format!(
                "{} {value} is not one of {}",
                self.what,
                self.names.join(", ")
            ))
        }
    }
    impl serde::de::Visitor<'_> for Visitor {
        type Value = usize;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "one of {}", self.names.join(", "))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<usize, E> {
            self.names
                .iter()
                .position(|n| *n == v)
                .ok_or_else(|| self.bad(&format_args!("{v:?}")))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<usize, E> {
            usize::try_from(v)
                .ok()
                .filter(|i| *i < self.names.len())
                .ok_or_else(|| self.bad(&v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<usize, E> {
            match u64::try_from(v) {
                Ok(u) => self.visit_u64(u),
                Err(_) => Err(self.bad(&v)),
            }
        }
    }
    d.deserialize_any(Visitor { what, names })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::dataplane::{parse_documents, parse_file, DataplaneKind, Format, ParsedFile};

    /// A sidecar with Kuma's fields hdsd reads and some it ignores.
    pub(in crate::dataplane) const WEB: &str = r#"
type: Dataplane
mesh: default
name: web-01
labels: {team: a}
networking:
  address: 192.168.0.10
  advertisedAddress: 10.0.0.1
  inbound:
  - port: 10001
    servicePort: 8080
    serviceAddress: 127.0.0.1
    tags: {kuma.io/service: web}
    serviceProbe:
      interval: 2s
      timeout: 1s
      healthyThreshold: 1
      unhealthyThreshold: 2
      tcp: {}
  - port: 10002
    tags: {kuma.io/service: admin}
  outbound:
  - port: 33033
    tags: {kuma.io/service: db}
  transparentProxying: {redirectPortInbound: 15006}
"#;

    /// A YAML file that must parse.
    pub(in crate::dataplane) fn yaml(text: &str) -> ParsedFile {
        parse_file(text, Format::Yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_kuma_dataplane() {
        let dps = parse_documents(WEB).unwrap();
        assert_eq!(dps.len(), 1);
        let dp = &dps[0];
        assert_eq!(dp.id.to_string(), "default.web-01");
        assert_eq!(dp.inbounds.len(), 2);
        let a = &dp.inbounds[0];
        assert_eq!((a.port, a.service_port), (10001, 8080));
        assert_eq!(a.service_address.to_string(), "127.0.0.1");
        assert_eq!(
            a.probe.as_ref().unwrap().interval,
            Some(Duration::from_secs(2))
        );
        let b = &dp.inbounds[1];
        assert_eq!(b.service_port, 10002, "servicePort defaults to port");
        assert_eq!(
            b.service_address.to_string(),
            "192.168.0.10",
            "serviceAddress defaults to networking.address"
        );
        assert!(b.probe.is_none());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = WEB.replace("    tags: {kuma.io/service: admin}", "    tagz: {a: b}");
        let e = parse_documents(&text).unwrap_err();
        assert!(e.message.contains("unknown field `tagz`"), "{e}");
        // The parser points at the mapping that holds the key; the message names the path.
        assert_eq!(e.line, Some(21), "{e}");
        assert!(e.message.contains("networking.inbound[1]"), "{e}");
    }

    #[test]
    fn hostname_is_rejected_with_line() {
        let text = WEB.replace("serviceAddress: 127.0.0.1", "serviceAddress: localhost");
        let e = parse_documents(&text).unwrap_err();
        assert!(
            e.message.contains("\"localhost\" is not an IP literal"),
            "{e}"
        );
        assert_eq!(e.line, Some(10), "the inbound's line");
        assert!(e.message.contains("networking.inbound[0]:"), "{e}");
    }

    #[test]
    fn ipv6_is_accepted() {
        let text = WEB.replace("serviceAddress: 127.0.0.1", "serviceAddress: \"::1\"");
        let dps = parse_documents(&text).unwrap();
        assert_eq!(dps[0].inbounds[0].service_address.to_string(), "::1");
    }

    #[test]
    fn semantic_errors() {
        for (from, to, expect) in [
            (
                "mesh: default",
                "mesh: Default",
                "a mesh is lowercase letters",
            ),
            (
                "name: web-01",
                "name: Web_01",
                "a dataplane name is lowercase letters",
            ),
            ("mesh: default", "mesh: a.b", "no dot"),
            ("name: web-01", "name: \"\"", "name must not be empty"),
            ("type: Dataplane", "type: \"\"", "`type` is empty"),
            (
                "port: 10002",
                "port: 10001",
                "each inbound needs its own port",
            ),
            ("port: 10002", "port: 70000", "port 70000 is out of range"),
        ] {
            let e = parse_documents(&WEB.replace(from, to)).unwrap_err();
            assert!(e.message.contains(expect), "{from} -> {to}: {e}");
        }
        let twice = format!("{WEB}\n---\n{WEB}");
        assert!(parse_documents(&twice)
            .unwrap_err()
            .message
            .contains("defined twice"));
    }

    const PROBES: &str = r#"
type: Dataplane
mesh: default
name: web-01
networking:
  address: 127.0.0.1
  admin: {port: 9901}
  inbound:
  - port: 10001
    servicePort: 8080
    serviceProbe:
      http:
        path: /healthz
        host: web.internal
        expectedStatuses: [200, "300-302", "204"]
        headers: {X-Probe: hdsd}
        http2: true
      port: 8081
      address: 127.0.0.2
  - port: 10002
    serviceProbe:
      grpc: {service: shop.Cart, authority: cart.internal}
  - port: 10003
    serviceProbe:
      tcp: {send: "PING\r\n", receive: ["PONG"]}
  - port: 10004
    serviceProbe:
      tcp: {sendHex: "50494e47", receiveHex: ["504f4e47", "0d0a"]}
  - port: 10005
    serviceProbe: {interval: 3s}
"#;

    #[test]
    fn parses_probe_kinds_port_address_and_admin() {
        let dp = parse_documents(PROBES).unwrap().remove(0);
        assert_eq!(dp.admin_port, Some(9901));
        let probe = |i: usize| dp.inbounds[i].probe.clone().unwrap();
        let web = probe(0);
        assert_eq!(web.port, Some(8081));
        assert_eq!(web.address, Some("127.0.0.2".parse().unwrap()));
        let mut headers = BTreeMap::new();
        headers.insert("X-Probe".to_string(), "hdsd".to_string());
        assert_eq!(
            web.check,
            Some(Check::Http(HttpCheck {
                path: "/healthz".into(),
                host: Some("web.internal".into()),
                expected_statuses: vec![
                    StatusRange {
                        start: 200,
                        end: 200
                    },
                    StatusRange {
                        start: 300,
                        end: 302
                    },
                    StatusRange {
                        start: 204,
                        end: 204
                    },
                ],
                headers,
                http2: true,
                tls: None,
            }))
        );
        assert_eq!(
            probe(1).check,
            Some(Check::Grpc(GrpcCheck {
                service: Some("shop.Cart".into()),
                authority: Some("cart.internal".into()),
                tls: None,
            }))
        );
        assert_eq!(
            probe(2).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Text("PING\r\n".into())),
                receive: vec![Payload::Text("PONG".into())],
                tls: None,
            }))
        );
        assert_eq!(
            probe(3).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Hex("50494e47".into())),
                receive: vec![Payload::Hex("504f4e47".into()), Payload::Hex("0d0a".into())],
                tls: None,
            }))
        );
        let timing = probe(4);
        assert_eq!(
            (timing.check, timing.port, timing.address),
            (None, None, None)
        );
        // Kuma's `tcp: {}` is a connect-only TCP check.
        let kuma = parse_documents(WEB).unwrap().remove(0);
        assert_eq!(
            kuma.inbounds[0].probe.as_ref().unwrap().check,
            Some(Check::default())
        );
        assert_eq!(kuma.admin_port, None);
    }

    #[test]
    fn probe_shape_errors() {
        for (from, to, expect) in [
            (
                "      grpc: {service: shop.Cart, authority: cart.internal}",
                "      grpc: {service: shop.Cart}\n      tcp: {}",
                "default.web-01: networking.inbound[1].serviceProbe: set exactly one of http, grpc, tcp (found grpc and tcp)",
            ),
            (
                "{send: \"PING\\r\\n\", receive",
                "{send: \"PING\", sendHex: \"50\", receive",
                "networking.inbound[2].serviceProbe: tcp: set send or sendHex, not both",
            ),
            (
                "receiveHex: [",
                "receive: [\"a\"], receiveHex: [",
                "networking.inbound[3].serviceProbe: tcp: set receive or receiveHex, not both",
            ),
            (
                "\"300-302\"",
                "\"3xx\"",
                "networking.inbound[0].serviceProbe: http.expectedStatuses: \"3xx\" is neither a status (200) nor a range (\"200-299\")",
            ),
            ("port: 8081", "port: 0", "port 0 is out of range; use 1-65535"),
            (
                "address: 127.0.0.2",
                "address: web.local",
                "\"web.local\" is not an IP literal",
            ),
            ("admin: {port: 9901}", "admin: {port: 99999}", "port 99999 is out of range"),
            ("        http2: true", "        http3: true", "unknown field `http3`"),
            ("        path: /healthz\n", "", "missing field `path`"),
        ] {
            assert!(PROBES.contains(from), "{from}");
            let e = parse_documents(&PROBES.replace(from, to)).unwrap_err();
            assert!(e.message.contains(expect), "{from} -> {to}: {e}");
        }
    }

    const TLS_PROBES: &str = r#"
type: Dataplane
mesh: default
name: web-01
networking:
  address: 127.0.0.1
  inbound:
  - port: 10001
    servicePort: 8443
    serviceProbe:
      http:
        path: /healthz
        tls:
          sni: web.internal
          caFile: /etc/envoy/web-ca.pem
          clientCertFile: /etc/envoy/probe.pem
          clientKeyFile: /etc/envoy/probe.key
          alpn: [http/1.1]
  - port: 10002
    serviceProbe:
      grpc: {tls: {insecureSkipVerify: true}}
  - port: 10003
    serviceProbe:
      tcp: {send: "PING", receive: ["PONG"], tls: {enabled: false, caFile: /ca.pem}}
"#;

    #[test]
    fn parses_tls_blocks() {
        let dp = parse_documents(TLS_PROBES).unwrap().remove(0);
        let tls = |i: usize| {
            dp.inbounds[i]
                .probe
                .as_ref()
                .and_then(|p| p.check.as_ref())
                .and_then(|c| c.tls())
                .cloned()
                .unwrap()
        };
        assert_eq!(
            tls(0),
            Tls {
                enabled: true,
                sni: Some("web.internal".into()),
                ca_file: Some("/etc/envoy/web-ca.pem".into()),
                insecure_skip_verify: false,
                client_cert_file: Some("/etc/envoy/probe.pem".into()),
                client_key_file: Some("/etc/envoy/probe.key".into()),
                alpn: vec!["http/1.1".into()],
            }
        );
        assert_eq!(
            tls(1),
            Tls {
                ca_file: None,
                insecure_skip_verify: true,
                ..Tls::with_ca("")
            }
        );
        assert!(!tls(2).enabled);
        // Skipping verification takes a boolean, not a word that reads as one.
        for (from, to, expect) in [
            (
                "insecureSkipVerify: true",
                "insecureSkipVerify: \"yes\"",
                "expected a boolean",
            ),
            (
                "insecureSkipVerify: true",
                "insecureSkipVerify: 1",
                "expected a boolean",
            ),
            (
                "          sni:",
                "          serverName:",
                "unknown field `serverName`",
            ),
        ] {
            assert!(TLS_PROBES.contains(from), "{from}");
            let e = parse_documents(&TLS_PROBES.replace(from, to)).unwrap_err();
            assert!(e.message.contains(expect), "{from} -> {to}: {e}");
        }
    }

    const GATEWAY: &str = include_str!("../../testdata/kuma/gateway.yaml");
    const ZONE_PROXY: &str = include_str!("../../testdata/kuma/zone-proxy.yaml");
    const INBOUND_FIELDS: &str = include_str!("../../testdata/kuma/inbound-fields.yaml");

    #[test]
    fn gateways_have_no_inbounds_and_say_so() {
        let parsed = yaml(GATEWAY);
        let [builtin, delegated] = &parsed.dataplanes[..] else {
            panic!("{parsed:?}")
        };
        assert_eq!(builtin.gateway, Some(GatewayType::Builtin));
        assert_eq!(
            delegated.gateway,
            Some(GatewayType::Delegated),
            "the default"
        );
        for dp in [builtin, delegated] {
            assert_eq!(dp.kind(), DataplaneKind::Gateway);
            assert!(dp.inbounds.is_empty());
        }
    }

    #[test]
    fn zone_proxy_listeners() {
        let dp = yaml(ZONE_PROXY).dataplanes.remove(0);
        assert_eq!(dp.kind(), DataplaneKind::ZoneProxy);
        assert!(dp.inbounds.is_empty());
        assert_eq!(
            dp.listeners,
            [
                Listener {
                    kind: "ZoneIngress".into(),
                    port: 10001,
                    name: Some("zone-ingress-port".into())
                },
                Listener {
                    kind: "ZoneEgress".into(),
                    port: 10002,
                    name: Some("zone-egress-port".into())
                },
            ]
        );
        let typo = ZONE_PROXY.replace("    port: 10002", "    prot: 10002");
        let e = parse_file(&typo, Format::Yaml).unwrap_err();
        assert!(e.message.contains("unknown field `prot`"), "{e}");
        assert!(e.message.contains("networking.listeners[1]"), "{e}");
    }

    #[test]
    fn inbound_name_state_protocol_and_the_new_fields() {
        let dp = yaml(INBOUND_FIELDS).dataplanes.remove(0);
        assert_eq!(dp.kind(), DataplaneKind::Sidecar);
        let got: Vec<(Option<&str>, InboundState)> = dp
            .inbounds
            .iter()
            .map(|i| (i.name.as_deref(), i.state))
            .collect();
        assert_eq!(
            got,
            [
                (Some("http-port"), InboundState::Ready),
                (Some("draining"), InboundState::NotReady),
                (Some("metrics"), InboundState::Ignored),
            ]
        );
    }

    #[test]
    fn proto_names_and_enum_numbers_are_accepted_as_kuma_does() {
        let text = INBOUND_FIELDS
            .replace("redirectPortInbound:", "redirect_port_inbound:")
            .replace("ipFamilyMode: IPv4", "ip_family_mode: 2")
            .replace("state: NotReady", "state: 1");
        let dp = yaml(&text).dataplanes.remove(0);
        assert_eq!(dp.inbounds[1].state, InboundState::NotReady);
        let bad = INBOUND_FIELDS.replace("state: NotReady", "state: Draining");
        let e = parse_file(&bad, Format::Yaml).unwrap_err();
        assert!(
            e.message
                .contains("state \"Draining\" is not one of Ready, NotReady, Ignored"),
            "{e}"
        );
        assert!(e.message.contains("networking.inbound[1]"), "{e}");
    }

    #[test]
    fn typos_inside_the_new_blocks_are_errors() {
        for (from, to, key) in [
            (
                "      name: backend\n      port: 80",
                "      name: backend\n      prt: 80",
                "prt",
            ),
            (
                "    reachableBackends:",
                "    reachableBackend:",
                "reachableBackend",
            ),
            ("kri: kri_", "kir: kri_", "kir"),
            ("    port: 9901", "    prt: 9901", "prt"),
        ] {
            let text = INBOUND_FIELDS.replacen(from, to, 1);
            assert_ne!(text, INBOUND_FIELDS, "{from}");
            let e = parse_file(&text, Format::Yaml).unwrap_err();
            assert!(
                e.message.contains(&format!("unknown field `{key}`")),
                "{key}: {e}"
            );
            assert!(e.line.is_some(), "{key}: {e}");
        }
    }
}
