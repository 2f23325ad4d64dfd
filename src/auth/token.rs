//! Dataplane tokens: issuing, verifying and inspecting.
//!
//! A token is a JWT signed with Ed25519 (`alg: EdDSA`) whose header `kid`
//! names the signing key. Only `EdDSA` is accepted: `none`, HMAC (key
//! confusion with the public key as secret), RSA and ECDSA are refused before
//! any key is looked up.
//!
//! # Time
//!
//! [`KeyRing::verify`] never reads the system clock: it takes `now`.
//! jsonwebtoken's own `exp`/`nbf` checks (which use the system clock) are
//! disabled and done here instead:
//!
//! * `exp`: no leeway. The token is expired when `now >= exp` (RFC 7519: the
//!   current time must be before `exp`).
//! * `iat`: may be at most [`ISSUED_AT_LEEWAY_SECS`] in the future (clock skew
//!   between hdsd hosts that share keys), else [`Rejection::NotYetValid`].
//!
//! # Order of checks
//!
//! shape and header -> `alg` -> `kid` present (a token without `kid` is
//! [`Rejection::Malformed`]: hdsd always sets one) -> key known -> signature
//! -> claims shape -> revocation -> `exp` -> `iat` -> `nbf`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use rand::RngCore;

use super::claims::Claims;
use super::keys::{hex, KeyRing};
use super::rejection::{rfc3339, Rejection};
use super::revocation::Revocations;
use crate::dataplane::DataplaneId;

/// How far in the future a token's `iat` may be before it is
/// [`Rejection::NotYetValid`]. `exp` has no leeway.
pub const ISSUED_AT_LEEWAY_SECS: i64 = 60;

/// The only accepted JWT `alg`.
pub const ALLOWED_ALG: &str = "EdDSA";

/// Why a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The ring has no local private key.
    #[error("no signing key in {keys_dir}: run `hdsd token keygen` (or start the server once) to create one")]
    NoSigningKey {
        /// Where private keys are looked for.
        keys_dir: String,
    },
    /// The requested validity is above the configured maximum.
    #[error("requested validity {} is longer than the maximum of {}; ask for a shorter validity or raise the server's maximum token validity", days_hms(.requested), days_hms(.max))]
    ValidityTooLong {
        /// What was asked for.
        requested: Duration,
        /// The configured maximum.
        max: Duration,
    },
    /// The requested validity is under one second.
    #[error("token validity must be at least 1s")]
    ValidityTooShort,
    /// The mesh or name cannot form a node id.
    #[error("cannot issue a token for mesh {mesh:?} name {name:?}: the mesh must be lowercase letters, digits and '-', and the name must not be empty (the Envoy node id is <mesh>.<name>)")]
    BadIdentity {
        /// The mesh asked for.
        mesh: String,
        /// The name asked for.
        name: String,
    },
    /// The zone (or one of its meshes) breaks the naming rules.
    #[error("cannot issue a zone token: {problem}")]
    BadZone {
        /// The rule it breaks.
        problem: String,
    },
    /// A tag has an empty name.
    #[error("token tags must have non-empty names")]
    EmptyTagName,
    /// `now + validity` is not a representable time.
    #[error("token expiry is out of range")]
    OutOfRange,
    /// The JWT library failed to sign.
    #[error("cannot sign the token: {0}")]
    Sign(String),
}

/// `366d 1h`, `1h 30m`, `45s`: whole seconds, largest units first.
fn days_hms(d: &Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        format!("{}ms", d.as_millis())
    } else {
        text.join(" ")
    }
}

impl KeyRing {
    /// Issues a token for dataplane `mesh.name`, valid from `now` for
    /// `valid_for` (whole seconds), signed with the newest local key.
    ///
    /// Refuses `valid_for` above `max_validity` or under one second.
    pub fn issue(
        &self,
        mesh: &str,
        name: &str,
        valid_for: Duration,
        max_validity: Duration,
        tags: BTreeMap<String, String>,
        now: DateTime<Utc>,
    ) -> Result<String, IssueError> {
        if DataplaneId::try_new(mesh, name).is_err() {
            return Err(IssueError::BadIdentity {
                mesh: mesh.to_string(),
                name: name.to_string(),
            });
        }
        if tags.keys().any(String::is_empty) {
            return Err(IssueError::EmptyTagName);
        }
        self.sign(
            Claims {
                mesh: mesh.to_string(),
                name: name.to_string(),
                tags,
                ..Claims::default()
            },
            valid_for,
            max_validity,
            now,
        )
    }

    /// Issues a zone token for zone `zone`, allowed to announce the
    /// dataplanes of `meshes`, valid from `now` for `valid_for`.
    pub fn issue_zone(
        &self,
        zone: &str,
        meshes: &[String],
        valid_for: Duration,
        max_validity: Duration,
        now: DateTime<Utc>,
    ) -> Result<String, IssueError> {
        if let Err(problem) = crate::names::check_zone(zone) {
            return Err(IssueError::BadZone { problem });
        }
        if let Some(problem) = meshes
            .iter()
            .find_map(|m| crate::names::check_mesh(m).err())
        {
            return Err(IssueError::BadZone { problem });
        }
        self.sign(
            Claims {
                zone: Some(zone.to_string()),
                meshes: meshes.to_vec(),
                ..Claims::default()
            },
            valid_for,
            max_validity,
            now,
        )
    }

    /// Signs `claims` with the newest local key, with `iat`, `exp` and a
    /// fresh `jti`; refuses `valid_for` above `max_validity` or under 1 s.
    fn sign(
        &self,
        mut claims: Claims,
        valid_for: Duration,
        max_validity: Duration,
        now: DateTime<Utc>,
    ) -> Result<String, IssueError> {
        if valid_for > max_validity {
            return Err(IssueError::ValidityTooLong {
                requested: valid_for,
                max: max_validity,
            });
        }
        if valid_for.as_secs() == 0 {
            return Err(IssueError::ValidityTooShort);
        }
        let Some((kid, key)) = self.signer() else {
            return Err(IssueError::NoSigningKey {
                keys_dir: self.keys_dir().display().to_string(),
            });
        };
        claims.iat = now.timestamp();
        claims.exp = i64::try_from(valid_for.as_secs())
            .ok()
            .and_then(|secs| claims.iat.checked_add(secs))
            .filter(|exp| DateTime::from_timestamp(*exp, 0).is_some())
            .ok_or(IssueError::OutOfRange)?;
        let mut jti = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut jti);
        claims.jti = hex(&jti);
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_string());
        jsonwebtoken::encode(&header, &claims, key).map_err(|e| IssueError::Sign(e.to_string()))
    }

    /// Verifies `token` (signature by a trusted key named by its `kid`,
    /// `EdDSA` only, not revoked, not expired at `now`) and returns its
    /// claims. Does not check that the token belongs to the connecting
    /// dataplane: see [`Claims::authorize`].
    pub fn verify(
        &self,
        token: &str,
        revoked: &Revocations,
        now: DateTime<Utc>,
    ) -> Result<Claims, Rejection> {
        let parts = split(token)?;
        let header = parts.header()?;
        if header.alg != ALLOWED_ALG {
            return Err(Rejection::DisallowedAlgorithm { alg: header.alg });
        }
        if header.crit {
            return Err(Rejection::Malformed {
                detail: "token header has a `crit` parameter, which hdsd does not support".into(),
            });
        }
        let Some(kid) = header.kid else {
            return Err(Rejection::Malformed {
                detail: "token header has no kid".into(),
            });
        };
        let Some(key) = self.decoding_key(&kid) else {
            return Err(Rejection::UnknownKey { kid });
        };

        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.leeway = 0;
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let claims = match jsonwebtoken::decode::<Claims>(token, key, &validation) {
            Ok(data) => data.claims,
            Err(e) => {
                return Err(match e.kind() {
                    ErrorKind::InvalidSignature => Rejection::BadSignature { kid },
                    ErrorKind::InvalidAlgorithm => {
                        Rejection::DisallowedAlgorithm { alg: header.alg }
                    }
                    _ => Rejection::Malformed {
                        detail: format!(
                            "token (kid {}) does not decode: {e}",
                            crate::names::shown(&kid)
                        ),
                    },
                })
            }
        };

        if revoked.contains(&claims.jti) {
            return Err(Rejection::Revoked { jti: claims.jti });
        }
        let (Some(expires_at), Some(issued_at)) = (claims.expires_at(), claims.issued_at()) else {
            return Err(Rejection::Malformed {
                detail: format!("iat {} or exp {} is out of range", claims.iat, claims.exp),
            });
        };
        if now.timestamp() >= claims.exp {
            return Err(Rejection::Expired { at: expires_at });
        }
        if claims.iat > now.timestamp().saturating_add(ISSUED_AT_LEEWAY_SECS) {
            return Err(Rejection::NotYetValid { issued_at });
        }
        if let Some(nbf) = claims.nbf {
            if nbf > now.timestamp() {
                let Some(at) = DateTime::from_timestamp(nbf, 0) else {
                    return Err(Rejection::Malformed {
                        detail: format!("nbf {nbf} is out of range"),
                    });
                };
                return Err(Rejection::NotBefore { at });
            }
        }
        Ok(claims)
    }
}

/// The three parts of a compact JWT.
struct Parts<'a> {
    header: &'a str,
    payload: &'a str,
}

/// The header fields that matter, read without trusting them.
struct RawHeader {
    alg: String,
    kid: Option<String>,
    crit: bool,
}

fn split(token: &str) -> Result<Parts<'_>, Rejection> {
    let parts: Vec<&str> = token.split('.').collect();
    match parts[..] {
        [header, payload, _signature] => Ok(Parts { header, payload }),
        _ => Err(Rejection::Malformed {
            detail: format!(
                "expected 3 dot-separated parts (header.payload.signature), got {}",
                parts.len()
            ),
        }),
    }
}

fn decode_json(part: &str, what: &str) -> Result<serde_json::Value, Rejection> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| Rejection::Malformed {
            detail: format!("token {what} is not base64url: {e}"),
        })?;
    serde_json::from_slice(&bytes).map_err(|e| Rejection::Malformed {
        detail: format!("token {what} is not JSON: {e}"),
    })
}

impl Parts<'_> {
    fn header(&self) -> Result<RawHeader, Rejection> {
        let value = decode_json(self.header, "header")?;
        let Some(obj) = value.as_object() else {
            return Err(Rejection::Malformed {
                detail: "token header is not a JSON object".into(),
            });
        };
        let alg = match obj.get("alg") {
            Some(serde_json::Value::String(alg)) => alg.clone(),
            Some(other) => {
                return Err(Rejection::DisallowedAlgorithm {
                    alg: other.to_string(),
                })
            }
            None => {
                return Err(Rejection::Malformed {
                    detail: "token header has no alg".into(),
                })
            }
        };
        let kid = match obj.get("kid") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(kid)) => Some(kid.clone()),
            Some(other) => {
                return Err(Rejection::Malformed {
                    detail: format!(
                        "token header kid is not a string: {}",
                        crate::names::shown(&other.to_string())
                    ),
                })
            }
        };
        Ok(RawHeader {
            alg,
            kid,
            crit: obj.contains_key("crit"),
        })
    }
}

/// What `hdsd token inspect` shows: the token's contents, decoded WITHOUT
/// trusting them, and whether this server would accept it.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The header's `alg`, if the header decodes.
    pub alg: Option<String>,
    /// The header's `kid`, if present.
    pub kid: Option<String>,
    /// The payload as JSON, if it decodes (untrusted).
    pub payload: Option<serde_json::Value>,
    /// The payload as [`Claims`], if it has that shape (untrusted).
    pub claims: Option<Claims>,
    /// The verdict of [`KeyRing::verify`] at the inspection time.
    pub verdict: Result<Claims, Rejection>,
}

impl Inspection {
    /// Whether [`KeyRing::verify`] accepted the token.
    pub fn accepted(&self) -> bool {
        self.verdict.is_ok()
    }
}

/// Decodes `token` for display and says whether this server would accept it
/// (signature, algorithm, key, revocation and time; not the binding to a
/// particular dataplane, which is checked when it connects).
pub fn inspect(
    ring: &KeyRing,
    revoked: &Revocations,
    token: &str,
    now: DateTime<Utc>,
) -> Inspection {
    let token = token.trim();
    let mut inspection = Inspection {
        alg: None,
        kid: None,
        payload: None,
        claims: None,
        verdict: ring.verify(token, revoked, now),
    };
    if let Ok(parts) = split(token) {
        if let Ok(value) = decode_json(parts.header, "header") {
            inspection.alg = value.get("alg").map(|a| match a {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            inspection.kid = value
                .get("kid")
                .and_then(|k| k.as_str())
                .map(str::to_string);
        }
        if let Ok(value) = decode_json(parts.payload, "payload") {
            inspection.claims = serde_json::from_value(value.clone()).ok();
            inspection.payload = Some(value);
        }
    }
    inspection
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "(none)".into());
        let time = |t: i64| {
            DateTime::from_timestamp(t, 0)
                .map(|t| rfc3339(&t))
                .unwrap_or_else(|| format!("{t} (out of range)"))
        };
        writeln!(f, "contents (decoded, not verified):")?;
        writeln!(f, "  alg:     {}", opt(&self.alg))?;
        writeln!(f, "  kid:     {}", opt(&self.kid))?;
        match (&self.claims, &self.payload) {
            (Some(c), _) => {
                writeln!(f, "  mesh:    {}", c.mesh)?;
                writeln!(f, "  name:    {}", c.name)?;
                writeln!(f, "  issued:  {}", time(c.iat))?;
                writeln!(f, "  expires: {}", time(c.exp))?;
                writeln!(f, "  jti:     {}", c.jti)?;
                if !c.tags.is_empty() {
                    let tags: Vec<String> =
                        c.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    writeln!(f, "  tags:    {}", tags.join(", "))?;
                }
            }
            (None, Some(raw)) => {
                writeln!(f, "  claims:  {raw} (not the shape of a dataplane token)")?
            }
            (None, None) => writeln!(f, "  claims:  (undecodable)")?,
        }
        match &self.verdict {
            Ok(c) => write!(
                f,
                "verdict: accepted by this server (as {}, until {})",
                c.identity(),
                time(c.exp)
            ),
            Err(r) => {
                write!(f, "verdict: would be rejected: {r}")?;
                let detail = r.detail();
                if detail != r.to_string() {
                    write!(f, "\n  detail: {detail}")?;
                }
                Ok(())
            }
        }
    }
}
