//! `run`: N simulated Envoys against an HDS server, and what it measures.
//!
//! Phases: connect (every dataplane gets its first specifier), warm-up,
//! steady window (report rate, server CPU and memory, readiness propagation),
//! then optionally the consumers (gRPC watchers, EDS subscribers),
//! definition churn and a reconnect storm, then settle (every dataplane
//! reports all healthy) and linger.
//!
//! - `plan`: the flags checked and worked out (pure);
//! - `fleet`: the simulated Envoys and the counters they share;
//! - `scenarios`: one function per phase;
//! - `figures`: what each phase reports, from what it sampled (pure).

mod figures;
mod fleet;
mod plan;
mod scenarios;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::gen::Manifest;
use crate::stats::{round3, summary};
use crate::sys;
use fleet::{Ctx, Dp, Probers};
use plan::Plan;
use scenarios::{Connected, Steady};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The HDS server (loopback only), or several, comma-separated, as an
    /// Envoy's bootstrap lists them: every simulated Envoy connects to the
    /// first and, when its stream or connection fails, moves to another
    /// (at random) after Envoy's backoff (jittered, 1 s doubling to 30 s).
    #[arg(long, default_value = "127.0.0.1:5678", value_delimiter = ',')]
    pub hds: Vec<SocketAddr>,
    /// hdsd's REST API, e.g. http://127.0.0.1:5680: enables readiness propagation sampling.
    #[arg(long)]
    pub api: Option<String>,
    /// The server's process id: its CPU time and resident memory are measured.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// A server running under `valgrind --tool=callgrind --instr-atstart=no`:
    /// its instructions are counted over the steady window alone
    /// (`callgrind_control -i on` at its start, `-i off` at its end).
    #[arg(long)]
    pub instrument_pid: Option<u32>,
    /// A directory written by `gen-dataplanes` (names, inbounds; needed for --churn).
    #[arg(long)]
    pub dataplanes_dir: Option<PathBuf>,
    /// Without --dataplanes-dir: how many dataplanes (<mesh>.<prefix><index>).
    #[arg(long)]
    pub count: Option<usize>,
    #[arg(long, default_value = "default")]
    pub mesh: String,
    #[arg(long, default_value = "dp-")]
    pub prefix: String,
    /// Dataplanes (HDS streams) sharing one HTTP/2 connection; Envoy uses 1.
    #[arg(long, default_value_t = 1)]
    pub streams_per_connection: usize,
    /// Spread connections over this many source addresses 127.0.0.2, 127.0.0.3, ... (0: kernel's choice).
    #[arg(long, default_value_t = 32)]
    pub source_ips: usize,
    /// Connection attempts in flight at once.
    #[arg(long, default_value_t = 512)]
    pub connect_concurrency: usize,
    /// How long every dataplane may take to get its first specifier.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Wait after everyone is connected before measuring (default: one report interval).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,
    /// The steady measurement window.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Fraction of dataplanes whose first endpoint flips HEALTHY <-> UNHEALTHY every report.
    #[arg(long, default_value_t = 0.0)]
    pub flip_fraction: f64,
    /// Saturation: send reports as fast as the server takes them, not every interval.
    #[arg(long, alias = "saturation")]
    pub rate_unlimited: bool,
    /// Spread the simulated Envoys' report timers over one interval, as in a
    /// fleet whose Envoys started at different times. By default each starts
    /// its timer at its first specifier, like Envoy, and since they all
    /// connect within a fraction of a second their reports come in bursts.
    #[arg(long)]
    pub spread_reports: bool,
    /// Dataplanes whose flips are timed until hdsd's API shows them (needs --api; 0: off).
    #[arg(long, default_value_t = 50)]
    pub sample: usize,
    /// Tokens to present: one per line in dataplane order, or a directory of files named <mesh>.<name>.
    #[arg(long, conflicts_with = "sign_with_state_dir")]
    pub token_file: Option<PathBuf>,
    /// Issue a token per dataplane with the KeyRing in hdsd's state_dir.
    #[arg(long)]
    pub sign_with_state_dir: Option<PathBuf>,
    /// After the steady window: this many definition changes (a servicePort rewrite each).
    #[arg(long, default_value_t = 0)]
    pub churn: usize,
    /// Definition changes per second during churn.
    #[arg(long, default_value_t = 5.0)]
    pub churn_rate: f64,
    /// After the steady window (and churn): drop every stream and connection at once and reconnect.
    #[arg(long)]
    pub reconnect_storm: bool,
    /// After the steady window: this many gRPC `hdsd.v1.ReadinessService/Watch`
    /// clients on --api (one connection each), for another --duration while the
    /// same flips go on: latency from each flip's report to the event at every
    /// watcher, hdsd CPU added, memory per watcher.
    #[arg(long, default_value_t = 0)]
    pub watchers: usize,
    /// After the steady window (and the watchers): this many EDS subscribers
    /// (front Envoys: `StreamEndpoints` on --hds, one connection each, ACKing)
    /// subscribed to every service of --dataplanes-dir, for another --duration:
    /// latency from each flip's report to the push at every subscriber, hdsd
    /// CPU and memory per subscriber.
    #[arg(long, default_value_t = 0)]
    pub eds_subscribers: usize,
    /// Keep the streams open this long after printing the results.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub linger: Duration,
    /// Soak: sample the server's resident memory this often during the steady
    /// window (e.g. 10s with --duration 2h); the results get every sample and
    /// the growth over the window's last hour.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub rss_sample_every: Option<Duration>,
    /// Print the results as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// A name for this run, copied into the results.
    #[arg(long)]
    pub label: Option<String>,
}

/// Plays the scenarios the flags ask for and prints what they measured.
/// Exits 3 when a specifier was invalid, 2 when not every dataplane got one.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    plan::check_flags(&args)?;
    let nofile = sys::raise_nofile();
    let manifest = match &args.dataplanes_dir {
        Some(dir) => Some(Manifest::load(dir)?),
        None => None,
    };
    let plan = Plan::new(&args, manifest.as_ref(), nofile)?;
    let names = plan.names(manifest.as_ref());
    let tokens = fleet::load_tokens(&args, &names)?;
    let dps = fleet::dataplanes(
        &plan,
        names,
        tokens.as_ref(),
        args.flip_fraction,
        args.sample,
    );
    let (probers, jobs) = Probers::start(&args, &plan);
    let ctx = Arc::new(Ctx::new(&args, &plan, jobs));

    let connected = scenarios::connect(&ctx, &args, &dps).await;
    let steady = scenarios::steady(&ctx, &args, &connected, &probers).await;
    let steady_cpu = steady.server["cpu_percent_of_one_core_steady"].as_f64();
    let shared = manifest.clone().map(Arc::new);
    let phases = Phases {
        watchers: scenarios::watchers(&ctx, &args, &plan, shared.as_ref(), steady_cpu).await,
        eds: scenarios::eds_subscribers(&ctx, &args, shared.as_ref(), steady_cpu).await,
        churn: scenarios::churn(&ctx, &args, manifest.as_ref()).await?,
        storm: scenarios::reconnect_storm(&ctx, &args).await,
    };
    scenarios::settle(&ctx).await;

    let invalid = ctx.invalid.load(Ordering::Relaxed);
    let run = Run {
        args: &args,
        plan: &plan,
        nofile,
        tokens: tokens.is_some(),
        dps: &dps,
        invalid,
    };
    let result = results(&run, &ctx, &connected, &steady, &probers, phases);
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print!("{}", crate::stats::table(&result));
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    if invalid > 0 {
        eprintln!("FAILED: {invalid} invalid specifiers (see above)");
    }
    if !args.linger.is_zero() {
        tokio::time::sleep(args.linger).await;
    }
    ctx.control.send_modify(|c| c.stop = true);
    drop(probers);
    Ok(if invalid > 0 {
        ExitCode::from(3)
    } else if !connected.all {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// What the run was asked for.
struct Run<'a> {
    args: &'a Args,
    plan: &'a Plan,
    nofile: u64,
    tokens: bool,
    dps: &'a [Arc<Dp>],
    /// Invalid specifiers when the results were taken.
    invalid: u64,
}

/// The figures of the optional scenarios (null when not played).
struct Phases {
    watchers: Option<Value>,
    eds: Option<Value>,
    churn: Option<Value>,
    storm: Option<Value>,
}

/// The results: settings, the connect phase, the steady window and every
/// scenario played.
fn results(
    run: &Run<'_>,
    ctx: &Ctx,
    connected: &Connected,
    steady: &Steady,
    probers: &Probers,
    phases: Phases,
) -> Value {
    let (args, plan) = (run.args, run.plan);
    let interval = connected.interval;
    let window = steady.window;
    json!({
        "label": args.label,
        "machine": sys::machine(),
        "settings": {
            "dataplanes": plan.count,
            "clusters_per_dataplane": plan.expect_clusters,
            "streams_per_connection": args.streams_per_connection,
            "connections": plan.connections,
            "report_interval_ms": interval.as_millis() as u64,
            "rate_unlimited": args.rate_unlimited,
            "spread_reports": args.spread_reports,
            "flip_fraction": args.flip_fraction,
            "duration_s": round3(window),
            "tokens": run.tokens,
            "rlimit_nofile": run.nofile,
        },
        "connected": ctx.active.load(Ordering::Acquire),
        "connected_steady": steady.active,
        "first_specifier_all_s": connected.first_specifier_all.map(round3),
        "specifiers_received": ctx.specifiers.load(Ordering::Relaxed),
        "invalid_specifiers": run.invalid,
        "invalid_examples": ctx.invalid_examples.lock().unwrap().clone(),
        "stream_failures": ctx.failures.lock().unwrap().clone(),
        "listen_queue_overflows": match (connected.overflows_before, sys::listen_overflows()) {
            (Some(a), Some(b)) => json!(b - a),
            _ => Value::Null,
        },
        "reports_sent": steady.reports,
        "reports_per_s": round3(steady.reports as f64 / window),
        "expected_reports_per_s": figures::expected_rate(args.rate_unlimited, steady.active, interval),
        "server": steady.server,
        "loadgen_cpu_percent_of_one_core": steady.loadgen_cpu,
        "readiness_propagation": if plan.sample_stride > 0 {
            let mut s = summary(&steady.propagation);
            s["timeouts_3s"] = json!(probers.timeouts.load(Ordering::Relaxed));
            s["sampled_dataplanes"] = json!(run.dps.iter().filter(|d| d.sample).count());
            s
        } else { Value::Null },
        "watchers": phases.watchers,
        "eds": phases.eds,
        "churn": phases.churn,
        "reconnect_storm": phases.storm,
        "rss_soak": figures::rss_soak(&steady.rss_samples),
    })
}
