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
use crate::support::{dataplane_yaml, wait_for, Hdsd, HdsdOptions};

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
    let hdsd = Hdsd::start(HdsdOptions {
        extra: "[api.limits]\nmax_watches = 3\nmax_watch_names = 100\n".into(),
        ..Default::default()
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
    let hdsd = Hdsd::start(HdsdOptions {
        extra: "[eds]\nmax_resource_names = 10\n".into(),
        env: vec![("HDSD_HDS__LIMITS__MAX_MESSAGE_BYTES".into(), "8192".into())],
        ..Default::default()
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
    let mut hdsd = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        ..Default::default()
    });
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
    let mut hdsd = Hdsd::start(HdsdOptions {
        api_tokens: r#"["s3cret"]"#,
        ..Default::default()
    });
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
        let sources = hdsd.get_json("/api/v1/sources")?;
        sources["files"]
            .as_array()
            .ok_or("no files")?
            .iter()
            .find(|f| {
                f["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("empty.yaml"))
            })
            .and_then(|f| f["error"]["message"].as_str().map(str::to_string))
            .ok_or_else(|| sources.to_string())
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

/// A token whose header names `kid` (anyone's text until the signature
/// verifies, which it never does).
fn forged_token(kid: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = serde_json::json!({ "alg": "EdDSA", "kid": kid }).to_string();
    format!(
        "{}.{}.AAAA",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode("{}")
    )
}

/// Issue 56, item 3: an EDS client's NACK text went into the log raw
/// (forged lines, 500 KB lines), a token header's `kid` made 15 KB refusal
/// lines, and the zone listener logged every refusal. Every client-sent
/// string reaches the log escaped and cut, and the zone listener's
/// refusals are limited per address.
#[test]
fn client_text_reaches_the_log_escaped_cut_and_rate_limited() {
    use hdsd::pb::zone_sync_service_client::ZoneSyncServiceClient;
    let hdsd = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra:
            "[global]\nenabled = true\nzones = [\"eu-1\"]\n\n[eds]\ntokens = [\"front-token\"]\n"
                .into(),
        ..Default::default()
    });
    hdsd.write_dataplane("web.yaml", &dataplane_yaml("web", &[(10001, 8080)]));
    let forged = "NACK\n2026-01-01T00:00:00.000000Z ERROR hdsd: forged line";
    let nack_text = format!("{forged}{}", "x".repeat(500_000));
    let rt = runtime();
    rt.block_on(async {
        // An EDS client that NACKs the first response with the forged text.
        let mut client = EndpointDiscoveryServiceClient::connect(format!("http://{}", hdsd.hds))
            .await
            .expect("EDS on the HDS port")
            .max_decoding_message_size(1 << 20);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(eds_request(
            vec!["default/web".into()],
            &format!("front\n{forged}"),
        ))
        .await
        .unwrap();
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request
            .metadata_mut()
            .insert("authorization", "Bearer front-token".parse().unwrap());
        let mut inbound = client
            .stream_endpoints(request)
            .await
            .expect("an EDS stream")
            .into_inner();
        let first = tokio::time::timeout(SOON, inbound.message())
            .await
            .expect("a response in time")
            .expect("a response")
            .expect("not ended");
        let mut nack = eds_request(vec!["default/web".into()], "front");
        nack.version_info = format!("v\n{forged}");
        nack.response_nonce = first.nonce.clone();
        nack.error_detail = Some(envoy_types::pb::google::rpc::Status {
            code: 3,
            message: nack_text.clone(),
            details: Vec::new(),
        });
        tx.send(nack).await.unwrap();
        // Zone streams with a forged token whose kid is 9,000 bytes, 20
        // times from one address.
        let token = forged_token(&"k".repeat(9000));
        for _ in 0..20 {
            let mut zones = ZoneSyncServiceClient::connect(format!(
                "http://{}",
                hdsd.zones.expect("the zone listener")
            ))
            .await
            .expect("the zone listener");
            let (_ztx, zrx) = tokio::sync::mpsc::channel::<hdsd::pb::ZoneMessage>(1);
            let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(zrx));
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            let status = zones.sync(request).await.expect_err("refused");
            assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        }
        drop(tx);
    });
    // The same kid on the HDS listener.
    let grpc = GrpcClient::connect(hdsd.hds);
    let token = forged_token(&"k".repeat(9000));
    let _refused = grpc.try_open_with_token(Some(&token)).map(|_| ());
    wait_for("the NACK logged", SOON, || {
        match log_lines(&hdsd, "EDS response rejected by the client (NACK)") {
            1 => Ok(()),
            n => Err(format!("{n} NACK lines")),
        }
    });
    wait_for("the HDS refusal logged", SOON, || {
        match log_lines(&hdsd, "stream refused: token header kid") {
            0 => Err("no HDS refusal line".to_string()),
            _ => Ok(()),
        }
    });
    let log = hdsd.log();
    let nack = log
        .lines()
        .find(|l| l.contains("(NACK)"))
        .expect("the NACK line");
    assert!(
        nack.contains("bytes in all)") && nack.contains("\\n2026-01-01"),
        "{nack}"
    );
    // No line is forged, and none is long.
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-01-01T00:00:00.000000Z")),
        "a forged line:\n{log}"
    );
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2048, "a log line of {longest} bytes");
    // 20 refused zone streams, 5 lines (the counter counts all 20).
    assert_eq!(
        log_lines(&hdsd, "zone stream refused"),
        5,
        "{}",
        log.lines()
            .filter(|l| l.contains("zone stream refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        hdsd.metric("hdsd_zone_refusals_total{code=\"unauthenticated\"}"),
        Some(20.0)
    );
}

/// One HTTP/1.1 request written as is (any `Host`, any header): the status
/// and the body.
fn raw_http(addr: std::net::SocketAddr, head: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    write!(
        stream,
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {answer}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Issue 56, item 7, over plain HTTP: on an open API, `Host: evil.example`
/// was answered (`DELETE /api/v1/zones/ap-1` gave 200) and a write from
/// another origin or with a simple body type went through. Unknown Host
/// names are refused (probes excepted, and the allowed names answered),
/// cross-origin writes are refused, writes need JSON, and the CLI's way
/// (no Origin, JSON) still writes.
#[test]
fn the_open_api_refuses_unknown_hosts_cross_origin_writes_and_simple_bodies() {
    let hdsd = Hdsd::start(HdsdOptions {
        auth_mode: "token",
        zone_listener: true,
        extra: "[global]\nenabled = true\n".into(),
        env: vec![(
            "HDSD_API__ALLOWED_HOSTS".into(),
            "[\"hdsd.internal\"]".into(),
        )],
        ..Default::default()
    });
    let api = hdsd.api;
    let own = format!("Host: {api}");
    let json = "Content-Type: application/json";
    let send = |request: &str, headers: &[&str], body: &str| {
        raw_http(
            api,
            &format!("{request} HTTP/1.1\r\n{}", headers.join("\r\n")),
            body,
        )
    };
    // The CLI's way registers and disables ap-1.
    assert_eq!(send("PUT /api/v1/zones/ap-1", &[&own, json], "{}").0, 200);
    assert_eq!(
        send("POST /api/v1/zones/ap-1/disable", &[&own, json], "").0,
        200
    );

    // A rebound DNS name: refused, reads and writes alike; probes answer.
    let (status, body) = send(
        "DELETE /api/v1/zones/ap-1",
        &["Host: evil.example:5680"],
        "",
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("api.allowed_hosts"), "{body}");
    assert_eq!(
        send("GET /api/v1/zones", &["Host: evil.example"], "").0,
        403
    );
    assert_eq!(send("GET /readyz", &["Host: lb.example"], "").0, 200);
    assert_eq!(
        send("GET /api/v1/zones", &["Host: hdsd.internal:5680"], "").0,
        200
    );
    assert_eq!(send("GET /api/v1/zones", &["Host: localhost"], "").0, 200);

    // Another origin's writes, whatever their body type.
    for origin in [
        "Origin: http://evil.example",
        "Origin: null",
        "Origin: http://127.0.0.1:1",
    ] {
        let (status, body) = send(
            "POST /api/v1/zones/ap-1/enable",
            &[&own, origin, json],
            "{}",
        );
        assert_eq!(status, 403, "{origin}: {body}");
        assert!(body.contains("cross-origin write"), "{body}");
    }
    // Simple bodies (what a page sends without a preflight).
    for ct in [
        "Content-Type: text/plain",
        "Content-Type: application/x-www-form-urlencoded",
        "Content-Type: multipart/form-data; boundary=x",
        "X-None: none",
    ] {
        let (status, body) = send("POST /api/v1/zones/ap-1/enable", &[&own, ct], "{}");
        assert_eq!(status, 415, "{ct}: {body}");
        assert!(body.contains("application/json"), "{body}");
    }
    let zone = hdsd
        .get_json("/api/v1/zones/ap-1")
        .expect("ap-1 is still there");
    assert_eq!(zone["state"], "disabled", "{zone}");
    // The API's own origin, and no Origin at all, write.
    let own_origin = format!("Origin: http://{api}");
    assert_eq!(
        send(
            "POST /api/v1/zones/ap-1/enable",
            &[&own, &own_origin, json],
            ""
        )
        .0,
        200
    );
    assert_eq!(send("DELETE /api/v1/zones/ap-1", &[&own], "").0, 200);
    for (reason, at_least) in [("host", 2.0), ("origin", 3.0), ("content_type", 4.0)] {
        let series = format!("hdsd_api_browser_refusals_total{{reason=\"{reason}\"}}");
        assert!(
            hdsd.metric(&series).is_some_and(|n| n >= at_least),
            "{series}: {:?}",
            hdsd.metric(&series)
        );
    }
}
