//! What a package needs from the build: `hdsd --version` with the commit,
//! shell completions and the man page generated from the command line's
//! definition, and systemd units that systemd itself accepts.

use std::path::Path;
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn hdsd(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(args)
        .output()
        .expect("run hdsd");
    assert!(
        out.status.success(),
        "hdsd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_version_names_the_commit() {
    let version = hdsd(&["--version"]);
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(REPO)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert!(
        version.starts_with(&format!("hdsd {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    // Built from a git checkout: its commit (a build outside git says
    // `unknown`); HEAD may have moved on since the build, so only its form.
    if commit.is_some() {
        let named = version
            .trim()
            .trim_end_matches(')')
            .rsplit(' ')
            .next()
            .unwrap();
        assert!(
            named.len() == 12 && named.chars().all(|c| c.is_ascii_hexdigit()),
            "{version}"
        );
    }
}

#[test]
fn completions_and_the_man_page_cover_every_command() {
    let commands = [
        "serve",
        "validate",
        "token",
        "status",
        "explain",
        "watch",
        "apply",
        "zone",
        "bootstrap",
    ];
    for shell in ["bash", "zsh", "fish"] {
        let script = hdsd(&["completions", shell]);
        for command in commands {
            assert!(script.contains(command), "{shell}: {command}");
        }
    }
    let bash = hdsd(&["completions", "bash"]);
    let out = Command::new("bash")
        .args(["-n", "-c", &bash])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let man = hdsd(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH hdsd 1"),
        "{}",
        &man[..200]
    );
    for command in commands {
        assert!(man.contains(&format!(".TH hdsd-{command} 1")), "{command}");
    }
    // `man` renders it without a warning.
    if Path::new("/usr/bin/groff").exists() {
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().unwrap().write_all(man.as_bytes())?;
                child.wait_with_output()
            })
            .expect("groff");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `systemd-analyze verify` accepts the units, with `ExecStart` pointing
/// at the hdsd just built (it checks that the binary exists).
#[test]
fn the_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["hdsd.service", "hdsd.socket"] {
        let text = std::fs::read_to_string(Path::new(REPO).join("packaging/systemd").join(unit))
            .unwrap()
            .replace("/usr/local/bin/hdsd", env!("CARGO_BIN_EXE_hdsd"));
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.path().join("hdsd.socket"))
        .arg(dir.path().join("hdsd.service"))
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("systemd-analyze (Debian's systemd; scripts/setup.sh installs it)");
    let said = String::from_utf8_lossy(&out.stderr);
    // Lines about units of the host (it may not run systemd) are not ours.
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("hdsd")).collect();
    assert!(out.status.success() && ours.is_empty(), "{said}");
    let service = std::fs::read_to_string(dir.path().join("hdsd.service")).unwrap();
    assert!(service.contains("LimitNOFILE="));
    let socket = std::fs::read_to_string(dir.path().join("hdsd.socket")).unwrap();
    assert_eq!(
        socket.matches("\nListenStream=").count(),
        2,
        "HDS first, then the API"
    );
}
