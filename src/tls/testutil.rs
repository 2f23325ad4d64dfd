//! Test certificates and clients for the TLS tests.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::provider;
use crate::config::TlsConfig;

/// A test certificate authority.
pub(super) struct Ca {
    pub(super) issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
pub(super) struct Leaf {
    pub(super) cert_pem: String,
    pub(super) key_pem: String,
    pub(super) der: CertificateDer<'static>,
}

impl Ca {
    pub(super) fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub(super) fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub(super) fn leaf(&self, name: &str, eku: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
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

    pub(super) fn server(&self, name: &str) -> Leaf {
        self.leaf(name, ExtendedKeyUsagePurpose::ServerAuth)
    }

    pub(super) fn client(&self, name: &str) -> Leaf {
        self.leaf(name, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// Writes a file the way certificate tools do: a temporary file renamed over it.
pub(super) fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub(super) struct Files {
    pub(super) dir: tempfile::TempDir,
    pub(super) config: TlsConfig,
}

pub(super) fn files(leaf: &Leaf, client_ca: Option<&Ca>) -> Files {
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

pub(super) fn client_config(
    ca: &Ca,
    client: Option<&Leaf>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
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
pub(super) async fn presented(server: Arc<ServerConfig>, ca: &Ca) -> CertificateDer<'static> {
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
pub(super) async fn connect(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}
