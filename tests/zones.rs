//! Zones end to end: a global hdsd and zone hdsds, each zone with a real
//! Envoy probing a real application. Readiness crosses from a zone to the
//! global; a zone that stops talking (SIGSTOP: its process freezes, its
//! TCP connection stays open) is offline at the global within
//! `global.zone_timeout`; when it wakes it resumes without a snapshot and
//! the global never deletes its dataplanes; a zone the global does not know
//! is refused with the fix in the message.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::relay::Relay;
use crate::support::*;

/// The global's `zone_timeout` in these tests.
const ZONE_TIMEOUT: Duration = Duration::from_secs(2);
/// Envoy's first connect and first report.
const CONNECT: Duration = Duration::from_secs(20);

pub(crate) fn global() -> Hdsd {
    Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nzones = [\"eu-1\", \"us-1\"]\n"
            .to_string(),
        ..HdsdOptions::default()
    })
}

/// Issues a zone token at the global and writes it to a file of `dir`.
pub(crate) fn zone_token(global: &Hdsd, zone: &str, dir: &tempfile::TempDir) -> PathBuf {
    let token = global.cli(&["token", "issue", "--zone", zone, "--mesh", "default"]);
    let path = dir.path().join(format!("{zone}.token"));
    std::fs::write(&path, token.trim()).unwrap();
    path
}

pub(crate) fn zone(global: &Hdsd, name: &str, token: &std::path::Path) -> Hdsd {
    zone_at(
        global.zones.expect("the global's zone listener"),
        name,
        token,
    )
}

/// A zone that dials the global at `addr` (a relay, say).
fn zone_at(addr: std::net::SocketAddr, name: &str, token: &std::path::Path) -> Hdsd {
    Hdsd::start(HdsdOptions {
        extra: format!(
            "[zone]\nname = \"{name}\"\nglobal = [\"http://{addr}\"]\ntoken_file = {:?}\n",
            token.display().to_string()
        ),
        ..HdsdOptions::default()
    })
}

fn zones(global: &Hdsd) -> Vec<Value> {
    global.get_json("/api/v1/zones").unwrap()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn zone_state(global: &Hdsd, name: &str) -> Result<Value, String> {
    zones(global)
        .into_iter()
        .find(|z| z["name"] == name)
        .ok_or_else(|| format!("zone {name} not listed"))
}

/// The global's items of one zone.
fn remote_items(global: &Hdsd, zone: &str) -> Vec<Value> {
    global
        .get_json(&format!("/api/v1/dataplanes?zone={zone}"))
        .unwrap()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn wait_remote_ready(global: &Hdsd, zone: &str, name: &str, ready: bool, timeout: Duration) {
    wait_for(
        &format!("{zone}'s {name} to read ready={ready} at the global"),
        timeout,
        || {
            let items = remote_items(global, zone);
            let item = items
                .iter()
                .find(|i| i["name"] == name)
                .ok_or_else(|| format!("not listed: {items:?}"))?;
            let got = item["inbounds"][0]["health"]["ready"].as_bool();
            if got == Some(ready) {
                Ok(())
            } else {
                Err(format!("{item}"))
            }
        },
    );
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// The global's SSE watch (every zone), read on a thread: each event as
/// (event, data) until the stream ends (the global stops) or 120 s pass.
struct Follower {
    events: std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>,
}

impl Follower {
    fn start(global: &Hdsd) -> Follower {
        use std::io::{BufRead as _, BufReader};
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let url = global.api_url("/api/v1/watch");
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = events.clone();
        std::thread::spawn(move || {
            let response = ureq::get(&url)
                .config()
                .timeout_global(Some(Duration::from_secs(120)))
                .build()
                .call()
                .expect("GET /api/v1/watch at the global");
            let _ = tx.send(());
            let reader = BufReader::new(response.into_body().into_reader());
            let mut event = String::new();
            for line in reader.lines().map_while(Result::ok) {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    let data = serde_json::from_str(v.trim()).unwrap_or(Value::Null);
                    sink.lock()
                        .unwrap()
                        .push((std::mem::take(&mut event), data));
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the global's watch answers");
        let follower = Follower { events };
        follower.wait("the watch's synced", |e, _| e == "synced");
        follower
    }

    fn events(&self) -> Vec<(String, Value)> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (30 s at most) for an event `matches` accepts.
    fn wait(&self, what: &str, matches: impl Fn(&str, &Value) -> bool) -> Value {
        wait_for(what, Duration::from_secs(30), || {
            let events = self.events();
            events
                .iter()
                .find(|(e, d)| matches(e, d))
                .map(|(_, d)| d.clone())
                .ok_or_else(|| format!("{} events so far: {events:?}", events.len()))
        })
    }

    /// Waits for a zone_changed event of `zone` to `state`.
    fn wait_zone(&self, zone: &str, state: &str) -> Value {
        self.wait(&format!("a zone_changed event: {zone} {state}"), |e, d| {
            e == "zone_changed" && d["zone"]["name"] == zone && d["zone"]["state"] == state
        })
    }

    /// Fails if the watch ever said that a dataplane of `zone` was deleted
    /// one by one (a zone deletion is allowed).
    fn assert_no_dataplane_deleted(&self, zone: &str) {
        let deleted: Vec<_> = self
            .events()
            .into_iter()
            .filter(|(e, d)| e == "deleted" && d["dataplane"]["zone"] == zone)
            .collect();
        assert!(
            deleted.is_empty(),
            "the global's watch deleted a dataplane of {zone} one by one: {deleted:?}"
        );
    }

    /// Fails if the watch ever said that a dataplane of `zone` was deleted.
    fn assert_nothing_deleted(&self, zone: &str) {
        let deleted: Vec<_> = self
            .events()
            .into_iter()
            .filter(|(e, d)| {
                (e == "deleted" && d["dataplane"]["zone"] == zone)
                    || (e == "zone_deleted" && d["zone"]["name"] == zone)
            })
            .collect();
        assert!(
            deleted.is_empty(),
            "the global's watch deleted a dataplane of {zone} that still exists: {deleted:?}"
        );
    }
}

/// Two zones report to one global; readiness crosses; a frozen zone is
/// offline within its timeout while the other stays online; it resumes
/// when it wakes and nothing is deleted.
#[test]
fn two_zones_report_to_a_global_and_a_frozen_zone_is_offline_within_its_timeout() {
    let global = global();
    let tokens = tempfile::tempdir().unwrap();
    let (eu_token, us_token) = (
        zone_token(&global, "eu-1", &tokens),
        zone_token(&global, "us-1", &tokens),
    );
    let eu = zone(&global, "eu-1", &eu_token);
    let us = zone(&global, "us-1", &us_token);
    let mut eu_app = App::start();
    let us_app = App::start();
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, eu_app.port)]));
    us.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, us_app.port)]));
    let _eu_envoy = Envoy::start(eu.hds, "default.web", None);
    let _us_envoy = Envoy::start(us.hds, "default.web", None);

    // Each zone's readiness reaches the global, marked with its zone.
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    wait_remote_ready(&global, "us-1", "web", true, CONNECT);
    let item = &remote_items(&global, "eu-1")[0];
    assert_eq!(item["zone"]["name"], "eu-1", "{item}");
    assert_eq!(item["zone"]["state"], "online", "{item}");
    let eu_zone = zone_state(&global, "eu-1").unwrap();
    assert_eq!(eu_zone["state"], "online", "{eu_zone}");
    assert_eq!(eu_zone["dataplanes"], 1, "{eu_zone}");
    assert_eq!(eu_zone["snapshots"], 1, "{eu_zone}");
    // The zone says it is connected, in /readyz and the API.
    let readyz = ureq::get(&eu.api_url("/readyz"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    assert!(
        readyz.contains("zone eu-1: connected to the global"),
        "{readyz}"
    );

    every_reader_of_the_global_sees_both_zones(&global);
    // The global's watch carries both zones' dataplanes and zone states.
    let watch = Follower::start(&global);

    // The application dies: the global hears it from the zone.
    eu_app.stop();
    wait_remote_ready(&global, "eu-1", "web", false, CONNECT);
    let changed = watch.wait("eu-1's web not ready in the watch", |e, d| {
        e == "changed" && d["dataplane"]["zone"] == "eu-1" && d["dataplane"]["ready"] == false
    });
    assert_eq!(changed["dataplane"]["name"], "web", "{changed}");
    eu_app.resume();
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);

    // Freeze eu-1's hdsd: its TCP connection stays open, nothing arrives.
    signal(eu.pid(), "-STOP");
    let frozen = Instant::now();
    let offline = wait_for(
        "eu-1 to be offline at the global",
        ZONE_TIMEOUT + Duration::from_secs(5),
        || {
            let z = zone_state(&global, "eu-1")?;
            if z["state"] == "offline" {
                Ok(z)
            } else {
                Err(format!("{z}"))
            }
        },
    );
    let took = frozen.elapsed();
    println!("eu-1 offline {took:?} after SIGSTOP (zone_timeout {ZONE_TIMEOUT:?})");
    assert!(
        took <= ZONE_TIMEOUT + Duration::from_secs(1),
        "offline {took:?} after the zone froze: more than zone_timeout + 1 s"
    );
    // Its dataplane is still there, marked offline with its last readiness;
    // us-1 is unaffected.
    let items = remote_items(&global, "eu-1");
    assert_eq!(
        items.len(),
        1,
        "an offline zone's dataplanes stay: {items:?}"
    );
    assert_eq!(items[0]["zone"]["state"], "offline");
    assert_eq!(offline["withdrawn"], false, "{offline}");
    assert_eq!(zone_state(&global, "us-1").unwrap()["state"], "online");
    watch.wait_zone("eu-1", "offline");

    // Wake it: it reconnects and resumes (no second snapshot); its
    // dataplane is never absent meanwhile.
    signal(eu.pid(), "-CONT");
    let back = wait_for("eu-1 back online", Duration::from_secs(30), || {
        let items = remote_items(&global, "eu-1");
        assert_eq!(items.len(), 1, "a reconnect deleted something: {items:?}");
        let z = zone_state(&global, "eu-1")?;
        if z["state"] == "online" && z["streams"] == 2 {
            Ok(z)
        } else {
            Err(format!("{z}"))
        }
    });
    assert_eq!(back["resumes"], 1, "{back}");
    assert_eq!(back["snapshots"], 1, "{back}");
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    watch.wait_zone("eu-1", "online");
    watch.assert_nothing_deleted("eu-1");
    watch.assert_nothing_deleted("us-1");

    // The global's metrics say the same.
    let metrics = ureq::get(&global.api_url("/metrics"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    for line in [
        "hdsd_zone_state{zone=\"eu-1\",state=\"online\"} 1",
        "hdsd_zone_resumes_total{zone=\"eu-1\"} 1",
        "hdsd_zones{state=\"online\"} 2",
        "hdsd_zone_refusals_total{code=\"zone_timeout\"} 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in:\n{metrics}");
    }
}

/// The uplink status a zone shows once its code is `code`.
fn wait_uplink_code(zone: &Hdsd, code: &str, timeout: Duration) -> Value {
    wait_for(
        &format!("the zone's uplink to read {code}"),
        timeout,
        || {
            let v = zone.get_json("/api/v1/zones")?;
            let uplink = v["uplink"].clone();
            if uplink["code"] == code {
                Ok(uplink)
            } else {
                Err(format!("{v}"))
            }
        },
    )
}

fn problem_of(status: &Value) -> &str {
    status["problem"].as_str().unwrap_or_default()
}

/// Every refusal says what is wrong and what to do: an unregistered zone,
/// a disabled one, a dataplane token, a revoked zone token (whose stream
/// ends within a second).
#[test]
fn each_refusal_says_what_to_do() {
    let global = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nzones = [\"eu-1\"]\ndisabled = [\"off-1\"]\n"
            .to_string(),
        ..HdsdOptions::default()
    });
    let tokens = tempfile::tempdir().unwrap();

    let ap = zone(&global, "ap-1", &zone_token(&global, "ap-1", &tokens));
    let status = wait_uplink_code(&ap, "zone_unregistered", Duration::from_secs(20));
    assert!(
        problem_of(&status).contains("add it to global.zones"),
        "{status}"
    );
    assert_eq!(status["connected"], false);
    let readyz = ureq::get(&ap.api_url("/readyz"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    assert!(
        readyz.contains("zone ap-1: not connected to the global"),
        "{readyz}"
    );
    drop(ap);

    let off = zone(&global, "off-1", &zone_token(&global, "off-1", &tokens));
    let status = wait_uplink_code(&off, "zone_disabled", Duration::from_secs(20));
    assert!(
        problem_of(&status).contains("remove it from global.disabled"),
        "{status}"
    );
    let z = zone_state(&global, "off-1").unwrap();
    assert_eq!(z["state"], "disabled", "{z}");
    drop(off);

    // A dataplane token is not a zone token.
    let dp_token = tokens.path().join("dataplane.token");
    std::fs::write(&dp_token, global.issue_token("default.web", "1h")).unwrap();
    let wrong = zone(&global, "eu-1", &dp_token);
    let status = wait_uplink_code(&wrong, "unauthenticated", Duration::from_secs(20));
    assert!(problem_of(&status).contains("zone token"), "{status}");
    assert!(
        problem_of(&status).contains("hdsd token issue --zone"),
        "{status}"
    );
    drop(wrong);

    // A token for eu-1 in a zone named xx-1: the global knows it as eu-1
    // (the token says so); the zone stops and names both fixes.
    let misnamed = zone(&global, "xx-1", &zone_token(&global, "eu-1", &tokens));
    let status = wait_uplink_code(&misnamed, "zone_name_mismatch", Duration::from_secs(20));
    for part in [
        "\"eu-1\"",
        "zone.name is \"xx-1\"",
        "hdsd token issue --zone xx-1",
    ] {
        assert!(problem_of(&status).contains(part), "{part}: {status}");
    }
    drop(misnamed);

    // A revoked zone token ends its stream within a second.
    let token = zone_token(&global, "eu-1", &tokens);
    let eu = zone(&global, "eu-1", &token);
    wait_for("eu-1 connected", Duration::from_secs(20), || {
        let v = eu.get_json("/api/v1/zones")?;
        if v["uplink"]["connected"] == true {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    });
    let text = std::fs::read_to_string(&token).unwrap();
    let jti = global.jti_of(&text);
    let revoked_at = Instant::now();
    global.cli(&["token", "revoke", &jti]);
    let status = wait_uplink_code(&eu, "unauthenticated", Duration::from_millis(1500));
    println!(
        "stream ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    assert!(problem_of(&status).contains("revoked"), "{status}");
}

fn wait_zone(
    global: &Hdsd,
    name: &str,
    what: &str,
    timeout: Duration,
    f: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(&format!("zone {name} {what}"), timeout, || {
        let z = zone_state(global, name)?;
        if f(&z) {
            Ok(z)
        } else {
            Err(format!("{z}"))
        }
    })
}

/// A link cut while both sides keep running (the TCP connection stays
/// open, nothing crosses): the global reads the zone offline within its
/// timeout, the zone's own readiness never changes, and once the link heals
/// the zone resumes without a snapshot.
#[test]
fn a_cut_link_takes_the_zone_offline_and_healing_it_resumes_without_a_snapshot() {
    let global = global();
    let tokens = tempfile::tempdir().unwrap();
    let relay = Relay::start(global.zones.unwrap());
    let eu = zone_at(relay.addr, "eu-1", &zone_token(&global, "eu-1", &tokens));
    let app = App::start();
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let _envoy = Envoy::start(eu.hds, "default.web", None);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);

    relay.cut();
    let cut = Instant::now();
    wait_zone(
        &global,
        "eu-1",
        "offline",
        ZONE_TIMEOUT + Duration::from_secs(5),
        |z| z["state"] == "offline",
    );
    let took = cut.elapsed();
    println!("eu-1 offline {took:?} after the cut (zone_timeout {ZONE_TIMEOUT:?})");
    assert!(
        took <= ZONE_TIMEOUT + Duration::from_secs(1),
        "offline {took:?} after the cut"
    );
    // The zone's own Envoy and readiness are untouched by the cut.
    let local = eu.dataplane("default.web").unwrap();
    assert!(local.inbounds[0].health.ready, "{local:?}");
    assert!(local.connection.connected);

    relay.heal();
    let back = wait_zone(
        &global,
        "eu-1",
        "back online on a second stream",
        Duration::from_secs(30),
        |z| z["state"] == "online" && z["streams"] == 2,
    );
    assert_eq!(
        (back["resumes"].as_u64(), back["snapshots"].as_u64()),
        (Some(1), Some(1)),
        "{back}"
    );
    assert_eq!(remote_items(&global, "eu-1").len(), 1);
    assert!(
        eu.dataplane("default.web").unwrap().inbounds[0]
            .health
            .ready
    );
}

/// Restarting a zone never shows its dataplanes deleted at the global; a
/// global killed and started again gets every zone back within their
/// backoff.
#[test]
fn restarts_of_either_side_delete_nothing_at_the_global() {
    let mut global = global();
    let tokens = tempfile::tempdir().unwrap();
    let mut eu = zone(&global, "eu-1", &zone_token(&global, "eu-1", &tokens));
    let app = App::start();
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let _envoy = Envoy::start(eu.hds, "default.web", None);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    let watch = Follower::start(&global);

    // Restart the zone: a new process, a higher epoch; the global keeps the
    // dataplane from the first stream until the new stream's snapshot.
    eu.restart();
    wait_for("eu-1's second stream", Duration::from_secs(30), || {
        let items = remote_items(&global, "eu-1");
        assert_eq!(
            items.len(),
            1,
            "the dataplane left the global during a zone restart: {items:?}"
        );
        let z = zone_state(&global, "eu-1")?;
        if z["state"] == "online" && z["streams"] == 2 {
            Ok(())
        } else {
            Err(format!("{z}"))
        }
    });
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    // A watcher on the global never heard of a deletion.
    watch.assert_nothing_deleted("eu-1");

    // Kill the global and start it again: the zone reconnects.
    global.kill();
    global.start_again();
    let back = wait_zone(
        &global,
        "eu-1",
        "online after the global restarted",
        Duration::from_secs(30),
        |z| z["state"] == "online" && z["dataplanes"] == 1,
    );
    assert_eq!(back["snapshots"], 1, "{back}");
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    // The zone served its Envoy throughout.
    assert!(
        eu.dataplane("default.web").unwrap().inbounds[0]
            .health
            .ready
    );
}

/// REST services, gRPC (ListZones, ListDataplanes by zone, ListServices)
/// and `hdsd status` at a global with eu-1 and us-1, one ready `web`
/// dataplane each (the same name in both zones).
fn every_reader_of_the_global_sees_both_zones(global: &Hdsd) {
    use hdsd::consumers::pb;
    let services = global.get_json("/api/v1/services").unwrap();
    let web = &services["items"][0];
    assert_eq!(web["name"], "svc-10001", "{services}");
    assert_eq!(
        (web["inboundsReady"].as_u64(), web["dataplanes"].as_u64()),
        (Some(2), Some(2)),
        "{web}"
    );
    let zones: Vec<(String, u64, String)> = web["zones"]
        .as_array()
        .unwrap_or_else(|| panic!("no zones in {web}"))
        .iter()
        .map(|z| {
            (
                z["zone"].as_str().unwrap_or_default().to_string(),
                z["inboundsReady"].as_u64().unwrap_or(99),
                z["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        zones,
        [
            ("eu-1".to_string(), 1, "online".to_string()),
            ("us-1".to_string(), 1, "online".to_string())
        ]
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = pb::readiness_service_client::ReadinessServiceClient::connect(format!(
            "http://{}",
            global.api
        ))
        .await
        .expect("gRPC on the global's API port");
        let zones = client
            .list_zones(pb::ListZonesRequest {})
            .await
            .unwrap()
            .into_inner()
            .items;
        let states: Vec<(String, i32, u32)> = zones
            .iter()
            .map(|z| (z.name.clone(), z.state, z.inbounds_ready))
            .collect();
        let online = pb::ZoneState::Online as i32;
        assert_eq!(
            states,
            [("eu-1".into(), online, 1), ("us-1".into(), online, 1)]
        );
        let eu = client
            .list_dataplanes(pb::ListDataplanesRequest {
                zone: "eu-1".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(eu.len(), 1, "{eu:?}");
        let zone = eu[0]
            .zone
            .as_ref()
            .expect("a zone's dataplane names its zone");
        assert_eq!((zone.name.as_str(), zone.state), ("eu-1", online));
        assert!(eu[0].ready);
        let all = client
            .list_dataplanes(pb::ListDataplanesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(all.len(), 2, "both zones' web: {all:?}");
        let local = client
            .list_dataplanes(pb::ListDataplanesRequest {
                zone: "local".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        assert!(
            local.is_empty(),
            "the global has no dataplane of its own: {local:?}"
        );
        let services = client
            .list_services(pb::ListServicesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
        let zones: Vec<&str> = services[0].zones.iter().map(|z| z.zone.as_str()).collect();
        assert_eq!(zones, ["eu-1", "us-1"]);

        // The gRPC watch of one zone: its dataplane and its state.
        let mut watch = client
            .watch(pb::WatchRequest {
                zone: "us-1".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let first = watch.message().await.unwrap().expect("a snapshot");
        assert_eq!(first.r#type, pb::watch_event::Type::Snapshot as i32);
        let dataplanes: Vec<(&str, &str, bool)> = first
            .snapshot
            .iter()
            .map(|d| (d.zone.as_str(), d.name.as_str(), d.ready))
            .collect();
        assert_eq!(dataplanes, [("us-1", "web", true)], "{first:?}");
        let zones: Vec<(&str, i32)> = first
            .zones
            .iter()
            .map(|z| (z.name.as_str(), z.state))
            .collect();
        assert_eq!(zones, [("us-1", online)], "{first:?}");
    });

    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["status", "--api", &format!("http://{}", global.api)])
        .output()
        .expect("hdsd status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("eu-1/default.web") && text.contains("us-1/default.web"),
        "{text}"
    );
    let zones_part = text
        .split("Zones:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Zones: in {text}"));
    for zone in ["eu-1", "us-1"] {
        let line = zones_part
            .lines()
            .find(|l| l.contains(zone))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            line.contains("online") && line.contains("1/1 inbounds ready"),
            "{line}"
        );
    }
    // The filters and --json.
    let status = |args: &[&str]| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(["status", "--api", &format!("http://{}", global.api)])
            .args(args)
            .output()
            .expect("hdsd status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json: Value = serde_json::from_str(&status(&["--zone", "us-1", "--json"])).unwrap();
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{json}");
    assert_eq!(items[0]["zone"]["name"], "us-1", "{json}");
    assert_eq!(
        json["zones"]["items"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
    let text = status(&["--not-ready"]);
    assert!(
        text.contains("0 dataplanes"),
        "every dataplane is ready: {text}"
    );
}

/// The `[global]` table of the two-instance test.
const GLOBAL_EU: &str = "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nzones = [\"eu-1\"]\n";

/// A global of two instances on PostgreSQL, with the zone's stream on the
/// first: the second answers for the zone too (its dataplanes, ready, and
/// which instance holds the stream). Cut the zone off both: offline on both
/// within `zone_timeout` + 1 s. Heal: online again, resumed. Kill the
/// instance holding the stream: the zone moves to the other one and
/// resumes there without a snapshot, and no dataplane left the survivor's
/// view meanwhile. A zone token revoked through the store ends the stream
/// wherever it is held.
#[test]
fn two_global_instances_on_postgres_answer_for_every_zone() {
    use crate::support::postgres::Postgres;
    let Some(pg) = Postgres::start("two_global_instances_on_postgres_answer_for_every_zone") else {
        return;
    };
    let extra = format!(
        "[store]\nkind = \"postgres\"\n[store.postgres]\nurl = {:?}\nreconcile_interval = \"1s\"\n{GLOBAL_EU}",
        pg.url()
    );
    let options = || HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        env: vec![("HDSD_DATAPLANES__SOURCE".into(), "api".into())],
        extra: extra.clone(),
        ..HdsdOptions::default()
    };
    let mut g1 = Hdsd::start(options());
    let g2 = Hdsd::start(options());
    let tokens = tempfile::tempdir().unwrap();
    let token = zone_token(&g1, "eu-1", &tokens);
    let (r1, r2) = (
        Relay::start(g1.zones.unwrap()),
        Relay::start(g2.zones.unwrap()),
    );
    let eu = Hdsd::start(HdsdOptions {
        extra: format!(
            "[zone]\nname = \"eu-1\"\nglobal = [\"http://{}\", \"http://{}\"]\ntoken_file = {:?}\n",
            r1.addr,
            r2.addr,
            token.display().to_string()
        ),
        ..HdsdOptions::default()
    });
    let app = App::start();
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let _envoy = Envoy::start(eu.hds, "default.web", None);
    wait_remote_ready(&g1, "eu-1", "web", true, CONNECT);
    let seen = Instant::now();
    wait_remote_ready(&g2, "eu-1", "web", true, Duration::from_secs(5));
    println!(
        "web ready at the second instance {:?} after the first",
        seen.elapsed()
    );
    let on_g2 = zone_state(&g2, "eu-1").unwrap();
    assert_eq!(on_g2["state"], "online", "{on_g2}");
    assert!(
        on_g2["heldBy"]
            .as_str()
            .is_some_and(|h| h.ends_with(&format!("/{}", g1.pid()))),
        "the second instance names the first as the holder: {on_g2}"
    );
    let on_g1 = zone_state(&g1, "eu-1").unwrap();
    assert!(on_g1.get("heldBy").is_none(), "held here: {on_g1}");

    // Cut the zone off both instances: the TCP connections stay open.
    r1.cut();
    r2.cut();
    let cut = Instant::now();
    let mut offline = Vec::new();
    for g in [&g1, &g2] {
        wait_zone(
            g,
            "eu-1",
            "offline",
            ZONE_TIMEOUT + Duration::from_secs(5),
            |z| z["state"] == "offline",
        );
        offline.push(cut.elapsed());
    }
    println!(
        "eu-1 offline at the instances {offline:?} after the cut (zone_timeout {ZONE_TIMEOUT:?})"
    );
    for took in &offline {
        assert!(
            *took <= ZONE_TIMEOUT + Duration::from_secs(1),
            "offline {took:?} after the cut"
        );
    }
    assert!(
        eu.dataplane("default.web").unwrap().inbounds[0]
            .health
            .ready
    );

    // Heal: online on both again, and the stream resumed (no snapshot).
    r1.heal();
    r2.heal();
    for g in [&g1, &g2] {
        wait_zone(g, "eu-1", "online again", Duration::from_secs(30), |z| {
            z["state"] == "online"
        });
    }
    let resumes = |g: &Hdsd| {
        zone_state(g, "eu-1").unwrap()["resumes"]
            .as_u64()
            .unwrap_or(0)
    };
    let snapshots = |g: &Hdsd| {
        zone_state(g, "eu-1").unwrap()["snapshots"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_for(
        "a resume on either instance",
        Duration::from_secs(10),
        || {
            if resumes(&g1) + resumes(&g2) >= 1 {
                Ok(())
            } else {
                Err(format!(
                    "{:?} {:?}",
                    zone_state(&g1, "eu-1"),
                    zone_state(&g2, "eu-1")
                ))
            }
        },
    );
    assert_eq!(snapshots(&g1) + snapshots(&g2), 1, "one snapshot in all");

    // Kill the instance holding the stream: the zone moves to the
    // survivor and resumes there from what the shared store holds.
    let mut g2 = g2;
    let (holder, survivor) = if zone_state(&g1, "eu-1").unwrap().get("heldBy").is_none() {
        (&mut g1, &g2)
    } else {
        (&mut g2, &g1)
    };
    let before = zone_state(survivor, "eu-1").unwrap();
    holder.kill();
    let killed = Instant::now();
    let moved = wait_for("eu-1 held by the survivor", Duration::from_secs(40), || {
        let items = remote_items(survivor, "eu-1");
        assert_eq!(
            items.len(),
            1,
            "a dataplane left the survivor's view: {items:?}"
        );
        let z = zone_state(survivor, "eu-1")?;
        if z["state"] == "online" && z.get("heldBy").is_none() && z["streams"] != before["streams"]
        {
            Ok(z)
        } else {
            Err(format!("{z}"))
        }
    });
    println!(
        "eu-1 held by the survivor {:?} after the kill: {moved}",
        killed.elapsed()
    );
    assert_eq!(
        moved["resumes"].as_u64(),
        before["resumes"].as_u64().map(|r| r + 1),
        "resumed from the shared store: {moved}"
    );
    assert_eq!(
        moved["snapshots"], before["snapshots"],
        "no snapshot on the survivor: {moved}"
    );
    wait_remote_ready(survivor, "eu-1", "web", true, Duration::from_secs(5));

    // The killed instance comes back: it reads the zone back from the
    // store (its state, its holder, its dataplane) though the zone's stream
    // stays on the survivor.
    holder.start_again();
    let restarted = Instant::now();
    let back = wait_zone(
        holder,
        "eu-1",
        "read back from the store",
        Duration::from_secs(10),
        |z| z["state"] == "online" && z["dataplanes"] == 1 && z.get("heldBy").is_some(),
    );
    println!(
        "the restarted instance answers for eu-1 {:?} after its start: {back}",
        restarted.elapsed()
    );
    wait_remote_ready(holder, "eu-1", "web", true, Duration::from_secs(5));

    // A zone token revoked through the shared store ends the stream.
    let jti = survivor.jti_of(&std::fs::read_to_string(&token).unwrap());
    let revoked_at = Instant::now();
    survivor.cli(&["token", "revoke", &jti]);
    let status = wait_uplink_code(&eu, "unauthenticated", Duration::from_secs(3));
    println!(
        "stream ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    assert!(problem_of(&status).contains("revoked"), "{status}");
}

/// `cluster.instance_timeout` of the zone instances in
/// [`two_zone_instances_on_postgres_hold_one_uplink_and_take_it_over`].
const ZONE_INSTANCE_TIMEOUT: Duration = Duration::from_secs(1);

/// What a takeover may add to `cluster.instance_timeout`: the lease's
/// margin (50 ms), one query, and the new holder's first dial (its backoff
/// is fresh: no wait), with room for a loaded machine.
const TAKEOVER_SLACK: Duration = Duration::from_secs(1);

/// A zone instance's uplink, as `GET /api/v1/zones` shows it.
fn uplink_of(zone: &Hdsd) -> Result<Value, String> {
    Ok(zone.get_json("/api/v1/zones")?["uplink"].clone())
}

/// Waits until `zone`'s uplink reads `state` (and `holder`, when given).
fn wait_uplink_state(zone: &Hdsd, state: &str, holder: Option<&str>, timeout: Duration) -> Value {
    wait_for(
        &format!("the zone's uplink to read {state} (holder {holder:?})"),
        timeout,
        || {
            let u = uplink_of(zone)?;
            if u["state"] == state && holder.is_none_or(|h| u["holder"] == h) {
                Ok(u)
            } else {
                Err(format!("{u}"))
            }
        },
    )
}

/// A zone of two hdsd instances on one PostgreSQL: exactly one holds the
/// uplink lease and dials (one stream at the global, no `stale_epoch`
/// refusal), the other stands by, healthy, naming the holder, while the
/// holder sends the readiness of an Envoy attached to the standby. SIGKILL
/// the holder: the standby takes the uplink over within
/// `cluster.instance_timeout` + the takeover's slack, with a higher epoch;
/// the global's zone is online again at once and never lost a dataplane.
/// A rolling restart (SIGTERM of the holder) hands over at once: the
/// holder gives the lease up as it stops.
#[test]
fn two_zone_instances_on_postgres_hold_one_uplink_and_take_it_over() {
    use crate::support::postgres::Postgres;
    let Some(pg) =
        Postgres::start("two_zone_instances_on_postgres_hold_one_uplink_and_take_it_over")
    else {
        return;
    };
    // The global: heartbeats every second, a zone offline after 3 s of
    // silence, so a takeover within instance_timeout + slack keeps it online.
    let global = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"3s\"\nzones = [\"eu-1\"]\n"
            .to_string(),
        ..HdsdOptions::default()
    });
    let tokens = tempfile::tempdir().unwrap();
    let token = zone_token(&global, "eu-1", &tokens);
    let options = || {
        HdsdOptions {
        env: vec![("HDSD_DATAPLANES__SOURCE".into(), "api".into())],
        extra: format!(
            "[store]\nkind = \"postgres\"\n[store.postgres]\nurl = {:?}\nreconcile_interval = \"1s\"\n\
             [cluster]\ninstance_timeout = \"{}ms\"\nresume_slack = \"2s\"\n\
             [zone]\nname = \"eu-1\"\nglobal = [\"http://{}\"]\ntoken_file = {:?}\n",
            pg.url(),
            ZONE_INSTANCE_TIMEOUT.as_millis(),
            global.zones.unwrap(),
            token.display().to_string()
        ),
        ..HdsdOptions::default()
    }
    };

    // A starts alone and takes the uplink; B starts and stands by.
    let mut a = Hdsd::start(options());
    let on_a = wait_uplink_state(&a, "connected", None, Duration::from_secs(20));
    let a_name = on_a["holder"]
        .as_str()
        .expect("the holder's name")
        .to_string();
    assert!(a_name.ends_with(&format!("/{}", a.pid())), "{on_a}");
    let b = Hdsd::start(options());
    let on_b = wait_uplink_state(&b, "standby", Some(&a_name), Duration::from_secs(10));
    assert_eq!(on_b["connected"], false, "{on_b}");
    assert_eq!(on_b["epoch"], on_a["epoch"], "{on_b}");
    let (status, body) = b.readyz();
    assert_eq!(status, 200, "a standby instance is ready: {body}");
    assert!(
        body.contains("zone eu-1: standby since")
            && body.contains(&format!(
                "instance {a_name} holds the zone's uplink to the global"
            )),
        "{body}"
    );
    assert_eq!(b.metric("hdsd_uplink_state{state=\"standby\"}"), Some(1.0));
    assert_eq!(
        b.metric("hdsd_uplink_state{state=\"disconnected\"}"),
        Some(0.0)
    );
    assert_eq!(b.metric("hdsd_uplink_connected"), Some(0.0));
    assert_eq!(
        a.metric("hdsd_uplink_state{state=\"connected\"}"),
        Some(1.0)
    );

    // web is defined through A's API and its Envoy attaches to B: A sends
    // what B's Envoy reports (each instance's view is the whole zone's).
    let app = App::start();
    let yaml = dataplane_yaml("web", &[(10001, app.port)]);
    let (put, _, _) = crate::store_postgres::send(
        &a,
        "/api/v1/dataplanes/default/web",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(put, 200);
    let _envoy = Envoy::start(b.hds, "default.web", None);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    let watch = Follower::start(&global);
    // Held steady past the resume slack: A still connected, B still
    // standing by, the zone online. Then one more dataplane: the revision
    // the global holds is one B's change feed reaches back to, so B can
    // resume from it.
    hold_for("one uplink, on A", Duration::from_secs(3), || {
        let (on_a, on_b) = (uplink_of(&a)?, uplink_of(&b)?);
        let z = zone_state(&global, "eu-1")?;
        if on_a["state"] == "connected" && on_b["state"] == "standby" && z["state"] == "online" {
            Ok(())
        } else {
            Err(format!("A {on_a}, B {on_b}, at the global {z}"))
        }
    });
    let (put, _, _) = crate::store_postgres::send(
        &a,
        "/api/v1/dataplanes/default/db",
        Some(("application/yaml", &dataplane_yaml("db", &[(10002, 1)]))),
        &[],
    );
    assert_eq!(put, 200);
    wait_for("db at the global", Duration::from_secs(10), || {
        let n = remote_items(&global, "eu-1").len();
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n} dataplanes"))
        }
    });
    let before = zone_state(&global, "eu-1").unwrap();
    assert_eq!(before["state"], "online", "{before}");
    assert_eq!(before["instance"], a_name.as_str(), "one holder: {before}");
    assert_eq!(before["streams"], 1, "exactly one stream: {before}");
    wait_uplink_state(&b, "standby", Some(&a_name), Duration::from_secs(1));
    for code in ["stale_epoch", "superseded"] {
        assert_eq!(
            global
                .metric(&format!("hdsd_zone_refusals_total{{code=\"{code}\"}}"))
                .unwrap_or(0.0),
            0.0,
            "no {code} refusal at the global"
        );
    }

    // SIGKILL the holder: B takes the uplink over.
    a.kill();
    let killed = Instant::now();
    let taken = wait_uplink_state(&b, "connected", None, Duration::from_secs(20));
    let took = killed.elapsed();
    let b_name = taken["holder"]
        .as_str()
        .expect("the holder's name")
        .to_string();
    assert!(b_name.ends_with(&format!("/{}", b.pid())), "{taken}");
    assert!(
        taken["epoch"].as_u64() > on_a["epoch"].as_u64(),
        "a higher epoch: {taken} after {on_a}"
    );
    let moved = wait_zone(&global, "eu-1", "held by B", Duration::from_secs(5), |z| {
        z["state"] == "online" && z["instance"] == b_name.as_str()
    });
    println!(
        "B took the uplink over {took:?} after the SIGKILL of A (instance_timeout {ZONE_INSTANCE_TIMEOUT:?}): {moved}"
    );
    assert!(
        took <= ZONE_INSTANCE_TIMEOUT + TAKEOVER_SLACK,
        "the takeover took {took:?}, more than instance_timeout {ZONE_INSTANCE_TIMEOUT:?} + {TAKEOVER_SLACK:?}"
    );
    assert_eq!(moved["streams"], 2, "one stream more: {moved}");
    assert_eq!(
        moved["resumes"], 1,
        "the global held the zone complete and offered to resume: {moved}"
    );
    assert_eq!(
        moved["snapshots"], 1,
        "B resumed from A's revision: no snapshot but the first stream's: {moved}"
    );
    assert_eq!(moved["dataplanes"], 2, "{moved}");
    wait_remote_ready(&global, "eu-1", "web", true, Duration::from_secs(5));
    let offline: Vec<_> = watch
        .events()
        .into_iter()
        .filter(|(e, d)| {
            e == "zone_changed" && d["zone"]["name"] == "eu-1" && d["zone"]["state"] != "online"
        })
        .collect();
    println!("eu-1's state changes at the global during the takeover: {offline:?}");
    assert!(
        offline.is_empty(),
        "the zone stayed online through the takeover (zone_timeout 3s): {offline:?}"
    );
    watch.assert_nothing_deleted("eu-1");

    // A rolling restart: A comes back and stands by; SIGTERM B: it ends its
    // stream and gives the lease up as it stops, and A takes over at once,
    // without waiting for instance_timeout.
    a.start_again();
    let a_name = format!("{}/{}", a_name.rsplit_once('/').unwrap().0, a.pid());
    wait_uplink_state(&a, "standby", Some(&b_name), Duration::from_secs(10));
    signal(b.pid(), "-TERM");
    let stopping = Instant::now();
    let back = wait_uplink_state(&a, "connected", Some(&a_name), Duration::from_secs(10));
    let handed = stopping.elapsed();
    println!("A took the uplink over {handed:?} after the SIGTERM of B: {back}");
    // A dead holder is replaced after at least 3/4 of instance_timeout (its
    // silence since its last heartbeat, a quarter of the timeout at most).
    assert!(
        handed < ZONE_INSTANCE_TIMEOUT / 2,
        "a clean stop hands the uplink over at once, not after instance_timeout: {handed:?}"
    );
    let last = wait_zone(
        &global,
        "eu-1",
        "held by A again",
        Duration::from_secs(5),
        |z| z["state"] == "online" && z["instance"] == a_name.as_str(),
    );
    assert_eq!(last["streams"], 3, "{last}");
    watch.assert_nothing_deleted("eu-1");
    for code in ["stale_epoch", "superseded"] {
        assert_eq!(
            global
                .metric(&format!("hdsd_zone_refusals_total{{code=\"{code}\"}}"))
                .unwrap_or(0.0),
            0.0,
            "no {code} refusal at the global"
        );
    }

    // A frozen holder: B comes back and stands by; SIGSTOP A until B holds
    // the uplink, then SIGCONT A. A wakes believing it held the lease, but
    // a lease past its confirmed end is not held: A never dials with its
    // old epoch (the global would refuse it as stale_epoch) and stands by.
    let mut b = b;
    b.kill(); // reaps it: it stopped on its SIGTERM above
    b.start_again();
    let b_name = format!("{}/{}", b_name.rsplit_once('/').unwrap().0, b.pid());
    wait_uplink_state(&b, "standby", Some(&a_name), Duration::from_secs(10));
    signal(a.pid(), "-STOP");
    let frozen = Instant::now();
    let taken = wait_uplink_state(&b, "connected", Some(&b_name), Duration::from_secs(20));
    println!(
        "B took the uplink over {:?} after A froze: {taken}",
        frozen.elapsed()
    );
    wait_zone(&global, "eu-1", "held by B", Duration::from_secs(5), |z| {
        z["state"] == "online" && z["instance"] == b_name.as_str()
    });
    signal(a.pid(), "-CONT");
    hold_for("B's uplink after A woke", Duration::from_secs(2), || {
        let z = zone_state(&global, "eu-1")?;
        let on_a = uplink_of(&a)?;
        let stale = global
            .metric("hdsd_zone_refusals_total{code=\"stale_epoch\"}")
            .unwrap_or(0.0);
        if z["instance"] == b_name.as_str() && on_a["state"] != "connected" && stale == 0.0 {
            Ok(())
        } else {
            Err(format!(
                "at the global {z}, A {on_a}, stale_epoch refusals {stale}"
            ))
        }
    });
    wait_uplink_state(&a, "standby", Some(&b_name), Duration::from_secs(5));
    watch.assert_nothing_deleted("eu-1");
}

/// Runs `hdsd zone ARGS --api <the global's API>`: whether it succeeded,
/// its stdout and its stderr.
fn zone_cli(global: &Hdsd, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .arg("zone")
        .args(args)
        .arg("--api")
        .arg(global.api_url(""))
        .env_remove("RUST_LOG")
        .output()
        .expect("run hdsd zone");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The wall clock in whole seconds (as token times are).
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `hdsd zone ARGS` that must succeed: its stdout.
fn zone_cli_ok(global: &Hdsd, args: &[&str]) -> String {
    let (ok, out, err) = zone_cli(global, args);
    assert!(ok, "hdsd zone {args:?} failed: {out}{err}");
    out
}

/// A global that lists no zone and registers none by itself; `extra`
/// before its `[global]`, and `env`.
fn bare_global(extra: &str, env: Vec<(String, String)>) -> Hdsd {
    Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        env,
        extra: format!(
            "{extra}[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nauto_register = false\n"
        ),
        ..HdsdOptions::default()
    })
}

/// A zone hdsd with one dataplane, `web`, whose inbound a real Envoy
/// probes on `app`.
fn zone_with_web(global: &Hdsd, token: &std::path::Path, app: &App) -> (Hdsd, Envoy) {
    let eu = zone(global, "eu-1", token);
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let envoy = Envoy::start(eu.hds, "default.web", None);
    (eu, envoy)
}

/// Zones registered, deleted, disabled and enabled through the API and
/// the CLI at a running global that lists none: an added zone connects;
/// a deleted one leaves every reader as one zone deletion (no dataplane
/// deletion), with its series, and is refused as unregistered; its old
/// token stays refused once it is added again, a new one connects; a
/// disabled zone is refused and withdrawn, and comes back by itself once
/// enabled.
#[test]
fn zones_are_registered_and_deleted_through_the_api_without_a_restart() {
    let global = bare_global("", Vec::new());
    let tokens = tempfile::tempdir().unwrap();
    let follower = Follower::start(&global);

    // A bad name is refused with the rule, by the CLI and by the API.
    let (ok, _, err) = zone_cli(&global, &["add", "EU_1"]);
    assert!(!ok && err.contains("is not a zone name"), "{err}");
    let mut bad = ureq::put(&global.api_url("/api/v1/zones/EU_1"))
        .config()
        .http_status_as_error(false)
        .build()
        .header("Content-Type", "application/json")
        .send("")
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body = bad.body_mut().read_to_string().unwrap();
    assert!(body.contains("lowercase letters, digits and '-'"), "{body}");

    let out = zone_cli_ok(&global, &["add", "eu-1"]);
    assert!(out.contains("zone eu-1 registered"), "{out}");
    follower.wait_zone("eu-1", "never_connected");
    let token = zone_token(&global, "eu-1", &tokens);
    let app = App::start();
    let (eu, envoy) = zone_with_web(&global, &token, &app);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    let z = zone_state(&global, "eu-1").unwrap();
    assert_eq!(z["registeredBy"], "api", "{z}");
    assert!(global
        .metrics()
        .contains("hdsd_zone_state{zone=\"eu-1\",state=\"online\"} 1"));

    // Deleted: one zone deletion, no dataplane deletion; the stream ends.
    let before = follower.events().len();
    let deleted_at = Instant::now();
    let out = zone_cli_ok(&global, &["delete", "eu-1"]);
    let deleted_second = unix_seconds();
    assert!(
        out.contains("zone eu-1 deleted; its zone tokens issued until"),
        "{out}"
    );
    follower.wait("a zone_deleted event of eu-1", |e, d| {
        e == "zone_deleted" && d["zone"]["name"] == "eu-1"
    });
    let status = wait_uplink_code(&eu, "zone_unregistered", Duration::from_secs(5));
    println!(
        "eu-1's stream ended {:?} after the deletion",
        deleted_at.elapsed()
    );
    assert!(
        problem_of(&status).contains("was deleted at the global")
            && problem_of(&status).contains("hdsd zone add eu-1"),
        "{status}"
    );
    let events = follower.events();
    let after = &events[before..];
    let zone_deleted = after
        .iter()
        .filter(|(e, d)| e == "zone_deleted" && d["zone"]["name"] == "eu-1")
        .count();
    let dataplane_deleted: Vec<_> = after
        .iter()
        .filter(|(e, d)| e == "deleted" && d["dataplane"]["zone"] == "eu-1")
        .collect();
    assert_eq!(zone_deleted, 1, "{after:?}");
    assert!(dataplane_deleted.is_empty(), "{dataplane_deleted:?}");
    assert!(global.get_json("/api/v1/zones/eu-1").is_err(), "404");
    assert!(remote_items(&global, "eu-1").is_empty());
    let metrics = global.metrics();
    assert!(
        !metrics.contains("zone=\"eu-1\""),
        "eu-1's series are gone: {}",
        metrics
            .lines()
            .filter(|l| l.contains("eu-1"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("hdsd_zones{state=\"online\"} 0"));

    // A new connection is refused as unregistered, naming the command.
    drop(envoy);
    drop(eu);
    let eu = zone(&global, "eu-1", &token);
    let status = wait_uplink_code(&eu, "zone_unregistered", Duration::from_secs(20));
    assert!(
        problem_of(&status).contains("is not registered at the global: run `hdsd zone add eu-1`"),
        "{status}"
    );

    // Added again: the old token stays refused, a new one connects.
    zone_cli_ok(&global, &["add", "eu-1"]);
    drop(eu);
    let eu = zone(&global, "eu-1", &token);
    let status = wait_uplink_code(&eu, "unauthenticated", Duration::from_secs(20));
    assert!(
        problem_of(&status).contains("was deleted at the global")
            && problem_of(&status).contains("hdsd token issue --zone eu-1"),
        "{status}"
    );
    drop(eu);
    // Token times are whole seconds: one issued in the second of the
    // deletion counts as issued before it.
    wait_for(
        "a second after the deletion",
        Duration::from_secs(3),
        || {
            (unix_seconds() > deleted_second)
                .then_some(())
                .ok_or_else(|| "the same second".to_string())
        },
    );
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = zone_token(&global, "eu-1", &fresh_dir);
    let (eu, _envoy) = zone_with_web(&global, &fresh, &app);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);

    // Disabled: refused with how to enable it, withdrawn; enabled: back
    // by itself at its next try (a refused zone tries every 30 s).
    let out = zone_cli_ok(&global, &["disable", "eu-1"]);
    assert!(
        out.contains("zone eu-1 disabled (state: disabled)"),
        "{out}"
    );
    let status = wait_uplink_code(&eu, "zone_disabled", Duration::from_secs(5));
    assert!(
        problem_of(&status).contains("hdsd zone enable eu-1"),
        "{status}"
    );
    let z = zone_state(&global, "eu-1").unwrap();
    assert_eq!(
        (&z["state"], &z["withdrawn"]),
        (&"disabled".into(), &true.into()),
        "{z}"
    );
    wait_remote_ready(&global, "eu-1", "web", false, Duration::from_secs(5));
    let streams = z["streams"].as_u64().unwrap();
    zone_cli_ok(&global, &["enable", "eu-1"]);
    let enabled_at = Instant::now();
    wait_zone(
        &global,
        "eu-1",
        "connected again",
        Duration::from_secs(45),
        |z| z["state"] == "online" && z["streams"].as_u64() > Some(streams),
    );
    println!(
        "eu-1 connected again {:?} after it was enabled",
        enabled_at.elapsed()
    );
    wait_remote_ready(&global, "eu-1", "web", true, Duration::from_secs(5));
    wait_for("eu-1's uplink connected", Duration::from_secs(5), || {
        let v = eu.get_json("/api/v1/zones")?;
        (v["uplink"]["connected"] == true)
            .then_some(())
            .ok_or_else(|| format!("{v}"))
    });
    follower.assert_no_dataplane_deleted("eu-1");
}

/// Writes need one of api.tokens; the configuration wins over the API
/// (each refusal names the fix); registrations through the API outlive a
/// restart of the global (the redb file of state_dir).
#[test]
fn zone_registrations_need_the_api_token_and_outlive_a_restart() {
    let mut global = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        api_tokens: "[\"admin-token\"]",
        extra: "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nzones = [\"eu-1\"]\ndisabled = [\"off-1\"]\n"
            .to_string(),
        ..HdsdOptions::default()
    });
    let with_token = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--api-token", "admin-token"]);
        zone_cli(&global, &all)
    };
    let (ok, _, err) = zone_cli(&global, &["add", "ap-1"]);
    assert!(
        !ok && err.contains("HTTP 401") && err.contains("--api-token"),
        "{err}"
    );
    let (ok, out, err) = with_token(&["add", "ap-1"]);
    assert!(ok && out.contains("zone ap-1 registered"), "{out}{err}");
    let (ok, out, err) = with_token(&["add", "us-1", "--disabled"]);
    assert!(ok && out.contains("(state: disabled)"), "{out}{err}");

    // The configuration wins; what it already says is no change.
    let (ok, _, err) = with_token(&["delete", "eu-1"]);
    assert!(
        !ok && err.contains("HTTP 409")
            && err.contains("zone \"eu-1\" is in global.zones")
            && err.contains("remove it from global.zones"),
        "{err}"
    );
    let (ok, _, err) = with_token(&["disable", "eu-1"]);
    assert!(
        !ok && err.contains("move it from global.zones to global.disabled"),
        "{err}"
    );
    let (ok, _, err) = with_token(&["enable", "off-1"]);
    assert!(
        !ok && err.contains("remove it from global.disabled"),
        "{err}"
    );
    let (ok, out, _) = with_token(&["add", "eu-1"]);
    assert!(
        ok && out.contains("was registered already (config)"),
        "{out}"
    );
    let (ok, _, err) = with_token(&["disable", "xx-1"]);
    assert!(
        !ok && err.contains("HTTP 404") && err.contains("hdsd zone add"),
        "{err}"
    );

    let zones_with_token = |global: &Hdsd| -> Vec<Value> {
        let mut r = ureq::get(&global.api_url("/api/v1/zones"))
            .header("Authorization", "Bearer admin-token")
            .call()
            .unwrap();
        r.body_mut().read_json::<Value>().unwrap()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let find = |items: &[Value], name: &str| {
        items
            .iter()
            .find(|z| z["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    global.restart();
    let items = zones_with_token(&global);
    let ap = find(&items, "ap-1");
    assert_eq!(
        (&ap["state"], &ap["registeredBy"]),
        (&"never_connected".into(), &"api".into()),
        "{items:?}"
    );
    assert_eq!(find(&items, "us-1")["state"], "disabled", "{items:?}");
    assert_eq!(find(&items, "eu-1")["registeredBy"], "config", "{items:?}");
}

/// A global of two instances on PostgreSQL: a zone added through one is
/// accepted by the other; deleted through the first, its stream held by
/// the second ends and its rows leave the store.
#[test]
fn a_zone_added_through_one_global_instance_is_accepted_by_another() {
    use crate::support::postgres::Postgres;
    let Some(pg) =
        Postgres::start("a_zone_added_through_one_global_instance_is_accepted_by_another")
    else {
        return;
    };
    let store = format!(
        "[store]\nkind = \"postgres\"\n[store.postgres]\nurl = {:?}\nreconcile_interval = \"1s\"\n",
        pg.url()
    );
    let env = || vec![("HDSD_DATAPLANES__SOURCE".to_string(), "api".to_string())];
    let g1 = bare_global(&store, env());
    let g2 = bare_global(&store, env());
    zone_cli_ok(&g1, &["add", "eu-1"]);
    let tokens = tempfile::tempdir().unwrap();
    let token = zone_token(&g1, "eu-1", &tokens);
    let app = App::start();
    // The zone dials the second instance only.
    let (eu, _envoy) = zone_with_web(&g2, &token, &app);
    wait_remote_ready(&g2, "eu-1", "web", true, CONNECT);
    wait_remote_ready(&g1, "eu-1", "web", true, Duration::from_secs(5));
    let rows = |table: &str| -> u32 {
        pg.psql(&format!("SELECT count(*) FROM {table} WHERE zone = 'eu-1'"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(rows("hdsd_zone_dataplanes") >= 1);

    let deleted_at = Instant::now();
    zone_cli_ok(&g1, &["delete", "eu-1"]);
    wait_uplink_code(&eu, "zone_unregistered", Duration::from_secs(5));
    println!(
        "the stream held by the second instance ended {:?} after the deletion through the first",
        deleted_at.elapsed()
    );
    for g in [&g1, &g2] {
        wait_for("eu-1 gone", Duration::from_secs(5), || {
            match zone_state(g, "eu-1") {
                Err(_) => Ok(()),
                Ok(z) => Err(format!("{z}")),
            }
        });
    }
    assert_eq!(rows("hdsd_zone_dataplanes"), 0);
    assert_eq!(rows("hdsd_zone_links"), 0);
    assert_eq!(
        pg.psql("SELECT state FROM hdsd_zone_registrations WHERE zone = 'eu-1'")
            .trim(),
        "deleted"
    );
}

/// Zones known by their client certificate (`global.tls.client_ca`): a
/// certificate whose one URI is `hdsd://zone/eu-1` connects without a
/// token and syncs the meshes `global.certificate_meshes` gives eu-1 (its
/// dataplane, probed by a real Envoy, reads ready at the global); a zone
/// with no meshes listed, a certificate naming two zones, a token and a
/// certificate naming different zones, and a certificate of another CA are
/// each refused, and say why.
#[test]
fn a_zone_known_by_its_client_certificate_connects_without_a_token() {
    use crate::support::pki::{Ca, Leaf};
    use rcgen::ExtendedKeyUsagePurpose;

    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("global CA");
    let server_ca_file = server_ca.write(&dir.path().join("global-ca.pem"));
    let server = server_ca.issue(dir.path(), "global", ExtendedKeyUsagePurpose::ServerAuth);
    let zones_ca = Ca::new("zones CA");
    let zones_ca_file = zones_ca.write(&dir.path().join("zones-ca.pem"));
    let global = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: format!(
            "[global]\nenabled = true\nheartbeat_interval = \"1s\"\nzone_timeout = \"2s\"\nzones = [\"eu-1\", \"us-1\", \"ap-1\"]\n\
             [global.tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n\
             [global.certificate_meshes]\neu-1 = [\"default\"]\nap-1 = [\"default\"]\n",
            server.cert.display().to_string(),
            server.key.display().to_string(),
            zones_ca_file.display().to_string(),
        ),
        ..HdsdOptions::default()
    });
    let url = format!("https://127.0.0.1:{}", global.zones.unwrap().port());
    let zone_with = |name: &str, leaf: &Leaf, token: Option<&std::path::Path>| {
        let token = token.map_or(String::new(), |t| {
            format!("token_file = {:?}\n", t.display().to_string())
        });
        Hdsd::start(HdsdOptions {
            extra: format!(
                "[zone]\nname = \"{name}\"\nglobal = [\"{url}\"]\nca = {:?}\ncert = {:?}\nkey = {:?}\n{token}",
                server_ca_file.display().to_string(),
                leaf.cert.display().to_string(),
                leaf.key.display().to_string(),
            ),
            ..HdsdOptions::default()
        })
    };

    let app = App::start();
    let eu_cert = zones_ca.issue_with_uris(dir.path(), "eu-1", &["hdsd://zone/eu-1"]);
    let eu = zone_with("eu-1", &eu_cert, None);
    eu.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
    let _envoy = Envoy::start(eu.hds, "default.web", None);
    wait_remote_ready(&global, "eu-1", "web", true, CONNECT);
    let z = zone_state(&global, "eu-1").unwrap();
    assert_eq!(z["state"], "online", "{z}");

    let refused = |zone: &Hdsd, parts: &[&str]| {
        let status = wait_uplink_code(zone, "unauthenticated", Duration::from_secs(20));
        assert_eq!(status["connected"], false, "{status}");
        for part in parts {
            assert!(problem_of(&status).contains(part), "{part}: {status}");
        }
    };
    let us = zone_with(
        "us-1",
        &zones_ca.issue_with_uris(dir.path(), "us-1", &["hdsd://zone/us-1"]),
        None,
    );
    refused(
        &us,
        &[
            "refused the zone's client certificate (zone.cert)",
            "global.certificate_meshes lists no meshes for it",
            "us-1 = [\"MESH\"]",
        ],
    );
    drop(us);

    let two = zone_with(
        "ap-1",
        &zones_ca.issue_with_uris(
            dir.path(),
            "ap-two",
            &["hdsd://zone/ap-1", "hdsd://zone/eu-1"],
        ),
        None,
    );
    refused(
        &two,
        &[
            "2 URI subject alternative names",
            "exactly one, hdsd://zone/NAME",
        ],
    );
    drop(two);

    let ap_cert = zones_ca.issue_with_uris(dir.path(), "ap-1", &["hdsd://zone/ap-1"]);
    let token = zone_token(&global, "eu-1", &dir);
    let mixed = zone_with("ap-1", &ap_cert, Some(&token));
    refused(
        &mixed,
        &["the zone token names zone \"eu-1\" but the client certificate names zone \"ap-1\""],
    );
    drop(mixed);

    // Another CA's certificate does not complete the handshake: ap-1 never
    // connects, and the zone says what failed.
    let rogue = Ca::new("another CA").issue_with_uris(dir.path(), "rogue", &["hdsd://zone/ap-1"]);
    let outsider = zone_with("ap-1", &rogue, None);
    let status = wait_for(
        "the outsider's uplink to fail",
        Duration::from_secs(20),
        || {
            let v = outsider.get_json("/api/v1/zones")?;
            let uplink = v["uplink"].clone();
            if uplink["problem"].is_string() {
                Ok(uplink)
            } else {
                Err(format!("{v}"))
            }
        },
    );
    println!("a certificate of another CA: {status}");
    assert_eq!(status["connected"], false, "{status}");
    assert!(
        problem_of(&status).contains("does not trust the certificate"),
        "{status}"
    );
    let ap = zone_state(&global, "ap-1").unwrap();
    assert_eq!(ap["state"], "never_connected", "{ap}");
    let z = zone_state(&global, "eu-1").unwrap();
    assert_eq!(z["state"], "online", "eu-1 unaffected: {z}");
}

/// Issue 56, item 6: with us-1 running, a zone configured as eu-1 holding
/// a copy of us-1's token superseded us-1 (the global compared no names)
/// and flapped it online and offline. The Hello names the zone: the global
/// refuses eu-1's stream with `zone_name_mismatch` before it takes
/// anything over, and us-1 keeps its one stream throughout.
#[test]
fn a_zone_with_another_zones_token_is_refused_before_it_takes_over() {
    let global = global();
    let tokens = tempfile::tempdir().unwrap();
    let us_token = zone_token(&global, "us-1", &tokens);
    let us = zone(&global, "us-1", &us_token);
    wait_uplink_state(&us, "connected", None, CONNECT);
    let impostor = zone(&global, "eu-1", &us_token);
    let refused = wait_uplink_code(&impostor, "zone_name_mismatch", CONNECT);
    assert!(
        problem_of(&refused).contains("zone.name is \"eu-1\"")
            && problem_of(&refused).contains("names zone \"us-1\""),
        "{refused}"
    );
    assert_eq!(refused["accepted"], 0, "{refused}");
    // us-1 was never superseded: one stream accepted, online all along.
    hold_for(
        "us-1 to keep its one stream",
        Duration::from_secs(3),
        || {
            let u = uplink_of(&us)?;
            let state = zone_state(&global, "us-1")?;
            if u["connected"] == true && u["accepted"] == 1 && state["state"] == "online" {
                Ok(())
            } else {
                Err(format!("{u} / {state}"))
            }
        },
    );
    assert!(
        global
            .metric("hdsd_zone_refusals_total{code=\"zone_name_mismatch\"}")
            .is_some_and(|n| n >= 1.0),
        "{}",
        global.metrics()
    );
    assert_eq!(
        global.metric("hdsd_zone_refusals_total{code=\"superseded\"}"),
        None
    );
}

/// Issue 56, item 6: two holders of one credential, both named us-1 (a
/// cloned machine), dial in turn. The later one takes over once (a
/// takeover is no storm); the earlier one's retries contest the online
/// holder, and the third contest within the window is a supersede storm:
/// refused `uplink_contested`, logged naming both instances, counted. The
/// holder keeps the zone all along (no flap).
#[test]
fn a_supersede_storm_is_refused_naming_both_holders_and_the_zone_does_not_flap() {
    let global = global();
    let tokens = tempfile::tempdir().unwrap();
    let token = zone_token(&global, "us-1", &tokens);
    let first = zone(&global, "us-1", &token);
    wait_uplink_state(&first, "connected", None, CONNECT);
    let second = zone(&global, "us-1", &token);
    wait_uplink_state(&second, "connected", None, CONNECT);
    let holder = uplink_of(&second).unwrap()["holder"]
        .as_str()
        .unwrap()
        .to_string();
    let other = uplink_of(&first).unwrap()["holder"]
        .as_str()
        .unwrap()
        .to_string();
    // The earlier one retries at the backoff's longest delay (30 s): its
    // second retry is the third contest.
    let started = Instant::now();
    wait_for(
        "the supersede storm refused",
        Duration::from_secs(90),
        || {
            let u = uplink_of(&second)?;
            let state = zone_state(&global, "us-1")?;
            assert!(
                u["connected"] == true && u["accepted"] == 1 && state["state"] == "online",
                "the holder lost the zone: {u} / {state}"
            );
            match global.metric("hdsd_zone_refusals_total{code=\"uplink_contested\"}") {
                Some(n) if n >= 1.0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    eprintln!(
        "MEASURE supersede_storm_detected_seconds {:.1}",
        started.elapsed().as_secs_f64()
    );
    let refused = wait_uplink_code(&first, "uplink_contested", CONNECT);
    let log = global.log();
    let line = log
        .lines()
        .find(|l| l.contains("supersede storm"))
        .unwrap_or_else(|| panic!("no storm line:\n{log}"));
    assert!(
        line.contains(&holder) && line.contains(&other) && line.contains("127.0.0.1"),
        "{line}"
    );
    assert!(
        problem_of(&refused).contains("hdsd token revoke"),
        "{refused}"
    );
    assert_eq!(uplink_of(&second).unwrap()["accepted"], 1);
}
