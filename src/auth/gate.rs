//! The running server's authentication gate: the key ring and the revocation
//! list in force, reloaded from disk when they change, and the checks a
//! stream goes through.
//!
//! One writer (the reload task) stores new snapshots with `ArcSwap`; streams
//! read them lock-free and watch a version number to re-check their token
//! when the revocation list changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use tokio::sync::watch;

use std::collections::BTreeMap;

use super::{Claims, ExtraPublicKey, KeyError, KeyRing, Rejection, Revocations, SharedKey};
use crate::config::{AuthConfig, AuthMode};
use crate::fswatch;

/// How long file events are coalesced before keys and revocations are read again.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Why the gate could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error(transparent)]
    Revocations(#[from] super::RevocationError),
}

/// What the server checks tokens against.
#[derive(Debug)]
pub struct Gate {
    mode: AuthMode,
    state_dir: PathBuf,
    extra_keys: Vec<ExtraPublicKey>,
    revocations_path: PathBuf,
    /// The keys read from files and `auth.public_keys`.
    local: ArcSwap<KeyRing>,
    /// In force: the local keys and the shared ones (verify-only).
    ring: ArcSwap<KeyRing>,
    /// The public keys other instances published in the shared store.
    shared_keys: ArcSwap<Vec<SharedKey>>,
    /// Held while the keys in force are recomputed (file reload or shared
    /// update), so neither loses the other's keys.
    rekeying: std::sync::Mutex<()>,
    /// The local public keys (kid -> SPKI PEM), for the store to publish.
    published: watch::Sender<BTreeMap<String, String>>,
    /// In force: the file's list and the shared one.
    revoked: ArcSwap<Revocations>,
    /// `auth.max_token_validity`: the longest `exp - iat` accepted.
    max_validity: Duration,
    /// The revocations of the store shared with other instances (PostgreSQL).
    shared: ArcSwap<Revocations>,
    /// Held while the list in force is recomputed (file reload or shared
    /// update: rare, never on a stream's path), so neither loses the other's ids.
    recompute: std::sync::Mutex<()>,
    /// Bumped after every reload: streams re-check their token.
    version: watch::Sender<u64>,
}

impl Gate {
    /// Builds the gate for the `auth` settings, keys living in `state_dir`:
    /// with token auth, creates the first key if none exists (logging its
    /// path) and loads keys and revocations.
    pub fn new(auth: &AuthConfig, state_dir: &Path, now: DateTime<Utc>) -> Result<Gate, GateError> {
        let mode = auth.mode;
        let state_dir = state_dir.to_path_buf();
        let revocations_path = auth.revocations_path(&state_dir);
        let (ring, revoked) = match mode {
            AuthMode::None => (KeyRing::empty(&state_dir), Revocations::default()),
            AuthMode::Token => {
                if let Some(created) = KeyRing::ensure(&state_dir, now)? {
                    tracing::info!(
                        kid = %created.kid,
                        private_key = %created.private_path.display(),
                        "no signing key found: created one; issue tokens with `hdsd token issue`"
                    );
                }
                let ring = KeyRing::load(&state_dir, &auth.public_keys)?;
                for w in ring.warnings() {
                    tracing::warn!("{w}");
                }
                (ring, Revocations::load(&revocations_path)?)
            }
        };
        let (in_force, _) = ring.with_shared(&[]);
        Ok(Gate {
            mode,
            state_dir,
            extra_keys: auth.public_keys.clone(),
            revocations_path,
            published: watch::channel(ring.public_keys()).0,
            local: ArcSwap::from_pointee(ring),
            ring: ArcSwap::from_pointee(in_force),
            shared_keys: ArcSwap::from_pointee(Vec::new()),
            rekeying: std::sync::Mutex::new(()),
            revoked: ArcSwap::from_pointee(revoked),
            max_validity: auth.max_token_validity,
            shared: ArcSwap::from_pointee(Revocations::default()),
            recompute: std::sync::Mutex::new(()),
            version: watch::channel(0).0,
        })
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Verifies a token (taken from a request by the edge that received it):
    /// signed by a key trusted now, not revoked, not expired, and valid for
    /// no longer than `auth.max_token_validity` (whoever issued it).
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<Claims, Rejection> {
        let claims = self.ring.load().verify(token, &self.revoked.load(), now)?;
        let validity = claims.exp.saturating_sub(claims.iat);
        let max = self.max_validity.as_secs();
        if validity > i64::try_from(max).unwrap_or(i64::MAX) {
            return Err(Rejection::ValidityTooLong {
                validity_secs: validity,
                max_secs: max,
            });
        }
        Ok(claims)
    }

    /// How many signing keys are trusted now.
    pub fn signing_keys(&self) -> usize {
        self.ring.load().kids().len()
    }

    /// Wakes when keys or revocations were reloaded.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Reloads keys and revocations; a failure keeps the previous ones.
    pub fn reload(&self) {
        tracing::debug!("keys or revocations changed; reloading");
        metrics::counter!(crate::metrics::AUTH_RELOADS).increment(1);
        let recomputing = self.recompute.lock().unwrap_or_else(|p| p.into_inner());
        match Revocations::load(&self.revocations_path) {
            Ok(r) => {
                let r = r.union(&self.shared.load());
                if **self.revoked.load() != r {
                    tracing::info!(revoked = r.len(), file = %self.revocations_path.display(), "revocation list reloaded");
                    self.revoked.store(Arc::new(r));
                }
            }
            Err(e) => tracing::error!("{e}; keeping the previous revocation list"),
        }
        drop(recomputing);
        let rekeying = self.rekeying.lock().unwrap_or_else(|p| p.into_inner());
        match KeyRing::load(&self.state_dir, &self.extra_keys) {
            Ok(local) => {
                if local.kids() != self.local.load().kids() {
                    tracing::info!(keys = ?local.kids(), "signing keys reloaded");
                }
                let (ring, _) = local.with_shared(&self.shared_keys.load());
                metrics::gauge!(crate::metrics::AUTH_SIGNING_KEYS).set(ring.kids().len() as f64);
                let public = local.public_keys();
                self.published.send_if_modified(|p| {
                    let changed = *p != public;
                    *p = public;
                    changed
                });
                self.local.store(Arc::new(local));
                self.ring.store(Arc::new(ring));
            }
            Err(e) => tracing::error!("{e}; keeping the previous keys"),
        }
        drop(rekeying);
        self.version.send_modify(|v| *v += 1);
    }

    /// The public keys read from this instance's files and configuration
    /// (kid -> SPKI PEM), current and on every change: what it publishes in
    /// a shared store. Never the shared keys themselves, so a key leaves
    /// the store once no instance has it in its files.
    pub fn published_keys(&self) -> watch::Receiver<BTreeMap<String, String>> {
        self.published.subscribe()
    }

    /// Takes the public keys shared through the store (all of them, each
    /// time) and trusts them beside the local ones: when the keys in force
    /// change, streams re-check their token (a key withdrawn ends the
    /// streams signed with it).
    pub fn set_shared_keys(&self, mut shared: Vec<SharedKey>) {
        shared.sort();
        let _rekeying = self.rekeying.lock().unwrap_or_else(|p| p.into_inner());
        if **self.shared_keys.load() == shared {
            return;
        }
        let (ring, problems) = self.local.load().with_shared(&shared);
        for problem in &problems {
            tracing::warn!("{problem}");
        }
        let changed = ring.public_keys() != self.ring.load().public_keys();
        self.shared_keys.store(Arc::new(shared));
        if !changed {
            return;
        }
        tracing::info!(keys = ?ring.kids(), "signing keys shared by other instances taken");
        metrics::gauge!(crate::metrics::AUTH_SIGNING_KEYS).set(ring.kids().len() as f64);
        self.ring.store(Arc::new(ring));
        self.version.send_modify(|v| *v += 1);
    }

    /// Takes the revocations shared through the store (all of them, each
    /// time): streams re-check their token when the list in force changed.
    pub fn set_shared_revocations(&self, shared: Revocations) {
        let _recomputing = self.recompute.lock().unwrap_or_else(|p| p.into_inner());
        if **self.shared.load() == shared {
            return;
        }
        let file = Revocations::load(&self.revocations_path).unwrap_or_default();
        let in_force = file.union(&shared).union(&self.revoked.load());
        tracing::info!(
            shared = shared.len(),
            "revocations shared by other instances taken"
        );
        self.shared.store(Arc::new(shared));
        self.revoked.store(Arc::new(in_force));
        self.version.send_modify(|v| *v += 1);
    }

    /// Watches the keys directory and the revocation list and reloads on
    /// change: a long-lived task, for the caller to run (the server
    /// supervises it). It never ends: with auth off, or when the watcher
    /// cannot be set up (logged), it only waits.
    pub async fn watch(self: Arc<Self>) {
        if self.mode == AuthMode::None {
            return std::future::pending().await;
        }
        let (mut watching, mut changes) = match fswatch::watch(DEBOUNCE) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!("cannot watch keys and revocations for changes: {e}; restart hdsd after changing them");
                return std::future::pending().await;
            }
        };
        let keys_dir = self.ring.load().keys_dir().to_path_buf();
        for dir in [keys_dir.as_path(), parent(&self.revocations_path)] {
            if let Err(e) = std::fs::create_dir_all(dir)
                .map_err(notify::Error::io)
                .and_then(|_| watching.add(dir))
            {
                tracing::error!(dir = %dir.display(), "cannot watch for changes: {e}; restart hdsd after changing files there");
            }
        }
        while let Some(changed) = changes.next().await {
            // The revocation list's directory may be state_dir, where the
            // readiness store is written all the time: only our files count.
            if changed.rescan || changed.paths.iter().any(|p| self.is_own_file(p)) {
                self.reload();
            }
        }
    }

    /// Whether a changed path can change the keys or the revocation list:
    /// anything in the keys directory, the revocation list itself, or a
    /// Kubernetes-style `..data` swap beside it.
    fn is_own_file(&self, path: &Path) -> bool {
        owns(self.ring.load().keys_dir(), &self.revocations_path, path)
    }
}

/// See [`Gate::is_own_file`].
fn owns(keys_dir: &Path, revocations: &Path, path: &Path) -> bool {
    if path.starts_with(keys_dir) || path == revocations {
        return true;
    }
    let beside = path.parent() == Some(parent(revocations));
    beside
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".."))
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_and_the_revocation_list_are_the_gates_files() {
        let keys = Path::new("/s/keys");
        let revoked = Path::new("/s/revoked-tokens");
        assert!(owns(keys, revoked, Path::new("/s/keys/k1.pub.pem")));
        assert!(owns(keys, revoked, Path::new("/s/revoked-tokens")));
        assert!(owns(keys, revoked, Path::new("/s/..data")));
        assert!(!owns(keys, revoked, Path::new("/s/readiness.redb")));
        assert!(!owns(keys, revoked, Path::new("/s/revoked-tokens.tmp")));
        assert!(!owns(keys, revoked, Path::new("/other/..data")));
    }
}
