//! Envoy bootstraps: the reference files in testdata/envoy are exactly what
//! `hdsd bootstrap` prints, the real Envoy accepts each of them, and
//! `GET /api/v1/bootstrap` hands a machine its bootstrap for nothing but its token.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/envoy")
}

/// The reference files and the flags that produce them (run inside testdata/envoy).
const REFERENCES: &[(&str, &[&str])] = &[
    ("plaintext.yaml", &[]),
    ("token.yaml", &["--token-file", "token"]),
    (
        "tls.yaml",
        &[
            "--server",
            "hdsd.example.com:5678",
            "--token-file",
            "token",
            "--ca",
            "ca.pem",
        ],
    ),
];

fn hdsd_bootstrap(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["bootstrap", "--mesh", "default", "--name", "web-01"])
        .args(args)
        .current_dir(testdata())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn reference_bootstraps_are_what_hdsd_prints_and_envoy_accepts_them() {
    for (file, flags) in REFERENCES {
        let expected = std::fs::read_to_string(testdata().join(file)).unwrap();
        assert_eq!(
            hdsd_bootstrap(flags),
            expected,
            "{file} is stale: regenerate it with hdsd bootstrap {flags:?}"
        );
        let out = Command::new(envoy_bin())
            .args(["--mode", "validate", "-c", file, "--log-level", "error"])
            .current_dir(testdata())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy --mode validate {file}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The front proxy's reference file: what `hdsd bootstrap front` prints, and
/// the real Envoy accepts it.
#[test]
fn the_front_reference_is_what_hdsd_prints_and_envoy_accepts_it() {
    let flags = [
        "bootstrap",
        "front",
        "--service",
        "web",
        "--listen",
        "0.0.0.0:8080",
        "--server",
        "127.0.0.1:5678",
        "--token",
        "example-api-token",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = std::fs::read_to_string(testdata().join("front.yaml")).unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        expected,
        "front.yaml is stale: regenerate it with hdsd {flags:?}"
    );
    let out = Command::new(envoy_bin())
        .args([
            "--mode",
            "validate",
            "-c",
            "front.yaml",
            "--log-level",
            "error",
        ])
        .current_dir(testdata())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "envoy --mode validate front.yaml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_flags_are_refused_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args([
            "bootstrap",
            "--mesh",
            "default",
            "--name",
            "x",
            "--server",
            "nohostport",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not HOST:PORT"), "{err}");
}

#[test]
fn a_machine_fetches_its_bootstrap_with_its_token_and_is_served() {
    let hdsd = Hdsd::start_with(|c| c.auth.mode = AuthMode::Token);
    let app = App::start();
    hdsd.write_dataplane(
        "web-01.yaml",
        &dataplane_yaml("web-01", &[(10001, app.port)]),
    );
    let token = hdsd.issue_token("default.web-01", "1h");

    // No token, a bad token: 401 with a message.
    let url = hdsd.api_url("/api/v1/bootstrap?adminPort=0");
    let no_token = ureq::get(&url)
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    assert_eq!(no_token.status(), 401);
    let mut bad = ureq::get(&url)
        .header("Authorization", "Bearer not.a.token")
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    assert_eq!(bad.status(), 401);
    assert!(bad
        .body_mut()
        .read_to_string()
        .unwrap()
        .contains("malformed token"));

    // The token's identity gets the same bootstrap `hdsd bootstrap` prints.
    let yaml = ureq::get(&url)
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let admin_port = url.rsplit('=').next().unwrap();
    let cli = hdsd_bootstrap(&[
        "--server",
        &hdsd.hds.to_string(),
        "--token",
        &token,
        "--admin-port",
        admin_port,
    ]);
    assert_eq!(yaml, cli);

    // And a real Envoy started from it is served.
    let envoy = Envoy::start_with_bootstrap(tempfile::tempdir().unwrap(), "default.web-01", &yaml);
    hdsd.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    drop(envoy);
}
