//! `hdsd status` and `hdsd watch` against an API served with `api.tls`:
//! HTTPS with a private CA (`--ca`), the token, and `hdsd watch` reconnecting
//! and resuming after hdsd restarts.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{dataplane_yaml, listener, pass_fds, wait_for};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const TOKEN: &str = "tls-t0ken";

/// A CA and a server certificate for 127.0.0.1, written to `dir`: (ca, cert, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("api.pem"),
        dir.join("api-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// hdsd with `api.tls`, started by hand: the shared harness probes plain HTTP.
struct TlsHdsd {
    dir: tempfile::TempDir,
    /// HDS and API listeners, held for every hdsd process (LISTEN_FDS).
    sockets: [std::net::TcpListener; 2],
    api: String,
    ca: PathBuf,
    child: Option<Child>,
}

impl TlsHdsd {
    fn start() -> TlsHdsd {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dataplanes")).unwrap();
        let (ca, cert, key) = certificates(dir.path());
        let sockets = [listener(), listener()];
        let hds_port = sockets[0].local_addr().unwrap().port();
        let api_port = sockets[1].local_addr().unwrap().port();
        let config = format!(
            "state_dir = {state:?}\n\n[hds]\nlisten = \"127.0.0.1:{hds}\"\n\n[api]\nlisten = \"127.0.0.1:{api_port}\"\ntokens = [\"{TOKEN}\"]\n\n[api.tls]\ncert = {cert:?}\nkey = {key:?}\n\n[dataplanes]\ndir = {dps:?}\n",
            state = dir.path().join("state").display().to_string(),
            hds = hds_port,
            cert = cert.display().to_string(),
            key = key.display().to_string(),
            dps = dir.path().join("dataplanes").display().to_string(),
        );
        std::fs::write(dir.path().join("hdsd.toml"), config).unwrap();
        let mut hdsd = TlsHdsd {
            api: format!("https://127.0.0.1:{api_port}"),
            ca,
            dir,
            sockets,
            child: None,
        };
        hdsd.spawn();
        hdsd
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("hdsd.log"))
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_hdsd"));
        command
            .args(["serve", "--config"])
            .arg(self.dir.path().join("hdsd.toml"))
            .env_remove("RUST_LOG")
            .env_remove("LISTEN_PID")
            .env("LISTEN_FDS", "2")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        {
            use std::os::fd::AsFd;
            pass_fds(
                &mut command,
                &[self.sockets[0].as_fd(), self.sockets[1].as_fd()],
            );
        }
        self.child = Some(command.spawn().expect("start hdsd"));
        // Up once `hdsd status` gets through, over HTTPS.
        wait_for("hdsd status over HTTPS", Duration::from_secs(20), || {
            let out = self.status(&["--ca", self.ca.to_str().unwrap()]);
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn status(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(["status", "--api", &self.api, "--api-token", TOKEN])
            .args(args)
            .output()
            .expect("run hdsd status")
    }

    fn write_dataplane(&self, name: &str) {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, dataplane_yaml(name, &[(20001, 1)])).unwrap();
        std::fs::rename(
            &tmp,
            self.dir.path().join(format!("dataplanes/{name}.yaml")),
        )
        .unwrap();
    }
}

impl Drop for TlsHdsd {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("hdsd.log")).unwrap_or_default();
            eprintln!("----- hdsd log -----\n{log}");
        }
    }
}

/// Collects a child's output lines as they come.
fn collect(reader: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

fn wait_line(lines: &Arc<Mutex<Vec<String>>>, what: &str, pred: impl Fn(&str) -> bool) {
    wait_for(what, Duration::from_secs(20), || {
        let lines = lines.lock().unwrap();
        if lines.iter().any(|l| pred(l)) {
            Ok(())
        } else {
            Err(format!("{lines:?}"))
        }
    });
}

#[test]
fn status_and_watch_speak_https_to_an_api_with_tls_and_watch_resumes_after_a_restart() {
    let mut hdsd = TlsHdsd::start();
    hdsd.write_dataplane("web-1");
    let ca = hdsd.ca.to_str().unwrap().to_string();
    wait_for("web-1 in hdsd status", Duration::from_secs(20), || {
        let out = hdsd.status(&["--ca", &ca]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("default.web-1") && text.contains("pending") {
            Ok(())
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    });
    // Without the CA the certificate is not trusted, and the error says what to check.
    let out = hdsd.status(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read"), "{err}");

    let mut watch = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args([
            "watch",
            "--api",
            &hdsd.api,
            "--api-token",
            TOKEN,
            "--ca",
            &ca,
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hdsd watch");
    let stdout = collect(watch.stdout.take().unwrap());
    let stderr = collect(watch.stderr.take().unwrap());
    wait_line(&stdout, "the snapshot with web-1", |l| {
        l.contains("\"SNAPSHOT\"") && l.contains("default.web-1")
    });
    std::fs::remove_file(hdsd.dir.path().join("dataplanes/web-1.yaml")).unwrap();
    wait_line(&stdout, "web-1 deleted", |l| {
        l.contains("\"DELETED\"") && l.contains("deleted")
    });

    // hdsd restarts: hdsd watch reconnects, says from where, and (a
    // revision of the earlier process is below the new one's floor) is told
    // to resync.
    hdsd.kill();
    wait_line(&stderr, "a reconnect notice", |l| {
        l.contains("reconnecting in") && l.contains("resuming after revision ")
    });
    hdsd.spawn();
    wait_line(&stderr, "reconnected", |l| l.contains("reconnected to"));
    wait_line(&stdout, "RESYNC after the restart", |l| {
        l.contains("\"RESYNC\"")
    });
    let _ = watch.kill();
    let _ = watch.wait();
}
