//! Partitions, for real: one side keeps running while the other cannot
//! reach it, and what each side then does. The failure table of
//! `docs/operating.md` ("What a partition does") cites these tests:
//! - one instance cut from PostgreSQL by a firewall that drops its packets
//!   (PostgreSQL in a network namespace, each instance on its own address
//!   of it, `iptables -j DROP` inside the namespace for one address), while
//!   the two others keep the database: the cut instance keeps serving its
//!   real Envoy from memory and says so in `/readyz` and `hdsd_store_up`;
//!   the others take it for dead after `cluster.instance_timeout` (the
//!   documented rule) and its readiness goes `stale` there; a transition
//!   folded during the cut reaches them once the cut heals;
//! - Envoy and hdsd on a slow, lossy path (500 ms each way, 30 % of chunks
//!   lost and retransmitted after a backing-off timeout: the kernel has no
//!   `sch_netem`, so a userspace proxy, `support::lossy`, emulates it) for
//!   60 s with the default report interval and `stale_after`: every
//!   not-ready interval is explained by a stall longer than `stale_after`
//!   minus the report interval;
//! - the state directory's disk full (a 1 MiB tmpfs): hdsd keeps serving
//!   its Envoy and moving readiness, reports the failed writes once (log)
//!   and in its metrics, and writes what it kept once space returns.
//!
//! A zone cut from its global is `zones::a_cut_link_takes_the_zone_offline_and_healing_it_resumes_without_a_snapshot`.

use std::time::{Duration, Instant};

use crate::support::cluster::{on_postgres_with_timeout, web01_served_by};
use crate::support::lossy::{LossyLink, Path};
use crate::support::netns::Netns;
use crate::support::postgres::Postgres;
use crate::support::tmpfs::Tmpfs;
use crate::support::{dataplane_yaml, wait_for, App, Envoy, Hdsd};

/// web-01's inbound on `hdsd`: (status, held by).
fn web01(hdsd: &Hdsd) -> Result<(String, Option<String>), String> {
    let dp = hdsd.dataplane("default.web-01")?;
    Ok((dp.inbounds[0].health.status.clone(), dp.connection.held_by))
}

fn wait_web01(
    hdsd: &Hdsd,
    what: &str,
    timeout: Duration,
    f: impl Fn(&str, Option<&str>) -> bool,
) -> (String, Option<String>) {
    wait_for(what, timeout, || {
        let (status, held) = web01(hdsd)?;
        if f(&status, held.as_deref()) {
            Ok((status, held))
        } else {
            Err(format!("{status} held by {held:?}"))
        }
    })
}

const INSTANCE_TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn an_instance_cut_from_postgres_serves_from_memory_and_converges_when_the_cut_heals() {
    const TEST: &str =
        "an_instance_cut_from_postgres_serves_from_memory_and_converges_when_the_cut_heals";
    let Some(net) = Netns::create(TEST, 3) else {
        return;
    };
    let addresses: Vec<_> = (0..3).map(|i| net.addr(i)).collect();
    let Some(pg) = Postgres::start_in(TEST, &net.name, addresses.clone()) else {
        return;
    };
    // Each instance reaches PostgreSQL at its own address: a firewall rule
    // for one address cuts that instance only.
    let start = |i: usize| {
        Hdsd::start_with(|c| {
            on_postgres_with_timeout(c, pg.tcp_url(addresses[i]), INSTANCE_TIMEOUT);
            c.hds.stale_after = Some(Duration::from_secs(3));
        })
    };
    let a = start(0);
    let others = [start(1), start(2)];
    let mut app = App::start();
    // An Envoy that knows only A.
    let _envoy = web01_served_by(&a, &app);
    let holder = format!("/{}", a.pid());
    for other in &others {
        wait_web01(
            other,
            "the others to see web-01 healthy, held by A",
            Duration::from_secs(5),
            |s, h| s == "healthy" && h.is_some_and(|h| h.ends_with(&holder)),
        );
    }
    for instance in std::iter::once(&a).chain(&others) {
        assert_eq!(instance.metric("hdsd_store_up"), Some(1.0));
    }

    let cut = net.cut(addresses[0], 5432);
    let cut_at = Instant::now();
    // A transition during the cut: A folds it from memory and serves it.
    app.stop();
    a.wait_inbound("default.web-01", 10001, "unhealthy", Duration::from_secs(5));
    // A says so: still ready (it serves), the store unreachable.
    let body = wait_for("A to report the cut", Duration::from_secs(10), || {
        let (status, body) = a.readyz();
        assert_eq!(status, 200, "A serves: {body}");
        (body.contains("unreachable since") && a.metric("hdsd_store_up") == Some(0.0))
            .then_some(body.clone())
            .ok_or(body)
    });
    let reported = cut_at.elapsed();
    eprintln!("A reported the cut {reported:?} after it: {body}");
    assert!(body.contains("still serving HDS"), "{body}");
    // Noticed at a heartbeat that hangs: a quarter of the timeout to the
    // next one, half of it for its answer; a second for the polling.
    assert!(
        reported <= INSTANCE_TIMEOUT * 3 / 4 + Duration::from_secs(1),
        "{reported:?}"
    );
    // The others keep the database, and take A for dead after the timeout:
    // web-01 disconnected there, its last written readiness goes stale (the
    // transition has not reached them).
    for other in &others {
        let (_, body) = other.readyz();
        assert!(!body.contains("unreachable"), "{body}");
        assert_eq!(other.metric("hdsd_store_up"), Some(1.0));
    }
    for other in &others {
        wait_web01(
            other,
            "the others to mark web-01 disconnected",
            INSTANCE_TIMEOUT * 3,
            |_, h| h.is_none(),
        );
    }
    let swept = cut_at.elapsed();
    eprintln!("web-01 disconnected on both others {swept:?} after the cut");
    // Silent for the timeout (the last heartbeat up to a quarter of it
    // before the cut), found by a sweep (every quarter), a second for the
    // notification and the polling.
    assert!(swept >= INSTANCE_TIMEOUT * 3 / 4, "{swept:?}");
    assert!(
        swept <= INSTANCE_TIMEOUT + INSTANCE_TIMEOUT / 4 + Duration::from_secs(1),
        "{swept:?}"
    );
    for other in &others {
        // Stored readiness goes stale twice stale_after after the last
        // report time A wrote (which trails its reports by up to 3 s).
        let (status, _) = wait_web01(
            other,
            "web-01 stale on the others",
            Duration::from_secs(8),
            |s, _| s != "healthy",
        );
        assert_eq!(status, "stale", "the unhealthy report never reached them");
    }
    // All along, A serves its Envoy: the stream is held, the transition is
    // there.
    let dp = a.dataplane("default.web-01").unwrap();
    assert!(dp.connection.connected, "{:?}", dp.connection);
    assert_eq!(dp.inbounds[0].health.status, "unhealthy");
    let (status, body) = a.readyz();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("unreachable since"), "{body}");
    // The transition waits to be written.
    assert!(body.contains("1 readiness update(s) queued"), "{body}");
    assert_eq!(a.metric("hdsd_store_pending_writes"), Some(1.0));
    let sweepers = others
        .iter()
        .filter(|o| {
            o.log()
                .contains("marked the dataplanes it held disconnected")
        })
        .count();
    assert_eq!(sweepers, 1, "exactly one instance sweeps");

    cut.heal();
    let healed = Instant::now();
    eprintln!("cut for {:?}", cut_at.elapsed());
    // A reaches PostgreSQL again, registers again, claims web-01 again and
    // writes the transition it kept: the others see it, held by A.
    for other in &others {
        wait_web01(
            other,
            "the transition made during the cut on the others, held by A again",
            Duration::from_secs(30),
            |s, h| s == "unhealthy" && h.is_some_and(|h| h.ends_with(&holder)),
        );
    }
    let converged = healed.elapsed();
    wait_for(
        "A to report the store back",
        Duration::from_secs(30),
        || {
            let (status, body) = a.readyz();
            (status == 200
                && !body.contains("unreachable")
                && a.metric("hdsd_store_up") == Some(1.0))
            .then_some(())
            .ok_or(body)
        },
    );
    eprintln!(
        "after the heal: the others converged in {converged:?}, A reported the store back in {:?}",
        healed.elapsed()
    );
    assert!(a.log().contains("registered again"), "{}", a.log());
    // And transitions flow again through the database.
    app.resume();
    for other in &others {
        wait_web01(
            other,
            "healthy again on the others",
            Duration::from_secs(10),
            |s, h| s == "healthy" && h.is_some_and(|h| h.ends_with(&holder)),
        );
    }
    let log = a.log();
    assert_eq!(log.matches(" unreachable (").count(), 1, "{log}");
    assert_eq!(log.matches("reachable again after").count(), 1, "{log}");
    for instance in std::iter::once(&a).chain(&others) {
        assert!(!instance.log().contains("panicked"));
    }
}

/// What the lossy link adds each way.
const LATENCY: Duration = Duration::from_millis(500);
/// How long the lossy link runs.
const LOSSY_RUN: Duration = Duration::from_secs(60);

#[test]
fn an_envoy_on_a_slow_lossy_link_stays_ready_with_the_default_intervals() {
    // The defaults: reports every 5 s, stale after 15 s, keepalive pings
    // every 30 s answered within 10 s. Probes (Envoy to its app) do not
    // cross the link.
    let hdsd = Hdsd::start_with(|c| c.hds.report_interval = Duration::from_secs(5));
    let (report_interval, stale_after) = (Duration::from_secs(5), Duration::from_secs(15));
    let link = LossyLink::start(
        hdsd.hds,
        Path {
            latency: LATENCY,
            loss: 0.3,
            // Linux: the smoothed round trip (1 s) plus its floor of 200 ms.
            rto: Duration::from_millis(1200),
            seed: 33,
        },
    );
    let app = App::start();
    hdsd.write_dataplane(
        "web-01.yaml",
        &dataplane_yaml("web-01", &[(10001, app.port)]),
    );
    let _envoy = Envoy::start(link.addr, "default.web-01", None);
    hdsd.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(30));

    // Sample readiness and the connection; each not-ready stretch is one
    // interval (its start, its end, what it read).
    let started = Instant::now();
    let mut intervals: Vec<(Instant, Instant, String)> = Vec::new();
    let mut open: Option<(Instant, String)> = None;
    let mut disconnected: Vec<Instant> = Vec::new();
    while started.elapsed() < LOSSY_RUN {
        let dp = hdsd.dataplane("default.web-01").unwrap();
        let now = Instant::now();
        let health = &dp.inbounds[0].health;
        match (&open, health.ready) {
            (None, false) => open = Some((now, health.status.clone())),
            (Some(_), true) => {
                let (from, status) = open.take().unwrap();
                intervals.push((from, now, status));
            }
            _ => {}
        }
        if !dp.connection.connected {
            disconnected.push(now);
        }
        std::thread::sleep(Duration::from_millis(100)); // the sampling period
    }
    if let Some((from, status)) = open.take() {
        intervals.push((from, Instant::now(), status));
    }
    let stalls = link.stalls();
    let (up, down) = link.chunks();
    let lost = stalls.iter().filter(|s| s.lost).count();
    let longest = |upstream: bool| {
        stalls
            .iter()
            .filter(|s| s.upstream == upstream)
            .map(|s| s.extra)
            .max()
            .unwrap_or_default()
    };
    eprintln!(
        "{LOSSY_RUN:?} on the lossy link: {up} chunks up, {down} down, {lost} lost at least once; \
         longest stall up {:?}, down {:?}; {} not-ready interval(s), {} sample(s) disconnected",
        longest(true),
        longest(false),
        intervals.len(),
        disconnected.len()
    );
    // Each not-ready interval is a report too late: an Envoy to hdsd stall,
    // begun within `stale_after` + a report interval before it, long enough
    // that no report arrived for `stale_after` (a second for sampling).
    for (from, to, status) in &intervals {
        eprintln!(
            "not ready ({status}) from {:?} to {:?} into the run",
            *from - started,
            *to - started
        );
        assert_eq!(status, "stale", "loss delays reports, it fails no probe");
        let explained = stalls.iter().any(|s| {
            s.upstream
                && s.at + stale_after + report_interval >= *from
                && s.at <= *from
                && s.extra + report_interval + Duration::from_secs(1) >= stale_after
        });
        assert!(explained, "not explained by a stall: {stalls:?}");
    }
    // A disconnection is a keepalive ping unanswered for its 10 s timeout.
    if !disconnected.is_empty() {
        let explained = stalls
            .iter()
            .any(|s| s.extra + 2 * LATENCY + Duration::from_secs(1) >= Duration::from_secs(10));
        assert!(explained, "disconnected without a 10 s stall: {stalls:?}");
    }
    assert!(!hdsd.log().contains("panicked"));
}

#[test]
fn a_full_state_disk_keeps_hdsd_serving_and_writes_resume_when_space_returns() {
    const TEST: &str = "a_full_state_disk_keeps_hdsd_serving_and_writes_resume_when_space_returns";
    let Some(disk) = Tmpfs::mount(TEST, "1m") else {
        return;
    };
    let hdsd = Hdsd::start_with(|c| c.state_dir = disk.path().join("state"));
    let mut app = App::start();
    hdsd.write_dataplane(
        "web-01.yaml",
        &dataplane_yaml("web-01", &[(10001, app.port)]),
    );
    let _envoy = Envoy::start(hdsd.hds, "default.web-01", None);
    hdsd.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    let metric = |name: &str| hdsd.metric(name).unwrap_or(0.0);
    wait_for("a first commit", Duration::from_secs(5), || {
        (metric("hdsd_store_commits_total") >= 1.0)
            .then_some(())
            .ok_or_else(|| "none yet".to_string())
    });
    assert_eq!(metric("hdsd_store_write_failures_total"), 0.0);

    let filled = disk.fill();
    eprintln!("filled the state disk with {filled} bytes");
    // Readiness moves while nothing can be written: the Envoy is served.
    app.stop();
    hdsd.wait_inbound("default.web-01", 10001, "unhealthy", Duration::from_secs(5));
    wait_for(
        "the failed writes counted and the update kept",
        Duration::from_secs(5),
        || {
            let (failures, pending) = (
                metric("hdsd_store_write_failures_total"),
                metric("hdsd_store_pending_writes"),
            );
            (failures >= 3.0 && pending >= 1.0)
                .then_some(())
                .ok_or(format!("failures {failures}, pending {pending}"))
        },
    );
    app.resume();
    hdsd.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(5));
    assert!(
        hdsd.dataplane("default.web-01")
            .unwrap()
            .connection
            .connected
    );
    let log = hdsd.log();
    assert_eq!(
        log.matches("keeping readiness updates in memory").count(),
        1,
        "logged once, not per batch: {log}"
    );
    assert!(log.contains("No space left on device"), "{log}");

    disk.free();
    let freed = Instant::now();
    let commits = metric("hdsd_store_commits_total");
    wait_for("writes to succeed again", Duration::from_secs(10), || {
        let (now, pending) = (
            metric("hdsd_store_commits_total"),
            metric("hdsd_store_pending_writes"),
        );
        (now > commits && pending == 0.0)
            .then_some(())
            .ok_or(format!("commits {now}, pending {pending}"))
    });
    eprintln!(
        "writing again {:?} after the space returned",
        freed.elapsed()
    );
    let failures = metric("hdsd_store_write_failures_total");
    let log = hdsd.log();
    assert_eq!(
        log.matches("readiness store: writing again").count(),
        1,
        "{log}"
    );
    // And it stays so.
    let commits = metric("hdsd_store_commits_total");
    wait_for("more commits", Duration::from_secs(5), || {
        (metric("hdsd_store_commits_total") > commits)
            .then_some(())
            .ok_or_else(|| "none".to_string())
    });
    assert_eq!(metric("hdsd_store_write_failures_total"), failures);
    assert!(!hdsd.log().contains("panicked"));
}
