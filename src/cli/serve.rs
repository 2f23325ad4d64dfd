//! `hdsd serve`: loads the configuration, sets up the log, and runs the
//! server (`server::run`) on a new runtime until SIGINT or SIGTERM. The
//! server's error is logged once and becomes the exit code (1 for setup,
//! 2 at run time).

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};
use crate::server;

/// `hdsd serve`'s arguments.
#[derive(clap::Args)]
pub(super) struct ServeArgs {
    /// Config file (.toml, .yaml or .yml); HDSD_* variables override it.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

impl ServeArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let config_path = self.config.as_deref();
        let config = Config::load(config_path)?;
        init_logging(&config);
        for warning in config.secret_file_warnings(config_path) {
            tracing::warn!("{warning}");
        }
        let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
        match runtime
            .block_on(server::run(config, shutdown_signal()))
            .map_err(|e| match e {
                server::ServeError::Config(problems) => {
                    server::ServeError::Config(Config::locate(problems, config_path))
                }
                e => e,
            }) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                // Logging is set up by now: the log (stderr) carries the message once.
                tracing::error!("{e}");
                Ok(ExitCode::from(e.exit_code()))
            }
        }
    }
}

fn init_logging(config: &Config) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = config.log.format == LogFormat::Json;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(crate::logging::BudgetedStderr::new(
            config.log.max_bytes_per_second,
            json,
        ));
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
