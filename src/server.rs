//! `hdsd serve`: wires the source, the registry, the HDS service and the API
//! together and runs them until shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::api::{self, ApiState};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::hds::{HdsService, HdsSettings};
use crate::registry::Registry;
use crate::source::{self, Loaded};
use crate::specifier::SpecifierSettings;

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
    #[error("cannot watch the dataplanes directory: {0}")]
    Watch(#[from] notify::Error),
    #[error("HDS listener failed: {0}")]
    Hds(#[from] tonic::transport::Error),
    #[error("API listener failed: {0}")]
    Api(std::io::Error),
}

/// How long a graceful shutdown may take before the process exits anyway.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The server-wide specifier settings of a configuration.
pub fn specifier_settings(config: &Config) -> SpecifierSettings {
    SpecifierSettings {
        defaults: config.hds.check.probe_settings(),
        report_interval: config.hds.report_interval,
        probe_all_inbounds: config.hds.probe_all_inbounds,
    }
}

/// Runs hdsd until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let problems = config.validate();
    if !problems.is_empty() {
        return Err(ServeError::Config(problems));
    }
    let settings = specifier_settings(&config);
    let dir = config.dataplanes.dir.clone();
    let initial = source::load(&dir, &Loaded::default(), &settings)?;
    source::log_problems(&initial, &Loaded::default());
    tracing::info!(
        dir = %dir.display(),
        dataplanes = initial.dataplanes.len(),
        broken_files = initial.error_count(),
        "dataplanes loaded"
    );
    let (sources_tx, sources_rx) = watch::channel(Arc::new(initial));
    let watcher = tokio::spawn(source::watch(dir.clone(), settings, sources_tx));

    let registry = Registry::spawn(sources_rx.clone(), Arc::new(SystemClock));

    let hds_listener = TcpListener::bind(config.hds.listen)
        .await
        .map_err(|source| ServeError::Bind {
            what: "hds.listen",
            addr: config.hds.listen,
            source,
        })?;
    let api_listener = TcpListener::bind(config.api.listen)
        .await
        .map_err(|source| ServeError::Bind {
            what: "api.listen",
            addr: config.api.listen,
            source,
        })?;
    let hds_addr = hds_listener.local_addr().map_err(ServeError::Api)?;
    let api_addr = api_listener.local_addr().map_err(ServeError::Api)?;

    let (drain_tx, drain_rx) = watch::channel(false);
    let service = HdsService::new(
        registry.clone(),
        HdsSettings {
            unknown_dataplane_grace: config.hds.unknown_dataplane_grace,
            report_interval: config.hds.report_interval,
            dataplanes_dir: dir.display().to_string(),
        },
        drain_rx.clone(),
    );
    let hds = {
        let mut drain = drain_rx.clone();
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_service(service.into_server())
            .serve_with_incoming_shutdown(
                TcpIncoming::from(hds_listener).with_nodelay(Some(true)),
                async move {
                    let _ = drain.wait_for(|d| *d).await;
                },
            )
    };

    let ready = Arc::new(AtomicBool::new(false));
    let api_state = ApiState {
        registry,
        sources: sources_rx,
        ready: ready.clone(),
        notes: Arc::new(Vec::new()),
    };
    let api = {
        let mut drain = drain_rx.clone();
        axum::serve(api_listener, api::router(api_state)).with_graceful_shutdown(async move {
            let _ = drain.wait_for(|d| *d).await;
        })
    };

    ready.store(true, Ordering::Release);
    tracing::info!(hds = %hds_addr, api = %api_addr, "hdsd listening");

    let hds = tokio::spawn(hds);
    let api = tokio::spawn(async move { api.await });
    tokio::select! {
        () = shutdown => {}
        r = watcher => {
            if let Ok(Err(e)) = r { return Err(e.into()); }
        }
    }
    tracing::info!("shutting down: ending streams so Envoys reconnect elsewhere");
    let _ = drain_tx.send(true);
    let stopped = tokio::time::timeout(SHUTDOWN_TIMEOUT, async {
        let h = hds.await;
        let a = api.await;
        (h, a)
    })
    .await;
    match stopped {
        Ok((Ok(Err(e)), _)) => Err(e.into()),
        Ok((_, Ok(Err(e)))) => Err(ServeError::Api(e)),
        Ok(_) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(
                "shutdown took longer than {}s; exiting anyway",
                SHUTDOWN_TIMEOUT.as_secs()
            );
            Ok(())
        }
    }
}
