//! End-to-end tests of keys, issuing and verification, with the attacks the
//! verifier must refuse.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

use super::keys::generate_with_kid;
use super::*;

const HOUR: Duration = Duration::from_secs(3600);
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn t0() -> DateTime<Utc> {
    t("2026-01-01T00:00:00Z")
}

fn none() -> Revocations {
    Revocations::default()
}

/// A state dir with one key generated at `t0`, and its loaded ring.
fn setup() -> (tempfile::TempDir, KeyRing, GeneratedKey) {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyRing::generate(dir.path(), t0()).unwrap();
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    (dir, ring, key)
}

fn issue(ring: &KeyRing, valid_for: Duration) -> String {
    ring.issue("default", "web-01", valid_for, YEAR, BTreeMap::new(), t0())
        .unwrap()
}

fn b64(json: &str) -> String {
    URL_SAFE_NO_PAD.encode(json)
}

fn claims_json() -> String {
    let exp = t0().timestamp() + 3600;
    format!(
        r#"{{"mesh":"default","name":"web-01","iat":{},"exp":{exp},"jti":"forged"}}"#,
        t0().timestamp()
    )
}

fn sample_claims() -> Claims {
    serde_json::from_str(&claims_json()).unwrap()
}

#[test]
fn issue_then_verify_round_trip() {
    let (_dir, ring, key) = setup();
    let mut tags = BTreeMap::new();
    tags.insert("kuma.io/service".to_string(), "web".to_string());
    let token = ring
        .issue("default", "web-01", HOUR, YEAR, tags.clone(), t0())
        .unwrap();

    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.alg, Algorithm::EdDSA);
    assert_eq!(header.kid.as_deref(), Some(key.kid.as_str()));
    assert_eq!(header.typ.as_deref(), Some("JWT"));

    let claims = ring.verify(&token, &none(), t0()).unwrap();
    assert_eq!(claims.mesh, "default");
    assert_eq!(claims.name, "web-01");
    assert_eq!(claims.iat, t0().timestamp());
    assert_eq!(claims.exp, t0().timestamp() + 3600);
    assert_eq!(claims.tags, tags);
    assert_eq!(claims.jti.len(), 32);
    assert!(claims.jti.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(claims.identity(), "default.web-01");
}

#[test]
fn jti_is_unique_and_empty_tags_are_not_serialized() {
    let (_dir, ring, _) = setup();
    let a = ring.verify(&issue(&ring, HOUR), &none(), t0()).unwrap();
    let b = ring.verify(&issue(&ring, HOUR), &none(), t0()).unwrap();
    assert_ne!(a.jti, b.jti);
    let json = serde_json::to_string(&a).unwrap();
    assert!(!json.contains("tags"), "{json}");
}

#[test]
fn alg_none_is_disallowed() {
    let (_dir, ring, key) = setup();
    let payload = b64(&claims_json());
    let plain = format!("{}.{payload}.", b64(r#"{"alg":"none","typ":"JWT"}"#));
    let err = ring.verify(&plain, &none(), t0()).unwrap_err();
    assert_eq!(err, Rejection::DisallowedAlgorithm { alg: "none".into() });
    assert_eq!(err.to_string(), "token algorithm not allowed");
    assert_eq!(err.reason(), "disallowed_algorithm");
    assert_eq!(err.kind(), RejectionKind::Unauthenticated);

    // Same with a known kid, and with other spellings of "none".
    for alg in ["none", "None", "NONE"] {
        let header = format!(r#"{{"alg":"{alg}","typ":"JWT","kid":"{}"}}"#, key.kid);
        let token = format!("{}.{payload}.", b64(&header));
        assert!(matches!(
            ring.verify(&token, &none(), t0()),
            Err(Rejection::DisallowedAlgorithm { .. })
        ));
    }
}

#[test]
fn hmac_with_public_key_as_secret_is_disallowed() {
    let (_dir, ring, key) = setup();
    let pem = fs::read(&key.public_path).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(key.kid.clone());
    // The PEM text and the raw 32 key bytes, the two usual confusions.
    let raw = {
        use ed25519_dalek::pkcs8::DecodePublicKey;
        let vk =
            ed25519_dalek::VerifyingKey::from_public_key_pem(std::str::from_utf8(&pem).unwrap())
                .unwrap();
        vk.to_bytes().to_vec()
    };
    for secret in [pem, raw] {
        let token = jsonwebtoken::encode(
            &header,
            &sample_claims(),
            &EncodingKey::from_secret(&secret),
        )
        .unwrap();
        let err = ring.verify(&token, &none(), t0()).unwrap_err();
        assert_eq!(
            err,
            Rejection::DisallowedAlgorithm {
                alg: "HS256".into()
            }
        );
        assert!(err.detail().contains("HS256"));
    }
}

#[test]
fn other_ed25519_key_with_known_kid_is_bad_signature() {
    let (_dir, ring, key) = setup();
    let other = tempfile::tempdir().unwrap();
    generate_with_kid(other.path(), &key.kid).unwrap();
    let forger = KeyRing::load(other.path(), &[]).unwrap();
    assert_eq!(forger.signing_kid(), Some(key.kid.as_str()));
    let forged = issue(&forger, HOUR);
    let err = ring.verify(&forged, &none(), t0()).unwrap_err();
    assert_eq!(
        err,
        Rejection::BadSignature {
            kid: key.kid.clone()
        }
    );
    assert_eq!(err.to_string(), "invalid token signature");
    assert_eq!(err.reason(), "bad_signature");
}

#[test]
fn tampered_payload_is_bad_signature() {
    let (_dir, ring, _) = setup();
    let token = issue(&ring, HOUR);
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["name"] = "web-02".into();
    let tampered = format!("{}.{}.{}", parts[0], b64(&claims.to_string()), parts[2]);
    assert!(matches!(
        ring.verify(&tampered, &none(), t0()),
        Err(Rejection::BadSignature { .. })
    ));
}

#[test]
fn unknown_and_missing_kid() {
    let (_dir, ring, _) = setup();
    let other = tempfile::tempdir().unwrap();
    let stranger_key = KeyRing::generate(other.path(), t0()).unwrap();
    let stranger = KeyRing::load(other.path(), &[]).unwrap();
    let err = ring
        .verify(&issue(&stranger, HOUR), &none(), t0())
        .unwrap_err();
    assert_eq!(
        err,
        Rejection::UnknownKey {
            kid: stranger_key.kid.clone()
        }
    );
    assert_eq!(err.to_string(), "unknown signing key");
    assert_eq!(err.reason(), "unknown_key");

    // A correctly signed EdDSA token without kid: Malformed (hdsd always sets one).
    let pem = fs::read(&stranger_key.private_path).unwrap();
    let no_kid = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &sample_claims(),
        &EncodingKey::from_ed_pem(&pem).unwrap(),
    )
    .unwrap();
    let err = ring.verify(&no_kid, &none(), t0()).unwrap_err();
    assert!(matches!(err, Rejection::Malformed { .. }), "{err:?}");
    assert!(err.detail().contains("no kid"), "{}", err.detail());
}

#[test]
fn garbage_is_malformed() {
    let (_dir, ring, key) = setup();
    let valid = issue(&ring, HOUR);
    let sig = valid.rsplit('.').next().unwrap();
    let header = b64(&format!(r#"{{"alg":"EdDSA","kid":"{}"}}"#, key.kid));
    let cases = [
        "".to_string(),
        "garbage".to_string(),
        "a.b".to_string(),
        "a.b.c".to_string(),
        "a.b.c.d".to_string(),
        "...".to_string(),
        format!("{}.x.y", b64("not json")),
        format!("{}.x.y", b64("[1,2]")),
        format!("{}.x.y", b64(r#"{"typ":"JWT"}"#)),
        // Right header, payload not base64 / not claims.
        format!("{header}.!!!.{sig}"),
        format!("{}.{sig}", &valid[..valid.rfind('.').unwrap()]).replace('.', ".."),
    ];
    for token in &cases {
        let err = ring.verify(token, &none(), t0()).unwrap_err();
        assert!(
            matches!(
                err,
                Rejection::Malformed { .. } | Rejection::BadSignature { .. }
            ),
            "{token:?}: {err:?}"
        );
        assert_eq!(err.kind(), RejectionKind::Unauthenticated);
    }
    for token in &cases[..9] {
        let err = ring.verify(token, &none(), t0()).unwrap_err();
        assert_eq!(err.reason(), "malformed", "{token:?}: {err:?}");
        assert_eq!(err.to_string(), "malformed token");
    }
}

#[test]
fn signed_token_with_wrong_claims_shape_is_malformed() {
    let (_dir, ring, key) = setup();
    let pem = fs::read(&key.private_path).unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(key.kid.clone());
    let claims = serde_json::json!({"mesh": "default", "exp": t0().timestamp() + 60});
    let token =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_pem(&pem).unwrap()).unwrap();
    let err = ring.verify(&token, &none(), t0()).unwrap_err();
    assert_eq!(err.reason(), "malformed", "{err:?}");
}

/// A token valid only from tomorrow (another issuer's `nbf`) is refused
/// today with the time it becomes valid, and accepted from then on.
#[test]
fn a_token_is_refused_before_its_nbf() {
    let (_dir, ring, key) = setup();
    let pem = fs::read(&key.private_path).unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(key.kid.clone());
    let tomorrow = t0() + chrono::Duration::days(1);
    let claims = serde_json::json!({
        "mesh": "default", "name": "web-01", "jti": "nbf-1",
        "iat": t0().timestamp(), "exp": tomorrow.timestamp() + 3600,
        "nbf": tomorrow.timestamp(),
    });
    let token =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_pem(&pem).unwrap()).unwrap();
    let err = ring.verify(&token, &none(), t0()).unwrap_err();
    assert_eq!(err, Rejection::NotBefore { at: tomorrow });
    assert_eq!(err.reason(), "not_yet_valid");
    assert_eq!(
        err.to_string(),
        "token not valid before 2026-01-02T00:00:00Z; use it from then on, or issue one valid now with `hdsd token issue`"
    );
    let err = ring
        .verify(&token, &none(), tomorrow - chrono::Duration::seconds(1))
        .unwrap_err();
    assert_eq!(err.reason(), "not_yet_valid");
    let claims = ring.verify(&token, &none(), tomorrow).unwrap();
    assert_eq!(claims.nbf, Some(tomorrow.timestamp()));
    // hdsd's own tokens carry no nbf.
    let own = ring.verify(&issue(&ring, HOUR), &none(), t0()).unwrap();
    assert_eq!(own.nbf, None);
}

#[test]
fn expiry_uses_the_given_time_without_leeway() {
    let (_dir, ring, _) = setup();
    let token = issue(&ring, HOUR);
    let exp = t("2026-01-01T01:00:00Z");
    assert!(ring
        .verify(&token, &none(), exp - chrono::Duration::seconds(1))
        .is_ok());
    // Sub-second before exp is still valid.
    assert!(ring
        .verify(&token, &none(), exp - chrono::Duration::milliseconds(1))
        .is_ok());
    let err = ring.verify(&token, &none(), exp).unwrap_err();
    assert_eq!(err, Rejection::Expired { at: exp });
    assert_eq!(
        err.to_string(),
        "token expired at 2026-01-01T01:00:00Z; issue a new one with `hdsd token issue`"
    );
    assert_eq!(err.reason(), "expired");
    // Far past the system clock's idea of now, too: only `now` counts.
    assert!(ring
        .verify(&token, &none(), t("2100-01-01T00:00:00Z"))
        .is_err());
    assert!(ring.verify(&token, &none(), t0()).is_ok());
}

#[test]
fn issued_in_the_future_is_not_yet_valid() {
    let (_dir, ring, _) = setup();
    let token = issue(&ring, HOUR);
    let skew_ok = t0() - chrono::Duration::seconds(ISSUED_AT_LEEWAY_SECS);
    assert!(ring.verify(&token, &none(), skew_ok).is_ok());
    let err = ring
        .verify(&token, &none(), skew_ok - chrono::Duration::seconds(1))
        .unwrap_err();
    assert_eq!(err, Rejection::NotYetValid { issued_at: t0() });
    assert_eq!(err.reason(), "not_yet_valid");
}

#[test]
fn revoked_jti_is_rejected() {
    let (dir, ring, _) = setup();
    let token = issue(&ring, HOUR);
    let jti = ring.verify(&token, &none(), t0()).unwrap().jti;
    let list = dir.path().join("revoked-tokens");
    assert!(Revocations::revoke(&list, &jti).unwrap());
    let revoked = Revocations::load(&list).unwrap();
    assert_eq!(revoked.len(), 1);
    let err = ring.verify(&token, &revoked, t0()).unwrap_err();
    assert_eq!(err, Rejection::Revoked { jti: jti.clone() });
    assert_eq!(err.to_string(), "token revoked");
    assert_eq!(err.reason(), "revoked");
    assert!(err.detail().contains(&jti));
    // Other tokens are unaffected.
    assert!(ring.verify(&issue(&ring, HOUR), &revoked, t0()).is_ok());
}

#[test]
fn rotation() {
    let (dir, ring1, old) = setup();
    let old_token = issue(&ring1, HOUR);

    let new = KeyRing::generate(dir.path(), t("2026-01-02T00:00:00Z")).unwrap();
    assert!(new.kid > old.kid, "{} vs {}", new.kid, old.kid);
    let ring2 = KeyRing::load(dir.path(), &[]).unwrap();
    assert_eq!(ring2.kids(), vec![old.kid.clone(), new.kid.clone()]);
    assert_eq!(ring2.signing_kid(), Some(new.kid.as_str()));
    let new_token = issue(&ring2, HOUR);
    assert_eq!(
        jsonwebtoken::decode_header(&new_token)
            .unwrap()
            .kid
            .as_deref(),
        Some(new.kid.as_str())
    );
    assert!(ring2.verify(&old_token, &none(), t0()).is_ok());
    assert!(ring2.verify(&new_token, &none(), t0()).is_ok());

    fs::remove_file(&old.private_path).unwrap();
    fs::remove_file(&old.public_path).unwrap();
    let ring3 = KeyRing::load(dir.path(), &[]).unwrap();
    assert_eq!(ring3.kids(), vec![new.kid.clone()]);
    assert_eq!(
        ring3.verify(&old_token, &none(), t0()),
        Err(Rejection::UnknownKey { kid: old.kid })
    );
    assert!(ring3.verify(&new_token, &none(), t0()).is_ok());
}

#[test]
fn public_only_key_verifies_but_does_not_sign() {
    let (dir, ring1, old) = setup();
    let old_token = issue(&ring1, HOUR);
    fs::remove_file(&old.private_path).unwrap();
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    assert_eq!(ring.signing_kid(), None);
    assert!(ring.verify(&old_token, &none(), t0()).is_ok());
    assert!(matches!(
        ring.issue("default", "web-01", HOUR, YEAR, BTreeMap::new(), t0()),
        Err(IssueError::NoSigningKey { .. })
    ));
}

#[test]
fn issue_refuses_validity_above_max_and_bad_input() {
    let (_dir, ring, _) = setup();
    let err = ring
        .issue(
            "default",
            "web-01",
            YEAR + HOUR,
            YEAR,
            BTreeMap::new(),
            t0(),
        )
        .unwrap_err();
    assert!(matches!(err, IssueError::ValidityTooLong { .. }));
    let msg = err.to_string();
    assert!(msg.contains("validity 365d 1h is longer"), "{msg}");
    assert!(msg.contains("maximum of 365d;"), "{msg}");
    // Exactly the maximum is fine.
    assert!(ring
        .issue("default", "web-01", YEAR, YEAR, BTreeMap::new(), t0())
        .is_ok());
    assert!(matches!(
        ring.issue(
            "default",
            "web-01",
            Duration::from_millis(500),
            YEAR,
            BTreeMap::new(),
            t0()
        ),
        Err(IssueError::ValidityTooShort)
    ));
    for (mesh, name) in [
        ("", "web"),
        ("default", ""),
        ("a.b", "web"),
        ("Default", "web"),
    ] {
        assert!(
            matches!(
                ring.issue(mesh, name, HOUR, YEAR, BTreeMap::new(), t0()),
                Err(IssueError::BadIdentity { .. })
            ),
            "{mesh:?} {name:?}"
        );
    }
    // Names may contain dots (the node id splits on the first one).
    assert!(ring
        .issue("default", "web.01", HOUR, YEAR, BTreeMap::new(), t0())
        .is_ok());
}

#[test]
fn empty_ring_and_missing_keys_dir() {
    let dir = tempfile::tempdir().unwrap();
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    assert!(ring.kids().is_empty());
    assert_eq!(ring.signing_kid(), None);
    let err = ring
        .issue("default", "web-01", HOUR, YEAR, BTreeMap::new(), t0())
        .unwrap_err();
    assert!(err.to_string().contains("hdsd token keygen"), "{err}");
}

#[cfg(unix)]
#[test]
fn private_key_file_mode_is_0600() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, ring, key) = setup();
    let mode = fs::metadata(&key.private_path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(ring.warnings().is_empty());
    let dir_mode = fs::metadata(dir.path().join("keys"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode & 0o077, 0, "keys dir mode {dir_mode:o}");

    // A loosened private key loads with a warning.
    fs::set_permissions(&key.private_path, fs::Permissions::from_mode(0o644)).unwrap();
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    assert_eq!(ring.warnings().len(), 1);
    assert!(
        ring.warnings()[0].contains("chmod 600"),
        "{:?}",
        ring.warnings()
    );
}

#[test]
fn key_files_and_kid_format() {
    let (dir, _, key) = setup();
    assert!(key.kid.starts_with("k20260101T000000Z-"), "{}", key.kid);
    assert_eq!(key.kid.len(), "k20260101T000000Z-".len() + 6);
    assert_eq!(
        key.private_path,
        dir.path().join("keys").join(format!("{}.key.pem", key.kid))
    );
    assert_eq!(
        key.public_path,
        dir.path().join("keys").join(format!("{}.pub.pem", key.kid))
    );
    let private = fs::read_to_string(&key.private_path).unwrap();
    assert!(
        private.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{private}"
    );
    let public = fs::read_to_string(&key.public_path).unwrap();
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
}

#[test]
fn generate_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate_with_kid(dir.path(), "k1").unwrap();
    let before = fs::read(&first.private_path).unwrap();
    let err = generate_with_kid(dir.path(), "k1").unwrap_err();
    assert!(matches!(err, KeyError::AlreadyExists { .. }), "{err:?}");
    assert!(err.to_string().contains("refusing to overwrite"), "{err}");
    assert_eq!(fs::read(&first.private_path).unwrap(), before);

    // Also when only the public half is there.
    fs::remove_file(&first.private_path).unwrap();
    assert!(matches!(
        generate_with_kid(dir.path(), "k1"),
        Err(KeyError::AlreadyExists { .. })
    ));
}

#[test]
fn ensure_creates_only_on_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let created = KeyRing::ensure(dir.path(), t0()).unwrap();
    let created = created.expect("first start creates a key");
    assert!(created.private_path.exists());
    assert_eq!(KeyRing::ensure(dir.path(), t0()).unwrap(), None);
    assert_eq!(
        KeyRing::load(dir.path(), &[]).unwrap().kids(),
        vec![created.kid]
    );
}

#[test]
fn extra_public_keys() {
    let (_a_dir, a, a_key) = setup();
    let b_dir = tempfile::tempdir().unwrap();
    KeyRing::generate(b_dir.path(), t0()).unwrap();
    let extra = [ExtraPublicKey {
        kid: a_key.kid.clone(),
        path: a_key.public_path.clone(),
    }];
    let b = KeyRing::load(b_dir.path(), &extra).unwrap();
    assert_eq!(b.kids().len(), 2);
    assert_eq!(b.key_source(&a_key.kid), Some(a_key.public_path.as_path()));
    // B verifies A's tokens but still signs with its own key.
    assert!(b.verify(&issue(&a, HOUR), &none(), t0()).is_ok());
    assert_ne!(b.signing_kid(), Some(a_key.kid.as_str()));

    // The same kid twice is refused.
    let dup = [extra[0].clone(), extra[0].clone()];
    assert!(matches!(
        KeyRing::load(b_dir.path(), &dup),
        Err(KeyError::DuplicateKid { .. })
    ));
    // A bad kid or a private key where a public one belongs is refused.
    let bad_kid = [ExtraPublicKey {
        kid: "has space".into(),
        path: a_key.public_path.clone(),
    }];
    assert!(matches!(
        KeyRing::load(b_dir.path(), &bad_kid),
        Err(KeyError::InvalidKid { .. })
    ));
    let private = [ExtraPublicKey {
        kid: "x".into(),
        path: a_key.private_path.clone(),
    }];
    assert!(matches!(
        KeyRing::load(b_dir.path(), &private),
        Err(KeyError::BadPublicKey { .. })
    ));
}

#[test]
fn extra_public_key_config_denies_unknown_fields() {
    let ok: ExtraPublicKey =
        serde_json::from_str(r#"{"kid":"a","path":"keys/a.pub.pem"}"#).unwrap();
    assert_eq!(ok.path, Path::new("keys/a.pub.pem"));
    assert!(
        serde_json::from_str::<ExtraPublicKey>(r#"{"kid":"a","path":"p","alg":"HS256"}"#).is_err()
    );
}

#[test]
fn mismatched_or_corrupt_key_files_fail_to_load() {
    let (dir, _, key) = setup();
    let other = tempfile::tempdir().unwrap();
    let stranger = KeyRing::generate(other.path(), t0()).unwrap();
    fs::copy(&stranger.public_path, &key.public_path).unwrap();
    assert!(matches!(
        KeyRing::load(dir.path(), &[]),
        Err(KeyError::KeyMismatch { .. })
    ));
    fs::write(&key.public_path, "not a key").unwrap();
    assert!(matches!(
        KeyRing::load(dir.path(), &[]),
        Err(KeyError::BadPublicKey { .. })
    ));
    fs::remove_file(&key.public_path).unwrap();
    fs::write(&key.private_path, "not a key").unwrap();
    let err = KeyRing::load(dir.path(), &[]).unwrap_err();
    assert!(matches!(err, KeyError::BadPrivateKey { .. }), "{err:?}");
    // Key material never appears in Debug output of a ring.
    let (_d, ring, _) = setup();
    let debug = format!("{ring:?}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
}

#[test]
fn inspect_forged_token_shows_claims_and_rejection() {
    let (_dir, ring, key) = setup();
    let other = tempfile::tempdir().unwrap();
    generate_with_kid(other.path(), &key.kid).unwrap();
    let forger = KeyRing::load(other.path(), &[]).unwrap();
    let forged = forger
        .issue("default", "db-01", HOUR, YEAR, BTreeMap::new(), t0())
        .unwrap();

    let inspection = inspect(&ring, &none(), &forged, t0());
    assert!(!inspection.accepted());
    assert_eq!(inspection.claims.as_ref().unwrap().name, "db-01");
    let text = inspection.to_string();
    assert!(text.contains("name:    db-01"), "{text}");
    assert!(text.contains("mesh:    default"), "{text}");
    assert!(text.contains("expires: 2026-01-01T01:00:00Z"), "{text}");
    assert!(
        text.contains("would be rejected: invalid token signature"),
        "{text}"
    );
    assert!(text.contains(&key.kid), "{text}");

    let good = inspect(&ring, &none(), &issue(&ring, HOUR), t0());
    assert!(good.accepted());
    assert!(
        good.to_string().contains("accepted by this server"),
        "{good}"
    );

    let plain = format!("{}.{}.", b64(r#"{"alg":"none"}"#), b64(&claims_json()));
    let text = inspect(&ring, &none(), &plain, t0()).to_string();
    assert!(text.contains("jti:     forged"), "{text}");
    assert!(
        text.contains("would be rejected: token algorithm not allowed"),
        "{text}"
    );

    let text = inspect(&ring, &none(), "garbage", t0()).to_string();
    assert!(
        text.contains("would be rejected: malformed token"),
        "{text}"
    );
}

#[test]
fn the_gate_refuses_tokens_valid_longer_than_the_maximum_whoever_issued_them() {
    let dir = tempfile::tempdir().unwrap();
    KeyRing::generate(dir.path(), t0()).unwrap();
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    let century = YEAR * 100;
    let long = ring
        .issue("default", "web-01", century, century, BTreeMap::new(), t0())
        .unwrap();
    let short = issue(&ring, HOUR);
    let mut config = crate::config::Config {
        state_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    config.auth.max_token_validity = YEAR;
    let gate = Gate::new(&config.auth, &config.state_dir, t0()).unwrap();
    let err = gate.verify(&long, t0()).unwrap_err();
    assert_eq!(err.reason(), "validity_too_long");
    assert_eq!(err.kind(), RejectionKind::Unauthenticated);
    assert!(
        err.detail().contains("max_token_validity"),
        "{}",
        err.detail()
    );
    assert!(gate.verify(&short, t0()).is_ok());

    // Removing the key (rotation) makes the same token fail on the next reload.
    for entry in fs::read_dir(dir.path().join("keys")).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
    }
    KeyRing::generate(dir.path(), t0()).unwrap();
    gate.reload();
    assert_eq!(
        gate.verify(&short, t0()).unwrap_err().reason(),
        "unknown_key"
    );
}

#[test]
fn a_key_made_in_the_same_second_signs_after_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20 {
        // Also within the second, not only on it.
        let now = t0() + chrono::Duration::milliseconds(i * 40);
        let made = KeyRing::generate(dir.path(), now).unwrap();
        let ring = KeyRing::load(dir.path(), &[]).unwrap();
        assert_eq!(ring.signing_kid(), Some(made.kid.as_str()));
    }
}

/// A public key shared by `publisher` under `kid`: the one of `ring`'s `of`.
fn shared(ring: &KeyRing, of: &str, kid: &str, publisher: &str) -> SharedKey {
    SharedKey {
        kid: kid.to_string(),
        publisher: publisher.to_string(),
        public_pem: ring.public_keys()[of].clone(),
    }
}

#[test]
fn public_keys_are_the_key_files_encoding() {
    let (dir, ring, key) = setup();
    let keys = ring.public_keys();
    assert_eq!(keys.len(), 1);
    assert_eq!(
        keys[&key.kid],
        fs::read_to_string(&key.public_path).unwrap()
    );
    assert!(!keys[&key.kid].contains("PRIVATE"));
    drop(dir);
}

#[test]
fn shared_keys_verify_beside_the_local_ones_and_never_sign() {
    let (_a_dir, a, a_key) = setup();
    let (_b_dir, b, b_key) = setup();
    let token = issue(&a, Duration::from_secs(3600));
    assert!(matches!(
        b.verify(&token, &none(), t0()),
        Err(Rejection::UnknownKey { .. })
    ));
    // The same key published twice is one key.
    let (merged, problems) = b.with_shared(&[
        shared(&a, &a_key.kid, &a_key.kid, "a-1"),
        shared(&a, &a_key.kid, &a_key.kid, "a-2"),
    ]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(merged.kids().len(), 2);
    assert_eq!(merged.verify(&token, &none(), t0()).unwrap().name, "web-01");
    assert_eq!(merged.key_source(&a_key.kid), None);
    assert!(merged.key_source(&b_key.kid).is_some());
    assert_eq!(merged.signing_kid(), None);
    // Withdrawn: no longer trusted.
    let (merged, _) = b.with_shared(&[]);
    assert!(matches!(
        merged.verify(&token, &none(), t0()),
        Err(Rejection::UnknownKey { .. })
    ));
}

#[test]
fn conflicting_or_bad_shared_keys_are_not_trusted() {
    let (_a_dir, a, a_key) = setup();
    let (_b_dir, b, b_key) = setup();
    let token = issue(&a, Duration::from_secs(3600));
    // Two publishers disagree about a kid: neither is trusted.
    let (merged, problems) = b.with_shared(&[
        shared(&a, &a_key.kid, "k-x", "a-1"),
        shared(&b, &b_key.kid, "k-x", "b-1"),
    ]);
    assert!(!merged.kids().contains(&"k-x".to_string()));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("different public keys"),
        "{problems:?}"
    );
    // A shared key under a local kid with another key: the local one stays.
    let (merged, problems) = b.with_shared(&[shared(&a, &a_key.kid, &b_key.kid, "a-1")]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("local one is kept"), "{problems:?}");
    let token_b = issue(&b, Duration::from_secs(3600));
    assert!(merged.verify(&token_b, &none(), t0()).is_ok());
    assert!(merged.verify(&token, &none(), t0()).is_err());
    // Not a key, or an invalid kid.
    let garbage = SharedKey {
        kid: a_key.kid.clone(),
        publisher: "a-1".into(),
        public_pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
    };
    let (merged, problems) = b.with_shared(&[garbage, shared(&a, &a_key.kid, "bad kid", "a-1")]);
    assert_eq!(merged.kids(), vec![b_key.kid.clone()]);
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn the_publisher_id_outlives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let first = keys::publisher_id(&state).unwrap();
    assert!(!first.is_empty() && first.bytes().all(|b| b.is_ascii_graphic()));
    assert_eq!(keys::publisher_id(&state).unwrap(), first);
    let other = tempfile::tempdir().unwrap();
    assert_ne!(keys::publisher_id(other.path()).unwrap(), first);
}

#[test]
fn the_gate_trusts_shared_keys_and_publishes_only_its_own() {
    let (_a_dir, a, a_key) = setup();
    let b_dir = tempfile::tempdir().unwrap();
    let b_key = KeyRing::generate(b_dir.path(), t0()).unwrap();
    let config = crate::config::Config {
        state_dir: b_dir.path().to_path_buf(),
        ..Default::default()
    };
    let gate = Gate::new(&config.auth, &config.state_dir, t0()).unwrap();
    let mut published = gate.published_keys();
    assert_eq!(
        published.borrow_and_update().keys().collect::<Vec<_>>(),
        vec![&b_key.kid]
    );
    let mut version = gate.subscribe();
    let token = issue(&a, HOUR);
    assert_eq!(
        gate.verify(&token, t0()).unwrap_err().reason(),
        "unknown_key"
    );

    gate.set_shared_keys(vec![shared(&a, &a_key.kid, &a_key.kid, "a-1")]);
    assert!(version.has_changed().unwrap());
    version.mark_unchanged();
    assert!(gate.verify(&token, t0()).is_ok());
    assert_eq!(gate.signing_keys(), 2);
    // The same list again changes nothing; a file reload keeps the shared key
    // in force and does not publish it as this instance's.
    gate.set_shared_keys(vec![shared(&a, &a_key.kid, &a_key.kid, "a-1")]);
    assert!(!version.has_changed().unwrap());
    gate.reload();
    assert!(gate.verify(&token, t0()).is_ok());
    assert!(!published.has_changed().unwrap());
    assert_eq!(published.borrow().len(), 1);

    // Withdrawn by its publisher: streams re-check, the token is refused.
    version.mark_unchanged();
    gate.set_shared_keys(Vec::new());
    assert!(version.has_changed().unwrap());
    assert_eq!(
        gate.verify(&token, t0()).unwrap_err().reason(),
        "unknown_key"
    );

    // A key added to this instance's files is published.
    KeyRing::generate(b_dir.path(), t0()).unwrap();
    gate.reload();
    assert!(published.has_changed().unwrap());
    assert_eq!(published.borrow().len(), 2);
}

/// A zone token names its zone and meshes, verifies with the same keys and
/// revocations, and connects no dataplane.
#[test]
fn a_zone_token_names_its_zone_and_connects_no_dataplane() {
    let (_dir, ring, _) = setup();
    let meshes = vec!["default".to_string(), "payments".to_string()];
    let token = ring.issue_zone("eu-1", &meshes, HOUR, YEAR, t0()).unwrap();
    let claims = ring.verify(&token, &none(), t0()).unwrap();
    assert_eq!(claims.zone.as_deref(), Some("eu-1"));
    assert_eq!(claims.meshes, meshes);
    assert_eq!(claims.identity(), "zone eu-1");
    let refused = check_identity(&claims, "default", "web-01").unwrap_err();
    assert_eq!(refused.kind(), RejectionKind::PermissionDenied);
    assert!(
        refused.detail().contains("zone token"),
        "{}",
        refused.detail()
    );
    // A dataplane token is not a zone token.
    let dataplane = ring.verify(&issue(&ring, HOUR), &none(), t0()).unwrap();
    assert_eq!(dataplane.zone, None);
    // Revoked like any other.
    let revoked = Revocations::from_iter([claims.jti.clone()]);
    assert_eq!(
        ring.verify(&token, &revoked, t0()).unwrap_err().reason(),
        "revoked"
    );
}

#[test]
fn a_zone_token_for_a_bad_name_is_refused_with_the_rule() {
    let (_dir, ring, _) = setup();
    let err = ring
        .issue_zone("EU_1", &["default".to_string()], HOUR, YEAR, t0())
        .unwrap_err();
    assert!(err.to_string().contains("zone name"), "{err}");
    let err = ring
        .issue_zone("eu-1", &["Bad.Mesh".to_string()], HOUR, YEAR, t0())
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot issue a zone token"),
        "{err}"
    );
}

/// Issue 33, finding 6: a keys directory others could write let another
/// user plant a public key whose tokens were accepted. Now the directory,
/// and any key file, that group or others can write is refused, with the
/// path and the fix; the modes are set explicitly, whoever runs the test.
#[cfg(unix)]
#[test]
fn keys_others_can_write_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let chmod =
        |p: &Path, mode: u32| fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    let (dir, _, key) = setup();
    let keys = dir.path().join("keys");
    // Planted by "another user": a key pair of its own in the keys dir.
    let planter = tempfile::tempdir().unwrap();
    let planted = KeyRing::generate(planter.path(), t0()).unwrap();
    fs::copy(&planted.public_path, keys.join("planted.pub.pem")).unwrap();
    chmod(&keys.join("planted.pub.pem"), 0o644);
    for mode in [0o777, 0o770, 0o733, 0o1777] {
        chmod(&keys, mode);
        let err = KeyRing::load(dir.path(), &[]).unwrap_err();
        assert!(matches!(err, KeyError::Untrusted(_)), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&keys.display().to_string()), "{message}");
        assert!(message.contains("chmod go-w"), "{message}");
        // `hdsd token keygen` refuses to write there too.
        assert!(KeyRing::generate(dir.path(), t0()).is_err());
    }
    chmod(&keys, 0o700);
    let ring = KeyRing::load(dir.path(), &[]).unwrap();
    assert!(ring.kids().contains(&"planted".to_string()));

    // A key file others can write: the private key, a public key.
    for (path, mode) in [
        (key.private_path.clone(), 0o666),
        (key.private_path.clone(), 0o620),
        (keys.join("planted.pub.pem"), 0o646),
    ] {
        chmod(&path, mode);
        let message = KeyRing::load(dir.path(), &[]).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(&format!("{mode:04o}")), "{message}");
        chmod(&path, 0o600);
    }
    KeyRing::load(dir.path(), &[]).unwrap();

    // Another issuer's key (auth.public_keys), through a symlink to it.
    let extra = planter.path().join("extra.pub.pem");
    fs::copy(&planted.public_path, &extra).unwrap();
    let link = planter.path().join("link.pub.pem");
    std::os::unix::fs::symlink(&extra, &link).unwrap();
    let extras = [ExtraPublicKey {
        kid: "other".into(),
        path: link.clone(),
    }];
    chmod(&extra, 0o644);
    KeyRing::load(dir.path(), &extras).unwrap();
    chmod(&extra, 0o666);
    let message = KeyRing::load(dir.path(), &extras).unwrap_err().to_string();
    assert!(message.contains(&link.display().to_string()), "{message}");
}

/// A revocation list others can write could take a revocation back: it is
/// refused like a loose key file.
#[cfg(unix)]
#[test]
fn a_revocation_list_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("revoked-tokens");
    fs::write(&path, "0123abcd\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(Revocations::load(&path).unwrap().len(), 1);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o662)).unwrap();
    let message = Revocations::load(&path).unwrap_err().to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("chmod go-w"), "{message}");
}
