//! Readiness moves traffic across zones: a global and two zones (eu-1,
//! us-1), each zone one hdsd, one Envoy and two HTTP apps; a front Envoy in
//! eu-1 takes service `web` from the global's EDS (`hdsd bootstrap front
//! --zone eu-1`). A client sends ~50 requests/s through the front for the
//! whole test.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::front::{hits_of, Client, Front, FrontOptions};
use crate::support::zones::Topology;
use crate::support::*;

/// Detection at a zone (see eds_envoy) plus the trip to the global.
const DETECTION: Duration = Duration::from_millis(700);
const CONNECT: Duration = Duration::from_secs(20);
const FRONT_TOKEN: &str = "front-secret";

/// A dataplane `web` with one inbound per app, all of service `web`.
fn web(apps: &[&HttpApp]) -> String {
    let mut text = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n".to_string();
    for app in apps {
        text.push_str(&format!(
            "  - port: {p}\n    servicePort: {p}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: web}}\n",
            p = app.port
        ));
    }
    text
}

/// Hits per zone (by the apps' name prefix) since `before`.
fn by_zone(now: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> (u64, u64) {
    let mut eu = 0;
    let mut us = 0;
    for (app, n) in now {
        let d = n - before.get(app).copied().unwrap_or(0);
        if app.starts_with("eu-") {
            eu += d;
        } else {
            us += d;
        }
    }
    (eu, us)
}

/// Waits until the client has sent at least `n` requests more than at `before`.
fn requests_after(client: &Client, before: &BTreeMap<String, u64>, n: u64) -> (u64, u64) {
    wait_for(
        &format!("{n} more requests"),
        Duration::from_secs(60),
        || {
            let (eu, us) = by_zone(&client.all_hits(), before);
            if eu + us >= n {
                Ok((eu, us))
            } else {
                Err(format!("eu {eu}, us {us}"))
            }
        },
    )
}

/// Waits until every request of a 200 ms window goes to `zone`.
fn all_in(client: &Client, zone: &str, timeout: Duration) {
    wait_for(&format!("every request going to {zone}"), timeout, || {
        let before = client.all_hits();
        std::thread::sleep(Duration::from_millis(200));
        let (eu, us) = by_zone(&client.all_hits(), &before);
        let (here, elsewhere) = if zone == "eu-1" { (eu, us) } else { (us, eu) };
        if elsewhere == 0 && here > 0 {
            Ok(())
        } else {
            Err(format!("eu {eu}, us {us}"))
        }
    });
}

/// The whole failover story on real Envoys, with Envoy's default factor (140).
#[test]
fn a_front_fails_over_to_the_other_zone_by_readiness_without_a_failed_request() {
    // eu-1 dials the global directly, us-1 through a relay the test cuts.
    let (mut global, [eu, us]) = Topology::new()
        .global_with(|c| {
            c.eds.tokens = vec![FRONT_TOKEN.into()];
            c.eds.overprovisioning_factor = 140;
        })
        .zone("eu-1")
        .zone_through_relay("us-1")
        .start();
    let relay = us.relay.as_ref().unwrap();
    let (mut eu_a, mut eu_b) = (HttpApp::start("eu-a"), HttpApp::start("eu-b"));
    let (us_a, us_b) = (HttpApp::start("us-a"), HttpApp::start("us-b"));
    eu.write_dataplane("web.yaml", &web(&[&eu_a, &eu_b]));
    us.write_dataplane("web.yaml", &web(&[&us_a, &us_b]));
    let _eu_envoy = Envoy::start(eu.hds, "default.web", None);
    let _us_envoy = Envoy::start(us.hds, "default.web", None);
    for z in [&eu, &us] {
        wait_for("the zone's inbounds ready", CONNECT, || {
            let dp = z.dataplane("default.web")?;
            if dp.inbounds.iter().all(|i| i.health.ready) {
                Ok(())
            } else {
                Err(format!("{dp:?}"))
            }
        });
    }

    let front = Front::start(
        &global.hds.to_string(),
        FrontOptions {
            zone: Some("eu-1".into()),
            token: Some(FRONT_TOKEN.into()),
        },
    );
    let url = format!("http://127.0.0.1:{}/", front.listener);
    // The front's zone first: once its endpoints are in, eu-1 takes it all.
    wait_for("the front to see eu-1's endpoints healthy", CONNECT, || {
        for app in [&eu_a, &eu_b, &us_a, &us_b] {
            let host = front.host(app.port)?;
            if host.get("health_flags").map(String::as_str) != Some("healthy") {
                return Err(format!("{}: {host:?}", app.name));
            }
        }
        Ok(())
    });
    let client = Client::start(url);
    let start = client.all_hits();
    let (eu_hits, us_hits) = requests_after(&client, &start, 100);
    assert_eq!(
        us_hits, 0,
        "us-1 got traffic while eu-1 was healthy ({eu_hits} in eu-1)"
    );

    // Both of eu-1's apps stop: traffic moves to us-1, not one request fails.
    eu_a.stop();
    eu_b.stop();
    let stopped = Instant::now();
    all_in(&client, "us-1", DETECTION + Duration::from_secs(5));
    let moved = stopped.elapsed();
    println!("traffic moved to us-1 {moved:?} after eu-1's apps stopped");
    assert!(
        moved <= DETECTION + Duration::from_secs(1) + Duration::from_millis(200),
        "{moved:?}"
    );
    assert!(client.failures().is_empty(), "{:?}", client.failures());

    // Back: eu-1 takes everything again.
    eu_a.resume();
    eu_b.resume();
    all_in(&client, "eu-1", CONNECT);

    // One of eu-1's two apps stops: 50 % healthy x 1.4 = 70 % stays in
    // eu-1 and 30 % spills to us-1 (health_status is real).
    eu_b.stop();
    wait_for("the front to mark eu-b unhealthy", CONNECT, || {
        let host = front.host(eu_b.port)?;
        match host.get("health_flags") {
            Some(f) if f.contains("failed_eds_health") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let before = client.all_hits();
    let (eu_hits, us_hits) = requests_after(&client, &before, 300);
    let spill = us_hits as f64 / (eu_hits + us_hits) as f64;
    println!("one of two eu-1 apps down: {eu_hits} requests in eu-1, {us_hits} in us-1 ({:.1} % spilled)", spill * 100.0);
    assert!(
        (0.2..=0.4).contains(&spill),
        "expected ~30 % in us-1, got {spill:.3}"
    );
    assert!(client.failures().is_empty(), "{:?}", client.failures());

    // eu-1 all down again, and us-1 cut from the global: after the zone
    // timeout its endpoints are degraded (eds.offline_zone), and the front,
    // with nothing healthy left, keeps being served by them.
    eu_a.stop();
    all_in(&client, "us-1", CONNECT);
    relay.cut();
    wait_for(
        "us-1's endpoints degraded at the front",
        Duration::from_secs(10),
        || {
            let host = front.host(us_a.port)?;
            match host.get("health_flags") {
                Some(f) if f.contains("degraded_eds_health") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    let before = client.all_hits();
    let (_, us_hits) = requests_after(&client, &before, 100);
    assert!(us_hits >= 100, "served by us-1's degraded endpoints");
    assert!(client.failures().is_empty(), "{:?}", client.failures());

    // The global dies: the front routes on its last assignment.
    global.kill();
    let before = client.all_hits();
    let (_, us_hits) = requests_after(&client, &before, 100);
    assert!(us_hits >= 100);
    assert!(client.failures().is_empty(), "{:?}", client.failures());
    relay.heal();
    global.start_again();

    // The global back, holding nothing of its zones: it answers the front
    // only once both zones' snapshots are in, so no assignment it sends
    // lacks us-1 (its endpoints never leave the front) and pushes resume
    // (eu-1's apps back: the front routes to eu-1 again).
    let restarted = Instant::now();
    eu_a.resume();
    eu_b.resume();
    wait_for(
        "the front to route to eu-1 again after the global's restart",
        CONNECT,
        || {
            for app in [&us_a, &us_b] {
                if let Err(e) = front.host(app.port) {
                    panic!("an assignment lacked us-1 after the global's restart: {e}");
                }
            }
            for app in [&eu_a, &eu_b] {
                let host = front.host(app.port)?;
                if host.get("health_flags").map(String::as_str) != Some("healthy") {
                    return Err(format!("{}: {host:?}", app.name));
                }
            }
            Ok(())
        },
    );
    all_in(&client, "eu-1", CONNECT);
    println!(
        "after the global's restart, the front routed to eu-1 again {:?} after its apps came back",
        restarted.elapsed()
    );
    assert!(client.failures().is_empty(), "{:?}", client.failures());
    drop(front);
    drop(client);
}

/// The operator's word crosses zones: eu-1 declares one of its two
/// inbounds `state: NotReady` while its checks pass; the global reads it
/// not ready with the word, and its EDS holds it DRAINING, so a front in
/// eu-1 fed by the global sends it not one request.
#[test]
fn a_zone_s_declared_not_ready_inbound_gets_no_traffic_from_the_global() {
    let (global, [eu]) = Topology::new()
        .global_with(|c| c.eds.tokens = vec![FRONT_TOKEN.into()])
        .zone("eu-1")
        .start();
    let (eu_a, eu_b) = (HttpApp::start("eu-a"), HttpApp::start("eu-b"));
    let text = web(&[&eu_a, &eu_b]);
    let held = format!("servicePort: {}\n", eu_b.port);
    let text = text.replacen(&held, &format!("{held}    state: NotReady\n"), 1);
    eu.write_dataplane("web.yaml", &text);
    let _eu_envoy = Envoy::start(eu.hds, "default.web", None);
    for app in [&eu_a, &eu_b] {
        eu.wait_inbound("default.web", app.port, "healthy", CONNECT);
    }
    wait_for(
        "the global to hold eu-b not ready with the word",
        CONNECT,
        || {
            let v = global.get_json("/api/v1/dataplanes?zone=eu-1")?;
            let inbounds = v["items"][0]["inbounds"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let at = |port: u16| inbounds.iter().find(|i| i["port"] == port).cloned();
            match (at(eu_a.port), at(eu_b.port)) {
                (Some(a), Some(b))
                    if a["health"]["ready"] == true
                        && b["health"]["ready"] == false
                        && b["health"]["status"] == "healthy"
                        && b["operatorWord"]["kind"] == "declared_not_ready" =>
                {
                    Ok(())
                }
                _ => Err(v.to_string()),
            }
        },
    );

    let front = Front::start(
        &global.hds.to_string(),
        FrontOptions {
            zone: Some("eu-1".into()),
            token: Some(FRONT_TOKEN.into()),
        },
    );
    let url = format!("http://127.0.0.1:{}/", front.listener);
    wait_for("the front to hold eu-1's endpoints", CONNECT, || {
        let host = front.host(eu_a.port)?;
        front.host(eu_b.port)?;
        match host.get("health_flags").map(String::as_str) {
            Some("healthy") => Ok(()),
            other => Err(format!("eu-a: {other:?}")),
        }
    });
    let hits = hits_of(&url, 100);
    assert_eq!(
        hits.get("eu-b"),
        None,
        "eu-1's declared NotReady inbound got traffic through the global: {hits:?}"
    );
    assert_eq!(hits.get("eu-a"), Some(&100), "{hits:?}");
    front.draining(eu_b.port).unwrap();
    drop(front);
}
