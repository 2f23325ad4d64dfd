//! Supervision: an infrastructure task that ends stops hdsd (crash-only),
//! and a panic in one dataplane's work stays with that dataplane. The
//! faults come from `HDSD_FAULT`, which only a build with the
//! `fault-injection` feature reads (`make test` builds with it).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// Envoy start, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);

/// Starts hdsd with `fault` (`<task>:return` or `<task>:panic`), sees it
/// ready, fires the fault (SIGUSR2) and checks the stop: `/readyz` 503
/// naming the task within 1 s, the log line, the readiness flushed, and
/// exit code 2.
fn a_stopped_task_stops_hdsd(task: &str, fault: &str, ended: &str) {
    let mut hdsd = Hdsd::start(HdsdOptions {
        env: vec![("HDSD_FAULT".into(), format!("{task}:{fault}"))],
        ..Default::default()
    });
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, 8080)]));
    wait_for("the dataplane loaded", CONNECT, || {
        hdsd.dataplane("default.web").map(|_| ())
    });
    assert_eq!(hdsd.readyz().0, 200, "ready before the fault");

    let fired = Instant::now();
    let ok = Command::new("kill")
        .arg("-USR2")
        .arg(hdsd.pid().to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -USR2 {}", hdsd.pid());
    let named = format!("the {task} task {ended}");
    let body = wait_for(
        "/readyz to read 503 naming the task",
        Duration::from_secs(1),
        || match hdsd.readyz() {
            (503, body) if body.contains(&named) => Ok(body),
            (status, body) => Err(format!("{status}: {body}")),
        },
    );
    assert!(
        fired.elapsed() < Duration::from_secs(1),
        "within 1 s: {:?}",
        fired.elapsed()
    );
    assert!(body.contains("exits with code 2"), "{body}");

    let status = hdsd.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{}", hdsd.log());
    let log = hdsd.log();
    for line in [
        named.clone(),
        "hdsd stops: /readyz reads 503, the streams are drained".to_string(),
        "stopped; readiness state flushed".to_string(),
    ] {
        assert!(log.contains(&line), "{line}\n---\n{log}");
    }
}

#[test]
fn the_feed_returning_stops_hdsd_with_exit_code_2() {
    a_stopped_task_stops_hdsd("feed", "return", "returned");
}

#[test]
fn the_feed_panicking_stops_hdsd_with_exit_code_2() {
    a_stopped_task_stops_hdsd(
        "feed",
        "panic",
        "panicked: fault injected into the feed task",
    );
}

#[test]
fn the_registry_returning_stops_hdsd_with_exit_code_2() {
    a_stopped_task_stops_hdsd("registry", "return", "returned");
}

#[test]
fn the_registry_panicking_stops_hdsd_with_exit_code_2() {
    a_stopped_task_stops_hdsd(
        "registry",
        "panic",
        "panicked: fault injected into the registry task",
    );
}

#[test]
fn a_dataplane_task_that_panics_fails_that_dataplane_alone() {
    let hdsd = Hdsd::start(HdsdOptions {
        env: vec![("HDSD_FAULT".into(), "dataplane-panic:default/broken".into())],
        ..Default::default()
    });
    let app = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    hdsd.write_dataplane(
        "broken.yaml",
        &dataplane_yaml("broken", &[(10002, app.port)]),
    );
    let _web = Envoy::start(hdsd.hds, "default.web", None);
    let _broken = Envoy::start(hdsd.hds, "default.broken", None);

    // The other dataplane is served: its Envoy probes, its inbound is healthy.
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    // The broken one reads failed, with the reason.
    let broken = wait_for("the broken dataplane to read failed", CONNECT, || {
        let dp = hdsd.dataplane("default.broken")?;
        match &dp.connection.problem {
            Some(p) if p.code == "dataplane_task_failed" => Ok(dp),
            _ => Err(format!("{dp:?}")),
        }
    });
    let problem = broken.connection.problem.as_ref().unwrap();
    assert!(
        problem
            .message
            .contains("fault injected into the task of dataplane default.broken"),
        "{problem:?}"
    );
    assert!(!broken.connection.connected, "{broken:?}");
    assert!(
        broken
            .inbounds
            .iter()
            .all(|i| i.health.status == "unknown" && !i.health.ready),
        "{broken:?}"
    );
    assert_eq!(
        hdsd.metric("hdsd_task_panics_total{work=\"dataplane\"}"),
        Some(1.0)
    );
    let log = hdsd.log();
    assert!(log.contains("the dataplane's task panicked"), "{log}");

    // hdsd stays up and ready, and goes on serving the other dataplane.
    hold_for(
        "hdsd to stay up and ready",
        Duration::from_secs(2),
        || match hdsd.readyz() {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status}: {body}")),
        },
    );
    let web = hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    assert!(
        web.connection.connected && web.connection.problem.is_none(),
        "{web:?}"
    );
}
