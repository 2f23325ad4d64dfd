//! The token verifier: any string as a dataplane token. A forged token is
//! never accepted (the key ring's key is made here, so no input can hold a
//! valid signature), and nothing panics. `hdsd token inspect`'s decoding of
//! untrusted tokens runs too.
#![no_main]

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use hdsd::auth::{inspect, KeyRing, Revocations};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    ring: KeyRing,
    kid: String,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        KeyRing::generate(dir.path(), now()).expect("a key");
        let ring = KeyRing::load(dir.path(), &[]).expect("the key ring");
        let kid = ring.signing_kid().expect("a signing key").to_string();
        Fixture {
            ring,
            kid,
            _dir: dir,
        }
    })
}

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).expect("a valid time")
}

/// The input as a token: as given, or, when it has three lines (header
/// JSON, claims JSON, signature bytes), those encoded as a JWT with `KID` in
/// the header replaced by the trusted key's id, so that the fuzzer gets past
/// the key lookup to the signature and claims checks.
fn token(data: &[u8]) -> Option<String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let mut lines = data.splitn(3, |&b| b == b'\n');
    match (lines.next(), lines.next(), lines.next()) {
        (Some(header), Some(claims), Some(signature)) => {
            let header = std::str::from_utf8(header)
                .ok()?
                .replace("KID", &fixture().kid);
            Some(format!(
                "{}.{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims),
                URL_SAFE_NO_PAD.encode(signature)
            ))
        }
        _ => std::str::from_utf8(data).ok().map(str::to_string),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(token) = token(data) else {
        return;
    };
    let f = fixture();
    let revoked = Revocations::default();
    {
        let verdict = f.ring.verify(&token, &revoked, now());
        assert!(verdict.is_err(), "a forged token was accepted: {token:?}");
        let inspection = inspect(&f.ring, &revoked, &token, now());
        assert!(!inspection.accepted());
    }
});
