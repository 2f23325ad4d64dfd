//! Dataplane authentication at the gRPC edge: the token from the request's
//! metadata, its verification by the [`Gate`], and a [`Rejection`] as the
//! gRPC status the client sees.

use chrono::{DateTime, Utc};
use tonic::metadata::MetadataMap;

use crate::auth::{bearer, BearerError, Claims, Gate, Rejection, RejectionKind};
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

/// Extracts the token from gRPC metadata `authorization` by the rule of
/// [`bearer::parse`]: `Bearer <token>`, the scheme in any case.
///
/// No value (or one without a token) is [`Rejection::Missing`]; more than one
/// value is [`Rejection::MultipleTokens`]; a non-ASCII value, another scheme
/// (e.g. `Basic`), a bare token or extra spaces are [`Rejection::Malformed`].
pub fn token_from_metadata(md: &MetadataMap) -> Result<String, Rejection> {
    let mut values = md.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(Rejection::Missing);
    };
    if values.next().is_some() {
        return Err(Rejection::MultipleTokens);
    }
    let token = value
        .to_str()
        .map_err(|_| BearerError::NotAscii)
        .and_then(bearer::parse);
    match token {
        Ok(token) => Ok(token.to_string()),
        Err(BearerError::Missing) => Err(Rejection::Missing),
        Err(e) => Err(Rejection::Malformed {
            detail: e.to_string(),
        }),
    }
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
    fn metadata_bearer_in_any_case() {
        for value in ["Bearer a.b.c", "bearer a.b.c", "BEARER a.b.c"] {
            assert_eq!(token_from_metadata(&md(&[value])).unwrap(), "a.b.c");
        }
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
        // The one rule of `auth::bearer`: no bare token, exactly one space.
        for value in ["a.b.c", "Bearer  a.b.c"] {
            let err = token_from_metadata(&md(&[value])).unwrap_err();
            assert_eq!(err.reason(), "malformed", "{value:?}");
            assert!(err.detail().contains("Bearer <token>"), "{}", err.detail());
        }
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
