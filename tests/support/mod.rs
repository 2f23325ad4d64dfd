//! The integration harness: starts hdsd (the real binary), real Envoys and
//! tiny TCP applications on loopback, waits on conditions with deadlines, and
//! kills everything it started when dropped, also when a test panics (then it
//! prints the processes' logs).
//!
//! No port is ever picked and handed on: every listener binds port 0 and
//! the harness reads back what it got. hdsd's two listeners are bound by the
//! harness and passed in (`LISTEN_FDS`, as systemd does), so a restarted hdsd
//! has the same ports without a window in which another test could take them;
//! Envoy's admin listener binds port 0 and writes its address to a file; an
//! app that is stopped keeps its port reserved (bound, not listening) until
//! it starts again.
#![allow(dead_code)] // each test file uses a different part of the harness

pub mod apps;
pub mod cluster;
pub mod front;
pub mod grpc;
pub mod lossy;
pub mod netns;
pub mod pki;
pub mod postgres;
pub mod relay;
pub mod tmpfs;
pub mod zones;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdsd::api::{DataplaneItem, SourcesView};
use hdsd::bootstrap::{bootstrap_yaml, BootstrapParams};
pub use hdsd::config::{
    AuthMode, CheckFallback, CheckTlsConfig, Config, DataplanesSource, StoreKind, TlsConfig,
    ZoneConfig,
};
use hdsd::dataplane::DataplaneId;
use hdsd::view::Paged;

/// The Envoy binary: `$ENVOY_BIN`, or the one `scripts/setup.sh` installs.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let found = std::fs::read_dir(&venv).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("site-packages/envoy/_bin/envoy"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!("no Envoy binary: run scripts/setup.sh (or `make test`), or set ENVOY_BIN")
    })
}

/// The binary of the Envoy release `minor` (e.g. "1.37"): one of the
/// releases `scripts/setup.sh` installs under `.envoys/` (ENVOY_MATRIX), or
/// the main one (`envoy_bin`) when that is this release. With its full
/// version, as `envoy --version` prints it.
pub fn envoy_release(minor: &str) -> (String, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(".envoys");
    let prefix = format!("{minor}.");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| {
            let name = d.file_name().to_string_lossy().to_string();
            let bin = d.path().join("envoy/_bin/envoy");
            (name.starts_with(&prefix) && bin.exists()).then_some((name, bin))
        })
        .collect();
    found.sort();
    if let Some(newest) = found.pop() {
        return newest;
    }
    let main = envoy_bin();
    let version = envoy_version(&main);
    if version.starts_with(&prefix) {
        return (version, main);
    }
    panic!(
        "no Envoy {minor} under {} nor as the main Envoy ({version}): run scripts/setup.sh (or `make test`), which installs every supported release",
        root.display()
    )
}

/// The version an Envoy binary prints (`envoy --version`), e.g. "1.40.0".
pub fn envoy_version(bin: &Path) -> String {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    // "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    text.split('/')
        .find(|p| p.split('.').count() == 3 && p.split('.').all(|n| n.parse::<u32>().is_ok()))
        .unwrap_or_else(|| panic!("no version in {text:?}"))
        .to_string()
}

/// A loopback listener on a port the kernel chose.
pub fn listener() -> StdListener {
    StdListener::bind("127.0.0.1:0").expect("bind an ephemeral port")
}

/// A port nobody listens on, reserved for as long as the returned socket
/// lives: connections to it are refused, and no other test can take it.
pub fn dead_port() -> (u16, socket2::Socket) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind an ephemeral port");
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("bound address")
        .port();
    (port, socket)
}

/// Polls `f` every 25 ms until it returns `Some`, or panics after `timeout`
/// naming what was awaited and the last observation.
/// Checks `f` every 100 ms for `period`: a state that must hold, not one
/// waited for. Panics with what broke it and when.
pub fn hold_for(what: &str, period: Duration, mut f: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        if let Err(broke) = f() {
            panic!(
                "{what} stopped holding after {:?}: {broke}",
                start.elapsed()
            );
        }
        if start.elapsed() >= period {
            return;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::park_timeout(Duration::from_millis(25)),
        }
    }
}

/// How the harness runs an hdsd process, besides its configuration
/// (which is a [`Config`], see [`Hdsd::start_with`]).
#[derive(Debug, Clone, Default)]
pub struct HdsdOptions {
    /// Run hdsd with this open-file limit (soft and hard), through `prlimit`.
    pub nofile: Option<u64>,
    /// Extra environment variables (`HDSD_*` settings) for hdsd.
    pub env: Vec<(String, String)>,
}

/// The configuration every hdsd of the tests starts from: the defaults with
/// short intervals (reports and checks every 200 ms, two failures make an
/// inbound unhealthy), no authentication, every file under `dir`, and a
/// verbose log the tests can read whole. [`Hdsd::start_with`]'s closure
/// edits it; the harness then sets the listen addresses.
pub fn test_config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.state_dir = dir.join("state");
    c.dataplanes.dir = dir.join("dataplanes");
    c.hds.report_interval = Duration::from_millis(200);
    c.hds.unknown_dataplane_grace = Duration::from_secs(30);
    c.hds.check.interval = Duration::from_millis(200);
    c.hds.check.timeout = Duration::from_millis(100);
    c.hds.check.unhealthy_threshold = 2;
    c.auth.mode = AuthMode::None;
    c.log.level = "info,hdsd=debug".into();
    // Debug lines are many: tests read the log whole (one test checks the budget).
    c.log.max_bytes_per_second = 16 * 1024 * 1024;
    c
}

/// A running hdsd in its own temporary directory.
pub struct Hdsd {
    pub dir: tempfile::TempDir,
    pub hds: SocketAddr,
    pub api: SocketAddr,
    /// The zone listener (`global.listen`), on a global.
    pub zones: Option<SocketAddr>,
    /// The configuration written to [`Hdsd::config_path`] at every start
    /// (see [`Hdsd::reconfigure`]).
    pub config: Config,
    /// The listening sockets passed to every hdsd process of this test.
    sockets: Vec<StdListener>,
    child: Option<Child>,
    options: HdsdOptions,
}

impl Hdsd {
    /// An hdsd with the tests' configuration ([`test_config`]), run as
    /// `options` say.
    pub fn start(options: HdsdOptions) -> Hdsd {
        Self::start_configured(options, |_| {})
    }

    /// An hdsd with the tests' configuration edited by `edit`, e.g.
    /// `Hdsd::start_with(|c| c.hds.limits.max_connections_per_ip = 50)`.
    pub fn start_with(edit: impl FnOnce(&mut Config)) -> Hdsd {
        Self::start_configured(HdsdOptions::default(), edit)
    }

    /// [`Hdsd::start_with`], run as `options` say (open-file limit,
    /// environment).
    ///
    /// The listen addresses are the harness's: it binds the HDS and API
    /// listeners (and the zone listener when `edit` enables `[global]`)
    /// and passes them in, whatever `edit` set.
    pub fn start_configured(options: HdsdOptions, edit: impl FnOnce(&mut Config)) -> Hdsd {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = test_config(dir.path());
        edit(&mut config);
        std::fs::create_dir_all(&config.dataplanes.dir).unwrap();
        let count = if config.global.enabled { 3 } else { 2 };
        let sockets: Vec<StdListener> = (0..count).map(|_| listener()).collect();
        let mut hdsd = Hdsd {
            hds: sockets[0].local_addr().unwrap(),
            api: sockets[1].local_addr().unwrap(),
            zones: sockets.get(2).map(|s| s.local_addr().unwrap()),
            sockets,
            dir,
            config,
            child: None,
            options,
        };
        hdsd.spawn();
        hdsd
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("hdsd.toml")
    }

    pub fn dataplanes_dir(&self) -> PathBuf {
        self.config.dataplanes.dir.clone()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("hdsd.log")
    }

    /// Edits the configuration; the next start ([`Hdsd::restart`],
    /// [`Hdsd::start_again`]) runs with it.
    pub fn reconfigure(&mut self, edit: impl FnOnce(&mut Config)) {
        edit(&mut self.config);
    }

    /// Writes [`Hdsd::config`] as TOML to [`Hdsd::config_path`], with the
    /// harness's listeners, and checks that hdsd's loader reads back the
    /// same configuration (so no setting is lost on the way).
    fn write_config(&mut self) {
        self.config.hds.listen = self.hds;
        self.config.api.listen = self.api;
        if let Some(zones) = self.zones {
            self.config.global.listen = zones;
        }
        let text = toml::to_string(&self.config).expect("the configuration serialises");
        let loaded = Config::from_text(&text, "toml")
            .unwrap_or_else(|e| panic!("the written configuration does not load: {e}\n{text}"));
        assert_eq!(
            loaded, self.config,
            "the written configuration loads otherwise:\n{text}"
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    fn spawn(&mut self) {
        self.write_config();
        let o = &self.options;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut command = match o.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_hdsd"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_hdsd")),
        };
        command
            .arg("serve")
            .arg("--config")
            .arg(self.config_path())
            .env_remove("RUST_LOG")
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .env("LISTEN_FDS", self.sockets.len().to_string())
            .envs(o.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null());
        let fds: Vec<_> = self.sockets.iter().map(|s| s.as_fd()).collect();
        pass_fds(&mut command, &fds);
        let child = command.spawn().expect("start hdsd");
        self.child = Some(child);
        let url = format!("http://{}/readyz", self.api);
        wait_for("hdsd /readyz", Duration::from_secs(20), || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("hdsd exited with {status}:\n{}", self.log());
            }
            // A bounded call: the listening sockets are the test's own, so
            // a dead hdsd's port still accepts and would never answer.
            ureq::get(&url)
                .config()
                .timeout_global(Some(Duration::from_secs(2)))
                .build()
                .call()
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn write_dataplane(&self, file: &str, yaml: &str) {
        // Write then rename, as editors and config tools do: never a half file.
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.dataplanes_dir().join(file)).unwrap();
    }

    pub fn remove_dataplane(&self, file: &str) {
        std::fs::remove_file(self.dataplanes_dir().join(file)).unwrap();
    }

    pub fn api_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    /// A gRPC channel to the API port (the readiness service's).
    pub async fn api_channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(self.api_url(""))
            .unwrap()
            .connect()
            .await
            .expect("gRPC on the API port")
    }

    /// `/readyz`: status and body.
    pub fn readyz(&self) -> (u16, String) {
        let mut response = ureq::get(&self.api_url("/readyz"))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .expect("GET /readyz");
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap())
    }

    pub fn get_json(&self, path: &str) -> Result<serde_json::Value, String> {
        let mut r = ureq::get(&self.api_url(path))
            .call()
            .map_err(|e| e.to_string())?;
        r.body_mut().read_json().map_err(|e| e.to_string())
    }

    /// `GET path`, read as `T` (one of the API's read types).
    pub fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        let v = self.get_json(path)?;
        serde_json::from_value(v).map_err(|e| format!("GET {path}: {e}"))
    }

    /// The dataplanes `GET /api/v1/dataplanes<query>` lists (its first
    /// page), e.g. `dataplanes("?ready=false")`.
    pub fn dataplanes(&self, query: &str) -> Result<Vec<DataplaneItem>, String> {
        self.get::<Paged<DataplaneItem>>(&format!("/api/v1/dataplanes{query}"))
            .map(|page| page.items)
    }

    /// `GET /api/v1/sources`: the dataplane files and their errors.
    pub fn sources(&self) -> Result<SourcesView, String> {
        self.get("/api/v1/sources")
    }

    pub fn dataplane(&self, id: &str) -> Result<DataplaneItem, String> {
        let id: DataplaneId = id.parse().map_err(|e| format!("{e}"))?;
        let v = self.get_json(&format!("/api/v1/dataplanes/{}/{}", id.mesh, id.name))?;
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// Waits until the dataplane's inbound on `port` has `status`.
    pub fn wait_inbound(
        &self,
        id: &str,
        port: u16,
        status: &str,
        timeout: Duration,
    ) -> DataplaneItem {
        wait_for(
            &format!("{id} inbound {port} to be {status}"),
            timeout,
            || {
                let dp = self.dataplane(id)?;
                let inbound = dp
                    .inbounds
                    .iter()
                    .find(|i| i.port == port)
                    .ok_or_else(|| format!("no inbound {port}: {dp:?}"))?;
                if inbound.health.status == status {
                    Ok(dp)
                } else {
                    Err(format!("{:?}", inbound.health))
                }
            },
        )
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kills hdsd with SIGKILL and starts it again: same ports (the harness
    /// holds the listening sockets), files and state.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts hdsd again after [`Hdsd::terminate`]: same ports, files and state.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "hdsd is still running");
        self.spawn();
    }

    /// Waits (at most `timeout`) for hdsd to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        let status = wait_for("hdsd to exit", timeout, || {
            child
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still running".to_string())
        });
        self.child = None;
        status
    }

    /// Sends SIGTERM and waits (at most `timeout`) for hdsd to exit.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -TERM {}", self.pid());
        let child = self.child.as_mut().expect("running");
        let status = wait_for("hdsd to exit", timeout, || {
            child
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still running".to_string())
        });
        self.child = None;
        status
    }
}

impl Drop for Hdsd {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- hdsd log -----\n{}", self.log());
        }
    }
}

/// A dataplane YAML with one inbound per (port, servicePort).
pub fn dataplane_yaml(name: &str, inbounds: &[(u16, u16)]) -> String {
    let mut s = format!(
        "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n"
    );
    for (port, service_port) in inbounds {
        s.push_str(&format!(
            "  - port: {port}\n    servicePort: {service_port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: svc-{port}}}\n"
        ));
    }
    s
}

/// A real Envoy whose bootstrap points at hdsd. When dropped at the end of a
/// test that did not fail otherwise, it checks that the Envoy is still
/// running (unless the test stopped it): an Envoy that crashed, e.g. on a
/// specifier it could not run, fails the test with its critical log lines.
pub struct Envoy {
    pub dir: tempfile::TempDir,
    pub id: String,
    child: Option<Child>,
    /// The test sent a signal that may end the Envoy.
    signalled: std::sync::atomic::AtomicBool,
}

impl Envoy {
    pub fn start(hds: SocketAddr, id: &str, token: Option<&str>) -> Envoy {
        Self::start_release(&envoy_bin(), hds, id, token)
    }

    /// [`Envoy::start`] with the Envoy binary `bin` (see [`envoy_release`]).
    pub fn start_release(bin: &Path, hds: SocketAddr, id: &str, token: Option<&str>) -> Envoy {
        Self::start_logging(bin, hds, id, token, "hc:debug")
    }

    /// [`Envoy::start_release`] with these `--component-log-level`s (e.g.
    /// `hc:debug,upstream:debug` to see HDS hosts added and removed).
    pub fn start_logging(
        bin: &Path,
        hds: SocketAddr,
        id: &str,
        token: Option<&str>,
        components: &str,
    ) -> Envoy {
        let dir = tempfile::tempdir().expect("tempdir");
        let dp_id: DataplaneId = id.parse().expect("node id");
        let yaml = bootstrap_yaml(&BootstrapParams {
            id: dp_id,
            servers: vec![hds.to_string()],
            token: token.map(str::to_string),
            admin_port: 0,
            ca: None,
        })
        .expect("bootstrap");
        Self::spawn(bin, dir, id, &yaml, &["--component-log-level", components])
    }

    pub fn start_with_bootstrap(dir: tempfile::TempDir, id: &str, bootstrap: &str) -> Envoy {
        Self::start_with_args(dir, id, bootstrap, &[])
    }

    /// [`Envoy::start_with_bootstrap`] with the Envoy binary `bin`.
    pub fn start_release_with_bootstrap(
        bin: &Path,
        dir: tempfile::TempDir,
        id: &str,
        bootstrap: &str,
    ) -> Envoy {
        Self::spawn(
            bin,
            dir,
            id,
            bootstrap,
            &["--component-log-level", "hc:debug"],
        )
    }

    /// Starts Envoy with `bootstrap` and extra command-line arguments.
    pub fn start_with_args(
        dir: tempfile::TempDir,
        id: &str,
        bootstrap: &str,
        extra: &[&str],
    ) -> Envoy {
        let args: Vec<&str> = ["--component-log-level", "hc:debug"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        Self::spawn(&envoy_bin(), dir, id, bootstrap, &args)
    }

    fn spawn(
        bin: &Path,
        dir: tempfile::TempDir,
        id: &str,
        bootstrap: &str,
        extra: &[&str],
    ) -> Envoy {
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).unwrap();
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(dir.path().join("admin.address"))
            .args(["--use-dynamic-base-id", "--log-level", "info"])
            .args(extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start envoy");
        Envoy {
            dir,
            id: id.to_string(),
            child: Some(child),
            signalled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The Envoy's log (lossy: the backtrace of an Envoy that aborted
    /// holds bytes that are not UTF-8).
    pub fn log(&self) -> String {
        std::fs::read(self.dir.path().join("envoy.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The admin listener's address (bootstraps use port 0; Envoy writes
    /// what it bound to `--admin-address-path`).
    pub fn admin(&self) -> SocketAddr {
        let path = self.dir.path().join("admin.address");
        wait_for("Envoy's admin address", Duration::from_secs(20), || {
            std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())?
                .trim()
                .parse()
                .map_err(|e: std::net::AddrParseError| e.to_string())
        })
    }

    /// Sends a signal by name (STOP, CONT, KILL...).
    pub fn signal(&self, name: &str) {
        if !matches!(name, "STOP" | "CONT") {
            self.signalled
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{name} {}", self.pid());
    }

    /// The Envoy's exit status once it has exited (the test expected it:
    /// it is no longer checked when dropped), `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // A crash is a failure of the test, whatever it checked: no
        // specifier may ever bring an Envoy down.
        let exited = match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status)))
                if !self.signalled.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                Some(status)
            }
            _ => None,
        };
        self.kill();
        if let (Some(status), false) = (exited, std::thread::panicking()) {
            let log = self.log();
            let critical: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("[critical]"))
                .take(5)
                .collect();
            panic!(
                "Envoy {} exited during the test ({status}):\n{}",
                self.id,
                if critical.is_empty() {
                    log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
                } else {
                    critical.join("\n")
                }
            );
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "----- envoy {} log (last lines) -----\n{}",
                self.id,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// A loopback listener on a port the kernel chose, serving each connection
/// with `handle` on its thread. [`Served::stop`] closes the listener but keeps
/// the port bound (not listening: connections are refused, and no other test
/// can take it); [`Served::resume`] listens on it again.
struct Served {
    port: u16,
    reserved: Option<socket2::Socket>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    handle: std::sync::Arc<dyn Fn(std::net::TcpStream) + Send + Sync>,
}

/// A TCP socket on 127.0.0.1:`port` (0: the kernel chooses) that can share
/// its port with the app's other socket while one of them is closing.
fn app_socket(port: u16) -> socket2::Socket {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_reuse_address(true).expect("SO_REUSEADDR");
    socket.set_reuse_port(true).expect("SO_REUSEPORT");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], port)).into())
        .expect("bind app port");
    socket
}

impl Served {
    fn start(handle: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> Served {
        let socket = app_socket(0);
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("bound address")
            .port();
        let mut served = Served {
            port,
            reserved: Some(socket),
            stop: None,
            thread: None,
            handle: std::sync::Arc::new(handle),
        };
        served.resume();
        served
    }

    fn resume(&mut self) {
        let socket = self.reserved.take().expect("the app is stopped");
        socket.listen(128).expect("listen on the app port");
        let listener: StdListener = socket.into();
        listener.set_nonblocking(true).unwrap();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let handle = self.handle.clone();
        let thread = std::thread::spawn(move || loop {
            match listener.accept() {
                Ok((stream, _)) => handle(stream),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Wait for the next connection or the stop signal.
                    match stop_rx.recv_timeout(Duration::from_millis(2)) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
                Err(_) => return,
            }
        });
        self.stop = Some(stop_tx);
        self.thread = Some(thread);
    }

    fn stop(&mut self) {
        if self.reserved.is_none() {
            self.reserved = Some(app_socket(self.port));
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tiny TCP application: accepts connections and closes them. Stops when dropped.
pub struct App {
    pub port: u16,
    served: Served,
}

impl App {
    pub fn start() -> App {
        let served = Served::start(drop);
        App {
            port: served.port,
            served,
        }
    }

    /// Listens again on the same port after [`App::stop`].
    pub fn resume(&mut self) {
        self.served.resume();
    }

    /// Closes the listening socket: probes now fail with "connection refused".
    /// The port stays reserved for [`App::resume`].
    pub fn stop(&mut self) {
        self.served.stop();
    }
}

/// Passes `fds` to the child as fds 3, 4, ... (for `LISTEN_FDS`).
pub fn pass_fds(command: &mut Command, fds: &[std::os::fd::BorrowedFd<'_>]) {
    use command_fds::{CommandFdExt, FdMapping};
    let mappings = fds
        .iter()
        .zip(3..)
        .map(|(fd, child_fd)| FdMapping {
            parent_fd: fd.try_clone_to_owned().expect("dup"),
            child_fd,
        })
        .collect();
    command.fd_mappings(mappings).expect("distinct fds");
}

/// A tiny HTTP application that answers every request with its own name
/// (`Connection: close`); a TCP probe (connect, close) gets no answer. Stops
/// when dropped; [`HttpApp::stop`] keeps its port for [`HttpApp::resume`].
pub struct HttpApp {
    pub name: String,
    pub port: u16,
    served: Served,
}

impl HttpApp {
    pub fn start(name: &str) -> HttpApp {
        let body = name.to_string();
        let served = Served::start(move |mut stream| {
            use std::io::{Read as _, Write as _};
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                body.len(),
                body
            );
            let _ = stream.flush();
        });
        HttpApp {
            name: name.to_string(),
            port: served.port,
            served,
        }
    }

    /// Listens again on the same port after [`HttpApp::stop`].
    pub fn resume(&mut self) {
        self.served.resume();
    }

    /// Closes the listening socket: probes and requests are refused.
    pub fn stop(&mut self) {
        self.served.stop();
    }
}

/// Decodes %XX escapes (Envoy percent-encodes gRPC status messages in its log).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Envoy {
    /// The decoded messages of HDS streams hdsd closed, from Envoy's log.
    pub fn hds_closures(&self) -> Vec<String> {
        self.log()
            .lines()
            .map(percent_decode)
            .filter(|l| l.contains("StreamHealthCheck gRPC config stream closed"))
            .collect()
    }

    /// Waits until Envoy logs an HDS stream closed by hdsd with `needle` in it.
    pub fn wait_closure(&self, needle: &str, timeout: Duration) -> String {
        wait_for(
            &format!("Envoy to log a closed HDS stream with {needle:?}"),
            timeout,
            || {
                let all = self.hds_closures();
                all.iter()
                    .find(|l| l.contains(needle))
                    .cloned()
                    .ok_or_else(|| format!("{all:?}"))
            },
        )
    }
}

impl Hdsd {
    /// Runs `hdsd <args> --config <this server's config>` and returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .env_remove("RUST_LOG")
            .output()
            .expect("run hdsd");
        assert!(
            out.status.success(),
            "hdsd {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Reads `GET /api/v1/watch` (with `Last-Event-ID` when given, and
    /// `Authorization: Bearer <token>`) up to the first `until` event, then
    /// disconnects: each event as (event, id, data). Fails after 30 s.
    pub fn sse(
        &self,
        token: Option<&str>,
        last_event_id: Option<&str>,
        until: &str,
    ) -> Vec<(String, String, String)> {
        use std::io::{BufRead as _, BufReader};
        let mut request = ureq::get(&self.api_url("/api/v1/watch"))
            .config()
            .timeout_global(Some(Duration::from_secs(30)))
            .build();
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.call().expect("GET /api/v1/watch");
        assert_eq!(
            response.headers().get("content-type").unwrap(),
            "text/event-stream"
        );
        let reader = BufReader::new(response.into_body().into_reader());
        let mut events = Vec::new();
        let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
        for line in reader.lines() {
            let line = line.unwrap_or_else(|e| {
                panic!("read the event stream up to {until:?}: {e}; read so far: {events:?}")
            });
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data = v.trim().to_string();
            } else if line.is_empty() && !event.is_empty() {
                let done = event == until;
                events.push((
                    std::mem::take(&mut event),
                    std::mem::take(&mut id),
                    std::mem::take(&mut data),
                ));
                if done {
                    break;
                }
            }
        }
        events
    }

    /// The `/metrics` exposition text.
    pub fn metrics(&self) -> String {
        ureq::get(&self.api_url("/metrics"))
            .call()
            .expect("GET /metrics")
            .body_mut()
            .read_to_string()
            .expect("metrics text")
    }

    /// The value of one exposition series, e.g. `hdsd_auth_failures_total{reason="tls"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics().lines().find_map(|l| {
            let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
            rest.trim().parse().ok()
        })
    }

    /// Waits until the dataplane's `connection.connected` is `connected`.
    pub fn wait_connected(&self, id: &str, connected: bool, timeout: Duration) {
        wait_for(&format!("{id} connected = {connected}"), timeout, || {
            let dp = self.dataplane(id)?;
            if dp.connection.connected == connected {
                Ok(())
            } else {
                Err(format!("{:?}", dp.connection))
            }
        });
    }

    /// Issues a token for `mesh.name` with this server's keys.
    /// A token's id (`jti`), as `hdsd token inspect` prints it.
    pub fn jti_of(&self, token: &str) -> String {
        self.cli(&["token", "inspect", token.trim()])
            .lines()
            .find_map(|l| l.trim().strip_prefix("jti:"))
            .expect("inspect prints the jti")
            .trim()
            .to_string()
    }

    pub fn issue_token(&self, id: &str, valid_for: &str) -> String {
        let id: DataplaneId = id.parse().unwrap();
        self.cli(&[
            "token",
            "issue",
            "--mesh",
            &id.mesh,
            "--name",
            &id.name,
            "--valid-for",
            valid_for,
        ])
        .trim()
        .to_string()
    }
}

/// A test that cannot run here (no root, a missing tool) says so in one
/// `SKIPPED` line; under `HDSD_REQUIRE_PARTITIONS=1` (set by CI) it fails
/// instead, so CI never skips the partition tests silently.
pub fn skip(line: String) {
    if std::env::var("HDSD_REQUIRE_PARTITIONS").is_ok_and(|v| v == "1") {
        panic!("{line} (HDSD_REQUIRE_PARTITIONS=1: CI runs the partition tests)");
    }
    eprintln!("{line}");
}
