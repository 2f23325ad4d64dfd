//! `hdsd serve`: wires the source, the registry, the HDS service and the API
//! together ([`Server::build`], which starts nothing) and runs them until
//! shutdown ([`Server::run`]: every long-lived task in one supervised set,
//! `supervisor`, whose module doc says why hdsd is crash-only).

mod supervisor;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, ApiState};
use crate::auth::Gate;
use crate::clock::{Clock, SystemClock};
use crate::cluster::{Cluster, PgCluster, Solo};
use crate::config::{AuthMode, Config, DataplanesSource, StoreKind};
use crate::hds::{HdsService, HdsSettings};
use crate::net::{Admission, Incoming, Plain};
use crate::registry::{Registry, RegistryOptions};
use crate::source::{self, Loaded};
use crate::specifier::SpecifierSettings;
use crate::store::definitions::{self, DefinitionStore};
use crate::store::postgres::PgStore;
use crate::store::{ReadinessStore, RedbStore, StoreHandle, StoreStatus};
use crate::task::Task;
use crate::tls::TlsHandshake;

pub use supervisor::Stopped;
use supervisor::Supervisor;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    #[error(transparent)]
    Dataplanes(#[from] source::DirError),
    #[error("cannot listen on {what} address {addr}: {source}; choose a free port or stop the process using it")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} socket passed in as LISTEN_FDS #{index} is unusable: {source}; pass listening TCP sockets (HDS first, then API), or unset LISTEN_FDS")]
    Passed {
        what: &'static str,
        index: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch the dataplanes directory for changes: {0}; check that it exists and that the inotify limits (fs.inotify.max_user_instances, max_user_watches) are not exhausted")]
    Watch(#[from] notify::Error),
    #[error("HDS listener failed: {0}")]
    Hds(#[from] tonic::transport::Error),
    #[error("zone listener (global.listen) failed: {0}")]
    Zones(tonic::transport::Error),
    #[error("API listener failed: {0}")]
    Api(std::io::Error),
    #[error("{0}")]
    Stopped(Stopped),
    #[error("cannot set up dataplane authentication: {0}")]
    Auth(#[from] crate::auth::GateError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("{0}; check that state_dir is writable, or move the file aside")]
    Store(#[from] crate::store::StoreError),
    #[error("cannot read the dataplane definitions: {0}")]
    Definitions(crate::store::StoreError),
    #[error("cannot read the readiness state: {0}")]
    Readiness(crate::store::StoreError),
}

impl ServeError {
    /// The process exit code: 1 when hdsd could not start (fix the setup),
    /// 2 when it failed while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::Hds(_)
            | ServeError::Zones(_)
            | ServeError::Api(_)
            | ServeError::Stopped(_) => 2,
            _ => 1,
        }
    }
}

/// Accept queue of the HDS listener: a reconnect storm of thousands of Envoys
/// queues instead of being dropped (and retried a second later) by the kernel.
/// The kernel caps it at `net.core.somaxconn`.
const HDS_BACKLOG: u32 = 4096;

/// HTTP/2 flow-control windows of the HDS listener: how much an Envoy may
/// send before hdsd has read it. A window is a bound, not an allocation: data
/// is buffered only while hdsd has not read it yet. hyper's default is 1 MiB
/// for each stream and for each connection; an Envoy's HDS stream carries one
/// report of a few hundred bytes per report interval, so 64 KiB (HTTP/2's own
/// default, 65,535 bytes) is hundreds of reports of slack, and it caps what a
/// client whose dataplane task is busy can make hdsd hold at 64 KiB per
/// connection instead of 1 MiB.
const HDS_STREAM_WINDOW: u32 = 65_535;

/// The largest header block an HDS or EDS client may send: a dataplane token
/// and gRPC's headers take about 1 KiB.
const HDS_MAX_HEADER_LIST: u32 = 16 * 1024;

const HDS_CONNECTION_WINDOW: u32 = 65_535;

fn bind_with_backlog(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// File descriptors hdsd needs beside its connections (files, the store,
/// watches, the runtime).
const SPARE_FILES: u64 = 256;

/// Raises the soft open-file limit to the hard limit (systemd's default soft
/// limit is 1024, far below what many Envoys need) and warns when even the
/// hard limit is below what the connection caps allow.
pub fn raise_open_file_limit(config: &Config) {
    let wanted = (config.hds.limits.max_connections as u64)
        .saturating_add(config.api.limits.max_connections as u64)
        .saturating_add(SPARE_FILES);
    let soft = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit (RLIMIT_NOFILE)");
            return;
        }
    };
    tracing::info!(
        open_files = soft,
        "open-file limit (soft, raised to the hard limit)"
    );
    if soft < wanted {
        tracing::warn!(
            open_files = soft,
            needed = wanted,
            "the open-file limit ({soft}) is below hds.limits.max_connections + api.limits.max_connections + {SPARE_FILES}: \
             when it runs out, new connections wait until others close. Raise it (LimitNOFILE= in the \
             systemd unit, ulimit -Hn) or lower the connection caps"
        );
    }
}

/// The listening socket passed in at `index`, if any.
fn passed_listener(
    passed: &mut listenfd::ListenFd,
    index: usize,
    what: &'static str,
) -> Result<Option<TcpListener>, ServeError> {
    let bad = |source: std::io::Error| ServeError::Passed {
        what,
        index,
        source,
    };
    let Some(listener) = passed.take_tcp_listener(index).map_err(bad)? else {
        return Ok(None);
    };
    listener.set_nonblocking(true).map_err(bad)?;
    let listener = TcpListener::from_std(listener).map_err(bad)?;
    tracing::info!(
        addr = %listener.local_addr().map_err(bad)?,
        "{what}: using the listening socket passed in (LISTEN_FDS)"
    );
    Ok(Some(listener))
}

/// Zeroes the series whose label values belong to other parts than
/// `metrics` (which names no type of hdsd's): every limit of a dataplane
/// file, every EDS health tier, every reason of a watch RESYNC.
fn zero_owned_labels() {
    use crate::metrics as m;
    m::zero_counters(
        m::FILE_LIMIT_HITS,
        "limit",
        &crate::dataplane::Limit::ALL.map(|l| l.as_str()),
    );
    m::zero_gauges(
        m::EDS_ENDPOINTS,
        "health",
        &crate::consumers::eds::assignment::EdsHealth::ALL.map(|h| h.as_str()),
    );
    m::zero_counters(m::TASK_PANICS, "work", &["dataplane", "zone_stream"]);
    m::zero_counters(
        m::WATCH_RESYNCS,
        "reason",
        &crate::feed::ResyncReason::ALL.map(|r| r.as_str()),
    );
}

/// The long-lived tasks a build wires, by name, for [`Server::run`] to
/// supervise.
#[derive(Default)]
struct Tasks(Vec<(&'static str, Task)>);

impl Tasks {
    fn add(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.0.push((name, crate::task::task(task)));
    }
}

/// How long the API goes on answering `/readyz` (503, naming the task)
/// after a supervised task stopped, at least: a probe or an operator
/// polling it sees why before the process exits. At most half of
/// `shutdown_timeout`.
const STOPPED_LINGER: Duration = Duration::from_secs(2);

/// A server built: configuration validated, stores open, cluster picked,
/// dataplanes loaded, state and listeners wired and bound. Nothing runs
/// yet: [`Server::run`] spawns every long-lived task into one supervised
/// set (`supervisor`) beside the listeners.
pub struct Server {
    tasks: Tasks,
    hds: Serving<tonic::transport::Error>,
    api: Serving<std::io::Error>,
    zones: Option<Serving<tonic::transport::Error>>,
    hds_addr: std::net::SocketAddr,
    api_addr: std::net::SocketAddr,
    zones_addr: Option<std::net::SocketAddr>,
    store: StoreHandle,
    joined: crate::cluster::Joined,
    phase: watch::Sender<api::Phase>,
    /// Ends the streams (HDS, EDS, zones, watches).
    drain: watch::Sender<bool>,
    /// Ends the API's listener, after the streams.
    drain_api: watch::Sender<bool>,
    shutdown_timeout: Duration,
}

/// Builds hdsd, then runs it until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    Server::build(config).await?.run(shutdown).await
}

impl Server {
    /// Validates, opens the stores, picks the cluster, loads the sources,
    /// wires the state and binds the listeners: a handful of named steps,
    /// each owning one part of the wiring. Starts no task.
    pub async fn build(config: Config) -> Result<Server, ServeError> {
        let mut problems = config.validate();
        problems.extend(config.file_problems());
        if !problems.is_empty() {
            return Err(ServeError::Config(problems));
        }
        raise_open_file_limit(&config);
        let settings = SpecifierSettings::from(&config);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let mut tasks = Tasks::default();
        let stores = Stores::open(&config, &mut tasks).await?;
        let cluster = stores.cluster(&config);
        let instance = cluster.instance().to_string();
        // A zone's instances take turns at the uplink: one lease for all of them.
        let uplink_lease = config.zone.is_some().then(|| {
            let (lease, keeper) = crate::cluster::lease::keep(
                cluster.clone(),
                crate::cluster::lease::UPLINK,
                config.cluster.instance_timeout,
            );
            tasks.add("uplink lease", keeper);
            lease
        });
        let mut sources = start_sources(&config, &stores, &settings).await?;
        if let Some(watcher) = sources.watcher.take() {
            tasks.add("dataplane definitions watcher", watcher);
        }
        // A global's zones: EDS follows them from the start.
        let hub = match config.global.enabled {
            true => Some(crate::zone_sync::global::spawn_hub(
                crate::zones::hub::HubSettings {
                    zone_timeout: config.global.zone_timeout,
                    offline_ttl: config.global.offline_ttl,
                    auto_register: config.global.auto_register,
                },
                &config.global.zones,
                &config.global.disabled,
                registered_zones(cluster.as_ref()).await,
                Some(cluster.clone()),
                clock.clone(),
            )),
            false => None,
        };
        let zone_admin = hub.as_ref().map(|hub| {
            Arc::new(crate::zone_sync::admin::ZoneAdmin::new(
                hub.clone(),
                cluster.clone(),
                &config.global.zones,
                &config.global.disabled,
            ))
        });
        let state = start_state(
            &config,
            &stores,
            cluster.as_ref(),
            &sources,
            hub.as_ref().map(|h| h.subscribe()),
            clock.clone(),
            &mut tasks,
        )
        .await?;
        if let Some(hub) = &hub {
            // The global's watchers hear every zone's changes too.
            crate::zone_sync::global::feed_zones(hub, state.feed.sender());
        }
        let gate = Arc::new(Gate::new(&config.auth, &config.state_dir, clock.now())?);
        if config.auth.mode == AuthMode::Token {
            tasks.add("auth gate watcher", gate.clone().watch());
        }
        let scrape = start_metrics(&state, &sources, &gate, hub.as_ref().map(|h| h.subscribe()))?;
        tasks.add(
            "metrics upkeep",
            crate::metrics::upkeep(scrape.handle.clone()),
        );
        let store_status = stores.status(&state.store);
        let mut joined = crate::cluster::join(
            cluster,
            crate::cluster::Members {
                registry: state.registry.clone(),
                feed: state.feed.sender(),
                gate: (config.auth.mode == AuthMode::Token).then(|| gate.clone()),
                publisher: match (&stores, config.auth.mode) {
                    (Stores::Postgres(_), AuthMode::Token) => Some(
                        crate::auth::keys::publisher_id(&config.state_dir)
                            .map_err(crate::auth::GateError::from)?,
                    ),
                    _ => None,
                },
                status: store_status.clone(),
                instance_timeout: config.cluster.instance_timeout,
            },
        );
        for (name, task) in std::mem::take(&mut joined.tasks) {
            tasks.add(name, task);
        }
        let listeners = Listeners::bind(&config).await?;
        let (drain, drain_rx) = watch::channel(false);
        let (drain_api, drain_api_rx) = watch::channel(false);
        let hds = serve_hds(
            &config,
            &state,
            &gate,
            clock.clone(),
            listeners.hds,
            drain_rx.clone(),
            &mut tasks,
        )?;
        let zones = start_zones(
            &config,
            &state,
            &gate,
            ZoneParts {
                instance,
                lease: uplink_lease,
                hub,
                listener: listeners.zones,
            },
            clock.clone(),
            drain_rx.clone(),
            &mut tasks,
        )?;
        let (phase, phase_rx) = watch::channel(api::Phase::Starting);
        let zones_view = || zones.hub.as_ref().map(|h| h.subscribe());
        let (history, recording) = crate::history::start(
            state.registry.clone(),
            state.feed.clone(),
            zones_view(),
            clock.clone(),
            crate::history::Limits::default(),
        );
        tasks.add("history", recording);
        let (counts, counting) = crate::consumers::counts::start(
            state.registry.clone(),
            state.feed.clone(),
            zones_view(),
        );
        tasks.add("counts", counting);
        // Spawns nothing: every task it reads is started above.
        let api_state = ApiState {
            fleet: api::Fleet {
                registry: state.registry.clone(),
                sources: sources.rx.clone(),
            },
            health: api::Health {
                phase: phase_rx,
                notes: Arc::new(setup_notes(&config)),
                store_status,
                uplink: zones.uplink.clone(),
            },
            zones: api::Zones {
                hub: zones.hub.clone(),
                uplink: zones.uplink.clone(),
                admin: zone_admin,
            },
            tokens: api::ApiTokens(Arc::new(config.api.tokens.clone())),
            watches: crate::consumers::watch::Watches::new((&config.api.limits).into()),
            bootstraps: api::Bootstraps {
                gate: (config.auth.mode == AuthMode::Token).then(|| gate.clone()),
                hds_port: listeners.hds_addr.port(),
            },
            metrics: api::Metrics(Some(scrape)),
            // Watches are streams: they end with the others.
            feed: state.feed.clone().until(drain_rx.clone()),
            definitions: sources.definitions,
            history,
            counts,
        };
        let api = serve_api(
            &config,
            api_state,
            ApiListener {
                listener: listeners.api,
                budget: state.budget.clone(),
            },
            drain_api_rx,
            &mut tasks,
        )
        .await?;
        Ok(Server {
            tasks,
            hds,
            api,
            zones: zones.serving,
            hds_addr: listeners.hds_addr,
            api_addr: listeners.api_addr,
            zones_addr: zones.addr,
            store: state.store,
            joined,
            phase,
            drain,
            drain_api,
            shutdown_timeout: config.shutdown_timeout,
        })
    }

    /// Spawns every long-lived task into the supervised set and serves
    /// until `shutdown` completes, a listener fails, or a supervised task
    /// ends ([`ServeError::Stopped`]: `/readyz` reads 503 naming it while
    /// the streams drain). Then drains: the streams first, the readiness
    /// store flushed, the API last.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            tasks,
            hds,
            api,
            zones,
            hds_addr,
            api_addr,
            zones_addr,
            store,
            joined,
            phase,
            drain,
            drain_api,
            shutdown_timeout,
        } = self;
        let mut supervisor = Supervisor::new();
        for (name, task) in tasks.0 {
            supervisor.spawn(name, task);
        }
        let mut hds = tokio::spawn(hds);
        let mut api = tokio::spawn(api);
        let mut zone_listener = tokio::spawn(async move {
            match zones {
                Some(serving) => serving.await,
                None => std::future::pending().await,
            }
        });
        phase.send_replace(api::Phase::Serving);
        tracing::debug!(
            tasks = ?supervisor.names().collect::<Vec<_>>(),
            "supervising"
        );
        match zones_addr {
            Some(z) => {
                tracing::info!(hds = %hds_addr, api = %api_addr, zones = %z, "hdsd listening")
            }
            None => tracing::info!(hds = %hds_addr, api = %api_addr, "hdsd listening"),
        }
        let failure = tokio::select! {
            () = shutdown => None,
            stopped = supervisor.stopped() => Some(ServeError::Stopped(stopped)),
            r = &mut hds => Some(match r {
                Ok(Err(e)) => ServeError::Hds(e),
                _ => ServeError::Stopped(Stopped::returned("HDS listener")),
            }),
            r = &mut api => Some(match r {
                Ok(Err(e)) => ServeError::Api(e),
                _ => ServeError::Stopped(Stopped::returned("API listener")),
            }),
            r = &mut zone_listener => Some(match r {
                Ok(Err(e)) => ServeError::Zones(e),
                _ => ServeError::Stopped(Stopped::returned("zone listener")),
            }),
        };
        let failed_at = tokio::time::Instant::now();
        if let Some(e) = &failure {
            phase.send_replace(api::Phase::Stopping(e.to_string()));
            tracing::error!(
                "{e}; hdsd stops: /readyz reads 503, the streams are drained, and it exits with code 2 for its service manager to start it again"
            );
        }
        tracing::info!("shutting down: ending streams (GOAWAY) so Envoys reconnect elsewhere");
        let _ = drain.send(true);
        let failed = failure.is_some();
        let graceful = tokio::time::timeout(shutdown_timeout, async {
            if !hds.is_finished() {
                let _ = hds.await;
            }
            if !zone_listener.is_finished() {
                let _ = tokio::time::timeout(Duration::from_secs(1), zone_listener).await;
            }
            // When the writer is the task that failed, nothing writes what
            // it had not written yet: the next start restores what it did.
            let flushed = store.flush().await;
            if failed {
                tokio::time::sleep_until(failed_at + STOPPED_LINGER.min(shutdown_timeout / 2))
                    .await;
            }
            let _ = drain_api.send(true);
            if !api.is_finished() {
                let _ = api.await;
            }
            supervisor.shutdown().await;
            joined.leave().await;
            flushed
        })
        .await;
        match graceful {
            Ok(true) => tracing::info!("stopped; readiness state flushed"),
            Ok(false) => tracing::warn!(
                "stopped; the readiness store writer had ended, so the changes it had not written are lost: the next start restores the state it wrote last"
            ),
            Err(_) => tracing::warn!(
                "shutdown took longer than shutdown_timeout ({}); exiting anyway",
                humantime::format_duration(shutdown_timeout)
            ),
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The zones registered through a global's API, as the cluster keeps them
/// (the redb file alone, PostgreSQL with several instances). A store that
/// does not answer leaves them to the zone ledger (PostgreSQL), which
/// reads them again every second.
async fn registered_zones(cluster: &dyn Cluster) -> Vec<crate::zones::hub::ZoneRecord> {
    match cluster.zone_registrations(0).await {
        Ok(rows) => rows
            .into_iter()
            .map(crate::zone_sync::shared::record_of)
            .collect(),
        Err(e) => {
            tracing::warn!(
                "cannot read the zones registered through the API: {e}; they are refused until they are read"
            );
            Vec::new()
        }
    }
}

/// Zones: the global's hub and zone listener, the zone's uplink, each only
/// where the configuration asks for it.
struct Zones {
    hub: Option<crate::zone_sync::global::HubHandle>,
    uplink: Option<crate::zone_sync::uplink::UplinkHandle>,
    serving: Option<Serving<tonic::transport::Error>>,
    addr: Option<std::net::SocketAddr>,
}

/// What the zones' wiring starts from.
struct ZoneParts {
    /// This instance's name in the cluster (the zone's uplink says it).
    instance: String,
    /// The uplink lease, on a zone.
    lease: Option<crate::cluster::lease::LeaseHandle>,
    /// The hub, on a global.
    hub: Option<crate::zone_sync::global::HubHandle>,
    /// `global.listen`, on a global.
    listener: Option<TcpListener>,
}

fn start_zones(
    config: &Config,
    state: &State,
    gate: &Arc<Gate>,
    parts: ZoneParts,
    clock: Arc<dyn Clock>,
    drain: watch::Receiver<bool>,
    tasks: &mut Tasks,
) -> Result<Zones, ServeError> {
    let ZoneParts {
        instance,
        lease,
        hub,
        listener,
    } = parts;
    use crate::zone_sync::{global, uplink};
    let uplink = config.zone.as_ref().zip(lease).map(|(zone, lease)| {
        uplink::spawn(
            uplink::UplinkOptions {
                settings: crate::zones::uplink::UplinkSettings::new(&zone.name, instance),
                globals: zone.global.clone(),
                token_file: zone.token_file.clone(),
                ca: zone.ca.clone(),
                identity: zone.cert.clone().zip(zone.key.clone()),
                backoff: crate::zones::backoff::Backoff::default(),
            },
            lease,
            state.registry.clone(),
            state.feed.clone().until(drain.clone()),
            clock.clone(),
            drain.clone(),
        )
    });
    let Some(hub) = hub else {
        return Ok(Zones {
            hub: None,
            uplink,
            serving: None,
            addr: None,
        });
    };
    let g = &config.global;
    let mut session =
        crate::zones::session::SessionSettings::new(g.heartbeat_interval, g.zone_timeout);
    session.auto_register = g.auto_register;
    let sync =
        global::ZoneSyncServer::new(hub.clone(), gate.clone(), session, clock, drain.clone())
            .with_certificate_meshes(g.certificate_meshes.clone());
    let tls = load_tls(
        "global.tls",
        g.tls.as_ref(),
        crate::tls::Listener::Zones,
        tasks,
    )?;
    if tls.is_none() && !g.listen.ip().is_loopback() {
        tracing::warn!(listen = %g.listen, "zone tokens travel in plaintext; set global.tls");
    }
    let Some(listener) = listener else {
        return Err(ServeError::Stopped(Stopped::returned(
            "zone listener (not bound)",
        )));
    };
    let addr = listener.local_addr().map_err(ServeError::Api)?;
    let admission = Admission::new("zones", (&config.hds.limits).into());
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(config.hds.keepalive.interval))
        .http2_keepalive_timeout(Some(config.hds.keepalive.timeout))
        .layer(crate::net::TrackLayer(admission.clone()))
        .layer(crate::net::budget::BudgetLayer(state.budget.clone()))
        .add_service(sync.into_server());
    let serving = serve_grpc(server, listener, admission, tls, drain)?;
    Ok(Zones {
        hub: Some(hub),
        uplink,
        serving: Some(serving),
        addr: Some(addr),
    })
}

/// The stores: this instance's redb file alone, or the PostgreSQL
/// database (`store.kind = "postgres"`: definitions, shared readiness, the
/// cluster), where no redb file is opened.
enum Stores {
    Embedded {
        redb: Arc<RedbStore>,
        path: std::path::PathBuf,
    },
    Postgres(Arc<PgStore>),
}

impl Stores {
    /// Opens the configured store; PostgreSQL's tasks join `tasks`.
    async fn open(config: &Config, tasks: &mut Tasks) -> Result<Stores, ServeError> {
        match config.store.kind {
            StoreKind::Redb => {
                let path = config.state_dir.join("readiness.redb");
                let redb = Arc::new(RedbStore::open(&path)?);
                Ok(Stores::Embedded { redb, path })
            }
            StoreKind::Postgres => {
                let (pg, pg_tasks) = PgStore::open(&config.store.postgres)
                    .await
                    .map_err(ServeError::Definitions)?;
                tasks.add("PostgreSQL listener", pg_tasks.listen);
                tasks.add("PostgreSQL claims announcer", pg_tasks.claims);
                Ok(Stores::Postgres(Arc::new(pg)))
            }
        }
    }

    /// What this instance shares with others: nothing alone, the database
    /// with PostgreSQL.
    fn cluster(&self, config: &Config) -> Arc<dyn Cluster> {
        match self {
            Stores::Postgres(pg) => {
                Arc::new(PgCluster::new(pg.clone(), config.cluster.resume_slack))
            }
            // Alone, zones registered through the API live in the redb file.
            Stores::Embedded { redb, .. } => Arc::new(Solo::persisting(
                format!("{}/{}", hostname(), std::process::id()),
                redb.clone(),
            )),
        }
    }

    fn definitions(&self) -> Arc<dyn DefinitionStore> {
        match self {
            Stores::Postgres(pg) => pg.clone(),
            Stores::Embedded { redb, .. } => redb.clone(),
        }
    }

    fn readiness(&self) -> Arc<dyn ReadinessStore> {
        match self {
            Stores::Postgres(pg) => pg.clone(),
            Stores::Embedded { redb, .. } => redb.clone(),
        }
    }

    /// Whether the shared store answers (after the metrics recorder is
    /// installed: it sets `hdsd_store_up`); `None` without one.
    fn status(&self, handle: &StoreHandle) -> Option<StoreStatus> {
        match self {
            Stores::Postgres(pg) => Some(StoreStatus::new(
                DefinitionStore::describe(pg.as_ref()),
                handle,
            )),
            Stores::Embedded { .. } => None,
        }
    }
}

/// This host's name, for logs and the single instance's name.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hdsd".to_string())
}

/// The dataplane definitions, followed as one watch of `Loaded` snapshots.
struct Sources {
    rx: watch::Receiver<Arc<Loaded>>,
    /// Follows the files or the store; ends only on failure. Taken by the
    /// build, for the supervisor.
    watcher: Option<Task>,
    /// What the API writes to (the store) or refuses (files).
    definitions: api::definitions::Definitions,
}

/// Loads the definitions (the files of `dataplanes.dir`, or the store) and
/// starts following them.
async fn start_sources(
    config: &Config,
    stores: &Stores,
    settings: &SpecifierSettings,
) -> Result<Sources, ServeError> {
    let dir = config.dataplanes.dir.clone();
    let limits = config.dataplanes.limits();
    let (sources_tx, rx) = watch::channel(Arc::new(Loaded::default()));
    let (watcher, definitions): (Task, _) = match config.dataplanes.source {
        DataplanesSource::Dir => {
            let initial = source::load(&dir, &Loaded::default(), settings, &limits)?;
            source::log_problems(&initial, &Loaded::default());
            tracing::info!(
                dir = %dir.display(),
                dataplanes = initial.dataplanes.len(),
                broken_files = initial.error_count(),
                "dataplanes loaded"
            );
            sources_tx.send_replace(Arc::new(initial));
            (
                Box::pin(source::watch(
                    dir.clone(),
                    settings.clone(),
                    limits,
                    sources_tx,
                )?),
                api::definitions::Definitions::Dir(dir),
            )
        }
        DataplanesSource::Api => {
            let store = stores.definitions();
            // Subscribed before the first read: no change falls in between.
            let changes = store.changes();
            let initial = definitions::load(store.as_ref(), &Loaded::default(), settings, &limits)
                .await
                .map_err(ServeError::Definitions)?;
            source::log_problems(&initial, &Loaded::default());
            tracing::info!(
                store = %store.describe(),
                dataplanes = initial.dataplanes.len(),
                broken = initial.error_count(),
                "dataplanes loaded from the store"
            );
            sources_tx.send_replace(Arc::new(initial));
            (
                Box::pin(definitions::watch(
                    store.clone(),
                    settings.clone(),
                    limits,
                    sources_tx,
                    changes,
                )),
                api::definitions::Definitions::Store {
                    store,
                    checks: Arc::new(api::definitions::Checks {
                        settings: settings.clone(),
                        limits,
                    }),
                },
            )
        }
    };
    Ok(Sources {
        rx,
        watcher: Some(watcher),
        definitions,
    })
}

/// The state every reader follows: the readiness store's writer, the
/// change feed, the registry, and the EDS assignments built from them.
struct State {
    /// The memory budget every listener's clients share (`limits.client_bytes`).
    budget: Arc<crate::net::budget::MemoryBudget>,
    store: StoreHandle,
    feed: crate::feed::FeedHandle,
    registry: Registry,
    assignments: crate::consumers::eds::index::AssignmentsRx,
}

async fn start_state(
    config: &Config,
    stores: &Stores,
    cluster: &dyn Cluster,
    sources: &Sources,
    zones: Option<crate::consumers::eds::index::ZonesRx>,
    clock: Arc<dyn Clock>,
    tasks: &mut Tasks,
) -> Result<State, ServeError> {
    let readiness = stores.readiness();
    let loading = readiness.clone();
    let restored = match tokio::task::spawn_blocking(move || loading.load()).await {
        Ok(Ok(restored)) => restored,
        Ok(Err(e)) if matches!(stores, Stores::Postgres(_)) => {
            return Err(ServeError::Readiness(e))
        }
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => {
            return Err(ServeError::Stopped(Stopped {
                task: "readiness state loader",
                ended: crate::task::Ended::Panicked(e.to_string()),
            }))
        }
    };
    match stores {
        Stores::Postgres(pg) => {
            tracing::info!(store = %DefinitionStore::describe(pg.as_ref()), dataplanes = restored.len(), "readiness state restored")
        }
        Stores::Embedded { path, .. } => {
            tracing::info!(file = %path.display(), dataplanes = restored.len(), "readiness state restored")
        }
    }
    let (store, writer) = StoreHandle::start(readiness);
    tasks.add("readiness store writer", writer);
    let (feed, feeding) = crate::feed::start(
        cluster.feed(crate::feed::HistoryLimits::default(), clock.now()),
        crate::feed::WATCHER_BUFFER,
    );
    tasks.add("feed", feeding);
    let (registry, cataloguing) = Registry::start(
        sources.rx.clone(),
        RegistryOptions {
            clock: clock.clone(),
            stale_after: config.hds.stale_after(),
            store: Some(store.clone()),
            restored,
            feed: Some(feed.sender()),
            claims: cluster.shared().then(|| cluster.claims()),
        },
    );
    tasks.add("registry", cataloguing);
    let (assignments, indexing) = crate::consumers::eds::index::start(
        registry.clone(),
        feed.clone(),
        sources.rx.clone(),
        zones,
        crate::consumers::eds::EdsOptions::from(&config.eds),
        crate::consumers::eds::Policy::from(&config.eds),
    );
    tasks.add("EDS index", indexing);
    Ok(State {
        budget: crate::net::budget::MemoryBudget::new(config.limits.client_bytes),
        store,
        feed,
        registry,
        assignments,
    })
}

/// Installs the recorder and the scrape, and zeroes the series owned
/// elsewhere.
fn start_metrics(
    state: &State,
    sources: &Sources,
    gate: &Gate,
    zones: Option<watch::Receiver<Arc<crate::zones::hub::ZonesView>>>,
) -> Result<crate::scrape::Scrape, ServeError> {
    let scrape = crate::scrape::Scrape {
        handle: crate::metrics::install()?,
        registry: state.registry.clone(),
        sources: sources.rx.clone(),
        process: Arc::new(metrics_process::Collector::default()),
        zones,
    };
    scrape.process.describe();
    zero_owned_labels();
    metrics::gauge!(crate::metrics::AUTH_SIGNING_KEYS).set(gate.signing_keys() as f64);
    Ok(scrape)
}

/// Lines `/readyz` adds about the setup (and logs once).
fn setup_notes(config: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    if config.auth.mode == AuthMode::None {
        let note = "WARNING: auth.mode is \"none\": any client that reaches the HDS port can claim any dataplane and forge its readiness";
        tracing::warn!("{note}");
        notes.push(note.to_string());
    }
    notes
}

/// The two listening sockets: passed in by a service manager (systemd
/// socket activation, `LISTEN_FDS`: the first is the HDS listener, the
/// second the API's), or bound to the configured addresses.
struct Listeners {
    hds: TcpListener,
    api: TcpListener,
    hds_addr: std::net::SocketAddr,
    api_addr: std::net::SocketAddr,
    /// `global.listen`, on a global.
    zones: Option<TcpListener>,
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Listeners, ServeError> {
        let mut passed = listenfd::ListenFd::from_env();
        let hds = match passed_listener(&mut passed, 0, "hds.listen")? {
            Some(l) => l,
            None => bind_with_backlog(config.hds.listen, HDS_BACKLOG).map_err(|source| {
                ServeError::Bind {
                    what: "hds.listen",
                    addr: config.hds.listen,
                    source,
                }
            })?,
        };
        let api = match passed_listener(&mut passed, 1, "api.listen")? {
            Some(l) => l,
            None => TcpListener::bind(config.api.listen)
                .await
                .map_err(|source| ServeError::Bind {
                    what: "api.listen",
                    addr: config.api.listen,
                    source,
                })?,
        };
        // The zone listener: a third passed socket, or global.listen.
        let zones = match config.global.enabled {
            false => None,
            true => Some(match passed_listener(&mut passed, 2, "global.listen")? {
                Some(l) => l,
                None => TcpListener::bind(config.global.listen)
                    .await
                    .map_err(|source| ServeError::Bind {
                        what: "global.listen",
                        addr: config.global.listen,
                        source,
                    })?,
            }),
        };
        Ok(Listeners {
            hds_addr: hds.local_addr().map_err(ServeError::Api)?,
            api_addr: api.local_addr().map_err(ServeError::Api)?,
            hds,
            api,
            zones,
        })
    }
}

/// The TLS configuration of `section`, when set; its reloader joins `tasks`.
fn load_tls(
    section: &'static str,
    files: Option<&crate::config::TlsConfig>,
    listener: crate::tls::Listener,
    tasks: &mut Tasks,
) -> Result<Option<crate::tls::ServerTls>, ServeError> {
    let Some(files) = files else {
        return Ok(None);
    };
    let (tls, reloading) = crate::tls::ServerTls::load_and_watch(section, files, listener)
        .map_err(|e| ServeError::Config(vec![e.to_string()]))?;
    if let Some(reloading) = reloading {
        tasks.add(section, reloading);
    }
    Ok(Some(tls))
}

type Serving<E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send>>;

/// HDS for the dataplanes' Envoys and EDS for Envoys that route to them, on
/// `hds.listen`, until `drain`.
fn serve_hds(
    config: &Config,
    state: &State,
    gate: &Arc<Gate>,
    clock: Arc<dyn Clock>,
    listener: TcpListener,
    drain: watch::Receiver<bool>,
    tasks: &mut Tasks,
) -> Result<Serving<tonic::transport::Error>, ServeError> {
    let tls = load_tls(
        "hds.tls",
        config.hds.tls.as_ref(),
        crate::tls::Listener::Hds,
        tasks,
    )?;
    if config.auth.mode == AuthMode::Token && tls.is_none() && !config.hds.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %config.hds.listen, "dataplane tokens travel in plaintext; set hds.tls");
    }
    let service = HdsService::new(
        state.registry.clone(),
        HdsSettings::from(config),
        gate.clone(),
        clock,
        drain.clone(),
    );
    let eds = crate::consumers::eds::server::EdsService::new(
        state.assignments.clone(),
        match config.auth.mode {
            AuthMode::Token => crate::consumers::eds::server::EdsAuth::Tokens(Arc::new(
                config
                    .api
                    .tokens
                    .iter()
                    .chain(&config.eds.tokens)
                    .cloned()
                    .collect(),
            )),
            AuthMode::None => crate::consumers::eds::server::EdsAuth::Open,
        },
        drain.clone(),
    )
    .refreshing(config.eds.endpoint_stale_after)
    .max_resource_names(config.eds.max_resource_names);
    let limits = &config.hds.limits;
    let admission = Admission::new("hds", limits.into());
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(config.hds.keepalive.interval))
        .http2_keepalive_timeout(Some(config.hds.keepalive.timeout))
        .initial_stream_window_size(HDS_STREAM_WINDOW)
        .initial_connection_window_size(HDS_CONNECTION_WINDOW)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_pending_accept_reset_streams(Some(crate::net::H2_MAX_PENDING_RESETS))
        .http2_max_local_error_reset_streams(Some(crate::net::H2_MAX_LOCAL_RESETS))
        .http2_max_header_list_size(HDS_MAX_HEADER_LIST)
        .layer(crate::net::TrackLayer(admission.clone()))
        .layer(crate::net::budget::BudgetLayer(state.budget.clone()))
        .add_service(service.into_server())
        .add_service(crate::consumers::eds::transport::EdsServer::new(
            eds,
            limits.max_message_bytes,
        ));
    serve_grpc(server, listener, admission, tls, drain)
}

/// A tonic router on `listener` (TLS when `tls`), admitted by `admission`,
/// until `drain`.
fn serve_grpc(
    server: tonic::transport::server::Router<
        tower::layer::util::Stack<
            crate::net::budget::BudgetLayer,
            tower::layer::util::Stack<crate::net::TrackLayer, tower::layer::util::Identity>,
        >,
    >,
    listener: TcpListener,
    admission: Arc<Admission>,
    tls: Option<crate::tls::ServerTls>,
    mut drain: watch::Receiver<bool>,
) -> Result<Serving<tonic::transport::Error>, ServeError> {
    let signal = async move {
        let _ = drain.wait_for(|d| *d).await;
    };
    Ok(match tls {
        Some(tls) => {
            let incoming =
                Incoming::new(listener, admission, TlsHandshake(tls)).map_err(ServeError::Api)?;
            Box::pin(server.serve_with_incoming_shutdown(incoming, signal))
        }
        None => {
            let incoming = Incoming::new(listener, admission, Plain).map_err(ServeError::Api)?;
            Box::pin(server.serve_with_incoming_shutdown(incoming, signal))
        }
    })
}

/// REST and gRPC (hdsd.v1) on `api.listen`, routed by content type, until
/// `drain`.
/// The API's listening socket and the memory budget its clients share.
struct ApiListener {
    listener: TcpListener,
    budget: Arc<crate::net::budget::MemoryBudget>,
}

async fn serve_api(
    config: &Config,
    state: ApiState,
    bound: ApiListener,
    drain: watch::Receiver<bool>,
    tasks: &mut Tasks,
) -> Result<Serving<std::io::Error>, ServeError> {
    let ApiListener { listener, budget } = bound;
    let tls = load_tls(
        "api.tls",
        config.api.tls.as_ref(),
        crate::tls::Listener::Api,
        tasks,
    )?;
    if config.api.tokens.is_empty() {
        // Beyond loopback, `validate` refused this already.
        tracing::info!(
            listen = %config.api.listen,
            "the API is open (api.tokens is empty): every process of this machine can read the fleet and open watches; set api.tokens when other users share it"
        );
    }
    let grpc = crate::consumers::grpc::router(
        crate::consumers::grpc::ReadinessApi {
            registry: state.fleet.registry.clone(),
            feed: state.feed.clone(),
            zones: state.zones.hub.as_ref().map(|h| h.subscribe()),
            watches: state.watches.clone(),
            counts: state.counts.clone(),
        },
        state.tokens.0.clone(),
    )
    .await;
    let router = crate::consumers::grpc::by_content_type(api::router(state), grpc);
    let mut drain = drain;
    let signal = async move {
        let _ = drain.wait_for(|d| *d).await;
    };
    let limits = &config.api.limits;
    let admission = Admission::new("api", limits.into());
    let options = crate::net::HttpOptions {
        header_read_timeout: limits.header_read_timeout,
        body_read_timeout: limits.body_read_timeout,
        max_streams_per_connection: limits.max_streams_per_connection,
        keepalive_interval: config.hds.keepalive.interval,
        keepalive_timeout: config.hds.keepalive.timeout,
        budget,
    };
    Ok(match tls {
        Some(tls) => {
            let incoming =
                Incoming::new(listener, admission, TlsHandshake(tls)).map_err(ServeError::Api)?;
            Box::pin(crate::net::serve_http(incoming, router, options, signal))
        }
        None => {
            let incoming = Incoming::new(listener, admission, Plain).map_err(ServeError::Api)?;
            Box::pin(crate::net::serve_http(incoming, router, options, signal))
        }
    })
}
