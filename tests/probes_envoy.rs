//! Probe kinds against real Envoy 1.40 processes: HTTP (status and custom
//! ranges), gRPC (grpc.health.v1), TCP payloads, a separate probe port, and
//! the Envoy's own admin /ready turning its inbounds `draining`.

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

#[test]
fn http_probe_follows_the_status_and_a_custom_range() {
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
    let _envoy = Envoy::start(hdsd.hds, "default.web", None);
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

#[test]
fn grpc_probe_follows_serving_and_not_serving() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = GrpcApp::start("shop.Cart");
    hdsd.write_dataplane(
        "cart.yaml",
        &probed_dataplane("cart", app.port, "      grpc: {service: shop.Cart}\n"),
    );
    let _envoy = Envoy::start(hdsd.hds, "default.cart", None);
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

#[test]
fn tcp_payload_probe_expects_the_answer() {
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
    let _envoy = Envoy::start(hdsd.hds, "default.cache", None);
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

#[test]
fn a_separate_probe_port_fails_while_the_service_port_stays_open() {
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
    let _envoy = Envoy::start(hdsd.hds, "default.api", None);
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

#[test]
fn an_envoy_failing_its_own_ready_check_drains_its_inbounds() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = App::start();
    // The Envoy binds its admin on port 0; the dataplane then declares the
    // port it got (its stream waits for the definition meanwhile).
    let envoy = Envoy::start(hdsd.hds, "default.edge", None);
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
