//! `docker compose up` for real: the compose demo (docker-compose.yml) on the
//! local Docker engine, checked like a user would, through its published ports.
//!
//! The engine may have no registry: every image comes from
//! `tests/compose/standins.sh` (local stand-ins, built once and reused while
//! their inputs are unchanged) through the override `tests/compose/offline.yml`;
//! hdsd's image is built from the repository's Dockerfile on those stand-ins;
//! Grafana has no stand-in and stays out (a profile).
//!
//! Proves: the init container makes the key, tokens and bootstraps (the
//! Envoys connect with them); hdsd turns healthy; every inbound of the demo
//! turns ready; stopping an app container turns its inbound not ready within
//! the documented worst-case detection time and starting it makes it ready
//! again; Prometheus scrapes hdsd (`up{job="hdsd"} == 1`) with every alert
//! rule loaded; `down -v` leaves no container, network or volume behind.
//!
//! Without a Docker engine it says so on one line and passes, unless
//! HDSD_REQUIRE_DOCKER=1 (set by .ci/run): then it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::wait_for;
use hdsd::api::DataplaneItem;
use hdsd::clock::{Clock as _, SystemClock};
use serde_json::Value;

/// How hdsd's image is made: the Dockerfile's `runtime` target with the hdsd
/// `cargo test` built mounted (prebuilt.yml; the default, seconds), or the
/// whole Dockerfile, compiling hdsd in Docker (HDSD_COMPOSE_BUILD=dockerfile;
/// tens of minutes on two cores).
fn compiles_in_docker() -> bool {
    std::env::var("HDSD_COMPOSE_BUILD").is_ok_and(|v| v == "dockerfile")
}

fn compose_files() -> Vec<&'static str> {
    let mut files = vec!["docker-compose.yml", "tests/compose/offline.yml"];
    if !compiles_in_docker() {
        files.push("tests/compose/prebuilt.yml");
    }
    files
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A line on the terminal even when the test passes (libtest captures only
/// the print macros).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "compose_up: {line}");
}

fn output(mut c: Command) -> Result<Output, String> {
    let shown = format!("{c:?}");
    let out = c.output().map_err(|e| format!("cannot run {shown}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{shown} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn stdout(c: Command) -> String {
    let out = output(c).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn docker(args: &[&str]) -> Command {
    let mut c = Command::new("docker");
    c.args(args);
    c
}

/// The engine's version, or why there is none.
fn engine() -> Result<String, String> {
    output(docker(&["version", "--format", "{{.Server.Version}}"]))
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// `docker compose` (v2 plugin), else `docker-compose` on PATH, else the
/// docker-compose scripts/setup.sh puts in .venv: the program, its leading
/// arguments and its version line.
fn compose_program() -> Option<(String, Vec<String>, String)> {
    let venv = repo().join(".venv/bin/docker-compose");
    let candidates = [
        ("docker".to_string(), vec!["compose".to_string()]),
        ("docker-compose".to_string(), vec![]),
        (venv.display().to_string(), vec![]),
    ];
    candidates.into_iter().find_map(|(program, lead)| {
        let mut c = Command::new(&program);
        c.args(&lead).arg("version");
        let out = output(c).ok()?;
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        Some((program, lead, version))
    })
}

/// A loopback port that is free now and outside the kernel's ephemeral range,
/// so that no test binding port 0 can be handed it while compose runs.
fn fixed_port(taken: &mut Vec<u16>) -> u16 {
    use rand::Rng;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let range = if low > 21000 { 20000..low } else { 1024..low };
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(range.clone());
        if !taken.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.push(port);
            return port;
        }
    }
}

/// One compose project: unique name, its own ports; `down -v` when dropped
/// (printing the logs first if the test is failing).
struct Project {
    program: String,
    lead: Vec<String>,
    name: String,
    env: BTreeMap<&'static str, String>,
    up: bool,
}

impl Project {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.lead);
        for f in compose_files() {
            c.args(["-f", f]);
        }
        c.args(["-p", &self.name])
            .args(args)
            .current_dir(repo())
            .env_remove("COMPOSE_FILE")
            .env_remove("COMPOSE_PROFILES")
            .env_remove("COMPOSE_PROJECT_NAME")
            .envs(&self.env);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        stdout(self.command(args))
    }

    fn container(&self, service: &str) -> String {
        let id = self.run(&["ps", "-q", service]);
        assert!(!id.is_empty(), "no container for service {service}");
        id
    }

    fn down(&mut self) {
        self.up = false;
        self.run(&["down", "-v", "--remove-orphans", "--timeout", "5"]);
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if !self.up {
            return;
        }
        if std::thread::panicking() {
            if let Ok(out) = output(self.command(&["ps"])) {
                eprintln!("{}", String::from_utf8_lossy(&out.stdout));
            }
            if let Ok(out) = output(self.command(&["logs", "--no-color", "--tail", "80"])) {
                eprintln!("{}", String::from_utf8_lossy(&out.stdout));
            }
        }
        if let Err(e) = output(self.command(&["down", "-v", "--remove-orphans", "--timeout", "5"]))
        {
            eprintln!("{e}");
        }
    }
}

fn get(url: &str, token: Option<&str>) -> Result<Value, String> {
    let mut request = ureq::get(url);
    if let Some(t) = token {
        request = request.header("Authorization", &format!("Bearer {t}"));
    }
    let mut response = request.call().map_err(|e| format!("GET {url}: {e}"))?;
    response
        .body_mut()
        .read_json()
        .map_err(|e| format!("GET {url}: {e}"))
}

/// The demo's dataplanes: id -> (inbound port -> kuma.io/service).
fn demo_dataplanes() -> BTreeMap<String, BTreeMap<u16, String>> {
    let dir = repo().join("examples/dataplanes");
    let mut all = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let yaml: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let id = format!(
            "{}.{}",
            yaml["mesh"].as_str().unwrap(),
            yaml["name"].as_str().unwrap()
        );
        let inbounds = yaml["networking"]["inbound"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["port"].as_u64().unwrap() as u16,
                    i["tags"]["kuma.io/service"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        all.insert(id, inbounds);
    }
    assert!(!all.is_empty(), "no dataplanes in {}", dir.display());
    all
}

/// The demo configuration's documented worst-case detection time.
fn detection_time() -> Duration {
    let config = hdsd::config::Config::load(Some(&repo().join("examples/hdsd.toml")))
        .expect("examples/hdsd.toml loads");
    hdsd::specifier::SpecifierSettings::from(&config)
        .defaults
        .worst_case_detection(config.hds.report_interval)
}

fn dataplanes(api: &str, token: &str) -> Result<Vec<DataplaneItem>, String> {
    let list = get(&format!("{api}/api/v1/dataplanes"), Some(token))?;
    serde_json::from_value(list["items"].clone()).map_err(|e| e.to_string())
}

/// The readiness of every inbound of the demo, or what is missing.
fn readiness(
    api: &str,
    token: &str,
    demo: &BTreeMap<String, BTreeMap<u16, String>>,
) -> Result<BTreeMap<(String, u16), bool>, String> {
    let items = dataplanes(api, token)?;
    let mut ready = BTreeMap::new();
    for (id, inbounds) in demo {
        let dp = items
            .iter()
            .find(|d| format!("{}.{}", d.mesh, d.name) == *id)
            .ok_or_else(|| format!("{id} not listed"))?;
        if !dp.connection.connected {
            return Err(format!("{id} not connected: {:?}", dp.connection));
        }
        for port in inbounds.keys() {
            let inbound = dp
                .inbounds
                .iter()
                .find(|i| i.port == *port)
                .ok_or_else(|| format!("{id} has no inbound {port}"))?;
            ready.insert((id.clone(), *port), inbound.health.ready);
        }
    }
    Ok(ready)
}

fn container_finished_at(id: &str) -> chrono::DateTime<chrono::Utc> {
    let at = stdout(docker(&["inspect", "-f", "{{.State.FinishedAt}}", id]));
    chrono::DateTime::parse_from_rfc3339(&at)
        .unwrap_or_else(|e| panic!("container {id} FinishedAt {at:?}: {e}"))
        .with_timezone(&chrono::Utc)
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[test]
fn compose_up_runs_the_demo_offline() {
    let required = std::env::var("HDSD_REQUIRE_DOCKER").is_ok_and(|v| v == "1");
    let version = match engine() {
        Ok(v) => v,
        Err(e) if required => panic!(
            "HDSD_REQUIRE_DOCKER=1 but no Docker engine answers; start one (or unset \
             HDSD_REQUIRE_DOCKER to skip this test): {e}"
        ),
        Err(e) => {
            // docker's own reason is its last line (e.g. "Cannot connect to the Docker daemon").
            let reason = e
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            say(&format!(
                "SKIPPED: no Docker engine answers ({}); set HDSD_REQUIRE_DOCKER=1 to fail instead",
                reason.trim()
            ));
            return;
        }
    };
    let (program, lead, compose_version) = compose_program().unwrap_or_else(|| {
        panic!(
            "a Docker engine ({version}) answers but there is no compose: install the compose \
             plugin (`docker compose`) or docker-compose, or run scripts/setup.sh"
        )
    });
    let shown = std::iter::once(program.rsplit('/').next().unwrap().to_string())
        .chain(lead.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    say(&format!(
        "Docker engine {version}; using `{shown}` ({compose_version}); hdsd image: {}",
        if compiles_in_docker() {
            "the Dockerfile, compiling hdsd"
        } else {
            "the Dockerfile's runtime target with this build's hdsd mounted"
        }
    ));

    // Stand-in images (built once, reused while their inputs are unchanged).
    let started = Instant::now();
    let tag = stdout({
        let mut c = Command::new(repo().join("tests/compose/standins.sh"));
        if compiles_in_docker() {
            c.arg("--rust");
        }
        c.env("ENVOY_BIN", crate::support::envoy_bin());
        c
    });
    let tag = tag.lines().last().unwrap_or_default().to_string();
    let standins_time = started.elapsed();

    let mut ports = Vec::new();
    let api_port = fixed_port(&mut ports);
    let prometheus_port = fixed_port(&mut ports);
    let token = format!("compose-test-{}", rand::random::<u64>());
    let name = format!(
        "hdsdtest{}x{}",
        std::process::id(),
        rand::random::<u32>() % 1_000_000
    );
    // One hdsd image per checkout: its build cache survives between runs.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    repo().hash(&mut hasher);
    let image = format!("hdsd-test/hdsd:{:016x}", hasher.finish());
    let mut project = Project {
        program,
        lead,
        name: name.clone(),
        env: BTreeMap::from([
            ("STANDIN_TAG", tag.clone()),
            ("HDSD_IMAGE", image),
            ("HDSD_BINARY", env!("CARGO_BIN_EXE_hdsd").to_string()),
            ("DEMO_API_PORT", api_port.to_string()),
            ("DEMO_PROMETHEUS_PORT", prometheus_port.to_string()),
            ("DEMO_API_TOKEN", token.clone()),
            // The classic builder: the Dockerfile needs nothing newer, and it
            // uses the local stand-ins without asking a registry.
            ("DOCKER_BUILDKIT", "0".to_string()),
            ("COMPOSE_DOCKER_CLI_BUILD", "0".to_string()),
        ]),
        up: false,
    };

    let started = Instant::now();
    project.run(&["build"]);
    let build_time = started.elapsed();

    let started = Instant::now();
    project.up = true;
    project.run(&["up", "-d"]);
    let api = format!("http://127.0.0.1:{api_port}");
    let prometheus = format!("http://127.0.0.1:{prometheus_port}");

    // hdsd healthy and ready.
    wait_for("hdsd /healthz", Duration::from_secs(60), || {
        ureq::get(&format!("{api}/healthz"))
            .call()
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    wait_for("hdsd /readyz", Duration::from_secs(60), || {
        ureq::get(&format!("{api}/readyz"))
            .call()
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    // /api/* needs the token compose passed.
    assert!(
        get(&format!("{api}/api/v1/dataplanes"), None).is_err(),
        "/api/v1/dataplanes answered without the API token"
    );

    // Every inbound ready: the Envoys connected with the tokens and bootstraps
    // hdsd-init made, signed by the key it made (auth mode token).
    let demo = demo_dataplanes();
    wait_for(
        "every inbound of the demo to be ready",
        Duration::from_secs(120),
        || {
            let r = readiness(&api, &token, &demo)?;
            if r.values().all(|ready| *ready) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    );
    let ready_time = started.elapsed();
    let init = project.run(&["ps", "-a", "-q", "hdsd-init"]);
    let init_exit = stdout(docker(&["inspect", "-f", "{{.State.ExitCode}}", &init]));
    assert_eq!(init_exit, "0", "hdsd-init exited with {init_exit}");
    let metrics = ureq::get(&format!("{api}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("hdsd_auth_failures_total") && !l.ends_with(" 0")),
        "authentication failures with the init container's tokens:\n{metrics}"
    );

    // Stop an app: its inbound turns not ready within the detection time;
    // start it: ready again. backend-admin shares backend's network namespace,
    // so stopping it stops only its process (see docs/operating.md, "Docker
    // Compose").
    let app = "backend-admin";
    let (dp, port) = demo
        .iter()
        .flat_map(|(id, inbounds)| {
            inbounds
                .iter()
                .filter(|(_, service)| service.as_str() == app)
                .map(move |(port, _)| (id.clone(), *port))
        })
        .next()
        .unwrap_or_else(|| panic!("no inbound of service {app} in examples/dataplanes"));
    let detection = detection_time();
    let container = project.container(app);
    project.run(&["stop", "--timeout", "5", app]);
    let died = container_finished_at(&container);
    wait_for(
        &format!("{dp} inbound {port} not ready after `stop {app}`"),
        detection + Duration::from_secs(10),
        || match readiness(&api, &token, &demo)?.get(&(dp.clone(), port)) {
            Some(false) => Ok(()),
            other => Err(format!("ready: {other:?}")),
        },
    );
    let detected = (SystemClock.now() - died)
        .to_std()
        .unwrap_or(Duration::ZERO);
    // The other inbounds are unaffected.
    let r = readiness(&api, &token, &demo).unwrap();
    assert!(
        r.iter()
            .all(|(k, ready)| *ready || *k == (dp.clone(), port)),
        "stopping {app} affected other inbounds: {r:?}"
    );
    // Polling adds up to the API's answer time; the bound is the documented one
    // plus one second for the polls and this machine's scheduling.
    assert!(
        detected <= detection + Duration::from_secs(1),
        "{dp} inbound {port} turned not ready {} after {app} stopped; documented worst case {}",
        secs(detected),
        secs(detection)
    );
    let started_app = Instant::now();
    project.run(&["start", app]);
    wait_for(
        &format!("{dp} inbound {port} ready after `start {app}`"),
        Duration::from_secs(60),
        || {
            let r = readiness(&api, &token, &demo)?;
            if r.values().all(|ready| *ready) {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        },
    );
    let recovered = started_app.elapsed();

    // Prometheus scrapes hdsd and has loaded every alert rule.
    wait_for(
        "Prometheus: up{job=\"hdsd\"} == 1",
        Duration::from_secs(60),
        || {
            let v = get(
                &format!("{prometheus}/api/v1/query?query=up%7Bjob%3D%22hdsd%22%7D"),
                None,
            )?;
            let result = &v["data"]["result"];
            match result.as_array().map(|r| r.as_slice()) {
                Some([one]) if one["value"][1] == "1" => Ok(()),
                _ => Err(v.to_string()),
            }
        },
    );
    let alerts: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("prometheus/alerts.yml")).unwrap(),
    )
    .unwrap();
    let expected: BTreeSet<String> = alerts["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect();
    assert!(!expected.is_empty());
    wait_for(
        "Prometheus: every alert rule loaded and evaluated",
        Duration::from_secs(60),
        || {
            let v = get(&format!("{prometheus}/api/v1/rules"), None)?;
            let rules: Vec<&Value> = v["data"]["groups"]
                .as_array()
                .ok_or_else(|| v.to_string())?
                .iter()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .collect();
            let loaded: BTreeSet<String> = rules
                .iter()
                .filter_map(|r| r["name"].as_str().map(String::from))
                .collect();
            if loaded != expected {
                return Err(format!("loaded {loaded:?}, expected {expected:?}"));
            }
            match rules.iter().find(|r| r["health"] != "ok") {
                Some(r) => Err(format!("rule not healthy: {r}")),
                None => Ok(()),
            }
        },
    );

    // Everything the project made, then `down -v`: nothing of it is left.
    let containers = project.run(&["ps", "-a", "-q"]);
    let mut volumes = BTreeSet::new();
    for id in containers.lines() {
        let mounts = stdout(docker(&[
            "inspect",
            "-f",
            "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}",
            id,
        ]));
        volumes.extend(mounts.split_whitespace().map(String::from));
    }
    assert!(volumes.len() >= 2, "volumes in use: {volumes:?}");
    let started = Instant::now();
    project.down();
    let down_time = started.elapsed();
    let label = format!("label=com.docker.compose.project={name}");
    for (what, args) in [
        ("containers", vec!["ps", "-a", "-q", "--filter", &label]),
        ("networks", vec!["network", "ls", "-q", "--filter", &label]),
        ("volumes", vec!["volume", "ls", "-q", "--filter", &label]),
    ] {
        let left = stdout(docker(&args));
        assert!(left.is_empty(), "`down -v` left {what}: {left}");
    }
    let all_volumes: BTreeSet<String> = stdout(docker(&["volume", "ls", "-q"]))
        .lines()
        .map(String::from)
        .collect();
    let left: Vec<_> = volumes.intersection(&all_volumes).collect();
    assert!(left.is_empty(), "`down -v` left volumes: {left:?}");

    say(&format!(
        "stand-ins {} (tag {tag}), hdsd image build {}, `up` to every inbound ready {}, \
         detection {} (documented {}), recovery {}, down {}",
        secs(standins_time),
        secs(build_time),
        secs(ready_time),
        secs(detected),
        secs(detection),
        secs(recovered),
        secs(down_time),
    ));
}
