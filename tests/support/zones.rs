//! Zones in the tests: a global hdsd and zone hdsds on loopback, the zone
//! tokens that join them, and readers of what the global holds of each
//! zone.
//!
//! [`Topology`] declares the usual shape, a global and its zones, each zone
//! optionally with a real Envoy probing a real application, and starts it:
//!
//! ```ignore
//! let (global, [mut eu, us]) = Topology::new()
//!     .global()
//!     .zone("eu-1")
//!     .zone("us-1")
//!     .web_in_each_zone()
//!     .start();
//! eu.web().app.stop();
//! wait_remote_ready(&global, "eu-1", "web", false, CONNECT);
//! ```
//!
//! The helpers below it ([`global`], [`zone`], [`zone_at`], [`zone_token`])
//! are for the shapes it does not cover.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hdsd::api::DataplaneItem;

use super::relay::Relay;
use super::{dataplane_yaml, wait_for, App, AuthMode, Config, Envoy, Hdsd, ZoneConfig};

/// The heartbeat interval zones follow in these tests (the shortest hdsd
/// allows).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// The global's `zone_timeout` in these tests.
pub const ZONE_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes `c` a global's configuration: token auth, the zone listener on,
/// heartbeats every second, a zone offline after [`ZONE_TIMEOUT`], and
/// `zones` registered.
pub fn as_global(c: &mut Config, zones: &[&str]) {
    c.auth.mode = AuthMode::Token;
    c.global.enabled = true;
    c.global.heartbeat_interval = HEARTBEAT;
    c.global.zone_timeout = ZONE_TIMEOUT;
    c.global.zones = zones.iter().map(|z| z.to_string()).collect();
}

/// Makes `c` the configuration of zone `name`, dialing the global's zone
/// listeners `globals` (in order) with the zone token in `token`.
pub fn as_zone(c: &mut Config, name: &str, globals: &[SocketAddr], token: &Path) {
    c.zone = Some(ZoneConfig {
        name: name.to_string(),
        global: globals.iter().map(|a| format!("http://{a}")).collect(),
        token_file: Some(token.to_path_buf()),
        ca: None,
        cert: None,
        key: None,
    });
}

/// A global that knows the zones eu-1 and us-1.
pub fn global() -> Hdsd {
    Hdsd::start_with(|c| as_global(c, &["eu-1", "us-1"]))
}

/// Issues a zone token at the global and writes it to a file of `dir`.
pub fn zone_token(global: &Hdsd, zone: &str, dir: &tempfile::TempDir) -> PathBuf {
    let token = global.cli(&["token", "issue", "--zone", zone, "--mesh", "default"]);
    let path = dir.path().join(format!("{zone}.token"));
    std::fs::write(&path, token.trim()).unwrap();
    path
}

/// Zone `name`, dialing `global`'s zone listener with the token in `token`.
pub fn zone(global: &Hdsd, name: &str, token: &Path) -> Hdsd {
    zone_at(
        global.zones.expect("the global's zone listener"),
        name,
        token,
    )
}

/// A zone that dials the global at `addr` (a relay, say).
pub fn zone_at(addr: SocketAddr, name: &str, token: &Path) -> Hdsd {
    Hdsd::start_with(|c| as_zone(c, name, &[addr], token))
}

/// Sends `sig` (e.g. `-STOP`) to the process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// The global's dataplanes of one zone.
pub fn remote_items(global: &Hdsd, zone: &str) -> Vec<DataplaneItem> {
    global
        .dataplanes(&format!("?zone={zone}"))
        .expect("the global's dataplanes")
}

/// Waits until the global reads the first inbound of `zone`'s dataplane
/// `name` ready (or not).
pub fn wait_remote_ready(global: &Hdsd, zone: &str, name: &str, ready: bool, timeout: Duration) {
    wait_for(
        &format!("{zone}'s {name} to read ready={ready} at the global"),
        timeout,
        || {
            let items = remote_items(global, zone);
            let item = items
                .iter()
                .find(|i| i.name == name)
                .ok_or_else(|| format!("not listed: {items:?}"))?;
            match item.inbounds.first().map(|i| i.health.ready) {
                Some(got) if got == ready => Ok(()),
                _ => Err(format!("{item:?}")),
            }
        },
    )
}

/// A zone's application and the Envoy that probes it ([`Topology::web_in_each_zone`]).
pub struct Web {
    pub app: App,
    pub envoy: Envoy,
}

/// One zone of a started [`Topology`]: its hdsd (the zone derefs to it),
/// its token, and what the topology gave it.
pub struct Zone {
    pub name: String,
    pub hdsd: Hdsd,
    /// The zone token file the zone dials with (re-read at every connect).
    pub token: PathBuf,
    /// The relay between the zone and the global ([`Topology::zone_through_relay`]).
    pub relay: Option<Relay>,
    /// Dataplane `web` (inbound 10001) probing `app` through a real Envoy
    /// ([`Topology::web_in_each_zone`]).
    pub web: Option<Web>,
    /// Holds the token file.
    _tokens: tempfile::TempDir,
}

impl Zone {
    /// The zone's `web` (set up by [`Topology::web_in_each_zone`]).
    pub fn web(&mut self) -> &mut Web {
        self.web.as_mut().expect("Topology::web_in_each_zone")
    }
}

impl std::ops::Deref for Zone {
    type Target = Hdsd;
    fn deref(&self) -> &Hdsd {
        &self.hdsd
    }
}

impl std::ops::DerefMut for Zone {
    fn deref_mut(&mut self) -> &mut Hdsd {
        &mut self.hdsd
    }
}

type Edit = Box<dyn FnOnce(&mut Config)>;

struct ZoneSpec {
    name: String,
    relay: bool,
    edit: Edit,
}

/// A global and its zones, declared then started:
/// `Topology::new().global().zone("eu-1").zone("us-1").web_in_each_zone().start()`.
///
/// The global ([`as_global`]) registers every zone declared; each zone
/// ([`as_zone`]) dials it with a zone token the global issued. Zones start
/// in the order declared, after the global.
#[derive(Default)]
pub struct Topology {
    global: Option<Edit>,
    zones: Vec<ZoneSpec>,
    web: bool,
}

impl Topology {
    pub fn new() -> Topology {
        Topology::default()
    }

    /// A global with the tests' settings ([`as_global`]).
    pub fn global(self) -> Topology {
        self.global_with(|_| {})
    }

    /// [`Topology::global`], its configuration then edited by `edit`.
    pub fn global_with(mut self, edit: impl FnOnce(&mut Config) + 'static) -> Topology {
        self.global = Some(Box::new(edit));
        self
    }

    /// A zone `name` dialing the global directly.
    pub fn zone(self, name: &str) -> Topology {
        self.add_zone(name, false, |_| {})
    }

    /// [`Topology::zone`], its configuration then edited by `edit`.
    pub fn zone_with(self, name: &str, edit: impl FnOnce(&mut Config) + 'static) -> Topology {
        self.add_zone(name, false, edit)
    }

    /// A zone `name` dialing the global through a [`Relay`], so that the
    /// test can cut the link ([`Zone::relay`]).
    pub fn zone_through_relay(self, name: &str) -> Topology {
        self.add_zone(name, true, |_| {})
    }

    fn add_zone(
        mut self,
        name: &str,
        relay: bool,
        edit: impl FnOnce(&mut Config) + 'static,
    ) -> Topology {
        self.zones.push(ZoneSpec {
            name: name.to_string(),
            relay,
            edit: Box::new(edit),
        });
        self
    }

    /// In each zone, an application, dataplane `web` with one inbound
    /// (10001) on it, and a real Envoy probing it ([`Zone::web`]).
    pub fn web_in_each_zone(mut self) -> Topology {
        self.web = true;
        self
    }

    /// Starts the global, then each zone (and its Envoy): `N` must be the
    /// number of zones declared.
    pub fn start<const N: usize>(self) -> (Hdsd, [Zone; N]) {
        assert_eq!(
            self.zones.len(),
            N,
            "the topology declares {} zones",
            self.zones.len()
        );
        let names: Vec<String> = self.zones.iter().map(|z| z.name.clone()).collect();
        let edit = self
            .global
            .expect("Topology::global: a topology needs a global");
        let global = Hdsd::start_with(|c| {
            as_global(c, &names.iter().map(String::as_str).collect::<Vec<_>>());
            edit(c);
        });
        let listener = global.zones.expect("the global's zone listener");
        let zones: Vec<Zone> = self
            .zones
            .into_iter()
            .map(|spec| {
                let tokens = tempfile::tempdir().unwrap();
                let token = zone_token(&global, &spec.name, &tokens);
                let relay = spec.relay.then(|| Relay::start(listener));
                let addr = relay.as_ref().map_or(listener, |r| r.addr);
                let hdsd = Hdsd::start_with(|c| {
                    as_zone(c, &spec.name, &[addr], &token);
                    (spec.edit)(c);
                });
                let web = self.web.then(|| {
                    let app = App::start();
                    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, app.port)]));
                    let envoy = Envoy::start(hdsd.hds, "default.web", None);
                    Web { app, envoy }
                });
                Zone {
                    name: spec.name,
                    hdsd,
                    token,
                    relay,
                    web,
                    _tokens: tokens,
                }
            })
            .collect();
        let zones = zones
            .try_into()
            .unwrap_or_else(|_| unreachable!("N zones, checked above"));
        (global, zones)
    }
}
