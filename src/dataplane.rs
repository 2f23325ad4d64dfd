//! Dataplanes: Kuma's universal `Dataplane` resource, parsed from YAML.
//!
//! Fields Kuma defines but hdsd does not use are accepted and ignored; any
//! other key is an error that names the key and its line. Addresses must be
//! IP literals: Envoy may crash on a hostname in an HDS endpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize};

use crate::probe::{
    one_kind, Check, GrpcCheck, HttpCheck, Payload, ProbeSettings, StatusRange, TcpCheck,
};

/// `<mesh>.<name>`: the identity of a dataplane, and Envoy's `node.id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DataplaneId {
    pub mesh: String,
    pub name: String,
}

impl DataplaneId {
    pub fn new(mesh: impl Into<String>, name: impl Into<String>) -> Self {
        DataplaneId {
            mesh: mesh.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for DataplaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.mesh, self.name)
    }
}

/// A node id that is not `<mesh>.<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node id {0:?} is not of the form <mesh>.<name> (e.g. default.web-01); set node.id in the Envoy bootstrap")]
pub struct BadNodeId(pub String);

impl FromStr for DataplaneId {
    type Err = BadNodeId;

    /// Splits on the first dot (Kuma's convention: the name may contain dots).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('.') {
            Some((mesh, name)) if valid_mesh(mesh).is_ok() && !name.is_empty() => {
                Ok(DataplaneId::new(mesh, name))
            }
            _ => Err(BadNodeId(s.to_string())),
        }
    }
}

fn valid_mesh(mesh: &str) -> Result<(), String> {
    if mesh.is_empty() {
        return Err("mesh must not be empty".into());
    }
    if let Some(c) = mesh
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "mesh {mesh:?} contains {c:?}; use lowercase letters, digits and '-' only (no dot: the node id is <mesh>.<name>)"
        ));
    }
    Ok(())
}

/// One Envoy and the inbounds (application ports) it fronts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplane {
    pub id: DataplaneId,
    pub address: IpAddr,
    pub inbounds: Vec<Inbound>,
    /// `networking.admin.port`: the Envoy's admin port on its loopback.
    pub admin_port: Option<u16>,
}

/// One application port behind the dataplane's Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// Envoy's public port for this inbound.
    pub port: u16,
    /// The inbound's own address (defaults to `networking.address`).
    pub address: IpAddr,
    /// Where the application listens: the probe target.
    pub service_address: IpAddr,
    pub service_port: u16,
    pub tags: BTreeMap<String, String>,
    /// Per-inbound overrides of the check defaults, from `serviceProbe`.
    pub probe: Option<ProbeOverrides>,
}

/// The fields of `serviceProbe`; unset fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ProbeOverrides {
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub no_traffic_interval: Option<Duration>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
    /// `http:`, `grpc:` or `tcp:`; unset: the server's default check (`hds.check.kind`).
    pub check: Option<Check>,
    /// Probe this port instead of `servicePort`.
    pub port: Option<u16>,
    /// Probe this address instead of `serviceAddress`.
    pub address: Option<IpAddr>,
}

impl ProbeOverrides {
    /// The effective settings: overrides on top of `defaults`. A `serviceProbe`
    /// that sets `interval` but not `noTrafficInterval` gets its own interval
    /// as the no-traffic interval.
    pub fn apply(&self, defaults: &ProbeSettings) -> ProbeSettings {
        let interval = self.interval.unwrap_or(defaults.interval);
        ProbeSettings {
            interval,
            timeout: self.timeout.unwrap_or(defaults.timeout),
            no_traffic_interval: self.no_traffic_interval.unwrap_or(match self.interval {
                Some(i) => i,
                None => defaults.no_traffic_interval,
            }),
            healthy_threshold: self.healthy_threshold.unwrap_or(defaults.healthy_threshold),
            unhealthy_threshold: self
                .unhealthy_threshold
                .unwrap_or(defaults.unhealthy_threshold),
        }
    }
}

/// Why a document could not be turned into a dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line, when the YAML parser knows it.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Parses every `---`-separated document of one file. Empty documents are skipped.
pub fn parse_documents(text: &str) -> Result<Vec<Dataplane>, ParseError> {
    let mut out: Vec<Dataplane> = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let doc = match Option::<DataplaneDoc>::deserialize(document) {
            Ok(Some(doc)) => doc,
            Ok(None) => continue,
            Err(e) => {
                return Err(ParseError {
                    line: e.location().map(|l| l.line()),
                    message: format!("document {}: {}", index + 1, strip_location(&e.to_string())),
                })
            }
        };
        let dataplane = doc.into_dataplane().map_err(|message| ParseError {
            line: None,
            message: format!("document {}: {message}", index + 1),
        })?;
        if out.iter().any(|d| d.id == dataplane.id) {
            return Err(ParseError {
                line: None,
                message: format!(
                    "document {}: dataplane {} is defined twice in this file; remove one of the documents",
                    index + 1,
                    dataplane.id
                ),
            });
        }
        out.push(dataplane);
    }
    Ok(out)
}

fn strip_location(s: &str) -> &str {
    match s.rfind(" at line ") {
        Some(i) => &s[..i],
        None => s,
    }
}

// ---- the YAML shape (Kuma's field names) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct DataplaneDoc {
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
    #[serde(default)]
    metrics: Option<IgnoredAny>,
    #[serde(default)]
    probes: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct NetworkingDoc {
    address: IpLiteral,
    #[serde(default)]
    inbound: Vec<InboundDoc>,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    advertised_address: Option<IgnoredAny>,
    #[serde(default)]
    outbound: Option<IgnoredAny>,
    #[serde(default)]
    gateway: Option<IgnoredAny>,
    #[serde(default)]
    transparent_proxying: Option<IgnoredAny>,
    #[serde(default)]
    admin: Option<AdminDoc>,
}

/// `networking.admin`: where the Envoy's admin listens (on its loopback).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminDoc {
    #[serde(default)]
    port: Option<Port>,
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
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    name: Option<IgnoredAny>,
    #[serde(default)]
    health: Option<IgnoredAny>,
    #[serde(default)]
    state: Option<IgnoredAny>,
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
        Ok(TcpCheck { send, receive })
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
            }))
        } else if let Some(grpc) = self.grpc {
            Some(Check::Grpc(GrpcCheck {
                service: grpc.service,
                authority: grpc.authority,
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

impl DataplaneDoc {
    fn into_dataplane(self) -> Result<Dataplane, String> {
        if self.kind != "Dataplane" {
            return Err(format!(
                "type is {:?}; only `type: Dataplane` documents belong in the dataplanes directory",
                self.kind
            ));
        }
        valid_mesh(&self.mesh)?;
        if self.name.is_empty() {
            return Err("name must not be empty".into());
        }
        let id = DataplaneId::new(self.mesh, self.name);
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
            });
        }
        Ok(Dataplane {
            id,
            address,
            inbounds,
            admin_port: self.networking.admin.and_then(|a| a.port).map(|p| p.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = r#"
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
    fn several_documents_and_empty_ones() {
        let text = format!("{WEB}\n---\n---\n{}", WEB.replace("web-01", "web-02"));
        let dps = parse_documents(&text).unwrap();
        assert_eq!(dps.len(), 2);
        assert_eq!(dps[1].id.name, "web-02");
        assert!(parse_documents("").unwrap().is_empty());
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
            ("mesh: default", "mesh: Default", "use lowercase letters"),
            ("mesh: default", "mesh: a.b", "no dot"),
            ("name: web-01", "name: \"\"", "name must not be empty"),
            ("type: Dataplane", "type: Mesh", "only `type: Dataplane`"),
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
            }))
        );
        assert_eq!(
            probe(1).check,
            Some(Check::Grpc(GrpcCheck {
                service: Some("shop.Cart".into()),
                authority: Some("cart.internal".into()),
            }))
        );
        assert_eq!(
            probe(2).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Text("PING\r\n".into())),
                receive: vec![Payload::Text("PONG".into())],
            }))
        );
        assert_eq!(
            probe(3).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Hex("50494e47".into())),
                receive: vec![Payload::Hex("504f4e47".into()), Payload::Hex("0d0a".into())],
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

    #[test]
    fn node_id_splits_on_first_dot() {
        let id: DataplaneId = "default.web.eu-1".parse().unwrap();
        assert_eq!(
            (id.mesh.as_str(), id.name.as_str()),
            ("default", "web.eu-1")
        );
        for bad in ["", "default", "default.", ".web", "Def.web"] {
            assert!(bad.parse::<DataplaneId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn overrides_apply_on_defaults() {
        let d = ProbeSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(3),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        };
        assert_eq!(ProbeOverrides::default().apply(&d), d);
        let o = ProbeOverrides {
            interval: Some(Duration::from_secs(5)),
            unhealthy_threshold: Some(4),
            ..Default::default()
        };
        let s = o.apply(&d);
        assert_eq!(s.no_traffic_interval, Duration::from_secs(5));
        assert_eq!(s.unhealthy_threshold, 4);
        assert_eq!(s.timeout, Duration::from_secs(1));
    }
}
