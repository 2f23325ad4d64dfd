//! Hostile dataplane files against the real binary (issue 16, finding 4):
//! a FIFO, a symlink to `/dev/zero`, a symlink to `/etc/passwd`, an alias
//! bomb, 100k levels of nesting and an oversized file, all at once. Each gets
//! a clear error in `/api/v1/sources` and from `hdsd validate`; a good file
//! changed in the same moment is picked up promptly; memory stays bounded;
//! the startup scan refuses them the same way; shutdown stays within
//! `shutdown_timeout`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// A file change reaching the API (the watcher debounces 100 ms). Before the
/// fix, the FIFO hung the watcher for good and 100k levels took 15 s+.
const PROMPT: Duration = Duration::from_secs(3);
/// Peak resident memory hdsd may reach (it starts at ~15 MiB): the alias
/// bomb alone took it past 500 MiB before.
const MAX_RSS_KIB: u64 = 100 * 1024;
/// `shutdown_timeout`'s default.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// (file, what its error must say, the limit counted for it).
const HOSTILE: &[(&str, &str, Option<&str>)] = &[
    (
        "fifo.yaml",
        "is a FIFO (or a symlink to one), not a regular file",
        Some("not_regular_file"),
    ),
    (
        "zero.yaml",
        "is a character device (or a symlink to one), not a regular file",
        Some("not_regular_file"),
    ),
    ("passwd.yaml", "expected a Kuma resource", None),
    (
        "aliases.yaml",
        "YAML aliases expand this file past 1048576 bytes (dataplanes.max_file_size)",
        Some("alias_expansion"),
    ),
    (
        "deep.yaml",
        "nested deeper than 32 levels (dataplanes.max_nesting)",
        Some("nesting"),
    ),
    (
        "big.yaml",
        "larger than dataplanes.max_file_size (1048576 bytes)",
        Some("file_size"),
    ),
];

fn write_hostile_files(dir: &Path) {
    let status = Command::new("mkfifo")
        .arg(dir.join("fifo.yaml"))
        .status()
        .expect("mkfifo");
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.yaml")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd.yaml")).unwrap();
    // One 1,000,000-byte value, anchored once and aliased 999 times in tags:
    // a 1 MB file that deserializes to 1 GB.
    let mut bomb = format!(
        "type: Dataplane\nmesh: default\nname: bomb\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 1\n    servicePort: 2\n    tags:\n      a: &v {}\n",
        "x".repeat(1_000_000)
    );
    for i in 0..999 {
        bomb.push_str(&format!("      t{i}: *v\n"));
    }
    assert!(bomb.len() <= 1 << 20, "the bomb fits the size limit");
    std::fs::write(dir.join("aliases.yaml"), bomb).unwrap();
    let deep = 100_000;
    std::fs::write(
        dir.join("deep.yaml"),
        format!(
            "type: Dataplane\nmesh: default\nname: deep\nx: {}{}\n",
            "{a: ".repeat(deep),
            "}".repeat(deep)
        ),
    )
    .unwrap();
    // 2 MiB: past the default limit of 1 MiB.
    std::fs::write(dir.join("big.yaml"), "# padding\n".repeat(210_000)).unwrap();
}

/// Every hostile file's error, once all are listed.
fn wait_errors(hdsd: &Hdsd, within: Duration) -> Vec<(String, String)> {
    wait_for("an error for every hostile file", within, || {
        let errors: Vec<(String, String)> = hdsd
            .sources()?
            .files
            .into_iter()
            .filter_map(|f| {
                let name = Path::new(&f.path).file_name()?.to_str()?.to_string();
                Some((name, f.error?.message))
            })
            .collect();
        if errors.len() == HOSTILE.len() {
            Ok(errors)
        } else {
            Err(format!("{errors:?}"))
        }
    })
}

fn check_errors(errors: &[(String, String)]) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for (file, expected, _) in HOSTILE {
        let (_, message) = errors
            .iter()
            .find(|(name, _)| name == file)
            .unwrap_or_else(|| panic!("no error for {file}: {errors:?}"));
        assert!(message.contains(expected), "{file}: {message}");
        assert!(message.chars().count() <= 401, "{file}: {message}");
        // At most a short excerpt of a file's content.
        for line in passwd.lines().filter(|l| l.len() > 24) {
            assert!(
                !message.contains(line),
                "{file} echoes /etc/passwd: {message}"
            );
        }
    }
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

fn service_port(hdsd: &Hdsd, id: &str) -> Result<u16, String> {
    Ok(hdsd.dataplane(id)?.inbounds[0].service_port)
}

#[test]
fn hostile_files_are_refused_and_the_others_stay_served() {
    let mut hdsd = Hdsd::start(HdsdOptions::default());
    let dir = hdsd.dataplanes_dir();
    hdsd.write_dataplane("good.yaml", &dataplane_yaml("good", &[(10001, 8080)]));
    hdsd.write_dataplane("other.yaml", &dataplane_yaml("other", &[(10002, 8090)]));
    wait_for("good and other", PROMPT, || {
        service_port(&hdsd, "default.good")?;
        service_port(&hdsd, "default.other")
    });

    // All at once, with a change to a good file in the same moment.
    write_hostile_files(&dir);
    hdsd.write_dataplane("good.yaml", &dataplane_yaml("good", &[(10001, 8081)]));
    let started = Instant::now();
    wait_for("good.yaml's change", PROMPT, || {
        match service_port(&hdsd, "default.good")? {
            8081 => Ok(()),
            port => Err(format!("servicePort {port}")),
        }
    });
    eprintln!(
        "the good file's change was served after {:?}",
        started.elapsed()
    );
    let errors = wait_errors(&hdsd, PROMPT);
    check_errors(&errors);
    assert_eq!(service_port(&hdsd, "default.other").unwrap(), 8090);
    let sources = hdsd.sources().unwrap();
    assert_eq!(sources.errors, HOSTILE.len(), "{sources:?}");
    // No hostile file defined anything.
    let list = hdsd.get_json("/api/v1/dataplanes").unwrap().to_string();
    assert!(
        !list.contains("bomb") && !list.contains("\"deep\""),
        "{list}"
    );

    // Counted per limit, once per rejection.
    for limit in [
        "not_regular_file",
        "file_size",
        "nesting",
        "alias_expansion",
    ] {
        let expected = HOSTILE.iter().filter(|h| h.2 == Some(limit)).count() as f64;
        let series = format!("hdsd_dataplane_file_limit_hits_total{{limit=\"{limit}\"}}");
        assert_eq!(hdsd.metric(&series), Some(expected), "{series}");
    }
    let rss = peak_rss_kib(hdsd.pid());
    eprintln!("peak RSS after the hostile files: {} KiB", rss);
    assert!(rss < MAX_RSS_KIB, "peak RSS {rss} KiB");
    let log = hdsd.log();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for line in passwd.lines().filter(|l| l.len() > 24) {
        assert!(!log.contains(line), "the log echoes /etc/passwd");
    }

    // `hdsd validate` says the same, promptly, and fails.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["validate", "--config"])
        .arg(hdsd.config_path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run hdsd validate");
    assert!(
        started.elapsed() < PROMPT,
        "validate took {:?}",
        started.elapsed()
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (file, expected, _) in HOSTILE {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(file) && l.contains(expected)),
            "validate does not report {file}: {stderr}"
        );
    }

    // The startup scan refuses them the same way and serves the good files.
    hdsd.restart();
    check_errors(&wait_errors(&hdsd, PROMPT));
    // The errors and the good files come from one scan, but the API may
    // answer before the registry has the definitions: wait for what is
    // asserted, not for something else.
    wait_for(
        "the good files served after the restart",
        PROMPT,
        || match (
            service_port(&hdsd, "default.good")?,
            service_port(&hdsd, "default.other")?,
        ) {
            (8081, 8090) => Ok(()),
            other => Err(format!("service ports {other:?}")),
        },
    );
    let rss = peak_rss_kib(hdsd.pid());
    eprintln!("peak RSS after a start with the hostile files: {} KiB", rss);
    assert!(rss < MAX_RSS_KIB, "peak RSS {rss} KiB");

    // A writer on the FIFO changes nothing; shutdown stays within its timeout.
    let fifo = dir.join("fifo.yaml");
    let _writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    std::fs::write(
        dir.join("deep.yaml"),
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
    )
    .unwrap();
    let started = Instant::now();
    let status = hdsd.terminate(SHUTDOWN_TIMEOUT);
    eprintln!("shutdown took {:?}", started.elapsed());
    assert!(status.success(), "{status}");
}

/// Finding 5's bound on the sum: whatever writes the lines, the log grows by
/// at most `log.max_bytes_per_second` per second (here 4 KiB: 400 broken
/// files logged at once would write about 100 KB), and the next line written
/// says how many lines and bytes were left out.
#[test]
fn the_log_grows_by_at_most_its_bytes_per_second() {
    let hdsd = Hdsd::start_with(|c| c.log.max_bytes_per_second = 4096);
    wait_for("hdsd to log its start", Duration::from_secs(10), || {
        let log = hdsd.log();
        log.contains("hdsd listening")
            .then_some(log.len())
            .ok_or_else(|| "not yet".to_string())
    });
    let before = hdsd.log().len();
    let started = std::time::Instant::now();
    for i in 0..400 {
        hdsd.write_dataplane(
            &format!("broken-{i:03}.yaml"),
            "type: Dataplane\nmesh: default\nname: [not, a, name]\n",
        );
    }
    wait_for("the broken files counted", Duration::from_secs(20), || {
        let broken = hdsd.sources()?.errors;
        (broken >= 400)
            .then_some(())
            .ok_or(format!("{broken} of 400"))
    });
    // One more line after a window has passed carries the count.
    wait_for(
        "a line saying what was left out",
        Duration::from_secs(10),
        || {
            hdsd.write_dataplane("broken-last.yaml", "type: Dataplane\n");
            let log = hdsd.log();
            log.contains("log.max_bytes_per_second reached")
                .then_some(())
                .ok_or_else(|| "no line says what was left out".to_string())
        },
    );
    let grown = hdsd.log().len() - before;
    let seconds = started.elapsed().as_secs_f64().ceil() + 1.0;
    eprintln!("the log grew {grown} bytes in {seconds} s under 4096 bytes/s");
    // Each window may end with one line that starts within it, and one
    // count line more: a line at most 1 KiB each.
    assert!(
        (grown as f64) <= seconds * (4096.0 + 2.0 * 1024.0),
        "{grown} bytes in {seconds} s"
    );
    let line = hdsd
        .log()
        .lines()
        .find(|l| l.contains("log.max_bytes_per_second reached"))
        .unwrap()
        .to_string();
    assert!(line.contains("lines ("), "{line}");
}
