//! The observability proof: a real Prometheus scrapes a running hdsd that
//! serves a real Envoy with one healthy and one unhealthy inbound; every
//! panel query of the Grafana dashboard must return data, the readiness
//! gauges must agree with the REST API, and promtool must accept the
//! metrics, the alert rules and their unit tests.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

const CONNECT: Duration = Duration::from_secs(20);
const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(REPO)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed by scripts/setup.sh (Debian package prometheus)");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", "prometheus/alerts.yml"], None);
    assert!(ok, "{out}");
    let (ok, out) = promtool(&["test", "rules", "prometheus/alerts.test.yml"], None);
    assert!(ok, "{out}");
}

/// A Prometheus server scraping hdsd every second; killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: hdsd\n  static_configs:\n  - targets: ['{target}']\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        // Port 0: Prometheus logs the address it bound.
        let log_path = dir.path().join("prometheus.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus is installed by scripts/setup.sh (Debian package prometheus)");
        let addr = wait_for("Prometheus to listen", Duration::from_secs(30), || {
            let log = std::fs::read_to_string(&log_path).map_err(|e| e.to_string())?;
            log.lines()
                .filter(|l| l.contains("msg=\"Listening on\""))
                .find_map(|l| l.split("address=").nth(1))
                .map(|a| a.trim().to_string())
                .ok_or_else(|| "not listening yet".to_string())
        });
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Runs an instant query; the result vector (or scalar) as JSON.
    fn query(&self, expr: &str) -> Result<serde_json::Value, String> {
        let mut r = ureq::get(format!("http://{}/api/v1/query", self.addr))
            .query("query", expr)
            .call()
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value = r.body_mut().read_json().map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(v.to_string());
        }
        Ok(v["data"]["result"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every target expression of the dashboard, with Grafana's variables substituted.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(REPO).join("grafana/hdsd.json")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).expect("grafana/hdsd.json is JSON");
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            let expr = expr
                .replace("$instance", ".*")
                .replace("$__rate_interval", "1m")
                .replace("$__interval", "15s")
                .replace("$__range", "5m");
            out.push((panel["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    assert!(
        out.len() >= 20,
        "the dashboard has its panels: {}",
        out.len()
    );
    out
}

#[test]
fn every_dashboard_panel_returns_data_from_a_real_prometheus() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let app = App::start();
    let (dead_port, _reserved) = dead_port();
    hdsd.write_dataplane(
        "web.yaml",
        &dataplane_yaml("web", &[(10001, app.port), (10002, dead_port)]),
    );
    let _envoy = Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    hdsd.wait_inbound("default.web", 10002, "unhealthy", CONNECT);

    // The exposition itself passes promtool's linter.
    let metrics = hdsd.metrics();
    let (ok, out) = promtool(&["check", "metrics"], Some(&metrics));
    assert!(ok, "promtool check metrics:\n{out}");
    for name in [
        "hdsd_streams_active",
        "hdsd_streams_closed_total",
        "hdsd_health_check_requests_total",
        "hdsd_reports_total",
        "hdsd_report_processing_seconds_bucket",
        "hdsd_report_unknown_endpoints_total",
        "hdsd_specifiers_sent_total",
        "hdsd_specifier_generation_seconds_bucket",
        "hdsd_specifier_generation_errors_total",
        "hdsd_dataplanes{connected=\"true\"}",
        "hdsd_inbounds{status=\"healthy\"}",
        "hdsd_readiness_transitions_total{to=\"ready\"}",
        "hdsd_dataplane_source_errors",
        "hdsd_build_info{version=",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics:\n{metrics}"
        );
    }

    let prometheus = Prometheus::start(&hdsd.api.to_string());
    wait_for("Prometheus to scrape hdsd", Duration::from_secs(30), || {
        let r = prometheus.query("up{job=\"hdsd\"} == 1")?;
        if r.as_array().is_some_and(|a| !a.is_empty()) {
            Ok(())
        } else {
            Err(r.to_string())
        }
    });

    for (title, expr) in dashboard_queries() {
        wait_for(
            &format!("panel {title:?}: {expr}"),
            Duration::from_secs(30),
            || {
                let r = prometheus.query(&expr)?;
                let non_empty = match &r {
                    serde_json::Value::Array(a) => !a.is_empty(),
                    other => !other.is_null(),
                };
                let shaped = r.as_array().is_none_or(|a| {
                    a.iter()
                        .all(|s| s["value"].as_array().is_some_and(|v| v.len() == 2))
                });
                if non_empty && shaped {
                    Ok(())
                } else {
                    Err(r.to_string())
                }
            },
        );
    }

    // The readiness gauges agree with the REST API.
    let dp = hdsd.dataplane("default.web").unwrap();
    for status in ["healthy", "unhealthy"] {
        let from_api = dp
            .inbounds
            .iter()
            .filter(|i| i.health.status == status)
            .count();
        wait_for(
            &format!("hdsd_inbounds{{status={status:?}}} = {from_api}"),
            Duration::from_secs(10),
            || {
                let r = prometheus.query(&format!("hdsd_inbounds{{status=\"{status}\"}}"))?;
                let value = r[0]["value"][1].as_str().unwrap_or("").to_string();
                if value == from_api.to_string() {
                    Ok(())
                } else {
                    Err(r.to_string())
                }
            },
        );
    }
    let connected = prometheus
        .query("hdsd_dataplanes{connected=\"true\"}")
        .unwrap();
    assert_eq!(connected[0]["value"][1], "1");
}
