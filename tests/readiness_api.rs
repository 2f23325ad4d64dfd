//! hdsd's own API (`proto/hdsd/v1/readiness.proto`) from outside: a Python
//! client generated from `proto/` in the test run (grpcio-tools) lists, gets
//! and watches readiness of dataplanes served by real Envoys; a Rust client
//! checks auth, errors and the standard health service; SSE carries the same
//! watch.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{dataplane_yaml, wait_for, App, Envoy, Hdsd, HdsdOptions};
use hdsd::consumers::pb;
use serde_json::Value;

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no .venv/bin/python: run scripts/setup.sh (it installs grpcio and grpcio-tools)"
    );
    venv
}

/// Generates the Python client code from proto/ into a temporary directory.
fn generate_python_client() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(python())
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(root.join("proto"))
        .arg(format!("--python_out={}", out.path().display()))
        .arg(format!("--grpc_python_out={}", out.path().display()))
        .arg(root.join("proto/hdsd/v1/readiness.proto"))
        .status()
        .expect("run grpc_tools.protoc (scripts/setup.sh installs grpcio-tools)");
    assert!(status.success(), "grpc_tools.protoc failed");
    out
}

/// `examples/python/follow_readiness.py`, its JSON lines collected as they come.
struct Follower {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Follower {
    fn start(generated: &Path, target: std::net::SocketAddr, args: &[String]) -> Follower {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/follow_readiness.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg("--target")
            .arg(target.to_string())
            .args(args)
            .env("PYTHONPATH", generated)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the Python client");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON from the client: {line}: {e}"));
                sink.lock().unwrap().push(value);
            }
        });
        Follower { child, lines }
    }

    fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until a line satisfies `pred`; returns its index.
    fn wait_line(&self, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> usize {
        wait_for(what, timeout, || {
            let lines = self.lines();
            lines
                .iter()
                .position(&pred)
                .ok_or_else(|| format!("{lines:?}"))
        })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is(line: &Value, kind: &str, name: &str) -> bool {
    line["type"] == kind && line["name"] == name
}

#[test]
fn a_python_client_lists_gets_watches_and_resumes_without_gaps_or_repeats() {
    let generated = generate_python_client();
    let options = HdsdOptions::default();
    // unhealthy_threshold x check interval + timeout + report interval.
    let detection = Duration::from_millis(2 * 200 + 100 + 200);
    let hdsd = Hdsd::start(options);
    let mut app_a = App::start();
    let mut app_b = App::start();
    hdsd.write_dataplane(
        "web-1.yaml",
        &dataplane_yaml("web-1", &[(20001, app_a.port)]),
    );
    hdsd.write_dataplane(
        "web-2.yaml",
        &dataplane_yaml("web-2", &[(20002, app_b.port)]),
    );
    let _envoy_1 = Envoy::start(hdsd.hds, "default.web-1", None);
    let _envoy_2 = Envoy::start(hdsd.hds, "default.web-2", None);
    hdsd.wait_inbound("default.web-1", 20001, "healthy", Duration::from_secs(30));
    hdsd.wait_inbound("default.web-2", 20002, "healthy", Duration::from_secs(30));

    let follower = Follower::start(generated.path(), hdsd.api, &[]);
    let synced = follower.wait_line("SYNCED", Duration::from_secs(20), |l| l["type"] == "SYNCED");
    let lines = follower.lines();
    let list = &lines[0]["list"];
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{lines:?}");
    assert_eq!(list[0]["name"], "web-1");
    assert_eq!(list[0]["ready"], true);
    assert_eq!(lines[synced - 1]["type"], "SNAPSHOT");
    assert_eq!(
        lines[synced - 1]["dataplanes"].as_array().map(Vec::len),
        Some(2)
    );

    // Stopping an app: one CHANGED event for its dataplane, not ready.
    let stopped = Instant::now();
    app_a.stop();
    let changed = follower.wait_line("CHANGED web-1", Duration::from_secs(20), |l| {
        is(l, "CHANGED", "web-1")
    });
    let took = stopped.elapsed();
    let line = &follower.lines()[changed];
    assert_eq!(line["ready"], false, "{line}");
    assert_eq!(line["inbounds"]["20001"], "STATUS_UNHEALTHY", "{line}");
    eprintln!(
        "app stopped -> CHANGED event at the client: {took:?} (detection time {detection:?})"
    );
    assert!(
        took <= detection + Duration::from_secs(4),
        "the event took {took:?}; detection time is {detection:?}"
    );
    // A fence: web-2's change comes after several more reports of web-1's
    // Envoy, none of which may make another event for web-1.
    app_b.stop();
    follower.wait_line("CHANGED web-2", Duration::from_secs(20), |l| {
        is(l, "CHANGED", "web-2")
    });
    let lines = follower.lines();
    let web1: Vec<&Value> = lines.iter().filter(|l| is(l, "CHANGED", "web-1")).collect();
    assert_eq!(web1.len(), 1, "exactly one event for one change: {web1:?}");
    let last_seen = lines
        .iter()
        .filter_map(|l| l["revision"].as_u64())
        .max()
        .unwrap();
    drop(follower);

    // While no client listens, web-1 comes back.
    app_a.resume();
    hdsd.wait_inbound("default.web-1", 20001, "healthy", Duration::from_secs(30));

    // Resume after the last revision seen: the replay, then SYNCED.
    let resumed = Follower::start(
        generated.path(),
        hdsd.api,
        &["--since".into(), last_seen.to_string()],
    );
    let synced = resumed.wait_line("SYNCED after the replay", Duration::from_secs(20), |l| {
        l["type"] == "SYNCED"
    });
    let lines = resumed.lines();
    let replay = &lines[1..synced];
    assert!(
        replay
            .iter()
            .all(|l| l["type"] != "SNAPSHOT" && l["type"] != "RESYNC"),
        "a known revision resumes without a snapshot: {replay:?}"
    );
    // Nothing twice: every replayed revision is newer than the last one seen.
    for l in replay {
        assert!(
            l["revision"].as_u64().unwrap() > last_seen,
            "{l} was seen before"
        );
    }
    // Nothing missed: every dataplane whose revision (in the list taken just
    // before the watch) is newer than the last one seen is in the replay.
    let mut expected: Vec<String> = lines[0]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["revision"].as_u64().unwrap() > last_seen)
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    let mut got: Vec<String> = replay
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "replay {replay:?}");
    assert_eq!(got, ["web-1"]);
    let back = replay.iter().find(|l| l["name"] == "web-1").unwrap();
    assert_eq!(back["ready"], true);
    assert_eq!(back["inbounds"]["20001"], "STATUS_HEALTHY");

    // The metrics count the watchers and what they were sent.
    let metrics = hdsd.metrics();
    assert!(metrics.contains("hdsd_watchers_active 1"), "{metrics}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn grpc_and_sse_share_the_api_port_tokens_and_errors() {
    let hdsd = Hdsd::start_with(|c| c.api.tokens = vec!["s3cret".into()]);
    hdsd.write_dataplane("web-1.yaml", &dataplane_yaml("web-1", &[(20001, 1)]));
    let rt = runtime();
    rt.block_on(async {
        use pb::readiness_service_client::ReadinessServiceClient;
        let channel = hdsd.api_channel().await;
        let mut open = ReadinessServiceClient::new(channel.clone());
        let err = open
            .list_dataplanes(pb::ListDataplanesRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(err.message().contains("authorization: Bearer"), "{err:?}");

        let token: tonic::metadata::MetadataValue<_> = "Bearer s3cret".parse().unwrap();
        let mut client = ReadinessServiceClient::with_interceptor(
            channel.clone(),
            move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", token.clone());
                Ok(r)
            },
        );
        let list = wait_until_listed(&mut client).await;
        assert_eq!(list.items[0].name, "web-1");
        assert_eq!(
            list.items[0].inbounds[0].health.as_ref().unwrap().status(),
            pb::Status::Pending
        );
        assert!(list.revision >= list.items[0].revision && list.items[0].revision > 0);
        let err = client
            .get_dataplane(pb::GetDataplaneRequest {
                mesh: "default".into(),
                name: "nope".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(
            err.message(),
            "dataplane default.nope not found; GET /api/v1/dataplanes lists the known ones"
        );
        let services = client
            .list_services(pb::ListServicesRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(services.items[0].name, "svc-20001");
        assert_eq!(services.items[0].status(), pb::ServiceStatus::Offline);

        // The standard health service answers, without a token.
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "hdsd.v1.ReadinessService".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            status.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    });

    // SSE: the same watch; Last-Event-ID resumes.
    let events = sse(&hdsd, None, "synced");
    assert_eq!(events[0].0, "snapshot");
    assert!(events[0].2.contains("\"name\":\"web-1\""), "{events:?}");
    assert_eq!(events[1].0, "synced");
    let revision: u64 = events[1].1.parse().unwrap();
    hdsd.remove_dataplane("web-1.yaml");
    // The replay (or, if the deletion comes later, the live event) after SYNCED.
    let events = sse(&hdsd, Some(&revision.to_string()), "deleted");
    let deleted = events.last().unwrap();
    assert!(deleted.2.contains("\"name\":\"web-1\""), "{events:?}");
    for (event, id, _) in &events {
        let id: u64 = id.parse().unwrap();
        match event.as_str() {
            // Up to date as of a revision at least as new as the one we had.
            "synced" => assert!(id >= revision, "{events:?}"),
            _ => assert!(id > revision, "seen before: {events:?}"),
        }
    }
    assert!(
        events.iter().all(|e| e.0 == "deleted" || e.0 == "synced"),
        "a known revision resumes without a snapshot: {events:?}"
    );
    // A REST client without the token is refused as before.
    let err = ureq::get(&hdsd.api_url("/api/v1/watch"))
        .call()
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
}

async fn wait_until_listed<T>(
    client: &mut pb::readiness_service_client::ReadinessServiceClient<T>,
) -> pb::ListDataplanesResponse
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = client
            .list_dataplanes(pb::ListDataplanesRequest::default())
            .await
            .expect("ListDataplanes")
            .into_inner();
        if !list.items.is_empty() {
            return list;
        }
        assert!(Instant::now() < deadline, "web-1 never listed");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn sse(hdsd: &Hdsd, last_event_id: Option<&str>, until: &str) -> Vec<(String, String, String)> {
    hdsd.sse(Some("s3cret"), last_event_id, until)
}

#[test]
fn the_api_docs_show_the_python_client_the_tests_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("examples/python/follow_readiness.py")).unwrap();
    let docs = std::fs::read_to_string(root.join("docs/api.md")).unwrap();
    let start = script.find("def follow(").unwrap();
    let end = script.find("\n\n\ndef main").unwrap();
    assert!(
        docs.contains(&script[start..end]),
        "docs/api.md (\"A Python client\") must show follow() exactly as examples/python/follow_readiness.py has it"
    );
}
