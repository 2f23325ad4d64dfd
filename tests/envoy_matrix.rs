//! hdsd's core story on every Envoy release a fleet may run (1.36 to 1.40,
//! the releases `scripts/setup.sh` installs): one test per release, so that
//! each is its own line in the test output. On each: a token for another
//! dataplane is refused; the right one is served, pending until the first
//! report, then ready; the app stops and its inbound turns not ready; a front
//! proxy of the same release routes to it over EDS and marks it unhealthy,
//! then healthy again; the Envoy restarts and is served again.

use std::time::Duration;

use crate::support::front::{Front, FrontOptions};
use crate::support::*;

/// Worst-case detection with the harness defaults plus a margin for a
/// loaded machine (see tests/envoy_core.rs).
const DETECTION: Duration = Duration::from_secs(5);
/// Envoy start, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);
const FRONT_TOKEN: &str = "front-token";

fn core_story(minor: &str) {
    let (version, bin) = envoy_release(minor);
    eprintln!("Envoy {version}: {}", bin.display());
    let hdsd = Hdsd::start_with(|c| {
        c.auth.mode = AuthMode::Token;
        c.eds.tokens = vec![FRONT_TOKEN.into()];
    });
    let mut app = HttpApp::start("web-01");
    hdsd.write_dataplane(
        "web-01.yaml",
        &format!(
            "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {p}\n    servicePort: {p}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: web}}\n",
            p = app.port
        ),
    );
    let id = "default.web-01";
    hdsd.wait_inbound(id, app.port, "pending", CONNECT);

    // Refused: a token issued to another dataplane.
    let stranger = hdsd.issue_token("default.other", "1h");
    let refused = Envoy::start_release(&bin, hdsd.hds, id, Some(&stranger));
    let line = refused.wait_closure("cannot be used by default.web-01", CONNECT);
    assert!(line.contains("closed: 7, "), "{version}: {line}");
    drop(refused);
    let dp = hdsd.dataplane(id).unwrap();
    assert!(!dp.connection.connected, "{version}: {dp:?}");
    assert_eq!(dp.inbounds[0].health.status, "pending", "{version}");

    // Served: pending until the first report, then ready.
    let token = hdsd.issue_token(id, "1h");
    let envoy = Envoy::start_release(&bin, hdsd.hds, id, Some(&token));
    let dp = hdsd.wait_inbound(id, app.port, "healthy", CONNECT);
    assert!(dp.connection.connected && dp.inbounds[0].health.ready);

    // EDS: a front proxy of the same release routes to the app.
    let front = Front::start_release(
        &bin,
        &hdsd.hds.to_string(),
        FrontOptions {
            token: Some(FRONT_TOKEN.into()),
            ..FrontOptions::default()
        },
    );
    let url = format!("http://127.0.0.1:{}/", front.listener);
    wait_for("the front to route to web-01", CONNECT, || {
        let body = ureq::get(&url)
            .call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        (body == "web-01").then_some(()).ok_or(body)
    });

    // Not ready: the app stops; the front marks its endpoint unhealthy.
    app.stop();
    let dp = hdsd.wait_inbound(id, app.port, "unhealthy", DETECTION);
    assert!(!dp.inbounds[0].health.ready, "{version}");
    wait_for("the front to mark web-01 unhealthy", DETECTION, || {
        let host = front.host(app.port)?;
        let flags = host.get("health_flags").cloned().unwrap_or_default();
        flags
            .contains("failed_eds_health")
            .then_some(())
            .ok_or(flags)
    });

    // Ready again, at hdsd and at the front.
    app.resume();
    hdsd.wait_inbound(id, app.port, "healthy", DETECTION);
    wait_for("the front to mark web-01 healthy", DETECTION, || {
        let host = front.host(app.port)?;
        let flags = host.get("health_flags").cloned().unwrap_or_default();
        (flags == "healthy").then_some(()).ok_or(flags)
    });

    // Reconnect: a restarted Envoy reports nothing until it is sent its
    // specifier again; it is, and its inbound reads ready again.
    drop(envoy);
    hdsd.wait_connected(id, false, CONNECT);
    let _envoy = Envoy::start_release(&bin, hdsd.hds, id, Some(&token));
    hdsd.wait_connected(id, true, CONNECT);
    let dp = wait_for("a report from the restarted Envoy", CONNECT, || {
        let dp = hdsd.dataplane(id)?;
        let at = dp.connection.connected_at;
        let report = dp.connection.last_report_at;
        match (at, report) {
            (Some(at), Some(report)) if report > at => Ok(dp),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(dp.inbounds[0].health.status, "healthy", "{version}");
}

#[test]
fn v1_36() {
    core_story("1.36");
}

#[test]
fn v1_37() {
    core_story("1.37");
}

#[test]
fn v1_38() {
    core_story("1.38");
}

#[test]
fn v1_39() {
    core_story("1.39");
}

#[test]
fn v1_40() {
    core_story("1.40");
}
