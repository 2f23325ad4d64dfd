//! Readiness moves traffic: a real front Envoy, from `hdsd bootstrap front`,
//! takes the endpoints of service `web` from hdsd's EDS. Three HTTP apps,
//! each with its dataplane and its own HDS Envoy. A client sends ~50
//! requests/s through the front for the whole test: not one may fail.

use std::time::{Duration, Instant};

use crate::support::front::{hits_of, Client, Front, FrontOptions};
use crate::support::*;

/// unhealthy_threshold (2) x interval (200ms) + timeout (100ms) + report
/// interval (200ms), the worst case `hdsd validate` prints for these settings.
const DETECTION: Duration = Duration::from_millis(700);

fn web_dataplane(name: &str, port: u16) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: {port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: web}}\n"
    )
}

#[test]
fn traffic_follows_readiness_without_a_failed_request() {
    let mut hdsd = Hdsd::start(HdsdOptions::default());
    let mut apps: Vec<HttpApp> = (1..=3)
        .map(|i| HttpApp::start(&format!("app-{i}")))
        .collect();
    let mut envoys = Vec::new();
    for app in &apps {
        hdsd.write_dataplane(
            &format!("{}.yaml", app.name),
            &web_dataplane(&app.name, app.port),
        );
        envoys.push(Envoy::start(
            hdsd.hds,
            &format!("default.{}", app.name),
            None,
        ));
    }
    for app in &apps {
        hdsd.wait_inbound(
            &format!("default.{}", app.name),
            app.port,
            "healthy",
            Duration::from_secs(20),
        );
    }

    let front = Front::start(&hdsd.hds.to_string(), FrontOptions::default());
    let url = format!("http://127.0.0.1:{}/", front.listener);
    wait_for("the front to route to web", Duration::from_secs(20), || {
        ureq::get(&url)
            .call()
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let mut client = Client::start(url);

    // All three apps receive traffic.
    wait_for("every app to get traffic", Duration::from_secs(10), || {
        let hits: Vec<u64> = apps.iter().map(|a| client.hits(&a.name)).collect();
        if hits.iter().all(|h| *h > 0) {
            Ok(())
        } else {
            Err(format!("{hits:?}"))
        }
    });

    // app-2 stops: within the detection time + 1 s the front has marked it
    // unhealthy (from EDS) and opens no more connections to it.
    let port2 = apps[1].port;
    let stopped = Instant::now();
    apps[1].stop();
    wait_for(
        "the front to mark app-2 unhealthy",
        DETECTION + Duration::from_secs(1),
        || {
            let host = front.host(port2)?;
            match host.get("health_flags") {
                Some(f) if f.contains("failed_eds_health") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    let detected = stopped.elapsed();
    let connections = front.connections_to(port2);
    let before: u64 = apps.iter().map(|a| client.hits(&a.name)).sum();
    wait_for("another second of traffic", Duration::from_secs(5), || {
        let now: u64 = apps.iter().map(|a| client.hits(&a.name)).sum();
        if now >= before + 40 {
            Ok(())
        } else {
            Err(format!("{now} requests"))
        }
    });
    assert_eq!(
        front.connections_to(port2),
        connections,
        "the front still tries app-2 after it was marked unhealthy"
    );
    assert!(client.failures().is_empty(), "{:?}", client.failures());
    eprintln!("app-2 left the front's load-balancing set {detected:?} after it stopped");

    // app-2 comes back on its port: it gets traffic again.
    let before = client.hits("app-2");
    let back = Instant::now();
    apps[1].resume();
    wait_for(
        "app-2 to get traffic again",
        DETECTION + Duration::from_secs(1),
        || {
            let hits = client.hits("app-2");
            if hits > before {
                Ok(())
            } else {
                Err(format!("{hits} hits"))
            }
        },
    );
    eprintln!(
        "app-2 got traffic again {:?} after it restarted",
        back.elapsed()
    );

    // hdsd restarts: the front keeps its endpoints, reconnects, and routes on.
    hdsd.terminate(Duration::from_secs(10));
    let mid: Vec<u64> = apps.iter().map(|a| client.hits(&a.name)).collect();
    hdsd.start_again();
    // Reconnected: the new hdsd has an EDS stream and has answered it.
    wait_for(
        "the front's EDS stream to reconnect and get its assignment",
        Duration::from_secs(15),
        || match (
            hdsd.metric("hdsd_eds_streams_active"),
            hdsd.metric("hdsd_eds_pushes_total"),
        ) {
            (Some(streams), Some(pushes)) if streams >= 1.0 && pushes >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    wait_for(
        "every app to get traffic after the restart",
        Duration::from_secs(10),
        || {
            let hits: Vec<u64> = apps.iter().map(|a| client.hits(&a.name)).collect();
            if hits.iter().zip(&mid).all(|(now, then)| now > then) {
                Ok(())
            } else {
                Err(format!("{hits:?} (before the restart: {mid:?})"))
            }
        },
    );
    client.stop();
    let failures = client.failures();
    assert!(
        failures.is_empty(),
        "{} failed requests: {failures:?}",
        failures.len()
    );
    drop(front.envoy);
}

/// `eds.endpoint_stale_after`: Envoy drops an assignment it has not
/// received again within it (and answers 503), so hdsd re-sends every
/// assignment every third of it. Proven on the real front: its stale timer
/// is re-armed by the re-sends and never fires while hdsd runs; with hdsd
/// frozen (SIGSTOP) it fires and the front answers 503; thawed, the next
/// re-send brings the endpoints back.
#[test]
fn re_sends_keep_a_front_with_endpoint_stale_after_from_going_stale() {
    let hdsd = Hdsd::start_with(|c| c.eds.endpoint_stale_after = Some(Duration::from_secs(1)));
    let app = HttpApp::start("app-1");
    hdsd.write_dataplane("app-1.yaml", &web_dataplane(&app.name, app.port));
    let _envoy = Envoy::start(hdsd.hds, "default.app-1", None);
    hdsd.wait_inbound(
        "default.app-1",
        app.port,
        "healthy",
        Duration::from_secs(20),
    );
    let front = Front::start(&hdsd.hds.to_string(), FrontOptions::default());
    let url = format!("http://127.0.0.1:{}/", front.listener);
    let answers = || -> Result<(), String> {
        ureq::get(&url)
            .call()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    wait_for(
        "the front to route to web",
        Duration::from_secs(20),
        answers,
    );

    // Three stale windows of re-sends (one every ~333 ms): the timer was
    // re-armed each time and never fired.
    let received = front.cluster_stat("assignment_timeout_received").unwrap();
    wait_for("nine re-sent assignments", Duration::from_secs(10), || {
        let now = front.cluster_stat("assignment_timeout_received")?;
        if now >= received + 9 {
            Ok(())
        } else {
            Err(format!("{now} received (from {received})"))
        }
    });
    assert_eq!(front.cluster_stat("assignment_stale").unwrap(), 0);
    answers().expect("the front still routes");
    let refreshes = hdsd.metric("hdsd_eds_refreshes_total").unwrap_or(0.0);
    assert!(refreshes >= 9.0, "hdsd_eds_refreshes_total {refreshes}");

    // Frozen hdsd: nothing re-sent, the front's assignment goes stale.
    let frozen = Instant::now();
    signal_hdsd(&hdsd, "-STOP");
    let went = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            "the front's assignment to go stale",
            Duration::from_secs(4),
            || match front.cluster_stat("assignment_stale")? {
                0 => Err("not stale yet".into()),
                _ => Ok(()),
            },
        );
        wait_for(
            "the front to answer 503",
            Duration::from_secs(2),
            || match answers() {
                Ok(()) => Err("still answered".into()),
                Err(e) if e.contains("503") => Ok(()),
                Err(e) => Err(e),
            },
        );
    }));
    let stale_after = frozen.elapsed();
    signal_hdsd(&hdsd, "-CONT");
    if let Err(e) = went {
        std::panic::resume_unwind(e);
    }
    eprintln!("the front went stale {stale_after:?} after hdsd froze (endpoint_stale_after 1s)");
    wait_for("the front to route again", Duration::from_secs(5), answers);
}

fn signal_hdsd(hdsd: &Hdsd, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &hdsd.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig}");
}

/// A dataplane `web` with one inbound per app; `not_ready` are declared
/// `state: NotReady`.
fn web_declaring(apps: &[&HttpApp], not_ready: &[&HttpApp]) -> String {
    let mut text = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n".to_string();
    for app in apps {
        text.push_str(&format!(
            "  - port: {p}\n    servicePort: {p}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: web}}\n",
            p = app.port
        ));
        if not_ready.iter().any(|n| n.port == app.port) {
            text.push_str("    state: NotReady\n");
        }
    }
    text
}

/// The operator's word reaches EDS: an inbound declared `state: NotReady`
/// whose checks pass reads not ready in the API and gets no request
/// through a real front Envoy, which holds it DRAINING. Declared ready
/// again it gets traffic (it is reachable); NotReady again, none.
#[test]
fn a_declared_not_ready_inbound_whose_checks_pass_gets_no_traffic() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let (ready, held) = (HttpApp::start("app-1"), HttpApp::start("app-2"));
    hdsd.write_dataplane("web.yaml", &web_declaring(&[&ready, &held], &[&held]));
    let _envoy = Envoy::start(hdsd.hds, "default.web", None);
    for app in [&ready, &held] {
        hdsd.wait_inbound("default.web", app.port, "healthy", Duration::from_secs(20));
    }
    let dp = hdsd.dataplane("default.web").unwrap();
    let inbound = dp.inbounds.iter().find(|i| i.port == held.port).unwrap();
    assert!(!inbound.health.ready, "{inbound:?}");
    assert_eq!(
        inbound.operator_word,
        Some(hdsd::operator::OperatorWord::DeclaredNotReady)
    );

    let front = Front::start(&hdsd.hds.to_string(), FrontOptions::default());
    let url = format!("http://127.0.0.1:{}/", front.listener);
    wait_for(
        "the front to hold both endpoints",
        Duration::from_secs(20),
        || {
            let host = front.host(ready.port)?;
            front.host(held.port)?;
            match host.get("health_flags").map(String::as_str) {
                Some("healthy") => Ok(()),
                other => Err(format!("app-1: {other:?}")),
            }
        },
    );
    let hits = hits_of(&url, 100);
    assert_eq!(
        hits.get("app-2"),
        None,
        "the declared NotReady inbound got traffic: {hits:?}"
    );
    assert_eq!(hits.get("app-1"), Some(&100), "{hits:?}");
    front.draining(held.port).unwrap();

    // Declared ready again: it is reachable, and gets traffic.
    hdsd.write_dataplane("web.yaml", &web_declaring(&[&ready, &held], &[]));
    wait_for("app-2 to get traffic", Duration::from_secs(10), || {
        let hits = hits_of(&url, 10);
        hits.get("app-2")
            .map(|_| ())
            .ok_or_else(|| format!("{hits:?}"))
    });

    // NotReady again: once the front holds it draining, not one request.
    hdsd.write_dataplane("web.yaml", &web_declaring(&[&ready, &held], &[&held]));
    wait_for(
        "the front to hold app-2 draining",
        Duration::from_secs(10),
        || front.draining(held.port),
    );
    let hits = hits_of(&url, 100);
    assert_eq!(hits.get("app-2"), None, "{hits:?}");
}
