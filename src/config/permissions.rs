//! Files hdsd trusts: the rule, as sshd applies it to `authorized_keys`.
//!
//! A file or directory whose content decides who hdsd trusts (the keys
//! directory, a key file, the configuration) is refused when its group or
//! other users can write it: any of them could plant a key or a token. The
//! mode checked is the target's (symlinks are followed, as Kubernetes mounts
//! Secrets and ConfigMaps through them). A file holding a secret that other
//! users can read is only warned about: hdsd still works, the operator
//! decides. [`judge_write`] and [`judge_owner`] are the rules on plain
//! numbers; [`check_writable`], [`check_owner`] and [`readable_by_others`]
//! read them from the file system.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Who besides the owner may write a file: from its permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writers {
    Group,
    Others,
    GroupAndOthers,
}

impl fmt::Display for Writers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Writers::Group => "its group",
            Writers::Others => "every user",
            Writers::GroupAndOthers => "its group and every user",
        })
    }
}

/// A file hdsd will not trust, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    /// Group or others can write it.
    #[error("{what} {path} is writable by {writers} (mode {mode:04o}), so another user could change whom hdsd trusts; refusing it: run `chmod go-w {path}`")]
    Writable {
        /// What the file is to hdsd, e.g. "the keys directory".
        what: &'static str,
        path: PathBuf,
        mode: u32,
        writers: Writers,
    },
    /// Owned by a user other than hdsd's and root.
    #[error("{what} {path} belongs to uid {owner}, neither the user hdsd runs as (uid {process}) nor root, so that user could change whom hdsd trusts; refusing it: run `chown {process} {path}` (or remove it)")]
    Owner {
        what: &'static str,
        path: PathBuf,
        owner: u32,
        process: u32,
    },
    /// Its mode could not be read.
    #[error("cannot read the permissions of {what} {path}: {detail}")]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
}

/// Who besides the owner may write a file of permission bits `mode`, if anyone.
pub fn judge_write(mode: u32) -> Option<Writers> {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some(Writers::GroupAndOthers),
        (true, false) => Some(Writers::Group),
        (false, true) => Some(Writers::Others),
        (false, false) => None,
    }
}

/// Whether a file owned by `owner` may be trusted by a process running as
/// `process`: owned by that user or by root.
pub fn judge_owner(owner: u32, process: u32) -> bool {
    owner == process || owner == 0
}

/// Refuses `path` (followed through symlinks) when group or others can
/// write it. A missing file passes: whoever reads it says it is missing.
pub fn check_writable(what: &'static str, path: &Path) -> Result<(), Untrusted> {
    let Some(mode) = mode_of(what, path)? else {
        return Ok(());
    };
    match judge_write(mode) {
        Some(writers) => Err(Untrusted::Writable {
            what,
            path: path.to_path_buf(),
            mode,
            writers,
        }),
        None => Ok(()),
    }
}

/// Refuses `path` (followed through symlinks) when it belongs to a user
/// other than the one hdsd runs as and root. Passes when either is unknown
/// (no `/proc`): the mode check still applies.
pub fn check_owner(what: &'static str, path: &Path) -> Result<(), Untrusted> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (Ok(meta), Some(process)) = (std::fs::metadata(path), process_uid()) else {
            return Ok(());
        };
        if !judge_owner(meta.uid(), process) {
            return Err(Untrusted::Owner {
                what,
                path: path.to_path_buf(),
                owner: meta.uid(),
                process,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (what, path);
    Ok(())
}

/// The permission bits of `path` when other users (not the owner, not the
/// group) can read it: for a file holding a secret, which is warned about.
pub fn readable_by_others(path: &Path) -> Option<u32> {
    let mode = mode_of("", path).ok().flatten()?;
    (mode & 0o004 != 0).then_some(mode)
}

/// The warning for a secret file other users can read.
pub fn readable_warning(what: &str, path: &Path, mode: u32) -> String {
    format!(
        "{what} {} has mode {mode:04o}: every user of this machine can read it; run `chmod o-r {}` (on Kubernetes, set the volume's defaultMode, e.g. 0440)",
        path.display(),
        path.display()
    )
}

/// The warning for a state directory group or others can write.
pub fn state_dir_warning(path: &Path) -> Option<String> {
    let mode = mode_of("", path).ok().flatten()?;
    let writers = judge_write(mode)?;
    Some(format!(
        "state_dir {} is writable by {writers} (mode {mode:04o}): they could delete hdsd's state or put files in it (a keys directory they own is refused); run `chmod go-w {}`",
        path.display(),
        path.display()
    ))
}

/// The permission bits of the file `path` names (symlinks followed), or
/// `None` when it does not exist.
fn mode_of(what: &'static str, path: &Path) -> Result<Option<u32>, Untrusted> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(bits(&meta))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Untrusted::Unreadable {
            what,
            path: path.to_path_buf(),
            detail: e.to_string(),
        }),
    }
}

#[cfg(unix)]
fn bits(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn bits(_meta: &std::fs::Metadata) -> u32 {
    0o600
}

/// The user hdsd runs as: the owner of `/proc/self` (its effective uid).
#[cfg(unix)]
pub fn process_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

#[cfg(not(unix))]
pub fn process_uid() -> Option<u32> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_rules_on_numbers() {
        assert_eq!(judge_write(0o600), None);
        assert_eq!(judge_write(0o755), None);
        assert_eq!(judge_write(0o1755), None);
        assert_eq!(judge_write(0o664), Some(Writers::Group));
        assert_eq!(judge_write(0o646), Some(Writers::Others));
        assert_eq!(judge_write(0o777), Some(Writers::GroupAndOthers));
        assert!(judge_owner(1000, 1000));
        assert!(judge_owner(0, 1000));
        assert!(judge_owner(0, 0));
        assert!(!judge_owner(1001, 1000));
        assert!(!judge_owner(1001, 0));
    }

    #[test]
    fn writable_files_are_refused_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        for mode in [0o600, 0o644, 0o640, 0o444] {
            chmod(&file, mode);
            check_writable("the file", &link).unwrap();
        }
        for mode in [0o666, 0o620, 0o602, 0o777] {
            chmod(&file, mode);
            let e = check_writable("the file", &link).unwrap_err();
            let m = e.to_string();
            assert!(m.contains(&link.display().to_string()), "{m}");
            assert!(m.contains("chmod go-w"), "{m}");
            assert!(m.contains(&format!("{mode:04o}")), "{m}");
        }
        check_writable("the file", &dir.path().join("missing")).unwrap();
    }

    #[test]
    fn secrets_readable_by_others_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        chmod(&file, 0o640);
        assert_eq!(readable_by_others(&file), None);
        chmod(&file, 0o644);
        assert_eq!(readable_by_others(&file), Some(0o644));
        let w = readable_warning("the config", &file, 0o644);
        assert!(w.contains("chmod o-r") && w.contains("0644"), "{w}");
        chmod(dir.path(), 0o777);
        assert!(state_dir_warning(dir.path()).unwrap().contains("0777"));
        chmod(dir.path(), 0o700);
        assert_eq!(state_dir_warning(dir.path()), None);
    }

    #[test]
    fn files_of_this_process_user_are_owned_right() {
        let dir = tempfile::tempdir().unwrap();
        // Whoever runs the test owns what it creates.
        check_owner("the dir", dir.path()).unwrap();
        assert!(process_uid().is_some());
    }
}
