//! Why a dataplane was refused, reading the token from gRPC metadata, and the
//! identity/tag rules that bind a token to a dataplane.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use tonic::metadata::MetadataMap;

use super::token::Claims;

/// The gRPC metadata key that carries the token.
pub const AUTHORIZATION: &str = "authorization";

/// Why a token was refused.
///
/// `Display` is the short message sent to the client (the Envoy operator
/// sees it); it never contains key material or parser output. The fields and
/// [`Rejection::detail`] are for the server log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No `authorization` metadata.
    #[error("no dataplane token: issue one with `hdsd token issue --mesh M --name N` and put it in the Envoy bootstrap's hds_config grpc_services initial_metadata as key `authorization`")]
    Missing,
    /// More than one `authorization` value.
    #[error("more than one `authorization` metadata value: send exactly one dataplane token")]
    MultipleTokens,
    /// Not a JWT of the expected shape.
    #[error("malformed token")]
    Malformed {
        /// What is wrong with it.
        detail: String,
    },
    /// The header's `alg` is not `EdDSA`.
    #[error("token algorithm not allowed")]
    DisallowedAlgorithm {
        /// The `alg` the token named.
        alg: String,
    },
    /// The header's `kid` names no trusted key.
    #[error("unknown signing key")]
    UnknownKey {
        /// The `kid` the token named.
        kid: String,
    },
    /// The signature does not verify with the key its `kid` names.
    #[error("invalid token signature")]
    BadSignature {
        /// The `kid` the token named.
        kid: String,
    },
    /// `exp` is not after now.
    #[error("token expired at {}; issue a new one with `hdsd token issue`", rfc3339(.at))]
    Expired {
        /// The token's `exp`.
        at: DateTime<Utc>,
    },
    /// `iat` is in the future (beyond the allowed clock skew).
    #[error(
        "token not yet valid: it was issued in the future; check the clocks of the hdsd hosts"
    )]
    NotYetValid {
        /// The token's `iat`.
        issued_at: DateTime<Utc>,
    },
    /// The token's `jti` is on the revocation list.
    #[error("token revoked")]
    Revoked {
        /// The token's `jti`.
        jti: String,
    },
    /// The token's mesh/name is not the connecting node's.
    #[error("token for {token} cannot be used by {node}")]
    WrongIdentity {
        /// `mesh.name` from the token.
        token: String,
        /// `mesh.name` of the node.
        node: String,
    },
    /// A tag the token is bound to is on none of the dataplane's inbounds.
    #[error("token is bound to tag {tag}={value}, which no inbound of this dataplane has")]
    TagsMismatch {
        /// The tag name.
        tag: String,
        /// The value the token requires.
        value: String,
    },
}

impl Rejection {
    /// A stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Missing => "missing",
            Rejection::MultipleTokens => "multiple_tokens",
            Rejection::Malformed { .. } => "malformed",
            Rejection::DisallowedAlgorithm { .. } => "disallowed_algorithm",
            Rejection::UnknownKey { .. } => "unknown_key",
            Rejection::BadSignature { .. } => "bad_signature",
            Rejection::Expired { .. } => "expired",
            Rejection::NotYetValid { .. } => "not_yet_valid",
            Rejection::Revoked { .. } => "revoked",
            Rejection::WrongIdentity { .. } => "wrong_identity",
            Rejection::TagsMismatch { .. } => "tags_mismatch",
        }
    }

    /// The gRPC status for the client: `PERMISSION_DENIED` for a valid token
    /// used by the wrong dataplane, `UNAUTHENTICATED` otherwise. The message
    /// is the short `Display` text.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            Rejection::WrongIdentity { .. } | Rejection::TagsMismatch { .. } => {
                tonic::Status::permission_denied(self.to_string())
            }
            _ => tonic::Status::unauthenticated(self.to_string()),
        }
    }

    /// The longer text for the server log: the short message plus what only
    /// the server should see (header alg, kid, parser error, jti).
    pub fn detail(&self) -> String {
        match self {
            Rejection::Missing | Rejection::MultipleTokens => self.to_string(),
            Rejection::Malformed { detail } => format!("malformed token: {detail}"),
            Rejection::DisallowedAlgorithm { alg } => {
                format!("token header alg {alg:?} is not allowed (only EdDSA is)")
            }
            Rejection::UnknownKey { kid } => {
                format!("token header kid {kid:?} matches no trusted public key")
            }
            Rejection::BadSignature { kid } => {
                format!("token signature does not verify with the public key of kid {kid:?}")
            }
            Rejection::Expired { .. } => self.to_string(),
            Rejection::NotYetValid { issued_at } => format!(
                "token iat {} is in the future beyond the allowed clock skew",
                rfc3339(issued_at)
            ),
            Rejection::Revoked { jti } => {
                format!("token jti {jti} is on the revocation list")
            }
            Rejection::WrongIdentity { .. } | Rejection::TagsMismatch { .. } => self.to_string(),
        }
    }
}

pub(super) fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Extracts the token from gRPC metadata `authorization`: `Bearer <jwt>`
/// (scheme case-insensitive) or the bare JWT.
///
/// No value (or an empty one) is [`Rejection::Missing`]; more than one value
/// is [`Rejection::MultipleTokens`]; a non-ASCII value or another scheme
/// (e.g. `Basic`) is [`Rejection::Malformed`].
pub fn token_from_metadata(md: &MetadataMap) -> Result<String, Rejection> {
    let mut values = md.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(Rejection::Missing);
    };
    if values.next().is_some() {
        return Err(Rejection::MultipleTokens);
    }
    let value = value.to_str().map_err(|_| Rejection::Malformed {
        detail: "authorization metadata is not printable ASCII".into(),
    })?;
    let value = value.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("bearer") {
        return Err(Rejection::Missing);
    }
    let token = match value.split_once(char::is_whitespace) {
        None => value,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        Some((scheme, _)) => {
            return Err(Rejection::Malformed {
                detail: format!(
                    "authorization scheme {scheme:?} is not supported; use `Bearer <token>`"
                ),
            })
        }
    };
    if token.is_empty() {
        return Err(Rejection::Missing);
    }
    if token.contains(char::is_whitespace) {
        return Err(Rejection::Malformed {
            detail: "authorization value has more than one word after the scheme".into(),
        });
    }
    Ok(token.to_string())
}

/// Binds a verified token to the connecting dataplane.
///
/// The token's mesh and name must equal the node's, else
/// [`Rejection::WrongIdentity`] ("token for default.web-01 cannot be used by
/// default.web-02"). Every tag in the token must be present, with the same
/// value, on at least one of the dataplane's inbounds (`inbound_tags`, one
/// map per inbound), else [`Rejection::TagsMismatch`]. A token without tags
/// binds by identity only.
pub fn authorize(
    claims: &Claims,
    node_mesh: &str,
    node_name: &str,
    inbound_tags: &[&BTreeMap<String, String>],
) -> Result<(), Rejection> {
    check_identity(claims, node_mesh, node_name)?;
    for (tag, value) in &claims.tags {
        if !inbound_tags.iter().any(|tags| tags.get(tag) == Some(value)) {
            return Err(Rejection::TagsMismatch {
                tag: tag.clone(),
                value: value.clone(),
            });
        }
    }
    Ok(())
}

/// The first half of [`authorize`]: the token must name this node. Checked
/// on the first request, before the dataplane (and its tags) is known.
pub fn check_identity(claims: &Claims, node_mesh: &str, node_name: &str) -> Result<(), Rejection> {
    if claims.mesh != node_mesh || claims.name != node_name {
        return Err(Rejection::WrongIdentity {
            token: format!("{}.{}", claims.mesh, claims.name),
            node: format!("{node_mesh}.{node_name}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn md(values: &[&str]) -> MetadataMap {
        let mut md = MetadataMap::new();
        for v in values {
            md.append(AUTHORIZATION, MetadataValue::try_from(*v).unwrap());
        }
        md
    }

    #[test]
    fn metadata_bearer_bare_and_lowercase() {
        assert_eq!(
            token_from_metadata(&md(&["Bearer a.b.c"])).unwrap(),
            "a.b.c"
        );
        assert_eq!(
            token_from_metadata(&md(&["bearer a.b.c"])).unwrap(),
            "a.b.c"
        );
        assert_eq!(
            token_from_metadata(&md(&["BEARER   a.b.c "])).unwrap(),
            "a.b.c"
        );
        assert_eq!(token_from_metadata(&md(&["a.b.c"])).unwrap(), "a.b.c");
    }

    #[test]
    fn metadata_missing_multiple_and_other_schemes() {
        assert_eq!(token_from_metadata(&md(&[])), Err(Rejection::Missing));
        assert_eq!(token_from_metadata(&md(&[""])), Err(Rejection::Missing));
        assert_eq!(
            token_from_metadata(&md(&["Bearer "])),
            Err(Rejection::Missing)
        );
        assert_eq!(
            token_from_metadata(&md(&["Bearer a.b.c", "Bearer d.e.f"])),
            Err(Rejection::MultipleTokens)
        );
        let err = token_from_metadata(&md(&["Basic dXNlcjpwYXNz"])).unwrap_err();
        assert_eq!(err.reason(), "malformed");
        assert!(err.detail().contains("Basic"), "{}", err.detail());
    }

    fn claims(tags: &[(&str, &str)]) -> Claims {
        Claims {
            mesh: "default".into(),
            name: "web-01".into(),
            iat: 0,
            exp: 1,
            jti: "j".into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn authorize_identity() {
        assert_eq!(authorize(&claims(&[]), "default", "web-01", &[]), Ok(()));
        let err = authorize(&claims(&[]), "default", "web-02", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token for default.web-01 cannot be used by default.web-02"
        );
        assert_eq!(err.reason(), "wrong_identity");
        assert_eq!(err.to_status().code(), tonic::Code::PermissionDenied);
        let err = authorize(&claims(&[]), "other", "web-01", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token for default.web-01 cannot be used by other.web-01"
        );
    }

    #[test]
    fn authorize_tags_need_one_matching_inbound_each() {
        let web = tags(&[("kuma.io/service", "web"), ("version", "v1")]);
        let admin = tags(&[("kuma.io/service", "admin")]);
        let inbounds = [&web, &admin];
        let ok = claims(&[("kuma.io/service", "web")]);
        assert_eq!(authorize(&ok, "default", "web-01", &inbounds), Ok(()));
        // Tags may be satisfied by different inbounds.
        let ok2 = claims(&[("kuma.io/service", "admin"), ("version", "v1")]);
        assert_eq!(authorize(&ok2, "default", "web-01", &inbounds), Ok(()));

        let wrong_value = claims(&[("kuma.io/service", "db")]);
        let err = authorize(&wrong_value, "default", "web-01", &inbounds).unwrap_err();
        assert_eq!(
            err,
            Rejection::TagsMismatch {
                tag: "kuma.io/service".into(),
                value: "db".into()
            }
        );
        assert_eq!(err.to_status().code(), tonic::Code::PermissionDenied);
        assert_eq!(err.reason(), "tags_mismatch");

        let absent = claims(&[("zone", "eu")]);
        assert!(authorize(&absent, "default", "web-01", &inbounds).is_err());
        // No inbounds at all: any token tag fails.
        assert!(authorize(&ok, "default", "web-01", &[]).is_err());
    }

    #[test]
    fn statuses_and_messages() {
        let expired = Rejection::Expired {
            at: "2026-01-01T00:00:00Z".parse().unwrap(),
        };
        assert_eq!(
            expired.to_string(),
            "token expired at 2026-01-01T00:00:00Z; issue a new one with `hdsd token issue`"
        );
        let status = expired.to_status();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(status.message(), expired.to_string());

        let unknown = Rejection::UnknownKey {
            kid: "secret-kid".into(),
        };
        assert_eq!(unknown.to_string(), "unknown signing key");
        assert!(!unknown.to_status().message().contains("secret-kid"));
        assert!(unknown.detail().contains("secret-kid"));

        let malformed = Rejection::Malformed {
            detail: "bad base64".into(),
        };
        assert_eq!(malformed.to_string(), "malformed token");
        assert!(malformed.detail().contains("bad base64"));
        assert!(Rejection::Missing.to_string().contains("initial_metadata"));
    }
}
