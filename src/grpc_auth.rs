//! Dataplane authentication at the gRPC edge: the token from the request's
//! metadata, its verification by the [`Gate`], and a [`Rejection`] as the
//! gRPC status the client sees.

use chrono::{DateTime, Utc};
use tonic::metadata::MetadataMap;

use crate::auth::{Claims, Gate, Rejection, RejectionKind};
use crate::config::AuthMode;

/// The gRPC metadata key that carries the token.
pub const AUTHORIZATION: &str = "authorization";

/// Checks the token of a request that is opening a stream (or a fetch).
/// `Ok(None)` when auth is off.
pub fn authenticate(
    gate: &Gate,
    metadata: &MetadataMap,
    now: DateTime<Utc>,
) -> Result<Option<Claims>, Rejection> {
    if gate.mode() == AuthMode::None {
        return Ok(None);
    }
    let token = token_from_metadata(metadata)?;
    gate.verify(&token, now).map(Some)
}

/// The gRPC status for the client: `PERMISSION_DENIED` for a valid token
/// used by the wrong dataplane, `UNAUTHENTICATED` otherwise. The message is
/// the short `Display` text, never the log detail.
pub fn status(rejection: &Rejection) -> tonic::Status {
    match rejection.kind() {
        RejectionKind::PermissionDenied => tonic::Status::permission_denied(rejection.to_string()),
        RejectionKind::Unauthenticated => tonic::Status::unauthenticated(rejection.to_string()),
    }
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

    #[test]
    fn statuses_carry_the_short_message_only() {
        let expired = Rejection::Expired {
            at: "2026-01-01T00:00:00Z".parse().unwrap(),
        };
        let s = status(&expired);
        assert_eq!(s.code(), tonic::Code::Unauthenticated);
        assert_eq!(s.message(), expired.to_string());

        let unknown = Rejection::UnknownKey {
            kid: "secret-kid".into(),
        };
        assert!(!status(&unknown).message().contains("secret-kid"));

        let wrong = Rejection::TagsMismatch {
            tag: "kuma.io/service".into(),
            value: "db".into(),
        };
        assert_eq!(status(&wrong).code(), tonic::Code::PermissionDenied);
    }
}
