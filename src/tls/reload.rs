//! The TLS configuration in force for a listener, reloaded from its files
//! when they change (through the one file watcher, [`crate::fswatch`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;

use super::pem::{build, read_files, Contents};
use super::{Listener, TlsError};
use crate::config::TlsConfig;
use crate::fswatch;

/// How long file events are coalesced before the files are read again (tools
/// often write the certificate and the key in quick succession).
const DEBOUNCE: Duration = Duration::from_millis(300);

/// What a [`ServerTls::reload`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The files hold what the configuration in force was built from.
    Unchanged,
    /// A new configuration was built and is used by new handshakes.
    Replaced,
}

/// A listener's TLS configuration, reloadable from its files. Clones share it.
#[derive(Clone)]
pub struct ServerTls {
    inner: Arc<Inner>,
}

struct Inner {
    section: String,
    files: TlsConfig,
    alpn: Listener,
    current: ArcSwap<ServerConfig>,
    /// What `current` was built from.
    loaded: Mutex<Contents>,
    /// Kept alive while the configuration is in use; dropping it ends the watch task.
    watcher: Mutex<Option<fswatch::Watching>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("section", &self.inner.section)
            .field("files", &self.inner.files)
            .field("alpn", &self.inner.alpn)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads `files`; fails with a message naming the setting and the file.
    pub fn load(section: &str, files: &TlsConfig, alpn: Listener) -> Result<ServerTls, TlsError> {
        let contents = read_files(section, files)?;
        let config = build(section, files, &contents, alpn)?;
        Ok(ServerTls {
            inner: Arc::new(Inner {
                section: section.to_string(),
                files: files.clone(),
                alpn,
                current: ArcSwap::from_pointee(config),
                loaded: Mutex::new(contents),
                watcher: Mutex::new(None),
            }),
        })
    }

    /// [`load`](Self::load), then [`watch`](Self::watch): the configuration
    /// and the task that reloads it, for the caller to run (the server
    /// supervises it). A watch that cannot be set up is logged (the listener
    /// still serves, without reloads, and there is no task).
    pub fn load_and_watch(
        section: &str,
        files: &TlsConfig,
        alpn: Listener,
    ) -> Result<(ServerTls, Option<crate::task::Task>), TlsError> {
        let tls = Self::load(section, files, alpn)?;
        tracing::info!(
            section,
            cert = %files.cert.display(),
            client_certificates = match (&files.client_ca, alpn.client_certificate_optional()) {
                (None, _) => "not requested",
                (Some(_), false) => "required",
                (Some(_), true) => "optional",
            },
            alpn = alpn.describe(),
            "TLS enabled"
        );
        let reloading = match tls.watch() {
            Ok(task) => Some(crate::task::task(task)),
            Err(e) => {
                tracing::warn!(
                    "{e}; certificates will not be reloaded: restart hdsd after replacing them"
                );
                None
            }
        };
        Ok((tls, reloading))
    }

    /// The settings section this configuration comes from (`hds.tls`).
    pub fn section(&self) -> &str {
        &self.inner.section
    }

    /// The listener's name in metrics: `hds` or `api`.
    pub fn listener(&self) -> &'static str {
        self.inner.alpn.name()
    }

    /// The protocols this listener offers.
    pub fn alpn(&self) -> Listener {
        self.inner.alpn
    }

    /// The certificate file in force.
    pub fn cert_path(&self) -> &Path {
        &self.inner.files.cert
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.inner.current.load_full()
    }

    /// Reads the files again and, when they changed and build, swaps the
    /// configuration in. On error the configuration in force stays.
    pub fn reload(&self) -> Result<Reload, TlsError> {
        let inner = &self.inner;
        let contents = read_files(&inner.section, &inner.files)?;
        let mut loaded = inner.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if *loaded == contents {
            return Ok(Reload::Unchanged);
        }
        let config = build(&inner.section, &inner.files, &contents, inner.alpn)?;
        inner.current.store(Arc::new(config));
        *loaded = contents;
        Ok(Reload::Replaced)
    }

    /// Watches the files' directories (tools replace files by renaming, and
    /// Kubernetes swaps a symlink) and reloads on change: the task that does,
    /// for the caller to run. It ends when the last clone of this
    /// `ServerTls` is dropped.
    pub fn watch(
        &self,
    ) -> Result<impl std::future::Future<Output = ()> + Send + 'static, TlsError> {
        let inner = &self.inner;
        let mut dirs: Vec<PathBuf> = Vec::new();
        for file in [
            Some(&inner.files.cert),
            Some(&inner.files.key),
            inner.files.client_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let dir = match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        let (mut watching, changes) =
            fswatch::watch(DEBOUNCE).map_err(|source| TlsError::Watch {
                section: inner.section.clone(),
                dir: dirs[0].clone(),
                source,
            })?;
        for dir in &dirs {
            watching.add(dir).map_err(|source| TlsError::Watch {
                section: inner.section.clone(),
                dir: dir.clone(),
                source,
            })?;
        }
        *inner.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watching);
        Ok(watch_task(Arc::downgrade(inner), changes))
    }
}

/// Reloads after each burst of file events, until the watcher is dropped.
async fn watch_task(inner: Weak<Inner>, mut changes: fswatch::Changes) {
    while let Some(changed) = changes.next().await {
        let Some(inner) = inner.upgrade() else { break };
        let tls = ServerTls { inner };
        let section = tls.section().to_string();
        if let Some(e) = changed.errors.first() {
            tracing::warn!(section = %section, "certificate file watch error: {e}; reading the files again");
        }
        let cert = tls.inner.files.cert.clone();
        match tokio::task::spawn_blocking(move || tls.reload()).await {
            Ok(Ok(Reload::Replaced)) => tracing::info!(
                section = %section,
                cert = %cert.display(),
                "TLS certificate reloaded; new connections use it, existing ones keep theirs"
            ),
            Ok(Ok(Reload::Unchanged)) => {
                tracing::debug!(section = %section, "TLS files unchanged")
            }
            Ok(Err(e)) => tracing::error!(
                section = %section,
                "TLS reload failed: {e}. Keeping the certificate loaded before; \
                 fix the file and hdsd reloads it"
            ),
            Err(e) => tracing::error!(section = %section, error = %e, "TLS reload task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testutil::*;

    #[tokio::test]
    async fn reload_swaps_and_a_broken_file_keeps_the_old_config() {
        let ca = Ca::new("test CA");
        let first = ca.server("first");
        let f = files(&first, None);
        let tls = ServerTls::load("hds.tls", &f.config, Listener::Hds).unwrap();
        assert_eq!(presented(tls.current(), &ca).await, first.der);
        assert_eq!(tls.reload().unwrap(), Reload::Unchanged);

        let second = ca.server("second");
        replace(&f.config.cert, &second.cert_pem);
        replace(&f.config.key, &second.key_pem);
        assert_eq!(tls.reload().unwrap(), Reload::Replaced);
        assert_eq!(presented(tls.current(), &ca).await, second.der);

        // A broken certificate, or a key that does not match: the config stays.
        let before = tls.current();
        replace(&f.config.cert, "garbage");
        assert!(tls.reload().is_err());
        assert!(Arc::ptr_eq(&before, &tls.current()));
        replace(&f.config.cert, &first.cert_pem);
        assert!(matches!(tls.reload(), Err(TlsError::KeyMismatch { .. })));
        assert!(Arc::ptr_eq(&before, &tls.current()));
        std::fs::remove_file(&f.config.key).unwrap();
        assert!(matches!(tls.reload(), Err(TlsError::Read { .. })));
        assert_eq!(presented(tls.current(), &ca).await, second.der);

        // Fixed: the next reload takes it.
        replace(&f.config.key, &first.key_pem);
        assert_eq!(tls.reload().unwrap(), Reload::Replaced);
        assert_eq!(presented(tls.current(), &ca).await, first.der);
    }

    async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_reloads_replaced_files() {
        let ca = Ca::new("test CA");
        let first = ca.server("first");
        let f = files(&first, None);
        let tls = ServerTls::load("hds.tls", &f.config, Listener::Hds).unwrap();
        tokio::spawn(tls.watch().unwrap());
        let before = tls.current();

        // A broken write on the way is not taken (the reload refuses it, see
        // `reload_swaps_and_a_broken_file_keeps_the_old_config`); the watcher
        // then picks up the complete replacement.
        replace(&f.config.cert, "garbage");

        let second = ca.server("second");
        replace(&f.config.key, &second.key_pem);
        replace(&f.config.cert, &second.cert_pem);
        wait_until("the new certificate", || {
            !Arc::ptr_eq(&before, &tls.current())
        })
        .await;
        assert_eq!(presented(tls.current(), &ca).await, second.der);
    }
}
