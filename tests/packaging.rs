//! What a package needs from the build: `hdsd --version` with the commit,
//! shell completions and the man page generated from the command line's
//! definition, systemd units that systemd itself accepts, and Kubernetes
//! manifests that the Kubernetes schemas and hdsd itself accept.

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

/// The Kubernetes release the manifests are checked against.
const KUBERNETES_VERSION: &str = "1.33.0";

fn kubernetes_dir() -> std::path::PathBuf {
    Path::new(REPO).join("packaging/kubernetes")
}

/// The manifests: the resources `kustomization.yaml` lists, and the
/// Secrets' example (kept out of it so that an apply never overwrites real
/// Secrets). Every YAML file of the directory is one or the other.
fn kubernetes_manifests() -> Vec<String> {
    let kustomization: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(kubernetes_dir().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let mut manifests: Vec<String> = kustomization["resources"]
        .as_sequence()
        .expect("kustomization.yaml lists resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    manifests.push("secrets.example.yaml".into());
    let mut on_disk: Vec<String> = std::fs::read_dir(kubernetes_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed = manifests.clone();
    listed.sort();
    assert_eq!(listed, on_disk, "a manifest neither listed nor the example");
    manifests
}

/// Every document of a manifest file.
fn documents(name: &str) -> Vec<serde_yaml_ng::Value> {
    let text = std::fs::read_to_string(kubernetes_dir().join(name)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// `kubernetes-validate` (installed by scripts/setup.sh into the venv, in a
/// directory of its own) accepts every manifest against the schemas of one
/// Kubernetes release, strictly: an unknown field is an error.
#[test]
fn the_kubernetes_manifests_validate() {
    let tool = Path::new(REPO).join(".venv/kubernetes-validate");
    assert!(
        tool.join("kubernetes_validate").is_dir(),
        "{} is missing: run scripts/setup.sh (it installs kubernetes-validate)",
        tool.display()
    );
    let manifests = kubernetes_manifests();
    let out = Command::new(Path::new(REPO).join(".venv/bin/python"))
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "-k",
            KUBERNETES_VERSION,
        ])
        .args(&manifests)
        .current_dir(kubernetes_dir())
        .env("PYTHONPATH", &tool)
        .output()
        .expect("run kubernetes-validate (scripts/setup.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    // One line per resource, each `passed`: none skipped for want of a schema.
    let resources: usize = manifests.iter().map(|m| documents(m).len()).sum();
    assert_eq!(
        said.matches(" passed for resource ").count(),
        resources,
        "{said}"
    );
    assert!(!said.contains("WARN"), "{said}");
}

/// The ConfigMap's hdsd.toml is a configuration `hdsd validate` accepts,
/// with the Deployment's environment (the Secret's values), mounted as the
/// kubelet mounts it (through symlinks); and the init container's script
/// turns a Secret volume of signing keys (a directory of mode 1777, files
/// of 0440 as `defaultMode: 0400` and `fsGroup` make them) into a keys
/// directory hdsd trusts and signs with.
#[test]
fn the_kubernetes_config_and_keys_pass_hdsd() {
    let config = documents("configmap.yaml").remove(0);
    let toml = config["data"]["hdsd.toml"].as_str().unwrap().to_string();
    let deployment = documents("deployment.yaml").remove(0);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["serve", "--config", "/etc/hdsd/config/hdsd.toml"]);
    assert!(container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "config" && m["mountPath"] == "/etc/hdsd/config"));
    let manifest = std::fs::read_to_string(kubernetes_dir().join("deployment.yaml")).unwrap();
    assert!(manifest.contains("defaultMode: 0400"), "the Secret's mode");
    assert_eq!(pod["securityContext"]["fsGroup"], 10001);

    // The kubelet's layout: hdsd.toml -> ..data/hdsd.toml, ..data -> ..<stamp>.
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let mount = |dir: &Path, files: &[(&str, &[u8], u32)], dir_mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let stamp = dir.join("..2026_01_01_00_00_00.000000000");
        std::fs::create_dir_all(&stamp).unwrap();
        for (name, bytes, mode) in files {
            std::fs::write(stamp.join(name), bytes).unwrap();
            std::fs::set_permissions(stamp.join(name), std::fs::Permissions::from_mode(*mode))
                .unwrap();
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name)).unwrap();
        }
        std::os::unix::fs::symlink(stamp.file_name().unwrap(), dir.join("..data")).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    };
    let toml = toml.replace("/var/lib/hdsd/state", state.to_str().unwrap());
    let config_dir = root.path().join("config");
    mount(
        &config_dir,
        &[("hdsd.toml", toml.as_bytes(), 0o644)],
        0o1777,
    );
    let config_file = config_dir.join("hdsd.toml");

    // The Deployment's environment, each variable from the Secret.
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let key = e["valueFrom"]["secretKeyRef"]["key"].as_str().unwrap();
            let value = match key {
                "postgres-url" => "postgresql://hdsd:secret@db.example:5432/hdsd",
                "api-tokens" => "[\"a-long-random-token\"]",
                other => panic!("a Secret key this test does not know: {other}"),
            };
            (name, value.to_string())
        })
        .collect();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let config_arg = config_file.to_str().unwrap();
    let (ok, said) = run(&["validate", "--config", config_arg]);
    assert!(ok && said.contains("ok: configuration valid"), "{said}");
    // Without the Secret's values hdsd refuses the configuration.
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["validate", "--config", config_arg])
        .output()
        .unwrap();
    assert!(!out.status.success());

    // A signing key, as `hdsd token keygen` makes it, in a Secret volume.
    let made = root.path().join("keygen");
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["token", "keygen"])
        .env("HDSD_STATE_DIR", &made)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let keys: Vec<(String, Vec<u8>)> = std::fs::read_dir(made.join("keys"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    let secret_dir = root.path().join("signing-keys");
    let files: Vec<(&str, &[u8], u32)> = keys
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice(), 0o440))
        .collect();
    mount(&secret_dir, &files, 0o1777);
    // hdsd refuses that directory as its keys directory...
    std::fs::create_dir_all(root.path().join("direct")).unwrap();
    std::os::unix::fs::symlink(&secret_dir, root.path().join("direct/keys")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["token", "issue", "--mesh", "default", "--name", "web-01"])
        .env("HDSD_STATE_DIR", root.path().join("direct"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("the keys directory"),
        "{said}"
    );
    // ...so the init container copies it; then hdsd signs with the key.
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "install-signing-keys");
    let script = init["command"][2]
        .as_str()
        .unwrap()
        .replace("/var/lib/hdsd/state", state.to_str().unwrap())
        .replace("/etc/hdsd/signing-keys", secret_dir.to_str().unwrap());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let (ok, said) = run(&[
        "token", "issue", "--config", config_arg, "--mesh", "default", "--name", "web-01",
    ]);
    assert!(ok && said.starts_with("ey"), "{said}");
    // An empty Secret stops the pod with the fix, before hdsd would make a key of its own.
    let empty = root.path().join("empty");
    mount(&empty, &[], 0o1777);
    let script = init["command"][2]
        .as_str()
        .unwrap()
        .replace(
            "/var/lib/hdsd/state",
            root.path().join("state2").to_str().unwrap(),
        )
        .replace("/etc/hdsd/signing-keys", empty.to_str().unwrap());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("hdsd token keygen"),
        "{said}"
    );
}
