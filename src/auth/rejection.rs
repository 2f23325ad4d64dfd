//! Why a dataplane was refused: the short message for the client, the metric
//! label, the log detail, and whether the token itself or its use was refused.
//! How a refusal travels (a gRPC status, an HTTP response) is the edges' business.

use chrono::{DateTime, SecondsFormat, Utc};

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
    /// `nbf` (not before) is later than now: the token is valid only from
    /// then on (RFC 7519, 4.1.5).
    #[error("token not valid before {}; use it from then on, or issue one valid now with `hdsd token issue`", rfc3339(.at))]
    NotBefore {
        /// The token's `nbf`.
        at: DateTime<Utc>,
    },
    /// `exp - iat` is longer than `auth.max_token_validity` (a token of
    /// another issuer, or one issued before the maximum was lowered).
    #[error("token validity is longer than this server's maximum (auth.max_token_validity); issue a shorter-lived token")]
    ValidityTooLong {
        /// `exp - iat`, in seconds.
        validity_secs: i64,
        /// `auth.max_token_validity`, in seconds.
        max_secs: u64,
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

/// The two classes of [`Rejection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// No usable token: missing, malformed, unknown key, bad signature,
    /// expired, not yet valid or revoked.
    Unauthenticated,
    /// A valid token that does not belong to the connecting dataplane.
    PermissionDenied,
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
            Rejection::NotYetValid { .. } | Rejection::NotBefore { .. } => "not_yet_valid",
            Rejection::Revoked { .. } => "revoked",
            Rejection::ValidityTooLong { .. } => "validity_too_long",
            Rejection::WrongIdentity { .. } => "wrong_identity",
            Rejection::TagsMismatch { .. } => "tags_mismatch",
        }
    }

    /// Whether the token was refused, or a valid token used by the wrong
    /// dataplane (the gRPC edge maps these to `UNAUTHENTICATED` and
    /// `PERMISSION_DENIED`).
    pub fn kind(&self) -> RejectionKind {
        match self {
            Rejection::WrongIdentity { .. } | Rejection::TagsMismatch { .. } => {
                RejectionKind::PermissionDenied
            }
            _ => RejectionKind::Unauthenticated,
        }
    }

    /// The longer text for the server log: the short message plus what only
    /// the server should see (header alg, kid, parser error, jti). What the
    /// client wrote (alg, kid) is escaped and cut ([`crate::names::shown`]):
    /// a token's header is anyone's text until its signature verifies.
    pub fn detail(&self) -> String {
        match self {
            Rejection::Missing | Rejection::MultipleTokens => self.to_string(),
            Rejection::Malformed { detail } => format!("malformed token: {detail}"),
            Rejection::DisallowedAlgorithm { alg } => {
                format!(
                    "token header alg {} is not allowed (only EdDSA is)",
                    crate::names::shown(alg)
                )
            }
            Rejection::UnknownKey { kid } => {
                format!(
                    "token header kid {} matches no trusted public key",
                    crate::names::shown(kid)
                )
            }
            Rejection::BadSignature { kid } => {
                format!(
                    "token signature does not verify with the public key of kid {}",
                    crate::names::shown(kid)
                )
            }
            Rejection::Expired { .. } | Rejection::NotBefore { .. } => self.to_string(),
            Rejection::NotYetValid { issued_at } => format!(
                "token iat {} is in the future beyond the allowed clock skew",
                rfc3339(issued_at)
            ),
            Rejection::Revoked { jti } => {
                format!("token jti {jti} is on the revocation list")
            }
            Rejection::ValidityTooLong {
                validity_secs,
                max_secs,
            } => format!(
                "token is valid for {validity_secs}s (exp - iat), longer than auth.max_token_validity ({max_secs}s)"
            ),
            Rejection::WrongIdentity { .. } | Rejection::TagsMismatch { .. } => self.to_string(),
        }
    }
}

pub(super) fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_messages() {
        let expired = Rejection::Expired {
            at: "2026-01-01T00:00:00Z".parse().unwrap(),
        };
        assert_eq!(
            expired.to_string(),
            "token expired at 2026-01-01T00:00:00Z; issue a new one with `hdsd token issue`"
        );
        assert_eq!(expired.kind(), RejectionKind::Unauthenticated);
        let wrong = Rejection::WrongIdentity {
            token: "default.a".into(),
            node: "default.b".into(),
        };
        assert_eq!(wrong.kind(), RejectionKind::PermissionDenied);

        let unknown = Rejection::UnknownKey {
            kid: "secret-kid".into(),
        };
        assert_eq!(unknown.to_string(), "unknown signing key");
        assert!(unknown.detail().contains("secret-kid"));

        let malformed = Rejection::Malformed {
            detail: "bad base64".into(),
        };
        assert_eq!(malformed.to_string(), "malformed token");
        assert!(malformed.detail().contains("bad base64"));
        assert!(Rejection::Missing.to_string().contains("initial_metadata"));
    }
}
