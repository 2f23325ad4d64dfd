//! A small tmpfs mounted on a temporary directory, for a disk that fills:
//! [`Tmpfs::mount`] needs root (it prints one `SKIPPED` line and returns
//! `None` without it); [`Tmpfs::fill`] writes a file until the disk is full
//! and [`Tmpfs::free`] deletes it. Unmounted when dropped (lazily, should a
//! process still hold a file there), also when a test panics.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
    filler: PathBuf,
}

impl Tmpfs {
    /// A tmpfs of `size` (as `mount -o size=` reads it: `1m`).
    pub fn mount(test: &str, size: &str) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("hdsd-tmpfs-")
            .tempdir()
            .expect("tempdir");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                crate::support::skip(format!(
                    "SKIPPED {test}: cannot mount a tmpfs ({}); run the test as root",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                return None;
            }
            Err(e) => {
                crate::support::skip(format!("SKIPPED {test}: cannot run mount ({e})"));
                return None;
            }
        }
        let filler = dir.path().join("filler");
        Some(Tmpfs { dir, filler })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full; returns the bytes written.
    pub fn fill(&self) -> u64 {
        let mut file = std::fs::File::create(&self.filler).expect("create the filler");
        let block = vec![0u8; 4096];
        let mut written = 0;
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", self.filler.display()),
            }
        }
        let _ = file.sync_all();
        written
    }

    /// Deletes the filler: the space returns.
    pub fn free(&self) {
        std::fs::remove_file(&self.filler).expect("delete the filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}
