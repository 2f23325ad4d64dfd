//! Envoy bootstrap generation: a pure function from a dataplane identity and
//! the server's address to an Envoy v3 bootstrap that connects to hdsd's HDS.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::dataplane::DataplaneId;

/// What a bootstrap needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapParams {
    pub id: DataplaneId,
    /// hdsd's HDS address as `HOST:PORT`; a hostname is resolved by Envoy (STRICT_DNS).
    pub server: String,
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

/// The bootstrap as a JSON value (YAML is a rendering of it).
pub fn bootstrap(p: &BootstrapParams) -> Result<Value, BootstrapError> {
    let (host, port) = split_server(&p.server)?;
    let discovery = if host.parse::<std::net::IpAddr>().is_ok() {
        "STATIC"
    } else {
        "STRICT_DNS"
    };
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
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": host, "port_value": port
            }}}}]}]
        }
    });
    if let Some(ca) = &p.ca {
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
        if discovery == "STRICT_DNS" {
            cluster["transport_socket"]["typed_config"]["sni"] = json!(host);
        }
    }
    let mut grpc_service = json!({"envoy_grpc": {"cluster_name": HDSD_CLUSTER}});
    if let Some(token) = &p.token {
        grpc_service["initial_metadata"] =
            json!([{"key": "authorization", "value": format!("Bearer {token}")}]);
    }
    Ok(json!({
        "node": {"id": p.id.to_string(), "cluster": p.id.mesh},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p.admin_port}}},
        "static_resources": {"clusters": [cluster]},
        "hds_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "set_node_on_first_message_only": false,
            "grpc_services": [grpc_service]
        }
    }))
}

/// The bootstrap rendered as YAML.
pub fn bootstrap_yaml(p: &BootstrapParams) -> Result<String, BootstrapError> {
    let value = bootstrap(p)?;
    Ok(serde_yaml_ng::to_string(&value).expect("a JSON value always renders as YAML"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> BootstrapParams {
        BootstrapParams {
            id: DataplaneId::new("default", "web-01"),
            server: "127.0.0.1:5678".into(),
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
            server: "hdsd.example:5678".into(),
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
    fn server_must_be_host_port() {
        for bad in ["", "host", "host:", ":5678", "host:0", "host:99999"] {
            let p = BootstrapParams {
                server: bad.into(),
                ..params()
            };
            assert!(bootstrap(&p).is_err(), "{bad}");
        }
        let p = BootstrapParams {
            server: "[::1]:5678".into(),
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
