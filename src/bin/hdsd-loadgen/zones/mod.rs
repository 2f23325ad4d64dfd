//! `zones`: N simulated zones against a global hdsd's zone listener, each
//! speaking `zone.proto` as a zone hdsd does (hdsd's own zone state machine,
//! fed by simulated dataplanes instead of a registry), and what the global
//! does with them.
//!
//! Phases, each bounded in time:
//! 1. connect: every zone dials, is accepted and sends its snapshot; until
//!    the global acknowledged every snapshot and `ListZones` shows every
//!    dataplane;
//! 2. steady window: flips (one inbound's readiness) at a rate per zone,
//!    heartbeats at the global's interval; gRPC watchers of the global's
//!    readiness API time each change until its event; the global's CPU and
//!    memory;
//! 3. resume (`--outage`): zone 1's stream is dropped for the outage while
//!    it keeps changing, then it reconnects and resumes: bytes and time to
//!    the global's Ack, against the same zone reconnecting for a snapshot;
//! 4. storm (`--storm`): every zone drops its stream at once and reconnects
//!    after a delay drawn as a zone's first backoff (full jitter below 1 s):
//!    the time until the global accepted them all.
//!
//! - `sim`: a zone's dataplanes and change feed (pure);
//! - `link`: one zone's stream, driving hdsd's `Uplink` machine;
//! - `watch`: the watchers and `ListZones`.

mod link;
mod sim;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdsd::zones::zone::backoff::Backoff;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::consumers::{wait_synced, Flips, Tally};
use crate::stats::{round3, summary, table};
use crate::sys;
use link::{Cmd, Kind, Link, Shared, StreamRecord};
use sim::{zone_name, Shape, SimZone};

/// The target of the change -> visible latency at a global watcher (p99).
const VISIBLE_P99_TARGET_MS: f64 = 250.0;

/// What a reconnect storm may take beyond the zones' first backoff delay.
const STORM_SLACK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The global's zone listener (`global.listen`; loopback only).
    #[arg(long, default_value = "127.0.0.1:5682")]
    pub global: SocketAddr,
    /// The global's API (gRPC on the API listener), e.g. http://127.0.0.1:5680 (loopback only).
    #[arg(long)]
    pub api: String,
    /// The global's state_dir: each zone's token is issued with its keys.
    #[arg(long)]
    pub sign_with_state_dir: PathBuf,
    /// The global's process id: its CPU time and resident memory are measured.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Simulated zones.
    #[arg(long, default_value_t = 10)]
    pub zones: usize,
    /// Dataplanes per zone.
    #[arg(long, default_value_t = 10_000)]
    pub dataplanes: usize,
    /// Inbounds per dataplane.
    #[arg(long, default_value_t = 2)]
    pub inbounds: usize,
    /// Services each zone's dataplanes are spread over.
    #[arg(long, default_value_t = 500)]
    pub services: usize,
    /// Readiness flips per second per zone (one inbound each); 0: none.
    #[arg(long, default_value_t = 50.0)]
    pub flips_per_s: f64,
    /// Zone names: <prefix>01, <prefix>02, ...
    #[arg(long, default_value = "lz-")]
    pub zone_prefix: String,
    #[arg(long, default_value = "default")]
    pub mesh: String,
    /// Changes a zone can replay on a resume (hdsd keeps 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub history: u64,
    /// gRPC watchers of the global's readiness API.
    #[arg(long, default_value_t = 1)]
    pub watchers: usize,
    /// How long every zone may take to be accepted and get its snapshot acknowledged.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Wait after the watchers synced, flipping, before measuring.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// The steady measurement window.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// After the steady window: zone 1 is away this long, then resumes (0s: no resume test).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub outage: Duration,
    /// After the resume test: every zone drops and reconnects at once.
    #[arg(long)]
    pub storm: bool,
    #[arg(long)]
    pub label: Option<String>,
    /// Print the results as one line of JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The address of an `http://host:port` URL, when it is a loopback one.
fn loopback_url(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--api {url}: write it as http://127.0.0.1:PORT"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let addr: SocketAddr = authority
        .parse()
        .with_context(|| format!("--api {url}: write it as http://127.0.0.1:PORT"))?;
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "the loadgen only targets loopback addresses, not {addr}"
    );
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.global.ip().is_loopback(),
        "the loadgen only targets loopback addresses, not {}",
        args.global
    );
    loopback_url(&args.api)?;
    anyhow::ensure!(args.zones > 0, "--zones must be at least 1");
    anyhow::ensure!(
        args.flips_per_s >= 0.0 && args.flips_per_s.is_finite(),
        "--flips-per-s must be a number >= 0"
    );
    sys::raise_nofile();
    let ring = hdsd::auth::KeyRing::load(&args.sign_with_state_dir, &[]).with_context(|| {
        format!(
            "cannot load the keys in {}",
            args.sign_with_state_dir.display()
        )
    })?;
    let day = Duration::from_secs(86_400);
    let names: Vec<String> = (0..args.zones)
        .map(|z| zone_name(&args.zone_prefix, z))
        .collect();
    let tokens = names
        .iter()
        .map(|z| {
            ring.issue_zone(
                z,
                std::slice::from_ref(&args.mesh),
                day,
                day * 365,
                chrono::Utc::now(),
            )
            .with_context(|| format!("cannot issue a zone token for {z}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let server = |what: &str| {
        args.server_pid.and_then(|p| match sys::sample(Some(p)) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("warning: cannot sample the global ({what}): {e}");
                None
            }
        })
    };
    let before = server("before");

    let flips = Arc::new(Flips::default());
    let shared = Arc::new(Shared::default());
    let epoch = chrono::Utc::now().timestamp_micros().max(1) as u64;
    let shape = Shape {
        dataplanes: args.dataplanes,
        inbounds: args.inbounds,
        services: args.services,
        history: args.history,
    };
    let flip_every =
        (args.flips_per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / args.flips_per_s));
    let now = prost_types::Timestamp::from(std::time::SystemTime::now());
    let mut cmds = Vec::new();
    let mut tasks = Vec::new();
    let start = Instant::now();
    for (z, (name, token)) in names.iter().zip(tokens).enumerate() {
        let (tx, rx) = mpsc::channel(4);
        cmds.push(tx);
        let link = Link {
            zone: z,
            name: name.clone(),
            sim: SimZone::new(z, &args.mesh, shape, now),
            global: args.global,
            token,
            epoch,
            flip_every,
            flip_base: z * args.dataplanes,
            flips: flips.clone(),
            shared: shared.clone(),
            cmds: rx,
            connect_timeout: Duration::from_secs(5),
        };
        tasks.push(tokio::spawn(link.run()));
    }

    // 1. Connect: every snapshot acknowledged, every dataplane at the global.
    let deadline = start + args.connect_timeout;
    let caught_up = wait_records(&shared, start, None, args.zones, deadline).await;
    let connect_s = start.elapsed().as_secs_f64();
    let snapshots = shared.records_since(start, None);
    let mut visible_s = None;
    let mut global_view = Vec::new();
    while Instant::now() < deadline {
        global_view = watch::list_zones(&args.api).await.unwrap_or_default();
        if holds_all(&global_view, &names, args.dataplanes) {
            visible_s = Some(start.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if caught_up < args.zones {
        for c in &cmds {
            let _ = c.send(Cmd::Stop).await;
        }
        anyhow::bail!(
            "only {caught_up} of {} zones were accepted and caught up within --connect-timeout ({}); streams ended with {:?} (check --global, and that --sign-with-state-dir is the global's state_dir)",
            args.zones,
            humantime::format_duration(args.connect_timeout),
            shared.closes.lock().unwrap()
        );
    }
    let after_connect = server("after connect");
    eprintln!(
        "zones: {} of {} zones caught up in {connect_s:.1}s, every dataplane at the global: {}",
        caught_up,
        args.zones,
        visible_s.map_or("no".to_string(), |s| format!("{s:.1}s"))
    );

    // 2. Steady window, watched.
    let tally = Arc::new(Tally::default());
    let layout = watch::Layout {
        prefix: args.zone_prefix.clone(),
        zones: args.zones,
        per_zone: args.dataplanes,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watchers: Vec<_> = (0..args.watchers)
        .map(|_| {
            tokio::spawn(watch::watcher(
                args.api.clone(),
                layout.clone(),
                flips.clone(),
                tally.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    let watchers_synced_s = wait_synced(&tally, args.watchers, Duration::from_secs(60)).await;
    tokio::time::sleep(args.warmup).await;
    flips.set_recording(true);
    tally.set_measuring(true);
    shared.set_measuring(true);
    let changes_before = shared.changes_sent.load(Ordering::Relaxed);
    let steady_start = Instant::now();
    let cpu_before = server("steady start");
    tokio::time::sleep(args.duration).await;
    let cpu_after = server("steady end");
    let window = steady_start.elapsed().as_secs_f64();
    let changes = shared.changes_sent.load(Ordering::Relaxed) - changes_before;
    // What was sent at the end of the window is still on its way.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tally.set_measuring(false);
    shared.set_measuring(false);
    let watched = tally.json();
    let ack_lag = summary(&shared.ack_lags());

    // 3. Resume after an outage, against a snapshot.
    let resume = if args.outage.is_zero() {
        Value::Null
    } else {
        let t = Instant::now();
        cmds[0]
            .send(Cmd::Drop {
                down: args.outage,
                resume: true,
            })
            .await?;
        let deadline = t + args.outage + Duration::from_secs(60);
        wait_records(&shared, t, Some(0), 1, deadline).await;
        let resumed = shared.records_since(t, Some(0)).into_iter().next();
        let t = Instant::now();
        cmds[0]
            .send(Cmd::Drop {
                down: Duration::ZERO,
                resume: false,
            })
            .await?;
        wait_records(&shared, t, Some(0), 1, t + Duration::from_secs(60)).await;
        let snapshot = shared.records_since(t, Some(0)).into_iter().next();
        resume_figures(args.outage, resumed.as_ref(), snapshot.as_ref())
    };

    // 4. Reconnect storm.
    let storm = if args.storm {
        let t = Instant::now();
        let mut rng = rand::thread_rng();
        let mut delays = Vec::new();
        for c in &cmds {
            let down = Backoff::default().next_delay_with(&mut rng);
            delays.push(down.as_secs_f64());
            c.send(Cmd::Drop { down, resume: true }).await?;
        }
        let bound = Backoff::START + STORM_SLACK;
        wait_records(
            &shared,
            t,
            None,
            args.zones,
            t + bound + Duration::from_secs(60),
        )
        .await;
        storm_figures(
            &shared.records_since(t, None),
            t,
            args.zones,
            bound,
            &delays,
        )
    } else {
        Value::Null
    };

    let global_end = watch::list_zones(&args.api).await.unwrap_or_default();
    let end = server("end");
    for c in &cmds {
        let _ = c.send(Cmd::Stop).await;
    }
    let _ = stop_tx.send(true);
    for t in tasks.into_iter().chain(watchers) {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }

    let remote = args.zones * args.dataplanes;
    let mib = |b: u64| round3(b as f64 / 1_048_576.0);
    let server_json = match (before, after_connect, cpu_before, cpu_after, end) {
        (Some(b), Some(c), Some(s0), Some(s1), Some(e)) => json!({
            "rss_before_mib": mib(b.rss_bytes),
            "rss_connected_mib": mib(c.rss_bytes),
            "rss_steady_mib": mib(s1.rss_bytes),
            "rss_end_mib": mib(e.rss_bytes),
            "rss_per_remote_dataplane_bytes": per(s1.rss_bytes.saturating_sub(b.rss_bytes), remote),
            "rss_per_remote_dataplane_total_bytes": per(s1.rss_bytes, remote),
            "cpu_percent_steady": round3((s1.cpu_seconds - s0.cpu_seconds) / window * 100.0),
            "cpu_seconds_connect": round3(c.cpu_seconds - b.cpu_seconds),
        }),
        _ => Value::Null,
    };
    let p99 = watched["latency"]["p99_ms"].as_f64();
    let result = json!({
        "label": args.label,
        "machine": sys::machine(),
        "zones": args.zones,
        "dataplanes_per_zone": args.dataplanes,
        "remote_dataplanes": remote,
        "inbounds_per_dataplane": args.inbounds,
        "flips_per_s_per_zone": args.flips_per_s,
        "connect": {
            "zones_caught_up": caught_up,
            "all_caught_up_s": round3(connect_s),
            "all_visible_at_global_s": visible_s.map(round3),
            "snapshot_bytes_total": snapshots.iter().map(|r| r.bytes).sum::<u64>(),
            "snapshot_time_max_s": round3(snapshots.iter().map(|r| r.caught_up_after.as_secs_f64()).fold(0.0, f64::max)),
        },
        "global_view": view_json(&global_view, &names),
        "server": server_json,
        "steady": {
            "window_s": round3(window),
            "changes_sent": changes,
            "changes_per_s": round3(changes as f64 / window),
            "watchers_synced_s": watchers_synced_s.map(round3),
            "change_to_watcher": watched,
            "change_to_ack": ack_lag,
            "visible_p99_target_ms": VISIBLE_P99_TARGET_MS,
            "visible_p99_met": p99.map(|p| p <= VISIBLE_P99_TARGET_MS),
        },
        "resume": resume,
        "storm": storm,
        "totals": {
            "bytes_sent": shared.bytes_sent.load(Ordering::Relaxed),
            "changes_sent": shared.changes_sent.load(Ordering::Relaxed),
            "heartbeats_sent": shared.heartbeats_sent.load(Ordering::Relaxed),
            "changes_acknowledged": shared.acks.load(Ordering::Relaxed),
            "rejected": shared.rejected.load(Ordering::Relaxed),
            "streams_accepted": shared.accepted.load(Ordering::Relaxed),
            "unexpected_closes": shared.closes.lock().unwrap().clone(),
        },
        "global_end": view_json(&global_end, &names),
    });
    if args.json {
        println!("{result}");
    } else {
        print!("{}", table(&result));
    }
    Ok(if caught_up == args.zones && visible_s.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn per(bytes: u64, n: usize) -> Option<f64> {
    (n > 0).then(|| (bytes as f64 / n as f64).round())
}

/// Until `n` zones (or `zone`) recorded a stream started at or after
/// `since`, at most until `deadline`; returns how many did.
async fn wait_records(
    shared: &Shared,
    since: Instant,
    zone: Option<usize>,
    n: usize,
    deadline: Instant,
) -> usize {
    loop {
        let done = zones_recorded(&shared.records_since(since, zone));
        if done >= n || Instant::now() >= deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn zones_recorded(records: &[StreamRecord]) -> usize {
    let mut zones: Vec<usize> = records.iter().map(|r| r.zone).collect();
    zones.sort_unstable();
    zones.dedup();
    zones.len()
}

/// True when the global lists every zone of `names` online with `per_zone`
/// dataplanes.
fn holds_all(view: &[hdsd::pb::Zone], names: &[String], per_zone: usize) -> bool {
    names.iter().all(|n| {
        view.iter().any(|z| {
            &z.name == n
                && z.state == hdsd::pb::ZoneState::Online as i32
                && z.dataplanes as usize == per_zone
        })
    })
}

/// What the global says of the simulated zones: totals, and the counters
/// of the first zone.
fn view_json(view: &[hdsd::pb::Zone], names: &[String]) -> Value {
    let ours: Vec<&hdsd::pb::Zone> = view.iter().filter(|z| names.contains(&z.name)).collect();
    let first = ours.iter().find(|z| Some(&z.name) == names.first());
    json!({
        "zones_listed": ours.len(),
        "zones_online": ours.iter().filter(|z| z.state == hdsd::pb::ZoneState::Online as i32).count(),
        "dataplanes": ours.iter().map(|z| u64::from(z.dataplanes)).sum::<u64>(),
        "inbounds_total": ours.iter().map(|z| u64::from(z.inbounds_total)).sum::<u64>(),
        "first_zone": first.map(|z| json!({
            "name": z.name, "streams": z.streams, "resumes": z.resumes, "snapshots": z.snapshots,
        })),
    })
}

/// The resume's figures against the snapshot's (pure).
fn resume_figures(
    outage: Duration,
    resumed: Option<&StreamRecord>,
    snapshot: Option<&StreamRecord>,
) -> Value {
    let one = |r: Option<&StreamRecord>| {
        r.map(|r| {
            json!({
                "kind": match r.kind { Kind::Snapshot => "snapshot", Kind::Resume => "resume" },
                "bytes": r.bytes,
                "dataplanes": r.dataplanes,
                "accepted_s": round3(r.accepted_after.as_secs_f64()),
                "time_s": round3(r.caught_up_after.as_secs_f64()),
            })
        })
    };
    let ratio = |f: fn(&StreamRecord) -> f64| match (resumed, snapshot) {
        (Some(r), Some(s)) if f(s) > 0.0 => Some(round3(f(r) / f(s))),
        _ => None,
    };
    json!({
        "outage_s": round3(outage.as_secs_f64()),
        "resume": one(resumed),
        "snapshot": one(snapshot),
        "bytes_ratio_resume_over_snapshot": ratio(|r| r.bytes as f64),
        "time_ratio_resume_over_snapshot": ratio(|r| r.caught_up_after.as_secs_f64()),
    })
}

/// The storm's figures: when the last zone was accepted and caught up,
/// from the drop `t` (pure).
fn storm_figures(
    records: &[StreamRecord],
    t: Instant,
    zones: usize,
    bound: Duration,
    delays: &[f64],
) -> Value {
    let latest = |f: fn(&StreamRecord) -> Duration| {
        records
            .iter()
            .map(|r| {
                (r.started + f(r))
                    .saturating_duration_since(t)
                    .as_secs_f64()
            })
            .fold(0.0, f64::max)
    };
    let reconnected = zones_recorded(records);
    let accepted_all = (reconnected == zones).then(|| round3(latest(|r| r.accepted_after)));
    json!({
        "zones": zones,
        "zones_reconnected": reconnected,
        "backoff_delay_max_s": round3(delays.iter().copied().fold(0.0, f64::max)),
        "accepted_all_s": accepted_all,
        "caught_up_all_s": (reconnected == zones).then(|| round3(latest(|r| r.caught_up_after))),
        "bound_s": round3(bound.as_secs_f64()),
        "met": accepted_all.map(|a| a <= bound.as_secs_f64()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        zone: usize,
        kind: Kind,
        started: Instant,
        accepted: u64,
        done: u64,
        bytes: u64,
    ) -> StreamRecord {
        StreamRecord {
            zone,
            kind,
            started,
            accepted_after: Duration::from_millis(accepted),
            caught_up_after: Duration::from_millis(done),
            bytes,
            dataplanes: 1,
        }
    }

    #[test]
    fn only_loopback_urls() {
        assert!(loopback_url("http://127.0.0.1:5680").is_ok());
        assert!(loopback_url("http://10.0.0.1:5680").is_err());
        assert!(loopback_url("https://127.0.0.1:5680").is_err());
    }

    #[test]
    fn resume_against_snapshot() {
        let t = Instant::now();
        let r = record(0, Kind::Resume, t, 5, 20, 1_000);
        let s = record(0, Kind::Snapshot, t, 5, 200, 100_000);
        let v = resume_figures(Duration::from_secs(30), Some(&r), Some(&s));
        assert_eq!(v["resume"]["kind"], "resume");
        assert_eq!(v["snapshot"]["bytes"], 100_000);
        assert_eq!(v["bytes_ratio_resume_over_snapshot"], 0.01);
        assert_eq!(v["time_ratio_resume_over_snapshot"], 0.1);
        let v = resume_figures(Duration::from_secs(30), Some(&r), None);
        assert!(v["bytes_ratio_resume_over_snapshot"].is_null());
    }

    #[test]
    fn a_storm_is_met_once_every_zone_is_accepted_within_the_bound() {
        let t = Instant::now();
        let later = t + Duration::from_millis(500);
        let records = [
            record(0, Kind::Resume, t, 100, 150, 10),
            record(1, Kind::Resume, later, 800, 900, 10),
        ];
        let bound = Duration::from_secs(3);
        let v = storm_figures(&records, t, 2, bound, &[0.0, 0.5]);
        assert_eq!(v["accepted_all_s"], 1.3);
        assert_eq!(v["caught_up_all_s"], 1.4);
        assert_eq!(v["met"], true);
        let v = storm_figures(&records[..1], t, 2, bound, &[0.0, 0.5]);
        assert_eq!(v["zones_reconnected"], 1);
        assert!(v["met"].is_null(), "unknown while a zone is missing");
    }
}
