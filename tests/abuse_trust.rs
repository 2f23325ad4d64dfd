//! Issue 33, findings 4, 6 and 7 against the real binary: watches and EDS
//! requests past their limits are refused with `RESOURCE_EXHAUSTED`, counted
//! and logged; files another user could change (the keys directory, a key,
//! the config) are refused; secrets others can read and a state directory
//! others can write are warned about; a file of 262,000 empty documents is
//! refused by the document limit.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
use hdsd::consumers::pb;
use pb::readiness_service_client::ReadinessServiceClient;
use tonic::Code;

use crate::support::grpc::{hc_request, GrpcClient};
use crate::support::{dataplane_yaml, wait_for, AuthMode, Hdsd, HdsdOptions};

const SOON: Duration = Duration::from_secs(10);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("dp-{i:06}")).collect()
}

fn log_lines(hdsd: &Hdsd, needle: &str) -> usize {
    hdsd.log().lines().filter(|l| l.contains(needle)).count()
}

/// Finding 4: 100 `Watch` calls naming 100,000 dataplanes each took RSS
/// from 16 to 399 MB. A watch naming more than `api.limits.max_watch_names`
/// and one past `api.limits.max_watches` are refused (gRPC:
/// `RESOURCE_EXHAUSTED`; SSE: 400 and 429), counted, and logged once.
#[test]
fn watches_past_their_limits_are_refused() {
    let hdsd = Hdsd::start_with(|c| {
        c.api.limits.max_watches = 3;
        c.api.limits.max_watch_names = 100;
    });
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, 8080)]));
    let before = rss_kib(hdsd.pid());
    let rt = runtime();
    rt.block_on(async {
        let channel = hdsd.api_channel().await;
        let client = ReadinessServiceClient::new(channel);
        let watch = |names: Vec<String>| {
            let mut client = client.clone();
            async move {
                client
                    .watch(pb::WatchRequest {
                        names,
                        ..Default::default()
                    })
                    .await
            }
        };

        // The finding's calls, a tenth of the size: 100 at once, 10,000
        // names each. Every one is refused; none is kept.
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..100 {
            calls.spawn(watch(names(10_000)));
        }
        for result in calls.join_all().await {
            let status = result.expect_err("a watch naming 10,000 dataplanes");
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(
                status
                    .message()
                    .contains("more than api.limits.max_watch_names (100)"),
                "{status:?}"
            );
        }

        // At the limit: served.
        let mut open = Vec::new();
        for _ in 0..3 {
            let mut stream = watch(names(100))
                .await
                .expect("a watch of 100")
                .into_inner();
            let first = tokio::time::timeout(SOON, stream.message())
                .await
                .expect("the snapshot in time")
                .expect("a message")
                .expect("not the end");
            assert_eq!(first.r#type(), pb::watch_event::Type::Snapshot);
            open.push(stream);
        }
        // One more than max_watches: refused, whatever it names.
        let status = watch(Vec::new()).await.expect_err("a fourth watch");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("api.limits.max_watches"),
            "{status:?}"
        );
        // SSE shares the slots.
        let sse = ureq::get(&hdsd.api_url("/api/v1/watch"))
            .config()
            .http_status_as_error(false)
            .timeout_global(Some(SOON))
            .build()
            .call()
            .unwrap();
        assert_eq!(sse.status(), 429);
        // A slot comes back when its watch ends.
        drop(open.pop());
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            match watch(Vec::new()).await {
                Ok(stream) => {
                    open.push(stream.into_inner());
                    break;
                }
                Err(status) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "no slot came back: {status:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let names_hits = hdsd.metric("hdsd_limit_hits_total{limit=\"max_watch_names\"}");
    assert_eq!(names_hits, Some(100.0));
    let slot_hits = hdsd
        .metric("hdsd_limit_hits_total{limit=\"max_watches\"}")
        .unwrap();
    assert!(slot_hits >= 2.0, "{slot_hits}");
    // The default without api.tokens is said for what it is, once.
    assert_eq!(log_lines(&hdsd, "the API is open (api.tokens is empty)"), 1);
    // Logged once (at most a line a minute), not once per refusal.
    assert_eq!(log_lines(&hdsd, "watch refused"), 1, "{}", hdsd.log());
    let after = rss_kib(hdsd.pid());
    eprintln!("RSS before the watches {before} KiB, after {after} KiB");
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
}

fn eds_request(names: Vec<String>, node_id: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(Node {
            id: node_id.into(),
            ..Default::default()
        }),
        resource_names: names,
        type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment".into(),
        ..Default::default()
    }
}

/// The status an EDS stream ends with after `request`.
async fn eds_end(hds: std::net::SocketAddr, request: DiscoveryRequest) -> tonic::Status {
    let mut client = EndpointDiscoveryServiceClient::connect(format!("http://{hds}"))
        .await
        .expect("EDS on the HDS port");
    // Sent, and the request stream kept open: the end is hdsd's.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(request).await.unwrap();
    let response = tokio::time::timeout(
        SOON,
        client.stream_endpoints(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .expect("the stream opens in time");
    let status = match response {
        Err(status) => status,
        Ok(response) => {
            let mut inbound = response.into_inner();
            loop {
                match tokio::time::timeout(SOON, inbound.message())
                    .await
                    .expect("an answer in time")
                {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("the stream ended with OK"),
                    Err(status) => break status,
                }
            }
        }
    };
    drop(tx);
    status
}

/// Finding 6 (last part): EDS requests over the size limit ended with
/// grpc-status OK, no log, no metric. Over `hds.limits.max_message_bytes` or
/// `eds.max_resource_names`, a stream ends with `RESOURCE_EXHAUSTED`,
/// counted and logged once.
#[test]
fn eds_requests_past_the_limits_end_with_resource_exhausted() {
    let hdsd = Hdsd::start_with(|c| {
        c.eds.max_resource_names = 10;
        c.hds.limits.max_message_bytes = 8192;
    });
    let rt = runtime();
    let (big, many, fine) = rt.block_on(async {
        let big = eds_end(
            hdsd.hds,
            eds_request(vec!["default/web".into()], &"x".repeat(10_000)),
        )
        .await;
        let many = eds_end(hdsd.hds, eds_request(names(11), "front")).await;
        // Within both: served (the stream stays open, so no status).
        let mut client = EndpointDiscoveryServiceClient::connect(format!("http://{}", hdsd.hds))
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(eds_request(names(10), "front")).await.unwrap();
        let mut inbound = client
            .stream_endpoints(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("a stream within the limits")
            .into_inner();
        let fine = tokio::time::timeout(Duration::from_millis(500), inbound.message()).await;
        (big, many, fine.map(|r| r.map(|_| ())))
    });
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    assert!(
        big.message().contains("hds.limits.max_message_bytes"),
        "{big:?}"
    );
    assert_eq!(many.code(), Code::ResourceExhausted, "{many:?}");
    assert!(
        many.message()
            .contains("the request names 11 resources, more than eds.max_resource_names (10)"),
        "{many:?}"
    );
    assert!(
        !matches!(fine, Ok(Err(_))),
        "a request within the limits was refused: {fine:?}"
    );
    assert_eq!(
        hdsd.metric("hdsd_limit_hits_total{limit=\"max_message_bytes\"}"),
        Some(1.0)
    );
    assert_eq!(
        hdsd.metric("hdsd_limit_hits_total{limit=\"max_eds_resource_names\"}"),
        Some(1.0)
    );
    assert_eq!(log_lines(&hdsd, "EDS stream ended"), 2, "{}", hdsd.log());
}

/// A key pair and a token of it, made in another state directory (by
/// "another user"): `(its public key file, the token)`.
fn foreign_key(hdsd: &Hdsd, other: &Path) -> (std::path::PathBuf, String) {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(args)
            .arg("--config")
            .arg(hdsd.config_path())
            .env("HDSD_STATE_DIR", other)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["token", "keygen"]);
    let token = run(&[
        "token",
        "issue",
        "--mesh",
        "default",
        "--name",
        "web",
        "--valid-for",
        "1h",
    ]);
    let public = std::fs::read_dir(other.join("keys"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".pub.pem"))
        .expect("a public key");
    (public, token.trim().to_string())
}

/// Finding 6: a keys directory others could write let another user plant
/// a public key whose token was accepted within 2 s. Now the directory is
/// refused (the keys already loaded stay), the planted token never works,
/// and hdsd does not start with such a directory; the message names the
/// path and the fix.
#[test]
fn a_keys_directory_others_can_write_is_refused() {
    let mut hdsd = Hdsd::start_with(|c| c.auth.mode = AuthMode::Token);
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, 8080)]));
    wait_for("web defined", SOON, || {
        hdsd.dataplane("default.web").map(|_| ())
    });
    let good = hdsd.issue_token("default.web", "1h");
    let other = tempfile::tempdir().unwrap();
    let (public, planted) = foreign_key(&hdsd, other.path());
    let keys = hdsd.dir.path().join("state").join("keys");

    chmod(&keys, 0o777);
    let name = public.file_name().unwrap();
    std::fs::copy(&public, keys.join(name)).unwrap();
    let refusal = wait_for("the reload's refusal", SOON, || {
        hdsd.log()
            .lines()
            .find(|l| l.contains("keeping the previous keys"))
            .map(str::to_string)
            .ok_or_else(|| "not yet".to_string())
    });
    assert!(refusal.contains(&keys.display().to_string()), "{refusal}");
    assert!(refusal.contains("chmod go-w"), "{refusal}");
    assert!(refusal.contains("0777"), "{refusal}");

    let client = GrpcClient::connect(hdsd.hds);
    match client.try_open_with_token(Some(&planted)) {
        Err(status) => assert_eq!(status.code(), Code::Unauthenticated, "{status:?}"),
        Ok(mut stream) => {
            stream.send(hc_request(Some("default.web")));
            let status = stream.expect_status(Code::Unauthenticated, SOON);
            assert!(
                status.message().contains("unknown signing key"),
                "{status:?}"
            );
        }
    }
    // The keys loaded before still work.
    let mut web = client.open_with_token(Some(&good));
    web.send(hc_request(Some("default.web")));
    web.expect_specifier(SOON);
    drop(web);

    // Restarted with that directory, hdsd refuses to start.
    hdsd.kill();
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["serve", "--config"])
        .arg(hdsd.config_path())
        .env_remove("RUST_LOG")
        .env_remove("LISTEN_FDS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the keys directory {} is writable by its group and every user (mode 0777)",
            keys.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("chmod go-w"), "{stderr}");
}

/// Finding 6: a world-readable config holding `api.tokens` and a 0777 state
/// directory passed silently; a config others can write was read. Now the
/// first two are warned about at start (once), the last is refused.
#[test]
fn loose_config_and_state_directory() {
    let mut hdsd = Hdsd::start_with(|c| c.api.tokens = vec!["s3cret".into()]);
    let config = hdsd.config_path();
    let state = hdsd.dir.path().join("state");
    chmod(&config, 0o644);
    chmod(&state, 0o777);
    hdsd.restart();
    let log = hdsd.log();
    let readable = format!(
        "config file (it holds api.tokens, eds.tokens or store.postgres.url) {} has mode 0644",
        config.display()
    );
    // Once per start: the test's config is 0644 from the first one on.
    assert_eq!(log.matches(&readable).count(), 2, "{log}");
    let writable = format!(
        "state_dir {} is writable by its group and every user (mode 0777)",
        state.display()
    );
    assert_eq!(log.matches(&writable).count(), 1, "{log}");

    // Others can write the config: `validate` and `serve` refuse it.
    chmod(&config, 0o666);
    for command in ["validate", "serve"] {
        let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args([command, "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .env_remove("LISTEN_FDS")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "config file {} is writable by its group and every user (mode 0666)",
                config.display()
            )),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("chmod go-w {}", config.display())),
            "{stderr}"
        );
    }
    chmod(&config, 0o600);
    chmod(&state, 0o700);
}

/// Finding 7: a file of 262,000 empty documents (1 MiB of `---`) cost
/// +38 MB of RSS and 0.74 s of CPU, kept for as long as the file was
/// there. It is refused by `dataplanes.max_documents`, like any file past
/// a limit, and the document cache's size is a metric.
#[test]
fn a_file_of_262000_empty_documents_is_refused() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    hdsd.write_dataplane("good.yaml", &dataplane_yaml("good", &[(10001, 8080)]));
    wait_for("good defined", SOON, || {
        hdsd.dataplane("default.good").map(|_| ())
    });
    let cached = wait_for("the cache's size", SOON, || {
        match hdsd.metric("hdsd_dataplane_document_cache_documents") {
            Some(n) if n >= 1.0 => Ok(hdsd.metric("hdsd_dataplane_document_cache_bytes")),
            other => Err(format!("{other:?}")),
        }
    })
    .expect("hdsd_dataplane_document_cache_bytes");
    let before = rss_kib(hdsd.pid());
    let text = "---\n".repeat(262_000);
    assert!(text.len() <= 1 << 20);
    hdsd.write_dataplane("empty.yaml", &text);
    let message = wait_for("the file's error", SOON, || {
        let sources = hdsd.sources()?;
        sources
            .files
            .iter()
            .find(|f| f.path.ends_with("empty.yaml"))
            .and_then(|f| f.error.as_ref().map(|e| e.message.clone()))
            .ok_or_else(|| format!("{sources:?}"))
    });
    assert!(
        message.contains("more than 10000 documents (dataplanes.max_documents)"),
        "{message}"
    );
    assert_eq!(
        hdsd.metric("hdsd_dataplane_file_limit_hits_total{limit=\"documents\"}"),
        Some(1.0)
    );
    let after = rss_kib(hdsd.pid());
    eprintln!("RSS before the file {before} KiB, after {after} KiB");
    assert!(after < before + 8 * 1024, "RSS {before} -> {after} KiB");
    // Nothing of the refused file is kept.
    assert_eq!(
        hdsd.metric("hdsd_dataplane_document_cache_bytes"),
        Some(cached)
    );
}
