//! Hostile clients against the real hdsd binary: idle and excess
//! connections, running out of file descriptors, streams that never speak,
//! too many streams, oversized and overlong reports, revoked tokens and
//! removed keys while a stream waits or is blocked sending, forged log
//! lines, probing other dataplanes with Fetch, slow API clients. Each test
//! reproduces one finding and asserts the bounded, fixed behaviour, and that
//! a valid client is still served.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use prost::Message as _;
use tonic::Code;

use crate::support::grpc::{flat_report, hc_request, probe_cluster, report, GrpcClient};
use crate::support::{dataplane_yaml, wait_for, AuthMode, Hdsd, HdsdOptions};

const APP_PORT: u16 = 18_080;
const SOON: Duration = Duration::from_secs(10);

/// A TCP connection to `to` from `from` (another loopback address: a
/// different client IP for hdsd).
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from((from, 0)).into())
        .expect("bind a loopback source address");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

/// Whether the server closed `s` within `timeout` (EOF or reset).
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// A metric's value, or an error while the API cannot answer.
fn try_metric(hdsd: &Hdsd, series: &str) -> Result<f64, String> {
    let text = ureq::get(&hdsd.api_url("/metrics"))
        .call()
        .map_err(|e| e.to_string())?
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("{series} not exported"))
}

fn wait_metric_at_least(hdsd: &Hdsd, series: &str, min: f64, timeout: Duration) -> f64 {
    wait_for(&format!("{series} >= {min}"), timeout, || {
        let v = try_metric(hdsd, series)?;
        if v >= min {
            Ok(v)
        } else {
            Err(format!("{v}"))
        }
    })
}

fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// CPU time (user + system) of `pid`, in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15; after the name, 12 and 13 (1-based: 3 is the first here).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn served_web(hdsd: &Hdsd) {
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, APP_PORT)]));
    wait_for("web defined", SOON, || {
        hdsd.dataplane("default.web").map(|_| ())
    });
}

/// A valid client opens a stream and gets its specifier; returns how long it took.
fn valid_client_is_served(hdsd: &Hdsd) -> Duration {
    let started = Instant::now();
    let client = GrpcClient::connect(hdsd.hds);
    let mut stream = client.open_as("default.web");
    stream.expect_specifier(SOON);
    started.elapsed()
}

/// Finding 1: idle TCP connections without a token. One address holds at most
/// `max_connections_per_ip`; each newcomer past it evicts the oldest (none
/// has authenticated); the held ones are closed at the handshake deadline; a valid client (another address) is
/// served at once throughout; memory stays flat.
#[test]
fn idle_connections_neither_lock_out_envoys_nor_stay_open() {
    let hdsd = Hdsd::start_configured(
        HdsdOptions {
            nofile: Some(256),
            ..HdsdOptions::default()
        },
        |c| {
            c.hds.limits.max_connections_per_ip = 50;
            c.hds.limits.handshake_timeout = Duration::from_secs(3);
        },
    );
    served_web(&hdsd);
    let rss_before = proc_status(hdsd.pid(), "VmRSS:");
    let cpu_before = cpu_ticks(hdsd.pid());
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..300)
        .map(|_| connect_from([127, 0, 0, 2], hdsd.hds))
        .collect();
    // Past its cap, each newcomer of the address takes the slot of the
    // oldest of its own connections (none has authenticated).
    wait_metric_at_least(
        &hdsd,
        r#"hdsd_connections_evicted_total{listener="hds",reason="max_connections_per_ip"}"#,
        250.0,
        SOON,
    );
    let took = valid_client_is_served(&hdsd);
    assert!(
        took < Duration::from_secs(3),
        "a valid client waited {took:?}"
    );
    let rss_after = proc_status(hdsd.pid(), "VmRSS:");
    let cpu = cpu_ticks(hdsd.pid()) - cpu_before;
    let wall = opened.elapsed();
    eprintln!(
        "300 idle connections: RSS {rss_before} -> {rss_after} kB, {cpu} CPU ticks in {wall:?}, valid client served in {took:?}"
    );
    assert!(
        rss_after < rss_before + 20 * 1024,
        "RSS grew from {rss_before} to {rss_after} kB"
    );

    // The held ones are closed by the deadline (3 s after their accept).
    let mut open = 0;
    for s in &mut idle {
        if !closed_within(s, Duration::from_secs(6)) {
            open += 1;
        }
    }
    assert_eq!(open, 0, "idle connections still open after the deadline");
    wait_metric_at_least(
        &hdsd,
        r#"hdsd_connections_timed_out_total{listener="hds",phase="handshake"}"#,
        50.0,
        SOON,
    );
    // The open-file limit below the caps is told at start.
    let log = hdsd.log();
    assert!(
        log.contains("the open-file limit (256) is below hds.limits.max_connections"),
        "{log}"
    );
    drop(idle);
    valid_client_is_served(&hdsd);
}

/// Finding 1: out of file descriptors (caps above the open-file limit). The
/// accept loop backs off instead of spinning, counts it, and serves again
/// once the idle connections are cut off by the deadline.
#[test]
fn running_out_of_file_descriptors_backs_off_and_recovers() {
    let hdsd = Hdsd::start_configured(
        HdsdOptions {
            nofile: Some(128),
            ..HdsdOptions::default()
        },
        |c| {
            c.hds.limits.max_connections_per_ip = 1000;
            c.hds.limits.handshake_timeout = Duration::from_secs(3);
        },
    );
    served_web(&hdsd);
    let cpu_before = cpu_ticks(hdsd.pid());
    let started = Instant::now();
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| connect_from([127, 0, 0, 2], hdsd.hds))
        .collect();
    // While the descriptors are used up (before the deadline frees them).
    std::thread::sleep(Duration::from_millis(2000).saturating_sub(started.elapsed()));
    let cpu = cpu_ticks(hdsd.pid()) - cpu_before;
    let wall = started.elapsed();
    eprintln!("out of file descriptors: {cpu} CPU ticks in {wall:?}");
    // A spinning accept loop burns ~100 ticks per second; backing off, a few.
    assert!(
        (cpu as f64) < wall.as_secs_f64() * 100.0 * 0.3,
        "{cpu} ticks in {wall:?}: the accept loop spins"
    );
    wait_metric_at_least(
        &hdsd,
        r#"hdsd_accept_errors_total{listener="hds",kind="out_of_file_descriptors"}"#,
        1.0,
        Duration::from_secs(20),
    );
    drop(idle);
    let took = valid_client_is_served(&hdsd);
    eprintln!("valid client served {took:?} after the flood ended");
}

/// Finding 3: a stream that never sends its first request, streams waiting
/// for unknown dataplanes, streams per node id, an oversized message and a
/// report with far more endpoints than targets: each ends with a status that
/// says which limit, and each is counted.
#[test]
fn stream_limits_end_bad_streams_with_clear_statuses() {
    let hdsd = Hdsd::start_with(|c| {
        let limits = &mut c.hds.limits;
        limits.first_request_timeout = Duration::from_secs(1);
        limits.max_streams_per_dataplane = 2;
        limits.max_waiting_streams = 3;
        limits.max_message_bytes = 4096;
    });
    served_web(&hdsd);
    let client = GrpcClient::connect(hdsd.hds);

    // Silent: ended at the first-request deadline.
    let mut silent = client.open();
    let status = silent.expect_status(Code::DeadlineExceeded, Duration::from_secs(5));
    assert!(
        status.message().contains("first_request_timeout"),
        "{status:?}"
    );

    // Per node id: two streams for default.ghost wait; a third is refused.
    let mut ghost1 = client.open_as("default.ghost");
    let mut ghost2 = client.open_as("default.ghost");
    ghost1.expect_nothing(Duration::from_millis(300));
    ghost2.expect_nothing(Duration::from_millis(10));
    let status = client
        .open_as("default.ghost")
        .expect_status(Code::ResourceExhausted, SOON);
    assert!(
        status.message().contains("max_streams_per_dataplane"),
        "{status:?}"
    );
    // Waiting in total: a third unknown dataplane waits, a fourth is refused.
    let mut other = client.open_as("default.other");
    other.expect_nothing(Duration::from_millis(300));
    let status = client
        .open_as("default.fourth")
        .expect_status(Code::Unavailable, SOON);
    assert!(
        status.message().contains("max_waiting_streams"),
        "{status:?}"
    );
    drop((ghost1, ghost2, other));

    // An oversized message: refused before it is decoded.
    let mut web = client.open_as("default.web");
    web.expect_specifier(SOON);
    let cluster = probe_cluster(10001);
    let big: Vec<(&str, u16, HealthStatus)> = (0..300)
        .map(|_| (cluster.as_str(), 10001, HealthStatus::Healthy))
        .collect();
    let message = report(&big);
    assert!(message.encoded_len() > 4096);
    web.send(message);
    let status = web.expect_status(Code::ResourceExhausted, SOON);
    assert!(status.message().contains("max_message_bytes"), "{status:?}");

    // Far more endpoints than the specifier has targets (under the size limit).
    let mut web = client.open_as("default.web");
    web.expect_specifier(SOON);
    let many: Vec<(u16, HealthStatus)> = (0..100)
        .map(|i| (20_000 + i, HealthStatus::Healthy))
        .collect();
    let message = flat_report(&many);
    assert!(message.encoded_len() < 4096);
    web.send(message);
    let status = web.expect_status(Code::InvalidArgument, SOON);
    assert!(status.message().contains("100 endpoints"), "{status:?}");

    for limit in [
        "first_request_timeout",
        "max_streams_per_dataplane",
        "max_waiting_streams",
        "max_message_bytes",
        "max_report_endpoints",
    ] {
        let v = hdsd
            .metric(&format!(r#"hdsd_limit_hits_total{{limit="{limit}"}}"#))
            .unwrap_or(0.0);
        assert!(v >= 1.0, "{limit} counted: {v}");
    }
    // The server still serves.
    valid_client_is_served(&hdsd);
}

/// Finding 3: the HTTP/2 settings a client sees: a small concurrent-stream
/// limit per connection.
#[test]
fn a_connection_may_open_only_a_few_concurrent_streams() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(hdsd.hds).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        // The SETTINGS frame has arrived once a request round-trips.
        let request = http::Request::post(format!(
            "http://{}/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck",
            hdsd.hds
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, _body) = client.send_request(request, false).unwrap();
        tokio::time::timeout(SOON, response).await.unwrap().unwrap();
        assert_eq!(client.current_max_send_streams(), 8);
        driver.abort();
    });
}

/// An hdsd that asks every stream for a dataplane token.
fn token_server() -> Hdsd {
    Hdsd::start_with(|c| c.auth.mode = AuthMode::Token)
}

fn jti(hdsd: &Hdsd, token: &str) -> String {
    hdsd.cli(&["token", "inspect", token])
        .lines()
        .find_map(|l| l.trim().strip_prefix("jti:").map(|j| j.trim().to_string()))
        .expect("inspect prints the jti")
}

/// Finding 2a and 10: a stream that has not sent its first request is ended
/// when its token is revoked (the list outside state_dir); the gate reloads
/// only when its own files change, not on readiness-store writes. Finding 5:
/// a client retrying with a bad token is counted every time, logged a few times.
#[test]
fn revocation_ends_a_stream_waiting_for_its_first_request() {
    let dir = tempfile::tempdir().unwrap();
    let revocations = dir.path().join("lists").join("revoked");
    let hdsd = Hdsd::start_with(|c| {
        c.hds.stale_after = Some(Duration::from_secs(30));
        c.auth.mode = AuthMode::Token;
        c.auth.revocations = Some(revocations.clone());
    });
    served_web(&hdsd);
    let client = GrpcClient::connect(hdsd.hds);

    // An attached, reporting stream makes the readiness store write.
    let web_token = hdsd.issue_token("default.web", "1h");
    let mut web = client.open_with_token(Some(&web_token));
    web.send(hc_request(Some("default.web")));
    web.expect_specifier(SOON);
    for _ in 0..10 {
        web.send(report(&[(
            &probe_cluster(10001),
            APP_PORT,
            HealthStatus::Healthy,
        )]));
        std::thread::sleep(Duration::from_millis(200));
    }
    hdsd.wait_connected("default.web", true, SOON);
    assert_eq!(
        hdsd.metric("hdsd_auth_reloads_total"),
        Some(0.0),
        "the gate reloaded without a change to keys or revocations"
    );

    // A stream that sent nothing yet, then its token is revoked.
    let token = hdsd.issue_token("default.web", "1h");
    let mut waiting = client.open_with_token(Some(&token));
    waiting.expect_nothing(Duration::from_millis(200));
    let revoked_at = Instant::now();
    hdsd.cli(&["token", "revoke", &jti(&hdsd, &token)]);
    let status = waiting.expect_status(Code::Unauthenticated, Duration::from_secs(5));
    assert!(status.message().contains("revoked"), "{status:?}");
    eprintln!(
        "revoked stream ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    assert!(revoked_at.elapsed() < Duration::from_secs(3));
    assert!(hdsd.metric("hdsd_auth_reloads_total").unwrap() >= 1.0);
    // The other token's stream is untouched.
    web.send(report(&[(
        &probe_cluster(10001),
        APP_PORT,
        HealthStatus::Healthy,
    )]));
    web.expect_nothing(Duration::from_millis(300));

    // A flood of refused streams: every one counted, a few logged.
    let before = hdsd
        .metric(r#"hdsd_auth_failures_total{reason="malformed"}"#)
        .unwrap_or(0.0);
    for _ in 0..200 {
        let refused = match client.try_open_with_token(Some("not.a.token")) {
            Err(status) => status,
            Ok(mut s) => s.expect_status(Code::Unauthenticated, SOON),
        };
        assert_eq!(refused.code(), Code::Unauthenticated);
    }
    let after = hdsd
        .metric(r#"hdsd_auth_failures_total{reason="malformed"}"#)
        .unwrap();
    assert_eq!(after - before, 200.0);
    let logged = hdsd
        .log()
        .lines()
        .filter(|l| l.contains("stream refused") && l.contains("malformed"))
        .count();
    assert!(logged <= 5, "{logged} refusal lines for one peer");
}

/// Finding 2c: removing a signing key ends the live streams of its tokens.
#[test]
fn removing_a_signing_key_ends_its_live_streams() {
    let hdsd = token_server();
    served_web(&hdsd);
    let keys = hdsd.dir.path().join("state").join("keys");
    let old_files: Vec<_> = std::fs::read_dir(&keys)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let token = hdsd.issue_token("default.web", "1h");
    let client = GrpcClient::connect(hdsd.hds);
    let mut web = client.open_with_token(Some(&token));
    web.send(hc_request(Some("default.web")));
    web.expect_specifier(SOON);
    hdsd.cli(&["token", "keygen"]);
    for f in &old_files {
        std::fs::remove_file(f).unwrap();
    }
    let status = web.expect_status(Code::Unauthenticated, SOON);
    assert!(
        status.message().contains("unknown signing key"),
        "{status:?}"
    );
    hdsd.wait_connected("default.web", false, SOON);
}

/// gRPC framing of one message.
fn grpc_frame(message: &impl prost::Message) -> prost::bytes::Bytes {
    let body = message.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(0);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

/// Finding 2b: a client that holds its flow-control window at zero keeps
/// hdsd's sends waiting; a revocation still ends the stream (hdsd detaches
/// the dataplane and counts the refusal: the client itself cannot read the
/// status through a shut window).
#[test]
fn revocation_ends_a_stream_blocked_sending() {
    let hdsd = token_server();
    served_web(&hdsd);
    let token = hdsd.issue_token("default.web", "1h");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, driver, body) = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(hdsd.hds).await.unwrap();
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, prost::bytes::Bytes>(tcp)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::post(format!(
            "http://{}/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck",
            hdsd.hds
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        // Every request is answered with a specifier: more than hdsd can queue.
        for _ in 0..20 {
            body.send_data(grpc_frame(&hc_request(Some("default.web"))), false)
                .unwrap();
        }
        let response = tokio::time::timeout(SOON, response).await.unwrap().unwrap();
        (client, driver, (body, response))
    });
    hdsd.wait_connected("default.web", true, SOON);
    // hdsd has sent nothing the client could read: its sends wait.
    std::thread::sleep(Duration::from_millis(500));
    let sent = hdsd.metric("hdsd_specifiers_sent_total").unwrap();
    assert!(sent < 20.0, "{sent} specifiers sent through a zero window");

    let revoked_at = Instant::now();
    hdsd.cli(&["token", "revoke", &jti(&hdsd, &token)]);
    hdsd.wait_connected("default.web", false, Duration::from_secs(5));
    eprintln!(
        "stream blocked sending ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    assert!(revoked_at.elapsed() < Duration::from_secs(3));
    assert!(
        hdsd.metric(r#"hdsd_auth_failures_total{reason="revoked"}"#)
            .unwrap()
            >= 1.0
    );
    let _guard = rt.enter();
    driver.abort();
    drop((client, body));
}

/// Finding 8: a newline in a node id does not forge a log line.
#[test]
fn a_newline_in_a_node_id_is_escaped_in_the_log() {
    let hdsd = Hdsd::start_with(|c| c.hds.unknown_dataplane_grace = Duration::from_secs(1));
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as("default.evil\nFORGED-LINE level=ERROR");
    // Refused where it enters: a name has no control character.
    let status = s.expect_status(Code::InvalidArgument, SOON);
    assert!(status.message().contains("contains '\\n'"), "{status:?}");
    let log = hdsd.log();
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED-LINE")),
        "a forged line:\n{log}"
    );
    // The id is in the log, escaped, on the line that refused it.
    assert!(
        log.lines()
            .any(|l| l.contains(r"evil\") && l.contains("FORGED-LINE") && l.contains("contains")),
        "{log}"
    );
}

/// A node id of 450 KB of control bytes (under the message limit) is shown
/// cut and escaped in the status and the log: 30 of them write a few KB
/// of log, not the 112 MB they wrote when the id was logged whole.
#[test]
fn a_long_node_id_is_cut_in_the_status_and_the_log() {
    let hdsd = Hdsd::start_with(|c| {
        c.hds.unknown_dataplane_grace = Duration::from_secs(1);
        c.hds.limits.max_message_bytes = 1024 * 1024;
    });
    let before = hdsd.log().len();
    let client = GrpcClient::connect(hdsd.hds);
    let id = format!("default.{}", "\u{1}".repeat(450_000));
    for _ in 0..30 {
        let status = client
            .open_as(&id)
            .expect_status(Code::InvalidArgument, SOON);
        assert!(
            status.message().len() < 1024,
            "a status message of {} bytes",
            status.message().len()
        );
        assert!(
            status.message().contains("(450008 bytes in all)"),
            "{status:?}"
        );
    }
    let log = hdsd.log();
    let grown = log.len() - before;
    assert!(grown < 64 * 1024, "30 refusals wrote {grown} bytes of log");
    assert!(log.lines().all(|l| l.len() < 4096), "a line over 4 KB");
}

/// Finding 7: Fetch checks the token's identity before looking anything up,
/// and NOT_FOUND names no server path.
#[test]
fn fetch_for_another_node_is_refused_before_lookup() {
    let hdsd = token_server();
    served_web(&hdsd);
    let client = GrpcClient::connect(hdsd.hds);
    let web_token = hdsd.issue_token("default.web", "1h");
    // Another node, existing or not: the same refusal, nothing learnt.
    for other in ["default.ghost", "default.web2"] {
        let e = client
            .fetch_with_token(hc_request(Some(other)), Some(&web_token))
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    }
    assert!(client
        .fetch_with_token(hc_request(Some("default.web")), Some(&web_token))
        .is_ok());
    let ghost_token = hdsd.issue_token("default.ghost", "1h");
    let e = client
        .fetch_with_token(hc_request(Some("default.ghost")), Some(&ghost_token))
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let dir = hdsd.dataplanes_dir().display().to_string();
    assert!(
        !e.message().contains(&dir),
        "reveals the path: {}",
        e.message()
    );
    assert!(e.message().contains("ghost.yaml"), "{}", e.message());
}

/// Finding 6: the API closes a client that sends no request, one that sends
/// half a header, and evicts the oldest silent connection of an address at
/// its per-address cap.
#[test]
fn the_api_bounds_slow_and_excess_clients() {
    let hdsd = Hdsd::start_with(|c| {
        let limits = &mut c.api.limits;
        limits.max_connections_per_ip = 4;
        limits.handshake_timeout = Duration::from_secs(1);
        limits.header_read_timeout = Duration::from_secs(1);
    });
    // Half a header: closed by the header-read timeout.
    let mut half = TcpStream::connect(hdsd.api).unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut half, Duration::from_secs(5)),
        "half a header kept open"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );

    // A kept-alive connection that goes quiet after a request: closed too.
    let mut kept = TcpStream::connect(hdsd.api).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut response = [0u8; 12];
    kept.read_exact(&mut response).unwrap();
    assert_eq!(&response, b"HTTP/1.1 200");
    assert!(
        closed_within(&mut kept, Duration::from_secs(5)),
        "idle keep-alive kept open"
    );

    // Four silent connections from one address are held; the fifth takes
    // the slot of the oldest (none has authenticated), which is closed at once.
    let mut held: Vec<TcpStream> = (0..4)
        .map(|_| connect_from([127, 0, 0, 3], hdsd.api))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let fifth = connect_from([127, 0, 0, 3], hdsd.api);
    assert!(
        closed_within(&mut held[0], Duration::from_millis(800)),
        "the oldest silent connection kept its slot"
    );
    held[0] = fifth;
    // Others are served meanwhile.
    ureq::get(&hdsd.api_url("/readyz"))
        .call()
        .expect("readyz from another address");
    // The silent ones are closed by the handshake deadline.
    for s in &mut held {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "a silent API client kept open"
        );
    }
    assert!(
        hdsd.metric(
            r#"hdsd_connections_evicted_total{listener="api",reason="max_connections_per_ip"}"#
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        hdsd.metric(r#"hdsd_connections_timed_out_total{listener="api",phase="handshake"}"#)
            .unwrap()
            >= 4.0
    );
}

/// Finding 6: an API connection that goes quiet is closed after
/// `api.limits.idle_timeout`, also when the header-read timeout is longer.
#[test]
fn a_quiet_api_connection_is_closed_after_the_idle_timeout() {
    let hdsd = Hdsd::start_with(|c| {
        c.api.limits.header_read_timeout = Duration::from_secs(30);
        c.api.limits.idle_timeout = Duration::from_secs(2);
    });
    let mut kept = TcpStream::connect(hdsd.api).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut response = [0u8; 12];
    kept.read_exact(&mut response).unwrap();
    assert_eq!(&response, b"HTTP/1.1 200");
    let quiet_from = Instant::now();
    assert!(closed_within(&mut kept, Duration::from_secs(10)));
    let took = quiet_from.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "closed after {took:?}"
    );
    assert!(
        hdsd.metric(r#"hdsd_connections_timed_out_total{listener="api",phase="idle"}"#)
            .unwrap()
            >= 1.0
    );
}

/// Finding 3: a client that opens and resets streams in a loop ("rapid
/// reset") has its connection closed by hdsd instead of costing unbounded
/// server work (the client sees the connection end while it floods).
#[test]
fn a_reset_flood_ends_the_connection() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(hdsd.hds).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let driver = tokio::spawn(connection);
        let mut client = client;
        for i in 0..5_000 {
            client = match client.ready().await {
                Ok(c) => c,
                Err(e) => return format!("refused at stream {i}: {e}"),
            };
            let request = http::Request::post(format!(
                "http://{}/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck",
                hdsd.hds
            ))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
            match client.send_request(request, false) {
                Ok((_response, mut body)) => body.send_reset(h2::Reason::CANCEL),
                Err(e) => return format!("refused at stream {i}: {e}"),
            }
        }
        // The client's handle is still alive: only the server can end it.
        match tokio::time::timeout(SOON, driver).await {
            Ok(Ok(Err(e))) => format!("connection ended by the server after the flood: {e}"),
            other => panic!("the connection survived 5,000 resets: {other:?}"),
        }
    });
    eprintln!("{outcome}");
    served_web(&hdsd);
    valid_client_is_served(&hdsd);
}

/// A flood of hostile connections run on the test's own runtime: every
/// connection is opened again as soon as hdsd closes it (an attacker that
/// keeps the pressure on). Dropping it stops the flood.
struct Flood {
    /// Runs the flood's tasks; dropped, they end and their sockets close.
    _rt: tokio::runtime::Runtime,
    /// Open now (admitted or not yet closed), with the time each was opened.
    live: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, Instant>>>,
    /// Connections that hdsd kept open, then closed: how long each lived.
    lifetimes: std::sync::Arc<std::sync::Mutex<Vec<Duration>>>,
}

/// What one attacking connection does once connected.
#[derive(Clone, Copy)]
enum Attack {
    /// Completes the HTTP/2 preface and answers every PING (h2's client
    /// does), never opens a stream.
    IdleH2,
    /// Sends the start of an HTTP/1 request, then one header line every
    /// 100 ms, never the blank line that ends the headers.
    Slowloris,
}

impl Flood {
    fn start(attack: Attack, to: SocketAddr, from: &[[u8; 4]], per_address: usize) -> Flood {
        use std::sync::atomic::{AtomicU64, Ordering};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let live = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let lifetimes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let ids = std::sync::Arc::new(AtomicU64::new(0));
        for &addr in from {
            for _ in 0..per_address {
                let (live, lifetimes, ids) = (live.clone(), lifetimes.clone(), ids.clone());
                rt.spawn(async move {
                    loop {
                        let socket = tokio::net::TcpSocket::new_v4().unwrap();
                        socket.bind(SocketAddr::from((addr, 0))).unwrap();
                        let Ok(tcp) = socket.connect(to).await else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        let id = ids.fetch_add(1, Ordering::Relaxed);
                        let opened = Instant::now();
                        live.lock().unwrap().insert(id, opened);
                        let served = match attack {
                            Attack::IdleH2 => idle_h2(tcp).await,
                            Attack::Slowloris => slowloris(tcp).await,
                        };
                        live.lock().unwrap().remove(&id);
                        if served {
                            lifetimes.lock().unwrap().push(opened.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
            }
        }
        Flood {
            _rt: rt,
            live,
            lifetimes,
        }
    }

    /// Waits until `n` of the flood's connections have been open for 300 ms.
    fn wait_holding(&self, n: usize) {
        wait_for(&format!("{n} attacking connections held"), SOON, || {
            let held = self
                .live
                .lock()
                .unwrap()
                .values()
                .filter(|t| t.elapsed() > Duration::from_millis(300))
                .count();
            if held >= n {
                Ok(())
            } else {
                Err(format!("{held} held"))
            }
        });
    }

    /// How long the oldest open attacking connection has been open.
    fn oldest(&self) -> Duration {
        self.live
            .lock()
            .unwrap()
            .values()
            .map(|t| t.elapsed())
            .max()
            .unwrap_or_default()
    }

    fn longest_lifetime(&self) -> Duration {
        self.lifetimes
            .lock()
            .unwrap()
            .iter()
            .copied()
            .max()
            .unwrap_or_default()
    }
}

/// An HTTP/2 client that answers PINGs and never opens a stream; true when
/// hdsd admitted it (it stayed open past its first 100 ms).
async fn idle_h2(tcp: tokio::net::TcpStream) -> bool {
    let opened = Instant::now();
    let Ok((send, connection)) = h2::client::handshake(tcp).await else {
        return false;
    };
    let _ = connection.await;
    drop(send);
    opened.elapsed() > Duration::from_millis(100)
}

/// Headers trickled forever; true when hdsd admitted it.
async fn slowloris(tcp: tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let opened = Instant::now();
    let (mut read, mut write) = tcp.into_split();
    let trickle = async move {
        if write
            .write_all(b"GET /api/v1/dataplanes HTTP/1.1\r\nHost: hdsd\r\n")
            .await
            .is_err()
        {
            return;
        }
        for i in 0u64.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if write
                .write_all(format!("X-Trickle-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    };
    let mut buf = [0u8; 1024];
    tokio::select! {
        () = trickle => {}
        _ = async { while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {} } => {}
    }
    opened.elapsed() > Duration::from_millis(100)
}

/// How long hdsd keeps one idle HTTP/2 connection (preface done, every PING
/// answered, no stream) open.
fn idle_h2_kept_for(to: SocketAddr) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(to).await.unwrap();
        let opened = Instant::now();
        let (send, connection) = h2::client::handshake(tcp).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
        assert!(ended.is_ok(), "an idle HTTP/2 connection open after 10 s");
        drop(send);
        opened.elapsed()
    })
}

/// A legitimate API client: a fresh connection, an answer within 1 s.
fn api_answers_within_a_second(hdsd: &Hdsd, path: &str) -> Result<Duration, String> {
    let started = Instant::now();
    ureq::get(&hdsd.api_url(path))
        .config()
        .timeout_global(Some(Duration::from_secs(1)))
        .build()
        .call()
        .map_err(|e| format!("GET {path}: {e} after {:?}", started.elapsed()))?;
    Ok(started.elapsed())
}

/// Issue 33, finding 1 (HDS): idle HTTP/2 connections that complete the
/// preface, answer PINGs and never open a stream fill `max_connections`
/// (from several addresses, each under its per-address cap). A real Envoy
/// and a gRPC client are still served within 2 s: a newcomer evicts the
/// oldest connection that has not authenticated. Each idle connection is
/// closed at `unauthenticated_timeout`, whatever PINGs hdsd's keepalive
/// sends, while the Envoy's quiet, authenticated stream stays.
#[test]
fn idle_http2_connections_neither_fill_the_hds_slots_nor_stay() {
    let hdsd = Hdsd::start_with(|c| {
        c.hds.keepalive.interval = Duration::from_millis(300);
        c.hds.keepalive.timeout = Duration::from_secs(5);
        let limits = &mut c.hds.limits;
        limits.max_connections = 20;
        limits.max_connections_per_ip = 10;
        limits.unauthenticated_timeout = Duration::from_secs(2);
        limits.idle_timeout = Duration::from_secs(2);
    });
    served_web(&hdsd);
    let flood = Flood::start(
        Attack::IdleH2,
        hdsd.hds,
        &[[127, 0, 0, 2], [127, 0, 0, 3]],
        10,
    );
    flood.wait_holding(15);

    // A real Envoy, from another address, while every slot is wanted.
    let started = Instant::now();
    let _envoy = crate::support::Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_connected("default.web", true, Duration::from_secs(2));
    eprintln!("Envoy served {:?} after its start", started.elapsed());
    // A gRPC client too. It speaks as default.web and replaces the Envoy's
    // stream; its node names no Envoy version, which tells its stream from
    // the Envoy's (a new one: its first was replaced) coming back.
    let envoy_stream = || {
        let c = hdsd.dataplane("default.web")?.connection;
        Ok::<_, String>((c.connected, c.connected_at, c.envoy_version.is_some()))
    };
    let (_, envoy_at, _) = envoy_stream().unwrap();
    let took = valid_client_is_served(&hdsd);
    eprintln!("gRPC client served in {took:?}");
    assert!(took < Duration::from_secs(2), "gRPC client waited {took:?}");

    // The flood's connections go at the grace, PINGs or not; the Envoy's
    // stream (authenticated, quiet between reports) stays past idle_timeout.
    wait_for(
        "the Envoy's stream back",
        Duration::from_secs(20),
        || match envoy_stream()? {
            (true, at, true) if at != envoy_at => Ok(()),
            other => Err(format!("(connected, at, an Envoy) = {other:?}")),
        },
    );
    crate::support::hold_for("the Envoy's stream", Duration::from_secs(3), || match hdsd
        .dataplane("default.web")?
        .connection
        .connected
    {
        true => Ok(()),
        false => Err("the Envoy was disconnected".to_string()),
    });
    let oldest = flood.oldest();
    assert!(
        oldest < Duration::from_millis(3500),
        "an idle connection has been open for {oldest:?}"
    );
    assert!(flood.longest_lifetime() < Duration::from_millis(3500));
    hdsd.wait_connected("default.web", true, Duration::from_millis(10));
    assert!(
        hdsd.metric(r#"hdsd_connections_evicted_total{listener="hds",reason="max_connections"}"#)
            .unwrap_or(0.0)
            >= 1.0,
        "{}",
        hdsd.metrics()
    );
    drop(flood);

    // Alone (no newcomer evicts it), an idle connection is closed at the
    // grace although it answers hdsd's PINGs (every 300 ms).
    let kept = idle_h2_kept_for(hdsd.hds);
    eprintln!("a lone idle HTTP/2 connection kept {kept:?}");
    assert!(
        kept >= Duration::from_millis(1500) && kept < Duration::from_millis(3500),
        "kept {kept:?}"
    );
    assert!(
        hdsd.metric(r#"hdsd_connections_timed_out_total{listener="hds",phase="unauthenticated"}"#)
            .unwrap_or(0.0)
            >= 1.0
    );
    // The Envoy's quiet stream is still there, past idle_timeout.
    hdsd.wait_connected("default.web", true, Duration::from_millis(10));
}

/// Asks the API for the fleet, `/readyz` and `/healthz` in a loop for
/// `period` (every one within a second, or the test fails): the slowest
/// answer.
fn api_keeps_answering(hdsd: &Hdsd, period: Duration) -> Duration {
    let until = Instant::now() + period;
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        for path in ["/api/v1/dataplanes", "/readyz", "/healthz"] {
            let took = api_answers_within_a_second(hdsd, path).unwrap();
            slowest = slowest.max(took);
        }
        std::thread::park_timeout(Duration::from_millis(50)); // between rounds
    }
    slowest
}

/// Issue 33, finding 1 (API): idle HTTP/2 connections fill the API's
/// slots; a GET and `/readyz` are answered within 1 s throughout, and the
/// idle connections are closed at `unauthenticated_timeout` although hdsd's
/// own keepalive PINGs flow on them (they used to reset the idle timer:
/// none was ever closed). The HDS listener's slots are not the API's.
#[test]
fn idle_http2_connections_neither_fill_the_api_slots_nor_stay() {
    let hdsd = Hdsd::start_with(|c| {
        c.hds.keepalive.interval = Duration::from_millis(300);
        c.hds.keepalive.timeout = Duration::from_secs(5);
        let limits = &mut c.api.limits;
        limits.max_connections = 20;
        limits.max_connections_per_ip = 10;
        limits.unauthenticated_timeout = Duration::from_secs(2);
        limits.idle_timeout = Duration::from_secs(2);
    });
    served_web(&hdsd);
    let flood = Flood::start(
        Attack::IdleH2,
        hdsd.api,
        &[[127, 0, 0, 2], [127, 0, 0, 3]],
        10,
    );
    flood.wait_holding(15);
    let slowest = api_keeps_answering(&hdsd, Duration::from_secs(4));
    eprintln!("API under an idle HTTP/2 flood: slowest answer {slowest:?}");
    // The HDS listener has its own slots.
    valid_client_is_served(&hdsd);
    let oldest = flood.oldest();
    assert!(
        oldest < Duration::from_millis(3500),
        "an idle API connection has been open for {oldest:?}"
    );
    assert!(flood.longest_lifetime() < Duration::from_millis(3500));
    drop(flood);

    // Alone, an idle connection is closed at the grace although hdsd's own
    // PINGs flow every 300 ms (they used to reset the idle timer).
    let kept = idle_h2_kept_for(hdsd.api);
    eprintln!("a lone idle HTTP/2 API connection kept {kept:?}");
    assert!(
        kept >= Duration::from_millis(1500) && kept < Duration::from_millis(3500),
        "kept {kept:?}"
    );
    assert!(
        hdsd.metric(r#"hdsd_connections_timed_out_total{listener="api",phase="unauthenticated"}"#)
            .unwrap_or(0.0)
            >= 1.0
    );
}

/// Issue 33, finding 2: slowloris on the API (HTTP/1 connections trickling
/// header lines, reconnecting as soon as they are closed, from several
/// addresses up to each one's cap). A GET and `/readyz` are answered within
/// 1 s throughout; a trickling client is cut at `header_read_timeout`, and
/// one trickling a body at `body_read_timeout`.
#[test]
fn slowloris_on_the_api_neither_locks_out_clients_nor_stays() {
    let hdsd = Hdsd::start_with(|c| {
        let limits = &mut c.api.limits;
        limits.max_connections = 20;
        limits.max_connections_per_ip = 10;
        limits.header_read_timeout = Duration::from_secs(2);
        limits.body_read_timeout = Duration::from_secs(2);
        limits.unauthenticated_timeout = Duration::from_secs(5);
    });
    let flood = Flood::start(
        Attack::Slowloris,
        hdsd.api,
        &[[127, 0, 0, 2], [127, 0, 0, 3]],
        10,
    );
    flood.wait_holding(15);
    let slowest = api_keeps_answering(&hdsd, Duration::from_secs(4));
    eprintln!("API under slowloris: slowest answer {slowest:?}");
    let oldest = flood.oldest();
    assert!(
        oldest < Duration::from_millis(3500),
        "a trickling connection has been open for {oldest:?}"
    );
    assert!(flood.longest_lifetime() < Duration::from_millis(3500));
    drop(flood);

    // A body trickled after complete headers: cut at body_read_timeout.
    let mut body = TcpStream::connect(hdsd.api).unwrap();
    body.write_all(
        b"PUT /api/v1/dataplanes/default/web HTTP/1.1\r\nHost: x\r\nContent-Type: application/yaml\r\nContent-Length: 100000\r\n\r\n",
    )
    .unwrap();
    let started = Instant::now();
    let mut cut = false;
    while started.elapsed() < Duration::from_secs(6) {
        if body.write_all(b"x").is_err() || closed_within(&mut body, Duration::from_millis(100)) {
            cut = true;
            break;
        }
    }
    let took = started.elapsed();
    assert!(cut, "a trickled body kept open for {took:?}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(3500),
        "a trickled body cut after {took:?}"
    );
}

/// How each stream of [`open_partial_streams`] ended: grpc-status and grpc-message.
type Ended = (Option<String>, Option<String>);

/// Opens `connections` x 8 HDS streams, each sending `partial` bytes of a
/// message announced as 500,000 bytes and then waiting; returns the
/// runtime, the streams' send halves (dropping the runtime closes them)
/// and where each stream's end is told.
fn open_partial_streams(
    hdsd: &Hdsd,
    connections: usize,
    partial: usize,
) -> (
    tokio::runtime::Runtime,
    Vec<h2::SendStream<prost::bytes::Bytes>>,
    tokio::sync::mpsc::UnboundedReceiver<Ended>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (ended_tx, ended_rx) = tokio::sync::mpsc::unbounded_channel();
    let addr = hdsd.hds;
    let streams = rt.block_on(async {
        let mut kept = Vec::new();
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (client, connection) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(connection);
            for _ in 0..8 {
                let mut client = client.clone().ready().await.unwrap();
                let request = http::Request::post(format!(
                    "http://{addr}/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
                let (response, mut body) = client.send_request(request, false).unwrap();
                let mut data = vec![0u8];
                data.extend_from_slice(&500_000u32.to_be_bytes());
                data.resize(5 + partial, 0);
                body.send_data(data.into(), false).unwrap();
                tokio::spawn(stream_end(response, ended_tx.clone()));
                kept.push(body);
            }
        }
        kept
    });
    (rt, streams, ended_rx)
}

/// Tells how a stream ended: its status, from the trailers or the headers.
async fn stream_end(
    response: h2::client::ResponseFuture,
    ended: tokio::sync::mpsc::UnboundedSender<Ended>,
) {
    let Ok(response) = response.await else { return };
    let headers = response.headers().clone();
    let mut data = response.into_body();
    let trailers = loop {
        match data.data().await {
            Some(Ok(_)) => continue,
            Some(Err(_)) => break None,
            None => break data.trailers().await.ok().flatten(),
        }
    };
    let header = |name: &str| {
        trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or(headers.get(name))
            .map(|v| v.to_str().unwrap_or_default().to_string())
    };
    let _ = ended.send((header("grpc-status"), header("grpc-message")));
}

/// The streams' ends told within half a second of each other.
fn ends(
    rt: &tokio::runtime::Runtime,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Ended>,
) -> Vec<Ended> {
    rt.block_on(async {
        let mut ended = Vec::new();
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            ended.push(e);
        }
        ended
    })
}

/// Finding 3: many streams each holding most of a large message. Each is
/// within `max_message_bytes`; together they would hold 8 MB against a
/// `limits.client_bytes` of 4 MiB. The budget is never passed, the largest
/// holders are reset with RESOURCE_EXHAUSTED (counted), a valid client is
/// served meanwhile, and the bytes come back when the streams end.
#[test]
fn partial_messages_share_one_memory_budget_and_the_largest_give_way() {
    const LIMIT: f64 = 4.0 * 1024.0 * 1024.0;
    let hdsd = Hdsd::start_with(|c| c.limits.client_bytes = 4 * 1024 * 1024);
    served_web(&hdsd);
    // 40 streams over 5 connections, each sending 200,000 bytes of a
    // message: 8 MB held if nothing bounded it.
    let (rt, streams, mut ended_rx) = open_partial_streams(&hdsd, 5, 200_000);
    let held = r#"hdsd_client_bytes{state="held"}"#;
    // The streams send while hdsd resets the largest: wait until the held
    // bytes fill the budget, some streams reset.
    wait_metric_at_least(
        &hdsd,
        r#"hdsd_limit_hits_total{limit="client_bytes"}"#,
        1.0,
        SOON,
    );
    let mut peak: f64 = 0.0;
    wait_for("the held bytes to fill most of the budget", SOON, || {
        let now = try_metric(&hdsd, held)?;
        peak = peak.max(now);
        assert!(now <= LIMIT, "{now} bytes held past the budget of {LIMIT}");
        (now >= LIMIT - 2.0 * 200_005.0)
            .then_some(())
            .ok_or(format!("{now} bytes held"))
    });
    let ended = ends(&rt, &mut ended_rx);
    eprintln!(
        "{} of 40 streams reset; held {peak} bytes at most of {LIMIT}",
        ended.len()
    );
    for (status, message) in &ended {
        assert_eq!(status.as_deref(), Some("8"), "{message:?}");
        let message = message.as_deref().unwrap_or_default();
        assert!(message.contains("limits.client_bytes"), "{message}");
    }
    // 4 MiB holds 20 of the 200,005-byte partial messages; the rest gave way.
    assert!(ended.len() >= 40 - 21, "only {} reset", ended.len());
    assert_eq!(
        hdsd.metric(r#"hdsd_limit_hits_total{limit="client_bytes"}"#),
        Some(ended.len() as f64)
    );
    // Everyone else is unaffected: a valid client is served at once.
    let took = valid_client_is_served(&hdsd);
    assert!(took < SOON, "a valid client waited {took:?}");
    drop(streams);
    rt.shutdown_timeout(Duration::from_secs(1));
    wait_for("the held bytes given back", SOON, || {
        let now = try_metric(&hdsd, held)?;
        (now == 0.0)
            .then_some(())
            .ok_or(format!("{now} bytes held"))
    });
}

/// The finding at its own scale, with the default budget (128 MiB): 1,000
/// streams over 125 connections, each holding 500,000 bytes of a message.
/// Measures hdsd's RSS; run by hand (`--ignored --nocapture`).
#[test]
#[ignore = "a measurement: 1,000 streams of 500 KB"]
fn measure_the_memory_budget_at_the_findings_scale() {
    let hdsd = Hdsd::start_with(|c| {
        if let Ok(bytes) = std::env::var("CLIENT_BYTES") {
            c.limits.client_bytes = bytes.parse().expect("CLIENT_BYTES: a number of bytes");
        }
    });
    served_web(&hdsd);
    let before = proc_status(hdsd.pid(), "VmRSS:");
    let (rt, streams, mut ended_rx) = open_partial_streams(&hdsd, 125, 499_990);
    wait_metric_at_least(
        &hdsd,
        r#"hdsd_limit_hits_total{limit="client_bytes"}"#,
        700.0,
        Duration::from_secs(60),
    );
    let ended = ends(&rt, &mut ended_rx);
    let peak = proc_status(hdsd.pid(), "VmHWM:");
    let held = hdsd.metric(r#"hdsd_client_bytes{state="held"}"#).unwrap();
    drop(streams);
    rt.shutdown_timeout(Duration::from_secs(1));
    wait_for("the held bytes given back", SOON, || {
        let now = try_metric(&hdsd, r#"hdsd_client_bytes{state="held"}"#)?;
        (now == 0.0)
            .then_some(())
            .ok_or(format!("{now} bytes held"))
    });
    let after = proc_status(hdsd.pid(), "VmRSS:");
    eprintln!(
        "1,000 streams of 500 KB: {} reset, {held} bytes held at the end; RSS {before} kB before, peak {peak} kB, {after} kB after",
        ended.len()
    );
    // The finding: 514 MB at the peak, 478 MB after. The budget bounds what
    // is counted; the allocator's pages behind the streams it reset come on top.
    assert!(peak < before + 3 * 128 * 1024, "peak RSS {peak} kB");
    let took = valid_client_is_served(&hdsd);
    assert!(took < SOON);
}

/// Issue 33, findings 1 and 2 at the default caps, with the findings' own
/// numbers: 10,033 idle HTTP/2 connections from 79 addresses (127 each,
/// under the per-address cap of 128) on the HDS port, 512 from 8 addresses
/// on the API port, then 8 x 64 slowloris connections on the API port. A
/// real Envoy, a gRPC client and API reads are timed meanwhile. It opens
/// about 10,600 sockets, so it is run by hand (`--ignored --nocapture`).
#[test]
#[ignore = "a measurement at the default caps: about 10,600 connections"]
fn measure_the_findings_floods_at_the_default_caps() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    served_web(&hdsd);
    let rss_before = proc_status(hdsd.pid(), "VmRSS:");
    let hds_from: Vec<[u8; 4]> = (0..79).map(|i| [127, 0, 1, 10 + i]).collect();
    let api_from: Vec<[u8; 4]> = (0..8).map(|i| [127, 0, 2, 10 + i]).collect();
    let started = Instant::now();
    let hds_flood = Flood::start(Attack::IdleH2, hdsd.hds, &hds_from, 127);
    let api_flood = Flood::start(Attack::IdleH2, hdsd.api, &api_from, 64);
    wait_for(
        "the HDS and API slots full",
        Duration::from_secs(120),
        || {
            let connections = |listener: &str| {
                hdsd.metric(&format!(
                    r#"hdsd_connections_open{{listener="{listener}"}}"#
                ))
                .unwrap_or(0.0)
            };
            let (hds, api) = (connections("hds"), connections("api"));
            (hds >= 9_990.0 && api >= 500.0)
                .then_some(())
                .ok_or(format!("hds {hds}, api {api}"))
        },
    );
    eprintln!(
        "slots full {:?} after the floods started; RSS {} -> {} kB",
        started.elapsed(),
        rss_before,
        proc_status(hdsd.pid(), "VmRSS:")
    );

    let started = Instant::now();
    let _envoy = crate::support::Envoy::start(hdsd.hds, "default.web", None);
    hdsd.wait_connected("default.web", true, Duration::from_secs(2));
    eprintln!("Envoy served {:?} after its start", started.elapsed());
    let took = valid_client_is_served(&hdsd);
    eprintln!("gRPC client served in {took:?}");
    assert!(took < Duration::from_secs(2), "gRPC client waited {took:?}");
    let slowest = api_keeps_answering(&hdsd, Duration::from_secs(5));
    eprintln!("API under the idle HTTP/2 flood: slowest answer {slowest:?}");
    let evicted = |listener: &str| {
        hdsd.metric(&format!(
            r#"hdsd_connections_evicted_total{{listener="{listener}",reason="max_connections"}}"#
        ))
        .unwrap_or(0.0)
    };
    eprintln!(
        "evicted so far: hds {}, api {}; oldest attacking connection {:?} (hds), {:?} (api); RSS {} kB",
        evicted("hds"),
        evicted("api"),
        hds_flood.oldest(),
        api_flood.oldest(),
        proc_status(hdsd.pid(), "VmRSS:")
    );
    // unauthenticated_timeout is 10 s: no attacking connection lives past
    // it (and a second for the sweep).
    assert!(hds_flood.oldest() < Duration::from_secs(11));
    assert!(api_flood.oldest() < Duration::from_secs(11));
    drop(api_flood);

    let slow = Flood::start(Attack::Slowloris, hdsd.api, &api_from, 64);
    slow.wait_holding(400);
    let slowest = api_keeps_answering(&hdsd, Duration::from_secs(5));
    eprintln!(
        "API under 8 x 64 slowloris connections: slowest answer {slowest:?}; longest trickler {:?}",
        slow.longest_lifetime()
    );
    drop(slow);
    drop(hds_flood);
    eprintln!("RSS after: {} kB", proc_status(hdsd.pid(), "VmRSS:"));
}
