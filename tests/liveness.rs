//! Liveness and lifecycle with real Envoy 1.40: hung and killed Envoys,
//! graceful shutdown, and restarts of hdsd that do not flap readiness.

use std::time::{Duration, Instant};

use hdsd::clock::{Clock as _, SystemClock};

use crate::support::*;

const CONNECT: Duration = Duration::from_secs(20);

const STALE_AFTER: Duration = Duration::from_secs(2);

/// Reports every 500ms; a report older than `stale_after` is stale.
fn start(stale_after: Duration) -> Hdsd {
    Hdsd::start_with(|c| {
        c.hds.report_interval = Duration::from_millis(500);
        c.hds.stale_after = Some(stale_after);
    })
}

#[test]
fn a_stopped_envoy_goes_stale_and_its_stream_is_closed_then_recovers() {
    let hdsd = start(STALE_AFTER);
    let app = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let envoy = Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);

    // SIGSTOP: the TCP connection stays open and silent.
    envoy.signal("STOP");
    let stopped_at = Instant::now();
    let dp = hdsd.wait_inbound(
        "default.web",
        10001,
        "stale",
        STALE_AFTER + Duration::from_secs(2),
    );
    assert!(!dp.inbounds[0].health.ready);
    assert!(
        stopped_at.elapsed() <= STALE_AFTER + Duration::from_secs(1),
        "stale within stale_after + 1s, took {:?}",
        stopped_at.elapsed()
    );
    hdsd.wait_connected("default.web", false, Duration::from_secs(3));
    assert!(
        hdsd.log().contains("no health report for 2s"),
        "the reason is logged"
    );
    assert!(
        hdsd.metric("hdsd_streams_closed_total{reason=\"stale\"}")
            .unwrap_or(0.0)
            > 0.0,
        "stale closes are counted"
    );

    // SIGCONT: Envoy reconnects and is ready again after its next report.
    envoy.signal("CONT");
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    assert!(hdsd.dataplane("default.web").unwrap().connection.connected);
}

#[test]
fn a_killed_envoy_is_stale_after_the_window_not_before_and_a_quick_restart_never_flaps() {
    let hdsd = start(Duration::from_secs(4));
    let app = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let mut envoy = Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);

    // Killed: disconnected at once, but the last report stands until the window ends.
    envoy.kill();
    let dp = wait_for("the disconnect", Duration::from_secs(5), || {
        let dp = hdsd.dataplane("default.web")?;
        if dp.connection.connected {
            Err("still connected".into())
        } else {
            Ok(dp)
        }
    });
    let last_report = dp.inbounds[0]
        .health
        .last_report_at
        .expect("reported before");
    let window = chrono::Duration::seconds(4);
    let dp = wait_for("the inbound to go stale", Duration::from_secs(10), || {
        let dp = hdsd.dataplane("default.web")?;
        let h = &dp.inbounds[0].health;
        if h.status == "stale" {
            return Ok(dp);
        }
        // Not before the window.
        assert!(
            SystemClock.now() < last_report + window + chrono::Duration::milliseconds(900),
            "{h:?}"
        );
        assert_eq!(
            h.status, "healthy",
            "keeps its last reported state until the window ends"
        );
        Err(format!("{h:?}"))
    });
    assert_eq!(
        dp.inbounds[0].health.since,
        last_report + window,
        "stale from the moment the window ended"
    );
    assert!(SystemClock.now() >= last_report + window);

    // A restart within the window never reads not ready.
    let app2 = App::start();
    hdsd.write_dataplane("api.yaml", &dataplane_yaml("api", &[(10001, app2.port)]));
    let mut api_envoy = Envoy::start(hdsd.hds, "default.api", None);
    hdsd.wait_inbound("default.api", 10001, "healthy", CONNECT);
    api_envoy.kill();
    let _api_envoy = Envoy::start(hdsd.hds, "default.api", None);
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut reconnected = false;
    while Instant::now() < deadline {
        let dp = hdsd.dataplane("default.api").unwrap();
        assert!(
            dp.inbounds[0].health.ready,
            "flapped: {:?}",
            dp.inbounds[0].health
        );
        if dp.connection.connected
            && dp.inbounds[0].health.last_report_at > dp.connection.connected_at
        {
            reconnected = true;
            break;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    assert!(
        reconnected,
        "the restarted Envoy reported within the window"
    );
}

#[test]
fn sigterm_ends_streams_and_exits_zero_within_the_shutdown_timeout() {
    let mut hdsd = start(STALE_AFTER);
    let app = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let envoy = Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    let started = Instant::now();
    let status = hdsd.terminate(Duration::from_secs(12));
    assert!(status.success(), "exit code 0 on SIGTERM: {status}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "within shutdown_timeout: {:?}",
        started.elapsed()
    );
    // Envoy was told to go elsewhere (UNAVAILABLE), not left hanging.
    let line = envoy.wait_closure("hdsd is shutting down", Duration::from_secs(5));
    assert!(line.contains("closed: 14, "), "{line}");
    assert!(hdsd.log().contains("readiness state flushed"));
}

#[test]
fn a_killed_and_restarted_hdsd_never_reads_not_ready_then_detects_a_failure() {
    let mut hdsd = start(Duration::from_secs(6));
    let a = App::start();
    let mut b = App::start();
    hdsd.write_dataplane("a.yaml", &dataplane_yaml("a", &[(10001, a.port)]));
    hdsd.write_dataplane("b.yaml", &dataplane_yaml("b", &[(10001, b.port)]));
    let _ea = Envoy::start(hdsd.hds, "default.a", None);
    let _eb = Envoy::start(hdsd.hds, "default.b", None);
    hdsd.wait_inbound("default.a", 10001, "healthy", CONNECT);
    hdsd.wait_inbound("default.b", 10001, "healthy", CONNECT);
    // The transitions are on disk once the store writer logged a batch after them.
    let commits = || hdsd.metric("hdsd_store_commits_total").unwrap_or(0.0);
    let before = commits();
    wait_for(
        "the readiness store to be written",
        Duration::from_secs(5),
        || {
            let n = commits();
            if n > before {
                Ok(())
            } else {
                Err(format!("{n} commits"))
            }
        },
    );

    hdsd.restart(); // SIGKILL, then the same binary, config and state
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut both_reported_again = false;
    while Instant::now() < deadline {
        let items = hdsd.dataplanes("").unwrap();
        assert_eq!(items.len(), 2);
        for dp in &items {
            assert!(
                dp.inbounds[0].health.ready,
                "{}.{} flapped: {:?}",
                dp.mesh, dp.name, dp.inbounds[0].health
            );
        }
        if items.iter().all(|d| {
            d.connection.connected && d.connection.last_report_at > d.connection.connected_at
        }) {
            both_reported_again = true;
            break;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
    assert!(
        both_reported_again,
        "both Envoys reconnected and reported to the new hdsd"
    );

    // The restarted hdsd still detects a failure.
    b.stop();
    hdsd.wait_inbound("default.b", 10001, "unhealthy", Duration::from_secs(10));
    assert_eq!(
        hdsd.dataplane("default.a").unwrap().inbounds[0]
            .health
            .status,
        "healthy"
    );
}
