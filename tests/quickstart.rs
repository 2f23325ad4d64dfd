//! The README's quick start, run as written: every `sh` block after a
//! `<!-- quickstart -->` marker, in order, in one shell, so the commands a
//! newcomer pastes cannot drift from what works. Two things differ from a
//! newcomer's machine: `cargo install --path .` is skipped (the hdsd this
//! test suite built comes first on `PATH`), and the tests' Envoy is on
//! `PATH` (so step 6 does not download one). The quick start's fixed ports
//! (5678, 5680, 8080, 9901) are free here: every other test binds port 0.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::support::envoy_bin;

/// The `sh` blocks of `text` that follow a `<!-- quickstart -->` line.
fn quickstart_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "<!-- quickstart -->" {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "a quickstart marker is followed by a ```sh block"
        );
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        blocks.push(block.join("\n"));
    }
    blocks
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let blocks = quickstart_blocks(&readme);
    assert!(
        blocks.len() >= 8,
        "the quick start's steps: {}",
        blocks.len()
    );
    assert!(
        blocks[0].contains("cargo install --path ."),
        "step 1 installs hdsd: {}",
        blocks[0]
    );
    let hdsd_dir = Path::new(env!("CARGO_BIN_EXE_hdsd"))
        .parent()
        .unwrap()
        .to_path_buf();
    let envoy_dir = envoy_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}:{}",
        hdsd_dir.display(),
        envoy_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Stops whatever the script started if a step fails midway; each
    // step's wait is bounded by the whole script's timeout.
    let script = format!(
        "set -eu\ncargo() {{ echo \"(skipped: cargo $*)\"; }}\ntrap 'kill ${{ENVOY_PID:-}} ${{APP_PID:-}} ${{HDSD_PID:-}} 2>/dev/null || true' EXIT\n{}\necho QUICKSTART-DONE\n",
        blocks
            .iter()
            .enumerate()
            .map(|(i, b)| format!("echo '== step block {}'\n{b}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let started = Instant::now();
    let out = Command::new("timeout")
        .args(["--kill-after=5", "120", "bash", "-c", &script])
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("the quick start ran in {:?}", started.elapsed());
    assert!(
        out.status.success() && stdout.contains("QUICKSTART-DONE"),
        "the quick start failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Step 7 saw the inbound ready, step 8 not ready after the app stopped.
    assert!(stdout.contains("1/1 inbounds ready"), "{stdout}");
    assert!(stdout.contains("0/1 inbounds ready"), "{stdout}");
    assert!(
        stdout.contains("why (probe_failing): Envoy default.web-01 reports the tcp check"),
        "hdsd explain: {stdout}"
    );
    assert!(stdout.contains("hdsd 0."), "hdsd --version: {stdout}");
}
