//! TLS for hdsd's listeners (rustls with the `ring` provider).
//!
//! - [`ServerTls`] loads a listener's PEM files ([`TlsConfig`]) into a
//!   [`rustls::ServerConfig`], keeps it in an [`ArcSwap`] and, once
//!   [`watched`](ServerTls::watch), rebuilds it when the files change on disk.
//!   A failed rebuild keeps the previous configuration and logs what to fix.
//!   New handshakes use the configuration in force when they start; existing
//!   connections are never touched.
//! - [`TlsHandshake`] is the TLS step of [`crate::net`]'s accept loop, which
//!   admits connections and hands established ones to tonic and axum
//!   ([`TlsListener`]). Handshakes run concurrently, each bounded by the
//!   listener's handshake deadline; a failed one is logged and skipped, never
//!   ending the stream of connections.
//!
//! With `client_ca` set, clients must present a certificate signed by that CA
//! (mutual TLS).
//!
//! The parts: [`pem`] reads the PEM files and builds a configuration, with a
//! diagnosis of each mistake; [`reload`] holds the configuration in force and
//! reloads it when the files change; [`listener`] accepts connections and
//! completes handshakes.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use tokio::net::TcpStream;

pub mod listener;
pub mod pem;
pub mod reload;
#[cfg(test)]
mod testutil;

pub use listener::{TlsHandshake, TlsListener, HANDSHAKE_TIMEOUT};
pub use pem::server_config;
pub use reload::{Reload, ServerTls};

/// An established server-side TLS connection over TCP.
///
/// tonic's `Connected` is implemented for it (feature `tls-ring`), so
/// `Request::remote_addr()` and `Request::peer_certs()` work in handlers.
pub type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

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

    pub(crate) fn describe(self) -> &'static str {
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

/// The crypto provider for every TLS configuration hdsd builds.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
