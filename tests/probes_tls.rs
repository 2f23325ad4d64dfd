//! Probes over TLS with real Envoys: an HTTPS application (rustls, with
//! certificates the test makes) is ready over `http.tls`, not ready once
//! its certificate comes from another CA or does not name the SNI, and a
//! plaintext probe never passes its TLS port; a gRPC health server over TLS
//! follows SERVING and NOT_SERVING; an application that requires a client
//! certificate is ready only while the probe presents one; a change of
//! only the TLS settings (Envoy recreates the host) never flaps the
//! inbound; and `envoy --mode validate` accepts, on every supported
//! release, the clusters Envoy's HDS makes of every reference TLS shape.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::bootstrap::v3::{bootstrap::StaticResources, Bootstrap};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::service::health::v3::HealthCheckSpecifier;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use hdsd::specifier::{build, Specifier, SpecifierSettings};
use prost::Message;
use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};

use crate::support::apps::{tls_config, GrpcApp, TlsApp};
use crate::support::pki::Ca;
use crate::support::*;

/// Worst-case detection with the harness defaults is 700 ms (2 x 200 ms +
/// 100 ms + 200 ms); this leaves a margin for a loaded machine.
const DETECTION: Duration = Duration::from_secs(5);
/// Envoy start, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);

/// A dataplane with one inbound on port 10001 for `service_port`, whose
/// `serviceProbe` block is `probe` (already indented under serviceProbe:).
fn probed_dataplane(name: &str, service_port: u16, probe: &str) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {service_port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: {name}}}\n    serviceProbe:\n{probe}"
    )
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The Envoy's counter `<stats_prefix(cluster)><stat>` on its admin port
/// (0 when absent): where the `tls_probe_failing` reason sends the operator.
fn envoy_stat(envoy: &Envoy, cluster: &str, stat: &str) -> u64 {
    let name = format!("{}{stat}", hdsd::specifier::stats_prefix(cluster));
    let text = ureq::get(&format!("http://{}/stats", envoy.admin()))
        .call()
        .expect("GET /stats")
        .body_mut()
        .read_to_string()
        .expect("stats text");
    text.lines()
        .find_map(|l| {
            l.strip_prefix(&name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Waits for `n` more reports of `id` than when called, asserting `check`
/// on every sample of the API meanwhile.
fn through_reports(
    hdsd: &Hdsd,
    id: &str,
    n: usize,
    mut check: impl FnMut(&hdsd::api::DataplaneItem),
) {
    let mut last = hdsd.dataplane(id).unwrap().connection.last_report_at;
    let mut seen = 0;
    wait_for(&format!("{n} more reports"), DETECTION, || {
        let dp = hdsd.dataplane(id)?;
        check(&dp);
        if dp.connection.last_report_at > last {
            last = dp.connection.last_report_at;
            seen += 1;
        }
        (seen >= n).then_some(()).ok_or(format!("{seen} reports"))
    });
}

#[test]
fn https_probe_follows_the_certificate_and_a_plaintext_probe_never_passes() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let good = ca.issue_for(pki.path(), "app", ServerAuth, &["app.test"]);
    let rogue = Ca::new("another CA").issue_for(pki.path(), "rogue", ServerAuth, &["app.test"]);
    let app = TlsApp::start(tls_config(&good.cert, &good.key, None), false);
    let hdsd = Hdsd::start(HdsdOptions::default());
    let https = |sni: &str| {
        probed_dataplane(
            "web",
            app.port,
            &format!(
                "      http:\n        path: /healthz\n        tls: {{caFile: {}, sni: {sni}}}\n",
                path(&ca_file)
            ),
        )
    };
    hdsd.write_dataplane("web.yaml", &https("app.test"));
    let envoy = Envoy::start(hdsd.hds, "default.web", None);
    let dp = hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    let probe = dp.inbounds[0].probe.clone().unwrap();
    let tls = probe.tls.expect("the API says the probe is TLS");
    assert_eq!(
        (tls.verify.as_str(), tls.sni.as_deref(), tls.ca_file),
        ("ca", Some("app.test"), Some(path(&ca_file)))
    );
    let served = app.served();
    assert!(served.tls > 0 && served.plaintext == 0, "{served:?}");
    assert_eq!(served.last_sni.as_deref(), Some("app.test"));

    // The application's certificate replaced by one from another CA.
    let started = Instant::now();
    app.set_config(tls_config(&rogue.cert, &rogue.key, None));
    let dp = hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
    eprintln!(
        "https: a certificate from another CA seen as unhealthy after {:?}",
        started.elapsed()
    );
    assert!(!dp.inbounds[0].health.ready);
    let reason = dp.inbounds[0].health.reason.clone().expect("a reason");
    assert_eq!(reason.code, "tls_probe_failing");
    // What the reason sends the operator to read says what happened.
    let cluster = &probe.cluster;
    let prefix = hdsd::specifier::stats_prefix(cluster);
    assert!(reason.message.contains(&prefix), "{reason:?}");
    assert!(envoy_stat(&envoy, cluster, "ssl.fail_verify_error") > 0);

    app.set_config(tls_config(&good.cert, &good.key, None));
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);

    // A name the certificate does not carry.
    let started = Instant::now();
    hdsd.write_dataplane("web.yaml", &https("other.test"));
    hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
    eprintln!(
        "https: an SNI the certificate does not name seen as unhealthy after {:?}",
        started.elapsed()
    );
    assert!(envoy_stat(&envoy, cluster, "ssl.fail_verify_san") > 0);
    hdsd.write_dataplane("web.yaml", &https("app.test"));
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);

    // A plaintext probe of the TLS port: never ready.
    let started = Instant::now();
    hdsd.write_dataplane(
        "web.yaml",
        &probed_dataplane("web", app.port, "      http: {path: /healthz}\n"),
    );
    let dp = hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
    eprintln!(
        "https: a plaintext probe of the TLS port seen as unhealthy after {:?}",
        started.elapsed()
    );
    assert_eq!(dp.inbounds[0].probe.as_ref().unwrap().tls, None);
    let reason = dp.inbounds[0].health.reason.clone().expect("a reason");
    assert_eq!(reason.code, "probe_failing", "not a TLS probe: {reason:?}");
    through_reports(&hdsd, "default.web", 5, |dp| {
        assert!(!dp.inbounds[0].health.ready, "{:?}", dp.inbounds[0].health);
    });
    assert_eq!(app.served().plaintext, 0);
}

/// `[hds.check.tls]` puts the default check (here a TCP connect: the
/// handshake is the check) over TLS for inbounds without a `serviceProbe`.
#[test]
fn the_default_check_goes_over_tls() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let good = ca.issue_for(pki.path(), "app", ServerAuth, &["app.test"]);
    let rogue = Ca::new("another CA").issue_for(pki.path(), "rogue", ServerAuth, &["app.test"]);
    let app = TlsApp::start(tls_config(&good.cert, &good.key, None), false);
    let hdsd = Hdsd::start_with(|c| {
        c.hds.check.tls = Some(CheckTlsConfig {
            enabled: true,
            sni: Some("app.test".into()),
            ca_file: Some(path(&ca_file)),
            insecure_skip_verify: false,
            client_cert_file: None,
            client_key_file: None,
            alpn: Vec::new(),
        })
    });
    hdsd.write_dataplane("db.yaml", &dataplane_yaml("db", &[(10001, app.port)]));
    let _envoy = Envoy::start(hdsd.hds, "default.db", None);
    let dp = hdsd.wait_inbound("default.db", 10001, "healthy", CONNECT);
    let probe = dp.inbounds[0].probe.clone().unwrap();
    assert_eq!(probe.kind, "tcp");
    assert_eq!(probe.tls.unwrap().sni.as_deref(), Some("app.test"));
    assert_eq!(app.served().last_sni.as_deref(), Some("app.test"));
    let started = Instant::now();
    app.set_config(tls_config(&rogue.cert, &rogue.key, None));
    hdsd.wait_inbound("default.db", 10001, "unhealthy", DETECTION);
    eprintln!(
        "tcp over TLS: a certificate from another CA seen as unhealthy after {:?}",
        started.elapsed()
    );
}

#[test]
fn grpc_over_tls_follows_serving_and_not_serving() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let leaf = ca.issue_for(pki.path(), "cart", ServerAuth, &["cart.test"]);
    let app = GrpcApp::start_tls("shop.Cart", &leaf.cert, &leaf.key);
    let hdsd = Hdsd::start(HdsdOptions::default());
    hdsd.write_dataplane(
        "cart.yaml",
        &probed_dataplane(
            "cart",
            app.port,
            &format!(
                "      grpc:\n        service: shop.Cart\n        tls: {{caFile: {}, sni: cart.test}}\n",
                path(&ca_file)
            ),
        ),
    );
    let _envoy = Envoy::start(hdsd.hds, "default.cart", None);
    let dp = hdsd.wait_inbound("default.cart", 10001, "healthy", CONNECT);
    let tls = dp.inbounds[0].probe.clone().unwrap().tls.unwrap();
    assert_eq!(tls.alpn, ["h2"], "gRPC offers h2 by default");
    let started = Instant::now();
    app.set_serving(false);
    let dp = hdsd.wait_inbound("default.cart", 10001, "unhealthy", DETECTION);
    eprintln!(
        "grpc over TLS: NOT_SERVING seen as unhealthy after {:?}",
        started.elapsed()
    );
    assert!(!dp.inbounds[0].health.ready);
    app.set_serving(true);
    hdsd.wait_inbound("default.cart", 10001, "healthy", DETECTION);
}

#[test]
fn mutual_tls_is_ready_only_while_the_probe_presents_a_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let server = ca.issue_for(pki.path(), "db", ServerAuth, &["db.test"]);
    let clients = Ca::new("clients CA");
    let probe_cert = clients.issue_for(pki.path(), "probe", ClientAuth, &["probe.test"]);
    let app = TlsApp::start(tls_config(&server.cert, &server.key, Some(&clients)), false);
    let hdsd = Hdsd::start(HdsdOptions::default());
    let probe = |client: bool| {
        let client = if client {
            format!(
                ", clientCertFile: {}, clientKeyFile: {}",
                path(&probe_cert.cert),
                path(&probe_cert.key)
            )
        } else {
            String::new()
        };
        probed_dataplane(
            "db",
            app.port,
            &format!(
                "      http:\n        path: /healthz\n        tls: {{caFile: {}, sni: db.test{client}}}\n",
                path(&ca_file)
            ),
        )
    };
    hdsd.write_dataplane("db.yaml", &probe(false));
    let _envoy = Envoy::start(hdsd.hds, "default.db", None);
    hdsd.wait_inbound("default.db", 10001, "unhealthy", CONNECT);
    through_reports(&hdsd, "default.db", 5, |dp| {
        assert!(!dp.inbounds[0].health.ready, "{:?}", dp.inbounds[0].health);
    });
    let served = app.served();
    assert!(
        served.tls == 0 && served.failed_handshakes > 0,
        "the app refused the probe: {served:?}"
    );

    hdsd.write_dataplane("db.yaml", &probe(true));
    let dp = hdsd.wait_inbound("default.db", 10001, "healthy", DETECTION);
    let tls = dp.inbounds[0].probe.clone().unwrap().tls.unwrap();
    assert_eq!(tls.client_cert_file, Some(path(&probe_cert.cert)));
    assert!(app.served().last_client_cert, "{:?}", app.served());

    let started = Instant::now();
    hdsd.write_dataplane("db.yaml", &probe(false));
    hdsd.wait_inbound("default.db", 10001, "unhealthy", DETECTION);
    eprintln!(
        "mtls: the client certificate withdrawn seen as unhealthy after {:?}",
        started.elapsed()
    );
}

/// A change of only the TLS settings makes Envoy recreate the target's
/// host (its log says so), and a new host reads UNHEALTHY until its first
/// check; the app answers slowly, so reports come meanwhile. hdsd holds
/// those (its log says so too), and the API, sampled all along, never
/// reads anything but healthy: TLS switched on, its SNI changed,
/// verification skipped, TLS switched off.
#[test]
fn a_change_of_only_the_tls_settings_keeps_the_inbound_ready() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = path(&ca.write(&pki.path().join("ca.pem")));
    let leaf = ca.issue_for(pki.path(), "web", ServerAuth, &["app.test", "web.test"]);
    // TLS and plaintext on one port, each answer 300 ms late.
    let app = TlsApp::start(tls_config(&leaf.cert, &leaf.key, None), true);
    app.set_delay(Duration::from_millis(300));
    let hdsd = Hdsd::start_with(|c| {
        c.hds.report_interval = Duration::from_millis(100);
        c.hds.check.interval = Duration::from_secs(1);
        c.hds.check.timeout = Duration::from_millis(800);
    });
    let define = |tls: &str| {
        hdsd.write_dataplane(
            "web.yaml",
            &probed_dataplane(
                "web",
                app.port,
                &format!("      http:\n        path: /healthz\n        tls: {tls}\n"),
            ),
        )
    };
    define(&format!(
        "{{enabled: false, caFile: {ca_file}, sni: app.test}}"
    ));
    let envoy = Envoy::start_logging(
        &envoy_bin(),
        hdsd.hds,
        "default.web",
        None,
        "hc:debug,upstream:debug",
    );
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    assert!(app.served().plaintext > 0);
    // Envoy logs each host it adds to an existing HDS cluster (its
    // constructor, the first specifier, logs none).
    let recreations = || envoy.log().matches("Hosts Added: 1,").count();
    let steps = [
        format!("{{caFile: {ca_file}, sni: app.test}}"),
        format!("{{caFile: {ca_file}, sni: web.test}}"),
        "{insecureSkipVerify: true, sni: web.test}".to_string(),
        format!("{{enabled: false, caFile: {ca_file}, sni: web.test}}"),
    ];
    let healthy = |dp: &hdsd::api::DataplaneItem| {
        let h = &dp.inbounds[0].health;
        assert!(
            h.status == "healthy" && h.ready,
            "the inbound flapped during a TLS change: {h:?}"
        );
    };
    let mut samples = 0;
    for (n, tls) in steps.iter().enumerate() {
        let served = app.served();
        define(tls);
        // Envoy recreates the host, then checks it (slowly), then reports.
        wait_for(
            &format!("Envoy to recreate the host for {tls}"),
            DETECTION,
            || {
                let dp = hdsd.dataplane("default.web")?;
                healthy(&dp);
                samples += 1;
                (recreations() > n)
                    .then_some(())
                    .ok_or(format!("{} recreations", recreations()))
            },
        );
        wait_for("the new host's first check", DETECTION, || {
            let dp = hdsd.dataplane("default.web")?;
            healthy(&dp);
            samples += 1;
            let now = app.served();
            (now.tls + now.plaintext > served.tls + served.plaintext)
                .then_some(())
                .ok_or(format!("{now:?}"))
        });
        through_reports(&hdsd, "default.web", 3, |dp| {
            healthy(dp);
            samples += 1;
        });
    }
    assert_eq!(recreations(), steps.len(), "one recreation per change");
    let served = app.served();
    assert_eq!(served.last_sni.as_deref(), Some("web.test"));
    // One probe per interval still: the replaced hosts are probed no more
    // (the criteria change with the settings, so Envoy replaces the checker).
    let started = Instant::now();
    let before = served.tls + served.plaintext;
    std::thread::park_timeout(Duration::from_secs(4));
    let after = app.served();
    let probes = after.tls + after.plaintext - before;
    eprintln!(
        "tls changes: {probes} probes in {:?} after {} changes (interval 1s)",
        started.elapsed(),
        steps.len()
    );
    assert!(probes <= 5, "the replaced hosts are still probed: {probes}");
    let held = hdsd.log().matches("report held: a TLS change").count();
    eprintln!(
        "tls changes: {} host recreations, {held} reports held, {samples} samples all healthy",
        steps.len()
    );
    assert!(held > 0, "no UNHEALTHY of a recreated host was reported");
}

/// Envoy aborts on a TLS file it cannot read (an uncaught exception in
/// its HDS), and restarts into the same specifier. After three such
/// streams in a row hdsd sends that Envoy no TLS check: it stays up, its
/// other inbounds are probed, the TLS one reads `unsupported` with the
/// reason; once the file is there, new TLS settings are sent again.
#[test]
fn an_envoy_that_aborts_on_a_missing_tls_file_is_sent_its_tls_checks_no_more() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = pki.path().join("ca.pem");
    let leaf = ca.issue_for(pki.path(), "app", ServerAuth, &["app.test"]);
    let tls_app = TlsApp::start(tls_config(&leaf.cert, &leaf.key, None), false);
    let app = App::start();
    let hdsd = Hdsd::start(HdsdOptions::default());
    let define = |tls: &str| {
        hdsd.write_dataplane(
            "web.yaml",
            &format!(
                "{}  - port: 10002\n    servicePort: {}\n    serviceAddress: 127.0.0.1\n",
                probed_dataplane(
                    "web",
                    tls_app.port,
                    &format!("      http:\n        path: /healthz\n        tls: {tls}\n")
                ),
                app.port
            ),
        )
    };
    // The CA file is not on the machine yet.
    define(&format!("{{caFile: {}}}", path(&ca_file)));
    let mut crashes = 0;
    let mut envoy = loop {
        assert!(crashes <= 3, "hdsd kept sending the TLS check");
        // A supervisor restarts the Envoy each time it aborts.
        let mut envoy = Envoy::start(hdsd.hds, "default.web", None);
        let aborted = wait_for(
            "Envoy to abort, or to run without the TLS check",
            CONNECT,
            || {
                if envoy.exited().is_some() {
                    return Ok(true);
                }
                let dp = hdsd.dataplane("default.web")?;
                match (
                    dp.connection.connected,
                    dp.inbounds[1].health.status.as_str(),
                ) {
                    (true, "healthy") => Ok(false),
                    other => Err(format!("{other:?}")),
                }
            },
        );
        if !aborted {
            break envoy;
        }
        crashes += 1;
        assert!(
            envoy.log().contains("Invalid path"),
            "Envoy aborted for another reason:\n{}",
            envoy.log()
        );
    };
    eprintln!("missing CA file: Envoy aborted {crashes} times, then ran without the TLS check");
    assert_eq!(crashes, 3, "three streams in a row flag the dataplane");
    let dp = hdsd.wait_inbound("default.web", 10001, "unsupported", DETECTION);
    let reason = dp.inbounds[0].health.reason.clone().expect("a reason");
    assert_eq!(reason.code, "tls_withheld");
    through_reports(&hdsd, "default.web", 5, |dp| {
        assert_eq!(dp.inbounds[1].health.status, "healthy");
        assert!(!dp.inbounds[0].health.ready);
    });
    assert!(envoy.is_running(), "the Envoy runs what it is sent");

    // The file is put in place; new TLS settings are sent again.
    ca.write(&ca_file);
    define(&format!("{{caFile: {}, sni: app.test}}", path(&ca_file)));
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);
    through_reports(&hdsd, "default.web", 3, |dp| {
        assert!(dp.is_ready(), "{dp:?}");
    });
    assert!(envoy.is_running());
}

/// The cluster Envoy's HDS makes of one `ClusterHealthCheck`
/// (`HdsDelegate::createClusterConfig`: its name, a 1 s connect timeout, a
/// 32 KiB buffer limit, the endpoints, the health checks and the transport
/// socket matches), as a static cluster. A static cluster with a gRPC check
/// must say it speaks HTTP/2 (an HDS cluster need not, from Envoy 1.38).
fn hds_cluster(chc: &envoy_types::pb::envoy::service::health::v3::ClusterHealthCheck) -> Cluster {
    use envoy_types::pb::envoy::config::core::v3::{health_check, Http2ProtocolOptions};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        http_protocol_options::{
            explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
        },
        HttpProtocolOptions,
    };
    let grpc = chc.health_checks.iter().any(|h| {
        matches!(
            h.health_checker,
            Some(health_check::HealthChecker::GrpcHealthCheck(_))
        )
    });
    let http2 = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                    Http2ProtocolOptions::default(),
                )),
            },
        )),
        ..Default::default()
    };
    let options = grpc.then(|| {
        (
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            envoy_types::pb::google::protobuf::Any {
                type_url:
                    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
                        .to_string(),
                value: http2.encode_to_vec(),
            },
        )
    });
    Cluster {
        typed_extension_protocol_options: options.into_iter().collect(),
        name: chc.cluster_name.clone(),
        connect_timeout: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        per_connection_buffer_limit_bytes: Some(UInt32Value { value: 32768 }),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: chc.cluster_name.clone(),
            endpoints: chc
                .locality_endpoints
                .iter()
                .map(|le| LocalityLbEndpoints {
                    locality: le.locality.clone(),
                    lb_endpoints: le
                        .endpoints
                        .iter()
                        .map(|e| LbEndpoint {
                            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(e.clone())),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        health_checks: chc.health_checks.clone(),
        transport_socket_matches: chc.transport_socket_matches.clone(),
        ..Default::default()
    }
}

/// Runs `envoy --mode validate` on a binary bootstrap holding the clusters
/// of `specifier`; the output when it refuses them.
fn envoy_validates(bin: &Path, dir: &Path, specifier: &HealthCheckSpecifier) -> Result<(), String> {
    let bootstrap = Bootstrap {
        static_resources: Some(StaticResources {
            clusters: specifier
                .cluster_health_checks
                .iter()
                .map(hds_cluster)
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let file = dir.join("specifier.pb");
    std::fs::write(&file, bootstrap.encode_to_vec()).unwrap();
    let out = Command::new(bin)
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The reference shapes' specifier, with their `/certs/` files in `certs`.
fn reference_specifier(certs: &Path) -> Specifier {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/specifiers/tls-probes.yaml");
    let text = std::fs::read_to_string(file)
        .unwrap()
        .replace("/certs/", &format!("{}/", certs.display()));
    let dp = hdsd::dataplane::parse_documents(&text).unwrap().remove(0);
    build(&dp, &SpecifierSettings::default()).unwrap()
}

#[test]
fn envoy_validates_every_reference_tls_shape_on_every_release() {
    let certs = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    ca.write(&certs.path().join("ca.pem"));
    let client = ca.issue_for(certs.path(), "client", ClientAuth, &["probe.test"]);
    std::fs::rename(&client.key, certs.path().join("client.key")).unwrap();
    let specifier = reference_specifier(certs.path());
    let with_tls = specifier
        .message
        .cluster_health_checks
        .iter()
        .filter(|c| !c.transport_socket_matches.is_empty())
        .count();
    assert_eq!(with_tls, 6, "the reference file's TLS shapes");
    for minor in ["1.36", "1.37", "1.38", "1.39", "1.40"] {
        let (version, bin) = envoy_release(minor);
        // What hdsd sends this release (gRPC checks only from 1.38).
        let version_parsed: hdsd::capability::EnvoyVersion = version.parse().unwrap();
        let sent = specifier
            .for_envoy(Some(version_parsed), false)
            .map(|(s, _)| s.message)
            .unwrap_or_else(|| specifier.message.clone());
        let sent_tls = sent
            .cluster_health_checks
            .iter()
            .filter(|c| !c.transport_socket_matches.is_empty())
            .count();
        envoy_validates(&bin, certs.path(), &sent)
            .unwrap_or_else(|e| panic!("Envoy {version} refuses the TLS shapes:\n{e}"));
        eprintln!("Envoy {version}: validates {sent_tls} TLS clusters");
    }
    // The check is real: Envoy loads the files, and refuses a missing one.
    let missing = reference_specifier(&certs.path().join("missing"));
    let error = envoy_validates(&envoy_bin(), certs.path(), &missing.message)
        .expect_err("a missing CA file is refused");
    assert!(error.contains("missing/ca.pem"), "{error}");
}
