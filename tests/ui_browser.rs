//! The fleet page (`/ui/`) in a real headless Chromium, driven by Playwright
//! (`tests/ui/browser_test.py`), against the real hdsd with real Envoys and
//! apps. The script asks for changes (`ACTION ...`); this side makes them.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{dataplane_yaml, App, Envoy, Hdsd, HdsdOptions};

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no .venv/bin/python: run scripts/setup.sh (it installs Playwright)"
    );
    venv
}

/// Debian's Chromium (`scripts/setup.sh` installs it), or `$HDSD_CHROMIUM`.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("HDSD_CHROMIUM") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!("no chromium: run scripts/setup.sh (apt-get install chromium), or set HDSD_CHROMIUM")
    })
}

/// A dataplane named `name` whose one inbound is service `service` on `app`.
fn dataplane(name: &str, port: u16, service: &str, app: u16) -> String {
    dataplane_yaml(name, &[(port, app)]).replace(&format!("svc-{port}"), service)
}

/// Runs the browser script; answers each `ACTION` line with `act`. Returns its
/// `CHECK` lines and measurements; panics with its output if it fails.
fn run_browser(args: &[String], mut act: impl FnMut(&str)) -> Vec<String> {
    run_browser_told(args, |what| {
        act(what);
        String::new()
    })
}

/// [`run_browser`], answering each `ACTION` with `DONE` and what `act`
/// returns (words the script reads).
fn run_browser_told(args: &[String], act: impl FnMut(&str) -> String) -> Vec<String> {
    run_script("browser_test.py", args, act)
}

/// Runs `tests/ui/<script>` as [`run_browser_told`] does.
fn run_script(script: &str, args: &[String], mut act: impl FnMut(&str) -> String) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ui")
        .join(script);
    let mut child = Command::new(python())
        .arg(script)
        .arg("--chromium")
        .arg(chromium())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run tests/ui/browser_test.py");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for line in stdout.lines().map_while(Result::ok) {
        eprintln!("browser: {line}");
        if let Some(what) = line.strip_prefix("ACTION ") {
            let told = act(what);
            writeln!(stdin, "DONE {told}")
                .and_then(|()| stdin.flush())
                .unwrap();
        }
        lines.push(line);
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the browser test failed ({status}):\n{}",
        lines.join("\n")
    );
    assert!(
        lines.last().is_some_and(|l| l.starts_with("PASSED")),
        "{lines:?}"
    );
    lines
}

/// web-2's file with a typo on its last line (line 8).
const BROKEN_WEB_2: &str = "type: Dataplane\nmesh: default\nname: web-2\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 21002\n    servicePort: nope\n";

/// One browser test at a time: Chromium is heavy, and the timing checks must
/// not measure a second browser's load.
static ONE_BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_browser() -> std::sync::MutexGuard<'static, ()> {
    ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls the REST API from a thread and prints when `id` stopped being ready:
/// how much of the page's delay is hdsd's detection.
fn note_api_not_ready(url: String) {
    let started = std::time::Instant::now();
    std::thread::spawn(move || {
        while started.elapsed() < Duration::from_secs(10) {
            let ready = ureq::get(&url)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
                .map(|v| v["inbounds"][0]["health"]["ready"] == true);
            if ready == Some(false) {
                eprintln!(
                    "MEASURE api_not_ready_seconds {:.3}",
                    started.elapsed().as_secs_f64()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("ui.png")
}

/// Writes each dataplane's file (one inbound, probing its app), starts its
/// Envoy and waits until its inbound is healthy; returns the Envoys and the
/// files' texts.
fn serve_all(
    hdsd: &Hdsd,
    dataplanes: &[(&str, u16, &str)],
    apps: &[App],
) -> (Vec<Envoy>, Vec<String>) {
    let yaml: Vec<String> = dataplanes
        .iter()
        .zip(apps)
        .map(|((name, port, service), app)| dataplane(name, *port, service, app.port))
        .collect();
    let mut envoys = Vec::new();
    for ((name, _, _), yaml) in dataplanes.iter().zip(&yaml) {
        hdsd.write_dataplane(&format!("{name}.yaml"), yaml);
        envoys.push(Envoy::start(hdsd.hds, &format!("default.{name}"), None));
    }
    for (name, port, _) in dataplanes {
        hdsd.wait_inbound(
            &format!("default.{name}"),
            *port,
            "healthy",
            Duration::from_secs(30),
        );
    }
    (envoys, yaml)
}

#[test]
fn the_fleet_page_follows_the_fleet_live_in_chromium() {
    let _one = one_browser();
    let options = HdsdOptions::default();
    // unhealthy_threshold x check interval + timeout + report interval.
    let detection = Duration::from_millis(2 * 200 + 100 + 200);
    let mut hdsd = Hdsd::start(options);
    let mut apps = [App::start(), App::start(), App::start()];
    let dataplanes = [
        ("web-1", 21001, "web"),
        ("web-2", 21002, "web"),
        ("api-1", 21003, "api"),
    ];
    let (envoys, yaml) = serve_all(&hdsd, &dataplanes, &apps);
    let shot = screenshot_path();
    let args = vec![
        "--scenario".to_string(),
        "live".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
        "--detection".to_string(),
        format!("{}", detection.as_secs_f64()),
        "--screenshot".to_string(),
        shot.display().to_string(),
    ];
    let lines = run_browser(&args, |action| match action {
        "stop_app web-1" => {
            apps[0].stop();
            note_api_not_ready(hdsd.api_url("/api/v1/dataplanes/default/web-1"));
        }
        "start_app web-1" => apps[0].resume(),
        "break_file web-2.yaml" => hdsd.write_dataplane("web-2.yaml", BROKEN_WEB_2),
        "fix_file web-2.yaml" => hdsd.write_dataplane("web-2.yaml", &yaml[1]),
        "restart_hdsd" => hdsd.restart(),
        other => panic!("unknown action {other:?}"),
    });
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 20, "{lines:?}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    eprintln!("screenshot: {}", shot.display());
    drop(envoys);
}

/// The last hour: an app stops and comes back; the page's timeline shows
/// the interval its inbound was not ready, and the dataplane's detail the
/// band of its status changes. Saves `timeline.png` (the picture in the
/// README and docs/operating.md).
#[test]
fn the_page_draws_the_last_hour_in_chromium() {
    let _one = one_browser();
    let hdsd = Hdsd::start(HdsdOptions::default());
    let mut apps = [App::start(), App::start()];
    let dataplanes = [("web-1", 23001, "web"), ("api-1", 23002, "api")];
    let (envoys, _) = serve_all(&hdsd, &dataplanes, &apps);
    let shot = screenshot_path().with_file_name("timeline.png");
    let args = vec![
        "--scenario".to_string(),
        "timeline".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
        "--screenshot".to_string(),
        shot.display().to_string(),
    ];
    let lines = run_browser(&args, |action| match action {
        "stop_app web-1" => apps[0].stop(),
        "start_app web-1" => apps[0].resume(),
        other => panic!("unknown action {other:?}"),
    });
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 10, "{lines:?}");
    // The REST side of the same story: web-1's changes end unhealthy, ready.
    let history = ureq::get(&hdsd.api_url("/api/v1/dataplanes/default/web-1/history"))
        .call()
        .unwrap()
        .body_mut()
        .read_json::<serde_json::Value>()
        .unwrap();
    let statuses: Vec<&str> = history["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["status"].as_str())
        .collect();
    assert!(statuses.ends_with(&["unhealthy", "ready"]), "{history}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    eprintln!("screenshot: {}", shot.display());
    drop(envoys);
}

/// An HTTPS probe on the page: marked TLS, its setup in words, and the
/// reason once its certificate is refused.
#[test]
fn the_page_shows_a_tls_probe_and_why_it_may_fail() {
    use crate::support::apps::{tls_config, TlsApp};
    use crate::support::pki::Ca;
    use rcgen::ExtendedKeyUsagePurpose::ServerAuth;
    let _one = one_browser();
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("apps CA");
    let ca_file = ca.write(&pki.path().join("ca.pem"));
    let good = ca.issue_for(pki.path(), "app", ServerAuth, &["app.test"]);
    let rogue = Ca::new("another CA").issue_for(pki.path(), "rogue", ServerAuth, &["app.test"]);
    let secure = TlsApp::start(tls_config(&good.cert, &good.key, None), false);
    let plain = App::start();
    let hdsd = Hdsd::start(HdsdOptions::default());
    let tls = format!(
        "    serviceProbe:\n      http:\n        path: /healthz\n        tls: {{caFile: {}, sni: app.test}}\n",
        ca_file.display()
    );
    hdsd.write_dataplane(
        "secure-1.yaml",
        &format!(
            "{}{tls}",
            dataplane("secure-1", 22001, "secure", secure.port)
        ),
    );
    hdsd.write_dataplane(
        "plain-1.yaml",
        &dataplane("plain-1", 22002, "plain", plain.port),
    );
    let _envoys = [
        Envoy::start(hdsd.hds, "default.secure-1", None),
        Envoy::start(hdsd.hds, "default.plain-1", None),
    ];
    for (id, port) in [("default.secure-1", 22001), ("default.plain-1", 22002)] {
        hdsd.wait_inbound(id, port, "healthy", Duration::from_secs(30));
    }
    let args = vec![
        "--scenario".to_string(),
        "tls".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
    ];
    let lines = run_browser(&args, |action| match action {
        "rogue_cert secure-1" => secure.set_config(tls_config(&rogue.cert, &rogue.key, None)),
        other => panic!("unknown action {other:?}"),
    });
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 4, "{lines:?}");
}

#[test]
fn with_api_tokens_the_page_asks_for_a_token_then_works() {
    let _one = one_browser();
    let options = HdsdOptions {
        api_tokens: "[\"ui-secret-token\"]",
        ..HdsdOptions::default()
    };
    let hdsd = Hdsd::start(options);
    let app = App::start();
    hdsd.write_dataplane("web-1.yaml", &dataplane("web-1", 21011, "web", app.port));
    let _envoy = Envoy::start(hdsd.hds, "default.web-1", None);
    // The harness reads the API without a token: wait on the Envoy's report instead.
    crate::support::wait_for("web-1 healthy", Duration::from_secs(30), || {
        let v = ureq::get(&hdsd.api_url("/api/v1/dataplanes/default/web-1"))
            .header("Authorization", "Bearer ui-secret-token")
            .call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        v.contains("\"healthy\"").then_some(()).ok_or(v)
    });
    let args = vec![
        "--scenario".to_string(),
        "token".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
        "--token".to_string(),
        "ui-secret-token".to_string(),
    ];
    let lines = run_browser(&args, |action| panic!("unexpected action {action:?}"));
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 7, "{lines:?}");
}

/// A longer run (not part of `make test`): an app flaps while the page stays
/// open, and its heap must level off. `cargo test --test integration ui_browser:: -- --ignored`
/// (`UI_SOAK_FLAPS=N` for N flaps, default 60).
#[test]
#[ignore = "a soak of a minute or more; run by hand"]
fn the_page_heap_levels_off_while_an_app_flaps() {
    let _one = one_browser();
    let hdsd = Hdsd::start(HdsdOptions::default());
    let mut app = App::start();
    let port = app.port;
    hdsd.write_dataplane("web-1.yaml", &dataplane("web-1", 21021, "web", port));
    let _envoy = Envoy::start(hdsd.hds, "default.web-1", None);
    hdsd.wait_inbound("default.web-1", 21021, "healthy", Duration::from_secs(30));
    let args = vec![
        "--scenario".to_string(),
        "soak".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
        "--flaps".to_string(),
        std::env::var("UI_SOAK_FLAPS").unwrap_or_else(|_| "60".to_string()),
    ];
    run_browser(&args, |action| match action {
        "flap web-1 10" => {
            for _ in 0..10 {
                app.stop();
                hdsd.wait_inbound("default.web-1", 21021, "unhealthy", Duration::from_secs(15));
                app.resume();
                hdsd.wait_inbound("default.web-1", 21021, "healthy", Duration::from_secs(15));
            }
        }
        other => panic!("unknown action {other:?}"),
    });
}

/// Three instances on one PostgreSQL: an Envoy held by one reads
/// `connected: true` with `heldBy` naming it on the two others, in REST,
/// gRPC and the page, within a second of the connect, and again after a
/// failover (SIGKILL of the holder).
#[test]
fn every_instance_shows_the_fleet_connection_in_rest_grpc_and_the_page() {
    use crate::store_postgres::{on_postgres_with_timeout, web01_envoy_on_all};
    let Some(pg) = crate::support::postgres::Postgres::start(
        "every_instance_shows_the_fleet_connection_in_rest_grpc_and_the_page",
    ) else {
        return;
    };
    let _one = one_browser();
    let options = on_postgres_with_timeout(&pg, "2s");
    let mut instances: Vec<Hdsd> = (0..3).map(|_| Hdsd::start(options.clone())).collect();
    let app = App::start();
    // Defined through the first instance, seen by all before any Envoy.
    let yaml = dataplane_yaml("web-01", &[(10001, app.port)]);
    let (status, _, body) = crate::store_postgres::send(
        &instances[0],
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    for h in &instances {
        h.wait_connected("default.web-01", false, Duration::from_secs(10));
    }
    let urls: Vec<String> = instances
        .iter()
        .map(|h| format!("http://{}/ui/", h.api))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut envoy = None;
    let mut dead = Vec::new();
    run_browser_told(
        &[
            "--url".into(),
            urls.join(","),
            "--scenario".into(),
            "fleet".into(),
        ],
        |what| {
            let started = std::time::Instant::now();
            match what {
                "connect" => envoy = Some(web01_envoy_on_all(&instances, app.port)),
                "failover" => {
                    let holder = held_here(&instances, &dead).expect("a holder");
                    instances[holder].kill();
                    dead.push(holder);
                }
                other => panic!("unknown action {other}"),
            }
            let holder = wait_for_holder(&instances, &dead);
            let pid = instances[holder].pid();
            // Every other live instance answers for the fleet, in REST and gRPC.
            for (i, h) in instances.iter().enumerate() {
                if i == holder || dead.contains(&i) {
                    continue;
                }
                crate::support::wait_for(
                    "connected with heldBy on another instance (REST and gRPC)",
                    Duration::from_secs(1),
                    || {
                        let c = h.dataplane("default.web-01")?.connection;
                        let suffix = format!("/{pid}");
                        if !(c.connected
                            && c.held_by.as_deref().is_some_and(|b| b.ends_with(&suffix)))
                        {
                            return Err(format!("REST: {c:?}"));
                        }
                        let pb = rt.block_on(grpc_connection(h));
                        if !(pb.connected && pb.held_by.ends_with(&suffix)) {
                            return Err(format!("gRPC: {pb:?}"));
                        }
                        Ok(())
                    },
                );
            }
            eprintln!(
                "MEASURE {what}: every instance answered connected (held by instance {holder}) {:?} after the action",
                started.elapsed()
            );
            format!("{holder} {pid}")
        },
    );
    drop(envoy);
}

/// The instance (not in `dead`) whose own stream holds web-01.
fn held_here(instances: &[Hdsd], dead: &[usize]) -> Option<usize> {
    (0..instances.len())
        .filter(|i| !dead.contains(i))
        .find(|&i| {
            instances[i]
                .dataplane("default.web-01")
                .is_ok_and(|d| d.connection.connected && d.connection.held_by.is_none())
        })
}

fn wait_for_holder(instances: &[Hdsd], dead: &[usize]) -> usize {
    crate::support::wait_for(
        "an instance to hold web-01",
        Duration::from_secs(60),
        || held_here(instances, dead).ok_or_else(|| "none yet".to_string()),
    )
}

/// web-01's connection as `hdsd.v1.ReadinessService/GetDataplane` answers it.
async fn grpc_connection(h: &Hdsd) -> hdsd::consumers::pb::Connection {
    use hdsd::consumers::pb;
    let mut client =
        pb::readiness_service_client::ReadinessServiceClient::connect(format!("http://{}", h.api))
            .await
            .expect("gRPC on the API port");
    client
        .get_dataplane(pb::GetDataplaneRequest {
            mesh: "default".into(),
            name: "web-01".into(),
        })
        .await
        .expect("GetDataplane")
        .into_inner()
        .connection
        .expect("a connection")
}

/// A global's page: a zones panel, a zone column and filter, per-zone
/// service counts; a zone frozen (SIGSTOP) reads Offline there within the
/// zone timeout plus the page's 1 s poll, and Online again once thawed.
#[test]
fn a_globals_page_shows_its_zones_and_one_going_offline() {
    use crate::zones::{global, signal, zone, zone_token};
    let _one = one_browser();
    let global = global();
    let tokens = tempfile::tempdir().unwrap();
    let eu = zone(&global, "eu-1", &zone_token(&global, "eu-1", &tokens));
    let us = zone(&global, "us-1", &zone_token(&global, "us-1", &tokens));
    let apps = [App::start(), App::start()];
    let mut envoys = Vec::new();
    for (z, app) in [&eu, &us].into_iter().zip(&apps) {
        z.write_dataplane("web.yaml", &dataplane("web", 21001, "web", app.port));
        envoys.push(Envoy::start(z.hds, "default.web", None));
    }
    crate::support::wait_for(
        "both zones' web ready at the global",
        Duration::from_secs(30),
        || {
            let list = global.get_json("/api/v1/dataplanes")?;
            let ready = list["items"].as_array().map_or(0, |items| {
                items
                    .iter()
                    .filter(|i| i["inbounds"][0]["health"]["ready"] == true)
                    .count()
            });
            if ready == 2 {
                Ok(())
            } else {
                Err(format!("{list}"))
            }
        },
    );
    let shot = screenshot_path().with_file_name("zones.png");
    let args = vec![
        "--scenario".to_string(),
        "zones".to_string(),
        "--url".to_string(),
        global.api_url("/ui/"),
        // The global's zone_timeout.
        "--detection".to_string(),
        "2".to_string(),
        "--screenshot".to_string(),
        shot.display().to_string(),
    ];
    let lines = run_browser(&args, |action| match action {
        "freeze us-1" => signal(us.pid(), "-STOP"),
        "thaw us-1" => signal(us.pid(), "-CONT"),
        other => panic!("unknown action {other:?}"),
    });
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 7, "{lines:?}");
    eprintln!("screenshot: {}", shot.display());
    drop(envoys);
}

/// A fleet past one API page: 5,200 dataplanes from files (every tenth
/// `state: Ignored`, so ready; the others pending). The page shows hdsd's
/// counts and 500 rows, fetches only those rows, and narrows by a service
/// name and Not ready only on the server; its heap stays small.
#[test]
fn a_large_fleets_page_holds_only_the_rows_it_shows() {
    const FLEET: usize = 5200;
    let _one = one_browser();
    let hdsd = Hdsd::start(HdsdOptions::default());
    for file in 0..FLEET / 400 {
        let docs: Vec<String> = (file * 400..(file + 1) * 400)
            .map(|i| {
                let state = if i % 10 == 0 { "    state: Ignored\n" } else { "" };
                format!(
                    "type: Dataplane\nmesh: default\nname: dp-{i:05}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: 8080\n    serviceAddress: 127.0.0.1\n{state}    tags: {{kuma.io/service: svc-{svc}}}\n",
                    port = 10000 + i % 1000,
                    svc = i % 3,
                )
            })
            .collect();
        hdsd.write_dataplane(&format!("fleet-{file:02}.yaml"), &docs.join("---\n"));
    }
    crate::support::wait_for("the fleet defined", Duration::from_secs(60), || {
        let summary = hdsd.get_json("/api/v1/fleet/summary")?;
        match summary["dataplanes"]["total"].as_u64() {
            Some(n) if n == FLEET as u64 => Ok(()),
            other => Err(format!("{other:?} of {FLEET} defined")),
        }
    });
    let args = vec![
        "--scenario".to_string(),
        "large".to_string(),
        "--url".to_string(),
        hdsd.api_url("/ui/"),
        "--fleet".to_string(),
        FLEET.to_string(),
    ];
    let lines = run_browser(&args, |action| panic!("unknown action {action:?}"));
    let checks = lines.iter().filter(|l| l.starts_with("CHECK")).count();
    assert!(checks >= 6, "{lines:?}");
}

/// Issue 56, item 7: a page of another origin enabled a disabled zone with
/// `fetch(POST .../enable, {mode: "no-cors"})`, and a page whose DNS name
/// pointed at this machine deleted a zone (`Host: evil.example` was
/// answered). In a real Chromium, against a global with an open API: the
/// cross-origin POSTs (no-cors, text/plain, a form) change nothing, the
/// rebound DELETE is refused with the fix, and the API's own origin still
/// writes with JSON (`tests/ui/cross_site.py`).
#[test]
fn pages_of_other_sites_write_nothing_through_the_open_api_in_chromium() {
    let _one = one_browser();
    let global = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: "[global]\nenabled = true\n".into(),
        ..HdsdOptions::default()
    });
    for (method, path) in [
        ("PUT", "/api/v1/zones/ap-1"),
        ("POST", "/api/v1/zones/ap-1/disable"),
    ] {
        let url = global.api_url(path);
        let request = match method {
            "PUT" => ureq::put(&url),
            _ => ureq::post(&url),
        };
        let response = request
            .header("Content-Type", "application/json")
            .send("{}")
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(response.status(), 200, "{method} {path}");
    }
    let lines = run_script(
        "cross_site.py",
        &["--api".to_string(), global.api_url("")],
        |what| panic!("no action expected: {what}"),
    );
    let result = |name: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(&format!("RESULT {name} ")))
            .unwrap_or_else(|| panic!("no RESULT {name}: {lines:?}"))
            .to_string()
    };
    assert_eq!(result("after_cross_site"), "disabled");
    assert_eq!(result("rebound_delete"), "403");
    assert_ne!(result("after_own"), "disabled");
    assert!(
        global
            .metric("hdsd_api_browser_refusals_total{reason=\"origin\"}")
            .is_some_and(|n| n >= 3.0),
        "{}",
        global.metrics()
    );
    assert_eq!(
        global.metric("hdsd_api_browser_refusals_total{reason=\"host\"}"),
        Some(1.0)
    );
}
