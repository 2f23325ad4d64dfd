//! The scenarios of one run, in the order `run` plays them: connect, the
//! steady window, the consumers (gRPC watchers, EDS subscribers),
//! definition churn, a reconnect storm, settle. Each returns its figures
//! (see `figures`); none is played unless its flags ask for it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng as _;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::figures::{self, ConsumerWindow, ServerSamples, Storm};
use super::fleet::{root_cause, run_group, Ctx, Dp, Probers};
use super::plan::Plan;
use super::Args;
use crate::consumers;
use crate::gen::{Manifest, CHURN_PORT_BASE, SERVICE_PORT_BASE};
use crate::stats::round3;
use crate::sys::{self, ProcSample};

pub(super) fn proc_sample(pid: Option<u32>) -> Option<ProcSample> {
    pid.and_then(|p| sys::sample(Some(p)).ok())
}

pub(super) async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
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

/// What the connect phase left.
pub(super) struct Connected {
    /// Every dataplane got its first specifier within `--connect-timeout`.
    pub all: bool,
    /// Seconds from the start until the last of them did.
    pub first_specifier_all: Option<f64>,
    pub overflows_before: Option<u64>,
    pub baseline: Option<ProcSample>,
    pub after: Option<ProcSample>,
    /// The report interval the specifiers ask for.
    pub interval: Duration,
}

/// Connects every simulated Envoy and waits for their first specifiers.
pub(super) async fn connect(ctx: &Arc<Ctx>, args: &Args, dps: &[Arc<Dp>]) -> Connected {
    let overflows_before = sys::listen_overflows();
    let baseline = proc_sample(args.server_pid);
    for (conn, chunk) in dps.chunks(args.streams_per_connection).enumerate() {
        tokio::spawn(run_group(chunk.to_vec(), conn, ctx.clone()));
    }
    let count = ctx.total;
    let all = wait_until(args.connect_timeout, || {
        ctx.first_specifiers.load(Ordering::Acquire) == count
    })
    .await;
    let first_specifier_all = ctx
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
    Connected {
        all,
        first_specifier_all,
        overflows_before,
        baseline,
        after: proc_sample(args.server_pid),
        interval: Duration::from_millis(ctx.interval_ms.load(Ordering::Relaxed).max(1)),
    }
}

/// Turns callgrind's counting in process `pid` `on` or `off`
/// (`--instrument-pid`); says on stderr when it cannot.
fn instrument(pid: Option<u32>, on_off: &str) {
    let Some(pid) = pid else { return };
    let done = std::process::Command::new("callgrind_control")
        .args(["-i", on_off, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status();
    if !matches!(done, Ok(s) if s.success()) {
        eprintln!(
            "callgrind_control -i {on_off} {pid} failed ({done:?}): is the server under callgrind?"
        );
    }
}

/// What the steady window measured.
pub(super) struct Steady {
    pub window: f64,
    pub reports: u64,
    /// Streams holding a specifier at the window's end.
    pub active: usize,
    pub server: Value,
    pub loadgen_cpu: Value,
    /// Seconds from each timed flip's report until the API showed it.
    pub propagation: Vec<f64>,
    pub rss_samples: Vec<(f64, u64)>,
}

/// Warm-up, then the steady window: reports, the server's CPU and memory,
/// readiness propagation, and with `--rss-sample-every` the soak's curve.
pub(super) async fn steady(
    ctx: &Ctx,
    args: &Args,
    connected: &Connected,
    probers: &Probers,
) -> Steady {
    tokio::time::sleep(args.warmup.unwrap_or(connected.interval)).await;
    instrument(args.instrument_pid, "on");
    let (reports0, server0, own0, t0) = (
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
    let (reports1, server1, own1, t1) = (
        ctx.reports.load(Ordering::Relaxed),
        proc_sample(args.server_pid),
        sys::sample(None).ok(),
        Instant::now(),
    );
    instrument(args.instrument_pid, "off");
    let active = ctx.active.load(Ordering::Acquire);
    let window = t1.duration_since(t0).as_secs_f64();
    let reports = reports1 - reports0;
    // Let the last timed flips finish.
    if ctx.jobs.is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let samples = ServerSamples {
        baseline: connected.baseline,
        after_connect: connected.after,
        steady_start: server0,
        steady_end: server1,
    };
    Steady {
        window,
        reports,
        active,
        server: figures::server_steady(args.server_pid, samples, window, reports, active),
        loadgen_cpu: figures::cpu_percent(own0, own1, window),
        propagation: probers.latencies.lock().unwrap().clone(),
        rss_samples,
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

/// `--watchers` gRPC watchers on `--api`, for another steady window.
pub(super) async fn watchers(
    ctx: &Arc<Ctx>,
    args: &Args,
    plan: &Plan,
    manifest: Option<&Arc<Manifest>>,
    steady_cpu: Option<f64>,
) -> Option<Value> {
    if args.watchers == 0 {
        return None;
    }
    let api = args.api.clone().unwrap_or_default();
    let m = match manifest {
        Some(m) => m.clone(),
        None => Arc::new(Manifest {
            count: plan.count,
            inbounds: 0,
            mesh: plan.mesh.clone(),
            prefix: plan.prefix.clone(),
            per_file: 1,
            services: 0,
        }),
    };
    let spawn = |tally, stop, _| {
        tokio::spawn(consumers::watcher(
            api.trim_end_matches('/').to_string(),
            m.clone(),
            ctx.flips.clone(),
            tally,
            stop,
        ));
    };
    Some(consumer_phase(ctx, args, steady_cpu, "watcher", args.watchers, spawn).await)
}

/// `--eds-subscribers` front Envoys on `--hds`, subscribed to every service
/// of the dataplane files, for another steady window.
pub(super) async fn eds_subscribers(
    ctx: &Arc<Ctx>,
    args: &Args,
    manifest: Option<&Arc<Manifest>>,
    steady_cpu: Option<f64>,
) -> Option<Value> {
    let m = match manifest {
        Some(m) if args.eds_subscribers > 0 => m,
        _ => return None,
    };
    let resources = m.eds_resource_names().len();
    let spawn = |tally, stop, n| {
        let (m, ctx, hds) = (m.clone(), ctx.clone(), args.hds[0]);
        let source = sys::source_ip(n, ctx.source_ips);
        tokio::spawn(async move {
            match sys::connect(hds, source, Duration::from_secs(10)).await {
                Ok(channel) => {
                    let node = format!("{}.front-{n:04}", m.mesh);
                    consumers::eds_subscriber(channel, node, m, ctx.flips.clone(), tally, stop)
                        .await
                }
                Err(e) => ctx.failure(format!("eds connect: {}", root_cause(&e))),
            }
        });
    };
    let n = args.eds_subscribers;
    let mut r = consumer_phase(ctx, args, steady_cpu, "subscriber", n, spawn).await;
    r["resources_subscribed"] = json!(resources);
    Some(r)
}

/// Starts `n` consumers (`spawn(tally, stop, i)`), waits until they all
/// synced, then measures a window of `--duration` with the same flips as the
/// steady window: latency per flip per consumer, the server's CPU beside the
/// steady window's (`steady_cpu`, no consumers), its memory per consumer.
async fn consumer_phase(
    ctx: &Ctx,
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
    let w = ConsumerWindow {
        what,
        n,
        synced_in,
        window,
        flips,
        own: (own0, own1),
        server: [before, connect_cpu, a, z],
        steady_cpu,
    };
    figures::consumer_figures(tally.json(), &w)
}

/// `--churn` definition changes at `--churn-rate`, and the server's CPU
/// meanwhile.
pub(super) async fn churn(
    ctx: &Ctx,
    args: &Args,
    manifest: Option<&Manifest>,
) -> anyhow::Result<Option<Value>> {
    let (Some(m), Some(dir)) = (manifest, &args.dataplanes_dir) else {
        return Ok(None);
    };
    if args.churn == 0 {
        return Ok(None);
    }
    let cpu0 = proc_sample(args.server_pid);
    let at = Instant::now();
    let mut r = rewrite_files(ctx, m, dir, args.churn, args.churn_rate).await?;
    if let (Some(a), Some(b)) = (cpu0, proc_sample(args.server_pid)) {
        let cpu = b.cpu_seconds - a.cpu_seconds;
        r["server_cpu_seconds"] = json!(round3(cpu));
        r["server_cpu_percent_of_one_core"] =
            json!(round3(cpu / at.elapsed().as_secs_f64() * 100.0));
    }
    Ok(Some(r))
}

/// Rewrites dataplane files at `rate` changes per second, `count` changes in
/// all, then waits (at most a minute) until every change reached its Envoy.
async fn rewrite_files(
    ctx: &Ctx,
    manifest: &Manifest,
    dir: &Path,
    count: usize,
    rate: f64,
) -> anyhow::Result<Value> {
    let mut churned: HashMap<usize, bool> = HashMap::new();
    let tick = Duration::from_millis(50);
    let mut ticker = tokio::time::interval(tick);
    let started = Instant::now();
    let mut done = 0usize;
    let mut budget = 0.0f64;
    while done < count {
        ticker.tick().await;
        budget += rate * tick.as_secs_f64();
        let by_file = pick_changes(ctx, manifest, &mut churned, &mut budget, &mut done, count);
        for (file, indexes) in by_file {
            write_file(ctx, manifest, dir, file, &indexes, &churned)?;
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
    Ok(figures::churn_figures(
        done,
        rate,
        written_in.as_secs_f64(),
        applied_in.as_secs_f64(),
        lost,
        &latencies,
    ))
}

/// One tick's changes, as many as the budget allows: random dataplanes
/// with no change in flight, flipped between their two service ports,
/// grouped by file.
fn pick_changes(
    ctx: &Ctx,
    manifest: &Manifest,
    churned: &mut HashMap<usize, bool>,
    budget: &mut f64,
    done: &mut usize,
    count: usize,
) -> BTreeMap<usize, Vec<usize>> {
    let mut rng = rand::thread_rng();
    let mut by_file: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    while *budget >= 1.0 && *done < count {
        *budget -= 1.0;
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
        *done += 1;
    }
    by_file
}

/// Writes one file anew (atomically, by a rename), its changed dataplanes
/// pending until their Envoys get the new port.
fn write_file(
    ctx: &Ctx,
    manifest: &Manifest,
    dir: &Path,
    file: usize,
    indexes: &[usize],
    churned: &HashMap<usize, bool>,
) -> std::io::Result<()> {
    let text = manifest.render_file(file, churned);
    let name = manifest.file_name(file);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    let at = Instant::now();
    {
        let mut pending = ctx.churn_pending.lock().unwrap();
        for i in indexes {
            let port = if churned[i] {
                CHURN_PORT_BASE
            } else {
                SERVICE_PORT_BASE
            };
            pending.insert(*i, (port, at));
        }
    }
    std::fs::rename(&tmp, dir.join(&name))
}

/// `--reconnect-storm`: every stream and connection dropped at once; how
/// soon all are served again, and at what CPU cost.
pub(super) async fn reconnect_storm(ctx: &Ctx, args: &Args) -> Option<Value> {
    if !args.reconnect_storm {
        return None;
    }
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
        .map(|t| t.duration_since(at).as_secs_f64());
    Some(figures::storm_figures(&Storm {
        target,
        served_again: ctx.storm_served.load(Ordering::Acquire),
        all_served_within: if ok { done } else { None },
        served_after: ctx.storm_times.lock().unwrap().clone(),
        server: (cpu0, cpu1),
        own: (own0, own1),
    }))
}

/// Everyone reports healthy from now on.
pub(super) async fn settle(ctx: &Ctx) {
    ctx.control.send_modify(|c| c.settle = true);
    tokio::time::sleep(Duration::from_millis(500)).await;
}
