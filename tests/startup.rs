//! Startup failures: `hdsd serve` exits 1 when it cannot start, naming what
//! to fix.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::wait_for;

/// Runs `hdsd serve` with a config whose listeners are `hds` and `api`, and
/// waits for it to exit (it must not start).
fn serve_until_exit(hds: &str, api: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let dataplanes = dir.path().join("dataplanes");
    std::fs::create_dir_all(&dataplanes).unwrap();
    let config = dir.path().join("hdsd.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {state:?}\n\n[hds]\nlisten = \"{hds}\"\n\n[api]\nlisten = \"{api}\"\n\n[dataplanes]\ndir = {dps:?}\n\n[auth]\nmode = \"none\"\n",
            state = dir.path().join("state").display().to_string(),
            dps = dataplanes.display().to_string(),
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hdsd");
    wait_for("hdsd to exit", Duration::from_secs(20), || {
        match child.try_wait() {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("still running".into()),
            Err(e) => Err(e.to_string()),
        }
    });
    child.wait_with_output().unwrap()
}

#[test]
fn a_listen_address_in_use_exits_1_and_says_which() {
    // Held for the whole test: no other process can take it in between.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();

    for (hds, api, setting) in [
        (taken.as_str(), "127.0.0.1:0", "hds.listen"),
        ("127.0.0.1:0", taken.as_str(), "api.listen"),
    ] {
        let out = serve_until_exit(hds, api);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{setting}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot listen on {setting} address {taken}"))
                && stderr.contains("choose a free port or stop the process using it"),
            "{setting}: {stderr}"
        );
    }
}
