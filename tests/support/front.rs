//! A front Envoy from `hdsd bootstrap front` and a client that sends it a
//! request every 20 ms, counting hits by app name and every failure.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// What the client saw: hits by app name, and failed requests.
#[derive(Debug, Default)]
pub struct Tally {
    hits: BTreeMap<String, u64>,
    failures: Vec<String>,
}

/// Sends a request every 20 ms until dropped.
pub struct Client {
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    pub fn start(url: String) -> Client {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (tally.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(3)))
                .build()
                .into();
            let started = Instant::now();
            let mut next = started;
            while !s.load(Ordering::Relaxed) {
                let result = agent
                    .get(&url)
                    .call()
                    .map_err(|e| e.to_string())
                    .and_then(|mut r| r.body_mut().read_to_string().map_err(|e| e.to_string()));
                {
                    let mut tally = t.lock().unwrap();
                    match result {
                        Ok(name) => *tally.hits.entry(name).or_default() += 1,
                        Err(e) => tally
                            .failures
                            .push(format!("at {:?}: {e}", started.elapsed())),
                    }
                }
                next += Duration::from_millis(20);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Client {
            tally,
            stop,
            thread: Some(thread),
        }
    }

    pub fn hits(&self, app: &str) -> u64 {
        self.tally
            .lock()
            .unwrap()
            .hits
            .get(app)
            .copied()
            .unwrap_or(0)
    }

    /// Every app's hits so far.
    pub fn all_hits(&self) -> BTreeMap<String, u64> {
        self.tally.lock().unwrap().hits.clone()
    }

    pub fn failures(&self) -> Vec<String> {
        self.tally.lock().unwrap().failures.clone()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A front Envoy whose admin and listener ports are chosen by the kernel and
/// read back from the admin API: no port is guessed.
pub struct Front {
    pub envoy: Envoy,
    pub admin: String,
    pub listener: u16,
}

/// What `hdsd bootstrap front` is given beyond the server.
#[derive(Debug, Clone, Default)]
pub struct FrontOptions {
    /// `--zone`.
    pub zone: Option<String>,
    /// `--token`.
    pub token: Option<String>,
}

impl Front {
    /// A front for service `web` of mesh `default`, fed by hdsd's EDS at `server`.
    pub fn start(server: &str, options: FrontOptions) -> Front {
        Self::start_release(&envoy_bin(), server, options)
    }

    /// [`Front::start`] with the Envoy binary `bin` (see [`envoy_release`]).
    pub fn start_release(bin: &std::path::Path, server: &str, options: FrontOptions) -> Front {
        let dir = tempfile::tempdir().unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"));
        command.args([
            "bootstrap",
            "front",
            "--service",
            "web",
            "--listen",
            "127.0.0.1:0",
            "--server",
            server,
            "--admin-port",
            "0",
        ]);
        if let Some(zone) = &options.zone {
            command.args(["--zone", zone]);
        }
        if let Some(token) = &options.token {
            command.args(["--token", token]);
        }
        let out = command.output().expect("run hdsd bootstrap front");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let yaml = String::from_utf8(out.stdout).unwrap();
        // The harness passes --admin-address-path; Envoy::admin reads it back.
        let envoy = Envoy::start_release_with_bootstrap(bin, dir, "front", &yaml);
        let admin = envoy.admin().to_string();
        let listener = wait_for("the front's listener port", Duration::from_secs(20), || {
            let v: serde_json::Value = ureq::get(&format!("http://{admin}/listeners?format=json"))
                .call()
                .map_err(|e| e.to_string())?
                .body_mut()
                .read_json()
                .map_err(|e| e.to_string())?;
            v["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                .as_u64()
                .filter(|p| *p != 0)
                .map(|p| p as u16)
                .ok_or_else(|| v.to_string())
        });
        Front {
            envoy,
            admin,
            listener,
        }
    }

    /// A text page of the front's admin API.
    fn admin_text(&self, path: &str) -> Result<String, String> {
        ureq::get(&format!("http://{}{path}", self.admin))
            .call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())
    }

    /// The front's view of one endpoint: its stats and health flags, from /clusters.
    pub fn host(&self, port: u16) -> Result<BTreeMap<String, String>, String> {
        let text = self.admin_text("/clusters")?;
        let prefix = format!("default/web::127.0.0.1:{port}::");
        let host: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| l.split_once("::"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if host.is_empty() {
            Err(format!("no host 127.0.0.1:{port} in /clusters"))
        } else {
            Ok(host)
        }
    }

    /// A counter or gauge of the front's `default/web` cluster, by its
    /// name after the cluster (e.g. `assignment_stale`), from /stats.
    pub fn cluster_stat(&self, name: &str) -> Result<u64, String> {
        let text = self.admin_text(&format!("/stats?filter={name}"))?;
        let line = format!("cluster.default/web.{name}: ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no {line:?} in /stats: {text:?}"))
    }

    /// Whether the front holds the endpoint on `port` DRAINING (from EDS).
    pub fn draining(&self, port: u16) -> Result<(), String> {
        let host = self.host(port)?;
        match host.get("health_flags") {
            Some(f) if f.contains("eds_status_draining") => Ok(()),
            other => Err(format!("health_flags {other:?}")),
        }
    }

    pub fn connections_to(&self, port: u16) -> u64 {
        self.host(port)
            .ok()
            .and_then(|h| h.get("cx_total")?.parse().ok())
            .unwrap_or(0)
    }
}

/// Sends `n` requests to `url` one after the other and returns the hits of
/// each app; every request must be answered.
pub fn hits_of(url: &str, n: usize) -> BTreeMap<String, u64> {
    let mut hits = BTreeMap::new();
    for i in 0..n {
        let body = ureq::get(url)
            .call()
            .map_err(|e| e.to_string())
            .and_then(|mut r| r.body_mut().read_to_string().map_err(|e| e.to_string()))
            .unwrap_or_else(|e| panic!("request {i} of {n} failed: {e}"));
        *hits.entry(body).or_insert(0) += 1;
    }
    hits
}
