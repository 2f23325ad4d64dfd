//! The Docker Compose setup, checked without a Docker engine:
//! docker-compose.yml parses, every host path it mounts is in the repository,
//! and its `hdsd-init` makes Envoy bootstraps with the same recipe and flags as
//! the local demo (`scripts/demo.py`), bootstraps that Envoy 1.40 accepts.
//!
//! Needs docker-compose (`scripts/setup.sh` installs 1.29.2 into .venv) and
//! Envoy (`crate::support::envoy_bin`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The compose command: .venv's docker-compose, one on PATH, or `docker compose`.
fn compose_command() -> Command {
    let venv = repo().join(".venv/bin/docker-compose");
    if venv.is_file() {
        return Command::new(venv);
    }
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if works("docker-compose", &["version"]) {
        return Command::new("docker-compose");
    }
    if works("docker", &["compose", "version"]) {
        let mut c = Command::new("docker");
        c.arg("compose");
        return c;
    }
    panic!(
        "no docker-compose: run scripts/setup.sh (it installs docker-compose 1.29.2 into .venv), \
         or install Docker Compose"
    );
}

fn run(mut command: Command) -> Output {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `docker-compose config`: the file as compose reads it (paths resolved,
/// variables substituted), as JSON.
fn compose_config() -> Value {
    let mut c = compose_command();
    c.current_dir(repo())
        .args(["-f", "docker-compose.yml", "config"])
        .env_remove("DEMO_API_TOKEN");
    let out = run(c);
    serde_yaml_ng::from_slice(&out.stdout).expect("docker-compose config prints YAML")
}

fn service<'a>(config: &'a Value, name: &str) -> &'a Value {
    let s = &config["services"][name];
    assert!(s.is_object(), "docker-compose.yml has no service {name}");
    s
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
        Value::Null => Vec::new(),
        other => panic!("expected a list of strings, got {other}"),
    }
}

/// A service's mounts: (source, target); a source without a slash is a named volume.
fn mounts(service: &Value) -> Vec<(String, String)> {
    let Some(volumes) = service["volumes"].as_array() else {
        return Vec::new();
    };
    volumes
        .iter()
        .map(|v| match v {
            // docker-compose v1: "SOURCE:TARGET[:MODE]".
            Value::String(s) => {
                let mut parts = s.splitn(3, ':');
                let source = parts.next().unwrap_or_default().to_string();
                let target = parts.next().unwrap_or_default().to_string();
                (source, target)
            }
            // Compose v2: {type, source, target, ...}.
            Value::Object(m) => (
                m["source"].as_str().unwrap_or_default().to_string(),
                m["target"].as_str().unwrap_or_default().to_string(),
            ),
            other => panic!("unexpected volume entry {other}"),
        })
        .collect()
}

fn is_host_path(source: &str) -> bool {
    source.starts_with('/') || source.starts_with('.') || source.starts_with('~')
}

/// A service's environment as a map (list or mapping form).
fn environment(service: &Value) -> BTreeMap<String, String> {
    match &service["environment"] {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| {
                i.as_str()?
                    .split_once('=')
                    .map(|(k, v)| (k.into(), v.into()))
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// `COPY` instructions of the final stage: destination -> sources.
fn dockerfile_copies() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");
    let mut copies = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("COPY ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        if let Some((dest, sources)) = words.split_last() {
            copies.insert(
                dest.to_string(),
                sources.iter().map(|s| s.to_string()).collect(),
            );
        }
    }
    copies
}

#[test]
fn compose_file_is_valid() {
    let mut c = compose_command();
    c.current_dir(repo())
        .args(["-f", "docker-compose.yml", "config", "-q"]);
    run(c);
    let config = compose_config();
    for name in [
        "hdsd-init",
        "hdsd",
        "web",
        "backend",
        "backend-admin",
        "envoy-web",
        "envoy-backend",
        "prometheus",
        "grafana",
    ] {
        service(&config, name);
    }
    // Envoys share their app's network namespace: the app is at 127.0.0.1.
    assert_eq!(service(&config, "envoy-web")["network_mode"], "service:web");
    assert_eq!(
        service(&config, "envoy-backend")["network_mode"],
        "service:backend"
    );
    // A non-loopback API needs api.tokens (hdsd refuses to start otherwise).
    let env = environment(service(&config, "hdsd"));
    assert_eq!(env["HDSD_API__LISTEN"], "0.0.0.0:5680");
    assert!(
        env.get("HDSD_API__TOKENS")
            .is_some_and(|t| t.starts_with('[') && t.len() > 2),
        "{env:?}"
    );
    // Images are pinned.
    for (name, s) in config["services"].as_object().unwrap() {
        if let Some(image) = s["image"].as_str() {
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            assert!(
                !tag.is_empty() && tag != "latest",
                "service {name}: pin the image {image}"
            );
        }
    }
}

#[test]
fn every_mounted_host_path_is_in_the_repository() {
    let root = repo().canonicalize().unwrap();
    let config = compose_config();
    let mut checked = 0;
    for (name, s) in config["services"].as_object().unwrap() {
        for (source, target) in mounts(s) {
            if !is_host_path(&source) {
                assert!(
                    config["volumes"].get(&source).is_some(),
                    "service {name}: volume {source} (at {target}) is not declared"
                );
                continue;
            }
            let path = Path::new(&source);
            assert!(
                path.exists(),
                "service {name} mounts {source} at {target}, which does not exist"
            );
            assert!(
                path.canonicalize().unwrap().starts_with(&root),
                "service {name} mounts {source}, outside the repository"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} host mounts found");
    // The image's build context: every COPY source exists and is not ignored.
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    for (dest, sources) in dockerfile_copies() {
        for source in sources {
            assert!(
                root.join(&source).exists(),
                "Dockerfile copies {source} to {dest}, which does not exist"
            );
            let first = source.split('/').next().unwrap();
            assert!(
                !ignored.lines().any(|l| l.trim() == first),
                ".dockerignore excludes {source}, which the Dockerfile copies"
            );
        }
    }
}

/// Splits the init script's arguments into options and dataplanes.
fn init_args(args: &[String]) -> (BTreeMap<String, String>, Vec<String>) {
    let mut options = BTreeMap::new();
    let mut dataplanes = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a.starts_with("--") {
            let value = it.next().unwrap_or_else(|| panic!("{a} has no value"));
            options.insert(a.clone(), value.clone());
        } else {
            dataplanes.push(a.clone());
        }
    }
    (options, dataplanes)
}

/// MESH.NAME of MESH.NAME:ADMIN_PORT.
fn identities(dataplanes: &[String]) -> Vec<String> {
    dataplanes
        .iter()
        .map(|d| d.rsplit_once(':').expect("MESH.NAME:PORT").0.to_string())
        .collect()
}

/// Runs the init script with `hdsd` from this build; returns its output.
fn run_init(script: &Path, args: &[String], env: &BTreeMap<String, String>, cwd: &Path) -> String {
    let mut c = Command::new("sh");
    c.arg(script)
        .arg("--hdsd")
        .arg(env!("CARGO_BIN_EXE_hdsd"))
        .args(args)
        .current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("HDSD_") {
            c.env_remove(k);
        }
    }
    c.envs(env).env("NO_COLOR", "1");
    String::from_utf8_lossy(&run(c).stdout).into_owned()
}

/// A bootstrap with what differs between deployments masked: the server
/// address and its discovery type, the admin port, and the token itself.
fn normalized(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut b: Value = serde_yaml_ng::from_str(&text).expect("bootstrap YAML");
    let auth = &mut b["hds_config"]["grpc_services"][0]["initial_metadata"][0];
    assert_eq!(auth["key"], "authorization", "{}", path.display());
    let token = auth["value"].as_str().unwrap().to_string();
    assert!(
        token.starts_with("Bearer ey") && token.matches('.').count() == 2,
        "{}: not a bearer JWT: {token}",
        path.display()
    );
    auth["value"] = "Bearer <token>".into();
    b["admin"]["address"]["socket_address"]["port_value"] = 0.into();
    let cluster = &mut b["static_resources"]["clusters"][0];
    cluster["type"] = "<discovery>".into();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] =
        "<server>".into();
    b
}

fn bearer_token(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let b: Value = serde_yaml_ng::from_str(&text).unwrap();
    b["hds_config"]["grpc_services"][0]["initial_metadata"][0]["value"]
        .as_str()
        .unwrap()
        .trim_start_matches("Bearer ")
        .to_string()
}

fn envoy_validate(path: &Path) {
    let mut c = Command::new(crate::support::envoy_bin());
    c.args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(path);
    run(c);
}

fn token_accepted(token: &str, config: &Path, env: &BTreeMap<String, String>, cwd: &Path) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hdsd"));
    c.args(["token", "inspect", token, "--config"])
        .arg(config)
        .current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("HDSD_") {
            c.env_remove(k);
        }
    }
    c.envs(env);
    run(c);
}

#[test]
fn compose_and_demo_make_bootstraps_with_the_same_recipe() {
    let root = repo();
    let config = compose_config();
    let init = service(&config, "hdsd-init");

    // Compose: the script baked into the image, with its arguments.
    let entrypoint = strings(&init["entrypoint"]);
    let script_in_image = entrypoint
        .iter()
        .find(|w| w.starts_with('/') && !w.ends_with("/sh"))
        .unwrap_or_else(|| panic!("hdsd-init's entrypoint runs no script: {entrypoint:?}"));
    let copies = dockerfile_copies();
    let compose_script = copies
        .get(script_in_image)
        .and_then(|s| s.first())
        .unwrap_or_else(|| {
            panic!("the Dockerfile does not COPY a script to {script_in_image}: {copies:?}")
        });
    let compose_args = strings(&init["command"]);

    // The demo: the invocation scripts/demo.py would run.
    let out = run({
        let mut c = Command::new("python3");
        c.arg("scripts/demo.py")
            .arg("--print-init-args")
            .current_dir(&root);
        c
    });
    let demo: Value = serde_json::from_slice(&out.stdout).expect("demo.py --print-init-args JSON");
    let demo_argv = strings(&demo["argv"]);
    assert_eq!(demo_argv[0], "sh", "{demo_argv:?}");
    assert_eq!(
        &demo_argv[1], compose_script,
        "the demo and compose must run the same init script"
    );
    let script = root.join(compose_script);
    assert!(script.is_file(), "{}", script.display());

    // The same options (only the local hdsd binary differs) and dataplanes.
    let (demo_options, demo_dataplanes) = init_args(&demo_argv[2..]);
    let (compose_options, compose_dataplanes) = init_args(&compose_args);
    let names = |o: &BTreeMap<String, String>| -> BTreeSet<String> {
        o.keys().filter(|k| *k != "--hdsd").cloned().collect()
    };
    assert_eq!(
        names(&demo_options),
        names(&compose_options),
        "init script options: demo {demo_options:?}, compose {compose_options:?}"
    );
    assert_eq!(
        identities(&demo_dataplanes),
        identities(&compose_dataplanes)
    );
    assert_eq!(
        compose_options["--server"], "hdsd:5678",
        "Envoys reach hdsd by its service name"
    );
    // The config the demo uses is the one compose mounts for hdsd-init and hdsd.
    let container_config = &compose_options["--config"];
    for name in ["hdsd-init", "hdsd"] {
        let host = mounts(service(&config, name))
            .into_iter()
            .find(|(_, target)| target == container_config)
            .unwrap_or_else(|| panic!("{name} does not mount {container_config}"))
            .0;
        assert_eq!(
            Path::new(&host).canonicalize().unwrap(),
            root.join(&demo_options["--config"]).canonicalize().unwrap(),
            "{name} mounts another config than the demo uses"
        );
    }

    let tmp = tempfile::tempdir().unwrap();

    // Compose's invocation, run here: container paths become host paths
    // (bind mounts) or temporary directories (named volumes).
    let mut paths: Vec<(String, PathBuf)> = Vec::new();
    for (source, target) in mounts(init) {
        let host = if is_host_path(&source) {
            PathBuf::from(source)
        } else {
            tmp.path().join(format!("volume-{source}"))
        };
        paths.push((target, host));
    }
    paths.sort_by_key(|(target, _)| std::cmp::Reverse(target.len()));
    let remap = |value: &str| -> String {
        for (target, host) in &paths {
            if let Some(rest) = value.strip_prefix(target.as_str()) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{}{rest}", host.display());
                }
            }
        }
        value.to_string()
    };
    let compose_env: BTreeMap<String, String> = environment(init)
        .into_iter()
        .map(|(k, v)| (k, remap(&v)))
        .collect();
    let compose_args: Vec<String> = compose_args.iter().map(|a| remap(a)).collect();
    let (options, _) = init_args(&compose_args);
    let compose_out = PathBuf::from(&options["--out"]);
    let compose_state = PathBuf::from(&compose_env["HDSD_STATE_DIR"]);
    assert!(
        compose_state.starts_with(tmp.path()),
        "HDSD_STATE_DIR of hdsd-init is a volume: {compose_state:?}"
    );
    run_init(&script, &compose_args, &compose_env, tmp.path());
    // Idempotent: a second run keeps the key and rewrites tokens and bootstraps.
    let second = run_init(&script, &compose_args, &compose_env, tmp.path());
    assert!(second.contains("keeping it"), "{second}");
    let keys = std::fs::read_dir(compose_state.join("keys"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".key.pem")
        })
        .count();
    assert_eq!(keys, 1, "the second run must not make another key");

    // The demo's invocation, run here with its own state and output directories.
    let demo_out = tmp.path().join("demo-out");
    let mut demo_args = demo_argv[2..].to_vec();
    for (i, a) in demo_argv[2..].iter().enumerate() {
        if a == "--out" {
            demo_args[i + 1] = demo_out.display().to_string();
        }
        if a == "--hdsd" {
            demo_args[i + 1] = env!("CARGO_BIN_EXE_hdsd").to_string();
        }
    }
    let mut demo_env: BTreeMap<String, String> = serde_json::from_value(demo["env"].clone())
        .expect("demo.py --print-init-args env is a string map");
    demo_env.insert(
        "HDSD_STATE_DIR".into(),
        tmp.path().join("demo-state").display().to_string(),
    );
    run_init(&script, &demo_args, &demo_env, &root);

    // Same bootstraps but for address, admin port and token; all valid for Envoy.
    for id in identities(&compose_dataplanes) {
        let compose_bootstrap = compose_out.join(format!("{id}.yaml"));
        let demo_bootstrap = demo_out.join(format!("{id}.yaml"));
        assert_eq!(
            normalized(&compose_bootstrap),
            normalized(&demo_bootstrap),
            "{id}: compose's and the demo's bootstraps differ beyond address, admin port and token"
        );
        assert_eq!(
            std::fs::read_to_string(compose_out.join(format!("tokens/{id}.jwt")))
                .unwrap()
                .trim(),
            bearer_token(&compose_bootstrap),
            "{id}: the bootstrap carries the token file's token"
        );
        let b: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&compose_bootstrap).unwrap()).unwrap();
        assert_eq!(b["node"]["id"], id.as_str());
        assert_eq!(b["static_resources"]["clusters"][0]["type"], "STRICT_DNS");
        // hdsd accepts each token (checked with the key hdsd-init made).
        token_accepted(
            &bearer_token(&compose_bootstrap),
            &PathBuf::from(&options["--config"]),
            &compose_env,
            tmp.path(),
        );
        envoy_validate(&compose_bootstrap);
        envoy_validate(&demo_bootstrap);
    }
}
