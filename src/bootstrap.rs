//! Envoy bootstrap generation: a pure function from a dataplane identity and
//! the server's address to an Envoy v3 bootstrap that connects to hdsd's HDS.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::dataplane::DataplaneId;

/// What a bootstrap needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapParams {
    pub id: DataplaneId,
    /// hdsd's HDS addresses as `HOST:PORT`, one per instance; a hostname is
    /// resolved by Envoy (STRICT_DNS). With several, Envoy's stream goes to
    /// one of them and, when that one fails, reconnects to another.
    pub servers: Vec<String>,
    /// The dataplane token, sent as gRPC metadata `authorization`.
    pub token: Option<String>,
    /// Envoy's admin port, bound on loopback only.
    pub admin_port: u16,
    /// A CA file: connect to hdsd over TLS and verify it with this CA.
    pub ca: Option<PathBuf>,
}

/// The name of the static cluster that points at hdsd.
pub const HDSD_CLUSTER: &str = "hdsd";

/// Why a bootstrap cannot be generated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("server {0:?} is not HOST:PORT (e.g. 127.0.0.1:5678 or hdsd.example:5678)")]
    Server(String),
    #[error("no server given; name hdsd's HDS address with --server HOST:PORT (repeat it for each instance)")]
    NoServer,
    #[error("--zone: {0}")]
    Zone(String),
}

/// Splits `HOST:PORT`, accepting `[v6]:PORT`.
fn split_server(server: &str) -> Result<(String, u16), BootstrapError> {
    let bad = || BootstrapError::Server(server.to_string());
    let (host, port) = server.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// The static cluster that points at hdsd's instances (gRPC over HTTP/2,
/// TLS with `ca`): one endpoint per server.
fn hdsd_cluster(servers: &[String], ca: Option<&PathBuf>) -> Result<Value, BootstrapError> {
    if servers.is_empty() {
        return Err(BootstrapError::NoServer);
    }
    let targets = servers
        .iter()
        .map(|s| split_server(s))
        .collect::<Result<Vec<_>, _>>()?;
    let all_ips = targets
        .iter()
        .all(|(host, _)| host.parse::<std::net::IpAddr>().is_ok());
    let discovery = if all_ips { "STATIC" } else { "STRICT_DNS" };
    let endpoints: Vec<Value> = targets
        .iter()
        .map(|(host, port)| {
            json!({"endpoint": {"address": {"socket_address": {
                "address": host, "port_value": port
            }}}})
        })
        .collect();
    let mut cluster = json!({
        "name": HDSD_CLUSTER,
        "type": discovery,
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {
                    "connection_keepalive": {"interval": "30s", "timeout": "5s"}
                }}
            }
        },
        "load_assignment": {
            "cluster_name": HDSD_CLUSTER,
            "endpoints": [{"lb_endpoints": endpoints}]
        }
    });
    if let Some(ca) = ca {
        cluster["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "alpn_protocols": ["h2"],
                    "validation_context": {"trusted_ca": {"filename": ca.display().to_string()}}
                }
            }
        });
        // SNI carries host names only (RFC 6066): an IP literal is not sent.
        // One SNI per cluster: sent when every server has the same host name.
        let host = &targets[0].0;
        if host.parse::<std::net::IpAddr>().is_err() && targets.iter().all(|(h, _)| h == host) {
            cluster["transport_socket"]["typed_config"]["sni"] = json!(host);
        }
    }
    Ok(cluster)
}

/// The gRPC service `hdsd`, with the token as `authorization` metadata.
fn grpc_service(token: Option<&String>) -> Value {
    let mut grpc_service = json!({"envoy_grpc": {"cluster_name": HDSD_CLUSTER}});
    if let Some(token) = token {
        grpc_service["initial_metadata"] =
            json!([{"key": "authorization", "value": format!("Bearer {token}")}]);
    }
    grpc_service
}

/// The bootstrap as a JSON value (YAML is a rendering of it).
pub fn bootstrap(p: &BootstrapParams) -> Result<Value, BootstrapError> {
    let cluster = hdsd_cluster(&p.servers, p.ca.as_ref())?;
    Ok(json!({
        "node": {"id": p.id.to_string(), "cluster": p.id.mesh},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p.admin_port}}},
        "static_resources": {"clusters": [cluster]},
        "hds_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "set_node_on_first_message_only": false,
            "grpc_services": [grpc_service(p.token.as_ref())]
        }
    }))
}

/// What a front-proxy bootstrap needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontParams {
    pub mesh: String,
    /// The `kuma.io/service` to route to.
    pub service: String,
    /// The HTTP listener's address (port 0: any free port, read back from
    /// the admin API's `/listeners`).
    pub listen: std::net::SocketAddr,
    /// hdsd's HDS address as `HOST:PORT` (EDS is served there too).
    pub server: String,
    /// One of hdsd's `api.tokens`, sent as gRPC metadata `authorization`.
    pub token: Option<String>,
    /// Envoy's admin port, bound on loopback only (0: any free port).
    pub admin_port: u16,
    pub ca: Option<PathBuf>,
    /// The front's zone (`node.locality.zone`): a global serves it its own
    /// zone's endpoints at priority 0 and the other zones' after them.
    pub zone: Option<String>,
}

/// An HTTP front proxy whose only route goes to the EDS cluster
/// `<mesh>/<service>`, fed by hdsd over gRPC.
///
/// - Retries (2) on connect-failure, reset and refused-stream, each on
///   another endpoint (previous_hosts predicate): a request that reaches an
///   app that just died is retried before its checks have caught up.
/// - `healthy_panic_threshold: 0`: Envoy's default (50%) ignores health once
///   half the endpoints are unhealthy and spreads traffic over all of them,
///   dead ones included. At 0 an unhealthy endpoint never gets traffic; when
///   none is healthy or degraded, requests fail fast with 503.
/// - With a zone: `node.locality.zone` names it; retries also follow a 5xx
///   and go to another priority once the one tried failed
///   (`previous_priorities`): `previous_hosts` alone retries inside
///   priority 0 only, so a request that met the last local endpoint dying
///   would fail instead of going to the next zone.
pub fn front(p: &FrontParams) -> Result<Value, BootstrapError> {
    let hdsd = hdsd_cluster(std::slice::from_ref(&p.server), p.ca.as_ref())?;
    if let Some(zone) = &p.zone {
        crate::names::check_zone(zone).map_err(BootstrapError::Zone)?;
    }
    let name = format!("{}/{}", p.mesh, p.service);
    let mut retry = json!({
        "retry_on": "connect-failure,reset,refused-stream",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
        }],
        "host_selection_retry_max_attempts": 5
    });
    if p.zone.is_some() {
        retry["retry_on"] = json!("5xx,connect-failure,reset,refused-stream");
        retry["retry_priority"] = json!({
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 1
            }
        });
    }
    let listener = json!({
        "name": "front",
        "address": {"socket_address": {"address": p.listen.ip().to_string(), "port_value": p.listen.port()}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "front",
                "route_config": {
                    "name": "front",
                    "virtual_hosts": [{
                        "name": p.service,
                        "domains": ["*"],
                        "routes": [{
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": name,
                                "retry_policy": retry
                            }
                        }]
                    }]
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    });
    let service = json!({
        "name": name,
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {
            "service_name": name,
            "eds_config": {
                "resource_api_version": "V3",
                "api_config_source": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [grpc_service(p.token.as_ref())]
                }
            }
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0.0}}
    });
    let mut node = json!({"id": format!("front-{}-{}", p.mesh, p.service), "cluster": "front"});
    if let Some(zone) = &p.zone {
        node["locality"] = json!({"zone": zone});
    }
    Ok(json!({
        "node": node,
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p.admin_port}}},
        "static_resources": {"listeners": [listener], "clusters": [service, hdsd]}
    }))
}

/// The front-proxy bootstrap rendered as YAML.
pub fn front_yaml(p: &FrontParams) -> Result<String, BootstrapError> {
    let value = front(p)?;
    Ok(serde_yaml_ng::to_string(&value).expect("a JSON value always renders as YAML"))
}

/// The bootstrap rendered as YAML.
pub fn bootstrap_yaml(p: &BootstrapParams) -> Result<String, BootstrapError> {
    let value = bootstrap(p)?;
    Ok(serde_yaml_ng::to_string(&value).expect("a JSON value always renders as YAML"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front_params() -> FrontParams {
        FrontParams {
            mesh: "default".into(),
            service: "web".into(),
            listen: "0.0.0.0:8080".parse().unwrap(),
            server: "127.0.0.1:5678".into(),
            token: None,
            admin_port: 9902,
            ca: None,
            zone: None,
        }
    }

    fn params() -> BootstrapParams {
        BootstrapParams {
            id: DataplaneId::new("default", "web-01"),
            servers: vec!["127.0.0.1:5678".into()],
            token: None,
            admin_port: 9901,
            ca: None,
        }
    }

    #[test]
    fn plaintext_bootstrap() {
        let b = bootstrap(&params()).unwrap();
        assert_eq!(b["node"]["id"], "default.web-01");
        assert_eq!(
            b["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
        assert_eq!(b["hds_config"]["api_type"], "GRPC");
        assert_eq!(b["hds_config"]["transport_api_version"], "V3");
        let c = &b["static_resources"]["clusters"][0];
        assert_eq!(c["type"], "STATIC");
        assert!(c.get("transport_socket").is_none());
        assert!(b["hds_config"]["grpc_services"][0]
            .get("initial_metadata")
            .is_none());
    }

    #[test]
    fn token_tls_and_hostname() {
        let p = BootstrapParams {
            servers: vec!["hdsd.example:5678".into()],
            token: Some("abc".into()),
            ca: Some("/etc/hdsd/ca.pem".into()),
            ..params()
        };
        let b = bootstrap(&p).unwrap();
        assert_eq!(
            b["hds_config"]["grpc_services"][0]["initial_metadata"][0],
            json!({"key": "authorization", "value": "Bearer abc"})
        );
        let c = &b["static_resources"]["clusters"][0];
        assert_eq!(c["type"], "STRICT_DNS");
        assert_eq!(c["transport_socket"]["typed_config"]["sni"], "hdsd.example");
    }

    #[test]
    fn several_servers_are_endpoints_of_the_one_cluster() {
        let p = BootstrapParams {
            servers: vec!["10.0.0.1:5678".into(), "10.0.0.2:5678".into()],
            ..params()
        };
        let b = bootstrap(&p).unwrap();
        let c = &b["static_resources"]["clusters"][0];
        assert_eq!(c["type"], "STATIC");
        let endpoints = &c["load_assignment"]["endpoints"][0]["lb_endpoints"];
        let addresses: Vec<&str> = endpoints
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e["endpoint"]["address"]["socket_address"]["address"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(addresses, ["10.0.0.1", "10.0.0.2"]);
        // Host names differ: resolved by DNS, and no single SNI fits them all.
        let p = BootstrapParams {
            servers: vec!["a.example:5678".into(), "b.example:5678".into()],
            ca: Some("/etc/hdsd/ca.pem".into()),
            ..params()
        };
        let b = bootstrap(&p).unwrap();
        let c = &b["static_resources"]["clusters"][0];
        assert_eq!(c["type"], "STRICT_DNS");
        assert!(c["transport_socket"]["typed_config"].get("sni").is_none());
    }

    #[test]
    fn tls_to_an_ip_address_sends_no_sni() {
        let p = BootstrapParams {
            ca: Some("/etc/hdsd/ca.pem".into()),
            ..params()
        };
        let b = bootstrap(&p).unwrap();
        let tls = &b["static_resources"]["clusters"][0]["transport_socket"]["typed_config"];
        assert_eq!(tls["common_tls_context"]["alpn_protocols"], json!(["h2"]));
        assert!(tls.get("sni").is_none(), "{tls}");
    }

    #[test]
    fn front_routes_to_the_eds_cluster_with_retries_and_no_panic_mode() {
        let b = front(&FrontParams {
            mesh: "default".into(),
            service: "web".into(),
            listen: "0.0.0.0:8080".parse().unwrap(),
            server: "127.0.0.1:5678".into(),
            token: Some("api-token".into()),
            admin_port: 9902,
            ca: None,
            zone: None,
        })
        .unwrap();
        let hcm = &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"];
        let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["cluster"], "default/web");
        assert_eq!(
            route["retry_policy"]["retry_on"],
            "connect-failure,reset,refused-stream"
        );
        assert_eq!(route["retry_policy"]["num_retries"], 2);
        let c = &b["static_resources"]["clusters"][0];
        assert_eq!(c["type"], "EDS");
        assert_eq!(c["eds_cluster_config"]["service_name"], "default/web");
        assert_eq!(
            c["common_lb_config"]["healthy_panic_threshold"]["value"],
            0.0
        );
        let grpc = &c["eds_cluster_config"]["eds_config"]["api_config_source"]["grpc_services"][0];
        assert_eq!(grpc["envoy_grpc"]["cluster_name"], HDSD_CLUSTER);
        assert_eq!(grpc["initial_metadata"][0]["value"], "Bearer api-token");
        assert_eq!(b["static_resources"]["clusters"][1]["name"], HDSD_CLUSTER);
        assert!(b.get("hds_config").is_none());
    }

    /// A front in a zone names it in its node and retries into the next
    /// priority (the next zone).
    #[test]
    fn a_front_in_a_zone_names_it_and_retries_in_the_next_zone() {
        let b = front(&FrontParams {
            zone: Some("eu-1".into()),
            ..front_params()
        })
        .unwrap();
        assert_eq!(b["node"]["locality"]["zone"], "eu-1");
        let route = &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        let retry = &route["retry_policy"];
        assert_eq!(
            retry["retry_on"],
            "5xx,connect-failure,reset,refused-stream"
        );
        assert_eq!(
            retry["retry_priority"]["name"],
            "envoy.retry_priorities.previous_priorities"
        );
        let bad = FrontParams {
            zone: Some("EU_1".into()),
            ..front_params()
        };
        assert!(matches!(front(&bad), Err(BootstrapError::Zone(_))));
    }

    /// Envoy fills in its own version; a bootstrap that set one would hide
    /// the real one from hdsd, which needs it to send only what that Envoy
    /// runs (`capability`).
    #[test]
    fn bootstraps_never_set_the_envoy_version() {
        let sidecar = bootstrap(&params()).unwrap();
        let front = front(&front_params()).unwrap();
        for b in [sidecar, front] {
            let node = b["node"].as_object().expect("a node");
            for key in node.keys() {
                assert!(!key.starts_with("user_agent"), "node.{key} is set");
            }
            assert!(!serde_json::to_string(&b).unwrap().contains("user_agent"));
        }
    }

    #[test]
    fn server_must_be_host_port() {
        for bad in ["", "host", "host:", ":5678", "host:0", "host:99999"] {
            let p = BootstrapParams {
                servers: vec![bad.into()],
                ..params()
            };
            assert!(bootstrap(&p).is_err(), "{bad}");
        }
        let none = BootstrapParams {
            servers: vec![],
            ..params()
        };
        assert_eq!(bootstrap(&none), Err(BootstrapError::NoServer));
        let p = BootstrapParams {
            servers: vec!["[::1]:5678".into()],
            ..params()
        };
        let b = bootstrap(&p).unwrap();
        assert_eq!(
            b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
                [0]["endpoint"]["address"]["socket_address"]["address"],
            "::1"
        );
    }
}
