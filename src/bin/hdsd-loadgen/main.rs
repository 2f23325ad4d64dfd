//! `hdsd-loadgen`: simulated Envoys for load tests of hdsd (see BENCHMARKS.md).
//!
//! - `gen-dataplanes` writes Dataplane files for hdsd to serve;
//! - `run` connects N simulated Envoy 1.40 HDS clients and measures, with
//!   optional consumers of readiness (gRPC watchers, EDS subscribers);
//! - `null-server` is an HDS server that does nothing but answer: the
//!   transport's ceiling to compare hdsd with;
//! - `zones` simulates zones against a global hdsd's zone listener, speaking
//!   `zone.proto` as a zone hdsd does, and measures the global.
//!
//! Targets loopback addresses only; every phase is bounded in time.
//!
//! It plays Envoys and zones against a real hdsd, on the real clock: the
//! wall clock is read where a message is stamped, not through a `Clock`.
#![allow(
    clippy::disallowed_methods,
    reason = "a load generator plays Envoys and zones on the real clock"
)]

mod consumers;
mod envoy;
mod gen;
mod null;
mod run;
mod stats;
mod sys;
mod zones;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hdsd-loadgen",
    version,
    about = "Load generator for hdsd: simulated Envoy HDS clients, dataplane files, a null HDS server, simulated zones"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate Envoys against an HDS server and print what was measured.
    Run(Box<run::Args>),
    /// Write Dataplane YAML files (and a manifest for `run`).
    GenDataplanes(gen::Args),
    /// An HDS server that answers every HealthCheckRequest with a fixed specifier, nothing else.
    NullServer(null::Args),
    /// Simulate zones (snapshots, changes, heartbeats) against a global hdsd and measure it.
    Zones(Box<zones::Args>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::GenDataplanes(args) => gen::run(args).map(|()| ExitCode::SUCCESS),
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run::run(*args))),
        Command::NullServer(args) => runtime()
            .and_then(|rt| rt.block_on(null::run(args)))
            .map(|()| ExitCode::SUCCESS),
        Command::Zones(args) => runtime().and_then(|rt| rt.block_on(zones::run(*args))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
