//! TLS for hdsd's listeners (rustls with the `ring` provider).
//!
//! - [`ServerTls`] loads a listener's PEM files ([`TlsConfig`]) into a
//!   [`rustls::ServerConfig`], keeps it in an [`ArcSwap`] and, once
//!   [`watched`](ServerTls::watch), rebuilds it when the files change on disk.
//!   A failed rebuild keeps the previous configuration and logs what to fix.
//!   New handshakes use the configuration in force when they start; existing
//!   connections are never touched.
//! - [`TlsListener`] turns a [`TcpListener`] into a stream of established TLS
//!   connections: the incoming stream for tonic's
//!   `Server::serve_with_incoming_shutdown`, and an [`axum::serve::Listener`].
//!   Handshakes run concurrently, each bounded by a timeout; a failed one is
//!   logged and skipped, never ending the stream.
//!
//! With `client_ca` set, clients must present a certificate signed by that CA
//! (mutual TLS).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;
use crate::fswatch;

/// An established server-side TLS connection over TCP.
///
/// tonic's `Connected` is implemented for it (feature `tls-ring`), so
/// `Request::remote_addr()` and `Request::peer_certs()` work in handlers.
pub type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long file events are coalesced before the files are read again (tools
/// often write the certificate and the key in quick succession).
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Established connections waiting to be taken by the server.
const READY_QUEUE: usize = 64;

/// Which application protocols a listener offers in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC (the HDS listener): `h2` only. Envoy requires `h2` for gRPC over TLS.
    Grpc,
    /// The REST API: `h2` and `http/1.1`.
    Http,
}

impl Alpn {
    /// The protocol identifiers, most preferred first.
    pub fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Grpc => vec![b"h2".to_vec()],
            Alpn::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Alpn::Grpc => "h2",
            Alpn::Http => "h2, http/1.1",
        }
    }
}

/// Why a listener's TLS configuration cannot be built. Each message names the
/// setting and the file, says what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting}: cannot read {}: {source}; check the path and that hdsd may read the file", .path.display())]
    Read {
        setting: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{setting}: {} is not valid PEM ({reason}); give a PEM file (-----BEGIN ...----- blocks)", .path.display())]
    Pem {
        setting: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{setting}: {} contains no certificate{hint}; give a PEM file with {expected}", .path.display())]
    NoCertificate {
        setting: String,
        path: PathBuf,
        /// What the file should hold.
        expected: &'static str,
        /// What the file holds instead, when that explains the mistake.
        hint: &'static str,
    },
    #[error("{setting}: {} contains no private key{hint}; give a PEM file with the unencrypted private key (PKCS#8, PKCS#1 or SEC1) of the certificate", .path.display())]
    NoKey {
        setting: String,
        path: PathBuf,
        hint: &'static str,
    },
    #[error("{setting}: the private key in {} cannot be used ({reason}); give an RSA, ECDSA (P-256/P-384) or Ed25519 key in PEM", .path.display())]
    BadKey {
        setting: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{setting}: the certificate in {} cannot be used ({reason}); give a valid X.509 certificate chain in PEM, server certificate first", .path.display())]
    BadCertificate {
        setting: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{key_setting}: the private key in {} does not belong to the certificate in {}; give the key the certificate was issued for (or the certificate issued for this key)", .key.display(), .cert.display())]
    KeyMismatch {
        key_setting: String,
        key: PathBuf,
        cert: PathBuf,
    },
    #[error("{setting}: the CA certificates in {} cannot verify client certificates ({reason}); give the PEM certificate of the CA that signs the clients' certificates", .path.display())]
    ClientCa {
        setting: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{section}: cannot watch {} for certificate changes: {source}", .dir.display())]
    Watch {
        section: String,
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// The file contents a configuration was built from, in the order
/// cert, key, client_ca.
type Contents = Vec<Vec<u8>>;

/// The crypto provider for every TLS configuration hdsd builds.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting: setting.to_string(),
        path: path.to_path_buf(),
        source,
    })
}

fn pem_error(setting: &str, path: &Path, e: pem::Error) -> TlsError {
    TlsError::Pem {
        setting: setting.to_string(),
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// All certificates of a PEM file, in order.
fn parse_certs(
    setting: &str,
    path: &Path,
    bytes: &[u8],
    expected: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(setting, path, e))?;
    if certs.is_empty() {
        let hint = if contains(bytes, b"PRIVATE KEY-----") {
            " (it holds a private key: are cert and key swapped?)"
        } else if !contains(bytes, b"-----BEGIN ") {
            " (it is not PEM; if it is DER, convert it with `openssl x509 -inform der -in FILE -out FILE.pem`)"
        } else {
            ""
        };
        return Err(TlsError::NoCertificate {
            setting: setting.to_string(),
            path: path.to_path_buf(),
            expected,
            hint,
        });
    }
    Ok(certs)
}

fn parse_key(setting: &str, path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    match PrivateKeyDer::from_pem_slice(bytes) {
        Ok(key) => Ok(key),
        Err(pem::Error::NoItemsFound) => {
            let hint = if contains(bytes, b"ENCRYPTED PRIVATE KEY") {
                " (it is encrypted; decrypt it with `openssl pkey -in FILE -out FILE`)"
            } else if contains(bytes, b"-----BEGIN CERTIFICATE") {
                " (it holds a certificate: are cert and key swapped?)"
            } else if !contains(bytes, b"-----BEGIN ") {
                " (it is not PEM)"
            } else {
                ""
            };
            Err(TlsError::NoKey {
                setting: setting.to_string(),
                path: path.to_path_buf(),
                hint,
            })
        }
        Err(e) => Err(pem_error(setting, path, e)),
    }
}

/// Builds a server configuration from the files' contents (`contents` as read
/// by [`read_files`]). `section` names the settings in messages (`hds.tls`).
fn build(
    section: &str,
    files: &TlsConfig,
    contents: &Contents,
    alpn: Alpn,
) -> Result<ServerConfig, TlsError> {
    let cert_setting = format!("{section}.cert");
    let key_setting = format!("{section}.key");
    let certs = parse_certs(
        &cert_setting,
        &files.cert,
        &contents[0],
        "the server certificate chain (server certificate first, then intermediates)",
    )?;
    let key = parse_key(&key_setting, &files.key, &contents[1])?;
    let provider = provider();
    // Parse the key on its own first so that a bad key is told apart from a
    // bad certificate or a pair that does not match.
    provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| TlsError::BadKey {
            setting: key_setting.clone(),
            path: files.key.clone(),
            reason: e.to_string(),
        })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions");
    let builder = match (&files.client_ca, contents.get(2)) {
        (Some(ca_path), Some(ca_bytes)) => {
            let setting = format!("{section}.client_ca");
            let cas = parse_certs(
                &setting,
                ca_path,
                ca_bytes,
                "the CA certificate(s) that sign client certificates",
            )?;
            let bad = |reason: String| TlsError::ClientCa {
                setting: setting.clone(),
                path: ca_path.clone(),
                reason,
            };
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots.add(ca).map_err(|e| bad(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            key_setting: key_setting.clone(),
            key: files.key.clone(),
            cert: files.cert.clone(),
        },
        other => TlsError::BadCertificate {
            setting: cert_setting.clone(),
            path: files.cert.clone(),
            reason: other.to_string(),
        },
    })?;
    config.alpn_protocols = alpn.protocols();
    Ok(config)
}

/// Reads the files of `files`: cert, key and, when set, client_ca.
fn read_files(section: &str, files: &TlsConfig) -> Result<Contents, TlsError> {
    let mut contents = vec![
        read(&format!("{section}.cert"), &files.cert)?,
        read(&format!("{section}.key"), &files.key)?,
    ];
    if let Some(ca) = &files.client_ca {
        contents.push(read(&format!("{section}.client_ca"), ca)?);
    }
    Ok(contents)
}

/// Builds the server configuration of `files` once, without watching.
/// `section` names the settings in error messages (`hds.tls`, `api.tls`).
pub fn server_config(
    section: &str,
    files: &TlsConfig,
    alpn: Alpn,
) -> Result<ServerConfig, TlsError> {
    build(section, files, &read_files(section, files)?, alpn)
}

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
    alpn: Alpn,
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
    pub fn load(section: &str, files: &TlsConfig, alpn: Alpn) -> Result<ServerTls, TlsError> {
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

    /// [`load`](Self::load), then [`watch`](Self::watch); a watch that cannot
    /// be set up is logged (the listener still serves, without reloads).
    /// Must be called within a tokio runtime.
    pub fn load_and_watch(
        section: &str,
        files: &TlsConfig,
        alpn: Alpn,
    ) -> Result<ServerTls, TlsError> {
        let tls = Self::load(section, files, alpn)?;
        tracing::info!(
            section,
            cert = %files.cert.display(),
            client_certificates = if files.client_ca.is_some() { "required" } else { "not requested" },
            alpn = alpn.describe(),
            "TLS enabled"
        );
        if let Err(e) = tls.watch() {
            tracing::warn!(
                "{e}; certificates will not be reloaded: restart hdsd after replacing them"
            );
        }
        Ok(tls)
    }

    /// The settings section this configuration comes from (`hds.tls`).
    pub fn section(&self) -> &str {
        &self.inner.section
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
    /// Kubernetes swaps a symlink) and reloads on change. The watch ends when
    /// the last clone of this `ServerTls` is dropped. Must be called within a
    /// tokio runtime.
    pub fn watch(&self) -> Result<(), TlsError> {
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
        tokio::spawn(watch_task(Arc::downgrade(inner), changes));
        Ok(())
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

/// Accepts TCP connections and completes TLS handshakes concurrently.
///
/// As a [`Stream`](tokio_stream::Stream) it is the `incoming` of tonic's
/// `Server::serve_with_incoming_shutdown` (it never yields an error: failed
/// handshakes are logged and skipped). It is also an
/// [`axum::serve::Listener`]. Dropping it closes the listening socket and
/// abandons handshakes in progress.
pub struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream, SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Serves TLS on `listener` with [`HANDSHAKE_TIMEOUT`]. Must be called
    /// within a tokio runtime.
    pub fn new(listener: TcpListener, tls: ServerTls) -> io::Result<TlsListener> {
        Self::with_handshake_timeout(listener, tls, HANDSHAKE_TIMEOUT)
    }

    /// Serves TLS on `listener`; a client that has not completed its handshake
    /// within `timeout` is disconnected.
    pub fn with_handshake_timeout(
        listener: TcpListener,
        tls: ServerTls,
        timeout: Duration,
    ) -> io::Result<TlsListener> {
        let local_addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = tokio::spawn(accept_loop(listener, tls, timeout, tx));
        Ok(TlsListener {
            local_addr,
            ready,
            acceptor,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next established connection and its peer address.
    pub async fn accept(&mut self) -> (TlsStream, SocketAddr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when this listener is dropped, or if
            // it panicked: then no connection will ever come.
            None => std::future::pending().await,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl tokio_stream::Stream for TlsListener {
    type Item = Result<TlsStream, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.ready.poll_recv(cx) {
            Poll::Ready(Some((stream, _))) => Poll::Ready(Some(Ok(stream))),
            // See `accept`: never end the stream of connections.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        TlsListener::accept(self).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: ServerTls,
    timeout: Duration,
    ready: mpsc::Sender<(TlsStream, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let acceptor = TlsAcceptor::from(tls.current());
                    let ready = ready.clone();
                    let tls = tls.clone();
                    handshakes.spawn(async move {
                        match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let _ = ready.send((stream, peer)).await;
                            }
                            Ok(Err(e)) => log_handshake_error(&tls, peer, &e),
                            Err(_) => tracing::warn!(
                                %peer,
                                section = tls.section(),
                                "TLS handshake failed: not completed within {}s; connection closed",
                                timeout.as_secs_f64()
                            ),
                        }
                    });
                }
                Err(e) => accept_error(e).await,
            },
            // Reap finished handshakes so the set does not grow.
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            () = ready.closed() => return,
        }
    }
}

/// As axum does: per-connection errors are retried at once; others (such as
/// running out of file descriptors) are logged and retried after a pause.
async fn accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a TCP connection failed; retrying in 1s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Why a handshake failed, in terms an operator can act on, and whether it is
/// worth a warning (a client closing early is usually a port check).
fn describe_handshake_error(tls: &ServerTls, e: &io::Error) -> (bool, String) {
    let section = tls.section();
    let Some(rustls_error) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => (
                false,
                format!("the client closed the connection before completing the handshake ({e})"),
            ),
            _ => (true, e.to_string()),
        };
    };
    use rustls::Error as E;
    let text = match rustls_error {
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => match tls.inner.alpn {
            Alpn::Grpc => format!(
                "{rustls_error}: the client does not speak TLS (plaintext gRPC?); configure TLS \
                 on the client (for Envoy: `hdsd bootstrap --ca`) or remove {section}"
            ),
            Alpn::Http => format!(
                "{rustls_error}: the client does not speak TLS (plain http://?); use https:// \
                 or remove {section}"
            ),
        },
        E::NoApplicationProtocol => format!(
            "{rustls_error}: the client offered none of the protocols this listener serves ({}); \
             Envoy must set alpn_protocols: [h2] in its UpstreamTlsContext",
            tls.inner.alpn.describe()
        ),
        E::NoCertificatesPresented => format!(
            "{rustls_error}: the client presented no certificate, and {section}.client_ca requires one"
        ),
        E::InvalidCertificate(_) => format!(
            "client certificate rejected: {rustls_error}; it must be issued by the CA in {section}.client_ca"
        ),
        E::AlertReceived(alert) => format!(
            "the client refused the handshake (alert {alert:?}); if it does not trust hdsd's \
             certificate, give it the CA that issued {}",
            tls.inner.files.cert.display()
        ),
        other => other.to_string(),
    };
    (true, text)
}

fn log_handshake_error(tls: &ServerTls, peer: SocketAddr, e: &io::Error) {
    let rejected_client_cert = matches!(
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_))
    );
    if rejected_client_cert {
        metrics::counter!(crate::metrics::AUTH_FAILURES, "reason" => "tls").increment(1);
    }
    let (warn, reason) = describe_handshake_error(tls, e);
    if warn {
        tracing::warn!(%peer, section = tls.section(), "TLS handshake failed: {reason}");
    } else {
        tracing::debug!(%peer, section = tls.section(), "TLS handshake failed: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;
    use tokio_stream::StreamExt;

    /// A test certificate authority.
    struct Ca {
        issuer: CertifiedIssuer<'static, KeyPair>,
    }

    /// A certificate and its key, in PEM.
    struct Leaf {
        cert_pem: String,
        key_pem: String,
        der: CertificateDer<'static>,
    }

    impl Ca {
        fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let issuer =
                CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
            Ca { issuer }
        }

        fn pem(&self) -> String {
            self.issuer.pem()
        }

        fn leaf(&self, name: &str, eku: ExtendedKeyUsagePurpose) -> Leaf {
            let mut params =
                CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                    .unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![eku];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            Leaf {
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
                der: cert.der().clone(),
            }
        }

        fn server(&self, name: &str) -> Leaf {
            self.leaf(name, ExtendedKeyUsagePurpose::ServerAuth)
        }

        fn client(&self, name: &str) -> Leaf {
            self.leaf(name, ExtendedKeyUsagePurpose::ClientAuth)
        }
    }

    /// Writes a file the way certificate tools do: a temporary file renamed over it.
    fn replace(path: &Path, contents: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    struct Files {
        dir: tempfile::TempDir,
        config: TlsConfig,
    }

    fn files(leaf: &Leaf, client_ca: Option<&Ca>) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let config = TlsConfig {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: client_ca.map(|_| dir.path().join("client-ca.pem")),
        };
        std::fs::write(&config.cert, &leaf.cert_pem).unwrap();
        std::fs::write(&config.key, &leaf.key_pem).unwrap();
        if let (Some(ca), Some(path)) = (client_ca, &config.client_ca) {
            std::fs::write(path, ca.pem()).unwrap();
        }
        Files { dir, config }
    }

    fn client_config(ca: &Ca, client: Option<&Leaf>, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(ca.issuer.der().clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            Some(leaf) => builder
                .with_client_auth_cert(
                    vec![leaf.der.clone()],
                    PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// Handshakes with `server` in memory; returns the certificate it presented.
    async fn presented(server: Arc<ServerConfig>, ca: &Ca) -> CertificateDer<'static> {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let connector = TlsConnector::from(Arc::new(client_config(ca, None, &[b"h2"])));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (client, server) = tokio::join!(
            connector.connect(name, a),
            TlsAcceptor::from(server).accept(b)
        );
        server.unwrap();
        let client = client.unwrap();
        client.get_ref().1.peer_certificates().unwrap()[0].clone()
    }

    /// Connects to `addr` with TLS.
    async fn connect(
        addr: SocketAddr,
        config: rustls::ClientConfig,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    #[test]
    fn valid_files_build_with_alpn() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let grpc = server_config("hds.tls", &f.config, Alpn::Grpc).unwrap();
        assert_eq!(grpc.alpn_protocols, vec![b"h2".to_vec()]);
        let api = server_config("api.tls", &f.config, Alpn::Http).unwrap();
        assert_eq!(
            api.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );

        let clients = Ca::new("clients");
        let f = files(&ca.server("hdsd"), Some(&clients));
        server_config("hds.tls", &f.config, Alpn::Grpc).unwrap();
    }

    #[test]
    fn missing_file_names_setting_and_path() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let mut config = f.config.clone();
        config.key = f.dir.path().join("nope.pem");
        let e = server_config("hds.tls", &config, Alpn::Grpc).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, TlsError::Read { .. }), "{e:?}");
        assert!(msg.starts_with("hds.tls.key: cannot read "), "{msg}");
        assert!(msg.contains("nope.pem"), "{msg}");
    }

    #[test]
    fn garbage_is_rejected_with_what_to_fix() {
        let ca = Ca::new("test CA");
        let leaf = ca.server("hdsd");
        let f = files(&leaf, None);

        std::fs::write(&f.config.cert, "hello\n").unwrap();
        let e = server_config("hds.tls", &f.config, Alpn::Grpc).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("hds.tls.cert: "), "{msg}");
        assert!(
            msg.contains("contains no certificate (it is not PEM")
                && msg.contains("give a PEM file with the server certificate chain"),
            "{msg}"
        );

        // Cert and key swapped.
        std::fs::write(&f.config.cert, &leaf.key_pem).unwrap();
        let msg = server_config("hds.tls", &f.config, Alpn::Grpc)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("are cert and key swapped?"), "{msg}");

        // Broken base64.
        std::fs::write(
            &f.config.cert,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = server_config("hds.tls", &f.config, Alpn::Grpc).unwrap_err();
        assert!(matches!(e, TlsError::Pem { .. }), "{e:?}");
        assert!(e.to_string().contains("is not valid PEM"), "{e}");

        // Valid PEM, not a certificate inside.
        std::fs::write(
            &f.config.cert,
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = server_config("hds.tls", &f.config, Alpn::Grpc).unwrap_err();
        assert!(matches!(e, TlsError::BadCertificate { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("hds.tls.cert: the certificate in "),
            "{e}"
        );

        // A key file without a key.
        std::fs::write(&f.config.cert, &leaf.cert_pem).unwrap();
        std::fs::write(&f.config.key, "").unwrap();
        let e = server_config("hds.tls", &f.config, Alpn::Grpc).unwrap_err();
        assert!(matches!(e, TlsError::NoKey { .. }), "{e:?}");
        assert!(e.to_string().starts_with("hds.tls.key: "), "{e}");

        // A CA file without a certificate.
        let clients = Ca::new("clients");
        let f = files(&leaf, Some(&clients));
        std::fs::write(f.config.client_ca.as_ref().unwrap(), "").unwrap();
        let msg = server_config("hds.tls", &f.config, Alpn::Grpc)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("hds.tls.client_ca: ")
                && msg.contains("the CA certificate(s) that sign client certificates"),
            "{msg}"
        );
    }

    #[test]
    fn mismatched_key_is_rejected() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        std::fs::write(&f.config.key, ca.server("other").key_pem).unwrap();
        let e = server_config("api.tls", &f.config, Alpn::Http).unwrap_err();
        assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("api.tls.key: the private key in ")
                && msg.contains("does not belong to the certificate in"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn reload_swaps_and_a_broken_file_keeps_the_old_config() {
        let ca = Ca::new("test CA");
        let first = ca.server("first");
        let f = files(&first, None);
        let tls = ServerTls::load("hds.tls", &f.config, Alpn::Grpc).unwrap();
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
        let tls = ServerTls::load("hds.tls", &f.config, Alpn::Grpc).unwrap();
        tls.watch().unwrap();
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

    #[tokio::test]
    async fn listener_skips_failed_and_slow_handshakes() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("hds.tls", &f.config, Alpn::Grpc).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener =
            TlsListener::with_handshake_timeout(tcp, tls, Duration::from_secs(2)).unwrap();
        let addr = listener.local_addr();

        // A client that never speaks, one that speaks plaintext HTTP/2, one
        // without h2: none blocks the next good client or ends the stream.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let no_h2 = connect(addr, client_config(&ca, None, &[b"http/1.1"])).await;
        assert!(no_h2.is_err(), "a client without h2 must be refused");

        for _ in 0..2 {
            let client = tokio::spawn(connect(addr, client_config(&ca, None, &[b"h2"])));
            let server = tokio::time::timeout(Duration::from_secs(1), listener.next())
                .await
                .expect("a good client is not held up by the others")
                .unwrap()
                .unwrap();
            assert_eq!(server.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            assert!(server.get_ref().0.nodelay().unwrap());
            client.await.unwrap().unwrap();
        }

        // The silent client is cut off after the timeout.
        let mut silent = _silent;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("the silent client is disconnected")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
        let ca = Ca::new("server CA");
        let clients = Ca::new("client CA");
        let other = Ca::new("another CA");
        let f = files(&ca.server("hdsd"), Some(&clients));
        let tls = ServerTls::load("hds.tls", &f.config, Alpn::Grpc).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener = TlsListener::new(tcp, tls).unwrap();
        let addr = listener.local_addr();

        async fn refused(addr: SocketAddr, config: rustls::ClientConfig) {
            // With TLS 1.3 the server judges the client certificate after the
            // client's handshake ends: the refusal arrives as an alert.
            let result = async {
                let mut s = connect(addr, config).await?;
                s.write_all(b"ping").await?;
                let mut buf = [0u8; 1];
                s.read(&mut buf).await
            };
            let r = tokio::time::timeout(Duration::from_secs(5), result)
                .await
                .expect("refused promptly");
            assert!(r.is_err(), "expected a refusal, got {r:?}");
        }
        refused(addr, client_config(&ca, None, &[b"h2"])).await;
        refused(
            addr,
            client_config(&ca, Some(&other.client("dp")), &[b"h2"]),
        )
        .await;

        let good = client_config(&ca, Some(&clients.client("dp")), &[b"h2"]);
        let client = tokio::spawn(connect(addr, good));
        let (server, peer) = listener.accept().await;
        let certs = server.get_ref().1.peer_certificates().unwrap();
        assert_eq!(certs.len(), 1);
        let client = client.await.unwrap().unwrap();
        assert_eq!(peer, client.get_ref().0.local_addr().unwrap());
    }

    #[tokio::test]
    async fn axum_serves_over_the_tls_listener() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("api.tls", &f.config, Alpn::Http).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = TlsListener::new(tcp, tls).unwrap();
        let addr = listener.local_addr();
        let app = axum::Router::new().route("/hello", axum::routing::get(|| async { "hi" }));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let mut s = connect(addr, client_config(&ca, None, &[b"http/1.1"]))
            .await
            .unwrap();
        assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).await.ok();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("hi"), "{response}");
        server.abort();
    }

    #[test]
    fn handshake_errors_say_what_to_do() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("hds.tls", &f.config, Alpn::Grpc).unwrap();
        let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);

        let (warn, text) = describe_handshake_error(
            &tls,
            &wrap(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType,
            )),
        );
        assert!(warn && text.contains("does not speak TLS"), "{text}");
        let (_, text) = describe_handshake_error(&tls, &wrap(rustls::Error::NoApplicationProtocol));
        assert!(text.contains("alpn_protocols: [h2]"), "{text}");
        let (_, text) =
            describe_handshake_error(&tls, &wrap(rustls::Error::NoCertificatesPresented));
        assert!(text.contains("hds.tls.client_ca requires one"), "{text}");
        let (warn, _) = describe_handshake_error(
            &tls,
            &io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof"),
        );
        assert!(!warn, "a client closing early is not worth a warning");
    }
}
