//! Dataplane files in the shapes current Kuma writes: mixed-resource files,
//! gateways, zone proxies, the new inbound fields, JSON, templates.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::*;
use hdsd::config::DataplanesConfig;
use hdsd::dataplane::UnknownFields;

/// Envoy start, first connection and first report.
const CONNECT: Duration = Duration::from_secs(20);
/// A file change reaching the API (the watcher debounces 100ms).
const RELOAD: Duration = Duration::from_secs(5);

const FIXTURES: &[&str] = &[
    "mixed.yaml",
    "gateway.yaml",
    "zone-proxy.yaml",
    "inbound-fields.yaml",
    "dataplane.json",
];

fn fixture(dir: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `hdsd validate` against this server's config: (success, stdout, stderr).
fn validate(hdsd: &Hdsd) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["validate", "--config"])
        .arg(hdsd.config_path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run hdsd validate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `hdsd status` against this server's API.
fn status(hdsd: &Hdsd) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["status", "--api", &hdsd.api_url("")])
        .output()
        .expect("run hdsd status");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kuma_files_load_and_other_documents_are_listed_as_ignored() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    for name in FIXTURES {
        hdsd.write_dataplane(name, &fixture("kuma", name));
    }
    let sources = wait_for("every fixture in /api/v1/sources", RELOAD, || {
        let v = hdsd.get_json("/api/v1/sources")?;
        match v["files"].as_array() {
            Some(files) if files.len() == FIXTURES.len() => Ok(v),
            _ => Err(v.to_string()),
        }
    });
    assert_eq!(sources["errors"], 0, "{sources}");
    assert_eq!(sources["ignored"], 3, "{sources}");
    let mixed = sources["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("mixed.yaml"))
        .expect("mixed.yaml listed");
    assert_eq!(
        mixed["dataplanes"],
        serde_json::json!(["default.backend-01", "default.frontend-01"])
    );
    assert_eq!(
        mixed["ignored"],
        serde_json::json!([
            {"document": 1, "type": "Mesh", "name": "default"},
            {"document": 3, "type": "MeshTrafficPermission", "name": "allow-all"},
            {"document": 5, "type": "MeshHealthCheck", "name": "backend-hc"},
        ])
    );

    // Gateways and zone proxies: defined, nothing to probe, shown as such.
    let edge = hdsd.dataplane("default.edge-gateway").unwrap();
    assert_eq!(
        edge.kind,
        hdsd::dataplane::DataplaneKind::Gateway,
        "{edge:?}"
    );
    assert!(edge.inbounds.is_empty(), "{edge:?}");
    let zp = hdsd.dataplane("default.zone-proxy-01").unwrap();
    assert_eq!(zp.kind, hdsd::dataplane::DataplaneKind::ZoneProxy);
    assert_eq!(zp.listeners.len(), 2);
    assert!(zp.is_ready(), "nothing to probe holds it back");

    // Inbound names and declared states.
    let web = hdsd.dataplane("default.web-01").unwrap();
    let by_name = |name: &str| {
        web.inbounds
            .iter()
            .find(|i| i.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("inbound {name}: {web:?}"))
    };
    assert_eq!(by_name("http-port").health.status, "pending");
    assert!(!by_name("draining").health.ready);
    assert_eq!(by_name("metrics").health.status, "ignored");
    assert!(by_name("metrics").health.ready);
    assert_eq!(
        hdsd.dataplane("default.json-01").unwrap().inbounds[0]
            .name
            .as_deref(),
        Some("main")
    );

    // `hdsd validate` counts what it skipped.
    let (ok, stdout, stderr) = validate(&hdsd);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("ignored 3 documents that are not Dataplanes (Mesh: 1, MeshHealthCheck: 1, MeshTrafficPermission: 1)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok: configuration valid, 7 dataplanes"),
        "{stdout}"
    );

    // `hdsd status` shows inbound names and leaves ignored inbounds out of the count.
    let status = status(&hdsd);
    assert!(status.contains("21021 (http-port)"), "{status}");
    assert!(
        status.contains("zone proxy (ZoneIngress 10001, ZoneEgress 10002)"),
        "{status}"
    );
    assert!(status.contains("(1 ignored)"), "{status}");

    // A template and a typo are refused, naming the file and the line.
    hdsd.write_dataplane("template.yaml", &fixture("kuma-invalid", "template.yaml"));
    hdsd.write_dataplane("typo.yaml", &fixture("kuma-invalid", "typo.yaml"));
    wait_for("two errors", RELOAD, || {
        let v = hdsd.sources()?;
        if v.errors == 2 {
            Ok(())
        } else {
            Err(format!("{v:?}"))
        }
    });
    let (ok, _, stderr) = validate(&hdsd);
    assert!(!ok);
    assert!(
        stderr.contains("template.yaml:5: {{ name }} is a template placeholder"),
        "{stderr}"
    );
    assert!(stderr.contains("render it first"), "{stderr}");
    assert!(stderr.contains("typo.yaml:12: document 2: "), "{stderr}");
    assert!(stderr.contains("unknown field `protocl`"), "{stderr}");
    // typo.yaml's Mesh is not counted: a file that never loaded has no
    // last good parse.
    assert!(stderr.contains("ignored 3 documents"), "{stderr}");
}

#[test]
fn declared_states_with_a_real_envoy() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let ready_app = App::start();
    let not_ready_app = App::start();
    // Nothing listens here: were the ignored inbound probed, it would fail.
    let (ignored_port, _reserved) = dead_port();
    let yaml = format!(
        "type: Mesh\nname: default\n---\n\
         type: Dataplane\nmesh: default\nname: web-01\nkri: kri_dp_default___web-01_\nnetworking:\n  address: 127.0.0.1\n  inbound:\n\
         \x20 - port: 10001\n    servicePort: {}\n    name: main\n    protocol: http\n    tags: {{kuma.io/service: web}}\n\
         \x20 - port: 10002\n    servicePort: {}\n    name: draining\n    state: NotReady\n    tags: {{kuma.io/service: web}}\n\
         \x20 - port: 10003\n    servicePort: {ignored_port}\n    name: debug\n    state: Ignored\n    tags: {{kuma.io/service: web-debug}}\n",
        ready_app.port, not_ready_app.port
    );
    hdsd.write_dataplane("web.yaml", &yaml);
    hdsd.wait_inbound("default.web-01", 10001, "pending", RELOAD);
    let _envoy = Envoy::start(hdsd.hds, "default.web-01", None);

    // Both probed inbounds report healthy; only the Ready one is ready.
    hdsd.wait_inbound("default.web-01", 10002, "healthy", CONNECT);
    let dp = hdsd.wait_inbound("default.web-01", 10001, "healthy", CONNECT);
    let [main, draining, debug] = &dp.inbounds[..] else {
        panic!("{dp:?}")
    };
    assert!(main.health.ready);
    assert!(!draining.health.ready, "declared NotReady: {draining:?}");
    assert!(draining.health.last_report_at.is_some(), "still probed");
    assert_eq!(debug.health.status, "ignored");
    assert!(debug.health.ready);
    assert_eq!(debug.health.last_report_at, None, "never probed");
    assert!(!dp.is_ready(), "the NotReady inbound holds it back");

    // Marking the draining inbound Ignored too makes the dataplane ready.
    hdsd.write_dataplane(
        "web.yaml",
        &yaml.replace("state: NotReady", "state: Ignored"),
    );
    let dp = wait_for("the dataplane to be ready", RELOAD, || {
        let dp = hdsd.dataplane("default.web-01")?;
        if dp.is_ready() {
            Ok(dp)
        } else {
            Err(format!("{dp:?}"))
        }
    });
    assert_eq!(dp.inbounds[1].health.status, "ignored");
    let listed = hdsd.dataplanes("?ready=true").unwrap();
    assert_eq!(listed[0].name, "web-01", "{listed:?}");
}

/// `hdsd validate` over a dataplanes directory holding `name` (from
/// testdata/kuma-invalid), its `[dataplanes]` table edited by `edit`:
/// (success, stdout, stderr).
fn validate_dir(name: &str, edit: impl FnOnce(&mut DataplanesConfig)) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let dps = dir.path().join("dataplanes");
    std::fs::create_dir_all(&dps).unwrap();
    std::fs::write(dps.join(name), fixture("kuma-invalid", name)).unwrap();
    let mut c = Config {
        state_dir: dir.path().join("state"),
        ..Config::default()
    };
    c.dataplanes.dir = dps;
    edit(&mut c.dataplanes);
    let config = dir.path().join("hdsd.toml");
    std::fs::write(&config, toml::to_string(&c).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["validate", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hdsd validate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_stale_field_is_refused_by_default_and_a_warning_when_unknown_fields_warn() {
    // The default, as `hdsd config defaults` prints it: refused, naming the
    // field and its line.
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["config", "defaults"])
        .output()
        .expect("run hdsd config defaults");
    let defaults = String::from_utf8(out.stdout).unwrap();
    assert!(
        defaults.contains("\nunknown_fields = \"refuse\"\n"),
        "{defaults}"
    );
    let (ok, stdout, stderr) = validate_dir("stale-field.yaml", |_| {});
    assert!(!ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("stale-field.yaml:15: document 1: networking.transparentProxying: unknown field `redirectPort`"),
        "{stderr}"
    );
    assert!(stderr.contains("1 problem(s) found"), "{stderr}");

    // Lenient: the file loads, the field is listed as ignored.
    let (ok, stdout, stderr) = validate_dir("stale-field.yaml", |d| {
        d.unknown_fields = UnknownFields::Warn
    });
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("ok: configuration valid, 1 dataplanes"),
        "{stdout}"
    );
    assert!(
        stderr.contains("stale-field.yaml:15: warning: document 1: unknown field networking.transparentProxying.redirectPort ignored (dataplanes.unknown_fields = \"warn\"); remove it, or set dataplanes.unknown_fields = \"refuse\" to make it an error"),
        "{stderr}"
    );
}
