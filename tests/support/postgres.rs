//! A throwaway PostgreSQL cluster for one test: `initdb` and `pg_ctl` from
//! Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`), run
//! as the `postgres` user (the server refuses root) in a temporary directory
//! owned by it. The server listens on a unix socket in that directory only
//! (`listen_addresses = ''`): no TCP port, so no port to pick and no race.
//! Stopped (`pg_ctl stop -m immediate`) when dropped, also when a test panics.
//! [`Postgres::start_in`] runs one inside a network namespace, listening on
//! TCP addresses of it too, for tests that cut an instance's path to it.
//!
//! Without PostgreSQL, [`Postgres::start`] prints one `SKIPPED` line and
//! returns `None`, unless `HDSD_REQUIRE_POSTGRES=1` (set by CI): then it panics.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running throwaway cluster.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    stopped: bool,
    /// Run in this network namespace, listening on these TCP addresses too
    /// (see [`Postgres::start_in`]).
    netns: Option<(String, Vec<std::net::Ipv4Addr>)>,
}

/// The directory of the newest installed PostgreSQL's programs.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("/usr/lib/postgresql: {e}"))?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no /usr/lib/postgresql/<version>/bin/pg_ctl".to_string())
}

/// The uid and gid of the `postgres` user.
fn postgres_user() -> Result<(u32, u32), String> {
    let out = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .map_err(|e| e.to_string())?;
    let uid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| "there is no postgres user".to_string())?;
    let out = Command::new("id")
        .args(["-g", "postgres"])
        .output()
        .map_err(|e| e.to_string())?;
    let gid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| "there is no postgres group".to_string())?;
    Ok((uid, gid))
}

fn as_postgres(program: &Path) -> Command {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--"]).arg(program);
    command
}

/// [`as_postgres`] inside network namespace `netns`.
fn as_postgres_in(netns: &str, program: &Path) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", netns, "runuser", "-u", "postgres", "--"])
        .arg(program);
    command
}

fn checked(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The programs' directory and the `postgres` user's uid and gid, or `None`
/// (with a `SKIPPED` line for `test`) when PostgreSQL is not installed and
/// `HDSD_REQUIRE_POSTGRES` is not `1` (then it panics).
fn installation(test: &str) -> Option<(PathBuf, (u32, u32))> {
    let required = std::env::var("HDSD_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
    match bin_dir().and_then(|bin| postgres_user().map(|user| (bin, user))) {
        Ok(found) => Some(found),
        Err(e) if required => panic!(
            "HDSD_REQUIRE_POSTGRES=1 but PostgreSQL is not installed ({e}); run scripts/setup.sh \
             (it installs Debian's postgresql package), or unset HDSD_REQUIRE_POSTGRES to skip"
        ),
        Err(e) => {
            eprintln!(
                "SKIPPED {test}: PostgreSQL is not installed ({e}); run scripts/setup.sh, or set \
                 HDSD_REQUIRE_POSTGRES=1 to fail instead"
            );
            None
        }
    }
}

impl Postgres {
    /// Whether PostgreSQL is installed, for a test that starts its own
    /// cluster (a script): the same rule as [`Postgres::start`] (a
    /// `SKIPPED` line, or a panic with `HDSD_REQUIRE_POSTGRES=1`).
    pub fn installed(test: &str) -> bool {
        installation(test).is_some()
    }

    /// Starts a new cluster, or `None` (with a `SKIPPED` line) when
    /// PostgreSQL is not installed and `HDSD_REQUIRE_POSTGRES` is not `1`.
    pub fn start(test: &str) -> Option<Postgres> {
        Self::start_listening(test, None)
    }

    /// [`Postgres::start`] inside the network namespace `netns`, listening
    /// on TCP port 5432 of `addresses` (addresses of that namespace) as well
    /// as on its unix socket, and trusting every client of 198.18.0.0/15
    /// (the benchmarking range the partition tests use).
    pub fn start_in(
        test: &str,
        netns: &str,
        addresses: Vec<std::net::Ipv4Addr>,
    ) -> Option<Postgres> {
        Self::start_listening(test, Some((netns.to_string(), addresses)))
    }

    fn start_listening(
        test: &str,
        netns: Option<(String, Vec<std::net::Ipv4Addr>)>,
    ) -> Option<Postgres> {
        let (bin, (uid, gid)) = installation(test)?;
        let dir = tempfile::Builder::new()
            .prefix("hdsd-pg-")
            .tempdir()
            .expect("tempdir");
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the cluster dir");
        let mut pg = Postgres {
            dir,
            bin,
            stopped: true,
            netns,
        };
        checked(
            "initdb",
            as_postgres(&pg.bin.join("initdb"))
                .arg("-D")
                .arg(pg.data())
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
                .output(),
        );
        if pg.netns.is_some() {
            let hba = pg.data().join("pg_hba.conf");
            let mut rules = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
            rules.push_str("host all all 198.18.0.0/15 trust\n");
            std::fs::write(&hba, rules).expect("write pg_hba.conf");
        }
        pg.start_again();
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A libpq connection string for database `postgres` over the socket.
    pub fn url(&self) -> String {
        format!(
            "host={} user=postgres dbname=postgres",
            self.socket_dir().display()
        )
    }

    /// A libpq connection string for database `postgres` over TCP to
    /// `address` (one of [`Postgres::start_in`]'s).
    pub fn tcp_url(&self, address: std::net::Ipv4Addr) -> String {
        format!("host={address} port=5432 user=postgres dbname=postgres")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// `program` of this PostgreSQL, run as its user (in its namespace).
    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some((netns, _)) => as_postgres_in(netns, &self.bin.join(program)),
            None => as_postgres(&self.bin.join(program)),
        }
    }

    /// Starts the server (after [`Postgres::stop`]) and waits until it accepts connections.
    pub fn start_again(&mut self) {
        let listen = match &self.netns {
            Some((_, addresses)) => addresses
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
            None => String::new(),
        };
        let options = format!(
            // Small: many tests may run a cluster at once.
            "-c listen_addresses='{listen}' -c unix_socket_directories='{}' -c fsync=off \
             -c shared_buffers=16MB -c max_connections=40",
            self.socket_dir().display()
        );
        checked(
            "pg_ctl start",
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.dir.path().join("postgres.log"))
                .args(["-o", &options, "-w", "-t", "30", "start"])
                .output(),
        );
        self.stopped = false;
    }

    /// Stops the server at once (`-m immediate`: like a crash, no shutdown checkpoint).
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        self.stopped = true;
    }

    /// Runs one SQL statement with psql and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> String {
        let out = checked(
            &format!("psql -c {sql:?}"),
            Command::new(self.bin.join("psql"))
                .arg("-h")
                .arg(self.socket_dir())
                .args(["-U", "postgres", "-d", "postgres", "-At", "-c", sql])
                .output(),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- postgres log -----\n{}", self.log());
        }
        self.stop();
    }
}
