//! HDS over TLS with real Envoy 1.40: server TLS, mutual TLS, and certificate
//! reload without dropping connected Envoys.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::pki::{replace, Ca, Leaf};
use crate::support::*;
use hdsd::bootstrap::{bootstrap, BootstrapParams};
use hdsd::dataplane::DataplaneId;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::{CertificateDer, ServerName};

/// Envoy start, TLS handshake, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);

/// The `[hds.tls]` table for hdsd's config.
fn hds_tls(cert: &Path, key: &Path, client_ca: Option<&Path>) -> TlsConfig {
    TlsConfig {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: client_ca.map(Path::to_path_buf),
    }
}

/// A TLS hdsd with one dataplane definition per name, each with a healthy app.
fn tls_server(pki: &Path, client_ca: Option<&Path>, names: &[&str]) -> (Hdsd, Ca, Vec<App>) {
    let ca = Ca::new("hdsd test CA");
    let server = ca.issue(pki, "server", ExtendedKeyUsagePurpose::ServerAuth);
    ca.write(&pki.join("ca.pem"));
    let hdsd =
        Hdsd::start_with(|c| c.hds.tls = Some(hds_tls(&server.cert, &server.key, client_ca)));
    let apps = names
        .iter()
        .map(|name| {
            let app = App::start();
            hdsd.write_dataplane(
                &format!("{name}.yaml"),
                &dataplane_yaml(name, &[(10001, app.port)]),
            );
            app
        })
        .collect();
    (hdsd, ca, apps)
}

/// Starts an Envoy that connects to hdsd over TLS, trusting `ca`, presenting
/// `client` (cert, key) when given.
fn tls_envoy(hds: SocketAddr, id: &str, ca: &Path, client: Option<&Leaf>) -> Envoy {
    let dir = tempfile::tempdir().unwrap();
    let mut value = bootstrap(&BootstrapParams {
        id: id.parse::<DataplaneId>().unwrap(),
        servers: vec![hds.to_string()],
        token: None,
        admin_port: 0,
        ca: Some(ca.to_path_buf()),
    })
    .unwrap();
    let tls = &mut value["static_resources"]["clusters"][0]["transport_socket"]["typed_config"];
    assert_eq!(
        tls["common_tls_context"]["alpn_protocols"],
        serde_json::json!(["h2"])
    );
    if let Some(client) = client {
        tls["common_tls_context"]["tls_certificates"] = serde_json::json!([{
            "certificate_chain": {"filename": client.cert.display().to_string()},
            "private_key": {"filename": client.key.display().to_string()},
        }]);
    }
    let yaml = serde_yaml_ng::to_string(&value).unwrap();
    Envoy::start_with_bootstrap(dir, id, &yaml)
}

/// Connects with rustls, verifying the server against `ca` for 127.0.0.1,
/// and returns the certificate the server presented.
fn presented_certificate(addr: SocketAddr, ca: &Ca) -> Result<CertificateDer<'static>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::IpAddress(addr.ip().into());
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| e.to_string())?;
    }
    assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
    conn.peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or_else(|| "no certificate presented".to_string())
}

/// Waits until hdsd has logged `needle` at least `count` times.
fn wait_log(hdsd: &Hdsd, needle: &str, count: usize, timeout: Duration) {
    wait_for(
        &format!("hdsd to log {needle:?} {count} time(s)"),
        timeout,
        || {
            let seen = hdsd.log().matches(needle).count();
            if seen >= count {
                Ok(())
            } else {
                Err(format!("seen {seen} time(s)"))
            }
        },
    )
}

fn assert_never_reported(hdsd: &Hdsd, id: &str) {
    let dp = hdsd.dataplane(id).unwrap();
    assert!(!dp.connection.connected, "{dp:?}");
    assert_eq!(dp.connection.connected_at, None, "{dp:?}");
    assert_eq!(dp.inbounds[0].health.last_report_at, None, "{dp:?}");
    assert_eq!(dp.inbounds[0].health.status, "pending", "{dp:?}");
}

#[test]
fn envoy_connects_over_tls_and_a_plaintext_envoy_is_refused() {
    let pki = tempfile::tempdir().unwrap();
    let (hdsd, _ca, _apps) = tls_server(pki.path(), None, &["web", "plain"]);
    assert!(hdsd.log().contains("TLS enabled"), "{}", hdsd.log());

    let _envoy = tls_envoy(hdsd.hds, "default.web", &pki.path().join("ca.pem"), None);
    let dp = hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    assert!(dp.connection.connected);

    // An Envoy without TLS in its bootstrap: hdsd says why, and never serves it.
    let _plain = Envoy::start(hdsd.hds, "default.plain", None);
    wait_log(&hdsd, "does not speak TLS", 1, CONNECT);
    assert_never_reported(&hdsd, "default.plain");
    hdsd.wait_inbound("default.web", 10001, "healthy", Duration::from_secs(5));
    // The bootstrap sends no IP literal as SNI (RFC 6066; rustls warns about it).
    assert!(!hdsd.log().contains("Illegal SNI"), "{}", hdsd.log());
}

#[test]
fn mutual_tls_serves_clients_of_the_ca_and_refuses_others() {
    let pki = tempfile::tempdir().unwrap();
    let clients = Ca::new("dataplane client CA");
    let client_ca = clients.write(&pki.path().join("client-ca.pem"));
    let (hdsd, _ca, _apps) =
        tls_server(pki.path(), Some(&client_ca), &["good", "stranger", "anon"]);
    let ca = pki.path().join("ca.pem");

    let good_cert = clients.issue(pki.path(), "good", ExtendedKeyUsagePurpose::ClientAuth);
    let _good = tls_envoy(hdsd.hds, "default.good", &ca, Some(&good_cert));
    let dp = hdsd.wait_inbound("default.good", 10001, "healthy", CONNECT);
    assert!(dp.connection.connected);

    // A client certificate from another CA: refused at the handshake, and
    // Envoy keeps retrying; each attempt is refused.
    let other = Ca::new("some other CA");
    let stranger_cert = other.issue(pki.path(), "stranger", ExtendedKeyUsagePurpose::ClientAuth);
    let _stranger = tls_envoy(hdsd.hds, "default.stranger", &ca, Some(&stranger_cert));
    wait_log(&hdsd, "client certificate rejected", 2, CONNECT);
    assert!(
        hdsd.log()
            .contains("it must be issued by the CA in hds.tls.client_ca"),
        "{}",
        hdsd.log()
    );
    assert_never_reported(&hdsd, "default.stranger");
    // Counted as an authentication failure.
    assert!(
        hdsd.metric("hdsd_auth_failures_total{reason=\"tls\"}")
            .unwrap_or(0.0)
            > 0.0,
        "rejected client certificates are counted"
    );

    // No client certificate at all.
    let _anon = tls_envoy(hdsd.hds, "default.anon", &ca, None);
    wait_log(&hdsd, "the client presented no certificate", 1, CONNECT);
    assert_never_reported(&hdsd, "default.anon");

    // The served Envoy was never disturbed.
    let dp = hdsd.wait_inbound("default.good", 10001, "healthy", Duration::from_secs(5));
    assert!(dp.connection.connected);
    assert_eq!(
        hdsd.dataplane("default.good")
            .unwrap()
            .connection
            .connected_at,
        dp.connection.connected_at
    );
}

#[test]
fn replaced_certificate_is_used_by_new_connections_and_keeps_envoy_connected() {
    let pki = tempfile::tempdir().unwrap();
    let (hdsd, ca, _apps) = tls_server(pki.path(), None, &["web"]);
    let first = presented_certificate(hdsd.hds, &ca).unwrap();

    let envoy = tls_envoy(hdsd.hds, "default.web", &pki.path().join("ca.pem"), None);
    let before = hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    let connected_at = before.connection.connected_at.expect("connected");

    // Renew: a new key and certificate from the same CA, written over the old files.
    let renewed = ca.issue(pki.path(), "server", ExtendedKeyUsagePurpose::ServerAuth);
    assert_ne!(renewed.der, first);
    let seen = wait_for(
        "a new TLS connection to be served the renewed certificate",
        Duration::from_secs(10),
        || {
            let der = presented_certificate(hdsd.hds, &ca)?;
            if der == renewed.der {
                Ok(der)
            } else {
                Err("still the first certificate".into())
            }
        },
    );
    assert_eq!(seen, renewed.der);
    assert!(
        hdsd.log().contains("TLS certificate reloaded"),
        "{}",
        hdsd.log()
    );

    // The Envoy connected before keeps its stream: same connection, reports go on.
    let reloaded_at = hdsd
        .dataplane("default.web")
        .unwrap()
        .connection
        .last_report_at
        .expect("reported");
    let after = wait_for("a report after the reload", Duration::from_secs(5), || {
        let dp = hdsd.dataplane("default.web")?;
        match dp.connection.last_report_at {
            Some(t) if t > reloaded_at => Ok(dp),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(after.connection.connected, "{after:?}");
    assert_eq!(
        after.connection.connected_at,
        Some(connected_at),
        "{after:?}"
    );
    assert_eq!(after.inbounds[0].health.status, "healthy", "{after:?}");
    assert!(
        envoy.hds_closures().is_empty(),
        "the HDS stream was not closed: {:?}",
        envoy.hds_closures()
    );

    // A broken certificate file is not taken: new connections still get the renewed one.
    replace(&pki.path().join("server.pem"), "not a certificate");
    wait_log(&hdsd, "TLS reload failed", 1, Duration::from_secs(10));
    assert!(
        hdsd.log().contains("contains no certificate"),
        "{}",
        hdsd.log()
    );
    assert_eq!(presented_certificate(hdsd.hds, &ca).unwrap(), renewed.der);
}
