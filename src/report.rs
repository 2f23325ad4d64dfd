//! A health report as Envoy sent it: an `EndpointHealthResponse` checked
//! once when it arrives, then read in place.
//!
//! Decoding a report into envoy-types' messages allocates a vector per list
//! and a string per cluster name and address (about a dozen allocations for
//! a dataplane of two inbounds), only for the fold to read four things of
//! each endpoint and drop the rest. A [`Report`] keeps the message's bytes
//! (a slice of the stream's buffer, no copy) and walks them when folded:
//! no allocation per report.
//!
//! The walk reads exactly what prost would decode for the fields the fold
//! uses (the same field numbers, wire types, last-value-wins and
//! message-merge rules, UTF-8 for the strings it reads), and skips the
//! others without decoding them. The unit tests check it against prost on
//! the same bytes; the `report_fold` fuzz target does so on arbitrary ones.

use std::net::{IpAddr, SocketAddr};

use envoy_types::pb::envoy::service::health::v3::EndpointHealthResponse;
use prost::bytes::{Buf, Bytes};
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::Message;

/// Why a report's bytes are not an `EndpointHealthResponse`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("malformed EndpointHealthResponse: {0}")]
    Wire(#[from] prost::DecodeError),
    #[error(
        "malformed EndpointHealthResponse: {field} has wire type {actual:?}, not {expected:?}"
    )]
    WireType {
        field: &'static str,
        expected: WireType,
        actual: WireType,
    },
    #[error("malformed EndpointHealthResponse: {0} is longer than the message holding it")]
    Truncated(&'static str),
    #[error("malformed EndpointHealthResponse: {0} is not UTF-8")]
    NotUtf8(&'static str),
}

/// One endpoint of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported<'a> {
    /// The cluster it was reported under; `None` in the deprecated flat
    /// `endpoints_health` list, which names no cluster.
    pub cluster: Option<&'a str>,
    /// Its socket address's IP text and port number, as sent, when its
    /// address is a socket address with a port number: parsed only by
    /// [`Reported::endpoint`], so that checking a report parses nothing.
    pub address: Option<(&'a str, u32)>,
    /// Envoy's `HealthStatus`, as sent.
    pub status: i32,
}

impl Reported<'_> {
    /// Its IP and port, when its address is an IP socket address with a
    /// port number that fits one.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        let (ip, port) = self.address?;
        Some(SocketAddr::new(
            ip.parse::<IpAddr>().ok()?,
            u16::try_from(port).ok()?,
        ))
    }
}

/// An `EndpointHealthResponse`, checked and kept as its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Report {
    bytes: Bytes,
    /// Endpoints in both lists (what the stream's limit counts).
    endpoints: usize,
    /// Any `cluster_endpoints_health` (even empty ones): the fold then reads
    /// that list only, as it reads prost's `cluster_endpoints_health` when
    /// it is not empty.
    grouped: bool,
}

impl Default for Report {
    /// A report of nothing.
    fn default() -> Report {
        Report {
            bytes: Bytes::new(),
            endpoints: 0,
            grouped: false,
        }
    }
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.endpoints()).finish()
    }
}

impl Report {
    /// Checks `bytes` (an encoded `EndpointHealthResponse`) and keeps them.
    pub fn decode(bytes: Bytes) -> Result<Report, ReportError> {
        let mut endpoints = 0;
        let grouped = walk(&bytes, |_| endpoints += 1)?;
        Ok(Report {
            bytes,
            endpoints,
            grouped,
        })
    }

    /// How many endpoints the report carries, in both lists.
    pub fn len(&self) -> usize {
        self.endpoints
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints == 0
    }

    /// The endpoints the fold reads, in report order: those of
    /// `cluster_endpoints_health`, or when there is none, those of the
    /// deprecated flat `endpoints_health`.
    pub fn endpoints(&self) -> Vec<Reported<'_>> {
        let mut all = Vec::new();
        self.for_each(|e| all.push(e));
        all
    }

    /// Calls `visit` with each endpoint [`Report::endpoints`] yields,
    /// without collecting them: the fold's way, no allocation.
    pub fn for_each<'a>(&'a self, mut visit: impl FnMut(Reported<'a>)) {
        let grouped = self.grouped;
        // Checked at decode: the walk cannot fail again.
        let _ = walk(&self.bytes, |e| {
            if e.cluster.is_some() == grouped {
                visit(e)
            }
        });
    }

    /// The bytes as received.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }
}

impl From<&EndpointHealthResponse> for Report {
    /// The report as Envoy would send `message` (tests, the API's examples).
    fn from(message: &EndpointHealthResponse) -> Report {
        let bytes = Bytes::from(message.encode_to_vec());
        // What prost encodes always decodes: its strings are UTF-8, its
        // lengths right.
        match Report::decode(bytes) {
            Ok(report) => report,
            Err(e) => unreachable!("prost's encoding of a report did not decode: {e}"),
        }
    }
}

impl From<EndpointHealthResponse> for Report {
    fn from(message: EndpointHealthResponse) -> Report {
        Report::from(&message)
    }
}

/// `EndpointHealthResponse`'s fields.
const ENDPOINTS_HEALTH: u32 = 1;
const CLUSTER_ENDPOINTS_HEALTH: u32 = 2;
/// `ClusterEndpointsHealth`'s.
const CLUSTER_NAME: u32 = 1;
const LOCALITY_ENDPOINTS_HEALTH: u32 = 2;
/// `LocalityEndpointsHealth`'s (its `locality`, 1, is not read).
const LOCALITY_ENDPOINTS: u32 = 2;
/// `EndpointHealth`'s.
const ENDPOINT: u32 = 1;
const HEALTH_STATUS: u32 = 2;
/// `config.endpoint.v3.Endpoint`'s.
const ENDPOINT_ADDRESS: u32 = 1;
/// `config.core.v3.Address`'s oneof: `socket_address`, `pipe`, `envoy_internal_address`.
const SOCKET_ADDRESS: u32 = 1;
const PIPE: u32 = 2;
const INTERNAL_ADDRESS: u32 = 3;
/// `config.core.v3.SocketAddress`'s: `address`, and the `port_specifier`
/// oneof (`port_value`, `named_port`).
const SOCKET_ADDRESS_ADDRESS: u32 = 2;
const PORT_VALUE: u32 = 3;
const NAMED_PORT: u32 = 4;

/// Visits every endpoint of both lists (a flat one with `cluster: None`) in
/// wire order; returns whether any `cluster_endpoints_health` was present.
///
/// prost appends repeated fields and merges a singular message field that
/// occurs twice; a cluster name occurring twice keeps the last. So a
/// cluster's name is known only at its end: its endpoints are visited then.
fn walk<'a>(message: &'a [u8], mut visit: impl FnMut(Reported<'a>)) -> Result<bool, ReportError> {
    let mut grouped = false;
    let mut buf = message;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            ENDPOINTS_HEALTH => {
                let eh = nested(&mut buf, wire_type, "endpoints_health")?;
                visit(endpoint_health(eh)?);
            }
            CLUSTER_ENDPOINTS_HEALTH => {
                grouped = true;
                let cluster = nested(&mut buf, wire_type, "cluster_endpoints_health")?;
                let name = cluster_name(cluster)?;
                each_endpoint_health(cluster, |eh| {
                    visit(Reported {
                        cluster: Some(name),
                        ..endpoint_health(eh)?
                    });
                    Ok(())
                })?;
            }
            _ => skip(&mut buf, wire_type, tag)?,
        }
    }
    Ok(grouped)
}

/// A `ClusterEndpointsHealth`'s name (the last one, as prost keeps).
fn cluster_name(mut buf: &[u8]) -> Result<&str, ReportError> {
    let mut name = "";
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            CLUSTER_NAME => name = string(&mut buf, wire_type, "cluster_name")?,
            _ => skip(&mut buf, wire_type, tag)?,
        }
    }
    Ok(name)
}

/// Calls `each` with every `EndpointHealth` of a `ClusterEndpointsHealth`.
fn each_endpoint_health<'a>(
    mut buf: &'a [u8],
    mut each: impl FnMut(&'a [u8]) -> Result<(), ReportError>,
) -> Result<(), ReportError> {
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag != LOCALITY_ENDPOINTS_HEALTH {
            skip(&mut buf, wire_type, tag)?;
            continue;
        }
        let mut locality = nested(&mut buf, wire_type, "locality_endpoints_health")?;
        while locality.has_remaining() {
            let (tag, wire_type) = decode_key(&mut locality)?;
            if tag == LOCALITY_ENDPOINTS {
                each(nested(&mut locality, wire_type, "endpoints_health")?)?;
            } else {
                skip(&mut locality, wire_type, tag)?;
            }
        }
    }
    Ok(())
}

/// The parts of a `SocketAddress` read so far (prost's merge: each field
/// keeps its last value).
#[derive(Default)]
struct Address<'a> {
    /// Which variant of `Address.address` came last.
    variant: Option<u32>,
    ip: &'a str,
    /// The `port_specifier` oneof: `Some(Some(port))` for a port number,
    /// `Some(None)` for a named port.
    port: Option<Option<u32>>,
}

/// An `EndpointHealth`: its socket address and status (no cluster).
fn endpoint_health(mut buf: &[u8]) -> Result<Reported<'_>, ReportError> {
    let mut address = Address::default();
    let mut status = 0;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            ENDPOINT => {
                let mut endpoint = nested(&mut buf, wire_type, "endpoint")?;
                while endpoint.has_remaining() {
                    let (tag, wire_type) = decode_key(&mut endpoint)?;
                    if tag == ENDPOINT_ADDRESS {
                        let a = nested(&mut endpoint, wire_type, "endpoint.address")?;
                        read_address(a, &mut address)?;
                    } else {
                        skip(&mut endpoint, wire_type, tag)?;
                    }
                }
            }
            HEALTH_STATUS => {
                check(wire_type, WireType::Varint, "health_status")?;
                // As prost reads an enum: the varint's low 32 bits.
                status = decode_varint(&mut buf)? as i32;
            }
            _ => skip(&mut buf, wire_type, tag)?,
        }
    }
    let address = match address {
        Address {
            variant: Some(SOCKET_ADDRESS),
            ip,
            port: Some(Some(port)),
        } => Some((ip, port)),
        _ => None,
    };
    Ok(Reported {
        cluster: None,
        address,
        status,
    })
}

/// Merges one `Address` message into `address`.
fn read_address<'a>(mut buf: &'a [u8], address: &mut Address<'a>) -> Result<(), ReportError> {
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            SOCKET_ADDRESS => {
                let mut sa = nested(&mut buf, wire_type, "socket_address")?;
                // Another variant before it is replaced, the same one merged.
                if address.variant != Some(SOCKET_ADDRESS) {
                    *address = Address {
                        variant: Some(SOCKET_ADDRESS),
                        ..Address::default()
                    };
                }
                while sa.has_remaining() {
                    let (tag, wire_type) = decode_key(&mut sa)?;
                    match tag {
                        SOCKET_ADDRESS_ADDRESS => {
                            address.ip = string(&mut sa, wire_type, "socket_address.address")?
                        }
                        PORT_VALUE => {
                            check(wire_type, WireType::Varint, "port_value")?;
                            address.port = Some(Some(decode_varint(&mut sa)? as u32));
                        }
                        NAMED_PORT => {
                            string(&mut sa, wire_type, "named_port")?;
                            address.port = Some(None);
                        }
                        _ => skip(&mut sa, wire_type, tag)?,
                    }
                }
            }
            PIPE | INTERNAL_ADDRESS => {
                nested(&mut buf, wire_type, "address")?;
                address.variant = Some(tag);
            }
            _ => skip(&mut buf, wire_type, tag)?,
        }
    }
    Ok(())
}

fn check(actual: WireType, expected: WireType, field: &'static str) -> Result<(), ReportError> {
    if actual == expected {
        Ok(())
    } else {
        Err(ReportError::WireType {
            field,
            expected,
            actual,
        })
    }
}

/// A length-delimited field's bytes; `buf` moves past them.
fn nested<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    field: &'static str,
) -> Result<&'a [u8], ReportError> {
    check(wire_type, WireType::LengthDelimited, field)?;
    let len = decode_varint(buf)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= buf.len())
        .ok_or(ReportError::Truncated(field))?;
    let (field_bytes, rest) = buf.split_at(len);
    *buf = rest;
    Ok(field_bytes)
}

fn string<'a>(
    buf: &mut &'a [u8],
    wire_type: WireType,
    field: &'static str,
) -> Result<&'a str, ReportError> {
    std::str::from_utf8(nested(buf, wire_type, field)?).map_err(|_| ReportError::NotUtf8(field))
}

fn skip(buf: &mut &[u8], wire_type: WireType, tag: u32) -> Result<(), ReportError> {
    Ok(skip_field(wire_type, tag, buf, DecodeContext::default())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{
        address, socket_address, Address as PbAddress, HealthStatus, Locality, Pipe, SocketAddress,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, LocalityEndpointsHealth,
    };

    fn socket(ip: &str, port: u32) -> Option<Endpoint> {
        Some(Endpoint {
            address: Some(PbAddress {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: ip.into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                    ..Default::default()
                })),
            }),
            hostname: "skipped".into(),
            ..Default::default()
        })
    }

    fn health(endpoint: Option<Endpoint>, status: HealthStatus) -> EndpointHealth {
        EndpointHealth {
            endpoint,
            health_status: status as i32,
            ..Default::default()
        }
    }

    /// What the fold read from prost's decoding of the same bytes.
    fn with_prost(bytes: &[u8]) -> Vec<(Option<String>, Option<SocketAddr>, i32)> {
        let m = EndpointHealthResponse::decode(bytes).unwrap();
        let addr = |e: &EndpointHealth| {
            e.endpoint
                .as_ref()
                .and_then(crate::specifier::endpoint_addr)
        };
        if !m.cluster_endpoints_health.is_empty() {
            m.cluster_endpoints_health
                .iter()
                .flat_map(|c| {
                    c.locality_endpoints_health
                        .iter()
                        .flat_map(|l| &l.endpoints_health)
                        .map(|e| (Some(c.cluster_name.clone()), addr(e), e.health_status))
                })
                .collect()
        } else {
            #[allow(deprecated)]
            m.endpoints_health
                .iter()
                .map(|e| (None, addr(e), e.health_status))
                .collect()
        }
    }

    fn lean(bytes: &[u8]) -> Vec<(Option<String>, Option<SocketAddr>, i32)> {
        let report = Report::decode(Bytes::copy_from_slice(bytes)).unwrap();
        let mut seen = Vec::new();
        report.for_each(|e| seen.push((e.cluster.map(str::to_owned), e.endpoint(), e.status)));
        let collected: Vec<_> = report
            .endpoints()
            .into_iter()
            .map(|e| (e.cluster.map(str::to_owned), e.endpoint(), e.status))
            .collect();
        assert_eq!(seen, collected, "for_each and endpoints agree");
        seen
    }

    #[test]
    fn reads_what_prost_reads() {
        #[allow(deprecated)]
        let message = EndpointHealthResponse {
            cluster_endpoints_health: vec![
                ClusterEndpointsHealth {
                    cluster_name: "web-8080".into(),
                    locality_endpoints_health: vec![LocalityEndpointsHealth {
                        locality: Some(Locality {
                            region: "r".into(),
                            ..Default::default()
                        }),
                        endpoints_health: vec![
                            health(socket("10.0.0.1", 8080), HealthStatus::Healthy),
                            health(socket("::1", 9090), HealthStatus::Unhealthy),
                        ],
                    }],
                },
                ClusterEndpointsHealth {
                    cluster_name: "".into(),
                    locality_endpoints_health: vec![
                        LocalityEndpointsHealth::default(),
                        LocalityEndpointsHealth {
                            locality: None,
                            endpoints_health: vec![
                                health(socket("not-an-ip", 1), HealthStatus::Healthy),
                                health(socket("10.0.0.2", 70000), HealthStatus::Healthy),
                                health(None, HealthStatus::Degraded),
                            ],
                        },
                    ],
                },
            ],
            // Ignored while the grouped list has entries, but counted.
            endpoints_health: vec![health(socket("10.0.0.9", 1), HealthStatus::Healthy)],
        };
        let bytes = message.encode_to_vec();
        assert_eq!(lean(&bytes), with_prost(&bytes));
        let report = Report::from(&message);
        assert_eq!(report.len(), 6);
        assert_eq!(report.endpoints().len(), 5);
        assert_eq!(
            report.endpoints()[0],
            Reported {
                cluster: Some("web-8080"),
                address: Some(("10.0.0.1", 8080)),
                status: HealthStatus::Healthy as i32
            }
        );
    }

    #[test]
    fn the_flat_list_counts_only_without_clusters() {
        #[allow(deprecated)]
        let flat = EndpointHealthResponse {
            endpoints_health: vec![health(socket("10.0.0.1", 8080), HealthStatus::Unhealthy)],
            ..Default::default()
        };
        let bytes = flat.encode_to_vec();
        assert_eq!(lean(&bytes), with_prost(&bytes));
        assert_eq!(lean(&bytes)[0].0, None);
        // One empty cluster entry switches to the grouped list, as with prost.
        let mut grouped = flat.clone();
        grouped
            .cluster_endpoints_health
            .push(ClusterEndpointsHealth::default());
        let bytes = grouped.encode_to_vec();
        assert_eq!(lean(&bytes), with_prost(&bytes));
        assert!(lean(&bytes).is_empty());
        assert!(Report::decode(Bytes::new()).unwrap().is_empty());
    }

    /// Fields that occur twice, as prost merges them: repeated lists
    /// append, a singular message merges, a scalar or string keeps the
    /// last, a oneof's other variant replaces.
    #[test]
    fn merges_repeated_occurrences_as_prost_does() {
        let cluster = |name: &str, eh: Vec<EndpointHealth>| ClusterEndpointsHealth {
            cluster_name: name.into(),
            locality_endpoints_health: vec![LocalityEndpointsHealth {
                locality: None,
                endpoints_health: eh,
            }],
        };
        let a = EndpointHealthResponse {
            cluster_endpoints_health: vec![cluster(
                "a",
                vec![health(socket("10.0.0.1", 1), HealthStatus::Healthy)],
            )],
            ..Default::default()
        };
        // The same cluster entry twice in one message: name "b" wins.
        let one = cluster(
            "a",
            vec![health(socket("10.0.0.1", 1), HealthStatus::Healthy)],
        )
        .encode_to_vec();
        let two = cluster(
            "b",
            vec![health(socket("10.0.0.2", 2), HealthStatus::Unhealthy)],
        )
        .encode_to_vec();
        let mut joined = Vec::new();
        for part in [&one, &two] {
            joined.push(0x12);
            prost::encoding::encode_varint(part.len() as u64, &mut joined);
            joined.extend_from_slice(part);
        }
        let mut merged_cluster = Vec::new();
        prost::encoding::encode_key(2, WireType::LengthDelimited, &mut merged_cluster);
        prost::encoding::encode_varint((one.len() + two.len()) as u64, &mut merged_cluster);
        merged_cluster.extend_from_slice(&one);
        merged_cluster.extend_from_slice(&two);
        for bytes in [a.encode_to_vec(), joined, merged_cluster] {
            assert_eq!(lean(&bytes), with_prost(&bytes), "{bytes:?}");
        }

        // An endpoint health whose status, then address, come twice; then
        // a pipe replacing the socket address; then the socket address back
        // with only a port (merged into nothing: no IP).
        let eh = |e: Option<Endpoint>, s: HealthStatus| health(e, s).encode_to_vec();
        let pipe = Some(Endpoint {
            address: Some(PbAddress {
                address: Some(address::Address::Pipe(Pipe {
                    path: "/x".into(),
                    mode: 0,
                })),
            }),
            ..Default::default()
        });
        let port_only = Some(Endpoint {
            address: Some(PbAddress {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(7)),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        });
        let named = Some(Endpoint {
            address: Some(PbAddress {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    port_specifier: Some(socket_address::PortSpecifier::NamedPort("http".into())),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        });
        let cases = [
            [
                eh(socket("10.0.0.1", 1), HealthStatus::Healthy),
                eh(None, HealthStatus::Unhealthy),
            ]
            .concat(),
            [
                eh(socket("10.0.0.1", 1), HealthStatus::Healthy),
                eh(port_only.clone(), HealthStatus::Healthy),
            ]
            .concat(),
            [
                eh(socket("10.0.0.1", 1), HealthStatus::Healthy),
                eh(pipe.clone(), HealthStatus::Healthy),
            ]
            .concat(),
            [
                eh(socket("10.0.0.1", 1), HealthStatus::Healthy),
                eh(pipe, HealthStatus::Healthy),
                eh(port_only, HealthStatus::Healthy),
            ]
            .concat(),
            [
                eh(socket("10.0.0.1", 1), HealthStatus::Healthy),
                eh(named, HealthStatus::Healthy),
            ]
            .concat(),
        ];
        for endpoint_health in cases {
            let mut bytes = Vec::new();
            prost::encoding::encode_key(1, WireType::LengthDelimited, &mut bytes);
            prost::encoding::encode_varint(endpoint_health.len() as u64, &mut bytes);
            bytes.extend_from_slice(&endpoint_health);
            assert_eq!(lean(&bytes), with_prost(&bytes), "{bytes:?}");
        }
    }

    #[test]
    fn broken_reports_are_refused() {
        let good = Report::from(EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: "web".into(),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![health(socket("10.0.0.1", 1), HealthStatus::Healthy)],
                }],
            }],
            ..Default::default()
        });
        let bytes = good.as_bytes().to_vec();
        // Every truncation is refused by both, or accepted by both alike.
        for n in 0..bytes.len() {
            let cut = &bytes[..n];
            match EndpointHealthResponse::decode(cut) {
                Ok(_) => assert_eq!(lean(cut), with_prost(cut)),
                Err(_) => assert!(Report::decode(Bytes::copy_from_slice(cut)).is_err(), "{n}"),
            }
        }
        // A cluster name that is not UTF-8.
        let mut bad = Vec::new();
        let cluster = [0x0a, 0x02, 0xff, 0xfe];
        bad.push(0x12);
        bad.push(cluster.len() as u8);
        bad.extend_from_slice(&cluster);
        assert!(EndpointHealthResponse::decode(&bad[..]).is_err());
        assert_eq!(
            Report::decode(Bytes::from(bad)).unwrap_err(),
            ReportError::NotUtf8("cluster_name")
        );
        // A list with the wrong wire type.
        let wrong = Bytes::from_static(&[0x10, 0x01]);
        assert!(EndpointHealthResponse::decode(&wrong[..]).is_err());
        let e = Report::decode(wrong).unwrap_err();
        assert!(e.to_string().contains("cluster_endpoints_health"), "{e}");
    }
}
