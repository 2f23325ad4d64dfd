//! `hdsd serve`: wires the source, the registry, the HDS service and the API
//! together and runs them until shutdown.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, ApiState};
use crate::auth::Gate;
use crate::clock::{Clock, SystemClock};
use crate::config::{AuthMode, Config, DataplanesSource, StoreKind};
use crate::hds::{HdsService, HdsSettings};
use crate::net::{Admission, Incoming, Plain};
use crate::registry::{Registry, RegistryOptions};
use crate::source::{self, Loaded};
use crate::specifier::SpecifierSettings;
use crate::store::definitions::{self, DefinitionStore};
use crate::store::postgres::{PgStore, StreamNote};
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
            ServeError::Hds(_) | ServeError::Api(_) | ServeError::Stopped(_) => 2,
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

/// Concurrent HTTP/2 streams per API connection (gRPC watches, a browser's
/// requests).
const API_MAX_STREAMS: u32 = 64;
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

/// Runs hdsd until `shutdown` completes.
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
    let dir = config.dataplanes.dir.clone();
    let limits = config.dataplanes.limits();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store_path = config.state_dir.join("readiness.redb");
    let redb = Arc::new(RedbStore::open(&store_path)?);

    // A PostgreSQL store holds the definitions and the shared readiness.
    let pg = match config.store.kind {
        StoreKind::Postgres => Some(Arc::new(
            PgStore::connect(&config.store.postgres)
                .await
                .map_err(ServeError::Definitions)?,
        )),
        StoreKind::Redb => None,
    };

    // Definitions: the files of dataplanes.dir, or the store. Either way the
    // registry follows one watch of `Loaded` snapshots.
    let (sources_tx, sources_rx) = watch::channel(Arc::new(Loaded::default()));
    let (watcher, definitions): (Pin<Box<dyn Future<Output = ()> + Send>>, _) =
        match config.dataplanes.source {
            DataplanesSource::Dir => {
                let initial = source::load(&dir, &Loaded::default(), &settings, &limits)?;
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
                    api::definitions::Definitions::Dir(dir.clone()),
                )
            }
            DataplanesSource::Api => {
                let store: Arc<dyn DefinitionStore> = match &pg {
                    Some(pg) => pg.clone(),
                    None => redb.clone(),
                };
                // Subscribed before the first read: no change falls in between.
                let changes = store.changes();
                let initial =
                    definitions::load(store.as_ref(), &Loaded::default(), &settings, &limits)
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
    let watcher = tokio::spawn(watcher);

    // Readiness: this instance's redb file, or shared through PostgreSQL.
    let store: Arc<dyn ReadinessStore> = match &pg {
        Some(pg) => pg.clone(),
        None => redb,
    };
    let loading = store.clone();
    let restored = match tokio::task::spawn_blocking(move || loading.load()).await {
        Ok(Ok(restored)) => restored,
        Ok(Err(e)) if pg.is_some() => return Err(ServeError::Readiness(e)),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(ServeError::Stopped("loading the readiness state")),
    };
    match &pg {
        Some(pg) => {
            tracing::info!(store = %DefinitionStore::describe(pg.as_ref()), dataplanes = restored.len(), "readiness state restored")
        }
        None => {
            tracing::info!(file = %store_path.display(), dataplanes = restored.len(), "readiness state restored")
        }
    }
    let store = StoreHandle::spawn(store);
    // Embedded, revisions count up from this process's start; with PostgreSQL they are
    // cluster time (the readiness follower's watermarks), valid on every
    // instance within `cluster.resume_slack`.
    let history = crate::feed::HistoryLimits::default();
    let feed = crate::feed::spawn_feed(
        match &pg {
            Some(_) => crate::feed::Feed::clustered(history, config.cluster.resume_slack),
            None => crate::feed::Feed::starting_at(
                history,
                u64::try_from(clock.now().timestamp_micros()).unwrap_or(0),
            ),
        },
        crate::feed::WATCHER_BUFFER,
    );
    let registry = Registry::spawn(
        sources_rx.clone(),
        RegistryOptions {
            clock: clock.clone(),
            stale_after: config.hds.stale_after(),
            report_interval: config.hds.report_interval,
            store: Some(store.clone()),
            restored,
            feed: Some(feed.sender()),
            claims: pg.as_ref().map(|pg| pg.claims()),
        },
    );
    if let Some(pg) = &pg {
        // Every instance keeps the whole fleet's readiness from what the
        // instances holding the streams write; each read's watermark follows
        // the changes it made into the feed and numbers its revisions.
        let observing = registry.clone();
        let watermarks = feed.sender();
        tokio::spawn(pg.clone().follow_readiness(
            move |rows, watermark| {
                let observing = observing.clone();
                async move { observing.observe(rows, watermark).await }
            },
            move |watermark| watermarks.watermark(watermark),
        ));
        // The newest stream wins across instances: one attached elsewhere
        // ends ours.
        let mut replaced = pg.replaced();
        let following = registry.clone();
        tokio::spawn(async move {
            loop {
                match replaced.recv().await {
                    Ok(StreamNote::Claimed((id, instance, at))) => {
                        following.replaced_on(&id, instance, at)
                    }
                    Ok(StreamNote::Released(id, instance)) => following.released(&id, instance),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        // Which instance holds each stream, read whole on every reconnect
        // and reconcile (heals an announcement missed while disconnected).
        let syncing = registry.clone();
        let own = pg.instance().to_string();
        tokio::spawn(
            pg.clone()
                .follow_holders(move |holders| syncing.sync_holders(&holders, &own)),
        );
        tracing::info!(
            instance = pg.instance(),
            instance_timeout = %humantime::format_duration(config.cluster.instance_timeout),
            "sharing the PostgreSQL store with other instances"
        );
    }
    let assignments = crate::consumers::eds::index::spawn(
        registry.clone(),
        feed.clone(),
        sources_rx.clone(),
        crate::consumers::eds::EdsOptions::from(&config.eds),
    );
    let gate = Arc::new(Gate::new(&config, clock.now())?);
    tokio::spawn(gate.clone().watch());
    if let (Some(pg), AuthMode::Token) = (&pg, config.auth.mode) {
        // A token revoked through any instance ends its streams on this one.
        let revoking = gate.clone();
        tokio::spawn(pg.clone().follow_revocations(move |all| {
            revoking.set_shared_revocations(all.into_iter().collect())
        }));
        // Tokens signed by any instance's key verify on this one: this
        // instance publishes the public keys of its files (and withdraws
        // those it no longer has) and trusts the ones the others publish.
        let publisher = crate::auth::keys::publisher_id(&config.state_dir)
            .map_err(crate::auth::GateError::from)?;
        tokio::spawn(pg.clone().publish_keys_from(
            publisher,
            gate.published_keys(),
            config.cluster.instance_timeout,
        ));
        let trusting = gate.clone();
        tokio::spawn(
            pg.clone()
                .follow_shared_keys(move |all| trusting.set_shared_keys(all)),
        );
    }
    let mut notes = Vec::new();
    if config.auth.mode == AuthMode::None {
        let note = "WARNING: auth.mode is \"none\": any client that reaches the HDS port can claim any dataplane and forge its readiness";
        tracing::warn!("{note}");
        notes.push(note.to_string());
    }
    let scrape = crate::scrape::Scrape {
        handle: crate::metrics::install()?,
        registry: registry.clone(),
        sources: sources_rx.clone(),
        process: Arc::new(metrics_process::Collector::default()),
    };
    scrape.process.describe();
    zero_owned_labels();
    metrics::gauge!(crate::metrics::AUTH_SIGNING_KEYS).set(gate.signing_keys() as f64);
    // The heartbeat: says whether the shared store answers, and finds the
    // instances that stopped answering (after the recorder is installed:
    // it sets `hdsd_store_up`).
    let store_status = pg
        .as_ref()
        .map(|pg| StoreStatus::new(DefinitionStore::describe(pg.as_ref()), &store));
    let cluster = pg.as_ref().zip(store_status.as_ref()).map(|(pg, status)| {
        let claims = pg.claims();
        let holding = registry.clone();
        let reclaim = move || {
            let held = holding.held_here();
            tracing::info!(
                streams = held.len(),
                "claiming the streams held here again in the shared store"
            );
            for (id, at) in held {
                (claims.0)(&id, Some(at));
            }
        };
        tokio::spawn(pg.clone().run_cluster(
            config.cluster.instance_timeout,
            status.clone(),
            reclaim,
        ))
    });

    let tls_error = |e: crate::tls::TlsError| ServeError::Config(vec![e.to_string()]);
    let hds_tls = (config.hds.tls.as_ref())
        .map(|t| crate::tls::ServerTls::load_and_watch("hds.tls", t, crate::tls::Alpn::Grpc))
        .transpose()
        .map_err(tls_error)?;
    let api_tls = (config.api.tls.as_ref())
        .map(|t| crate::tls::ServerTls::load_and_watch("api.tls", t, crate::tls::Alpn::Http))
        .transpose()
        .map_err(tls_error)?;
    if config.auth.mode == crate::config::AuthMode::Token
        && hds_tls.is_none()
        && !config.hds.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %config.hds.listen, "dataplane tokens travel in plaintext; set hds.tls");
    }

    // Sockets passed in by a service manager (systemd socket activation,
    // `LISTEN_FDS`: the first is the HDS listener, the second the API's) are
    // used as they are; otherwise hdsd binds the configured addresses.
    let mut passed = listenfd::ListenFd::from_env();
    let hds_listener = match passed_listener(&mut passed, 0, "hds.listen")? {
        Some(l) => l,
        None => bind_with_backlog(config.hds.listen, HDS_BACKLOG).map_err(|source| {
            ServeError::Bind {
                what: "hds.listen",
                addr: config.hds.listen,
                source,
            }
        })?,
    };
    let api_listener = match passed_listener(&mut passed, 1, "api.listen")? {
        Some(l) => l,
        None => TcpListener::bind(config.api.listen)
            .await
            .map_err(|source| ServeError::Bind {
                what: "api.listen",
                addr: config.api.listen,
                source,
            })?,
    };
    let hds_addr = hds_listener.local_addr().map_err(ServeError::Api)?;
    let api_addr = api_listener.local_addr().map_err(ServeError::Api)?;

    let (drain_tx, drain_rx) = watch::channel(false);
    let service = HdsService::new(
        registry.clone(),
        HdsSettings {
            unknown_dataplane_grace: config.hds.unknown_dataplane_grace,
            report_interval: config.hds.report_interval,
            stale_after: config.hds.stale_after(),
            limits: config.hds.limits.clone(),
            definitions_from_api: config.dataplanes.source == DataplanesSource::Api,
        },
        gate.clone(),
        clock,
        drain_rx.clone(),
    );
    let eds = crate::consumers::eds::server::EdsService::new(
        assignments,
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
        drain_rx.clone(),
    );
    let hds: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> = {
        let mut drain = drain_rx.clone();
        // HDS for the dataplanes' Envoys, EDS for Envoys that route to them.
        let limits = &config.hds.limits;
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(config.hds.keepalive.interval))
            .http2_keepalive_timeout(Some(config.hds.keepalive.timeout))
            .initial_stream_window_size(HDS_STREAM_WINDOW)
            .initial_connection_window_size(HDS_CONNECTION_WINDOW)
            .max_concurrent_streams(limits.max_streams_per_connection)
            .http2_max_pending_accept_reset_streams(Some(crate::net::H2_MAX_PENDING_RESETS))
            .http2_max_local_error_reset_streams(Some(crate::net::H2_MAX_LOCAL_RESETS))
            .http2_max_header_list_size(HDS_MAX_HEADER_LIST)
            .add_service(service.into_server())
            .add_service(eds.into_server(limits.max_message_bytes));
        let signal = async move {
            let _ = drain.wait_for(|d| *d).await;
        };
        let admission = Admission::new("hds", limits.into());
        match hds_tls {
            Some(tls) => {
                let incoming = Incoming::new(hds_listener, admission, TlsHandshake(tls))
                    .map_err(ServeError::Api)?;
                Box::pin(server.serve_with_incoming_shutdown(incoming, signal))
            }
            None => {
                let incoming =
                    Incoming::new(hds_listener, admission, Plain).map_err(ServeError::Api)?;
                Box::pin(server.serve_with_incoming_shutdown(incoming, signal))
            }
        }
    };

    let ready = Arc::new(AtomicBool::new(false));
    let feed = feed.until(drain_rx.clone());
    let api_tokens = Arc::new(config.api.tokens.clone());
    let grpc = crate::consumers::grpc::router(
        crate::consumers::grpc::ReadinessApi {
            registry: registry.clone(),
            feed: feed.clone(),
        },
        api_tokens.clone(),
    )
    .await;
    let api_state = ApiState {
        feed,
        registry,
        sources: sources_rx,
        ready: ready.clone(),
        notes: Arc::new(notes),
        store_status,
        metrics: Some(scrape),
        tokens: api_tokens,
        gate: (config.auth.mode == AuthMode::Token).then(|| gate.clone()),
        hds_port: hds_addr.port(),
        definitions,
    };
    let api: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> = {
        let mut drain = drain_rx.clone();
        // REST and gRPC (hdsd.v1) on one port, routed by content type.
        let router = crate::consumers::grpc::by_content_type(api::router(api_state), grpc);
        let signal = async move {
            let _ = drain.wait_for(|d| *d).await;
        };
        let limits = &config.api.limits;
        let admission = Admission::new("api", limits.into());
        let options = crate::net::HttpOptions {
            header_read_timeout: limits.header_read_timeout,
            max_streams_per_connection: API_MAX_STREAMS,
            keepalive_interval: config.hds.keepalive.interval,
            keepalive_timeout: config.hds.keepalive.timeout,
        };
        match api_tls {
            Some(tls) => {
                let incoming = Incoming::new(api_listener, admission, TlsHandshake(tls))
                    .map_err(ServeError::Api)?;
                Box::pin(crate::net::serve_http(incoming, router, options, signal))
            }
            None => {
                let incoming =
                    Incoming::new(api_listener, admission, Plain).map_err(ServeError::Api)?;
                Box::pin(crate::net::serve_http(incoming, router, options, signal))
            }
        }
    };

    ready.store(true, Ordering::Release);
    tracing::info!(hds = %hds_addr, api = %api_addr, "hdsd listening");

    let mut hds = tokio::spawn(hds);
    let mut api = tokio::spawn(api);
    let failure = tokio::select! {
        () = shutdown => None,
        _ = watcher => Some(ServeError::Stopped("the dataplane definitions watcher")),
        r = &mut hds => Some(match r {
            Ok(Err(e)) => ServeError::Hds(e),
            _ => ServeError::Stopped("the HDS listener"),
        }),
        r = &mut api => Some(match r {
            Ok(Err(e)) => ServeError::Api(e),
            _ => ServeError::Stopped("the API listener"),
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
        store.flush().await;
        if let Some(pg) = &pg {
            // Gone at once for the other instances, not after instance_timeout.
            if let Some(cluster) = &cluster {
                cluster.abort();
            }
            match pg.leave().await {
                Ok(()) => tracing::info!("left the cluster: the other instances no longer count this one"),
                Err(e) => tracing::warn!("cannot leave the cluster ({e}); the other instances take this one for dead after cluster.instance_timeout"),
            }
        }
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
