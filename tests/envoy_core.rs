//! hdsd serving real Envoy 1.40 processes: readiness follows the application.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// Worst-case detection with the harness defaults
/// (2 x 200ms + 100ms + 200ms = 700ms), plus a generous margin for a loaded machine.
const DETECTION: Duration = Duration::from_secs(5);
/// Envoy start, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);

#[test]
fn pending_until_first_report_then_ready_and_follows_the_app() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let mut app = App::start();
    hdsd.write_dataplane(
        "web-01.yaml",
        &dataplane_yaml("web-01", &[(10001, app.port)]),
    );

    // Defined, not connected: probed but never reported is pending, not ready.
    let dp = hdsd.wait_inbound("default.web-01", 10001, "pending", Duration::from_secs(5));
    assert!(!dp.connection.connected);
    assert!(!dp.inbounds[0].health.ready);
    assert_eq!(dp.inbounds[0].health.last_report_at, None);

    let _envoy = Envoy::start(hdsd.hds, "default.web-01", None);
    // Until a report arrives the inbound must read pending and not ready.
    let dp = wait_for("first report", CONNECT, || {
        let dp = hdsd.dataplane("default.web-01")?;
        let h = &dp.inbounds[0].health;
        if h.last_report_at.is_none() {
            assert_eq!(h.status, "pending", "unreported inbound: {h:?}");
            assert!(!h.ready);
            return Err(format!("{h:?}"));
        }
        Ok(dp)
    });
    assert!(dp.connection.connected);
    let dp = hdsd.wait_inbound("default.web-01", 10001, "healthy", DETECTION);
    assert!(dp.inbounds[0].health.ready);
    assert!(dp.connection.last_report_at.is_some());
    assert!(dp.connection.connected_at.is_some());

    // The app dies: not ready within the detection bound, and every reader
    // says why: the API's reason, `hdsd explain`, one log line.
    app.stop();
    let dp = hdsd.wait_inbound("default.web-01", 10001, "unhealthy", DETECTION);
    assert!(!dp.inbounds[0].health.ready);
    let reason = dp.inbounds[0].health.reason.clone().expect("a reason");
    assert_eq!(reason.code, "probe_failing", "{reason:?}");
    assert!(
        reason
            .message
            .contains(&format!("the tcp check of 127.0.0.1:{}", app.port)),
        "{reason:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["explain", "default", "web-01", "--api", &hdsd.api_url("")])
        .output()
        .expect("run hdsd explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for part in [
        "default.web-01: NOT READY (0/1 inbounds ready)",
        "Envoy: connected since",
        &format!("checked: tcp of 127.0.0.1:{} every", app.port),
        "failing in a row, last healthy",
        "why (probe_failing): Envoy default.web-01 reports the tcp check",
        "healthy -> unhealthy at",
    ] {
        assert!(text.contains(part), "{part}\n---\n{text}");
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["explain", "default", "nope", "--api", &hdsd.api_url("")])
        .output()
        .expect("run hdsd explain");
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no such item (HTTP 404)"), "{err}");

    // It comes back on the same port: ready again.
    app.resume();
    let dp = hdsd.wait_inbound("default.web-01", 10001, "healthy", DETECTION);
    assert_eq!(
        dp.inbounds[0].health.reason, None,
        "ready: nothing to explain"
    );
    // The journal: a connect and each readiness change, one line each.
    let log = hdsd.log();
    for line in [
        "Envoy connected dataplane=default.web-01",
        "inbound ready dataplane=default.web-01 port=10001 from=\"pending\" to=\"healthy\"",
        "inbound not ready dataplane=default.web-01 port=10001 from=\"healthy\" to=\"unhealthy\"",
        "inbound ready dataplane=default.web-01 port=10001 from=\"unhealthy\" to=\"healthy\"",
    ] {
        assert!(log.contains(line), "{line}\n---\n{log}");
    }
}

#[test]
fn two_inbounds_one_app_down_only_that_one_is_not_ready() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let a = App::start();
    let mut b = App::start();
    hdsd.write_dataplane(
        "api.yaml",
        &dataplane_yaml("api", &[(10001, a.port), (10002, b.port)]),
    );
    let _envoy = Envoy::start(hdsd.hds, "default.api", None);
    hdsd.wait_inbound("default.api", 10001, "healthy", CONNECT);
    hdsd.wait_inbound("default.api", 10002, "healthy", CONNECT);

    b.stop();
    let dp = hdsd.wait_inbound("default.api", 10002, "unhealthy", DETECTION);
    assert!(
        dp.inbounds[0].health.ready,
        "the other inbound stays ready: {dp:?}"
    );
    assert_eq!(dp.inbounds[0].health.status, "healthy");

    // ?ready=false lists the dataplane, ?ready=true does not.
    assert_eq!(hdsd.dataplanes("?ready=false").unwrap().len(), 1);
    assert_eq!(hdsd.dataplanes("?ready=true").unwrap().len(), 0);
}

#[test]
fn file_edits_reach_the_live_envoy_without_a_restart() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let a = App::start();
    let b = App::start();
    let c = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, a.port)]));
    let mut envoy = Envoy::start(hdsd.hds, "default.web", None);
    let pid = envoy.pid();
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);

    // Add an inbound: it is pending (not ready) until Envoy reports it.
    hdsd.write_dataplane(
        "web.yaml",
        &dataplane_yaml("web", &[(10001, a.port), (10002, b.port)]),
    );
    let dp = wait_for("the new inbound", Duration::from_secs(5), || {
        let dp = hdsd.dataplane("default.web")?;
        if dp.inbounds.len() == 2 {
            Ok(dp)
        } else {
            Err(format!("{dp:?}"))
        }
    });
    let new = &dp.inbounds[1].health;
    if new.last_report_at.is_none() {
        assert_eq!(new.status, "pending");
        assert!(!new.ready);
    }
    assert_eq!(
        dp.inbounds[0].health.status, "healthy",
        "the unchanged inbound keeps its state"
    );
    hdsd.wait_inbound("default.web", 10002, "healthy", DETECTION);

    // Change the first inbound's servicePort: pending until reported, then healthy.
    let since_before = dp.inbounds[0].health.since;
    hdsd.write_dataplane(
        "web.yaml",
        &dataplane_yaml("web", &[(10001, c.port), (10002, b.port)]),
    );
    let dp = wait_for("the changed servicePort", Duration::from_secs(5), || {
        let dp = hdsd.dataplane("default.web")?;
        if dp.inbounds[0].service_port == c.port {
            Ok(dp)
        } else {
            Err(format!("{dp:?}"))
        }
    });
    let changed = &dp.inbounds[0].health;
    assert!(
        changed.since > since_before,
        "a new target starts over: {changed:?}"
    );
    if changed.last_report_at.is_none() || changed.last_report_at < Some(changed.since) {
        assert_eq!(changed.status, "pending");
    }
    hdsd.wait_inbound("default.web", 10001, "healthy", DETECTION);
    assert!(envoy.is_running());
    assert_eq!(envoy.pid(), pid, "the same Envoy process, never restarted");

    // Delete the file: Envoy gets an empty specifier and the dataplane is gone.
    hdsd.remove_dataplane("web.yaml");
    wait_for(
        "the dataplane to disappear",
        Duration::from_secs(5),
        || match hdsd.dataplane("default.web") {
            Err(_) => Ok(()),
            Ok(dp) => Err(format!("{dp:?}")),
        },
    );
}

#[test]
fn unknown_dataplane_is_served_when_its_file_appears_within_the_grace() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = App::start();
    let _envoy = Envoy::start(hdsd.hds, "default.late", None);
    wait_for("hdsd to hold the unknown stream", CONNECT, || {
        match hdsd.metric("hdsd_streams_waiting") {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("{other:?} streams waiting")),
        }
    });
    hdsd.write_dataplane("late.yaml", &dataplane_yaml("late", &[(10001, app.port)]));
    hdsd.wait_inbound("default.late", 10001, "healthy", CONNECT);
}

#[test]
fn unknown_dataplane_gets_not_found_with_instructions_after_the_grace() {
    let hdsd = Hdsd::start_with(|c| c.hds.unknown_dataplane_grace = Duration::from_secs(1));
    let envoy = Envoy::start(hdsd.hds, "default.ghost", None);
    // Envoy logs the (percent-encoded) status of the closed stream.
    let line = wait_for("Envoy to be told NOT_FOUND", CONNECT, || {
        envoy
            .log()
            .lines()
            .map(percent_decode)
            .find(|l| l.contains("StreamHealthCheck gRPC config stream closed"))
            .ok_or_else(|| "not yet".to_string())
    });
    assert!(
        line.contains("closed: 5, "),
        "gRPC status 5 (NOT_FOUND): {line}"
    );
    assert!(
        line.contains("dataplane default.ghost is not registered"),
        "{line}"
    );
    let expected = "add ghost.yaml to the dataplanes directory";
    assert!(
        line.contains(expected) && !line.contains(&hdsd.dataplanes_dir().display().to_string()),
        "says which file to add, not where: {line}"
    );
    assert!(line.contains("name: ghost"), "with an example: {line}");
}

#[test]
fn broken_file_next_to_good_ones() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = App::start();
    hdsd.write_dataplane("good.yaml", &dataplane_yaml("good", &[(10001, app.port)]));
    let _envoy = Envoy::start(hdsd.hds, "default.good", None);
    hdsd.wait_inbound("default.good", 10001, "healthy", CONNECT);

    hdsd.write_dataplane(
        "broken.yaml",
        "type: Dataplane\nmesh: default\nname: broken\nnetworking:\n  address: db.internal\n",
    );
    let sources = wait_for(
        "the error in /api/v1/sources",
        Duration::from_secs(5),
        || {
            let v = hdsd.sources()?;
            if v.errors == 1 {
                Ok(v)
            } else {
                Err(format!("{v:?}"))
            }
        },
    );
    let broken = sources
        .files
        .iter()
        .find(|f| f.path.ends_with("broken.yaml"))
        .expect("broken.yaml listed");
    let error = broken.error.as_ref().expect("broken.yaml's error");
    assert!(error.message.contains("not an IP literal"), "{error:?}");
    assert!(error.line.is_some(), "{broken:?}");

    // Breaking the good file keeps its last good definition in force.
    hdsd.write_dataplane("good.yaml", "type: Dataplane\nmesh: [unclosed\n");
    wait_for("two broken files", Duration::from_secs(5), || {
        let v = hdsd.sources()?;
        if v.errors == 2 {
            Ok(())
        } else {
            Err(format!("{v:?}"))
        }
    });
    let dp = hdsd.wait_inbound("default.good", 10001, "healthy", DETECTION);
    assert!(dp.connection.connected);
    assert!(hdsd.log().contains("dataplane file rejected"));
    // `hdsd status` lists them as the page's banner does.
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["status", "--api", &hdsd.api_url("")])
        .output()
        .expect("run hdsd status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Broken dataplane files (2;"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("broken.yaml line") && l.contains("not an IP literal")),
        "{text}"
    );
}

#[test]
fn an_idle_server_does_not_reload_because_of_its_own_reads() {
    let hdsd = Hdsd::start_with(|c| c.auth.mode = AuthMode::Token);
    let app = App::start();
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    hdsd.wait_inbound("default.web", 10001, "pending", Duration::from_secs(5));
    hdsd.cli(&["token", "revoke", "0123456789abcdef"]);
    let reloads = || {
        let log = hdsd.log();
        (
            log.matches("dataplanes directory changed; reloading")
                .count(),
            log.matches("keys or revocations changed; reloading")
                .count(),
        )
    };
    wait_for(
        "both watchers to react once",
        Duration::from_secs(5),
        || {
            let (d, k) = reloads();
            if d >= 1 && k >= 1 {
                Ok(())
            } else {
                Err(format!("{d} directory, {k} key reloads"))
            }
        },
    );
    // Settle: a burst may still be in flight.
    let settled = reloads();
    let quiet_until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < quiet_until {
        std::thread::park_timeout(Duration::from_millis(100));
    }
    let after = reloads();
    assert!(
        after.0 <= settled.0 + 1 && after.1 <= settled.1 + 1,
        "no reload loop: {settled:?} -> {after:?}"
    );
}

#[test]
fn api_tokens_protect_the_rest_api_but_not_metrics_and_probes() {
    let hdsd = Hdsd::start_with(|c| c.api.tokens = vec!["s3cret".into()]);
    let get = |path: &str, token: Option<&str>| {
        let mut request = ureq::get(&hdsd.api_url(path));
        if let Some(t) = token {
            request = request.header("Authorization", &format!("Bearer {t}"));
        }
        let mut response = request
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .unwrap();
        (
            response.status().as_u16(),
            response.body_mut().read_to_string().unwrap(),
        )
    };
    let (code, body) = get("/api/v1/dataplanes", None);
    assert_eq!(code, 401);
    assert!(body.contains("Authorization: Bearer"), "{body}");
    assert_eq!(get("/api/v1/dataplanes", Some("wrong")).0, 401);
    assert_eq!(get("/api/v1/sources", Some("s3cret")).0, 200);
    assert_eq!(get("/api/v1/dataplanes", Some("s3cret")).0, 200);
    for open in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(open, None).0, 200, "{open}");
    }
    // `hdsd status` passes the token.
    let api = format!("http://{}", hdsd.api);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["status", "--api", &api, "--api-token", "s3cret"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 dataplanes"));
}
