//! Several hdsd instances sharing one PostgreSQL store (a cluster): the
//! configuration that puts an instance on the store, and the helpers that
//! define a dataplane through one instance's API and serve it to an Envoy
//! that knows one instance or all of them.

use std::time::Duration;

use super::{dataplane_yaml, Config, DataplanesSource, Envoy, Hdsd, StoreKind};
use crate::support::App;

/// An instance reading definitions from the PostgreSQL store at `url`
/// (through the API: `dataplanes.source = "api"`), reconciling every second.
/// Edit a test's configuration with it: `Hdsd::start_with(|c| on_postgres(c, pg.url()))`.
pub fn on_postgres(c: &mut Config, url: String) {
    c.dataplanes.source = DataplanesSource::Api;
    c.store.kind = StoreKind::Postgres;
    c.store.postgres.url = url;
    c.store.postgres.reconcile_interval = Duration::from_secs(1);
}

/// [`on_postgres`], with `cluster.instance_timeout` short enough for a test
/// to see an instance taken for dead.
pub fn on_postgres_with_timeout(c: &mut Config, url: String, instance_timeout: Duration) {
    on_postgres(c, url);
    c.cluster.instance_timeout = instance_timeout;
}

/// web-01 (inbound 10001 on `app`) defined through `a`'s API and served
/// by an Envoy that knows only `a`, healthy there.
pub fn web01_served_by(a: &Hdsd, app: &App) -> Envoy {
    let yaml = dataplane_yaml("web-01", &[(10001, app.port)]);
    let (status, _, body) = send(
        a,
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let envoy = Envoy::start(a.hds, "default.web-01", None);
    a.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    envoy
}

/// PUT (or DELETE with `body = None`); returns status, ETag and body.
pub fn send(
    hdsd: &Hdsd,
    path: &str,
    body: Option<(&str, &str)>,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, serde_json::Value) {
    let url = hdsd.api_url(path);
    let response = match body {
        Some((content_type, text)) => {
            let mut r = ureq::put(&url)
                .config()
                .http_status_as_error(false)
                .build()
                .header("Content-Type", content_type);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.send(text)
        }
        None => {
            let mut r = ureq::delete(&url)
                .config()
                .http_status_as_error(false)
                .build();
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.call()
        }
    };
    let mut response = response.expect("the API answers");
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (
        status,
        etag,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// Runs the hdsd binary with `args` (no configuration of a test's hdsd).
pub fn hdsd_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hdsd")
}

/// Defines `default.web-01` (one inbound probing `app_port`) through the first
/// instance's API and starts a real Envoy whose bootstrap lists every instance
/// (`hdsd bootstrap --server A --server B`).
pub fn web01_envoy_on_all(instances: &[Hdsd], app_port: u16) -> Envoy {
    let yaml = dataplane_yaml("web-01", &[(10001, app_port)]);
    let (status, _, body) = send(
        &instances[0],
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let servers: Vec<String> = instances.iter().map(|h| h.hds.to_string()).collect();
    let mut args = vec![
        "bootstrap",
        "--mesh",
        "default",
        "--name",
        "web-01",
        "--admin-port",
        "0",
    ];
    for s in &servers {
        args.extend(["--server", s.as_str()]);
    }
    let out = hdsd_cli(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bootstrap = String::from_utf8(out.stdout).unwrap();
    Envoy::start_with_bootstrap(tempfile::tempdir().unwrap(), "default.web-01", &bootstrap)
}
