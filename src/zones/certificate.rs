//! A zone known by its client certificate: the global's zone listener with
//! `global.tls.client_ca` accepts a certificate signed by that CA whose one
//! URI subject alternative name is `hdsd://zone/NAME`. The TLS handshake has
//! verified the chain by then; here, the name is read from the certificate
//! (never from what the zone sends) and checked, and the meshes the zone may
//! sync come from the global's `global.certificate_meshes`, since a
//! certificate cannot say which meshes a zone owns.

use std::collections::BTreeMap;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::clock::Timestamp;

/// The URI a zone's certificate carries before its name.
pub const URI_PREFIX: &str = "hdsd://zone/";

/// The key of `global.certificate_meshes` that applies to every zone not
/// listed by name.
pub use crate::config::ANY_CERTIFICATE_ZONE as ANY_ZONE;

/// What a verified client certificate says of the zone that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateZone {
    /// The zone's name, from the one `hdsd://zone/NAME` URI.
    pub zone: String,
    /// Valid from: a zone deleted after this time has its certificates
    /// refused, as its tokens issued until the deletion are.
    pub not_before: Timestamp,
    /// Valid until: the stream ends then.
    pub not_after: Timestamp,
}

/// Why a client certificate names no zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateProblem {
    /// The DER does not parse as an X.509 certificate.
    #[error("the client certificate cannot be read ({0})")]
    Unreadable(String),
    /// No URI subject alternative name.
    #[error("the client certificate has no URI subject alternative name; a zone's certificate carries exactly one, {URI_PREFIX}NAME (e.g. `openssl req ... -addext \"subjectAltName=URI:{URI_PREFIX}eu-1\"`), or the zone dials with a zone token")]
    NoUri,
    /// Several URI subject alternative names: which zone is meant?
    #[error("the client certificate has {} URI subject alternative names ({}); a zone's certificate carries exactly one, {URI_PREFIX}NAME", .0.len(), some_uris(.0))]
    SeveralUris(Vec<String>),
    /// A URI that does not name a zone.
    #[error("the client certificate's URI {} does not name a zone: it must be {URI_PREFIX}NAME", crate::names::shown(.0))]
    NotAZoneUri(String),
    /// A zone name that breaks the naming rule.
    #[error("the client certificate names zone {}, which breaks the zone naming rule ({problem}); issue a certificate for a valid name", crate::names::shown(.zone))]
    BadName {
        /// The name as written.
        zone: String,
        /// The rule it breaks.
        problem: String,
    },
}

/// The most URIs of a certificate a refusal quotes.
pub const SHOWN_URIS: usize = 3;

/// The first [`SHOWN_URIS`] URIs, each escaped and cut, and how many more
/// there are: a certificate with thousands of URIs makes a short line (and
/// a short grpc-message).
fn some_uris(uris: &[String]) -> String {
    let mut text = (uris.iter().take(SHOWN_URIS))
        .map(|u| crate::names::shown(u))
        .collect::<Vec<_>>()
        .join(", ");
    if uris.len() > SHOWN_URIS {
        text.push_str(&format!(" and {} more", uris.len() - SHOWN_URIS));
    }
    text
}

/// The zone a client certificate (DER, already verified) names.
pub fn zone_of(der: &[u8]) -> Result<CertificateZone, CertificateProblem> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| CertificateProblem::Unreadable(e.to_string()))?;
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name {
                uris.push(uri.to_string());
            }
        }
    }
    let uri = match uris.len() {
        0 => return Err(CertificateProblem::NoUri),
        1 => uris.remove(0),
        _ => return Err(CertificateProblem::SeveralUris(uris)),
    };
    let Some(zone) = uri.strip_prefix(URI_PREFIX) else {
        return Err(CertificateProblem::NotAZoneUri(uri));
    };
    crate::names::check_zone(zone).map_err(|problem| CertificateProblem::BadName {
        zone: zone.to_string(),
        problem: problem.to_string(),
    })?;
    let time = |t: x509_parser::time::ASN1Time| {
        Timestamp::from_timestamp(t.timestamp(), 0).unwrap_or_default()
    };
    Ok(CertificateZone {
        zone: zone.to_string(),
        not_before: time(cert.validity().not_before),
        not_after: time(cert.validity().not_after),
    })
}

/// The meshes a zone known by its certificate may sync: its own entry in
/// `global.certificate_meshes`, else the [`ANY_ZONE`] entry; `None` when
/// neither is there.
pub fn meshes_for<'a>(
    certificate_meshes: &'a BTreeMap<String, Vec<String>>,
    zone: &str,
) -> Option<&'a [String]> {
    certificate_meshes
        .get(zone)
        .or_else(|| certificate_meshes.get(ANY_ZONE))
        .map(Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["zone.test".to_string()]).unwrap();
        for uri in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(*uri).unwrap(),
            ));
        }
        params.not_before = rcgen::date_time_ymd(2026, 1, 2);
        params.not_after = rcgen::date_time_ymd(2027, 3, 4);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_one_zone_uri_names_the_zone_with_the_validity() {
        let z = zone_of(&cert(&["hdsd://zone/eu-1"])).unwrap();
        assert_eq!(z.zone, "eu-1");
        assert_eq!(z.not_before.to_rfc3339(), "2026-01-02T00:00:00+00:00");
        assert_eq!(z.not_after.to_rfc3339(), "2027-03-04T00:00:00+00:00");
    }

    #[test]
    fn every_other_certificate_is_refused_with_what_to_fix() {
        let text = |uris: &[&str]| zone_of(&cert(uris)).unwrap_err().to_string();
        assert!(
            text(&[]).contains("no URI subject alternative name"),
            "{}",
            text(&[])
        );
        let several = text(&["hdsd://zone/eu-1", "hdsd://zone/us-1"]);
        assert!(
            several.contains(
                r#"2 URI subject alternative names ("hdsd://zone/eu-1", "hdsd://zone/us-1")"#
            ),
            "{several}"
        );
        // Many long URIs: a few shown, each cut, and how many more.
        let long: Vec<String> = (0..400)
            .map(|i| format!("hdsd://zone/{i}-{}", "x".repeat(150)))
            .collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        let many = text(&long);
        assert!(many.len() < 1024, "{} bytes: {many}", many.len());
        assert!(
            many.contains("400 URI subject alternative names") && many.contains("and 397 more"),
            "{many}"
        );
        let spiffe = text(&["spiffe://example.org/ns/x"]);
        assert!(spiffe.contains("does not name a zone"), "{spiffe}");
        let bad = text(&["hdsd://zone/EU_1"]);
        assert!(bad.contains("breaks the zone naming rule"), "{bad}");
        assert!(matches!(
            zone_of(b"not a certificate"),
            Err(CertificateProblem::Unreadable(_))
        ));
    }

    #[test]
    fn meshes_come_from_the_zone_entry_or_the_default_one() {
        let mut map = BTreeMap::new();
        assert_eq!(meshes_for(&map, "eu-1"), None);
        map.insert("*".to_string(), vec!["default".to_string()]);
        map.insert("eu-1".to_string(), vec!["payments".to_string()]);
        assert_eq!(
            meshes_for(&map, "eu-1"),
            Some(&["payments".to_string()][..])
        );
        assert_eq!(meshes_for(&map, "us-1"), Some(&["default".to_string()][..]));
    }
}
