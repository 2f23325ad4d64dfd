//! The simulated Envoys: one task per connection, one per dataplane
//! stream on it, each speaking HDS as Envoy 1.40 does (reports on the
//! specifier's interval, Envoy's retry backoff), and the probers that time
//! flips against hdsd's API. Everything they count lives in [`Ctx`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use envoy_types::pb::envoy::service::health::v3::health_discovery_service_client::HealthDiscoveryServiceClient;
use envoy_types::pb::envoy::service::health::v3::HealthCheckSpecifier;
use rand::Rng as _;
use serde_json::Value;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use super::plan::Plan;
use super::Args;
use crate::consumers;
use crate::envoy::{self, Message, ReportPlan};
use crate::sys;

/// One simulated Envoy.
#[derive(Debug)]
pub(super) struct Dp {
    pub(super) index: usize,
    pub(super) name: String,
    pub(super) node_id: String,
    pub(super) token: Option<String>,
    /// Its first endpoint flips every report.
    pub(super) flips: bool,
    /// Its flips are timed against the API.
    pub(super) sample: bool,
    pub(super) got_first: AtomicBool,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Control {
    /// Bumped by a reconnect storm: every connection is dropped and made again.
    pub(super) epoch: u64,
    /// Report everything healthy from now on.
    pub(super) settle: bool,
    pub(super) stop: bool,
}

/// A flip to time: the report with `expect` for `endpoint` left at `sent`.
pub(super) struct Job {
    pub(super) name: String,
    pub(super) endpoint: SocketAddr,
    pub(super) expect: &'static str,
    pub(super) sent: Instant,
}

pub(super) struct Ctx {
    /// The HDS servers, as an Envoy's bootstrap lists them: each simulated
    /// Envoy connects to the first; with several, a failed stream moves it
    /// to another ([`run_group`]).
    pub(super) targets: Vec<SocketAddr>,
    pub(super) mesh: String,
    pub(super) expect_clusters: Option<usize>,
    pub(super) rate_unlimited: bool,
    pub(super) spread_reports: bool,
    pub(super) source_ips: usize,
    pub(super) total: usize,
    pub(super) started: Instant,
    pub(super) control: watch::Sender<Control>,
    pub(super) connect_slots: Semaphore,
    pub(super) first_specifiers: AtomicUsize,
    pub(super) all_first_at: Mutex<Option<Instant>>,
    /// Streams that hold a valid specifier now.
    pub(super) active: AtomicUsize,
    pub(super) reports: AtomicU64,
    pub(super) specifiers: AtomicU64,
    pub(super) invalid: AtomicU64,
    pub(super) invalid_examples: Mutex<Vec<String>>,
    pub(super) failures: Mutex<BTreeMap<String, u64>>,
    pub(super) interval_ms: AtomicU64,
    pub(super) measuring: AtomicBool,
    pub(super) jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    pub(super) storm_target: AtomicUsize,
    pub(super) storm_served: AtomicUsize,
    pub(super) storm_done_at: Mutex<Option<Instant>>,
    pub(super) storm_started: Mutex<Option<Instant>>,
    pub(super) storm_times: Mutex<Vec<f64>>,
    pub(super) churn_pending: Mutex<HashMap<usize, (u16, Instant)>>,
    pub(super) churn_latencies: Mutex<Vec<f64>>,
    /// Flips timed against watchers and EDS subscribers.
    pub(super) flips: Arc<consumers::Flips>,
}

impl Ctx {
    /// The shared counters of a run, before anything connected.
    pub(super) fn new(
        args: &Args,
        plan: &Plan,
        jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    ) -> Ctx {
        let (control, _) = watch::channel(Control::default());
        Ctx {
            targets: args.hds.clone(),
            mesh: plan.mesh.clone(),
            expect_clusters: plan.expect_clusters,
            rate_unlimited: args.rate_unlimited,
            spread_reports: args.spread_reports,
            source_ips: args.source_ips,
            total: plan.count,
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
        }
    }

    pub(super) fn failure(&self, reason: String) {
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

/// The simulated Envoys: `names` in order, each with its token, flipping
/// and timed as the plan says.
pub(super) fn dataplanes(
    plan: &Plan,
    names: Vec<(String, String)>,
    tokens: Option<&Vec<String>>,
    flip_fraction: f64,
    sample: usize,
) -> Vec<Arc<Dp>> {
    names
        .into_iter()
        .enumerate()
        .map(|(i, (mesh, name))| {
            Arc::new(Dp {
                index: i,
                node_id: format!("{mesh}.{name}"),
                name,
                token: tokens.map(|t| t[i].clone()),
                flips: super::plan::flips(i, flip_fraction),
                sample: super::plan::sampled(i, plan.sample_stride, sample),
                got_first: AtomicBool::new(false),
            })
        })
        .collect()
}

/// The threads that time flips against hdsd's API, and what they measured.
pub(super) struct Probers {
    pub(super) latencies: Arc<Mutex<Vec<f64>>>,
    pub(super) timeouts: Arc<AtomicU64>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
}

impl Probers {
    /// Two probers on `--api` when flips are timed (`plan.sample_stride > 0`),
    /// and the sender the streams give them their jobs on.
    pub(super) fn start(
        args: &Args,
        plan: &Plan,
    ) -> (Probers, Option<std::sync::mpsc::SyncSender<Job>>) {
        let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<Job>(1024);
        let mut probers = Probers {
            latencies: Arc::new(Mutex::new(Vec::new())),
            timeouts: Arc::new(AtomicU64::new(0)),
            threads: Vec::new(),
        };
        if plan.sample_stride == 0 {
            drop(jobs_tx);
            return (probers, None);
        }
        let rx = Arc::new(Mutex::new(jobs_rx));
        for _ in 0..2 {
            let (api, mesh, rx, lat, to) = (
                args.api
                    .clone()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string(),
                plan.mesh.clone(),
                rx.clone(),
                probers.latencies.clone(),
                probers.timeouts.clone(),
            );
            probers
                .threads
                .push(std::thread::spawn(move || prober(api, mesh, rx, lat, to)));
        }
        (probers, Some(jobs_tx))
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

/// Envoy's backoff between attempts of its HDS stream: jittered
/// exponential, from 1 s up to 30 s, reset once a stream is served.
#[derive(Debug, Default)]
pub(super) struct EnvoyBackoff {
    attempts: u32,
}

impl EnvoyBackoff {
    const BASE_MS: u64 = 1_000;
    const MAX_MS: u64 = 30_000;

    /// The longest the next wait may be; the wait is drawn below it.
    pub(super) fn ceiling(&self) -> Duration {
        let ms = Self::BASE_MS
            .saturating_mul(1u64 << self.attempts.min(16))
            .min(Self::MAX_MS);
        Duration::from_millis(ms)
    }

    pub(super) fn next(&mut self) -> Duration {
        let ceiling = self.ceiling().as_millis() as u64;
        self.attempts = self.attempts.saturating_add(1);
        Duration::from_millis(rand::thread_rng().gen_range(0..ceiling))
    }

    pub(super) fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// The server an Envoy tries after `current` failed: another of the `n`,
/// at random (Envoy's balancer over the hdsd cluster's hosts, which a fleet
/// lists in different orders: the survivors share a dead one's Envoys).
pub(super) fn next_server(current: usize, n: usize) -> usize {
    match n {
        0 | 1 => 0,
        _ => (current + rand::thread_rng().gen_range(1..n)) % n,
    }
}

/// One connection and the dataplanes multiplexed on it; reconnects on a
/// storm. With several servers, a failed stream or connect moves the
/// connection to another server after Envoy's backoff, as an Envoy whose
/// instance died does.
pub(super) async fn run_group(dps: Vec<Arc<Dp>>, conn: usize, ctx: Arc<Ctx>) {
    let mut control = ctx.control.subscribe();
    let failover = ctx.targets.len() > 1;
    let mut server = 0;
    let mut backoff = EnvoyBackoff::default();
    loop {
        let c = *control.borrow_and_update();
        if c.stop {
            return;
        }
        let epoch = c.epoch;
        let channel = loop {
            let permit = ctx.connect_slots.acquire().await;
            let source = sys::source_ip(conn, ctx.source_ips);
            match sys::connect(ctx.targets[server], source, Duration::from_secs(10)).await {
                Ok(ch) => break ch,
                Err(e) => {
                    drop(permit);
                    ctx.failure(format!("connect: {}", root_cause(&e)));
                    let wait = match failover {
                        true => {
                            server = next_server(server, ctx.targets.len());
                            backoff.next()
                        }
                        false => Duration::from_millis(rand::thread_rng().gen_range(100..1000)),
                    };
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
            set.spawn(run_dp(
                channel.clone(),
                dp.clone(),
                ctx.clone(),
                epoch,
                failover,
            ));
        }
        drop(channel);
        let (mut failed, mut served) = (false, false);
        while let Some(ended) = set.join_next().await {
            if let Ok(ended) = ended {
                failed |= ended.failed;
                served |= ended.served;
            }
        }
        if served {
            backoff.reset();
        }
        if failed {
            server = next_server(server, ctx.targets.len());
            tokio::select! {
                () = tokio::time::sleep(backoff.next()) => {}
                () = leave(&mut control, epoch) => {}
            }
        }
    }
}

pub(super) fn root_cause(e: &anyhow::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s = inner.to_string();
        source = inner.source();
    }
    s
}

/// How one dataplane's streams on a connection ended.
pub(super) struct DpEnded {
    /// A stream failed and the dataplane left to try another server.
    failed: bool,
    /// A stream got a specifier.
    served: bool,
}

/// `dp`'s HDS streams on `channel` until the epoch ends or the run stops;
/// a failed stream is retried on the same connection after Envoy's backoff,
/// or, with `failover`, ends this so that the connection moves.
pub(super) async fn run_dp(
    channel: Channel,
    dp: Arc<Dp>,
    ctx: Arc<Ctx>,
    epoch: u64,
    failover: bool,
) -> DpEnded {
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
            End::Leave => {
                return DpEnded {
                    failed: false,
                    served: served_this_epoch,
                }
            }
            End::Failed(reason) => {
                ctx.failure(reason);
                if failover {
                    return DpEnded {
                        failed: true,
                        served: served_this_epoch,
                    };
                }
                // Envoy's HDS retry: jittered backoff from a 1 s base, reset per stream.
                let wait = Duration::from_millis(rand::thread_rng().gen_range(0..1000));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = leave(&mut control, epoch) => {
                        return DpEnded {
                            failed: false,
                            served: served_this_epoch,
                        }
                    }
                }
            }
        }
    }
}

/// One HDS stream of `dp` until it fails, the epoch ends or the run stops.
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
    let mut stream = Stream::new(control.borrow().settle);
    loop {
        let due = stream.next_report;
        let report_due = async move {
            match due {
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
                if c.settle && !stream.settled {
                    if let Err(end) = stream.settle(&tx, ctx).await {
                        return end;
                    }
                }
            }
            msg = inbound.message() => match msg {
                Ok(Some(spec)) => stream.specifier(&spec, dp, ctx, epoch, served_this_epoch),
                Ok(None) => return End::Failed("closed by the server (OK)".into()),
                Err(status) => return End::Failed(format!("{:?}", status.code())),
            },
            () = report_due, if !ctx.rate_unlimited => {
                if let Err(end) = stream.report(&tx, dp, ctx).await {
                    return end;
                }
            }
            permit = tx.reserve(), if ctx.rate_unlimited && stream.plan.is_some() => {
                let Ok(permit) = permit else {
                    return End::Failed("request stream closed".into());
                };
                if let Some(p) = &stream.plan {
                    permit.send(p.message(true));
                    ctx.reports.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// What one open stream has received and sent.
struct Stream<'a> {
    /// The reports the last valid specifier asks for.
    plan: Option<ReportPlan>,
    next_report: Option<tokio::time::Instant>,
    /// Held while the stream has a valid specifier.
    active: Option<ActiveGuard<'a>>,
    sent: u64,
    /// The first endpoint's health in the last report.
    last_first: Option<bool>,
    /// Everything is reported healthy from now on.
    settled: bool,
}

impl<'a> Stream<'a> {
    fn new(settled: bool) -> Stream<'a> {
        Stream {
            plan: None,
            next_report: None,
            active: None,
            sent: 0,
            last_first: None,
            settled,
        }
    }

    /// The run settles: one all-healthy report now.
    async fn settle(&mut self, tx: &mpsc::Sender<Message>, ctx: &Ctx) -> Result<(), End> {
        self.settled = true;
        if let Some(p) = &self.plan {
            if tx.send(p.message(true)).await.is_err() {
                return Err(End::Failed("request stream closed".into()));
            }
            ctx.reports.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A specifier arrived: Envoy applies it unless it is invalid.
    fn specifier(
        &mut self,
        spec: &HealthCheckSpecifier,
        dp: &Dp,
        ctx: &'a Ctx,
        epoch: u64,
        served_this_epoch: &mut bool,
    ) {
        ctx.specifiers.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = envoy::validate(spec, ctx.expect_clusters) {
            // Envoy rejects it and keeps its clusters.
            ctx.invalid(dp, e);
            return;
        }
        let p = ReportPlan::new(spec);
        ctx.interval_ms
            .store(p.interval.as_millis() as u64, Ordering::Relaxed);
        ctx.churn_arrived(dp.index, &p);
        if self.active.is_none() {
            ctx.active.fetch_add(1, Ordering::AcqRel);
            self.active = Some(ActiveGuard(&ctx.active));
        }
        ctx.first_specifier(dp);
        if epoch > 0 && !*served_this_epoch {
            *served_this_epoch = true;
            ctx.storm_served();
        }
        // Envoy restarts its report timer only when the interval changes.
        if self.plan.as_ref().map(|q| q.interval) != Some(p.interval) {
            let phase = if ctx.spread_reports {
                // A fixed phase per dataplane, spread evenly.
                p.interval.mul_f64((dp.index as f64 * 0.618_034).fract())
            } else {
                Duration::ZERO
            };
            self.next_report = Some(tokio::time::Instant::now() + p.interval + phase);
        }
        self.plan = Some(p);
    }

    /// The report timer fired: one report, flipped if this dataplane flips.
    async fn report(&mut self, tx: &mpsc::Sender<Message>, dp: &Dp, ctx: &Ctx) -> Result<(), End> {
        let Some(p) = &self.plan else { return Ok(()) };
        let flipping = (dp.flips || dp.sample) && !self.settled;
        let healthy = !flipping || self.sent.is_multiple_of(2);
        let msg = p.message(healthy);
        let at = Instant::now();
        let flipped = self.last_first.is_some_and(|l| l != healthy);
        if flipping && flipped {
            ctx.flips.record(dp.index, healthy, at);
        }
        if tx.send(msg).await.is_err() {
            return Err(End::Failed("request stream closed".into()));
        }
        ctx.reports.fetch_add(1, Ordering::Relaxed);
        self.sent += 1;
        if dp.sample && flipped && ctx.measuring.load(Ordering::Relaxed) {
            if let (Some(jobs), Some(endpoint)) = (&ctx.jobs, p.first) {
                let _ = jobs.try_send(Job {
                    name: dp.name.clone(),
                    endpoint,
                    expect: envoy::api_status(healthy),
                    sent: at,
                });
            }
        }
        self.last_first = Some(healthy);
        let now = tokio::time::Instant::now();
        let mut next = self.next_report.unwrap_or(now) + p.interval;
        if next < now {
            next = now + p.interval;
        }
        self.next_report = Some(next);
        Ok(())
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
pub(super) fn inbound_status(dp: &Value, endpoint: SocketAddr) -> Option<String> {
    dp["inbounds"].as_array()?.iter().find_map(|i| {
        let port = i["servicePort"].as_u64()?;
        let ip = i["serviceAddress"].as_str()?;
        (port == u64::from(endpoint.port()) && ip == endpoint.ip().to_string())
            .then(|| i["health"]["status"].as_str().map(str::to_string))?
    })
}

/// The tokens the simulated Envoys present, in dataplane order: read from
/// `--token-file`, or issued with the key ring in `--sign-with-state-dir`.
pub(super) fn load_tokens(
    args: &Args,
    dps: &[(String, String)],
) -> anyhow::Result<Option<Vec<String>>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_backoff_doubles_from_one_second_to_thirty_and_resets() {
        let mut b = EnvoyBackoff::default();
        let ceilings: Vec<u64> = (0..7)
            .map(|_| {
                let ceiling = b.ceiling();
                assert!(b.next() < ceiling);
                ceiling.as_millis() as u64
            })
            .collect();
        assert_eq!(
            ceilings,
            [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn a_failed_server_is_left_for_another() {
        assert_eq!(next_server(0, 1), 0);
        let mut seen = [0; 8];
        for _ in 0..1000 {
            let next = next_server(3, 8);
            assert_ne!(next, 3);
            seen[next] += 1;
        }
        // Every other server takes a share of the dead one's Envoys.
        assert!(
            seen.iter().enumerate().all(|(i, &n)| i == 3 || n > 50),
            "{seen:?}"
        );
    }
}
