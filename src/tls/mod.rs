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
//! (mutual TLS); on the zone listener the certificate is optional, and the
//! zone sync service takes a zone's name from it when there is no zone token.
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

/// Which of hdsd's listeners a TLS configuration is for: what it offers in
/// ALPN, its name in metrics, and whether client certificates are optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The HDS listener (gRPC): `h2` only. Envoy requires `h2` for gRPC over TLS.
    Hds,
    /// The REST API: `h2` and `http/1.1`.
    Api,
    /// The global's zone listener (gRPC, `h2`). With `client_ca`, a
    /// certificate is optional: a zone shows a zone token or a certificate
    /// naming it (`hdsd://zone/NAME`), and the zone sync service requires one.
    Zones,
}

impl Listener {
    /// The protocol identifiers, most preferred first.
    pub fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Listener::Hds | Listener::Zones => vec![b"h2".to_vec()],
            Listener::Api => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }

    /// The listener's name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Listener::Hds => "hds",
            Listener::Api => "api",
            Listener::Zones => "zones",
        }
    }

    /// Whether a client without a certificate completes the handshake when
    /// `client_ca` is set (the service then decides).
    pub fn client_certificate_optional(self) -> bool {
        self == Listener::Zones
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Listener::Hds | Listener::Zones => "h2",
            Listener::Api => "h2, http/1.1",
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
