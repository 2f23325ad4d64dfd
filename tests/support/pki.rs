//! Certificates made for one test (rcgen): a CA, and leaf certificates it
//! issues, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateDer;

/// A certificate authority made for one test.
pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, written as PEM files.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// Writes the CA certificate to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.issuer.pem()).unwrap();
        path.to_path_buf()
    }

    /// Issues a certificate for 127.0.0.1 and localhost and writes it (by
    /// rename, as certificate tools do) to `<dir>/<stem>.pem` and `<dir>/<stem>-key.pem`.
    pub fn issue(&self, dir: &Path, stem: &str, eku: ExtendedKeyUsagePurpose) -> Leaf {
        self.issue_for(dir, stem, eku, &["127.0.0.1", "localhost"])
    }

    /// [`Ca::issue`] for these names (DNS names, or IP addresses).
    pub fn issue_for(
        &self,
        dir: &Path,
        stem: &str,
        eku: ExtendedKeyUsagePurpose,
        names: &[&str],
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = CertificateParams::new(names).unwrap();
        self.sign(dir, stem, eku, params)
    }

    /// A client certificate whose subject alternative names are these URIs
    /// only (a zone's: `hdsd://zone/NAME`).
    pub fn issue_with_uris(&self, dir: &Path, stem: &str, uris: &[&str]) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI(Ia5String::try_from(*uri).unwrap()));
        }
        self.sign(dir, stem, ExtendedKeyUsagePurpose::ClientAuth, params)
    }

    fn sign(
        &self,
        dir: &Path,
        stem: &str,
        eku: ExtendedKeyUsagePurpose,
        mut params: CertificateParams,
    ) -> Leaf {
        params.distinguished_name.push(DnType::CommonName, stem);
        params.extended_key_usages = vec![eku];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let leaf = Leaf {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}-key.pem")),
            der: cert.der().clone(),
        };
        replace(&leaf.key, &key.serialize_pem());
        replace(&leaf.cert, &cert.pem());
        leaf
    }
}

/// Writes `contents` to `path` by rename: readers never see half a file.
pub fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
