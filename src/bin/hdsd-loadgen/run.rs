//! `run`: N simulated Envoys against an HDS server, and what it measures.
//!
//! Phases: connect (every dataplane gets its first specifier), warm-up,
//! steady window (report rate, server CPU and memory, readiness propagation),
//! then optionally definition churn and a reconnect storm, then settle (every
//! dataplane reports all healthy) and linger.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use envoy_types::pb::envoy::service::health::v3::health_discovery_service_client::HealthDiscoveryServiceClient;
use rand::Rng as _;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::consumers;
use crate::envoy::{self, Message, ReportPlan};
use crate::gen::{Manifest, CHURN_PORT_BASE, SERVICE_PORT_BASE};
use crate::stats::{round3, summary};
use crate::sys;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The HDS server (loopback only).
    #[arg(long, default_value = "127.0.0.1:5678")]
    pub hds: SocketAddr,
    /// hdsd's REST API, e.g. http://127.0.0.1:5680: enables readiness propagation sampling.
    #[arg(long)]
    pub api: Option<String>,
    /// The server's process id: its CPU time and resident memory are measured.
    #[arg(long)]
    pub server_pid: Option<u32>,
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

/// One simulated Envoy.
#[derive(Debug)]
struct Dp {
    index: usize,
    name: String,
    node_id: String,
    token: Option<String>,
    /// Its first endpoint flips every report.
    flips: bool,
    /// Its flips are timed against the API.
    sample: bool,
    got_first: AtomicBool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Control {
    /// Bumped by a reconnect storm: every connection is dropped and made again.
    epoch: u64,
    /// Report everything healthy from now on.
    settle: bool,
    stop: bool,
}

/// A flip to time: the report with `expect` for `endpoint` left at `sent`.
struct Job {
    name: String,
    endpoint: SocketAddr,
    expect: &'static str,
    sent: Instant,
}

struct Ctx {
    target: SocketAddr,
    mesh: String,
    expect_clusters: Option<usize>,
    rate_unlimited: bool,
    spread_reports: bool,
    source_ips: usize,
    total: usize,
    started: Instant,
    control: watch::Sender<Control>,
    connect_slots: Semaphore,
    first_specifiers: AtomicUsize,
    all_first_at: Mutex<Option<Instant>>,
    /// Streams that hold a valid specifier now.
    active: AtomicUsize,
    reports: AtomicU64,
    specifiers: AtomicU64,
    invalid: AtomicU64,
    invalid_examples: Mutex<Vec<String>>,
    failures: Mutex<BTreeMap<String, u64>>,
    interval_ms: AtomicU64,
    measuring: AtomicBool,
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    storm_target: AtomicUsize,
    storm_served: AtomicUsize,
    storm_done_at: Mutex<Option<Instant>>,
    storm_started: Mutex<Option<Instant>>,
    storm_times: Mutex<Vec<f64>>,
    churn_pending: Mutex<HashMap<usize, (u16, Instant)>>,
    churn_latencies: Mutex<Vec<f64>>,
    /// Flips timed against watchers and EDS subscribers.
    flips: Arc<consumers::Flips>,
}

impl Ctx {
    fn failure(&self, reason: String) {
        *self.failures.lock().unwrap().entry(reason).or_default() += 1;
    }

    fn invalid(&self, dp: &Dp, error: String) {
        let n = self.invalid.fetch_add(1, Ordering::Relaxed);
        if n < 10 {
            eprintln!("INVALID SPECIFIER for {}: {error}", dp.node_id);
            self.invalid_examples
                .lock()
                .unwrap()
                .push(format!("{}: {error}", dp.node_id));
        }
    }

    fn first_specifier(&self, dp: &Dp) {
        if dp.got_first.swap(true, Ordering::Relaxed) {
            return;
        }
        if self.first_specifiers.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
            *self.all_first_at.lock().unwrap() = Some(Instant::now());
        }
    }

    fn storm_served(&self) {
        if let Some(at) = *self.storm_started.lock().unwrap() {
            self.storm_times
                .lock()
                .unwrap()
                .push(at.elapsed().as_secs_f64());
        }
        let n = self.storm_served.fetch_add(1, Ordering::AcqRel) + 1;
        if n == self.storm_target.load(Ordering::Acquire) {
            *self.storm_done_at.lock().unwrap() = Some(Instant::now());
        }
    }

    fn churn_arrived(&self, index: usize, plan: &ReportPlan) {
        let mut pending = self.churn_pending.lock().unwrap();
        if let Some(&(port, at)) = pending.get(&index) {
            if plan.first.map(|a| a.port()) == Some(port) {
                pending.remove(&index);
                drop(pending);
                self.churn_latencies
                    .lock()
                    .unwrap()
                    .push(at.elapsed().as_secs_f64());
            }
        }
    }
}

/// Decrements the active count when a served stream ends.
struct ActiveGuard<'a>(&'a AtomicUsize);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

enum End {
    /// A storm or the end of the run: leave without retrying.
    Leave,
    /// The stream failed: retry after Envoy's backoff.
    Failed(String),
}

async fn leave(control: &mut watch::Receiver<Control>, epoch: u64) {
    loop {
        {
            let c = *control.borrow_and_update();
            if c.stop || c.epoch != epoch {
                return;
            }
        }
        if control.changed().await.is_err() {
            return;
        }
    }
}

/// One connection and the dataplanes multiplexed on it; reconnects on a storm.
async fn run_group(dps: Vec<Arc<Dp>>, conn: usize, ctx: Arc<Ctx>) {
    let mut control = ctx.control.subscribe();
    loop {
        let c = *control.borrow_and_update();
        if c.stop {
            return;
        }
        let epoch = c.epoch;
        let channel = loop {
            let permit = ctx.connect_slots.acquire().await;
            let source = sys::source_ip(conn, ctx.source_ips);
            match sys::connect(ctx.target, source, Duration::from_secs(10)).await {
                Ok(ch) => break ch,
                Err(e) => {
                    drop(permit);
                    ctx.failure(format!("connect: {}", root_cause(&e)));
                    let wait = Duration::from_millis(rand::thread_rng().gen_range(100..1000));
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = leave(&mut control, epoch) => {
                            if control.borrow().stop { return; }
                        }
                    }
                    if control.borrow().stop {
                        return;
                    }
                }
            }
        };
        let mut set = JoinSet::new();
        for dp in &dps {
            set.spawn(run_dp(channel.clone(), dp.clone(), ctx.clone(), epoch));
        }
        drop(channel);
        while set.join_next().await.is_some() {}
    }
}

fn root_cause(e: &anyhow::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s = inner.to_string();
        source = inner.source();
    }
    s
}

async fn run_dp(channel: Channel, dp: Arc<Dp>, ctx: Arc<Ctx>, epoch: u64) {
    let mut control = ctx.control.subscribe();
    let mut served_this_epoch = false;
    loop {
        match stream_once(
            &channel,
            &dp,
            &ctx,
            epoch,
            &mut control,
            &mut served_this_epoch,
        )
        .await
        {
            End::Leave => return,
            End::Failed(reason) => {
                ctx.failure(reason);
                // Envoy's HDS retry: jittered backoff from a 1 s base, reset per stream.
                let wait = Duration::from_millis(rand::thread_rng().gen_range(0..1000));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = leave(&mut control, epoch) => return,
                }
            }
        }
    }
}

async fn stream_once(
    channel: &Channel,
    dp: &Dp,
    ctx: &Ctx,
    epoch: u64,
    control: &mut watch::Receiver<Control>,
    served_this_epoch: &mut bool,
) -> End {
    let (tx, rx) = mpsc::channel::<Message>(2);
    let _ = tx.try_send(envoy::health_check_request(&dp.node_id, &ctx.mesh));
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = &dp.token {
        match MetadataValue::try_from(format!("Bearer {token}")) {
            Ok(v) => {
                request.metadata_mut().insert("authorization", v);
            }
            Err(_) => return End::Failed("token is not valid metadata".into()),
        }
    }
    let mut client =
        HealthDiscoveryServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
    let response = tokio::select! {
        r = client.stream_health_check(request) => r,
        () = leave(control, epoch) => return End::Leave,
    };
    let mut inbound = match response {
        Ok(r) => r.into_inner(),
        Err(s) => return End::Failed(format!("open: {:?}", s.code())),
    };
    let mut plan: Option<ReportPlan> = None;
    let mut next_report: Option<tokio::time::Instant> = None;
    let mut active: Option<ActiveGuard<'_>> = None;
    let mut sent: u64 = 0;
    let mut last_first: Option<bool> = None;
    let mut settled = control.borrow().settle;
    loop {
        let report_due = async {
            match next_report {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() {
                    return End::Leave;
                }
                let c = *control.borrow_and_update();
                if c.stop || c.epoch != epoch {
                    return End::Leave;
                }
                if c.settle && !settled {
                    settled = true;
                    if let Some(p) = &plan {
                        if tx.send(p.message(true)).await.is_err() {
                            return End::Failed("request stream closed".into());
                        }
                        ctx.reports.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            msg = inbound.message() => match msg {
                Ok(Some(spec)) => {
                    ctx.specifiers.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = envoy::validate(&spec, ctx.expect_clusters) {
                        // Envoy rejects it and keeps its clusters.
                        ctx.invalid(dp, e);
                        continue;
                    }
                    let p = ReportPlan::new(&spec);
                    ctx.interval_ms.store(p.interval.as_millis() as u64, Ordering::Relaxed);
                    ctx.churn_arrived(dp.index, &p);
                    if active.is_none() {
                        ctx.active.fetch_add(1, Ordering::AcqRel);
                        active = Some(ActiveGuard(&ctx.active));
                    }
                    ctx.first_specifier(dp);
                    if epoch > 0 && !*served_this_epoch {
                        *served_this_epoch = true;
                        ctx.storm_served();
                    }
                    // Envoy restarts its report timer only when the interval changes.
                    if plan.as_ref().map(|q| q.interval) != Some(p.interval) {
                        let phase = if ctx.spread_reports {
                            // A fixed phase per dataplane, spread evenly.
                            p.interval.mul_f64((dp.index as f64 * 0.618_034).fract())
                        } else {
                            Duration::ZERO
                        };
                        next_report = Some(tokio::time::Instant::now() + p.interval + phase);
                    }
                    plan = Some(p);
                }
                Ok(None) => return End::Failed("closed by the server (OK)".into()),
                Err(status) => return End::Failed(format!("{:?}", status.code())),
            },
            () = report_due, if !ctx.rate_unlimited => {
                let Some(p) = &plan else { continue };
                let flipping = (dp.flips || dp.sample) && !settled;
                let healthy = !flipping || sent % 2 == 0;
                let msg = p.message(healthy);
                let at = Instant::now();
                if flipping && last_first.is_some_and(|l| l != healthy) {
                    ctx.flips.record(dp.index, healthy, at);
                }
                if tx.send(msg).await.is_err() {
                    return End::Failed("request stream closed".into());
                }
                ctx.reports.fetch_add(1, Ordering::Relaxed);
                sent += 1;
                if dp.sample && last_first.is_some_and(|l| l != healthy) && ctx.measuring.load(Ordering::Relaxed) {
                    if let (Some(jobs), Some(endpoint)) = (&ctx.jobs, p.first) {
                        let _ = jobs.try_send(Job {
                            name: dp.name.clone(),
                            endpoint,
                            expect: envoy::api_status(healthy),
                            sent: at,
                        });
                    }
                }
                last_first = Some(healthy);
                let now = tokio::time::Instant::now();
                let mut next = next_report.unwrap_or(now) + p.interval;
                if next < now {
                    next = now + p.interval;
                }
                next_report = Some(next);
            }
            permit = tx.reserve(), if ctx.rate_unlimited && plan.is_some() => {
                let Ok(permit) = permit else {
                    return End::Failed("request stream closed".into());
                };
                if let Some(p) = &plan {
                    permit.send(p.message(true));
                    ctx.reports.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Polls the API until each timed flip shows; runs on its own threads.
fn prober(
    api: String,
    mesh: String,
    jobs: Arc<Mutex<std::sync::mpsc::Receiver<Job>>>,
    latencies: Arc<Mutex<Vec<f64>>>,
    timeouts: Arc<AtomicU64>,
) {
    let agent = ureq::Agent::new_with_defaults();
    loop {
        let job = match jobs.lock().unwrap().recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        let url = format!("{api}/api/v1/dataplanes/{mesh}/{}", job.name);
        let deadline = job.sent + Duration::from_secs(3);
        loop {
            let seen = agent
                .get(&url)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_json::<Value>().ok())
                .and_then(|v| inbound_status(&v, job.endpoint));
            if seen.as_deref() == Some(job.expect) {
                latencies
                    .lock()
                    .unwrap()
                    .push(job.sent.elapsed().as_secs_f64());
                break;
            }
            if Instant::now() >= deadline {
                timeouts.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let waited = job.sent.elapsed();
            std::thread::sleep(if waited < Duration::from_millis(20) {
                Duration::from_micros(250)
            } else {
                Duration::from_millis(1)
            });
        }
    }
}

/// The status hdsd's API shows for the inbound probed at `endpoint`.
fn inbound_status(dp: &Value, endpoint: SocketAddr) -> Option<String> {
    dp["inbounds"].as_array()?.iter().find_map(|i| {
        let port = i["servicePort"].as_u64()?;
        let ip = i["serviceAddress"].as_str()?;
        (port == u64::from(endpoint.port()) && ip == endpoint.ip().to_string())
            .then(|| i["health"]["status"].as_str().map(str::to_string))?
    })
}

fn load_tokens(args: &Args, dps: &[(String, String)]) -> anyhow::Result<Option<Vec<String>>> {
    if let Some(path) = &args.token_file {
        if path.is_dir() {
            let tokens = dps
                .iter()
                .map(|(mesh, name)| {
                    let f = path.join(format!("{mesh}.{name}"));
                    std::fs::read_to_string(&f)
                        .map(|t| t.trim().to_string())
                        .with_context(|| format!("cannot read token file {}", f.display()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Some(tokens));
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let tokens: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        anyhow::ensure!(
            tokens.len() >= dps.len(),
            "{} holds {} tokens for {} dataplanes (one per line, in dataplane order)",
            path.display(),
            tokens.len(),
            dps.len()
        );
        return Ok(Some(tokens));
    }
    if let Some(dir) = &args.sign_with_state_dir {
        let ring = hdsd::auth::KeyRing::load(dir, &[])
            .with_context(|| format!("cannot load the keys in {}", dir.display()))?;
        let now = chrono::Utc::now();
        let day = Duration::from_secs(86_400);
        let tokens = dps
            .iter()
            .map(|(mesh, name)| {
                ring.issue(mesh, name, day, day * 365, BTreeMap::new(), now)
                    .with_context(|| format!("cannot issue a token for {mesh}.{name}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        return Ok(Some(tokens));
    }
    Ok(None)
}

fn proc_sample(pid: Option<u32>) -> Option<sys::ProcSample> {
    pid.and_then(|p| sys::sample(Some(p)).ok())
}

/// CPU microseconds per event between two samples of one process.
fn cpu_us_per(
    before: Option<sys::ProcSample>,
    after: Option<sys::ProcSample>,
    events: usize,
) -> Value {
    match (before, after) {
        (Some(a), Some(b)) if events > 0 => {
            json!(round3(
                (b.cpu_seconds - a.cpu_seconds) / events as f64 * 1e6
            ))
        }
        _ => Value::Null,
    }
}

/// The server's resident memory every `every` for `duration`: (seconds since
/// the first sample, bytes).
async fn sample_rss(pid: Option<u32>, every: Duration, duration: Duration) -> Vec<(f64, u64)> {
    let start = Instant::now();
    let mut ticks = tokio::time::interval(every);
    let mut samples = Vec::new();
    loop {
        ticks.tick().await;
        if let Some(p) = proc_sample(pid) {
            samples.push((start.elapsed().as_secs_f64(), p.rss_bytes));
        }
        if start.elapsed() >= duration {
            return samples;
        }
    }
}

/// The soak's RSS curve and its growth: over the last hour (null when the
/// window is shorter), and over the window's second half.
fn rss_soak(samples: &[(f64, u64)]) -> Value {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Value::Null;
    };
    let growth =
        |from: &(f64, u64)| round3((last.1 as f64 - from.1 as f64) / from.1 as f64 * 100.0);
    let at = |t: f64| samples.iter().find(|s| s.0 >= t);
    let hour = 3600.0;
    json!({
        "samples": samples.len(),
        "first_mib": round3(first.1 as f64 / 1048576.0),
        "last_mib": round3(last.1 as f64 / 1048576.0),
        "max_mib": round3(samples.iter().map(|s| s.1).max().unwrap_or(0) as f64 / 1048576.0),
        "growth_last_hour_percent": if last.0 - first.0 >= hour {
            at(last.0 - hour).map(growth).map(Value::from).unwrap_or(Value::Null)
        } else {
            Value::Null
        },
        "growth_second_half_percent": at(first.0 + (last.0 - first.0) / 2.0).map(growth),
        "curve_s_mib": samples
            .iter()
            .map(|s| json!([round3(s.0), round3(s.1 as f64 / 1048576.0)]))
            .collect::<Vec<_>>(),
    })
}

/// Starts `n` consumers (`spawn(tally, stop, i)`), waits until they all
/// synced, then measures a window of `--duration` with the same flips as the
/// steady window: latency per flip per consumer, the server's CPU beside the
/// steady window's (`steady_cpu`, no consumers), its memory per consumer.
async fn consumer_phase(
    ctx: &Arc<Ctx>,
    args: &Args,
    steady_cpu: Option<f64>,
    what: &str,
    n: usize,
    mut spawn: impl FnMut(Arc<consumers::Tally>, watch::Receiver<bool>, usize),
) -> Value {
    let tally = Arc::new(consumers::Tally::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let before = proc_sample(args.server_pid);
    ctx.flips.set_recording(true);
    for i in 0..n {
        spawn(tally.clone(), stop_rx.clone(), i);
    }
    let synced_in = consumers::wait_synced(&tally, n, Duration::from_secs(120)).await;
    let connect_cpu = proc_sample(args.server_pid);
    // Let the first full states' buffers go before measuring memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let a = proc_sample(args.server_pid);
    let own0 = sys::sample(None).ok();
    let flips0 = ctx.flips.recorded();
    let t0 = Instant::now();
    tally.set_measuring(true);
    tokio::time::sleep(args.duration).await;
    tally.set_measuring(false);
    let window = t0.elapsed().as_secs_f64();
    let flips = ctx.flips.recorded() - flips0;
    let z = proc_sample(args.server_pid);
    let own1 = sys::sample(None).ok();
    // The last flips' events.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop_tx.send(true);
    ctx.flips.set_recording(false);
    let mut r = tally.json();
    let per = |x: f64| round3(x / n as f64);
    r[format!("{what}s")] = json!(n);
    r["all_synced_within_s"] = json!(synced_in.map(round3));
    r["window_s"] = json!(round3(window));
    r["flips_reported"] = json!(flips);
    // The loadgen's own CPU in the window: its Envoys and the consumers.
    r["loadgen_cpu_percent_of_one_core"] = match (own0, own1) {
        (Some(a), Some(z)) => json!(round3((z.cpu_seconds - a.cpu_seconds) / window * 100.0)),
        _ => Value::Null,
    };
    r["flips_per_s"] = json!(round3(flips as f64 / window));
    let expected = flips as f64 * n as f64;
    let samples = r["latency"]["samples"].as_f64().unwrap_or(0.0);
    r["flips_seen_fraction"] = if expected > 0.0 {
        json!(round3(samples / expected))
    } else {
        Value::Null
    };
    if let (Some(b), Some(c), Some(a), Some(z)) = (before, connect_cpu, a, z) {
        let cpu = (z.cpu_seconds - a.cpu_seconds) / window * 100.0;
        let rss = z.rss_bytes as f64 - b.rss_bytes as f64;
        r["server"] = json!({
            "rss_before_mib": round3(b.rss_bytes as f64 / 1048576.0),
            "rss_with_mib": round3(z.rss_bytes as f64 / 1048576.0),
            format!("rss_per_{what}_kib"): per(rss / 1024.0),
            "cpu_seconds_connect": round3(c.cpu_seconds - b.cpu_seconds),
            "cpu_percent_of_one_core_without": steady_cpu,
            "cpu_percent_of_one_core_with": round3(cpu),
            "cpu_percent_added": steady_cpu.map(|s| round3(cpu - s)),
            format!("cpu_percent_added_per_{what}"): steady_cpu.map(|s| per(cpu - s)),
        });
    }
    r
}

async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Rewrites dataplane files at `rate` changes per second, `count` changes in all.
async fn churn(
    ctx: &Arc<Ctx>,
    manifest: &Manifest,
    dir: &std::path::Path,
    count: usize,
    rate: f64,
) -> anyhow::Result<Value> {
    let mut churned: HashMap<usize, bool> = HashMap::new();
    let tick = Duration::from_millis(50);
    let mut ticker = tokio::time::interval(tick);
    let started = Instant::now();
    let mut done = 0usize;
    let mut budget = 0.0f64;
    let mut rng = rand::thread_rng();
    while done < count {
        ticker.tick().await;
        budget += rate * tick.as_secs_f64();
        let mut by_file: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        while budget >= 1.0 && done < count {
            budget -= 1.0;
            let index = rng.gen_range(0..manifest.count);
            if ctx.churn_pending.lock().unwrap().contains_key(&index)
                || by_file
                    .get(&manifest.file_of(index))
                    .is_some_and(|v| v.contains(&index))
            {
                continue;
            }
            let now_churned = !churned.get(&index).copied().unwrap_or(false);
            churned.insert(index, now_churned);
            by_file
                .entry(manifest.file_of(index))
                .or_default()
                .push(index);
            done += 1;
        }
        for (file, indexes) in by_file {
            let text = manifest.render_file(file, &churned);
            let name = manifest.file_name(file);
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text)?;
            let at = Instant::now();
            {
                let mut pending = ctx.churn_pending.lock().unwrap();
                for i in indexes {
                    let port = if churned[&i] {
                        CHURN_PORT_BASE
                    } else {
                        SERVICE_PORT_BASE
                    };
                    pending.insert(i, (port, at));
                }
            }
            std::fs::rename(&tmp, dir.join(&name))?;
        }
    }
    let written_in = started.elapsed();
    wait_until(Duration::from_secs(60), || {
        ctx.churn_pending.lock().unwrap().is_empty()
    })
    .await;
    let applied_in = started.elapsed();
    let lost = ctx.churn_pending.lock().unwrap().len();
    let latencies = ctx.churn_latencies.lock().unwrap().clone();
    Ok(json!({
        "changes": done,
        "requested_rate_per_s": rate,
        "written_rate_per_s": round3(done as f64 / written_in.as_secs_f64()),
        "applied": latencies.len(),
        "applied_rate_per_s": round3(latencies.len() as f64 / applied_in.as_secs_f64()),
        "not_applied_within_60s": lost,
        "push_latency": summary(&latencies),
    }))
}

pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::ensure!(
        args.hds.ip().is_loopback(),
        "--hds must be a loopback address"
    );
    anyhow::ensure!(
        args.streams_per_connection > 0,
        "--streams-per-connection must be > 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.flip_fraction),
        "--flip-fraction must be within 0..=1"
    );
    let nofile = sys::raise_nofile();
    let manifest = match &args.dataplanes_dir {
        Some(dir) => Some(Manifest::load(dir)?),
        None => None,
    };
    let (count, mesh, prefix, expect_clusters) = match (&manifest, args.count) {
        (Some(m), _) => (
            m.count,
            m.mesh.clone(),
            m.prefix.clone(),
            Some(usize::from(m.inbounds)),
        ),
        (None, Some(n)) => (n, args.mesh.clone(), args.prefix.clone(), None),
        (None, None) => anyhow::bail!("give --dataplanes-dir (from gen-dataplanes) or --count"),
    };
    anyhow::ensure!(count > 0, "no dataplanes");
    anyhow::ensure!(
        args.watchers == 0 || args.api.is_some(),
        "--watchers watch hdsd's API: give --api"
    );
    anyhow::ensure!(
        args.eds_subscribers == 0 || manifest.is_some(),
        "--eds-subscribers subscribe to the services of the dataplane files: give --dataplanes-dir"
    );
    anyhow::ensure!(
        args.churn == 0 || manifest.is_some(),
        "--churn rewrites dataplane files: give --dataplanes-dir"
    );
    let connections = count.div_ceil(args.streams_per_connection);
    anyhow::ensure!(
        (connections as u64) + 64 <= nofile,
        "{connections} connections need more file descriptors than RLIMIT_NOFILE allows ({nofile}); \
         raise the hard limit or use --streams-per-connection"
    );
    let names: Vec<(String, String)> = (0..count)
        .map(|i| {
            let name = match &manifest {
                Some(m) => m.name(i),
                None => format!("{prefix}{i:06}"),
            };
            (mesh.clone(), name)
        })
        .collect();
    let tokens = load_tokens(&args, &names)?;
    let sample_stride = if args.sample == 0 || args.api.is_none() || args.rate_unlimited {
        0
    } else {
        (count / args.sample).max(1)
    };
    let flips = |i: usize| {
        let f = args.flip_fraction;
        (i as f64 * f).floor() != ((i + 1) as f64 * f).floor()
    };
    let dps: Vec<Arc<Dp>> = names
        .into_iter()
        .enumerate()
        .map(|(i, (mesh, name))| {
            Arc::new(Dp {
                index: i,
                node_id: format!("{mesh}.{name}"),
                name,
                token: tokens.as_ref().map(|t| t[i].clone()),
                flips: flips(i),
                sample: sample_stride > 0
                    && i % sample_stride == 0
                    && i / sample_stride < args.sample,
                got_first: AtomicBool::new(false),
            })
        })
        .collect();

    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<Job>(1024);
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let timeouts = Arc::new(AtomicU64::new(0));
    let mut probers = Vec::new();
    let jobs = if sample_stride > 0 {
        let rx = Arc::new(Mutex::new(jobs_rx));
        for _ in 0..2 {
            let (api, mesh, rx, lat, to) = (
                args.api
                    .clone()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string(),
                mesh.clone(),
                rx.clone(),
                latencies.clone(),
                timeouts.clone(),
            );
            probers.push(std::thread::spawn(move || prober(api, mesh, rx, lat, to)));
        }
        Some(jobs_tx)
    } else {
        drop(jobs_tx);
        None
    };

    let (control, _) = watch::channel(Control::default());
    let ctx = Arc::new(Ctx {
        target: args.hds,
        mesh: mesh.clone(),
        expect_clusters,
        rate_unlimited: args.rate_unlimited,
        spread_reports: args.spread_reports,
        source_ips: args.source_ips,
        total: count,
        started: Instant::now(),
        control,
        connect_slots: Semaphore::new(args.connect_concurrency.max(1)),
        first_specifiers: AtomicUsize::new(0),
        all_first_at: Mutex::new(None),
        active: AtomicUsize::new(0),
        reports: AtomicU64::new(0),
        specifiers: AtomicU64::new(0),
        invalid: AtomicU64::new(0),
        invalid_examples: Mutex::new(Vec::new()),
        failures: Mutex::new(BTreeMap::new()),
        interval_ms: AtomicU64::new(0),
        measuring: AtomicBool::new(false),
        jobs,
        storm_target: AtomicUsize::new(usize::MAX),
        storm_served: AtomicUsize::new(0),
        storm_done_at: Mutex::new(None),
        storm_started: Mutex::new(None),
        storm_times: Mutex::new(Vec::new()),
        churn_pending: Mutex::new(HashMap::new()),
        churn_latencies: Mutex::new(Vec::new()),
        flips: Arc::new(consumers::Flips::default()),
    });

    // Phase 1: connect.
    let overflows_before = sys::listen_overflows();
    let baseline = proc_sample(args.server_pid);
    for (conn, chunk) in dps.chunks(args.streams_per_connection).enumerate() {
        tokio::spawn(run_group(chunk.to_vec(), conn, ctx.clone()));
    }
    let all = wait_until(args.connect_timeout, || {
        ctx.first_specifiers.load(Ordering::Acquire) == count
    })
    .await;
    let connect_time = ctx
        .all_first_at
        .lock()
        .unwrap()
        .map(|at| at.duration_since(ctx.started).as_secs_f64());
    if !all {
        eprintln!(
            "only {} of {count} dataplanes got a specifier within {:?}",
            ctx.first_specifiers.load(Ordering::Acquire),
            args.connect_timeout
        );
    }
    let after_connect = proc_sample(args.server_pid);
    let interval = Duration::from_millis(ctx.interval_ms.load(Ordering::Relaxed).max(1));

    // Phase 2: warm-up, then the steady window.
    tokio::time::sleep(args.warmup.unwrap_or(interval)).await;
    let s0 = (
        ctx.reports.load(Ordering::Relaxed),
        proc_sample(args.server_pid),
        sys::sample(None).ok(),
        Instant::now(),
    );
    ctx.measuring.store(true, Ordering::Relaxed);
    let rss_samples = match (args.rss_sample_every, args.server_pid) {
        (Some(every), Some(_)) => sample_rss(args.server_pid, every, args.duration).await,
        _ => {
            tokio::time::sleep(args.duration).await;
            Vec::new()
        }
    };
    ctx.measuring.store(false, Ordering::Relaxed);
    let s1 = (
        ctx.reports.load(Ordering::Relaxed),
        proc_sample(args.server_pid),
        sys::sample(None).ok(),
        Instant::now(),
    );
    let active_steady = ctx.active.load(Ordering::Acquire);
    let window = s1.3.duration_since(s0.3).as_secs_f64();
    let reports = s1.0 - s0.0;
    // Let the last timed flips finish.
    if ctx.jobs.is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let propagation = latencies.lock().unwrap().clone();

    let server = match (baseline, after_connect, s0.1, s1.1) {
        (Some(b), Some(c), Some(a), Some(z)) => {
            let cpu = (z.cpu_seconds - a.cpu_seconds) / window;
            let per_dp = if active_steady > 0 {
                (z.rss_bytes as f64 - b.rss_bytes as f64) / active_steady as f64
            } else {
                0.0
            };
            json!({
                "pid": args.server_pid,
                "rss_baseline_mib": round3(b.rss_bytes as f64 / 1048576.0),
                "rss_after_connect_mib": round3(c.rss_bytes as f64 / 1048576.0),
                "rss_steady_mib": round3(z.rss_bytes as f64 / 1048576.0),
                "rss_per_connected_dataplane_kib": round3(per_dp / 1024.0),
                "cpu_seconds_connect": round3(c.cpu_seconds - b.cpu_seconds),
                "cpu_seconds_steady": round3(z.cpu_seconds - a.cpu_seconds),
                "cpu_percent_of_one_core_steady": round3(cpu * 100.0),
                "cpu_us_per_report": if reports > 0 {
                    json!(round3((z.cpu_seconds - a.cpu_seconds) / reports as f64 * 1e6))
                } else {
                    Value::Null
                },
            })
        }
        _ => Value::Null,
    };
    let loadgen_cpu = match (s0.2, s1.2) {
        (Some(a), Some(z)) => json!(round3((z.cpu_seconds - a.cpu_seconds) / window * 100.0)),
        _ => Value::Null,
    };

    // Phase 2b: consumers, each kind for another steady window.
    let steady_cpu = server["cpu_percent_of_one_core_steady"].as_f64();
    let manifest_arc = manifest.clone().map(Arc::new);
    let watchers_result = if args.watchers > 0 {
        let api = args.api.clone().unwrap_or_default();
        let m = match &manifest_arc {
            Some(m) => m.clone(),
            None => Arc::new(Manifest {
                count,
                inbounds: 0,
                mesh: mesh.clone(),
                prefix: prefix.clone(),
                per_file: 1,
                services: 0,
            }),
        };
        Some(
            consumer_phase(
                &ctx,
                &args,
                steady_cpu,
                "watcher",
                args.watchers,
                |tally, stop, _| {
                    tokio::spawn(consumers::watcher(
                        api.trim_end_matches('/').to_string(),
                        m.clone(),
                        ctx.flips.clone(),
                        tally,
                        stop,
                    ));
                },
            )
            .await,
        )
    } else {
        None
    };
    let eds_result = match &manifest_arc {
        Some(m) if args.eds_subscribers > 0 => {
            let resources = m.eds_resource_names().len();
            let mut r = consumer_phase(
                &ctx,
                &args,
                steady_cpu,
                "subscriber",
                args.eds_subscribers,
                |tally, stop, n| {
                    let (m, ctx, hds) = (m.clone(), ctx.clone(), args.hds);
                    let source = sys::source_ip(n, ctx.source_ips);
                    tokio::spawn(async move {
                        match sys::connect(hds, source, Duration::from_secs(10)).await {
                            Ok(channel) => {
                                let node = format!("{}.front-{n:04}", m.mesh);
                                consumers::eds_subscriber(
                                    channel,
                                    node,
                                    m,
                                    ctx.flips.clone(),
                                    tally,
                                    stop,
                                )
                                .await
                            }
                            Err(e) => ctx.failure(format!("eds connect: {}", root_cause(&e))),
                        }
                    });
                },
            )
            .await;
            r["resources_subscribed"] = json!(resources);
            Some(r)
        }
        _ => None,
    };

    // Phase 3: churn.
    let churn_result = match (&manifest, &args.dataplanes_dir) {
        (Some(m), Some(dir)) if args.churn > 0 => {
            let cpu0 = proc_sample(args.server_pid);
            let at = Instant::now();
            let mut r = churn(&ctx, m, dir, args.churn, args.churn_rate).await?;
            if let (Some(a), Some(b)) = (cpu0, proc_sample(args.server_pid)) {
                let cpu = b.cpu_seconds - a.cpu_seconds;
                r["server_cpu_seconds"] = json!(round3(cpu));
                r["server_cpu_percent_of_one_core"] =
                    json!(round3(cpu / at.elapsed().as_secs_f64() * 100.0));
            }
            Some(r)
        }
        _ => None,
    };

    // Phase 4: reconnect storm.
    let storm = if args.reconnect_storm {
        let target = ctx.active.load(Ordering::Acquire);
        ctx.storm_served.store(0, Ordering::Release);
        ctx.storm_target.store(target, Ordering::Release);
        let cpu0 = proc_sample(args.server_pid);
        // The loadgen's own CPU too: on a machine it shares with the
        // server, how soon everyone is served again depends on both.
        let own0 = sys::sample(None).ok();
        let at = Instant::now();
        *ctx.storm_started.lock().unwrap() = Some(at);
        ctx.control.send_modify(|c| c.epoch += 1);
        let ok = wait_until(Duration::from_secs(120), || {
            ctx.storm_served.load(Ordering::Acquire) >= target
        })
        .await;
        let cpu1 = proc_sample(args.server_pid);
        let own1 = sys::sample(None).ok();
        let done = ctx
            .storm_done_at
            .lock()
            .unwrap()
            .map(|t| round3(t.duration_since(at).as_secs_f64()));
        Some(json!({
            "dataplanes": target,
            "served_again": ctx.storm_served.load(Ordering::Acquire),
            "all_served_within_s": if ok { json!(done) } else { Value::Null },
            "served_after": summary(&ctx.storm_times.lock().unwrap()),
            "server_cpu_seconds": match (cpu0, cpu1) {
                (Some(a), Some(b)) => json!(round3(b.cpu_seconds - a.cpu_seconds)),
                _ => Value::Null,
            },
            "server_cpu_us_per_reconnect": cpu_us_per(cpu0, cpu1, target),
            "loadgen_cpu_us_per_reconnect": cpu_us_per(own0, own1, target),
        }))
    } else {
        None
    };

    // Phase 5: settle: everyone reports healthy.
    ctx.control.send_modify(|c| c.settle = true);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let invalid = ctx.invalid.load(Ordering::Relaxed);
    let connected = ctx.active.load(Ordering::Acquire);
    let expected_rate = if args.rate_unlimited {
        Value::Null
    } else {
        json!(round3(active_steady as f64 / interval.as_secs_f64()))
    };
    let result = json!({
        "label": args.label,
        "machine": sys::machine(),
        "settings": {
            "dataplanes": count,
            "clusters_per_dataplane": expect_clusters,
            "streams_per_connection": args.streams_per_connection,
            "connections": connections,
            "report_interval_ms": interval.as_millis() as u64,
            "rate_unlimited": args.rate_unlimited,
            "spread_reports": args.spread_reports,
            "flip_fraction": args.flip_fraction,
            "duration_s": round3(window),
            "tokens": tokens.is_some(),
            "rlimit_nofile": nofile,
        },
        "connected": connected,
        "connected_steady": active_steady,
        "first_specifier_all_s": connect_time.map(round3),
        "specifiers_received": ctx.specifiers.load(Ordering::Relaxed),
        "invalid_specifiers": invalid,
        "invalid_examples": ctx.invalid_examples.lock().unwrap().clone(),
        "stream_failures": ctx.failures.lock().unwrap().clone(),
        "listen_queue_overflows": match (overflows_before, sys::listen_overflows()) {
            (Some(a), Some(b)) => json!(b - a),
            _ => Value::Null,
        },
        "reports_sent": reports,
        "reports_per_s": round3(reports as f64 / window),
        "expected_reports_per_s": expected_rate,
        "server": server,
        "loadgen_cpu_percent_of_one_core": loadgen_cpu,
        "readiness_propagation": if sample_stride > 0 {
            let mut s = summary(&propagation);
            s["timeouts_3s"] = json!(timeouts.load(Ordering::Relaxed));
            s["sampled_dataplanes"] = json!(dps.iter().filter(|d| d.sample).count());
            s
        } else { Value::Null },
        "watchers": watchers_result,
        "eds": eds_result,
        "churn": churn_result,
        "reconnect_storm": storm,
        "rss_soak": rss_soak(&rss_samples),
    });
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
        std::process::ExitCode::from(3)
    } else if !all {
        std::process::ExitCode::from(2)
    } else {
        std::process::ExitCode::SUCCESS
    })
}
