//! Smoke test of `hdsd-loadgen` (kept under a minute): 500 simulated Envoys
//! against a real hdsd for about ten seconds, then against the null server.
//! It checks what the loadgen measured and what hdsd's API shows. The zone
//! mode's smoke: two simulated zones of 500 dataplanes against a global.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::zones::as_global;
use crate::support::{wait_for, Config, Hdsd};
use serde_json::Value;

const LOADGEN: &str = env!("CARGO_BIN_EXE_hdsd-loadgen");
const DATAPLANES: u64 = 500;

/// Kills the child when dropped (also when an assertion fails).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the first stdout line of `child` within `timeout`.
fn first_line(child: &mut Child, timeout: Duration) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(timeout)
        .expect("the loadgen printed nothing in time")
}

fn loadgen(args: &[&str]) -> Running {
    Running(
        Command::new(LOADGEN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null())
            .spawn()
            .expect("start hdsd-loadgen"),
    )
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for key in path.split('.') {
        cur = &cur[key];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

#[test]
fn loadgen_against_hdsd_and_null_server() {
    let hdsd = Hdsd::start_with(|c| {
        c.hds.report_interval = Duration::from_secs(1);
        // 500 simulated Envoys from 4 loopback addresses.
        c.hds.limits.max_connections_per_ip = 1000;
    });
    let dataplanes = hdsd.dataplanes_dir();
    let out = Command::new(LOADGEN)
        .args([
            "gen-dataplanes",
            "--count",
            "500",
            "--inbounds",
            "2",
            "--dir",
        ])
        .arg(&dataplanes)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The watcher has loaded them all before the simulated Envoys connect.
    wait_for("500 dataplanes loaded", Duration::from_secs(20), || {
        let v = hdsd.get_json("/api/v1/dataplanes")?;
        let n = v["items"].as_array().map_or(0, Vec::len);
        if n == 500 {
            Ok(())
        } else {
            Err(format!("{n} loaded"))
        }
    });
    let pid = hdsd.pid().to_string();
    let hds_addr = hdsd.hds.to_string();
    let api_url = format!("http://{}", hdsd.api);
    let mut run = loadgen(&[
        "run",
        "--hds",
        &hds_addr,
        "--api",
        &api_url,
        "--server-pid",
        &pid,
        "--dataplanes-dir",
        dataplanes.to_str().unwrap(),
        "--warmup",
        "1s",
        "--duration",
        "8s",
        "--source-ips",
        "4",
        "--linger",
        "40s",
        "--json",
    ]);
    let line = first_line(&mut run.0, Duration::from_secs(45));
    let r: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));

    assert_eq!(num(&r, "connected"), DATAPLANES as f64, "{r}");
    assert_eq!(num(&r, "invalid_specifiers"), 0.0, "{r}");
    assert!(num(&r, "first_specifier_all_s") < 20.0, "{r}");
    // 500 dataplanes reporting every second.
    let rate = num(&r, "reports_per_s");
    assert!((400.0..=600.0).contains(&rate), "reports/s {rate}: {r}");
    assert_eq!(num(&r, "expected_reports_per_s"), 500.0, "{r}");
    assert!(num(&r, "readiness_propagation.samples") > 0.0, "{r}");
    assert!(num(&r, "server.rss_steady_mib") > 0.0, "{r}");
    assert!(num(&r, "server.cpu_seconds_steady") > 0.0, "{r}");

    // hdsd's own view: all 500 connected and (after the loadgen settled) healthy.
    let list = format!("{api_url}/api/v1/dataplanes");
    wait_for(
        "all 500 dataplanes connected and healthy in hdsd's API",
        Duration::from_secs(10),
        || {
            let v: Value = ureq::get(&list)
                .call()
                .map_err(|e| e.to_string())?
                .body_mut()
                .read_json()
                .map_err(|e| e.to_string())?;
            let items = v["items"].as_array().ok_or("no items")?;
            let connected = items
                .iter()
                .filter(|d| d["connection"]["connected"] == true)
                .count();
            let healthy = items
                .iter()
                .filter(|d| {
                    d["inbounds"].as_array().is_some_and(|i| {
                        i.len() == 2 && i.iter().all(|i| i["health"]["status"] == "healthy")
                    })
                })
                .count();
            if items.len() == 500 && connected == 500 && healthy == 500 {
                Ok(())
            } else {
                Err(format!(
                    "{} items, {connected} connected, {healthy} healthy",
                    items.len()
                ))
            }
        },
    );
    drop(run);
    drop(hdsd);

    // The null server answers the same simulated Envoys.
    let mut null = loadgen(&[
        "null-server",
        "--listen",
        "127.0.0.1:0",
        "--report-interval",
        "1s",
        "--stats-every",
        "0s",
    ]);
    let banner = first_line(&mut null.0, Duration::from_secs(10));
    assert!(banner.contains("listening"), "{banner}");
    let null_addr = banner
        .split_whitespace()
        .find_map(|w| w.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_string();
    let out = Command::new(LOADGEN)
        .args([
            "run",
            "--hds",
            &null_addr,
            "--count",
            "100",
            "--warmup",
            "1s",
            "--duration",
            "3s",
            "--json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(num(&r, "connected"), 100.0, "{r}");
    assert_eq!(num(&r, "invalid_specifiers"), 0.0, "{r}");
    // Every simulated Envoy reported in the 3 s window (at 1 report/s). No
    // rate check: 3 s hold 2 to 4 report rounds depending on where the timers
    // fall, so a rate is a benchmark figure, not a test result.
    assert!(num(&r, "reports_sent") >= 100.0, "{r}");
    assert!(num(&r, "reports_per_s") > 0.0, "{r}");
}

/// The consumer modes at tiny scale: 200 dataplanes reporting every second,
/// 40 of them flipping, 3 gRPC watchers, then 2 EDS subscribers to the 10
/// services: each mode must receive events and time flips.
#[test]
fn loadgen_watchers_and_eds_subscribers_measure_flips() {
    let hdsd = Hdsd::start_with(|c| c.hds.report_interval = Duration::from_secs(1));
    let dataplanes = hdsd.dataplanes_dir();
    let out = Command::new(LOADGEN)
        .args(["gen-dataplanes", "--count", "200", "--per-file", "20"])
        .args(["--services", "10", "--dir"])
        .arg(&dataplanes)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    wait_for("200 dataplanes loaded", Duration::from_secs(20), || {
        let v = hdsd.get_json("/api/v1/dataplanes")?;
        let n = v["items"].as_array().map_or(0, Vec::len);
        if n == 200 {
            Ok(())
        } else {
            Err(format!("{n} loaded"))
        }
    });
    let out = Command::new(LOADGEN)
        .args(["run", "--hds", &hdsd.hds.to_string()])
        .args(["--api", &format!("http://{}", hdsd.api)])
        .args(["--server-pid", &hdsd.pid().to_string()])
        .arg("--dataplanes-dir")
        .arg(&dataplanes)
        .args(["--warmup", "1s", "--duration", "3s", "--source-ips", "4"])
        .args(["--flip-fraction", "0.2", "--sample", "0"])
        .args(["--watchers", "3", "--eds-subscribers", "2", "--json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(num(&r, "connected"), 200.0, "{r}");

    // 40 flipping dataplanes, one flip a second each.
    let w = &r["watchers"];
    assert_eq!(num(w, "watchers"), 3.0, "{r}");
    assert_eq!(num(w, "synced"), 3.0, "{r}");
    assert!(num(w, "flips_reported") > 0.0, "{r}");
    assert!(num(w, "changed_events") > 0.0, "{r}");
    assert!(num(w, "latency.samples") > 0.0, "{r}");
    assert!(num(w, "latency.p99_ms") > 0.0, "{r}");
    assert!(num(w, "flips_seen_fraction") > 0.5, "{r}");
    assert!(num(w, "server.rss_with_mib") > 0.0, "{r}");

    let e = &r["eds"];
    assert_eq!(num(e, "subscribers"), 2.0, "{r}");
    assert_eq!(num(e, "synced"), 2.0, "{r}");
    assert_eq!(num(e, "resources_subscribed"), 10.0, "{r}");
    assert!(num(e, "messages_received") > 1.0, "{r}");
    assert!(num(e, "resources_received") >= 10.0, "{r}");
    assert!(num(e, "latency.samples") > 0.0, "{r}");
    assert!(num(e, "flips_seen_fraction") > 0.5, "{r}");
    assert!(
        e["failures"].as_object().is_some_and(|f| f.is_empty()),
        "{r}"
    );
}

/// Connected dataplanes in `hdsd`'s API.
fn connected(hdsd: &Hdsd) -> Result<usize, String> {
    let v = hdsd.get_json("/api/v1/dataplanes")?;
    Ok(v["items"]
        .as_array()
        .ok_or("no items")?
        .iter()
        .filter(|d| d["connection"]["connected"] == true)
        .count())
}

/// The simulated Envoys fail over as Envoys listing several instances do:
/// all connect to the first listed; when it is killed, every one moves to
/// the other after Envoy's backoff (the first retry within 1 s).
#[test]
fn simulated_envoys_move_to_another_server_when_theirs_dies() {
    let options = |c: &mut Config| c.hds.report_interval = Duration::from_secs(1);
    let mut a = Hdsd::start_with(options);
    let b = Hdsd::start_with(options);
    for hdsd in [&a, &b] {
        let out = Command::new(LOADGEN)
            .args([
                "gen-dataplanes",
                "--count",
                "100",
                "--inbounds",
                "1",
                "--dir",
            ])
            .arg(hdsd.dataplanes_dir())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let servers = format!("{},{}", a.hds, b.hds);
    let _run = loadgen(&[
        "run",
        "--hds",
        &servers,
        "--dataplanes-dir",
        a.dataplanes_dir().to_str().unwrap(),
        "--source-ips",
        "2",
        "--duration",
        "1s",
        "--linger",
        "60s",
    ]);
    wait_for(
        "the 100 on the first server",
        Duration::from_secs(30),
        || match (connected(&a)?, connected(&b)?) {
            (100, 0) => Ok(()),
            held => Err(format!("{held:?} connected")),
        },
    );
    a.kill();
    let killed = std::time::Instant::now();
    // The first retry is drawn below 1 s; connecting and the first
    // specifier add little.
    wait_for(
        "the 100 on the other server",
        Duration::from_secs(10),
        || match connected(&b)? {
            100 => Ok(()),
            n => Err(format!("{n} connected")),
        },
    );
    eprintln!("100 simulated Envoys moved in {:?}", killed.elapsed());
}

/// `scripts/bench_api.py` (the `api100k` scenario's measurements) at 1,000
/// dataplanes, 100 of them connected, with the fleet page in Chromium:
/// every phase measures something, so the scenario cannot rot.
#[test]
fn the_fleet_api_benchmark_measures_at_a_thousand_dataplanes() {
    let hdsd = Hdsd::start_with(|c| c.hds.report_interval = Duration::from_secs(1));
    let dataplanes = hdsd.dataplanes_dir();
    let out = Command::new(LOADGEN)
        .args(["gen-dataplanes", "--count", "1000", "--per-file", "100"])
        .args(["--services", "10", "--dir"])
        .arg(&dataplanes)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let _envoys = loadgen(&[
        "run",
        "--hds",
        &hdsd.hds.to_string(),
        "--count",
        "100",
        "--prefix",
        "dp-",
        "--duration",
        "120s",
        "--flip-fraction",
        "0.1",
    ]);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        "python3".into()
    };
    let json = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new(python);
    command
        .arg(root.join("scripts/bench_api.py"))
        .args(["--api", &format!("http://{}", hdsd.api)])
        .args(["--pid", &hdsd.pid().to_string()])
        .args([
            "--dataplanes",
            "1000",
            "--connected",
            "100",
            "--rounds",
            "1",
        ])
        .args([
            "--watchers",
            "3",
            // Pages of 300: the 1,000 dataplanes' snapshot is four.
            "--snapshot-page",
            "300",
            "--service",
            "svc-0000",
            "--browser-timeout",
            "30",
        ])
        .arg("--json")
        .arg(json.path());
    let chromium = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(name))
            .find(|p| p.exists())
    });
    if let Some(chromium) = &chromium {
        command.arg("--chromium").arg(chromium);
    }
    let out = command.stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    assert_eq!(num(&r, "fleet.total"), 1000.0, "{r}");
    assert!(num(&r, "fleet.connected") >= 100.0, "{r}");
    // 1,000 items at the default page size of 500: two pages.
    assert_eq!(num(&r, "list_page.count"), 2.0, "{r}");
    assert!(num(&r, "list_page.p99_ms") > 0.0, "{r}");
    for filter in ["not_ready", "service", "status_healthy"] {
        assert_eq!(
            num(&r["list_filtered_first_page"][filter], "count"),
            20.0,
            "{r}"
        );
    }
    assert_eq!(num(&r, "summary.count"), 20.0, "{r}");
    assert_eq!(num(&r, "services.count"), 10.0, "{r}");
    for suffix in ["", "_paged"] {
        assert_eq!(num(&r, &format!("watch_synced{suffix}.count")), 5.0, "{r}");
        assert_eq!(num(&r, &format!("watchers{suffix}.held")), 3.0, "{r}");
    }
    if chromium.is_some() {
        assert!(num(&r, "browser.counts_shown_s") > 0.0, "{r}");
        assert!(num(&r, "browser.rows_drawn") > 0.0, "{r}");
        assert!(num(&r, "browser.js_heap_used_mb") > 0.0, "{r}");
    }
}

/// `hdsd-loadgen zones` at 1k dataplanes (2 zones x 500) against a global:
/// the smoke of the `zones10x10k` benchmark scenario.
#[test]
fn loadgen_zones_against_a_global() {
    let global = Hdsd::start_with(|c| {
        as_global(c, &[]);
        c.global.auto_register = true;
    });
    let zones_addr = global.zones.expect("the zone listener").to_string();
    let api_url = format!("http://{}", global.api);
    let state = global.dir.path().join("state");
    let pid = global.pid().to_string();
    let mut run = loadgen(&[
        "zones",
        "--global",
        &zones_addr,
        "--api",
        &api_url,
        "--sign-with-state-dir",
        state.to_str().unwrap(),
        "--server-pid",
        &pid,
        "--zones",
        "2",
        "--dataplanes",
        "500",
        "--flips-per-s",
        "20",
        "--connect-timeout",
        "20s",
        "--warmup",
        "1s",
        "--duration",
        "3s",
        "--outage",
        "3s",
        "--storm",
        "--json",
    ]);
    let line = first_line(&mut run.0, Duration::from_secs(45));
    let r: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let status = run.0.wait().unwrap();
    assert!(status.success(), "the loadgen exited with {status}: {r}");

    // Every remote dataplane reached the global.
    assert_eq!(num(&r, "connect.zones_caught_up"), 2.0, "{r}");
    assert_eq!(num(&r, "global_view.zones_online"), 2.0, "{r}");
    assert_eq!(num(&r, "global_view.dataplanes"), 1000.0, "{r}");
    assert_eq!(num(&r, "global_view.inbounds_total"), 2000.0, "{r}");
    assert_eq!(num(&r, "totals.rejected"), 0.0, "{r}");
    // Changes were sent, acknowledged and seen at the global's watcher.
    assert!(num(&r, "steady.changes_sent") > 0.0, "{r}");
    assert!(num(&r, "steady.change_to_ack.samples") > 0.0, "{r}");
    assert!(
        num(&r, "steady.change_to_watcher.latency.samples") > 0.0,
        "{r}"
    );
    assert!(
        num(&r, "steady.change_to_watcher.latency.p99_ms") > 0.0,
        "{r}"
    );
    // The resume replayed what changed during the outage, in fewer bytes
    // than the same zone's snapshot.
    assert_eq!(r["resume"]["resume"]["kind"], "resume", "{r}");
    assert_eq!(r["resume"]["snapshot"]["kind"], "snapshot", "{r}");
    assert!(num(&r, "resume.resume.dataplanes") > 0.0, "{r}");
    assert_eq!(num(&r, "resume.snapshot.dataplanes"), 500.0, "{r}");
    assert!(
        num(&r, "resume.resume.bytes") < num(&r, "resume.snapshot.bytes"),
        "{r}"
    );
    // The storm: both zones accepted again, with a time.
    assert_eq!(num(&r, "storm.zones_reconnected"), 2.0, "{r}");
    assert!(num(&r, "storm.accepted_all_s") >= 0.0, "{r}");
    assert!(num(&r, "server.rss_steady_mib") > 0.0, "{r}");

    // The global's own REST view: both zones with all their dataplanes, the
    // first one resumed at least once.
    let zones = global.get_json("/api/v1/zones").unwrap();
    let items = zones["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{zones}");
    for z in items {
        assert_eq!(z["dataplanes"], 500, "{zones}");
        assert_eq!(z["inbounds"]["total"], 1000, "{zones}");
    }
    let first = items.iter().find(|z| z["name"] == "lz-01").expect("lz-01");
    assert!(first["resumes"].as_u64() >= Some(1), "{zones}");
    assert!(first["snapshots"].as_u64() >= Some(2), "{zones}");
}

/// `scripts/bench_cluster.py` (the `cluster10k` and `cluster100k`
/// scenarios' measurements) at 1,000 dataplanes on three instances of one
/// throwaway PostgreSQL, reports every second: every phase measures
/// something, the failover reads no inbound not ready on the survivors and
/// they hold every dataplane, so the scenarios cannot rot. Skipped without
/// PostgreSQL, unless `HDSD_REQUIRE_POSTGRES=1`.
#[test]
fn the_cluster_benchmark_measures_at_a_thousand_dataplanes() {
    if !crate::support::postgres::Postgres::installed(
        "the_cluster_benchmark_measures_at_a_thousand_dataplanes",
    ) {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_hdsd"))
        .parent()
        .unwrap();
    let json = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("python3")
        .arg(root.join("scripts/bench_cluster.py"))
        .arg("--bin")
        .arg(bin)
        .args(["--instances", "3", "--dataplanes", "1000"])
        .args([
            "--window",
            "3",
            "--latency-window",
            "3",
            "--latency-sample",
            "20",
        ])
        .args(["--report-interval", "1", "--instance-timeout", "2"])
        .args(["--source-ips", "4", "--port-base", "0", "--json"])
        .arg(json.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    assert_eq!(num(&r, "instances"), 3.0, "{r}");
    // Report at a -> visible at b: timed flips seen (each within 3 s).
    let latency = &r["latency"]["propagation"];
    assert!(num(latency, "samples") > 0.0, "{r}");
    assert!(num(latency, "timeouts_3s") < num(latency, "samples"), "{r}");
    assert!(num(latency, "p50_ms") > 0.0, "{r}");
    assert!(num(latency, "p99_ms") >= num(latency, "p50_ms"), "{r}");
    // Memory: the fleet view costs something per dataplane, and so does a stream.
    assert!(num(&r, "memory.per_dataplane_not_held_bytes") > 0.0, "{r}");
    assert!(num(&r, "memory.a_held_mib") > 0.0, "{r}");
    for name in ["a", "b", "c"] {
        assert!(num(&r["steady"]["hdsd_cpu_pct"], name) > 0.0, "{r}");
        assert!(num(&r["steady"]["hdsd_rss_mib"], name) > 0.0, "{r}");
        assert!(num(&r["steady"]["write_tx_per_s"], name) > 0.0, "{r}");
        assert_eq!(
            num(&r["steady"]["not_ready_inbounds_at_end"], name),
            0.0,
            "{r}"
        );
    }
    assert!(
        num(&r, "steady.postgres_pss_mib_all_processes") > 0.0,
        "{r}"
    );
    // Failover: c's Envoys moved to a and b by themselves, nothing read not ready.
    let failover = &r["failover"];
    assert_eq!(failover["killed"], "c", "{r}");
    assert_eq!(
        num(failover, "max_not_ready_inbounds_all_survivors"),
        0.0,
        "{r}"
    );
    let held_at_end = num(&failover["held_at_end"], "a") + num(&failover["held_at_end"], "b");
    assert_eq!(held_at_end, 1000.0, "{r}");
    assert!(num(failover, "samples") > 10.0, "{r}");
    assert!(
        num(failover, "survivors_cpu_us_per_reconnect") >= 0.0,
        "{r}"
    );
}
