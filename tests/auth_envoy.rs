//! Dataplane tokens with real Envoy 1.40: who is served, who is refused, and
//! why, without harming the dataplanes that are served.

use std::time::Duration;

use crate::support::*;
use hdsd::auth::KeyRing;
use hdsd::clock::{Clock as _, SystemClock};

const CONNECT: Duration = Duration::from_secs(20);

fn token_server() -> Hdsd {
    Hdsd::start_with(|c| c.auth.mode = AuthMode::Token)
}

/// A dataplane with one healthy app, plus its Envoy served with a token
/// valid for `valid_for`; returns the token too.
fn served(hdsd: &Hdsd, name: &str, valid_for: &str) -> (App, Envoy, String) {
    let app = App::start();
    hdsd.write_dataplane(
        &format!("{name}.yaml"),
        &dataplane_yaml(name, &[(10001, app.port)]),
    );
    let id = format!("default.{name}");
    let token = hdsd.issue_token(&id, valid_for);
    let envoy = Envoy::start(hdsd.hds, &id, Some(&token));
    hdsd.wait_inbound(&id, 10001, "healthy", CONNECT);
    (app, envoy, token)
}
fn assert_never_connected(hdsd: &Hdsd, id: &str) {
    let dp = hdsd.dataplane(id).unwrap();
    assert!(!dp.connection.connected, "{dp:?}");
    assert_eq!(
        dp.connection.connected_at, None,
        "the stream never reached the registry: {dp:?}"
    );
    assert_eq!(dp.inbounds[0].health.status, "pending");
}

#[test]
fn each_bad_token_is_refused_with_its_status_and_others_are_unaffected() {
    let hdsd = token_server();
    let (_good_app, _good, _) = served(&hdsd, "good", "1h");
    let victim_app = App::start();
    hdsd.write_dataplane(
        "victim.yaml",
        &dataplane_yaml("victim", &[(10001, victim_app.port)]),
    );
    hdsd.wait_inbound("default.victim", 10001, "pending", Duration::from_secs(5));

    let valid = hdsd.issue_token("default.victim", "1h");
    let other = hdsd.issue_token("default.good", "1h");
    // Expired: signed with this server's key an hour and a half ago, valid for an hour.
    let ring = KeyRing::load(&hdsd.dir.path().join("state"), &[]).unwrap();
    let expired = ring
        .issue(
            "default",
            "victim",
            Duration::from_secs(3600),
            Duration::from_secs(8760 * 3600),
            Default::default(),
            SystemClock.now() - chrono::Duration::minutes(90),
        )
        .unwrap();
    // Bad signature: a valid token with its signature altered.
    let (head, sig) = valid.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let bad_signature = format!("{head}.{flipped}{}", &sig[1..]);
    // Unknown kid: a key this server has never seen.
    let stranger = tempfile::tempdir().unwrap();
    KeyRing::generate(stranger.path(), SystemClock.now()).unwrap();
    let unknown_kid = KeyRing::load(stranger.path(), &[])
        .unwrap()
        .issue(
            "default",
            "victim",
            Duration::from_secs(3600),
            Duration::from_secs(8760 * 3600),
            Default::default(),
            SystemClock.now(),
        )
        .unwrap();

    let cases: Vec<(Option<&str>, &str, &str)> = vec![
        (
            None,
            "16, ",
            "no dataplane token: issue one with `hdsd token issue",
        ),
        (
            Some(&other),
            "7, ",
            "token for default.good cannot be used by default.victim",
        ),
        (Some(&expired), "16, ", "token expired at "),
        (Some(&bad_signature), "16, ", "invalid token signature"),
        (Some(&unknown_kid), "16, ", "unknown signing key"),
    ];
    for (token, code, message) in cases {
        let envoy = Envoy::start(hdsd.hds, "default.victim", token);
        let line = envoy.wait_closure(message, CONNECT);
        assert!(
            line.contains(&format!("closed: {code}")),
            "status {code}for {message}: {line}"
        );
        drop(envoy);
        assert_never_connected(&hdsd, "default.victim");
    }
    // The served dataplane never noticed.
    let good = hdsd.dataplane("default.good").unwrap();
    assert!(good.connection.connected);
    assert_eq!(good.inbounds[0].health.status, "healthy");
    // Details stay in the server log, not in the client's message.
    assert!(hdsd.log().contains("stream refused"));

    // And the right token works.
    let _envoy = Envoy::start(hdsd.hds, "default.victim", Some(&valid));
    hdsd.wait_inbound("default.victim", 10001, "healthy", CONNECT);
}

#[test]
fn a_token_revoked_while_connected_ends_the_stream_within_a_second() {
    let hdsd = token_server();
    let (_app, envoy, token) = served(&hdsd, "web", "1h");

    let jti = hdsd.jti_of(&token);
    let revoked_at = std::time::Instant::now();
    hdsd.cli(&["token", "revoke", &jti]);
    hdsd.wait_connected("default.web", false, Duration::from_secs(1));
    assert!(revoked_at.elapsed() <= Duration::from_millis(1500));
    envoy.wait_closure("token revoked", CONNECT);
    // Envoy keeps reconnecting with the same token: refused every time.
    wait_for("a refused reconnect", CONNECT, || {
        let n = envoy
            .hds_closures()
            .iter()
            .filter(|l| l.contains("token revoked"))
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} refusals"))
        }
    });
    // The refusal is logged as the stream ends; the detach reaches the API
    // just after: wait for what is asserted.
    hdsd.wait_connected("default.web", false, Duration::from_secs(5));
}

#[test]
fn key_rotation_old_and_new_tokens_work_until_the_old_key_is_removed() {
    let hdsd = token_server();
    let a = App::start();
    let b = App::start();
    hdsd.write_dataplane("old.yaml", &dataplane_yaml("old", &[(10001, a.port)]));
    hdsd.write_dataplane("new.yaml", &dataplane_yaml("new", &[(10001, b.port)]));
    let keys = hdsd.dir.path().join("state/keys");
    let old_token = hdsd.issue_token("default.old", "1h");
    let old_kids: Vec<_> = std::fs::read_dir(&keys)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(
        old_kids.len(),
        2,
        "the first start created one key pair: {old_kids:?}"
    );

    // Add a key: new tokens are signed with it.
    hdsd.cli(&["token", "keygen"]);
    let new_token = hdsd.issue_token("default.new", "1h");
    let old_envoy = Envoy::start(hdsd.hds, "default.old", Some(&old_token));
    let _new_envoy = Envoy::start(hdsd.hds, "default.new", Some(&new_token));
    hdsd.wait_inbound("default.old", 10001, "healthy", CONNECT);
    hdsd.wait_inbound("default.new", 10001, "healthy", CONNECT);
    drop(old_envoy);

    // Remove the old key: its tokens are refused, the new key's still work.
    for f in &old_kids {
        std::fs::remove_file(f).unwrap();
    }
    // The state itself, not a log line (the keygen's reload logged one already).
    wait_for(
        "the old key to be dropped",
        Duration::from_secs(5),
        || match hdsd.metric("hdsd_auth_signing_keys") {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?} signing keys")),
        },
    );
    let refused = Envoy::start(hdsd.hds, "default.old", Some(&old_token));
    refused.wait_closure("unknown signing key", CONNECT);
    assert!(hdsd.dataplane("default.new").unwrap().connection.connected);
}

#[test]
fn a_token_that_expires_while_connected_ends_the_stream_at_expiry() {
    let hdsd = token_server();
    // Valid long enough for a slow (loaded) Envoy to start and be served
    // first: with 3 s it could expire before Envoy ever connected.
    let (_app, envoy, _token) = served(&hdsd, "web", "8s");
    // The stream ends when the token expires, and every reconnect is refused.
    let line = envoy.wait_closure("token expired at ", Duration::from_secs(20));
    assert!(line.contains("closed: 16, "), "{line}");
    hdsd.wait_connected("default.web", false, Duration::from_secs(5));
}

#[test]
fn a_revocation_ends_a_stream_that_is_busy_forwarding_reports() {
    use crate::support::grpc::{report, GrpcClient, Next};
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;

    let hdsd = token_server();
    let app = App::start();
    hdsd.write_dataplane("busy.yaml", &dataplane_yaml("busy", &[(10001, app.port)]));
    let token = hdsd.issue_token("default.busy", "1h");
    let client = GrpcClient::connect(hdsd.hds);
    let mut stream = client.open_with_token(Some(&token));
    stream.send(crate::support::grpc::hc_request(Some("default.busy")));
    stream.expect_specifier(CONNECT);

    // Reports as fast as the stream takes them, from another thread, until
    // the stream is ended (or a deadline).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < deadline
                && stream.try_send(report(&[("127.0.0.1", app.port, HealthStatus::Healthy)]))
            {
                sent += 1;
            }
            (stream, sent)
        })
    };
    let reports = || hdsd.metric("hdsd_reports_total").unwrap_or(0.0);
    wait_for("reports to flow", CONNECT, || {
        let n = reports();
        if n >= 200.0 {
            Ok(())
        } else {
            Err(format!("{n} reports"))
        }
    });

    let jti = hdsd
        .cli(&["token", "inspect", &token])
        .lines()
        .find_map(|l| l.trim().strip_prefix("jti:").map(|j| j.trim().to_string()))
        .expect("inspect prints the jti");
    hdsd.cli(&["token", "revoke", &jti]);
    // From the revocation written (the CLI process's own start-up, slow on
    // a loaded machine, is not part of it) to the stream ended: a deadline,
    // not a measurement.
    let revoked_at = std::time::Instant::now();
    hdsd.wait_connected("default.busy", false, Duration::from_secs(5));
    eprintln!(
        "the busy stream ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut stream, sent) = sender.join().unwrap();
    assert!(sent >= 200, "{sent} reports sent");
    // The client is told why.
    let mut status = None;
    for _ in 0..1000 {
        match stream.next(CONNECT) {
            Next::Specifier(_) => continue,
            Next::Status(s) => {
                status = Some(s);
                break;
            }
            other => panic!("the stream ended without a status: {other:?}"),
        }
    }
    let status = status.expect("a status");
    assert!(status.message().contains("token revoked"), "{status:?}");
    assert_eq!(
        hdsd.metric("hdsd_auth_failures_total{reason=\"revoked\"}"),
        Some(1.0)
    );
}

/// A token's expiry is shown before it is an outage (the API, `hdsd
/// status`, the metric), and tokens overlap: a new one is accepted while
/// the old one still serves, and the old one stays valid after the switch.
#[test]
fn token_expiry_is_shown_and_a_rotation_overlaps() {
    let hdsd = token_server();
    let issued = SystemClock.now();
    let (_app, old_envoy, old_token) = served(&hdsd, "web", "48h");
    let dp = hdsd.dataplane("default.web").unwrap();
    let expires = dp.connection.token_expires_at.expect("tokenExpiresAt");
    let off = (expires - (issued + chrono::Duration::hours(48)))
        .num_seconds()
        .abs();
    assert!(off < 60, "expires {expires}, issued {issued}");
    let left = hdsd.metric("hdsd_token_earliest_expiry_seconds").unwrap();
    assert!(
        (48.0 * 3600.0 - 120.0..=48.0 * 3600.0).contains(&left),
        "{left} s left"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["status", "--api", &hdsd.api_url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Earliest token expiry: default.web at") && text.contains("(in 1d 23h)"),
        "{text}"
    );

    // The next token, issued while the old one serves: both verify.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args([
            "token",
            "issue",
            "--mesh",
            "default",
            "--name",
            "web",
            "--valid-for",
            "72h",
        ])
        .arg("--config")
        .arg(hdsd.config_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let new_token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("expires at ") && said.contains("valid for 3days"),
        "{said}"
    );
    for token in [&old_token, &new_token] {
        let inspection = hdsd.cli(&["token", "inspect", token]);
        assert!(inspection.contains("verdict: accepted"), "{inspection}");
    }
    assert!(hdsd.dataplane("default.web").unwrap().connection.connected);

    // The Envoy restarts with the new token: served, the new expiry shown;
    // the old token still verifies until it expires or is revoked.
    drop(old_envoy);
    let _envoy = Envoy::start(hdsd.hds, "default.web", Some(&new_token));
    let dp = wait_for("the new token's stream", CONNECT, || {
        let dp = hdsd.dataplane("default.web")?;
        match dp.connection.token_expires_at {
            Some(at) if at > expires + chrono::Duration::hours(23) => Ok(dp),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(dp.connection.connected);
    hdsd.wait_inbound("default.web", 10001, "healthy", CONNECT);
    let inspection = hdsd.cli(&["token", "inspect", &old_token]);
    assert!(inspection.contains("verdict: accepted"), "{inspection}");
}
