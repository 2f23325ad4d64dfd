//! `Authorization: Bearer <token>`: the one rule every listener applies
//! (gRPC metadata `authorization` on the HDS listener, the HTTP header on the
//! API).
//!
//! The rule (RFC 7235 and RFC 6750): the scheme `Bearer` in any case, exactly
//! one space, then a non-empty token without whitespace. Whitespace around the
//! whole value is ignored (it is not part of an HTTP field value). A bare
//! token without the scheme is refused.

/// Why an `authorization` value holds no usable bearer token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BearerError {
    /// The value is empty, or the scheme has no token after it.
    #[error("no token: send `Bearer <token>`")]
    Missing,
    /// Another scheme, such as `Basic`.
    #[error("authorization scheme {} is not supported; send `Bearer <token>`", crate::names::shown(.0))]
    Scheme(String),
    /// A single word: a token without its scheme.
    #[error("the authorization value has no scheme; send `Bearer <token>` (the word Bearer, one space, the token)")]
    NoScheme,
    /// The value is not printable ASCII (checked by the edge that read it).
    #[error("the authorization value is not printable ASCII; send `Bearer <token>`")]
    NotAscii,
    /// More than one space after the scheme, or whitespace inside the token.
    #[error("malformed authorization value: send `Bearer <token>` with exactly one space after Bearer and no spaces in the token")]
    Spacing,
}

/// The token of an `authorization` value.
pub fn parse(value: &str) -> Result<&str, BearerError> {
    let value = value.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("bearer") {
        return Err(BearerError::Missing);
    }
    let Some((scheme, token)) = value.split_once(' ') else {
        return Err(if value.contains(char::is_whitespace) {
            BearerError::Spacing
        } else {
            BearerError::NoScheme
        });
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(if scheme.contains(char::is_whitespace) {
            BearerError::Spacing
        } else {
            BearerError::Scheme(scheme.to_string())
        });
    }
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(BearerError::Spacing);
    }
    Ok(token)
}

/// Whether `presented` is one of `api.tokens`, compared in constant time per
/// token so that timing does not reveal a token's prefix. Used by REST and gRPC.
pub fn is_api_token(tokens: &[String], presented: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    tokens
        .iter()
        .any(|known| bool::from(known.as_bytes().ct_eq(presented.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_in_any_case_one_space_and_a_token() {
        for value in [
            "Bearer a.b.c",
            "bearer a.b.c",
            "BEARER a.b.c",
            " Bearer a.b.c \t",
        ] {
            assert_eq!(parse(value), Ok("a.b.c"), "{value:?}");
        }
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        for value in ["", "  ", "Bearer", "bearer ", "BEARER"] {
            assert_eq!(parse(value), Err(BearerError::Missing), "{value:?}");
        }
        assert_eq!(parse("a.b.c"), Err(BearerError::NoScheme));
        assert_eq!(
            parse("Basic dXNlcjpwYXNz"),
            Err(BearerError::Scheme("Basic".into()))
        );
        for value in [
            "Bearer  a.b.c",
            "Bearer\ta.b.c",
            "Bearer a b",
            "Bearer a\tb",
        ] {
            assert_eq!(parse(value), Err(BearerError::Spacing), "{value:?}");
        }
        assert!(BearerError::Scheme("Basic".into())
            .to_string()
            .contains("\"Basic\""));
    }
}
