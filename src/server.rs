//! `hdsd serve`: wires the source, the registry, the HDS service and the API
//! together and runs them until shutdown.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
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
use crate::tls::TlsHandshake;

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
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
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
    m::zero_counters(
        m::WATCH_RESYNCS,
        "reason",
        &crate::feed::ResyncReason::ALL.map(|r| r.as_str()),
    );
}

/// The server-wide specifier settings of a configuration.
pub fn specifier_settings(config: &Config) -> SpecifierSettings {
    SpecifierSettings {
        defaults: config.hds.check.probe_settings(),
        default_check: config.hds.check.check(),
        report_interval: config.hds.report_interval,
        probe_all_inbounds: config.hds.probe_all_inbounds,
        check_envoy_ready: config.hds.check_envoy_ready,
        tcp_fallback: config.hds.check.fallback == crate::config::CheckFallback::Tcp,
    }
}

/// Runs hdsd until `shutdown` completes: a handful of named steps, each
/// owning one part of the wiring.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let mut problems = config.validate();
    problems.extend(config.file_problems());
    if !problems.is_empty() {
        return Err(ServeError::Config(problems));
    }
    raise_open_file_limit(&config);
    let settings = specifier_settings(&config);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let stores = Stores::open(&config).await?;
    let cluster = stores.cluster(&config);
    let instance = cluster.instance().to_string();
    // A zone's instances take turns at the uplink: one lease for all of them.
    let uplink_lease = config.zone.is_some().then(|| {
        crate::cluster::lease::keep(
            cluster.clone(),
            crate::cluster::lease::UPLINK,
            config.cluster.instance_timeout,
        )
    });
    let sources = start_sources(&config, &stores, &settings).await?;
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
    )
    .await?;
    let budget = state.budget.clone();
    if let Some(hub) = &hub {
        // The global's watchers hear every zone's changes too.
        crate::zone_sync::global::feed_zones(hub, state.feed.sender());
    }
    let gate = Arc::new(Gate::new(&config.auth, &config.state_dir, clock.now())?);
    tokio::spawn(gate.clone().watch());
    let scrape = start_metrics(&state, &sources, &gate, hub.as_ref().map(|h| h.subscribe()))?;
    let store_status = stores.status(&state.store);
    let joined = crate::cluster::join(
        cluster,
        crate::cluster::Members {
            registry: state.registry.clone(),
            feed: state.feed.sender(),
            gate: (config.auth.mode == AuthMode::Token).then(|| gate.clone()),
            publisher: match (&stores.pg, config.auth.mode) {
                (Some(_), AuthMode::Token) => Some(
                    crate::auth::keys::publisher_id(&config.state_dir)
                        .map_err(crate::auth::GateError::from)?,
                ),
                _ => None,
            },
            status: store_status.clone(),
            instance_timeout: config.cluster.instance_timeout,
        },
    );
    let listeners = Listeners::bind(&config).await?;
    let (drain_tx, drain_rx) = watch::channel(false);
    let clock_for_zones = clock.clone();
    let hds = serve_hds(
        &config,
        &state,
        &gate,
        clock,
        listeners.hds,
        drain_rx.clone(),
    )?;
    let zones = start_zones(
        &config,
        &state,
        &gate,
        (instance, uplink_lease),
        (hub, listeners.zones),
        clock_for_zones.clone(),
        drain_rx.clone(),
    )?;
    let ready = Arc::new(AtomicBool::new(false));
    let api_state = ApiState {
        fleet: api::Fleet {
            registry: state.registry.clone(),
            sources: sources.rx.clone(),
        },
        health: api::Health {
            ready: ready.clone(),
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
        browsers: api::Browsers::new(&config.api.tokens, &config.api.allowed_hosts),
        watches: crate::consumers::watch::Watches::new((&config.api.limits).into()),
        bootstraps: api::Bootstraps {
            gate: (config.auth.mode == AuthMode::Token).then(|| gate.clone()),
            hds_port: listeners.hds_addr.port(),
        },
        metrics: api::Metrics(Some(scrape)),
        feed: state.feed.clone().until(drain_rx.clone()),
        definitions: sources.definitions,
        history: crate::history::spawn(
            state.registry.clone(),
            state.feed.clone(),
            zones.hub.as_ref().map(|h| h.subscribe()),
            clock_for_zones.clone(),
            crate::history::Limits::default(),
        ),
        counts: crate::consumers::counts::spawn(
            state.registry.clone(),
            state.feed.clone(),
            zones.hub.as_ref().map(|h| h.subscribe()),
        ),
    };
    let api = serve_api(
        &config,
        api_state,
        (listeners.api, budget),
        drain_rx.clone(),
    )
    .await?;

    ready.store(true, Ordering::Release);
    match zones.addr {
        Some(z) => {
            tracing::info!(hds = %listeners.hds_addr, api = %listeners.api_addr, zones = %z, "hdsd listening")
        }
        None => {
            tracing::info!(hds = %listeners.hds_addr, api = %listeners.api_addr, "hdsd listening")
        }
    }

    let mut hds = tokio::spawn(hds);
    let mut api = tokio::spawn(api);
    let zones_serving = zones.serving;
    let mut zone_listener = tokio::spawn(async move {
        match zones_serving {
            Some(serving) => serving.await,
            None => std::future::pending().await,
        }
    });
    let failure = tokio::select! {
        () = shutdown => None,
        _ = sources.watcher => Some(ServeError::Stopped("the dataplane definitions watcher")),
        r = &mut hds => Some(match r {
            Ok(Err(e)) => ServeError::Hds(e),
            _ => ServeError::Stopped("the HDS listener"),
        }),
        r = &mut api => Some(match r {
            Ok(Err(e)) => ServeError::Api(e),
            _ => ServeError::Stopped("the API listener"),
        }),
        r = &mut zone_listener => Some(match r {
            Ok(Err(e)) => ServeError::Zones(e),
            _ => ServeError::Stopped("the zone listener"),
        }),
    };
    if let Some(e) = &failure {
        tracing::error!("{e}; shutting down");
    }
    tracing::info!("shutting down: ending streams (GOAWAY) so Envoys reconnect elsewhere");
    let _ = drain_tx.send(true);
    let shutdown_timeout = config.shutdown_timeout;
    let graceful = tokio::time::timeout(shutdown_timeout, async {
        if !hds.is_finished() {
            let _ = hds.await;
        }
        if !api.is_finished() {
            let _ = api.await;
        }
        if !zone_listener.is_finished() {
            let _ = tokio::time::timeout(Duration::from_secs(1), zone_listener).await;
        }
        state.store.flush().await;
        joined.leave().await;
    })
    .await;
    match graceful {
        Ok(()) => tracing::info!("stopped; readiness state flushed"),
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

fn start_zones(
    config: &Config,
    state: &State,
    gate: &Arc<Gate>,
    (instance, lease): (String, Option<crate::cluster::lease::LeaseHandle>),
    (hub, listener): (
        Option<crate::zone_sync::global::HubHandle>,
        Option<TcpListener>,
    ),
    clock: Arc<dyn Clock>,
    drain: watch::Receiver<bool>,
) -> Result<Zones, ServeError> {
    use crate::zone_sync::{global, uplink};
    for url in config.zone.iter().flat_map(|z| z.plaintext_globals()) {
        tracing::warn!(
            global = url,
            "zone.global is plain http://: the zone token and the global's answers travel unauthenticated (anyone on the path can read the token or answer as the global); use https:// with zone.ca"
        );
    }
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
    let tls = (g.tls.as_ref())
        .map(|t| {
            crate::tls::ServerTls::load_and_watch("global.tls", t, crate::tls::Listener::Zones)
        })
        .transpose()
        .map_err(tls_error)?;
    if tls.is_none() && !g.listen.ip().is_loopback() {
        tracing::warn!(listen = %g.listen, "zone tokens travel in plaintext; set global.tls");
    }
    let Some(listener) = listener else {
        return Err(ServeError::Stopped("the zone listener (not bound)"));
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

/// The stores: this instance's redb file, and the PostgreSQL database when
/// `store.kind = "postgres"` (definitions, shared readiness, the cluster).
struct Stores {
    redb: Arc<RedbStore>,
    redb_path: std::path::PathBuf,
    pg: Option<Arc<PgStore>>,
}

impl Stores {
    async fn open(config: &Config) -> Result<Stores, ServeError> {
        let redb_path = config.state_dir.join("readiness.redb");
        let redb = Arc::new(RedbStore::open(&redb_path)?);
        let pg = match config.store.kind {
            StoreKind::Postgres => Some(Arc::new(
                PgStore::connect(&config.store.postgres)
                    .await
                    .map_err(ServeError::Definitions)?,
            )),
            StoreKind::Redb => None,
        };
        Ok(Stores {
            redb,
            redb_path,
            pg,
        })
    }

    /// What this instance shares with others: nothing alone, the database
    /// with PostgreSQL.
    fn cluster(&self, config: &Config) -> Arc<dyn Cluster> {
        match &self.pg {
            Some(pg) => Arc::new(PgCluster::new(pg.clone(), config.cluster.resume_slack)),
            // Alone, zones registered through the API live in the redb file.
            None => Arc::new(Solo::persisting(
                format!("{}/{}", hostname(), std::process::id()),
                self.redb.clone(),
            )),
        }
    }

    fn definitions(&self) -> Arc<dyn DefinitionStore> {
        match &self.pg {
            Some(pg) => pg.clone(),
            None => self.redb.clone(),
        }
    }

    fn readiness(&self) -> Arc<dyn ReadinessStore> {
        match &self.pg {
            Some(pg) => pg.clone(),
            None => self.redb.clone(),
        }
    }

    /// Whether the shared store answers (after the metrics recorder is
    /// installed: it sets `hdsd_store_up`); `None` without one.
    fn status(&self, handle: &StoreHandle) -> Option<StoreStatus> {
        self.pg
            .as_ref()
            .map(|pg| StoreStatus::new(DefinitionStore::describe(pg.as_ref()), handle))
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
    /// Follows the files or the store; ends only on failure.
    watcher: tokio::task::JoinHandle<()>,
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
    let (watcher, definitions): (Pin<Box<dyn Future<Output = ()> + Send>>, _) =
        match config.dataplanes.source {
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
                let initial =
                    definitions::load(store.as_ref(), &Loaded::default(), settings, &limits)
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
        watcher: tokio::spawn(watcher),
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
) -> Result<State, ServeError> {
    let readiness = stores.readiness();
    let loading = readiness.clone();
    let restored = match tokio::task::spawn_blocking(move || loading.load()).await {
        Ok(Ok(restored)) => restored,
        Ok(Err(e)) if stores.pg.is_some() => return Err(ServeError::Readiness(e)),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(ServeError::Stopped("loading the readiness state")),
    };
    match &stores.pg {
        Some(pg) => {
            tracing::info!(store = %DefinitionStore::describe(pg.as_ref()), dataplanes = restored.len(), "readiness state restored")
        }
        None => {
            tracing::info!(file = %stores.redb_path.display(), dataplanes = restored.len(), "readiness state restored")
        }
    }
    let store = StoreHandle::spawn(readiness);
    let feed = crate::feed::spawn_feed(
        cluster.feed(crate::feed::HistoryLimits::default(), clock.now()),
        crate::feed::WATCHER_BUFFER,
    );
    let registry = Registry::spawn(
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
    let assignments = crate::consumers::eds::index::spawn(
        registry.clone(),
        feed.clone(),
        sources.rx.clone(),
        zones,
        crate::consumers::eds::EdsOptions::from(&config.eds),
        crate::consumers::eds::Policy::from(&config.eds),
    );
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

fn tls_error(e: crate::tls::TlsError) -> ServeError {
    ServeError::Config(vec![e.to_string()])
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
) -> Result<Serving<tonic::transport::Error>, ServeError> {
    let tls = (config.hds.tls.as_ref())
        .map(|t| crate::tls::ServerTls::load_and_watch("hds.tls", t, crate::tls::Listener::Hds))
        .transpose()
        .map_err(tls_error)?;
    if config.auth.mode == AuthMode::Token && tls.is_none() && !config.hds.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %config.hds.listen, "dataplane tokens travel in plaintext; set hds.tls");
    }
    let service = HdsService::new(
        state.registry.clone(),
        HdsSettings {
            unknown_dataplane_grace: config.hds.unknown_dataplane_grace,
            report_interval: config.hds.report_interval,
            stale_after: config.hds.stale_after(),
            limits: config.hds.limits.clone(),
            definitions_from_api: config.dataplanes.source == DataplanesSource::Api,
        },
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
async fn serve_api(
    config: &Config,
    state: ApiState,
    (listener, budget): (TcpListener, Arc<crate::net::budget::MemoryBudget>),
    drain: watch::Receiver<bool>,
) -> Result<Serving<std::io::Error>, ServeError> {
    let tls = (config.api.tls.as_ref())
        .map(|t| crate::tls::ServerTls::load_and_watch("api.tls", t, crate::tls::Listener::Api))
        .transpose()
        .map_err(tls_error)?;
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
