//! Server configuration: defaults <- file (TOML or YAML) <- `HDSD_*` environment.
//!
//! Loading is I/O (figment reads the file and the environment); validation is a
//! pure function over the loaded value so that `hdsd validate` and `hdsd serve`
//! report exactly the same problems.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml, Yaml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::probe::{validate_path, Check, HttpCheck, ProbeSettings, Spelling, TcpCheck, Tls};

/// The whole configuration of one hdsd process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub hds: HdsConfig,
    pub api: ApiConfig,
    pub dataplanes: DataplanesConfig,
    /// Directory for hdsd's own state (keys, revocations, readiness store).
    pub state_dir: PathBuf,
    /// How long a graceful shutdown may take before hdsd exits anyway.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    pub auth: AuthConfig,
    pub log: LogConfig,
    pub limits: Limits,
    pub eds: EdsConfig,
    pub store: StoreConfig,
    pub cluster: ClusterConfig,
    /// `[zone]`: this hdsd (or cluster) is a zone that reports to a global.
    /// Absent: standalone (or a global).
    pub zone: Option<ZoneConfig>,
    /// `[global]`: this hdsd accepts zone streams.
    pub global: GlobalConfig,
}

/// `[zone]`: where this zone reports, and as whom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneConfig {
    /// The zone's name, a DNS-1123 label of at most 63 characters. The
    /// global takes the name from the zone token (or the zone's client
    /// certificate), never from this setting: the two must agree, or the
    /// zone refuses to start.
    pub name: String,
    /// The global's zone listener(s), e.g. `["http://global.example:5682"]`
    /// (`https://` with `ca`): tried in order, the next one on a failure.
    pub global: Vec<String>,
    /// A file holding the zone token (`hdsd token issue --zone NAME` on the
    /// global), re-read at every connect.
    pub token_file: Option<PathBuf>,
    /// The CA that signed the global's certificate, for `https://`.
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) whose one URI subject alternative name is
    /// `hdsd://zone/NAME`, signed by the CA in the global's
    /// `global.tls.client_ca`: the zone's credential instead of (or besides)
    /// a zone token. Re-read at every connect. Needs `key` and `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

impl ZoneConfig {
    /// The URLs of `zone.global` that are plain `http://`: over them the
    /// zone token and every answer of the global travel unauthenticated
    /// (anyone on the path reads the token, or answers as the global).
    pub fn plaintext_globals(&self) -> impl Iterator<Item = &str> {
        self.global
            .iter()
            .map(String::as_str)
            .filter(|url| url.starts_with("http://"))
    }
}

/// The key of `global.certificate_meshes` for every zone not listed by name.
pub const ANY_CERTIFICATE_ZONE: &str = "*";

/// The shortest heartbeat interval zones follow (`global.heartbeat_interval`
/// may not be shorter).
pub const MIN_ZONE_HEARTBEAT: Duration = Duration::from_secs(1);

/// The longest heartbeat interval zones follow: a zone refuses an
/// `Accepted` that asks for more (`global.heartbeat_interval` may not be
/// longer).
pub const MAX_ZONE_HEARTBEAT: Duration = Duration::from_secs(3600);

/// The longest zone timeout zones follow: a zone refuses an `Accepted` that
/// names a longer one (`global.zone_timeout` may not be longer).
pub const MAX_ZONE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `[global]`: the zone streams this hdsd accepts, and when a zone is offline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GlobalConfig {
    /// Accept zone streams on `listen`.
    pub enabled: bool,
    /// The zone listener (default `0.0.0.0:5682`).
    pub listen: SocketAddr,
    /// How often zones send a heartbeat (handed to each zone when it connects).
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// A zone is offline when nothing came from it for this long (on the
    /// global's clock): its stream is ended and every reader sees why its
    /// dataplanes are stale. At least twice `heartbeat_interval`.
    #[serde(with = "humantime_serde")]
    pub zone_timeout: Duration,
    /// How long an offline zone's dataplanes keep their last readiness;
    /// after it, the API reads them not ready.
    #[serde(with = "humantime_serde")]
    pub offline_ttl: Duration,
    /// The zones allowed to connect (DNS-1123 labels). Others are refused
    /// with the command that adds them, unless `auto_register`.
    pub zones: Vec<String>,
    /// Zones listed here are refused, and their data withdrawn.
    pub disabled: Vec<String>,
    /// Accept any zone with a valid zone token (Kuma's behaviour).
    pub auto_register: bool,
    /// The meshes each zone known by its client certificate may sync (a
    /// certificate names a zone, not its meshes), by zone name; the entry
    /// `"*"` is for zones not listed. Needs `global.tls.client_ca`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub certificate_meshes: BTreeMap<String, Vec<String>>,
    /// TLS for the zone listener (zones then dial `https://` with `zone.ca`);
    /// plaintext when absent. The zone token travels in every stream's
    /// metadata: set it whenever zones reach the global over a network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

impl Default for GlobalConfig {
    fn default() -> Self {
        GlobalConfig {
            enabled: false,
            listen: "0.0.0.0:5682".parse().expect("valid literal"),
            heartbeat_interval: Duration::from_secs(5),
            zone_timeout: Duration::from_secs(15),
            offline_ttl: Duration::from_secs(300),
            zones: Vec::new(),
            disabled: Vec::new(),
            auto_register: false,
            certificate_meshes: BTreeMap::new(),
            tls: None,
        }
    }
}

/// The shortest `cluster.resume_slack`: the watermark's lag (a read of the
/// store at least once a second) plus the readiness writer's 200 ms batches,
/// with room for the instances' expiry timers and clocks.
pub const MIN_RESUME_SLACK: Duration = Duration::from_secs(2);

/// `cluster`: how instances sharing a PostgreSQL store watch each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// An instance whose heartbeat is older than this is dead: a live
    /// instance marks the dataplanes it held disconnected. Heartbeats and
    /// sweeps run every quarter of it. Must be the same on every instance.
    #[serde(with = "humantime_serde")]
    pub instance_timeout: Duration,
    /// How far a watch revision handed out by another instance may be from
    /// this instance's: a watch resuming at revision R replays every
    /// dataplane that changed after R minus this, and R may be ahead of
    /// this instance by up to this. Covers what each instance computes by
    /// itself at slightly different times and the watermark's lag. Above
    /// 0 and below the change feed's history age (5 minutes).
    #[serde(with = "humantime_serde")]
    pub resume_slack: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            instance_timeout: Duration::from_secs(10),
            resume_slack: Duration::from_secs(10),
        }
    }
}

/// Where hdsd keeps what it stores: the definitions of `dataplanes.source =
/// "api"`, and readiness (redb: in `state_dir`, per instance; PostgreSQL:
/// shared by the instances).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub kind: StoreKind,
    pub postgres: PostgresConfig,
}

/// `store.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The embedded redb file under `state_dir` (one instance).
    #[default]
    Redb,
    /// A PostgreSQL database shared by several instances.
    Postgres,
}

/// `store.postgres`: used when `store.kind = "postgres"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// A libpq connection string: a URL (`postgresql://user@host/db`) or
    /// key=value pairs (`host=/run/postgresql dbname=hdsd`, a socket directory).
    pub url: String,
    /// The most connections one instance opens (besides its one listener).
    pub pool_size: usize,
    /// How long opening a connection may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a request waits for a free pooled connection.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// How often every definition is read again, healing missed notifications.
    #[serde(with = "humantime_serde")]
    pub reconcile_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Redb,
            postgres: PostgresConfig::default(),
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: String::new(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(5),
            reconcile_interval: Duration::from_secs(30),
        }
    }
}

/// How readiness becomes EDS endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdsConfig {
    /// How a `stale` inbound is served: `degraded` (a fallback Envoy uses only
    /// when nothing healthy is left) or `unhealthy`.
    pub stale_as: StaleAs,
    /// Leave not-ready endpoints out of assignments instead of marking them.
    pub omit_not_ready: bool,
    /// Bearer tokens for EDS clients only (with `auth.mode = "token"`), beside
    /// `api.tokens`: a front proxy that holds one can take endpoints but not
    /// read the REST API.
    pub tokens: Vec<String>,
    /// The assignments' overprovisioning factor, in percent (Envoy's
    /// default, 140): a priority (a zone) keeps all of its load while at
    /// least 100/factor of its endpoints are healthy and spills the rest to
    /// the next one below that. 100 to 100000.
    pub overprovisioning_factor: u32,
    /// On a global, how an offline zone's endpoints are served from the
    /// moment it goes offline: `degraded` (its healthy endpoints become
    /// degraded: used only when no zone has healthy ones left), `unhealthy`,
    /// `keep` (its last readiness) or `withdraw` (its locality leaves the
    /// assignment).
    pub offline_zone: OfflineZone,
    /// Sets `endpoint_stale_after` in every assignment: a front that has
    /// received no assignment for this long drops every endpoint of it (and
    /// answers 503), so hdsd then re-sends every assignment at least every
    /// third of it. Off by default; at least 1 s when set.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub endpoint_stale_after: Option<Duration>,
    /// Per front zone, the other zones in the order they take over: a front
    /// in the key's zone gets its own zone at priority 0, the listed zones
    /// at 1, 2, ... and every zone not listed after them. Without an entry,
    /// every other zone is at priority 1.
    pub zone_priorities: BTreeMap<String, Vec<String>>,
    /// Resource names one EDS request may name (a request past it ends its
    /// stream with `RESOURCE_EXHAUSTED`).
    pub max_resource_names: usize,
}

impl Default for EdsConfig {
    fn default() -> Self {
        EdsConfig {
            stale_as: StaleAs::default(),
            omit_not_ready: false,
            tokens: Vec::new(),
            overprovisioning_factor: 140,
            offline_zone: OfflineZone::default(),
            endpoint_stale_after: None,
            zone_priorities: BTreeMap::new(),
            max_resource_names: 4096,
        }
    }
}

impl EdsConfig {
    /// The shortest `endpoint_stale_after` (re-sent every third of it).
    pub const MIN_ENDPOINT_STALE_AFTER: Duration = Duration::from_secs(1);

    /// What is wrong with `endpoint_stale_after` and `zone_priorities`.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(after) = self.endpoint_stale_after {
            if after < Self::MIN_ENDPOINT_STALE_AFTER {
                problems.push(format!(
                    "eds.endpoint_stale_after is {}: set it to at least 1s (hdsd re-sends every assignment every third of it), or remove it to leave it off",
                    humantime::format_duration(after)
                ));
            }
        }
        for (front, order) in &self.zone_priorities {
            if let Err(e) = crate::names::check_zone(front) {
                problems.push(format!("eds.zone_priorities: key {front:?}: {e}"));
            }
            let mut seen = BTreeSet::new();
            for zone in order {
                if let Err(e) = crate::names::check_zone(zone) {
                    problems.push(format!("eds.zone_priorities.{front}: {zone:?}: {e}"));
                } else if zone == front {
                    problems.push(format!("eds.zone_priorities.{front} lists {zone:?}, the front's own zone: it is always priority 0; list only the zones that take over after it"));
                } else if !seen.insert(zone.as_str()) {
                    problems.push(format!("eds.zone_priorities.{front} lists {zone:?} twice: list each zone once, in the order they take over"));
                }
            }
        }
        problems
    }
}

/// How an offline zone's endpoints are served (`eds.offline_zone`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OfflineZone {
    /// Healthy endpoints become degraded: a fallback while any zone has healthy ones.
    #[default]
    Degraded,
    /// Every endpoint is unhealthy.
    Unhealthy,
    /// The last readiness, as if the zone were online.
    Keep,
    /// The zone's locality leaves the assignment.
    Withdraw,
}

/// How a `stale` inbound is served (`eds.stale_as`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StaleAs {
    /// Kept as a fallback: Envoy uses degraded endpoints only when no healthy one is left.
    #[default]
    Degraded,
    /// Taken out of the load-balancing set.
    Unhealthy,
}

/// How dataplanes prove who they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// The longest validity `hdsd token issue` grants.
    #[serde(with = "humantime_serde")]
    pub max_token_validity: Duration,
    /// The revocation list (one token id per line); default `<state_dir>/revoked-tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocations: Option<PathBuf>,
    /// Public keys of other issuers whose tokens are accepted.
    pub public_keys: Vec<ExtraPublicKey>,
}

/// An additional trusted public key (`auth.public_keys = [{kid, path}]`),
/// e.g. the key of another hdsd that issues tokens for the same dataplanes.
/// Verify-only: never used to sign.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraPublicKey {
    /// The key id that tokens signed by this key carry in their `kid` header.
    pub kid: String,
    /// An Ed25519 public key in SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every stream must present a valid dataplane token.
    Token,
    /// No authentication: any client may claim any dataplane. For trusted networks only.
    None,
}

/// PEM files that turn TLS on for a listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HdsConfig {
    /// Address of the gRPC HDS listener Envoys connect to.
    pub listen: SocketAddr,
    /// How often Envoy sends health reports (`HealthCheckSpecifier.interval`).
    #[serde(with = "humantime_serde")]
    pub report_interval: Duration,
    /// How long a stream for a dataplane hdsd does not know is kept open
    /// waiting for its definition to appear.
    #[serde(with = "humantime_serde")]
    pub unknown_dataplane_grace: Duration,
    /// Check defaults, overridable per inbound with `serviceProbe`.
    pub check: CheckConfig,
    /// Probe every inbound (true), or only inbounds with a `serviceProbe` (false,
    /// Kuma's behaviour).
    pub probe_all_inbounds: bool,
    /// TLS for the HDS listener; plaintext when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// A report older than this no longer counts: its inbounds are `stale`,
    /// and a stream silent this long is ended. Default: 3 x report_interval.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub stale_after: Option<Duration>,
    /// HTTP/2 keepalive pings from the server to notice dead TCP peers.
    pub keepalive: KeepaliveConfig,
    /// Check each Envoy's own admin `/ready` (dataplanes that declare
    /// `networking.admin.port`); while it fails, every inbound is `draining`.
    pub check_envoy_ready: bool,
    /// Connection, stream and message limits of the HDS listener.
    pub limits: HdsLimits,
}

/// What one client may hold of the HDS listener (see docs/security.md,
/// "Limits and hardening").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HdsLimits {
    /// Connections open at once (HDS and EDS clients together).
    pub max_connections: usize,
    /// Connections open at once from one source IP address.
    pub max_connections_per_ip: usize,
    /// From accept to the end of the TLS handshake and the HTTP/2 preface.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// From accept to the first stream hdsd accepts (with a valid token
    /// when auth requires one); a connection without one by then is
    /// closed, and until then it is the first to give its slot to a
    /// newcomer when a cap is reached.
    #[serde(with = "humantime_serde")]
    pub unauthenticated_timeout: Duration,
    /// A connection with no stream or request open for this long is closed
    /// (HTTP/2 PINGs do not count; an open stream, however quiet, does).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection (an Envoy uses one for HDS).
    pub max_streams_per_connection: u32,
    /// The largest gRPC message hdsd decodes (a report), in bytes.
    pub max_message_bytes: usize,
    /// How long a stream may take to send its first HealthCheckRequest.
    #[serde(with = "humantime_serde")]
    pub first_request_timeout: Duration,
    /// Streams bound to one node id at once (the newest replaces the
    /// attached one; this caps the ones piling up beside it).
    pub max_streams_per_dataplane: usize,
    /// Streams waiting for an unknown dataplane at once, in total.
    pub max_waiting_streams: usize,
}

impl Default for HdsLimits {
    fn default() -> Self {
        HdsLimits {
            max_connections: 10_000,
            max_connections_per_ip: 128,
            handshake_timeout: Duration::from_secs(10),
            unauthenticated_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_streams_per_connection: 8,
            max_message_bytes: 512 * 1024,
            first_request_timeout: Duration::from_secs(10),
            max_streams_per_dataplane: 4,
            max_waiting_streams: 1_000,
        }
    }
}

/// What one client may hold of the API listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one source IP address.
    pub max_connections_per_ip: usize,
    /// From accept to the end of the TLS handshake and the first bytes of a request.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// How long an HTTP/1 request's headers may take to arrive, counted from
    /// the connection's start or the end of the previous response.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive, from the end of its
    /// headers (not gRPC requests, whose bodies are streams).
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// From accept to the first request answered with success (with a
    /// valid token where one is required); a connection without one by then
    /// is closed, and until then it is the first to give its slot to a
    /// newcomer when a cap is reached.
    #[serde(with = "humantime_serde")]
    pub unauthenticated_timeout: Duration,
    /// A connection with no request open for this long is closed (HTTP/2
    /// PINGs do not count; an open event stream or Watch, however quiet,
    /// does).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Watches (gRPC `Watch` and `GET /api/v1/watch`) open at once, in total.
    pub max_watches: usize,
    /// Dataplane names plus selector tags one watch may name.
    pub max_watch_names: usize,
    /// Concurrent HTTP/2 streams per API connection: the watches (and a
    /// browser's requests) one connection may have open at once.
    pub max_streams_per_connection: u32,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_connections: 512,
            max_connections_per_ip: 64,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            unauthenticated_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_watches: 512,
            max_watch_names: 256,
            max_streams_per_connection: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveConfig {
    /// Time between pings on an otherwise idle connection.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long to wait for a ping's answer before closing the connection.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for KeepaliveConfig {
    fn default() -> Self {
        KeepaliveConfig {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckConfig {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Defaults to `interval` when not set.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub no_traffic_interval: Option<Duration>,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// The check of inbounds whose `serviceProbe` names no kind.
    pub kind: CheckKind,
    /// Used when `kind = "http"`.
    pub http: HttpCheckConfig,
    /// What an Envoy too old for a probe's kind (`hdsd`'s table of Envoy
    /// versions, docs/configuration.md "Envoy versions") is sent instead: nothing (the
    /// default: the inbound reads `unsupported`, not ready), or a TCP
    /// connect to the same target (`"tcp"`, marked as a fallback).
    pub fallback: CheckFallback,
    /// TLS for the default check (`kind`); plaintext when absent. A
    /// `serviceProbe` that names a kind gives its own `tls`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<CheckTlsConfig>,
}

/// `[hds.check.tls]`: the default check over TLS. The files are paths on
/// the Envoy's machine: hdsd passes them to Envoy and never reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckTlsConfig {
    /// On unless `false`: the table's presence turns TLS on.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The server name sent in the handshake; with `ca_file`, the
    /// certificate must name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// The CA (PEM) that signs the applications' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Accept any certificate instead (exclusive with `ca_file`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
    /// The certificate Envoy presents to applications that require one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// Its private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<String>,
    /// ALPN protocols offered; default: none for TCP and HTTP/1.1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn: Vec<String>,
}

fn yes() -> bool {
    true
}

impl From<&CheckTlsConfig> for Tls {
    fn from(c: &CheckTlsConfig) -> Tls {
        Tls {
            enabled: c.enabled,
            sni: c.sni.clone(),
            ca_file: c.ca_file.clone(),
            insecure_skip_verify: c.insecure_skip_verify,
            client_cert_file: c.client_cert_file.clone(),
            client_key_file: c.client_key_file.clone(),
            alpn: c.alpn.clone(),
        }
    }
}

/// `hds.check.fallback`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckFallback {
    /// The check is not sent; its inbounds read `unsupported`.
    #[default]
    None,
    /// A TCP connect to the probe's target in its place.
    Tcp,
}

/// `hds.check.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// A TCP connect to the application's port.
    Tcp,
    /// An HTTP/1.1 GET of `hds.check.http.path`, expecting 200-299.
    Http,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpCheckConfig {
    /// The path every application serves its health on, e.g. `/healthz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// TLS for the REST API; plaintext when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Static bearer tokens for the REST API (required when it listens beyond loopback).
    pub tokens: Vec<String>,
    /// Host names (beside IP addresses, `localhost` and `*.localhost`) an
    /// API without `api.tokens` answers to: a request naming another
    /// `Host` is refused, so a web page whose DNS name is pointed at this
    /// machine (DNS rebinding) cannot reach the open API.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Connection limits of the API listener.
    pub limits: ApiLimits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataplanesConfig {
    /// Where definitions come from: the files of `dir`, or the store (API).
    pub source: DataplanesSource,
    pub dir: PathBuf,
    /// Bytes a dataplane file may have (and the most its YAML aliases may
    /// expand it to).
    pub max_file_size: u64,
    /// Levels of YAML nesting a dataplane file may have.
    pub max_nesting: usize,
    /// YAML aliases (`*name`) a dataplane file may have.
    pub max_aliases: usize,
    /// Inbounds a dataplane may have.
    pub max_inbounds: usize,
    /// Tags an inbound may have.
    pub max_tags: usize,
    /// Documents a dataplane file may have, empty ones included.
    pub max_documents: usize,
    /// Bytes the parse of one file may keep for its next version.
    pub max_kept_bytes: u64,
    /// A key the Dataplane resource does not define: `refuse` (the file is
    /// refused) or `warn` (the key is ignored, with a warning).
    pub unknown_fields: crate::dataplane::UnknownFields,
}

impl DataplanesConfig {
    /// The limits every dataplane file is read within.
    pub fn limits(&self) -> crate::dataplane::FileLimits {
        crate::dataplane::FileLimits {
            max_file_size: self.max_file_size,
            max_nesting: self.max_nesting,
            max_aliases: self.max_aliases,
            max_inbounds: self.max_inbounds,
            max_tags: self.max_tags,
            max_documents: self.max_documents,
            max_kept_bytes: self.max_kept_bytes,
            unknown_fields: self.unknown_fields,
        }
    }
}

/// `dataplanes.source`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataplanesSource {
    /// The files of `dataplanes.dir`, watched for changes.
    #[default]
    Dir,
    /// The store, written through `PUT` / `DELETE /api/v1/dataplanes/{mesh}/{name}`.
    Api,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter (`info`, `hdsd=debug`); `RUST_LOG` wins when set.
    pub level: String,
    pub format: LogFormat,
    /// Bytes of log written per second at most, over the whole process
    /// (0: no limit); past it, lines are left out and the next line
    /// written says how many.
    pub max_bytes_per_second: u64,
}

/// `[limits]`: what all clients together may make hdsd hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Bytes held at once on behalf of clients, over every listener: gRPC
    /// messages and HTTP request bodies that have not arrived whole.
    pub client_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            client_bytes: 128 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hds: HdsConfig::default(),
            api: ApiConfig::default(),
            dataplanes: DataplanesConfig::default(),
            state_dir: PathBuf::from("./hdsd-data"),
            shutdown_timeout: Duration::from_secs(10),
            auth: AuthConfig::default(),
            log: LogConfig::default(),
            limits: Limits::default(),
            eds: EdsConfig::default(),
            store: StoreConfig::default(),
            cluster: ClusterConfig::default(),
            zone: None,
            global: GlobalConfig::default(),
        }
    }
}

impl Default for HdsConfig {
    fn default() -> Self {
        HdsConfig {
            listen: "0.0.0.0:5678".parse().expect("valid literal"),
            report_interval: Duration::from_secs(5),
            unknown_dataplane_grace: Duration::from_secs(30),
            check: CheckConfig::default(),
            probe_all_inbounds: true,
            tls: None,
            stale_after: None,
            keepalive: KeepaliveConfig::default(),
            check_envoy_ready: true,
            limits: HdsLimits::default(),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::Token,
            max_token_validity: Duration::from_secs(8760 * 3600),
            revocations: None,
            public_keys: Vec::new(),
        }
    }
}

impl AuthConfig {
    /// The revocation list in force.
    pub fn revocations_path(&self, state_dir: &Path) -> PathBuf {
        self.revocations
            .clone()
            .unwrap_or_else(|| state_dir.join("revoked-tokens"))
    }
}

impl Default for CheckConfig {
    fn default() -> Self {
        let d = ProbeSettings::default();
        CheckConfig {
            interval: d.interval,
            timeout: d.timeout,
            no_traffic_interval: None,
            healthy_threshold: d.healthy_threshold,
            unhealthy_threshold: d.unhealthy_threshold,
            kind: CheckKind::Tcp,
            http: HttpCheckConfig::default(),
            fallback: CheckFallback::None,
            tls: None,
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:5680".parse().expect("valid literal"),
            tls: None,
            tokens: Vec::new(),
            allowed_hosts: Vec::new(),
            limits: ApiLimits::default(),
        }
    }
}

impl Default for DataplanesConfig {
    fn default() -> Self {
        let limits = crate::dataplane::FileLimits::default();
        DataplanesConfig {
            source: DataplanesSource::Dir,
            dir: PathBuf::from("./dataplanes"),
            max_file_size: limits.max_file_size,
            max_nesting: limits.max_nesting,
            max_aliases: limits.max_aliases,
            max_inbounds: limits.max_inbounds,
            max_tags: limits.max_tags,
            max_documents: limits.max_documents,
            max_kept_bytes: limits.max_kept_bytes,
            unknown_fields: limits.unknown_fields,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_string(),
            format: LogFormat::Text,
            max_bytes_per_second: 256 * 1024,
        }
    }
}

impl HdsConfig {
    /// `stale_after`, or its default of three report intervals.
    pub fn stale_after(&self) -> Duration {
        self.stale_after.unwrap_or(self.report_interval * 3)
    }
}

impl CheckConfig {
    /// The effective check defaults for every probed inbound.
    pub fn probe_settings(&self) -> ProbeSettings {
        ProbeSettings {
            interval: self.interval,
            timeout: self.timeout,
            no_traffic_interval: self.no_traffic_interval.unwrap_or(self.interval),
            healthy_threshold: self.healthy_threshold,
            unhealthy_threshold: self.unhealthy_threshold,
        }
    }

    /// The default check (validated by [`Config::validate`]).
    pub fn check(&self) -> Check {
        let tls = self.tls.as_ref().map(|t| Box::new(Tls::from(t)));
        match self.kind {
            CheckKind::Tcp => Check::Tcp(TcpCheck {
                tls,
                ..TcpCheck::default()
            }),
            CheckKind::Http => Check::Http(HttpCheck {
                tls,
                ..HttpCheck::path(self.http.path.clone().unwrap_or_default())
            }),
        }
    }
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} does not exist; pass an existing file to --config or omit it to use the defaults")]
    Missing { path: PathBuf },
    #[error("config file {path}: unsupported extension; use .toml, .yaml or .yml")]
    Extension { path: PathBuf },
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// The file is writable by users other than its owner.
    #[error(transparent)]
    Untrusted(#[from] permissions::Untrusted),
}

/// How long the change feed keeps a change (its history's age limit): a
/// watch may resume within it (`feed::HistoryLimits`'s default).
pub const FEED_HISTORY_AGE: Duration = Duration::from_secs(300);

/// The smallest report interval hdsd accepts: Envoy would flood the server below it.
pub const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(100);
/// The largest report interval hdsd accepts, as for every check duration.
pub const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(3600);

/// `HDSD_*` variables that belong to the project's tests and scripts, not to
/// the server: `HDSD_REQUIRE_DOCKER` (CI: the compose test must run),
/// `HDSD_REQUIRE_POSTGRES` (CI: the PostgreSQL tests must run),
/// `HDSD_REQUIRE_PARTITIONS` (CI: the partition tests must run),
/// `HDSD_COMPOSE_BUILD`, `HDSD_CHROMIUM`. They never count as settings.
pub const TOOLING_ENV: [&str; 5] = [
    "require_docker",
    "require_postgres",
    "require_partitions",
    "compose_build",
    "chromium",
];

impl Config {
    /// Loads the configuration: defaults, then the optional file, then `HDSD_*`
    /// variables (`__` separates nesting levels: `HDSD_HDS__REPORT_INTERVAL=10s`).
    /// The project's own tooling variables ([`TOOLING_ENV`]) are not settings.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with_env(
            file,
            Env::prefixed("HDSD_")
                .filter(|key| {
                    !TOOLING_ENV
                        .iter()
                        .any(|t| key.as_str().eq_ignore_ascii_case(t))
                })
                .split("__"),
        )
    }

    /// Loads a configuration from the text of a file with extension `ext`
    /// (`toml`, `yaml` or `yml`) over the defaults, without the environment.
    pub fn from_text(text: &str, ext: &str) -> Result<Config, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Config::default()));
        let figment = match ext {
            "toml" => figment.merge(Toml::string(text)),
            "yaml" | "yml" => figment.merge(Yaml::string(text)),
            _ => {
                return Err(ConfigError::Extension {
                    path: PathBuf::from(format!("config.{ext}")),
                })
            }
        };
        figment
            .extract()
            .map_err(|e| ConfigError::Parse(explain::describe(e, None, DEFAULTS_TOML)))
    }

    fn load_with_env(file: Option<&Path>, env: Env) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        // The file's text, to say on which line a bad key is.
        let mut text = None;
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Missing {
                    path: path.to_path_buf(),
                });
            }
            // It names the keys and tokens hdsd trusts.
            permissions::check_writable("config file", path)?;
            text = std::fs::read_to_string(path).ok();
            figment = match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => figment.merge(Toml::file(path)),
                Some("yaml" | "yml") => figment.merge(Yaml::file(path)),
                _ => {
                    return Err(ConfigError::Extension {
                        path: path.to_path_buf(),
                    })
                }
            };
        }
        figment.merge(env).extract().map_err(|e| {
            let file = file
                .zip(text.as_deref())
                .map(|(path, text)| explain::FileText {
                    path,
                    text,
                    yaml: path.extension().is_some_and(|e| e != "toml"),
                });
            ConfigError::Parse(explain::describe(e, file, DEFAULTS_TOML))
        })
    }

    /// `problems` (from [`Config::validate`]) with the line of the key each
    /// is about, when the file `path` sets it.
    pub fn locate(problems: Vec<String>, path: Option<&Path>) -> Vec<String> {
        let Some(path) = path else { return problems };
        let Ok(text) = std::fs::read_to_string(path) else {
            return problems;
        };
        let file = explain::FileText {
            path,
            text: &text,
            yaml: path.extension().is_some_and(|e| e != "toml"),
        };
        problems
            .into_iter()
            .map(|p| explain::with_line(p, file))
            .collect()
    }

    /// Every problem with the values, each with its own message. Pure: it
    /// reads no file (see [`Config::file_problems`] for the files it names).
    /// What is wrong with `[zone]` and `[global]`.
    fn zone_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(100..=100_000).contains(&self.eds.overprovisioning_factor) {
            problems.push(format!(
                "eds.overprovisioning_factor is {}: it is a percentage from 100 (spill to the next zone as soon as one endpoint is down) to 100000 (never before none is healthy); Envoy's default is 140",
                self.eds.overprovisioning_factor
            ));
        }
        problems.extend(self.eds.problems());
        if let Some(zone) = &self.zone {
            if let Err(e) = crate::names::check_zone(&zone.name) {
                problems.push(format!("zone.name: {e}"));
            }
            if zone.global.is_empty() {
                problems.push("zone.global is empty: list the global's zone listener, e.g. [\"http://global.example:5682\"]".to_string());
            }
            for url in &zone.global {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    problems.push(format!("zone.global: {url:?} is not an http:// or https:// URL of the global's zone listener (e.g. http://global.example:5682)"));
                }
                if url.starts_with("https://") && zone.ca.is_none() {
                    problems.push(format!("zone.global: {url:?} is https://, but zone.ca is not set: point zone.ca at the PEM file of the CA that signed the global's certificate"));
                }
            }
            // The global's rule, not this hdsd's `auth.mode`: a global names
            // every zone by its credential, never by what the zone says.
            if zone.token_file.is_none() && zone.cert.is_none() {
                problems.push("zone.token_file is not set: the global knows a zone only by its zone token (issue one on the global with `hdsd token issue --zone NAME --mesh MESH`, save it to a file, and set zone.token_file) or by its client certificate (zone.cert and zone.key, with a URI SAN hdsd://zone/NAME)".to_string());
            }
            match (&zone.cert, &zone.key) {
                (Some(_), None) => problems.push("zone.cert is set but zone.key is not: set zone.key to the certificate's private key (PEM)".to_string()),
                (None, Some(_)) => problems.push("zone.key is set but zone.cert is not: set zone.cert to the zone's client certificate (PEM, URI SAN hdsd://zone/NAME), or remove zone.key".to_string()),
                _ => {}
            }
            if zone.cert.is_some() {
                if let Some(url) = zone.global.iter().find(|u| !u.starts_with("https://")) {
                    problems.push(format!("zone.cert is set, but zone.global {url:?} is not https://: a client certificate is shown only over TLS; use https:// with zone.ca"));
                }
            }
        }
        let g = &self.global;
        if g.enabled {
            if self.auth.mode == AuthMode::None {
                problems.push("global.enabled needs auth.mode = \"token\": a zone's name and meshes come from its zone token (`hdsd token issue --zone NAME --mesh MESH`), so without tokens any peer could speak for any zone".to_string());
            }
            if g.heartbeat_interval < MIN_ZONE_HEARTBEAT {
                problems.push(format!(
                    "global.heartbeat_interval is {}: it must be at least {} (zones send no more than one heartbeat per {}; e.g. 5s)",
                    humantime::format_duration(g.heartbeat_interval),
                    humantime::format_duration(MIN_ZONE_HEARTBEAT),
                    humantime::format_duration(MIN_ZONE_HEARTBEAT),
                ));
            }
            if g.heartbeat_interval > MAX_ZONE_HEARTBEAT {
                problems.push(format!(
                    "global.heartbeat_interval is {}: it must be at most {} (zones refuse a longer one; e.g. 5s)",
                    humantime::format_duration(g.heartbeat_interval),
                    humantime::format_duration(MAX_ZONE_HEARTBEAT),
                ));
            }
            if g.zone_timeout > MAX_ZONE_TIMEOUT {
                problems.push(format!(
                    "global.zone_timeout is {}: it must be at most {} (zones refuse a longer one; e.g. 15s)",
                    humantime::format_duration(g.zone_timeout),
                    humantime::format_duration(MAX_ZONE_TIMEOUT),
                ));
            }
            if g.offline_ttl < g.zone_timeout {
                problems.push(format!(
                    "global.offline_ttl is {}: it must be at least global.zone_timeout ({}); it is how long an offline zone keeps its last readiness",
                    humantime::format_duration(g.offline_ttl),
                    humantime::format_duration(g.zone_timeout),
                ));
            }
            let client_ca = g.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
            if client_ca && g.certificate_meshes.is_empty() {
                problems.push("global.tls.client_ca is set, but global.certificate_meshes is empty: a zone known by its certificate could sync no mesh; list them, e.g. [global.certificate_meshes] eu-1 = [\"default\"] (or \"*\" for every zone), or remove client_ca if zones dial with zone tokens".to_string());
            }
            if !client_ca && !g.certificate_meshes.is_empty() {
                problems.push("global.certificate_meshes is set, but global.tls.client_ca is not: zones can show a certificate only when [global.tls] has client_ca, the CA that signs them".to_string());
            }
            for (zone, meshes) in &g.certificate_meshes {
                if zone != ANY_CERTIFICATE_ZONE {
                    if let Err(problem) = crate::names::check_zone(zone) {
                        problems.push(format!("global.certificate_meshes: {problem}"));
                    }
                }
                if meshes.is_empty() {
                    problems.push(format!("global.certificate_meshes.{zone} is empty: list the meshes the zone may sync, or remove the entry"));
                }
                for mesh in meshes {
                    if let Err(problem) = crate::names::check_mesh(mesh) {
                        problems.push(format!("global.certificate_meshes.{zone}: {problem}"));
                    }
                }
            }
            if g.zone_timeout < g.heartbeat_interval.saturating_mul(2) {
                problems.push(format!(
                    "global.zone_timeout is {}: it must be at least twice global.heartbeat_interval ({}), or one late heartbeat takes a zone offline",
                    humantime::format_duration(g.zone_timeout),
                    humantime::format_duration(g.heartbeat_interval)
                ));
            }
            for name in g.zones.iter().chain(&g.disabled) {
                if let Err(e) = crate::names::check_zone(name) {
                    problems.push(format!("global.zones: {e}"));
                }
            }
            if g.listen.port() != 0 && (g.listen == self.hds.listen || g.listen == self.api.listen)
            {
                problems.push(format!(
                    "global.listen {} is also hds.listen or api.listen: give the zone listener its own port (default 5682)",
                    g.listen
                ));
            }
        }
        problems
    }

    pub fn validate(&self) -> Vec<String> {
        let mut problems = self.zone_problems();
        if self.hds.report_interval < MIN_REPORT_INTERVAL {
            problems.push(format!(
                "hds.report_interval is {}, below the minimum of 100ms; Envoy reports at this rate, so raise it",
                humantime::format_duration(self.hds.report_interval)
            ));
        } else if self.hds.report_interval > MAX_REPORT_INTERVAL {
            problems.push(format!(
                "hds.report_interval is {}, above the maximum of 1h: readiness would be as old as that and a dead Envoy noticed only after 3 of them; lower it (the default is 5s)",
                humantime::format_duration(self.hds.report_interval)
            ));
        }
        if self.hds.unknown_dataplane_grace.is_zero() {
            problems.push(
                "hds.unknown_dataplane_grace must be > 0 (e.g. 30s): it is how long an unknown dataplane may wait for its file"
                    .to_string(),
            );
        }
        for e in self.hds.check.probe_settings().validate() {
            problems.push(format!("hds.check: {e}"));
        }
        match (self.hds.check.kind, &self.hds.check.http.path) {
            (CheckKind::Http, None) => problems.push(
                "hds.check.kind is \"http\" but hds.check.http.path is not set; set it to the path every application serves its health on (e.g. /healthz), or use kind = \"tcp\"".to_string(),
            ),
            (_, Some(path)) => {
                if let Err(e) = validate_path(path) {
                    problems.push(format!("hds.check.{e}"));
                }
            }
            (CheckKind::Tcp, None) => {}
        }
        if let Some(tls) = &self.hds.check.tls {
            let mut errors = Vec::new();
            Tls::from(tls).validate("hds.check.tls", Spelling::Snake, &mut errors);
            problems.extend(errors.iter().map(ToString::to_string));
        }
        let stale_after = self.hds.stale_after();
        if stale_after < self.hds.report_interval * 2 {
            problems.push(format!(
                "hds.stale_after is {}, below 2 x hds.report_interval ({}): one late report would make healthy inbounds stale; raise it",
                humantime::format_duration(stale_after),
                humantime::format_duration(self.hds.report_interval * 2)
            ));
        }
        if self.hds.keepalive.interval.is_zero() || self.hds.keepalive.timeout.is_zero() {
            problems.push(
                "hds.keepalive.interval and hds.keepalive.timeout must be > 0 (e.g. 30s and 10s)"
                    .to_string(),
            );
        }
        let (d, default) = (&self.dataplanes, crate::dataplane::FileLimits::default());
        for (key, value, default) in [
            ("max_file_size", d.max_file_size, default.max_file_size),
            (
                "max_nesting",
                d.max_nesting as u64,
                default.max_nesting as u64,
            ),
            (
                "max_inbounds",
                d.max_inbounds as u64,
                default.max_inbounds as u64,
            ),
            ("max_tags", d.max_tags as u64, default.max_tags as u64),
            (
                "max_documents",
                d.max_documents as u64,
                default.max_documents as u64,
            ),
            ("max_kept_bytes", d.max_kept_bytes, default.max_kept_bytes),
        ] {
            if value == 0 {
                problems.push(format!(
                    "dataplanes.{key} must be > 0 (the default is {default}): no dataplane file could be read within 0"
                ));
            }
        }
        if self.shutdown_timeout.is_zero() {
            problems.push("shutdown_timeout must be > 0 (e.g. 10s)".to_string());
        }
        if self.auth.max_token_validity.is_zero() {
            problems.push("auth.max_token_validity must be > 0 (e.g. 8760h)".to_string());
        }
        let l = &self.hds.limits;
        for (key, value) in [
            ("hds.limits.max_connections", l.max_connections),
            (
                "hds.limits.max_connections_per_ip",
                l.max_connections_per_ip,
            ),
            (
                "hds.limits.max_streams_per_connection",
                l.max_streams_per_connection as usize,
            ),
            (
                "hds.limits.max_streams_per_dataplane",
                l.max_streams_per_dataplane,
            ),
            ("hds.limits.max_waiting_streams", l.max_waiting_streams),
            (
                "api.limits.max_connections",
                self.api.limits.max_connections,
            ),
            (
                "api.limits.max_connections_per_ip",
                self.api.limits.max_connections_per_ip,
            ),
            ("api.limits.max_watches", self.api.limits.max_watches),
            (
                "api.limits.max_streams_per_connection",
                self.api.limits.max_streams_per_connection as usize,
            ),
            ("eds.max_resource_names", self.eds.max_resource_names),
        ] {
            if value == 0 {
                problems.push(format!("{key} must be > 0: with 0 nothing could connect; remove the setting to use its default"));
            }
        }
        if self.limits.client_bytes < l.max_message_bytes {
            problems.push(format!(
                "limits.client_bytes is {}, below hds.limits.max_message_bytes ({}): one large message would be refused even with nothing else held; use the default (134217728) or at least max_message_bytes",
                self.limits.client_bytes, l.max_message_bytes
            ));
        }
        if l.max_message_bytes < 4096 {
            problems.push(format!(
                "hds.limits.max_message_bytes is {}, below 4096: Envoy's first request alone can be larger; use the default (524288) or more",
                l.max_message_bytes
            ));
        }
        for (key, value) in [
            ("hds.limits.handshake_timeout", l.handshake_timeout),
            ("hds.limits.first_request_timeout", l.first_request_timeout),
            (
                "hds.limits.unauthenticated_timeout",
                l.unauthenticated_timeout,
            ),
            ("hds.limits.idle_timeout", l.idle_timeout),
            (
                "api.limits.handshake_timeout",
                self.api.limits.handshake_timeout,
            ),
            (
                "api.limits.header_read_timeout",
                self.api.limits.header_read_timeout,
            ),
            (
                "api.limits.body_read_timeout",
                self.api.limits.body_read_timeout,
            ),
            (
                "api.limits.unauthenticated_timeout",
                self.api.limits.unauthenticated_timeout,
            ),
            ("api.limits.idle_timeout", self.api.limits.idle_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("{key} must be > 0 (e.g. 10s)"));
            }
        }
        if !self.api.listen.ip().is_loopback() && self.api.tokens.is_empty() {
            problems.push(format!(
                "api.listen is {}, reachable from other machines, but api.tokens is empty; add at least one bearer token to api.tokens (or HDSD_API__TOKENS) or listen on 127.0.0.1",
                self.api.listen
            ));
        }
        for host in &self.api.allowed_hosts {
            let name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if host.is_empty() || host.len() > 253 || !host.chars().all(name) {
                problems.push(format!(
                    "api.allowed_hosts: {host:?} is not a host name: write the name alone (letters, digits, '-' and '.'; no scheme, port or path), e.g. \"hdsd.internal\""
                ));
            }
        }
        if self.cluster.instance_timeout < Duration::from_millis(100) {
            problems.push(format!(
                "cluster.instance_timeout is {}: it must be at least 100ms (e.g. 10s): instances heartbeat every quarter of it, and one silent for longer is taken for dead",
                humantime::format_duration(self.cluster.instance_timeout)
            ));
        }
        let history_age = FEED_HISTORY_AGE;
        if self.cluster.resume_slack.is_zero() || self.cluster.resume_slack >= history_age {
            problems.push(format!(
                "cluster.resume_slack is {}: it must be at least 2s and below the change feed's history of {} (e.g. 10s); set cluster.resume_slack (or HDSD_CLUSTER__RESUME_SLACK): a watch resumed on another instance replays the changes of the last resume_slack, and that history must still hold them",
                humantime::format_duration(self.cluster.resume_slack),
                humantime::format_duration(history_age)
            ));
        } else if self.cluster.resume_slack < MIN_RESUME_SLACK {
            problems.push(format!(
                "cluster.resume_slack is {}: it must be at least {} (e.g. 10s): each instance reads the cluster's changes once a second and writes its own every 200ms, so a shorter slack cannot cover what another instance had not read yet when a watch moved; raise cluster.resume_slack (or HDSD_CLUSTER__RESUME_SLACK)",
                humantime::format_duration(self.cluster.resume_slack),
                humantime::format_duration(MIN_RESUME_SLACK)
            ));
        }
        if self.store.kind == StoreKind::Postgres {
            let pg = &self.store.postgres;
            if pg.url.is_empty() {
                problems.push(
                    "store.kind is \"postgres\" but store.postgres.url is not set; set it (or HDSD_STORE__POSTGRES__URL) to a libpq connection string, e.g. postgresql://hdsd@db.example/hdsd or host=/run/postgresql dbname=hdsd".to_string(),
                );
            } else if let Err(e) = pg.url.parse::<tokio_postgres::Config>() {
                problems.push(format!(
                    "store.postgres.url is not a libpq connection string: {e}; use postgresql://user@host:port/db or key=value pairs such as host=/run/postgresql dbname=hdsd"
                ));
            }
            if self.dataplanes.source == DataplanesSource::Dir {
                problems.push(
                    "store.kind is \"postgres\" but dataplanes.source is \"dir\": instances sharing a PostgreSQL store share their definitions, so they must come from the store; set dataplanes.source = \"api\", or remove store.kind".to_string(),
                );
            }
            if pg.pool_size == 0 {
                problems.push("store.postgres.pool_size must be >= 1 (e.g. 8)".to_string());
            }
            for (key, value) in [
                ("connect_timeout", pg.connect_timeout),
                ("wait_timeout", pg.wait_timeout),
                ("reconcile_interval", pg.reconcile_interval),
            ] {
                if value.is_zero() {
                    problems.push(format!("store.postgres.{key} must be > 0"));
                }
            }
        }
        problems
    }

    /// The files the configuration names that cannot be read (TLS
    /// certificates, keys and CAs): I/O, for the edges that validate a
    /// configuration before using it.
    /// Warnings about the files of this configuration that hold secrets
    /// other users can read (the config file itself when it holds tokens or
    /// a connection string, TLS private keys, the zone token) and about a
    /// state directory others can write: for `hdsd serve` to log once.
    pub fn secret_file_warnings(&self, config_file: Option<&Path>) -> Vec<String> {
        let mut warnings = Vec::new();
        let holds_secrets = !self.api.tokens.is_empty()
            || !self.eds.tokens.is_empty()
            || !self.store.postgres.url.is_empty();
        if let Some(path) = config_file.filter(|_| holds_secrets) {
            if let Some(mode) = permissions::readable_by_others(path) {
                warnings.push(permissions::readable_warning(
                    "config file (it holds api.tokens, eds.tokens or store.postgres.url)",
                    path,
                    mode,
                ));
            }
        }
        let mut secrets: Vec<(String, &Path)> = Vec::new();
        for (key, tls) in [
            ("hds.tls.key", &self.hds.tls),
            ("api.tls.key", &self.api.tls),
            ("global.tls.key", &self.global.tls),
        ] {
            if let Some(tls) = tls {
                secrets.push((key.to_string(), &tls.key));
            }
        }
        if let Some(zone) = &self.zone {
            if let Some(path) = &zone.token_file {
                secrets.push(("zone.token_file".to_string(), path));
            }
            if let Some(path) = &zone.key {
                secrets.push(("zone.key".to_string(), path));
            }
        }
        for (key, path) in secrets {
            if let Some(mode) = permissions::readable_by_others(path) {
                warnings.push(permissions::readable_warning(&key, path, mode));
            }
        }
        warnings.extend(permissions::state_dir_warning(&self.state_dir));
        warnings
    }

    pub fn file_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, tls) in [
            ("hds.tls", &self.hds.tls),
            ("api.tls", &self.api.tls),
            ("global.tls", &self.global.tls),
        ] {
            let Some(tls) = tls else { continue };
            for (field, path) in [
                ("cert", Some(&tls.cert)),
                ("key", Some(&tls.key)),
                ("client_ca", tls.client_ca.as_ref()),
            ] {
                if let Some(path) = path {
                    if !path.is_file() {
                        problems.push(format!(
                            "{key}.{field}: {} is not a readable file",
                            path.display()
                        ));
                    }
                }
            }
        }
        problems
    }
}

/// The complete default configuration, with a comment for every key.
pub const DEFAULTS_TOML: &str = r#"# hdsd configuration. Every key is shown with its default.
# Environment variables override the file: HDSD_<SECTION>__<KEY>, e.g.
# HDSD_HDS__REPORT_INTERVAL=10s. Durations take units: 250ms, 5s, 1m.

# Directory for hdsd's own state (signing keys, revocation list, readiness store).
state_dir = "./hdsd-data"
# How long a graceful shutdown (SIGTERM, SIGINT) may take before hdsd exits anyway.
shutdown_timeout = "10s"

[hds]
# Address of the gRPC HDS listener Envoys connect to.
listen = "0.0.0.0:5678"
# How often Envoy sends its health reports (HealthCheckSpecifier.interval). 100ms to 1h.
report_interval = "5s"
# How long a stream from an unknown dataplane waits for its file before NOT_FOUND.
unknown_dataplane_grace = "30s"
# Probe every inbound (true), or only inbounds that have a serviceProbe (false, Kuma's behaviour).
probe_all_inbounds = true
# Check each Envoy's own admin /ready (for dataplanes that declare networking.admin.port):
# while it fails (the Envoy initialises or drains), every inbound of the dataplane is `draining`.
check_envoy_ready = true
# A report older than this no longer counts: its inbounds turn `stale` (not ready) and a
# stream silent this long is ended so that Envoy reconnects. >= 2 x report_interval.
# Default: 3 x report_interval.
# stale_after = "15s"

[hds.keepalive]
# HTTP/2 pings from hdsd so that dead TCP peers are noticed even with no report due.
interval = "30s"
# How long a ping may go unanswered before the connection is closed.
timeout = "10s"

[hds.limits]
# What one client may hold of the HDS listener; each limit counts its hits in a metric
# (docs/security.md: "Limits and hardening").
# Connections open at once (HDS and EDS clients), and from one source IP address. When one
# is reached, a newcomer takes the slot of a connection that has not authenticated (the
# oldest of its own address at the per-address cap, else of the address holding the most);
# it is refused only when all in the way have.
max_connections = 10000
max_connections_per_ip = 128
# From accept to the end of the TLS handshake and the HTTP/2 preface; a silent client is closed.
handshake_timeout = "10s"
# From accept to the first stream accepted (with a valid token under auth.mode = "token").
unauthenticated_timeout = "10s"
# A connection with no stream open for this long is closed (PINGs do not count).
idle_timeout = "60s"
# Concurrent HTTP/2 streams per connection (an Envoy opens one HDS stream).
max_streams_per_connection = 8
# The largest gRPC message hdsd decodes (a health report), in bytes.
max_message_bytes = 524288
# How long a new stream may take to send its first HealthCheckRequest.
first_request_timeout = "10s"
# Streams bound to one node id at once, and streams waiting for unknown dataplanes in total.
max_streams_per_dataplane = 4
max_waiting_streams = 1000

[hds.check]
# Time between two TCP probes of an inbound's application.
interval = "1s"
# How long a probe may take; must be <= interval and <= no_traffic_interval.
timeout = "1s"
# HDS clusters carry no traffic, so this is Envoy's real probe cadence.
# Defaults to `interval` when not set.
# no_traffic_interval = "1s"
# Consecutive successes before an inbound is healthy again.
healthy_threshold = 1
# Consecutive failures before an inbound is unhealthy.
unhealthy_threshold = 2
# The check of inbounds whose serviceProbe names no kind: "tcp" (a connect to the
# application's port) or "http" (a GET of [hds.check.http] path, expecting 200-299).
kind = "tcp"

# [hds.check.http]
# The path every application serves its health on; required when kind = "http".
# path = "/healthz"

# [hds.check.tls]
# The default check over TLS (a serviceProbe that names a kind gives its own `tls`).
# The files are paths on each Envoy's machine: hdsd passes them and never reads them.
# The CA that signs the applications' certificates (or insecure_skip_verify = true).
# ca_file = "/etc/envoy/apps-ca.pem"
# The server name sent in the handshake; with ca_file, the certificate must name it.
# sni = "app.internal"
# A certificate and key for applications that require one (mutual TLS).
# client_cert_file = "/etc/envoy/probe.pem"
# client_key_file = "/etc/envoy/probe.key"
# ALPN protocols offered (default: none).
# alpn = ["http/1.1"]
# false keeps the table but probes in plaintext.
# enabled = true

# TLS for the HDS listener (PEM files, reloaded when they change). Plaintext when absent.
# [hds.tls]
# cert = "/etc/hdsd/tls/server.pem"
# key = "/etc/hdsd/tls/server.key"
# Require client certificates signed by this CA (mutual TLS).
# client_ca = "/etc/hdsd/tls/clients-ca.pem"

[auth]
# "token": every Envoy must present a dataplane token (gRPC metadata `authorization`).
# "none": no authentication; any client may claim any dataplane (trusted networks only).
mode = "token"
# The longest validity `hdsd token issue --valid-for` may grant.
max_token_validity = "365days"
# Revoked token ids, one per line; default: <state_dir>/revoked-tokens. Reloaded while running.
# revocations = "./hdsd-data/revoked-tokens"
# Public keys of other issuers whose tokens are accepted, e.g.
# public_keys = [{ kid = "issuer-1", path = "/etc/hdsd/issuer-1.pub.pem" }]
public_keys = []

[api]
# Address of the REST API, /metrics, /healthz and /readyz.
listen = "127.0.0.1:5680"
# Static bearer tokens for the REST API; required when api.listen is not loopback.
tokens = []
# Without api.tokens, the API answers only requests whose Host is an IP address, localhost,
# a name under .localhost or one of these names (a page's DNS name pointed at this machine
# must not reach the open API); e.g. ["hdsd.internal"].
allowed_hosts = []

[api.limits]
# Connections open at once, and from one source IP address; at a cap, a newcomer takes the
# slot of a connection that has not authenticated, as on the HDS listener.
max_connections = 512
max_connections_per_ip = 64
# From accept to the end of the TLS handshake and the first bytes of a request.
handshake_timeout = "10s"
# How long an HTTP/1 request's headers may take, from the connection's start or the
# previous response (so it is also how long a kept-alive connection may sit idle).
header_read_timeout = "10s"
# How long a request's body may take, from the end of its headers (not gRPC).
body_read_timeout = "30s"
# From accept to the first request answered with success (with one of api.tokens where
# the endpoint needs one).
unauthenticated_timeout = "10s"
# A connection with no request open for this long is closed (PINGs do not count; an
# open event stream or Watch does).
idle_timeout = "60s"
# Watches (gRPC Watch and GET /api/v1/watch) open at once, in total; one more is refused
# (RESOURCE_EXHAUSTED, HTTP 429) and counted in hdsd_limit_hits_total{limit="max_watches"}.
max_watches = 512
# Dataplane names plus selector tags one watch may name; more is refused (RESOURCE_EXHAUSTED,
# HTTP 400) and counted in hdsd_limit_hits_total{limit="max_watch_names"}. 0: names and
# selectors are refused, a watch by mesh still works.
max_watch_names = 256
# Concurrent HTTP/2 streams per API connection: the watches one connection may have open
# at once (and a browser's requests); one more waits or gets REFUSED_STREAM. HTTP/1: one.
max_streams_per_connection = 64

# TLS for the REST API, same keys as [hds.tls].
# [api.tls]
# cert = "/etc/hdsd/tls/api.pem"
# key = "/etc/hdsd/tls/api.key"

[dataplanes]
# Where definitions come from: "dir" (the files of `dir`, watched for changes) or "api"
# (the store, managed with PUT/DELETE /api/v1/dataplanes/{mesh}/{name} and `hdsd apply`).
source = "dir"
# Directory of Dataplane YAML files (*.yaml, *.yml), watched for changes.
dir = "./dataplanes"
# Limits on each file; a file past one is rejected like a broken file (its last good
# definitions stay) and counted in hdsd_dataplane_file_limit_hits_total.
# Bytes a file may have (1 MiB); also the most its YAML aliases may expand it to.
max_file_size = 1048576
# Levels of YAML nesting (a Dataplane needs about 6).
max_nesting = 32
# YAML aliases (*name) per file; 0 refuses every alias.
max_aliases = 64
# Inbounds per dataplane.
max_inbounds = 4096
# Tags per inbound.
max_tags = 64
# YAML documents (or JSON values) per file, empty ones included.
max_documents = 10000
# Bytes the parse of one file may keep for its next version (its text, and per document
# what it parsed to): 4 MiB. The sum over files is hdsd_dataplane_document_cache_bytes.
max_kept_bytes = 4194304
# A key the Dataplane resource does not define (a typo, or a field of another Kuma version):
# "refuse" refuses the file, naming the key and its line; "warn" ignores the key and lists a
# warning with the file (hdsd validate, GET /api/v1/sources, hdsd status, the page).
unknown_fields = "refuse"

[store]
# Where definitions of dataplanes.source = "api" are kept: "redb" (a file under state_dir,
# one instance) or "postgres" (a database several instances share, with the readiness each
# instance folds from the streams it holds). Readiness is kept in the same store.
kind = "redb"

[store.postgres]
# A libpq connection string (HDSD_STORE__POSTGRES__URL): postgresql://user:pass@host:5432/db,
# or key=value pairs, e.g. "host=/run/postgresql dbname=hdsd" for a unix socket.
url = ""
# The most connections one instance opens, besides the one that listens for changes.
pool_size = 8
# How long opening a connection may take.
connect_timeout = "5s"
# How long a request waits for a free connection of the pool.
wait_timeout = "5s"
# How often every definition is read again (changes arrive within a second by
# LISTEN/NOTIFY; this heals a notification missed while a connection was down).
reconcile_interval = "30s"

[cluster]
# Instances sharing a PostgreSQL store heartbeat every quarter of this; one silent for
# longer is dead, and a live instance marks the dataplanes it held disconnected (they go
# stale by the usual rule unless their Envoys reconnect to another instance). Set the same
# value on every instance.
instance_timeout = "10s"
# Watch revisions are valid on every instance (cluster time, in microseconds): a watch
# resumed on another instance at revision R replays every dataplane that changed after
# R minus this, and R may be ahead of that instance by up to this (further ahead: RESYNC).
# At least 2s and below 5m (the change feed's history).
resume_slack = "10s"

[eds]
# EDS (Envoy's EndpointDiscoveryService) is served on hds.listen: one ClusterLoadAssignment
# per <mesh>/<service>. With auth.mode = "token", EDS clients send one of api.tokens or
# eds.tokens as `authorization: Bearer <token>`.
# How a `stale` inbound (its checker stopped reporting) is served: "degraded" (kept as a
# fallback, used only when nothing healthy is left) or "unhealthy".
stale_as = "degraded"
# Leave not-ready endpoints out instead of marking them unhealthy (Kuma's behaviour); Envoy's
# admin /clusters then no longer shows them.
omit_not_ready = false
# Bearer tokens accepted from EDS clients only (beside api.tokens), e.g. for front proxies
# that should not read the REST API.
tokens = []
# The assignments' overprovisioning factor in percent (Envoy's default): a priority (a zone)
# keeps all of its load while at least 100/factor of its endpoints are healthy.
overprovisioning_factor = 140
# On a global, an offline zone's endpoints: "degraded", "unhealthy", "keep" or "withdraw".
offline_zone = "degraded"
# Off unless set: endpoint_stale_after in every assignment (a front that received nothing for
# this long drops the assignment's endpoints and answers 503); hdsd then re-sends every
# assignment every third of it. At least 1s.
# endpoint_stale_after = "30s"
# Resource names one EDS request may name; a request with more ends its stream with
# RESOURCE_EXHAUSTED, counted in hdsd_limit_hits_total{limit="max_eds_resource_names"}.
max_resource_names = 4096

[eds.zone_priorities]
# Per front zone, the zones that take over in order (the front's own zone is always priority 0;
# zones not listed come after the listed ones). Without an entry, every other zone is priority 1.
# eu-1 = ["eu-2", "us-1"]

[log]
# Log filter: error, warn, info, debug, trace, or a tracing directive. RUST_LOG wins when set.
level = "info"
# text or json.
format = "text"
# Bytes of log written per second at most, over the whole process (0: no limit). Past it,
# lines are left out, and the next line written says how many lines and bytes were.
max_bytes_per_second = 262144

[limits]
# Bytes hdsd holds at once on behalf of all its clients, over every listener: gRPC messages
# and HTTP request bodies that have not arrived whole (a report in one piece holds nothing).
# Past it the largest holders give way first: the stream is reset with RESOURCE_EXHAUSTED
# (an HTTP request fails), never the process. Metric: hdsd_client_bytes.
client_bytes = 134217728
"#;

pub mod explain;
pub mod permissions;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn no_env() -> Env {
        Env::prefixed("HDSD_TEST_UNUSED_PREFIX_")
    }

    fn load_str(ext: &str, text: &str) -> Result<Config, ConfigError> {
        let mut f = tempfile::Builder::new().suffix(ext).tempfile().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        Config::load_with_env(Some(f.path()), no_env())
    }

    #[test]
    fn zones_are_known_by_their_token_only() {
        let mut c = Config::default();
        c.global.enabled = true;
        c.auth.mode = AuthMode::None;
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("global.enabled needs auth.mode = \"token\""),
            "{problems}"
        );
        c.auth.mode = AuthMode::Token;
        assert!(c.validate().is_empty(), "{:?}", c.validate());

        // A zone whose own Envoys need no token still needs a zone token.
        let mut z = Config::default();
        z.auth.mode = AuthMode::None;
        z.zone = Some(ZoneConfig {
            name: "eu-1".into(),
            global: vec!["http://global.example:5682".into()],
            token_file: None,
            ca: None,
            cert: None,
            key: None,
        });
        let problems = z.validate().join("\n");
        assert!(
            problems.contains("zone.token_file is not set"),
            "{problems}"
        );
        if let Some(zone) = z.zone.as_mut() {
            zone.token_file = Some(PathBuf::from("zone.token"));
        }
        assert!(z.validate().is_empty(), "{:?}", z.validate());

        // Or a client certificate, over https:// only, with its key.
        let zone = z.zone.as_mut().unwrap();
        zone.token_file = None;
        zone.cert = Some(PathBuf::from("zone.pem"));
        let problems = z.validate().join("\n");
        assert!(
            problems.contains("zone.cert is set but zone.key is not"),
            "{problems}"
        );
        assert!(
            problems.contains("is not https://: a client certificate is shown only over TLS"),
            "{problems}"
        );
        assert!(
            !problems.contains("zone.token_file is not set"),
            "{problems}"
        );
        let zone = z.zone.as_mut().unwrap();
        assert_eq!(
            zone.plaintext_globals().collect::<Vec<_>>(),
            ["http://global.example:5682"]
        );
        zone.key = Some(PathBuf::from("zone.key"));
        zone.global = vec!["https://global.example:5682".into()];
        zone.ca = Some(PathBuf::from("global-ca.pem"));
        assert_eq!(zone.plaintext_globals().count(), 0);
        assert!(z.validate().is_empty(), "{:?}", z.validate());
    }

    /// The global's timings stay within what zones follow, and a huge one
    /// is a problem, not an overflow.
    #[test]
    fn the_globals_timings_are_bounded_as_zones_bound_them() {
        let mut c = Config::default();
        c.global.enabled = true;
        c.global.heartbeat_interval = MAX_ZONE_HEARTBEAT;
        c.global.zone_timeout = MAX_ZONE_TIMEOUT;
        c.global.offline_ttl = MAX_ZONE_TIMEOUT;
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        c.global.heartbeat_interval = Duration::MAX;
        c.global.zone_timeout = MAX_ZONE_TIMEOUT + Duration::from_secs(1);
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("global.heartbeat_interval is") && problems.contains("at most 1h"),
            "{problems}"
        );
        assert!(
            problems.contains("global.zone_timeout is") && problems.contains("at most 1day"),
            "{problems}"
        );
    }

    #[test]
    fn zones_known_by_certificate_need_the_client_ca_and_their_meshes() {
        let mut c = Config::default();
        c.global.enabled = true;
        c.global.tls = Some(TlsConfig {
            cert: "g.pem".into(),
            key: "g.key".into(),
            client_ca: Some("zones-ca.pem".into()),
        });
        let problems = c.validate().join("\n");
        assert!(
            problems
                .contains("global.tls.client_ca is set, but global.certificate_meshes is empty"),
            "{problems}"
        );
        c.global
            .certificate_meshes
            .insert("*".into(), vec!["default".into()]);
        c.global
            .certificate_meshes
            .insert("EU".into(), vec!["Bad Mesh".into()]);
        c.global.certificate_meshes.insert("us-1".into(), vec![]);
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("global.certificate_meshes: "),
            "{problems}"
        );
        assert!(
            problems.contains("global.certificate_meshes.EU: "),
            "{problems}"
        );
        assert!(
            problems.contains("global.certificate_meshes.us-1 is empty"),
            "{problems}"
        );
        c.global.certificate_meshes.remove("EU");
        c.global.certificate_meshes.remove("us-1");
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        c.global.tls.as_mut().unwrap().client_ca = None;
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("global.certificate_meshes is set, but global.tls.client_ca is not"),
            "{problems}"
        );
    }

    #[test]
    fn unknown_fields_are_refused_by_default_and_can_be_warnings() {
        use crate::dataplane::UnknownFields;
        let c = Config::default();
        assert_eq!(c.dataplanes.unknown_fields, UnknownFields::Refuse);
        assert_eq!(c.dataplanes.limits().unknown_fields, UnknownFields::Refuse);
        // `hdsd config defaults` prints DEFAULTS_TOML.
        assert!(
            DEFAULTS_TOML.contains("\nunknown_fields = \"refuse\"\n"),
            "{DEFAULTS_TOML}"
        );
        let c = load_str(".toml", "[dataplanes]\nunknown_fields = \"warn\"\n").unwrap();
        assert_eq!(c.dataplanes.limits().unknown_fields, UnknownFields::Warn);
        let e = load_str(".toml", "[dataplanes]\nunknown_fields = \"ignore\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dataplanes.unknown_fields"), "{e}");
        assert!(e.contains("refuse") && e.contains("warn"), "{e}");
    }

    #[test]
    fn defaults_text_is_the_defaults() {
        let c = load_str(".toml", DEFAULTS_TOML).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.validate().is_empty());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own error type
    fn the_postgres_store_from_the_environment_and_its_rules() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HDSD_DATAPLANES__SOURCE", "api");
            jail.set_env("HDSD_STORE__KIND", "postgres");
            jail.set_env(
                "HDSD_STORE__POSTGRES__URL",
                "host=/run/postgresql dbname=hdsd",
            );
            jail.set_env("HDSD_CLUSTER__RESUME_SLACK", "20s");
            let c = Config::load(None).unwrap();
            assert_eq!(c.cluster.resume_slack, Duration::from_secs(20));
            assert_eq!(c.dataplanes.source, DataplanesSource::Api);
            assert_eq!(c.store.kind, StoreKind::Postgres);
            assert_eq!(c.store.postgres.pool_size, 8);
            assert!(c.validate().is_empty(), "{:?}", c.validate());
            Ok(())
        });
        let mut c = Config::default();
        c.store.kind = StoreKind::Postgres;
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("store.postgres.url is not set"),
            "{problems}"
        );
        assert!(
            problems.contains("dataplanes.source is \"dir\""),
            "{problems}"
        );
        c.dataplanes.source = DataplanesSource::Api;
        c.store.postgres.url = "postgresql://db:notaport/x".into();
        c.store.postgres.pool_size = 0;
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("not a libpq connection string"),
            "{problems}"
        );
        assert!(problems.contains("pool_size must be >= 1"), "{problems}");
    }

    #[test]
    fn the_instance_timeout_is_a_duration_of_at_least_100ms() {
        let c = load_str(".toml", "[cluster]\ninstance_timeout = \"2s\"\n").unwrap();
        assert_eq!(c.cluster.instance_timeout, Duration::from_secs(2));
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        assert_eq!(
            Config::default().cluster.instance_timeout,
            Duration::from_secs(10)
        );
        let c = load_str(".toml", "[cluster]\ninstance_timeout = \"0s\"\n").unwrap();
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("cluster.instance_timeout is 0s: it must be at least 100ms"),
            "{problems}"
        );
    }

    #[test]
    fn the_resume_slack_is_a_duration_above_zero_and_below_the_feeds_history() {
        assert_eq!(
            Config::default().cluster.resume_slack,
            Duration::from_secs(10)
        );
        let c = load_str(".toml", "[cluster]\nresume_slack = \"30s\"\n").unwrap();
        assert_eq!(c.cluster.resume_slack, Duration::from_secs(30));
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        let c = load_str(".toml", "[cluster]\nresume_slack = \"500ms\"\n").unwrap();
        let problems = c.validate().join("\n");
        assert!(
            problems.contains("cluster.resume_slack is 500ms: it must be at least 2s"),
            "{problems}"
        );
        for bad in ["0s", "5m", "1h"] {
            let c = load_str(".toml", &format!("[cluster]\nresume_slack = \"{bad}\"\n")).unwrap();
            let problems = c.validate().join("\n");
            assert!(
                problems.contains(&format!("cluster.resume_slack is {bad}: it must be at least 2s and below the change feed's history of 5m")),
                "{problems}"
            );
            assert!(
                problems.contains("HDSD_CLUSTER__RESUME_SLACK"),
                "{problems}"
            );
        }
    }

    #[test]
    fn eds_options() {
        let c = load_str(
            ".toml",
            "[eds]\nstale_as = \"unhealthy\"\nomit_not_ready = true\ntokens = [\"front\"]\n",
        )
        .unwrap();
        assert_eq!(c.eds.stale_as, StaleAs::Unhealthy);
        assert_eq!(c.eds.tokens, ["front"]);
        assert!(c.eds.omit_not_ready);
        let e = load_str(".toml", "[eds]\nstale_as = \"gone\"\n").unwrap_err();
        assert!(e.to_string().contains("degraded"), "{e}");
    }

    #[test]
    fn yaml_file_and_durations() {
        let c = load_str(
            ".yaml",
            "hds:\n  report_interval: 250ms\n  check:\n    interval: 2s\n    no_traffic_interval: 3s\n",
        )
        .unwrap();
        assert_eq!(c.hds.report_interval, Duration::from_millis(250));
        let p = c.hds.check.probe_settings();
        assert_eq!(p.interval, Duration::from_secs(2));
        assert_eq!(p.no_traffic_interval, Duration::from_secs(3));
    }

    #[test]
    fn no_traffic_interval_defaults_to_interval() {
        let c = load_str(
            ".toml",
            "[hds.check]\ninterval = \"7s\"\ntimeout = \"1s\"\n",
        )
        .unwrap();
        assert_eq!(
            c.hds.check.probe_settings().no_traffic_interval,
            Duration::from_secs(7)
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let e = load_str(".toml", "[hds]\nreport_intervall = \"5s\"\n").unwrap_err();
        assert!(e.to_string().contains("report_intervall"), "{e}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own error type
    fn env_overrides_file() {
        // figment::Jail isolates the environment for the duration of the closure.
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[hds]\nreport_interval = \"7s\"\n")?;
            jail.set_env("HDSD_HDS__REPORT_INTERVAL", "10s");
            jail.set_env("HDSD_API__LISTEN", "127.0.0.1:9999");
            // The tests' own switches are not settings (CI sets this one).
            jail.set_env("HDSD_REQUIRE_DOCKER", "1");
            jail.set_env("HDSD_REQUIRE_POSTGRES", "1");
            let c = Config::load(Some(Path::new("c.toml"))).unwrap();
            assert_eq!(c.hds.report_interval, Duration::from_secs(10));
            assert_eq!(c.api.listen.port(), 9999);
            Ok(())
        });
    }

    #[test]
    fn missing_file_and_bad_extension() {
        let e =
            Config::load_with_env(Some(Path::new("/nonexistent/x.toml")), no_env()).unwrap_err();
        assert!(matches!(e, ConfigError::Missing { .. }));
        let e = load_str(".ini", "x=1").unwrap_err();
        assert!(e.to_string().contains(".toml, .yaml or .yml"), "{e}");
    }

    #[test]
    fn default_check_kind() {
        let c = load_str(
            ".toml",
            "[hds]\ncheck_envoy_ready = false\n[hds.check]\nkind = \"http\"\n[hds.check.http]\npath = \"/healthz\"\n",
        )
        .unwrap();
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        assert!(!c.hds.check_envoy_ready);
        assert_eq!(
            c.hds.check.check(),
            Check::Http(HttpCheck::path("/healthz"))
        );
        assert_eq!(Config::default().hds.check.check(), Check::default());
        assert!(Config::default().hds.check_envoy_ready);

        let mut c = Config::default();
        c.hds.check.kind = CheckKind::Http;
        assert_eq!(
            c.validate(),
            vec!["hds.check.kind is \"http\" but hds.check.http.path is not set; set it to the path every application serves its health on (e.g. /healthz), or use kind = \"tcp\"".to_string()]
        );
        c.hds.check.http.path = Some("healthz".into());
        assert_eq!(
            c.validate(),
            vec!["hds.check.http.path \"healthz\" must start with '/' (e.g. /healthz)".to_string()]
        );
        let e = load_str(".toml", "[hds.check]\nkind = \"grpc\"\n").unwrap_err();
        assert!(e.to_string().contains("grpc"), "{e}");
    }

    #[test]
    fn default_check_tls() {
        let c = load_str(
            ".toml",
            "[hds.check]\nkind = \"http\"\n[hds.check.http]\npath = \"/healthz\"\n[hds.check.tls]\nca_file = \"/etc/envoy/ca.pem\"\nsni = \"app.internal\"\n",
        )
        .unwrap();
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        let check = c.hds.check.check();
        let tls = check.tls_in_force().unwrap();
        assert_eq!(
            (tls.ca_file.as_deref(), tls.sni.as_deref()),
            (Some("/etc/envoy/ca.pem"), Some("app.internal"))
        );
        assert_eq!(check.kind(), "http");
        // The TCP default check carries it too; `enabled = false` keeps it off.
        let mut c = Config::default();
        c.hds.check.tls = Some(CheckTlsConfig {
            enabled: false,
            sni: None,
            ca_file: None,
            insecure_skip_verify: false,
            client_cert_file: None,
            client_key_file: None,
            alpn: Vec::new(),
        });
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        assert_eq!(c.hds.check.check().tls_in_force(), None);
        // Every rule, in the file's own spelling.
        let c = load_str(
            ".toml",
            "[hds.check.tls]\nclient_key_file = \"probe.key\"\nalpn = [\"\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.validate(),
            vec![
                "hds.check.tls: say how Envoy verifies the application's certificate: set ca_file (the CA that signs it, a PEM file on the Envoy's machine) or insecure_skip_verify = true (no verification: anyone on the path can pose as the application)".to_string(),
                "hds.check.tls.client_key_file \"probe.key\" is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)".to_string(),
                "hds.check.tls.client_key_file is set but hds.check.tls.client_cert_file is not; a client certificate needs its private key: set both, or neither".to_string(),
                "hds.check.tls.alpn: \"\" is not an ALPN protocol id; use 1-255 visible ASCII characters, no spaces (e.g. h2, http/1.1)".to_string(),
            ]
        );
        let e = load_str(".toml", "[hds.check.tls]\ninsecure_skip_verify = \"yes\"\n").unwrap_err();
        assert!(e.to_string().contains("insecure_skip_verify"), "{e}");
    }

    #[test]
    fn dataplane_file_limits() {
        let c = load_str(
            ".toml",
            "[dataplanes]\nmax_file_size = 2048\nmax_nesting = 8\nmax_aliases = 0\nmax_inbounds = 10\nmax_tags = 3\n",
        )
        .unwrap();
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        let l = c.dataplanes.limits();
        assert_eq!(
            (
                l.max_file_size,
                l.max_nesting,
                l.max_aliases,
                l.max_inbounds,
                l.max_tags
            ),
            (2048, 8, 0, 10, 3)
        );
        assert_eq!(
            Config::default().dataplanes.limits(),
            crate::dataplane::FileLimits::default()
        );
        let c = load_str(".toml", "[dataplanes]\nmax_nesting = 0\n").unwrap();
        assert_eq!(
            c.validate(),
            vec!["dataplanes.max_nesting must be > 0 (the default is 32): no dataplane file could be read within 0".to_string()]
        );
        // The text form the fuzz target uses.
        let c = Config::from_text("dataplanes:\n  max_tags: 5\n", "yaml").unwrap();
        assert_eq!(c.dataplanes.max_tags, 5);
        assert!(Config::from_text("[dataplanes]\nmax_tagz = 5\n", "toml").is_err());
    }

    #[test]
    fn the_report_interval_is_within_100ms_and_1h_as_the_defaults_say() {
        assert!(DEFAULTS_TOML.contains("HealthCheckSpecifier.interval). 100ms to 1h."));
        for (value, ok) in [
            ("100ms", true),
            ("1h", true),
            ("99ms", false),
            ("2h", false),
        ] {
            let c = load_str(
                ".toml",
                &format!("[hds]\nreport_interval = \"{value}\"\nstale_after = \"3h\"\n"),
            )
            .unwrap();
            let problems = c.validate();
            assert_eq!(
                problems
                    .iter()
                    .any(|p| p.starts_with("hds.report_interval is")),
                !ok,
                "{value}: {problems:?}"
            );
        }
    }

    #[test]
    fn validation_lists_every_problem() {
        let mut c = Config::default();
        c.hds.report_interval = Duration::from_millis(50);
        c.hds.check.timeout = Duration::from_secs(5);
        c.hds.check.unhealthy_threshold = 0;
        let problems = c.validate();
        // timeout above interval: one problem, not a second one about the
        // no_traffic_interval that was never set (it is the interval).
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(!problems.iter().any(|p| p.contains("no_traffic_interval")));
        c.hds.check.no_traffic_interval = Some(Duration::from_secs(2));
        assert_eq!(c.validate().len(), 4, "{:#?}", c.validate());
        assert!(problems[0].contains("report_interval"));
        assert!(problems.iter().any(|p| p.contains("timeout")));
        assert!(problems.iter().any(|p| p.contains("unhealthy_threshold")));
    }

    #[test]
    fn validation_reads_no_file_and_file_problems_do() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "x").unwrap();
        let mut c = Config::default();
        c.hds.tls = Some(TlsConfig {
            cert,
            key: dir.path().join("missing.key"),
            client_ca: None,
        });
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        let problems = c.file_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("hds.tls.key: ") && problems[0].contains("missing.key"),
            "{problems:?}"
        );
    }
}
