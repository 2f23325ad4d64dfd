//! A listener's PEM files -> a [`ServerConfig`], with a diagnosis of each
//! mistake (swapped cert and key, DER instead of PEM, an encrypted key, a key
//! that does not match the certificate) that names the setting and the file.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::{provider, Listener, TlsError};
use crate::config::TlsConfig;

/// The file contents a configuration was built from, in the order
/// cert, key, client_ca.
pub(super) type Contents = Vec<Vec<u8>>;

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
pub(super) fn build(
    section: &str,
    files: &TlsConfig,
    contents: &Contents,
    alpn: Listener,
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
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if alpn.client_certificate_optional() {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| bad(e.to_string()))?;
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
pub(super) fn read_files(section: &str, files: &TlsConfig) -> Result<Contents, TlsError> {
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
    alpn: Listener,
) -> Result<ServerConfig, TlsError> {
    build(section, files, &read_files(section, files)?, alpn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testutil::*;

    #[test]
    fn valid_files_build_with_alpn() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let grpc = server_config("hds.tls", &f.config, Listener::Hds).unwrap();
        assert_eq!(grpc.alpn_protocols, vec![b"h2".to_vec()]);
        let api = server_config("api.tls", &f.config, Listener::Api).unwrap();
        assert_eq!(
            api.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );

        let clients = Ca::new("clients");
        let f = files(&ca.server("hdsd"), Some(&clients));
        server_config("hds.tls", &f.config, Listener::Hds).unwrap();
    }

    #[test]
    fn missing_file_names_setting_and_path() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let mut config = f.config.clone();
        config.key = f.dir.path().join("nope.pem");
        let e = server_config("hds.tls", &config, Listener::Hds).unwrap_err();
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
        let e = server_config("hds.tls", &f.config, Listener::Hds).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("hds.tls.cert: "), "{msg}");
        assert!(
            msg.contains("contains no certificate (it is not PEM")
                && msg.contains("give a PEM file with the server certificate chain"),
            "{msg}"
        );

        // Cert and key swapped.
        std::fs::write(&f.config.cert, &leaf.key_pem).unwrap();
        let msg = server_config("hds.tls", &f.config, Listener::Hds)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("are cert and key swapped?"), "{msg}");

        // Broken base64.
        std::fs::write(
            &f.config.cert,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = server_config("hds.tls", &f.config, Listener::Hds).unwrap_err();
        assert!(matches!(e, TlsError::Pem { .. }), "{e:?}");
        assert!(e.to_string().contains("is not valid PEM"), "{e}");

        // Valid PEM, not a certificate inside.
        std::fs::write(
            &f.config.cert,
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = server_config("hds.tls", &f.config, Listener::Hds).unwrap_err();
        assert!(matches!(e, TlsError::BadCertificate { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("hds.tls.cert: the certificate in "),
            "{e}"
        );

        // A key file without a key.
        std::fs::write(&f.config.cert, &leaf.cert_pem).unwrap();
        std::fs::write(&f.config.key, "").unwrap();
        let e = server_config("hds.tls", &f.config, Listener::Hds).unwrap_err();
        assert!(matches!(e, TlsError::NoKey { .. }), "{e:?}");
        assert!(e.to_string().starts_with("hds.tls.key: "), "{e}");

        // A CA file without a certificate.
        let clients = Ca::new("clients");
        let f = files(&leaf, Some(&clients));
        std::fs::write(f.config.client_ca.as_ref().unwrap(), "").unwrap();
        let msg = server_config("hds.tls", &f.config, Listener::Hds)
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
        let e = server_config("api.tls", &f.config, Listener::Api).unwrap_err();
        assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("api.tls.key: the private key in ")
                && msg.contains("does not belong to the certificate in"),
            "{msg}"
        );
    }
}
